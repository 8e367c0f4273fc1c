"""dqa regen against SGLang as it really behaves (issue 11): a start-up preflight (reachable? the
right protocol? the server's limits), output capped under the speculative reserve, seeds that
SGLang ignores recorded as such, a schema 400 that stops the run as a bug, aborts per SGLang's
semantics; and `dqa fleet up` flags per SGLang release. The servers are
``tests/servers/sglang_contract.py`` (SGLang's contract, ``--sglang-version``) and, for the wrong
protocol, a minimal OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dqa.errors import RuntimeFailure, UsageError
from dqa.regen.servers import sglang_releases as sg
from dqa.regen.servers.replies import classify_status
from dqa.regen.wire.outcome import FATAL, FAIL, RETRY
from dqa.regen.config import RegenConfig
from dqa.regen.run import regenerate
from dqa.regen.servers.facts import facts_from
from regen_helpers import degenerate_dataset, read_shards, write_findings
from servers.sglang_contract import StubServer

FAST = dict(health_interval=0.5, health_timeout=2.0, backoff_base=0.05, backoff_max=0.3, live=False, install_signal_handlers=False)
NEXTN = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4")  # fmt: skip
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("preflight-data")
    return degenerate_dataset(d / "chat.parquet", 12), write_findings(d / "scan", list(range(12)))


def _run(data, out, urls, **kw):
    path, findings = data
    logs: list[str] = []
    cfg = RegenConfig(dataset=str(path), out=str(out), endpoints=urls, findings=str(findings), log=logs.append, **{**FAST, **kw})
    return regenerate(cfg), logs


def _in_thread(fn):
    """Run ``fn`` in a thread; returns (thread, box) where box gets the result or the exception."""
    box: dict = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def _wait(cond, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout  # bounds a hang only
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)


# ------------------------------------------------------------------------------ SGLang facts


def test_versions_reserve_and_cap_follow_sglang():
    assert sg.parse_version("0.5.4.post3") == (0, 5, 4) and sg.parse_version("v0.5.23rc1") == (0, 5, 23)
    assert sg.parse_version(None) is None and sg.parse_version("dev") is None
    assert sg.inclusive_length_check((0, 5, 4)) and sg.inclusive_length_check(None)
    assert not sg.inclusive_length_check((0, 5, 5)) and not sg.inclusive_length_check((0, 5, 23))
    nextn = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    assert sg.speculative_reserve(nextn) == 4
    assert sg.speculative_reserve({**nextn, "speculative_num_steps": 5, "speculative_eagle_topk": 2}) == 10
    assert sg.speculative_reserve({**nextn, "max_speculative_num_draft_tokens": 8}) == 8
    assert sg.speculative_reserve({"speculative_algorithm": None, "speculative_num_draft_tokens": 4}) == 0
    assert sg.output_cap(8192, 1000, 0, False) == 7192  # exact: SGLang refuses only prompt + output > context
    assert sg.output_cap(8192, 1000, 0, True) == 7191  # 0.5.4: equal is already over
    assert sg.output_cap(8192, 1000, 4, False) == 7192 - 4 - sg.SPECULATIVE_MARGIN
    f = facts_from({"version": "0.5.23", "context_length": 4096, "enable_deterministic_inference": False, **nextn},
                   {"data": [{"id": "m", "max_model_len": 8192}]})
    assert (f.kind, f.context_length, f.model, f.reserve, f.seed_applied) == ("sglang", 8192, "m", 4, False)
    assert facts_from(None, {"data": [{"id": "m"}]}).kind == "openai" and facts_from(None, None).kind == "unknown"


def test_a_router_whose_workers_answer_but_say_no_context_length_is_refused_saying_that_not_that_they_did_not_answer():
    from dqa.regen.servers.facts import through_router, unknown_context

    # sglang-router 0.3.2's own replies, and the /v1/models of a `transformers serve` worker (no max_model_len).
    f = facts_from({"router_manager": True, "routers_count": 1, "workers_count": 1}, {"data": [{"id": "unknown"}]})
    worker = facts_from(None, {"object": "list", "data": [{"id": "/m", "owned_by": "local", "object": "model"}]})
    through_router(f, ["http://w:1"], [worker])
    msg = unknown_context("http://r:1", f)
    assert "1 of its 1 workers (GET /workers) answered, but none said its context length" in msg
    assert "none of its" not in msg and msg.endswith("less their speculative reserve when they use one)")
    through_router(f, ["http://w:1"], [facts_from(None, None)])  # the worker did not answer at all
    assert "none of its 1 workers (GET /workers) answered /server_info or /v1/models from here" in unknown_context("http://r:1", f)


def test_status_classification_follows_sglang():
    string_body = json.dumps({"error": "unknown field `seed`, expected one of `max_new_tokens`, `stop`"}).encode()
    nested_body = json.dumps({"error": {"message": "unknown field `min_tokens`, expected one of `max_new_tokens`"}}).encode()
    for body, name in ((string_body, "seed"), (nested_body, "min_tokens")):
        out = classify_status(400, body)
        assert out.kind == FATAL and out.error.startswith("BUG:") and f"`{name}`" in out.error
    assert classify_status(400, json.dumps({"error": {"message": "The input is longer than the model's context length"}}).encode()).kind == FAIL
    assert classify_status(404, b'{"detail":"Not Found"}').kind == FATAL
    for status in (500, 503):
        assert classify_status(status, b"{}").kind == RETRY


# ------------------------------------------------------------------------------ preflight


class ThreadServer:
    """A minimal aiohttp server on a free port, run in a thread; subclasses add ``routes``."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(60)

    def routes(self, app) -> None:
        raise NotImplementedError

    def _serve(self, ready):
        from aiohttp import web

        async def start():
            app = web.Application()
            self.routes(app)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(start())
        ready.set()
        self.loop.run_forever()

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


