"""`dqa regen -e ROUTER_URL` through the real SGLang router (sglang-router 0.3.2, a Rust binary that
runs on the CPU) in front of SGLang stand-ins (tests/servers/sglang_contract.py) with a 1,024-token
context: every (row, turn) exactly once, also with a worker killed mid-run; what the router passes
on recorded per sampling field (not known: its release is not said over HTTP); prompts that cannot fit never sent, so the router sees no 400 and
no circuit opens (its Prometheus port says so); a router whose workers cannot be asked is refused
at start-up unless --context-length is given.

Skipped, with the reason, when the sglang-router package is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from chatdata import render, write_parquet
from dqa.regen.config import RegenConfig
from dqa.regen.run import regenerate
from regen_helpers import degenerate_dataset, read_shards, write_findings
from router_helpers import ROUTER_MISSING, Router
from servers.sglang_contract import StubServer

pytestmark = pytest.mark.skipif(ROUTER_MISSING is not None, reason=ROUTER_MISSING or "")

CONTEXT = 1024
FAST = dict(health_interval=0.5, health_timeout=2.0, backoff_base=0.05, backoff_max=0.3, live=False, install_signal_handlers=False)


def _workers(tmp_path, n: int = 2, *extra: str) -> list[StubServer]:
    return [StubServer(tmp_path / f"w{i}", "--context-length", str(CONTEXT), *extra, name=f"w{i}").start() for i in range(n)]


def _run(path, findings, out, url, **kw):
    logs: list[str] = []
    cfg = RegenConfig(dataset=str(path), out=str(out), endpoints=[url], findings=str(findings), log=logs.append, **{**FAST, **kw})
    return regenerate(cfg), logs


def _rids(workers: list[StubServer]) -> list[str]:
    return [r["rid"] for w in workers for r in w.requests() if r["outcome"] == "ok"]


@pytest.fixture
def fleet(tmp_path):
    workers = _workers(tmp_path)
    router = Router(tmp_path / "router", [w.url for w in workers]).start()
    yield router, workers
    router.stop()
    for w in workers:
        w.stop()


def _multi_turn(path, n: int):
    rows = []
    for i in range(n):
        msgs = []
        for k in range(3):
            msgs += [{"role": "user", "content": f"Question {i}.{k}: what is {i} + {k}?"}, {"role": "assistant", "content": "OK."}]
        rows.append(render(msgs, enable_thinking=False))
    return write_parquet(path, rows, [f"sample-{i}" for i in range(n)])


def test_every_row_once_through_the_router_with_the_workers_facts_and_the_fields_it_passes(fleet, tmp_path):
    router, workers = fleet
    path = degenerate_dataset(tmp_path / "d.parquet", 30)
    findings = write_findings(tmp_path / "scan", list(range(30)))
    res, logs = _run(path, findings, tmp_path / "out", router.url, max_new_tokens=8192, max_in_flight=8)
    assert res.exit_code == 0, res.message
    rows = read_shards(tmp_path / "out").to_pylist()
    assert sorted(r["row"] for r in rows) == list(range(30))
    assert {(r["status"], r["attempts"], r["endpoint"]) for r in rows} == {("ok", 1, router.url)}
    # dqa's 8192 was capped under the workers' context: no request was a 400 at the router.
    assert all(json.loads(r["sampling"])["max_new_tokens"] == CONTEXT - r["prompt_len"] for r in rows)
    rids = _rids(workers)
    assert sorted(rids) == sorted(f"sample-{i}:1" for i in range(30))
    info = json.loads((tmp_path / "out" / "run.json").read_text())["servers"][router.url]
    assert (info["server"], info["context_length"], info["speculative_reserve"], info["version"]) == ("sglang", CONTEXT, 0, "0.5.23")
    r = info["router"]
    assert sorted(r["workers"]) == sorted(w.url for w in workers) and r["workers_answered"] == 2
    assert r["context_from"] == "workers"
    # -e URL: the router does not say its release over HTTP, so what it passes on is recorded as not known
    # (tests/test_gateways.py checks the table; tests/test_fleet_router.py a release taken from the fleet file).
    assert (r["gateway"], r["release"]) == ("sglang-router", None)
    assert r["sampling_fields"] == {k: "unknown" for k in ("temperature", "top_p", "top_k", "max_new_tokens", "sampling_seed")}
    # What the workers received is what run.json says was applied.
    keys = {tuple(x["sampling_keys"]) for w in workers for x in w.requests() if x["outcome"] == "ok"}
    assert keys == {tuple(sorted(r["sampling_fields"]))}
    assert any("through an SGLang router (sglang-router (release not known); 2 of 2 workers answered" in m for m in logs)
    assert router.metric_sum("smg_router_upstream_responses_total", status_code="400") == 0


def test_a_multi_turn_set_goes_through_the_router_once_per_turn_in_order(fleet, tmp_path):
    router, workers = fleet
    path = _multi_turn(tmp_path / "mt.parquet", 12)
    findings = write_findings(tmp_path / "scan", list(range(12)))
    res, _ = _run(path, findings, tmp_path / "out", router.url, turns="all", max_new_tokens=256)
    assert res.exit_code == 0, res.message
    rows = read_shards(tmp_path / "out").to_pylist()
    assert sorted((r["row"], r["turn"]) for r in rows) == [(i, k) for i in range(12) for k in range(3)]
    assert {r["status"] for r in rows} == {"ok"}
    by = {(r["row"], r["turn"]): r for r in rows}
    def text(ids):
        return "," + ",".join(map(str, ids)) + ","

    for i in range(12):  # turn k + 1's prompt holds turn k's regenerated answer (the history drops its reasoning)
        for k in range(2):
            a, b = by[(i, k)], by[(i, k + 1)]
            answer = a["input_ids"][a["input_ids"].index(151668, a["prompt_len"]) + 2:]  # after "</think>\n\n"
            assert text(answer) in text(b["input_ids"][: b["prompt_len"]])
    assert len(_rids(workers)) == 36 == len(set(_rids(workers)))


def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(tmp_path):
    workers = _workers(tmp_path, 2, "--latency-s", "0.05")
    router = Router(tmp_path / "router", [w.url for w in workers]).start()
    try:
        path = degenerate_dataset(tmp_path / "d.parquet", 60)
        findings = write_findings(tmp_path / "scan", list(range(60)))

        def kill_when_busy():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and workers[0].status()["num_requests"] < 5:
                time.sleep(0.02)
            workers[0].kill()

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        res, _ = _run(path, findings, tmp_path / "out", router.url, max_in_flight=8, max_new_tokens=256)
        killer.join()
        assert not workers[0].alive()
        assert res.exit_code == 0, res.message
        rows = read_shards(tmp_path / "out").to_pylist()
        assert sorted(r["row"] for r in rows) == list(range(60))
        assert {r["status"] for r in rows} == {"ok"}
        assert workers[1].status()["num_requests"] > 0
    finally:
        router.stop()
        for w in workers:
            w.stop()


def test_prompts_over_the_context_are_recorded_failed_never_sent_and_no_circuit_opens(fleet, tmp_path):
    router, workers = fleet
    short = [render([{"role": "user", "content": f"Short question {i}?"}, {"role": "assistant", "content": "OK."}],
                    enable_thinking=False) for i in range(6)]
    long_q = " ".join(["word"] * 1200)  # ~1,200 tokens: over the 1,024-token context by itself
    long = [render([{"role": "user", "content": f"{long_q} {i}"}, {"role": "assistant", "content": "OK."}],
                   enable_thinking=False) for i in range(14)]
    path = write_parquet(tmp_path / "d.parquet", short + long, [f"sample-{i}" for i in range(20)])
    findings = write_findings(tmp_path / "scan", list(range(20)))
    before = sum(w.status()["num_requests"] for w in workers)
    res, _ = _run(path, findings, tmp_path / "out", router.url)
    assert res.exit_code == 0, res.message
    rows = {r["row"]: r for r in read_shards(tmp_path / "out").to_pylist()}
    assert sorted(rows) == list(range(20))
    for i in range(6):
        assert rows[i]["status"] == "ok"
    for i in range(6, 20):
        r = rows[i]
        assert (r["status"], r["attempts"]) == ("failed", 0)
        assert f"under {router.url}'s context length {CONTEXT}" in r["error"] and r["error"].endswith("not sent")
    assert sum(w.status()["num_requests"] for w in workers) - before == 6
    assert router.metric_sum("smg_router_upstream_responses_total", status_code="400") == 0
    assert router.metric_sum("smg_router_upstream_responses_total", status_code="503") == 0
    states = [v for (n, _), v in router.metrics().items() if n == "smg_worker_cb_state"]
    assert states and all(v == 0 for v in states)  # 0: closed


def test_a_router_whose_workers_cannot_be_asked_is_refused_unless_context_length_is_given(tmp_path):
    from dqa.errors import UsageError

    workers = _workers(tmp_path, 1)
    router = Router(tmp_path / "router", [workers[0].url]).start()
    try:
        workers[0].kill()  # the router still lists it; dqa cannot ask it
        path = degenerate_dataset(tmp_path / "d.parquet", 4)
        findings = write_findings(tmp_path / "scan", list(range(4)))
        with pytest.raises(UsageError, match=r"an SGLang router, and dqa cannot learn its workers' context length .*--context-length N"):
            _run(path, findings, tmp_path / "out", router.url)
        # The CLI: exit 2, one line naming the fix, no traceback, nothing sent.
        cli = subprocess.run([sys.executable, "-m", "dqa.cli", "regen", str(path), "--findings", str(findings), "-e", router.url,
                              "--out", str(tmp_path / "out-cli"), "--quiet"], capture_output=True, text=True, timeout=120)
        assert cli.returncode == 2, cli.stderr
        assert "Traceback" not in cli.stderr and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
        assert "pass --context-length N" in cli.stderr
        assert router.metric_sum("smg_router_requests_total", endpoint="generate") == 0
        workers[0].restart()
        res, _ = _run(path, findings, tmp_path / "out2", router.url, context_length=600, max_new_tokens=8192)
        assert res.exit_code == 0, res.message
        rows = read_shards(tmp_path / "out2").to_pylist()
        assert all(json.loads(r["sampling"])["max_new_tokens"] == 600 - r["prompt_len"] for r in rows)
        info = json.loads((tmp_path / "out2" / "run.json").read_text())["servers"][router.url]
        assert info["context_length"] == 600 and info["router"]["context_from"] == "--context-length"
    finally:
        router.stop()
        for w in workers:
            w.stop()


def test_while_the_router_has_no_worker_dqa_pauses_instead_of_burning_attempts(tmp_path):
    workers = _workers(tmp_path, 1, "--latency-s", "0.05")
    # The README's setting: a short open-circuit timeout (60 s by default) once the worker is back.
    router = Router(tmp_path / "router", [workers[0].url], "--cb-timeout-duration-secs", "3").start()
    try:
        path = degenerate_dataset(tmp_path / "d.parquet", 40)
        findings = write_findings(tmp_path / "scan", list(range(40)))

        def outage():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and workers[0].status()["num_requests"] < 5:
                time.sleep(0.02)
            workers[0].kill()
            time.sleep(6)  # the router marks it unhealthy and answers 503 no_available_workers
            workers[0].restart()

        t = threading.Thread(target=outage)
        t.start()
        res, logs = _run(path, findings, tmp_path / "out", router.url, max_in_flight=4, max_new_tokens=64,
                         **{**FAST, "backoff_base": 0.5, "backoff_max": 4.0})
        t.join()
        assert res.exit_code == 0, res.message
        rows = read_shards(tmp_path / "out").to_pylist()
        assert sorted(r["row"] for r in rows) == list(range(40))
        assert {r["status"] for r in rows} <= {"ok", "length"}, [r["error"] for r in rows if r["status"] == "failed"][:3]
        assert max(r["attempts"] for r in rows) <= 6
        assert any("paused (the router has no available worker)" in m for m in logs), logs
    finally:
        router.stop()
        for w in workers:
            w.stop()


def test_through_the_router_the_smallest_context_and_the_largest_speculative_reserve_cap_the_output(tmp_path):
    from dqa.regen.servers.sglang_releases import SPECULATIVE_MARGIN

    workers = [StubServer(tmp_path / "w0", "--context-length", "1024", "--speculative-algorithm", "NEXTN", name="w0").start(),
               StubServer(tmp_path / "w1", "--context-length", "2048", name="w1").start()]
    router = Router(tmp_path / "router", [w.url for w in workers]).start()
    try:
        path = degenerate_dataset(tmp_path / "d.parquet", 8)
        findings = write_findings(tmp_path / "scan", list(range(8)))
        res, _ = _run(path, findings, tmp_path / "out", router.url, max_new_tokens=8192)
        assert res.exit_code == 0, res.message
        info = json.loads((tmp_path / "out" / "run.json").read_text())["servers"][router.url]
        assert (info["context_length"], info["speculative_reserve"]) == (1024, 4)
        rows = read_shards(tmp_path / "out").to_pylist()
        assert {r["status"] for r in rows} == {"ok"}
        assert all(json.loads(r["sampling"])["max_new_tokens"] == 1024 - r["prompt_len"] - 4 - SPECULATIVE_MARGIN for r in rows)
        assert router.metric_sum("smg_router_upstream_responses_total", status_code="400") == 0
    finally:
        router.stop()
        for w in workers:
            w.stop()
