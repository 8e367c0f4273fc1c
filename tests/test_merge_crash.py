"""A merge killed at any instant (kill -9) leaves no output that looks complete, and the next run
cleans up and succeeds."""

from __future__ import annotations

import os
import random
import shutil
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
    # Two kills at random instants after the merge began writing; should both miss (the machine
    # wrote faster than they came), up to two more at once when writing begins.
    for attempt in range(4):
        if attempt >= 2 and killed_mid_write:
            break
        proc = start_merge(src, regen, out)
        deadline = time.monotonic() + 120  # bounds a hang only
        while not temps(out) and proc.poll() is None:
            assert time.monotonic() < deadline, "the merge wrote nothing"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3) if attempt < 2 else 0.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.returncode == -signal.SIGKILL and not out.exists():
            killed_mid_write += 1
            assert temps(out), "a killed merge leaves only temporary names"
        # never a dataset at `out` unless it is the complete one
        if out.exists():
            assert read_back(out).num_rows == ROWS
            if attempt < 3:  # start over: the next try must find no output at `out`
                if out.is_dir():
                    shutil.rmtree(out)
                else:
                    out.unlink()
                (out.parent / (out.name + ".merge-report.json")).unlink(missing_ok=True)
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


@pytest.fixture()
def small(tmp_path):
    rows = sample_rows(4)
    ids = [f"c{i}" for i in range(4)]
    regen = tmp_path / "regen"
    write_shard(regen / "shards" / "part-a-000000.parquet", [shard_record(1, rows[1][0], ids[1])])
    return rows, ids, regen


@pytest.mark.parametrize("fmt", ["parquet", "parquet-dir", "hf"])
def test_merged_files_and_folders_get_the_modes_of_a_plain_open_and_mkdir(tmp_path, small, fmt):
    from merge_helpers import FORMAT_NAMES, OUT_NAMES

    from dqa.regen.merge import merge, report_path

    rows, ids, regen = small
    src = write_dataset(base_table(rows, ids), tmp_path / FORMAT_NAMES[fmt], fmt)
    out = tmp_path / OUT_NAMES[fmt]
    old = os.umask(0o027)
    try:
        merge(src, [regen], out)
    finally:
        os.umask(old)
    made = [out, *out.rglob("*"), report_path(out)]
    for p in made:
        want = 0o750 if p.is_dir() else 0o640
        assert p.stat().st_mode & 0o777 == want, (p, oct(p.stat().st_mode & 0o777))


def test_a_running_merges_work_folder_is_left_alone_and_a_dead_ones_removed(tmp_path, small):
    from dqa.regen.merge import merge

    rows, ids, regen = small
    src = write_dataset(base_table(rows, ids), tmp_path / "data", "parquet-dir")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = tmp_path / f".tmp-new.{os.getppid()}.abcd"  # pytest's parent: a process that is running
    dead = tmp_path / f".tmp-new.{gone.pid}.abcd"
    for d in (live, dead):
        (d / "data").mkdir(parents=True)
        (d / "data" / "part.parquet").write_bytes(b"half")
    merge(src, [regen], tmp_path / "new")
    assert live.is_dir() and not dead.exists()
    assert read_back(tmp_path / "new").num_rows == 4


def test_no_report_appears_when_moving_the_merged_dataset_into_place_fails(tmp_path, small, monkeypatch):
    from dqa.audit import writers
    from dqa.regen.merge import merge, report_path

    rows, ids, regen = small
    src = write_dataset(base_table(rows, ids), tmp_path / "data", "parquet-dir")

    def fail(src_dir, dest, *a, **k):
        raise OSError(28, "No space left on device", str(dest))

    monkeypatch.setattr(writers, "replace_dir", fail)
    with pytest.raises(OSError):
        merge(src, [regen], tmp_path / "new")
    assert not (tmp_path / "new").exists() and not report_path(tmp_path / "new").exists()
    assert temps(tmp_path / "new") == []
