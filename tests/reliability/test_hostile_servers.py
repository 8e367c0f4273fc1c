"""``dqa regen`` against generation servers that never end a reply, lie about lengths or break
HTTP's framing (issue 20): every run ends within its deadline, its memory stays bounded, and every
row is recorded ``failed`` with one clear error, never ``ok``; a well-formed gzip-encoded reply is
read as what it is.

Each case is one ``tests/servers/hostile.py`` behaviour behind an honest SGLang front (health,
server_info, models), and one real ``dqa regen`` process: 5 rows, ``--max-in-flight 5
--request-timeout 5 --max-attempts 2``, its peak RSS sampled every 50 ms. Before aiohttp, dqa's
own HTTP client held in none of these: endless headers and a huge Content-Length grew past 1 GiB
with no timeout, a trickling reply was recorded ok after a minute per row, and a smuggled second
reply behind two Content-Lengths was recorded ok.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from regen_helpers import degenerate_dataset, read_shards, write_findings
from servers.hostile import GOOD_REPLY, HostileServer

ROWS = 5
# A dqa regen process holds ~200-300 MiB (polars, pyarrow, the tokenizer); the hand-written client
# grew past 1 GiB on these servers. 600 MiB leaves room for the interpreter, never for a reply.
RSS_LIMIT = 600 * 2**20


def regen(tmp_path: Path, url: str, *extra: str, deadline: float, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run ``dqa regen`` on 5 degenerate rows against ``url``; ``(result, wall seconds, peak RSS)``.
    Fails the test when the run outlives ``deadline``."""
    data = degenerate_dataset(tmp_path / "data.parquet", ROWS)
    findings = write_findings(tmp_path / "scan", list(range(ROWS)))
    args = [sys.executable, "-m", "dqa.cli", "regen", str(data), "--findings", str(findings), "--endpoint", url,
            "--out", str(tmp_path / "out"), "--tokenizer", "qwen3", "--max-in-flight", "5", "--request-timeout", "5",
            "--max-attempts", "2", "--max-new-tokens", "64", "--down-deadline", "20", *extra]
    e = {k: v for k, v in os.environ.items() if k != "DQA_DEBUG"}
    e.update(env or {})
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        p = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                peak[0] = max(peak[0], p.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"dqa regen still running after {deadline} s (peak RSS {peak[0] / 2**20:.0f} MiB); stderr tail: {err[-1500:]}")
    finally:
        done.set()
        sampler.join(5)
    return subprocess.CompletedProcess(args, proc.returncode, out, err), time.monotonic() - t0, peak[0]


@pytest.mark.parametrize("behaviour, words, deadline", [
    ("endless_headers", "not valid HTTP", 60),
    ("huge_content_length", "100,000,000,000 bytes", 60),
    ("endless_chunked", "-byte limit", 60),
    ("trickle", "did not come in full within 5 s", 60),
    ("trickle_huge", "1,000,000,000 bytes", 60),
    ("two_content_lengths", "Duplicate Content-Length", 60),
    ("signed_chunk_size", "chunk size", 60),
    ("underscore_chunk_size", "chunk size", 60),
])
def test_a_hostile_reply_fails_its_row_within_the_deadline_and_bounded_memory(tmp_path, behaviour, words, deadline):
    server = HostileServer(behaviour).start()
    try:
        r, wall, peak = regen(tmp_path, server.url, deadline=deadline)
    finally:
        server.stop()
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 3, f"a run whose every request failed must not exit {r.returncode}: {r.stderr[-2000:]}"
    assert peak < RSS_LIMIT, f"peak RSS {peak / 2**20:.0f} MiB"
    shards = read_shards(tmp_path / "out").to_pylist()
    assert sorted(s["row"] for s in shards) == list(range(ROWS))
    assert {s["status"] for s in shards} == {"failed"}, {s["status"] for s in shards}
    for s in shards:
        assert s["attempts"] >= 2 and words in s["error"] and "127.0.0.1" in s["error"], s["error"]
        assert "\n" not in s["error"] and "\\x" not in s["error"] and len(s["error"]) < 400, s["error"]
    # Every attempt counted is a request the server got (requests in flight when the endpoint was
    # taken out count too, and go to the next attempt), and none was sent behind dqa's back.
    assert server.posts == sum(s["attempts"] for s in shards)
    if behaviour == "trickle":  # two attempts of 5 s each per row, 5 rows at once
        assert wall > 10


def test_a_gzip_encoded_reply_is_decoded_and_recorded_ok(tmp_path):
    server = HostileServer("gzip_reply").start()
    try:
        r, _, _ = regen(tmp_path, server.url, deadline=60)
    finally:
        server.stop()
    assert r.returncode == 0, r.stderr[-2000:]
    shards = read_shards(tmp_path / "out").to_pylist()
    assert [s["status"] for s in shards] == ["ok"] * ROWS
    assert all(s["input_ids"][s["prompt_len"]:] == GOOD_REPLY["output_ids"] and s["attempts"] == 1 for s in shards)