class OpenAIOnly(ThreadServer):
    """An OpenAI-compatible server (no /generate, no /server_info), counting the POSTs it gets."""

    posts = 0

    def routes(self, app) -> None:
        from aiohttp import web

        async def models(request):
            return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

        async def chat(request):
            self.posts += 1
            return web.json_response({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})

        async def health(request):
            return web.Response(status=200)

        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/health", health)


class RedirectsEverything(ThreadServer):
    """A proxy that sends every request elsewhere with one status (an http -> https redirect),
    counting the requests that are not GETs."""

    def __init__(self, status: int):
        self.status = status
        self.posts = 0
        super().__init__()

    def routes(self, app) -> None:
        from aiohttp import web

        async def moved(request):
            self.posts += request.method != "GET"
            return web.Response(status=self.status, headers={"Location": "https://127.0.0.1:1" + request.path})

        app.router.add_route("*", "/{tail:.*}", moved)


def test_an_openai_server_without_protocol_openai_is_refused_before_any_request(data, tmp_path):
    server = OpenAIOnly()
    try:
        with pytest.raises(UsageError, match=r"this server has no /generate \(an OpenAI-compatible server\): use --protocol openai"):
            _run(data, tmp_path / "out", [server.url])
        # the same through the CLI: exit 2 and the fix, one line
        p = subprocess.run(
            [sys.executable, "-m", "dqa.cli", "regen", str(data[0]), "--findings", str(data[1]), "-e", server.url,
             "--out", str(tmp_path / "out2"), "--quiet"],
            capture_output=True, text=True, timeout=300, cwd=REPO,
        )  # fmt: skip
        assert server.posts == 0
    finally:
        server.stop()
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == f"dqa: error: {server.url}: this server has no /generate (an OpenAI-compatible server): use --protocol openai"
    assert not read_shards(tmp_path / "out2").num_rows


