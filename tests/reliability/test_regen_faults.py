"""Regen against a misbehaving fleet of three SGLang-contract servers (real processes): whatever
the servers do, every selected row ends up in the output exactly once, with the status and the
tokens the server gave, and the API key is written nowhere. Each test records how throughput
degraded (printed in the terminal summary; the figures go into RELIABILITY.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from regen_harness import (
    MAX_NEW_TOKENS,
    SECRET,
    SECRET_ENV,
    assert_exactly_once,
    assert_no_duplicate_rows,
    assert_no_secret,
    build_regen_data,
    fast_config,
    read_shards,
    record_figure,
    soak,
    wait_until,
)


def run(config):
    from dqa.regen.run import regenerate

    t0 = time.perf_counter()
    result = regenerate(config)
    return result, time.perf_counter() - t0


def served(stub) -> int:
    """Generate requests the stub answered with a reply (not a fault) since it started."""
    return stub.status()["outcomes"].get("ok", 0)


def in_background(fn) -> threading.Thread:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # surfaced by join_ok
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t


def join_ok(t: threading.Thread) -> None:
    t.join(30)
    assert not t.is_alive(), "fault thread did not finish"
    if t.errors:  # type: ignore[attr-defined]
        raise t.errors[0]  # type: ignore[attr-defined]


def test_clean_fleet_regenerates_every_selected_row_once(tmp_path, fleet, regen_data, secret_env):
    log: list[str] = []
    out = tmp_path / "out"
    result, wall = run(fast_config(regen_data, out, [s.url for s in fleet], log))
    assert result.exit_code == 0, result.message
    counts = assert_exactly_once(out, regen_data)
    assert counts["failed"] == 1 and counts["ok"] > 0 and counts["length"] > 0
    assert_no_secret(out, *log, log_dirs=(tmp_path / "fleet",))
    record_figure("clean", out, wall, counts)


def test_endpoint_that_dies_mid_run_and_comes_back(tmp_path, fleet, secret_env):
    # a longer run (600 rows), so the revived endpoint is probed back in before the end
    regen_data = build_regen_data(tmp_path / "data", rows=900)
    log: list[str] = []
    out = tmp_path / "out"
    victim = fleet[0]
    others = fleet[1:]
    victim.control(die_after=15)  # the process exits when its 16th generate request arrives
    first_pid = victim.proc.pid

    def revive() -> None:
        assert wait_until(lambda: victim.proc.poll() is not None, 120), "the endpoint never died"
        # Until the revived endpoint has served again, the others answer slowly (1 s a request,
        # 16 rows/s together): the run cannot finish before it is probed back in, however slow
        # the restart is on a loaded machine. Then they are fast again.
        for s in others:
            s.control(latency_s=1.0)
        time.sleep(0.3)
        victim.restart()
        assert wait_until(lambda: served(victim) > 0, 120), "the revived endpoint was never used again"
        for s in others:
            s.control(latency_s=0.05)

    t = in_background(revive)
    result, wall = run(fast_config(regen_data, out, [s.url for s in fleet], log))
    join_ok(t)
    assert result.exit_code == 0, result.message
    counts = assert_exactly_once(out, regen_data)
    assert victim.proc.pid != first_pid
    assert served(victim) > 0, "the revived endpoint was never used again"
    assert_no_secret(out, *log, log_dirs=(tmp_path / "fleet",))
    record_figure("one endpoint dies, back after 0.3 s", out, wall, counts,
                  note="600 rows; the others at 1 s/request until it served again")


def test_endpoint_answering_500_503_429_for_a_while(tmp_path, fleet, regen_data, secret_env):
    log: list[str] = []
    out = tmp_path / "out"
    # The 11th to the 40th generate requests it receives get 500/503/429: counted in requests, not
    # seconds, so the errors land inside the run however long its start-up takes.
    fleet[1].control(error_window=[10, 40], error_statuses=[500, 503, 429])
    result, wall = run(fast_config(regen_data, out, [s.url for s in fleet], log))
    assert result.exit_code == 0, result.message
    counts = assert_exactly_once(out, regen_data)
    outcomes = fleet[1].status()["outcomes"]
    assert sum(v for k, v in outcomes.items() if k in ("http_500", "http_503", "http_429")) > 0
    t = read_shards(out)
    assert max(t.column("attempts").to_pylist()) > 1
    assert_no_secret(out, *log, log_dirs=(tmp_path / "fleet",))
    record_figure("one endpoint 500/503/429 x30 requests", out, wall, counts)


def test_endpoint_that_stalls_is_taken_out_and_its_work_moves(tmp_path, fleet, regen_data, secret_env):
    log: list[str] = []
    out = tmp_path / "out"
    stuck = fleet[2]

    def stall_for_a_while() -> None:
        assert wait_until(lambda: served(stuck) >= 10, 120)
        stuck.control(stall_share=1.0)  # accepts, never answers; /health_generate goes 503
        time.sleep(1.5)
        # and until the client has given up on a stalled request (the health check took the
        # endpoint out), however late that comes on a loaded machine
        assert wait_until(lambda: stuck.status()["outcomes"].get("client_disconnect", 0) > 0, 120)
        stuck.control(stall_share=0.0)

    t = in_background(stall_for_a_while)
    # request_timeout stays long: the health check, not a read timeout, must move the work
    result, wall = run(fast_config(regen_data, out, [s.url for s in fleet], log, request_timeout=60.0))
    join_ok(t)
    assert result.exit_code == 0, result.message
    counts = assert_exactly_once(out, regen_data)
    outcomes = stuck.status()["outcomes"]
    # the stalled requests were cancelled by the client (the server saw the disconnects) and re-sent elsewhere
    assert outcomes.get("stall", 0) > 0 and outcomes.get("client_disconnect", 0) > 0
    assert_no_secret(out, *log, log_dirs=(tmp_path / "fleet",))
    record_figure("one endpoint stalls >= 1.5 s", out, wall, counts, note="until the client gave up on it")


def test_malformed_json_error_chunks_drops_and_aborts_are_retried(tmp_path, fleet, regen_data, secret_env):
    log: list[str] = []
    out = tmp_path / "out"
    fleet[0].control(malformed_share=0.15, error_chunk_share=0.15)
    fleet[1].control(drop_share=0.15)
    fleet[2].control(abort_share=0.15)
    result, wall = run(fast_config(regen_data, out, [s.url for s in fleet], log))
    assert result.exit_code == 0, result.message
    counts = assert_exactly_once(out, regen_data)
    seen = {k for s in fleet for k in s.status()["outcomes"]}
    assert {"malformed", "error_chunk", "drop", "abort"} <= seen
    assert_no_secret(out, *log, log_dirs=(tmp_path / "fleet",))
    record_figure("15% malformed/error-chunk/drop/abort", out, wall, counts)


def test_all_endpoints_down_stops_with_exit_3_and_a_rerun_resumes(tmp_path, fleet, regen_data, secret_env):
    log: list[str] = []
    out = tmp_path / "out"
    urls = [s.url for s in fleet]

    run_over = threading.Event()
    killed = threading.Event()

    def kill_all() -> None:
        if wait_until(lambda: run_over.is_set() or sum(served(s) for s in fleet) >= 40, 120) and not run_over.is_set():
            for s in fleet:
                s.kill()
            killed.set()

    t = in_background(kill_all)
    # Only the kill may take the endpoints out: health checks and requests get timeouts a loaded machine cannot
    # miss (a killed server refuses connections, which takes it out at once), so the 1 s to stop counts from it.
    try:
        result, wall1 = run(fast_config(regen_data, out, urls, log, down_deadline=1.0, health_timeout=20.0,
                                        request_timeout=60.0, connect_timeout=20.0))
    finally:
        run_over.set()
    join_ok(t)
    assert killed.is_set(), f"the run ended before the endpoints were killed: {result.exit_code} {result.message}"
    assert result.exit_code == 3
    assert "down" in result.message and "rerun" in result.message, result.message
    done_first = assert_no_duplicate_rows(out)
    assert 0 < done_first < regen_data.selected.size
    first_rows = set(read_shards(out).column("row").to_pylist())

    for s in fleet:
        s.restart()
    result, wall2 = run(fast_config(regen_data, out, urls, log))
    assert result.exit_code == 0, result.message
    counts = assert_exactly_once(out, regen_data)
    # the rerun asked only for rows the first run had not recorded (rid = "<sample id>:<attempt>")
    asked = {int(r["rid"].split(":")[0].split("-")[1]) for s in fleet for r in s.requests() if r["rid"]}
    assert asked and not asked & first_rows
    assert_no_secret(out, *log, log_dirs=(tmp_path / "fleet",))
    record_figure("all endpoints down, then rerun", out, wall1 + wall2, counts,
                  note=f"first run stopped after {done_first} rows")


def test_cli_exits_3_with_a_clear_message_when_no_endpoint_answers(tmp_path, regen_data):
    from fleet_helpers import free_port_base

    # Nothing listens there: below the ephemeral range, where no server started with port 0 lands.
    dead = f"http://127.0.0.1:{free_port_base(1)}"
    env = {**os.environ, SECRET_ENV: SECRET}
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dqa.cli", "regen", str(regen_data.dataset), "--findings", str(regen_data.findings),
           "-e", dead, "--out", str(out), "--api-key-env", SECRET_ENV, "--down-deadline", "1",
           "--max-new-tokens", str(MAX_NEW_TOKENS)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 3, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("dqa: error:") and "down" in last and "rerun" in last, p.stderr
    assert "Traceback" not in p.stderr and SECRET not in p.stderr + p.stdout
    assert_no_secret(out)


@pytest.mark.soak
@pytest.mark.skipif(not soak(), reason="soak variant: run with DQA_SOAK=1")
def test_soak_random_faults_on_every_endpoint_for_a_long_run(tmp_path, fleet, secret_env):
    """Chaos for ~30 s: every 0.2-0.8 s a random endpoint gets a random fault (error window,
    stall, malformed/error-chunk/drop/abort burst, death with a later restart)."""
    import random

    data = build_regen_data(tmp_path / "data", rows=9000)
    log: list[str] = []
    out = tmp_path / "out"
    rng = random.Random(7)
    done = threading.Event()
    actions: dict[str, int] = {}

    def chaos() -> None:
        while not done.is_set():
            time.sleep(rng.uniform(0.2, 0.8))
            s = rng.choice(fleet)
            if not s.alive():
                s.restart()
                continue
            act = rng.choice(["errors", "stall", "garbage", "die", "calm"])
            actions[act] = actions.get(act, 0) + 1
            try:
                if act == "errors":
                    s.control(error_for_s=rng.uniform(0.3, 2.0))
                elif act == "stall":
                    s.control(stall_share=1.0)
                    time.sleep(rng.uniform(0.3, 1.5))
                    s.control(stall_share=0.0)
                elif act == "garbage":
                    s.control(malformed_share=0.1, error_chunk_share=0.1, drop_share=0.1, abort_share=0.1)
                elif act == "die":
                    s.kill()
                else:
                    s.control(malformed_share=0, error_chunk_share=0, drop_share=0, abort_share=0, stall_share=0)
            except OSError:
                pass  # the endpoint died under us: the next round restarts it

    t = in_background(chaos)
    try:
        result, wall = run(fast_config(data, out, [s.url for s in fleet], log, down_deadline=60.0))
    finally:
        done.set()
        join_ok(t)
    assert result.exit_code == 0, result.message
    counts = assert_exactly_once(out, data)
    assert_no_secret(out, *log, log_dirs=(tmp_path / "fleet",))
    record_figure("soak: random faults on all endpoints", out, wall, counts, note=json.dumps(actions, sort_keys=True))
