"""A merge killed at any instant (kill -9) leaves no output that looks complete, and the next run
cleans up and succeeds."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from merge_helpers import base_table, read_back, sample_rows, shard_record, write_dataset, write_shard

ROWS = 1500


def big_dataset(tmp_path: Path, fmt: str, name: str) -> tuple[Path, Path, list[str]]:
    """ROWS rows (real Qwen3 renderings, repeated with distinct ids) and a regen folder replacing every 3rd."""
    base = sample_rows(5)
    rows = [base[i % 5] for i in range(ROWS)]
    ids = [f"c{i}" for i in range(ROWS)]
    src = write_dataset(base_table(rows, ids), tmp_path / name, fmt, shards=4)
    regen = tmp_path / "regen"
    recs = [shard_record(i, rows[i][0], ids[i]) for i in range(0, ROWS, 3)]
    for k in range(4):
        write_shard(regen / "shards" / f"part-a-{k:06d}.parquet", recs[k::4])
    return src, regen, ids


def start_merge(src: Path, regen: Path, out: Path) -> subprocess.Popen:
    # One row per batch: the run lasts long enough to be killed while it writes.
    cmd = [sys.executable, "-m", "dqa.cli", "merge", str(src), "--regen", str(regen), "--out", str(out),
           "--batch-rows", "1", "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def temps(out: Path) -> list[Path]:
    return [p for p in out.parent.iterdir() if p.name.startswith(".tmp-" + out.name)]


@pytest.mark.parametrize("fmt,name,out_name", [("hf", "data", "new"), ("jsonl", "data.jsonl", "new.jsonl")])
def test_kill_9_mid_merge_leaves_no_complete_looking_output(tmp_path, fmt, name, out_name):
    src, regen, ids = big_dataset(tmp_path, fmt, name)
    out = tmp_path / out_name
    rng = random.Random(7)
    killed_mid_write = 0
    for attempt in range(2):
        proc = start_merge(src, regen, out)
        deadline = time.monotonic() + 60
        while not temps(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.returncode == -signal.SIGKILL and not out.exists():
            killed_mid_write += 1
            assert temps(out), "a killed merge leaves only temporary names"
        # never a dataset at `out` unless it is the complete one
        if out.exists():
            assert read_back(out).num_rows == ROWS
            break
    assert killed_mid_write >= 1

    if not out.exists():
        done = subprocess.run([sys.executable, "-m", "dqa.cli", "merge", str(src), "--regen", str(regen), "--out", str(out),
                               "--batch-rows", "512", "--quiet"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    assert temps(out) == []  # the rerun removed the leftovers
    back = read_back(out)
    assert back.column("id").to_pylist() == ids
    prov = back.column("dqa_regen")
    replaced = [i for i in range(ROWS) if (prov[i].as_py() not in (None, "null"))]
    assert replaced == list(range(0, ROWS, 3))
    if fmt == "hf":
        import datasets

        assert datasets.load_from_disk(str(out)).num_rows == ROWS
    assert isinstance(back, pa.Table)