@pytest.mark.parametrize(("protocol", "path", "status"), [("sglang", "/generate", 308), ("openai", "/v1/chat/completions", 301)])
def test_a_generation_route_that_redirects_is_refused_with_the_fix_before_any_request(data, tmp_path, protocol, path, status):
    server = RedirectsEverything(status)
    try:
        # the timeout only bounds a hang: it is half the default 600-s down deadline
        p = subprocess.run(
            [sys.executable, "-m", "dqa.cli", "regen", str(data[0]), "--findings", str(data[1]), "-e", server.url,
             "--protocol", protocol, "--out", str(tmp_path / "out"), "--quiet"],
            capture_output=True, text=True, timeout=300, cwd=REPO,
        )  # fmt: skip
    finally:
        server.stop()
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == (f"dqa: error: {server.url}: {path} answers HTTP {status}, a redirect; dqa does not "
                                f"follow redirects: pass -e the base URL it redirects to, without {path} (behind a proxy often https://)")
    assert server.posts == 0
    assert not read_shards(tmp_path / "out").num_rows


def test_endpoints_that_never_answer_stop_the_run_within_seconds_not_after_the_down_deadline(data, tmp_path):
    from fleet_helpers import free_port_base

    dead = [f"http://127.0.0.1:{free_port_base(1)}", f"http://127.0.0.1:{free_port_base(1)}"]
    # --down-deadline 600 would wait ten minutes; the preflight says at once that nothing answers.
    t, box = _in_thread(lambda: _run(data, tmp_path / "out", dead, down_deadline=600.0))
    t.join(120)  # bounds a hang only
    assert not t.is_alive(), "still waiting for endpoints that never answered"
    err = box.get("error")
    assert isinstance(err, RuntimeFailure) and err.exit_code == 3, box
    assert "no endpoint answers" in str(err) and all(u in str(err) for u in dead) and "rerun" in str(err)


def test_a_server_still_starting_is_reachable_and_waited_for(data, tmp_path):
    with StubServer(tmp_path, "--startup-delay-s", "600") as s:  # /health 503 for ten minutes unless told
        t, box = _in_thread(lambda: _run(data, tmp_path / "out", [s.url], down_deadline=600.0))
        # The preflight found it (it said what it is), the run waits for it rather than stopping.
        _wait(lambda: "result" in box or "error" in box or (tmp_path / "out" / "run.json").is_file(), "run.json after the preflight")
        assert t.is_alive() and s.status()["n_generate"] == 0
        s.control(starting_for_s=0)
        t.join(300)
    assert not t.is_alive() and "error" not in box, box.get("error")
    res, logs = box["result"]
    assert res.exit_code == 0 and res.progress["ok"] == 12
    assert any("SGLang 0.5.23" in m for m in logs)


# ------------------------------------------------------------------------------ limits and seeds


def test_output_is_capped_under_the_speculative_reserve_and_0_5_4s_ge(data, tmp_path):
    """Context 64, prompts of ~21 tokens: with NEXTN 3/1/4 SGLang counts 4 more; dqa asks for
    64 - prompt - 4 - the margin, and no row gets the 400 it got before."""
    with StubServer(tmp_path, "--context-length", "64", *NEXTN, name="mtp") as s:
        res, _ = _run(data, tmp_path / "mtp", [s.url])
    assert res.exit_code == 0 and res.progress["failed"] == 0
    rows = read_shards(tmp_path / "mtp").to_pylist()
    assert all(json.loads(r["sampling"])["max_new_tokens"] == 64 - r["prompt_len"] - 4 - sg.SPECULATIVE_MARGIN for r in rows)
    run = json.loads((tmp_path / "mtp" / "run.json").read_text())
    assert run["servers"][s.url]["speculative_reserve"] == 4 and run["servers"][s.url]["context_length"] == 64
    with StubServer(tmp_path, "--context-length", "64", "--sglang-version", "0.5.4", name="old") as s:
        res, _ = _run(data, tmp_path / "old", [s.url])
    assert res.exit_code == 0 and res.progress["failed"] == 0
    assert all(json.loads(r["sampling"])["max_new_tokens"] == 64 - r["prompt_len"] - 1 for r in read_shards(tmp_path / "old").to_pylist())


