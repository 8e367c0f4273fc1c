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


def _wait(cond, what: str, timeout: float = 120) -> None:
    """Poll ``cond`` until it holds; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)


class _Lines:
    """Collect a text pipe's lines in a thread, so a test can wait for one while the process runs."""

    def __init__(self, pipe):
        import threading

        self.lines: list[str] = []
        self._t = threading.Thread(target=lambda: self.lines.extend(iter(pipe.readline, "")), daemon=True)
        self._t.start()

    def text(self) -> str:
        return "".join(self.lines)

    def join(self) -> str:
        self._t.join(60)
        return self.text()


def test_kill_9_at_random_points_then_resume_writes_every_row_exactly_once(data, tmp_path):
    rng = random.Random(7)
    out = tmp_path / "out"
    killed_at = []
    with StubServer(tmp_path, "--latency-s", "0.05", "--latency-jitter-s", "0.1") as s:
        # The first kill falls during start-up, the others mid-run: after this run's first request
        # reached the server and a random number more (at most 20 per run of the 120 rows, so every
        # kill lands before the end, however fast or slow the machine).
        for k in range(3):
            before = s.status()["n_generate"]
            p = _start(data, out, s.url, "--max-in-flight", "3")
            if k == 0:
                time.sleep(0.3)
            else:
                n = rng.randint(1, 20)
                _wait(lambda: s.status()["n_generate"] - before >= n or p.poll() is not None, "requests")
            assert p.poll() is None, f"the run ended before kill {k + 1}: {p.communicate()[1][-2000:]}"
            p.send_signal(signal.SIGKILL)
            p.wait()
            killed_at.append(s.status()["outcomes"].get("ok", 0))
        p = _start(data, out, s.url)
        stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr
    rows = read_shards(out).column("row").to_pylist()
    assert sorted(rows) == SELECTED  # none lost, none twice
    assert killed_at[-1] < len(SELECTED)  # the kills did land before the end
    assert not list((out / "journal").glob("*.log")) and not list(out.rglob(".tmp-*"))


def test_first_ctrl_c_drains_in_flight_requests_and_a_rerun_finishes(data, tmp_path):
    out = tmp_path / "out"
    with StubServer(tmp_path, "--latency-s", "0.3") as s:
        p = _start(data, out, s.url)
        # Ctrl-C once the server has answered a request (dispatch is under way, many rows are left)
        _wait(lambda: s.status()["outcomes"].get("ok", 0) > 0 or p.poll() is not None, "a first reply")
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=120)
        assert p.returncode == 3, stderr
        assert "draining" in stderr and "rerun the same command" in stderr
        progress = json.loads((out / "progress.json").read_text())
        assert progress["state"] == "interrupted" and progress["in_flight"] == 0
        # Drained: every request the server answered is in a shard.
        assert s.status()["outcomes"].get("ok") == read_shards(out).num_rows == progress["done"]
        p = _start(data, out, s.url, "--max-in-flight", "48")
        _, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr
    assert sorted(read_shards(out).column("row").to_pylist()) == SELECTED


def test_second_ctrl_c_cancels_in_flight_requests_at_once(data, tmp_path):
    out = tmp_path / "out"
    # Replies would take 10 minutes: the run can only end in time by cancelling them.
    with StubServer(tmp_path, "--latency-s", "600") as s:
        p = _start(data, out, s.url)
        err = _Lines(p.stderr)
        _wait(lambda: s.status()["inflight"] >= 6 or p.poll() is not None, "6 requests in flight")
        p.send_signal(signal.SIGINT)
        # The second Ctrl-C once the first one was handled (two signals sent back to back can
        # reach the process as one).
        _wait(lambda: "draining" in err.text() or p.poll() is not None, "the first Ctrl-C handled")
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)
        stderr = err.join()
        _wait(lambda: s.status()["outcomes"].get("client_disconnect", 0) >= 6, "the server saw the cancels")
        outcomes = s.status()["outcomes"]
        assert outcomes.get("client_disconnect") == 6 and not outcomes.get("ok")  # cancelled, never answered
    assert p.returncode == 3, stderr
    assert json.loads((out / "progress.json").read_text())["state"] == "interrupted"
    assert read_shards(out).num_rows == 0
