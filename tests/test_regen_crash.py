"""dqa regen survives kill -9 at random points and Ctrl-C: rerunning finishes with every row exactly once."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from regen_helpers import degenerate_dataset, read_shards, write_findings
from servers.sglang_contract import StubServer

SELECTED = list(range(0, 120))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("crash-data")
    path = degenerate_dataset(d / "chat.parquet", 120)
    findings = write_findings(d / "scan", SELECTED)
    return path, findings


def _start(data, out, url, *extra):
    path, findings = data
    cmd = [sys.executable, "-m", "dqa.cli", "regen", str(path), "--findings", str(findings), "-e", url, "--out", str(out),
           "--max-in-flight", "6", "--shard-rows", "10", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _done(out) -> int:
    try:
        return json.loads((out / "progress.json").read_text())["done"]
    except (OSError, ValueError, KeyError):
        return 0


def test_kill_9_at_random_points_then_resume_writes_every_row_exactly_once(data, tmp_path):
    rng = random.Random(7)
    out = tmp_path / "out"
    killed_at = []
    with StubServer(tmp_path, "--latency-s", "0.05", "--latency-jitter-s", "0.1") as s:
        for wait in (0.3, rng.uniform(1.0, 2.0), rng.uniform(1.0, 2.0)):  # during startup, then mid-run
            p = _start(data, out, s.url, "--max-in-flight", "3")
            time.sleep(wait)
            p.send_signal(signal.SIGKILL)
            p.wait()
            killed_at.append(s.status()["outcomes"].get("ok", 0))
        p = _start(data, out, s.url)
        stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr
    rows = read_shards(out).column("row").to_pylist()
    assert sorted(rows) == SELECTED  # none lost, none twice
    assert killed_at[-1] < len(SELECTED)  # the kills did land before the end
    assert not list((out / "journal").glob("*.log")) and not list(out.rglob(".tmp-*"))


def test_first_ctrl_c_drains_in_flight_requests_and_a_rerun_finishes(data, tmp_path):
    out = tmp_path / "out"
    with StubServer(tmp_path, "--latency-s", "0.3") as s:
        p = _start(data, out, s.url)
        deadline = time.monotonic() + 30
        while _done(out) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=30)
        assert p.returncode == 3, stderr
        assert "draining" in stderr and "rerun the same command" in stderr
        progress = json.loads((out / "progress.json").read_text())
        assert progress["state"] == "interrupted" and progress["in_flight"] == 0
        # Drained: every request the server answered is in a shard.
        assert s.status()["outcomes"].get("ok") == read_shards(out).num_rows == progress["done"]
        p = _start(data, out, s.url, "--max-in-flight", "48")
        _, stderr = p.communicate(timeout=60)
    assert p.returncode == 0, stderr
    assert sorted(read_shards(out).column("row").to_pylist()) == SELECTED


def test_second_ctrl_c_cancels_in_flight_requests_at_once(data, tmp_path):
    out = tmp_path / "out"
    with StubServer(tmp_path, "--latency-s", "30") as s:
        p = _start(data, out, s.url)
        deadline = time.monotonic() + 30
        while s.status()["inflight"] < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=20)  # the replies would take 30 s: it did not wait for them
        deadline = time.monotonic() + 10
        while s.status()["outcomes"].get("client_disconnect", 0) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.status()["outcomes"].get("client_disconnect") == 6  # the in-flight requests were cancelled
    assert p.returncode == 3, stderr
    assert json.loads((out / "progress.json").read_text())["state"] == "interrupted"
    assert read_shards(out).num_rows == 0