def test_seeds_sglang_ignores_are_recorded_and_said_once(data, tmp_path):
    with StubServer(tmp_path, name="a") as a, StubServer(tmp_path, name="b") as b:
        res, logs = _run(data, tmp_path / "out", [a.url, b.url])
    assert res.exit_code == 0
    notices = [m for m in logs if "--enable-deterministic-inference" in m]
    assert len(notices) == 1 and "not applied" in notices[0]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["seed_applied"] is False
    assert all(run["servers"][u]["seed_applied"] is False for u in (a.url, b.url))
    assert all(json.loads(r["sampling"])["seed_applied"] is False for r in read_shards(tmp_path / "out").to_pylist())


def test_with_deterministic_inference_seeds_reproduce_the_outputs(data, tmp_path):
    with StubServer(tmp_path, "--enable-deterministic-inference") as s:
        first, logs = _run(data, tmp_path / "one", [s.url])
        second, _ = _run(data, tmp_path / "two", [s.url])
    assert first.exit_code == second.exit_code == 0
    assert not any("--enable-deterministic-inference" in m for m in logs)
    assert json.loads((tmp_path / "one" / "run.json").read_text())["seed_applied"] is True
    one, two = (sorted(read_shards(tmp_path / d).to_pylist(), key=lambda r: r["row"]) for d in ("one", "two"))
    assert [r["input_ids"] for r in one] == [r["input_ids"] for r in two]
    assert all(json.loads(r["sampling"])["seed_applied"] is True for r in one)


# ------------------------------------------------------------------------------ errors and aborts


def test_an_unknown_sampling_field_stops_the_run_as_a_bug_and_records_no_row(data, tmp_path, monkeypatch):
    from dqa.regen.config import SamplingSpec

    real = SamplingSpec.as_dict
    monkeypatch.setattr(SamplingSpec, "as_dict", lambda self: {**real(self), "min_tokens": 1})  # a field SGLang lacks
    with StubServer(tmp_path) as s:  # 0.5.23: /generate checks its body
        res, _ = _run(data, tmp_path / "out", [s.url], max_in_flight=2)
        sent = s.status()["n_generate"]
    assert res.exit_code == 3 and res.state == "failed"
    assert "BUG: the server rejects the request field `min_tokens`" in res.message and s.url in res.message
    assert read_shards(tmp_path / "out").num_rows == 0 and sent <= 2  # stopped at the first replies, not a row failure each


def test_aborts_are_retried_whether_a_plain_200_or_a_real_5xx(data, tmp_path):
    with StubServer(tmp_path, "--abort-share", "0.5", "--fault-seed", "4") as s:
        res, _ = _run(data, tmp_path / "plain", [s.url], max_attempts=30)
        s.control(abort_status=503)
        res503, _ = _run(data, tmp_path / "s503", [s.url], max_attempts=30)
        outcomes = s.status()["outcomes"]
    assert outcomes.get("abort", 0) > 0 and outcomes.get("abort_503", 0) > 0
    for r, out in ((res, "plain"), (res503, "s503")):
        assert r.exit_code == 0 and r.progress["ok"] == 12 and r.progress["failed"] == 0
        rows = read_shards(tmp_path / out).to_pylist()
        assert max(x["attempts"] for x in rows) > 1 and all(x["finish_reason"] != "abort" for x in rows)


# ------------------------------------------------------------------------------ fleet up per release


def _fake_sglang(folder: Path, version: str | None) -> Path:
    """A stand-in for the Python of an SGLang node with ``version`` installed (None: it has no
    sglang): answers the version query, runs the stub as that release for ``-m sglang.launch_server``."""
    from fleet_helpers import STUB

    py = folder / f"python-sglang-{version}"
    query = f'echo "{version}"; exit 0' if version else "echo \"PackageNotFoundError: sglang\" >&2; exit 1"
    release = version or "0.5.23"
    py.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-c" ]; then {query}; fi\n'
        '[ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ] || { echo "unexpected: $*"; exit 2; }\n'
        f'shift 2\nexec "{sys.executable}" "{STUB}" --sglang-version {release} "$@"\n'
    )
    py.chmod(0o755)
    return py


