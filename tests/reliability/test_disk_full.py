"""Disk full, for real: the output folder sits on a small tmpfs (or loop-mounted ext4) that the
test fills with a filler file, leaving a few KiB to a few hundred KiB free.

- ``dqa regen`` stops with exit 3 and one error line naming the folder and "No space left on
  device"; every shard on disk reads completely and no row is in two places; a rerun while the
  disk is still full fails the same way without losing what was recorded; after space is freed
  (filler deleted, or the tmpfs grown in place) the same command finishes with every selected
  row exactly once, with the tokens the server produced.
- ``dqa scan --out`` and ``dqa merge --out`` on a full disk: exit 3, one line, no output folder
  or file left that looks complete (no temp files either); after space is freed they succeed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from regen_harness import SECRET, SECRET_ENV, assert_exactly_once, assert_no_duplicate_rows, build_regen_data, start_fleet
from smallfs import MountUnavailable, fill, free_bytes, remount, small_filesystem, tree

FS_KIB = 2048


@pytest.fixture()
def smallfs(tmp_path):
    try:
        with small_filesystem(tmp_path / "mnt", FS_KIB) as mount:
            yield mount
    except MountUnavailable as exc:  # not root / no CAP_SYS_ADMIN: these tests cannot run here
        pytest.skip(f"cannot mount a small filesystem: {exc}")


def dqa(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    e.pop("DQA_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True, env=e, timeout=300)


def assert_one_line_disk_full(r: subprocess.CompletedProcess, where: Path) -> str:
    assert r.returncode == 3, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("dqa: error:")]
    assert len(errors) == 1, r.stderr[-2000:]
    assert "No space left on device" in errors[0] and str(where) in errors[0], errors[0]
    return errors[0]


# ------------------------------------------------------------------------------- regen


def regen_args(data, out: Path, url: str) -> list[str]:
    return ["regen", data.dataset, "--findings", data.findings, "--out", out, "--api-key-env", SECRET_ENV,
            "--max-new-tokens", "40", "--shard-rows", "100", "--max-in-flight", "16", "-e", url]


@pytest.mark.parametrize("free_kib,free_how", [(4, "delete"), (40, "delete"), (120, "grow")])
def test_regen_on_a_full_disk_stops_with_exit_3_and_resumes_exactly_once_after_space_is_freed(tmp_path, smallfs, free_kib, free_how):
    data = build_regen_data(tmp_path / "data", rows=960)
    fleet = start_fleet(tmp_path / "fleet", 1)
    out = smallfs / "out"
    env = {SECRET_ENV: SECRET}
    try:
        filler = fill(smallfs, free_kib * 1024)
        r = dqa(*regen_args(data, out, fleet[0].url), env=env)
        line = assert_one_line_disk_full(r, out)
        held = assert_no_duplicate_rows(out)  # every shard reads whole; none overlaps another
        assert held < data.selected.size
        for name in ("run.json", "progress.json"):
            if (out / name).exists():
                json.loads((out / name).read_text())
        # Still full: the rerun fails the same way and loses nothing already recorded.
        r2 = dqa(*regen_args(data, out, fleet[0].url), env=env)
        assert_one_line_disk_full(r2, out)
        assert assert_no_duplicate_rows(out) >= held
        if free_how == "delete":
            filler.unlink()
        else:
            remount(smallfs, FS_KIB * 4)
        assert free_bytes(smallfs) > 1024 * 1024
        r3 = dqa(*regen_args(data, out, fleet[0].url), env=env)
        assert r3.returncode == 0, r3.stderr[-2000:]
        counts = assert_exactly_once(out, data)
        assert not list(out.rglob(".tmp-*"))
        assert json.loads((out / "progress.json").read_text())["state"] == "finished"
        print(f"\nregen free={free_kib} KiB: stopped with {held}/{data.selected.size} rows recorded: {line}; resumed: {counts}")
    finally:
        for s in fleet:
            s.kill()


# ------------------------------------------------------------------------------- scan


def token_dataset(path: Path, rows: int, seed: int = 0) -> Path:
    """Random Qwen3-shaped rows (incompressible tokens, so outputs are large)."""
    rng = np.random.default_rng(seed)
    ids, masks = [], []
    for _ in range(rows):
        prompt = [151644, 872, 198, *rng.integers(1000, 100000, 20).tolist(), 151645, 198, 151644, 77091, 198]
        answer = [*rng.integers(1000, 100000, int(rng.integers(5, 40))).tolist(), 151645]
        ids.append(prompt + answer)
        masks.append([0] * len(prompt) + [1] * len(answer))
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(rows)], "input_ids": pa.array(ids, pa.list_(pa.int32())),
                             "loss_mask": pa.array(masks, pa.list_(pa.uint8()))}), path)
    return path


@pytest.mark.parametrize("free_kib", [4, 64, 400])
def test_scan_out_on_a_full_disk_is_exit_3_and_leaves_no_output(tmp_path, smallfs, free_kib):
    ds = token_dataset(tmp_path / "set.parquet", 20_000)
    out = smallfs / "scan"
    filler = fill(smallfs, free_kib * 1024)
    before = tree(smallfs)
    r = dqa("scan", ds, "--out", out, "--quiet")
    assert_one_line_disk_full(r, smallfs)
    assert tree(smallfs) == before, "scan left files behind on the full disk"
    filler.unlink()
    r = dqa("scan", ds, "--out", out, "--quiet")
    assert r.returncode in (0, 1), r.stderr
    assert {p.name for p in out.iterdir()} == {"findings.parquet", "metrics.parquet", "summary.json", "summary.md", "turns.parquet"}
    assert pq.read_metadata(out / "metrics.parquet").num_rows == 20_000


def test_scan_does_not_replace_a_previous_complete_scan_when_the_disk_fills(tmp_path, smallfs):
    # The earlier scan is of the same dataset (a scan folder holds one dataset's scans), made
    # while it had 50 rows; it has grown to 20,000 since.
    ds = token_dataset(tmp_path / "set.parquet", 50, seed=1)
    out = smallfs / "scan"
    assert dqa("scan", ds, "--out", out, "--quiet").returncode in (0, 1)
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    token_dataset(tmp_path / "set.parquet", 20_000)
    fill(smallfs, 64 * 1024)
    r = dqa("scan", ds, "--out", out, "--quiet")
    assert_one_line_disk_full(r, smallfs)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old, "the old scan was damaged"
    assert not list(smallfs.rglob(".tmp-*"))


# ------------------------------------------------------------------------------- merge


def regen_shard(folder: Path, rows: list[int], dataset: Path) -> Path:
    """A regen output folder with one shard that replaces ``rows`` (prompt = first 25 tokens)."""
    from dqa.regen.store.journal import Result, results_table, write_table

    t = pq.read_table(dataset)
    ids = t.column("input_ids").to_pylist()
    rng = np.random.default_rng(2)
    results = [Result(r, f"r{r}", np.array(ids[r][:25], np.int32), rng.integers(1000, 100000, 60).astype(np.int32), "ok",
                      "stop", None, "http://127.0.0.1:1", 1, 0.1, "m", "{}", r, 1.7e9) for r in rows]
    (folder / "shards").mkdir(parents=True)
    write_table(folder / "shards" / "part-s0of1-000000.parquet", results_table(results))
    return folder


@pytest.mark.parametrize("layout", ["file", "folder"])
@pytest.mark.parametrize("free_kib", [4, 200])
def test_merge_out_on_a_full_disk_is_exit_3_and_leaves_no_output(tmp_path, smallfs, layout, free_kib):
    ds = token_dataset(tmp_path / "set.parquet", 8_000)
    if layout == "folder":
        (tmp_path / "set").mkdir()
        t = pq.read_table(ds)
        for k in range(4):
            pq.write_table(t.slice(k * 2000, 2000), tmp_path / "set" / f"part-{k}.parquet")
        ds = tmp_path / "set"
    regen = regen_shard(tmp_path / "regen", list(range(0, 8000, 7)), tmp_path / "set.parquet")
    new = smallfs / ("new.parquet" if layout == "file" else "new")
    filler = fill(smallfs, free_kib * 1024)
    before = tree(smallfs)
    r = dqa("merge", ds, "--regen", regen, "--out", new, "--quiet")
    assert_one_line_disk_full(r, smallfs)
    assert tree(smallfs) == before, "merge left files behind on the full disk"
    filler.unlink()
    r = dqa("merge", ds, "--regen", regen, "--out", new, "--quiet")
    assert r.returncode == 0, r.stderr
    report = json.loads((smallfs / (new.name + ".merge-report.json")).read_text())
    assert report["replaced"] == len(range(0, 8000, 7)) and report["rows_out"] == 8000
