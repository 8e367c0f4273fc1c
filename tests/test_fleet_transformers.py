"""A real fleet on this CPU: `dqa fleet up --engine transformers` starts two `transformers serve`
processes with the tiny random Qwen3 model, `status` sees them up (metrics unavailable),
they answer chat completions, `dqa regen --fleet` and `dqa plan --calibrate --fleet` run on
them, and `down` leaves no process behind. And why `dqa fleet up --router --engine transformers`
is refused: the real sglang-router registers a `transformers serve` worker, then every request it
passes on is a 422."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest
from fleet_helpers import REPO, dqa, fleet_up, process_gone, read_json, write_failing_set
from router_helpers import ROUTER_MISSING, Router


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny random Qwen3 model (examples/tiny_model.py) in a folder whose name has a space."""
    sys.path.insert(0, str(REPO / "examples"))
    from tiny_model import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny qwen3")


@pytest.fixture()
def failing_set(tmp_path):
    return write_failing_set(tmp_path)


@pytest.mark.slow
def test_two_transformers_serve_processes_up_status_regen_down(tiny_model, tmp_path, failing_set):
    import psutil

    fleet = tmp_path / "fleet.json"
    r, _ = fleet_up(
        "fleet", "up", "--engine", "transformers", "--model", tiny_model, "--gpus", "0-1",
        "--fleet", fleet, "--env", "OMP_NUM_THREADS=1", "--timeout", "180", "--", "--device", "cpu",
        ports=2, cwd=tmp_path, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rec = read_json(fleet)
    assert (rec["engine"], rec["protocol"], rec["model"]) == ("transformers", "openai", str(tiny_model))
    eps = rec["endpoints"]
    pids = [e["pid"] for e in eps]
    try:
        children = [c.pid for pid in pids for c in psutil.Process(pid).children(recursive=True)]
        for e in eps:
            assert e["cmd"][1:4] == ["serve", str(tiny_model), "--host"]  # the path with a space, intact
            assert psutil.Process(e["pid"]).environ().get("CUDA_VISIBLE_DEVICES") == e["gpu"]

        s = dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path)
        assert s.returncode == 0, s.stderr
        st = json.loads(s.stdout)
        assert st["total"]["up"] == 2 and st["total"]["gen_tok_per_s"] is None
        assert all(e["source"] == "none" and "metrics unavailable" in e["note"] for e in st["endpoints"])

        with httpx.Client(timeout=60) as client:
            for i, e in enumerate(eps * 2):
                reply = client.post(
                    e["url"] + "/v1/chat/completions",
                    json={"model": rec["model"], "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4},
                )
                assert reply.status_code == 200, reply.text
                assert reply.json()["usage"]["completion_tokens"] >= 1

        # The fleet file drives regen and plan: dqa regen --fleet, dqa plan --calibrate --fleet.
        data, scan = failing_set
        g = dqa("regen", data, "--fleet", fleet, "--findings", scan, "--out", tmp_path / "regen", "--limit", "2",
                "--max-new-tokens", "8", "--json", cwd=tmp_path, timeout=240)  # fmt: skip
        assert g.returncode == 0, g.stderr
        progress = json.loads(g.stdout)
        assert progress["done"] == 2 and set(progress["endpoints"]) == {e["url"] for e in eps}
        c = dqa("plan", "--calibrate", "--fleet", fleet, "--dataset", data, "--findings", scan, "--sample", "2",
                "--max-new-tokens", "8", "--json", cwd=tmp_path, timeout=240)  # fmt: skip
        assert c.returncode == 0, c.stderr
        planned = json.loads(c.stdout)
        assert planned["calibration"]["done"] == 2
        assert planned["scenarios"][0]["gpus"] == 2 and planned["scenarios"][0]["samples"] == 6
    finally:
        d = dqa("fleet", "down", "--fleet", fleet, "--json", "--grace", "20", cwd=tmp_path, timeout=120)
    assert d.returncode == 0, d.stderr
    assert {e["outcome"] for e in json.loads(d.stdout)["endpoints"]} <= {"stopped", "killed"}
    assert all(process_gone(pid) for pid in pids + children)
    s = dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path)
    assert s.returncode == 3 and json.loads(s.stdout)["total"]["up"] == 0


@pytest.mark.slow
@pytest.mark.skipif(ROUTER_MISSING is not None, reason=ROUTER_MISSING or "")
def test_sglang_router_takes_a_transformers_serve_worker_but_every_request_it_passes_on_is_a_422(tiny_model, tmp_path):
    """The evidence behind ``servers.transformers.KIND.no_router``: the router (0.3.2) registers the
    worker and is ready, but adds SGLang's own fields to each request it passes on, and
    `transformers serve` answers 422 "Unexpected fields in the request" to each; the fields the
    refusal names are among them. If a later router or transformers changes this, this fails."""
    from dqa.regen.servers.transformers import KIND

    fleet = tmp_path / "fleet.json"
    r, _ = fleet_up(
        "fleet", "up", "--engine", "transformers", "--model", tiny_model, "--gpus", "0", "--fleet", fleet,
        "--env", "OMP_NUM_THREADS=1", "--timeout", "180", "--", "--device", "cpu", ports=1, cwd=tmp_path, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    ep = read_json(fleet)["endpoints"][0]
    router = None
    try:
        router = Router(tmp_path / "router", [ep["url"]]).start()  # /readiness 200: registration and health checks pass
        chat = {"model": str(tiny_model), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        with httpx.Client(timeout=60) as client:
            assert client.post(ep["url"] + "/v1/chat/completions", json=chat).status_code == 200  # the worker itself answers
            via = client.post(router.url + "/v1/chat/completions", json=chat)
            assert via.status_code == 422 and via.json()["detail"].startswith("Unexpected fields in the request"), via.text
            added = set(re.findall(r"'(\w+)'", via.json()["detail"]))
            named = set(re.search(r"SGLang-only fields \(([^)]*), \.\.\.\)", KIND.no_router).group(1).split(", "))
            assert named and named <= added, (named, added)
            text = client.post(router.url + "/v1/completions", json={"model": str(tiny_model), "prompt": "hi", "max_tokens": 4})
            assert text.status_code == 422 and "Unexpected fields in the request" in text.text
        # The router passed both 422s back and counts them (its circuit breaker counts every non-2xx).
        assert router.metric_sum("smg_router_upstream_responses_total", status_code="422") == 2
    finally:
        if router is not None:
            router.stop()
        d = dqa("fleet", "down", "--fleet", fleet, "--json", "--grace", "20", cwd=tmp_path, timeout=120)
    assert d.returncode == 0, d.stderr
    assert process_gone(ep["pid"])