def _hybrid(folder: Path) -> Path:
    m = folder / "Qwen3.6-27B"
    m.mkdir(parents=True, exist_ok=True)
    (m / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"]}))
    return m


def test_fleet_up_asks_the_servers_python_for_its_sglang_release(tmp_path):
    from dqa.regen.fleet.spec import FleetSpec
    from dqa.regen.fleet.up import prepare_launch
    from dqa.regen.servers.sglang import SglangOptions

    model = _hybrid(tmp_path)

    def argv(version, **kw):
        prepared = prepare_launch(FleetSpec(model=str(model), python=str(_fake_sglang(tmp_path, version)), engine_options=SglangOptions(mtp=True, **kw)),
                                  dry_run=True)
        return prepared.commands[0].argv, prepared.notes

    assert argv("0.5.11")[0][-2:] == ["--mamba-scheduler-strategy", "extra_buffer"]
    assert argv("0.5.15")[0][-2:] == ["--mamba-radix-cache-strategy", "extra_buffer"]
    got, notes = argv("0.5.23")
    assert not any("mamba" in a for a in got) and notes == []
    got, notes = argv(None)  # it cannot say: the newest known release, and a note
    assert not any("mamba" in a for a in got) and len(notes) == 1
    assert "could not be asked" in notes[0] and sg.NEWEST_KNOWN in notes[0] and "--sglang-version" in notes[0]
    assert argv(None, sglang_version="0.5.11") == ([*got, "--mamba-scheduler-strategy", "extra_buffer"], [])  # the override
    det, _ = argv("0.5.23", deterministic=True)
    assert "--enable-deterministic-inference" in det
    with pytest.raises(UsageError, match="--sglang-version"):
        argv(None, sglang_version="latest")


def test_fleet_up_mtp_on_a_0_5_23_node_starts_and_regen_fits_its_reserve(tmp_path):
    """The issue's two failures end to end: `fleet up --mtp` on a hybrid model must not pass the
    flag 0.5.20+ rejects (exit 2, unrecognized arguments), and regen must leave the speculative
    reserve free (every row was a 400 before)."""
    from fleet_helpers import dqa, fleet_up

    model = _hybrid(tmp_path / "models")
    py = _fake_sglang(tmp_path, "0.5.23")
    fleet = tmp_path / "fleet.json"
    r, base = fleet_up("fleet", "up", "--model", model, "--gpus", "0", "--mtp", "--python", py, "--context-length", "64",
                       "--fleet", fleet, "--timeout", "120", ports=1, cwd=tmp_path)  # fmt: skip
    try:
        assert r.returncode == 0, r.stderr
        cmd = json.loads(fleet.read_text())["endpoints"][0]["cmd"]
        assert "--speculative-algorithm" in cmd and not any("mamba" in a for a in cmd)
        path = degenerate_dataset(tmp_path / "chat.parquet", 4)
        findings = write_findings(tmp_path / "scan", list(range(4)))
        p = dqa("regen", path, "--findings", findings, "--fleet", fleet, "--out", tmp_path / "out", "--json", cwd=tmp_path, timeout=300)
        assert p.returncode == 0, p.stderr
        progress = json.loads(p.stdout)
        assert (progress["done"], progress["failed"]) == (4, 0)
        rows = read_shards(tmp_path / "out").to_pylist()
        assert all(json.loads(x["sampling"])["max_new_tokens"] == 64 - x["prompt_len"] - 4 - sg.SPECULATIVE_MARGIN for x in rows)
    finally:
        dqa("fleet", "down", "--fleet", fleet, "--grace", "10", cwd=tmp_path)
    # The seed's flag on this node: the server refuses it at start, as SGLang >= 0.5.20 does.
    r, _ = fleet_up("fleet", "up", "--model", model, "--gpus", "0", "--mtp", "--python", py, "--sglang-version", "0.5.11",
                    "--fleet", tmp_path / "old.json", "--timeout", "120", ports=1, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 3 and "unrecognized arguments: --mamba-scheduler-strategy extra_buffer" in r.stderr, r.stderr
