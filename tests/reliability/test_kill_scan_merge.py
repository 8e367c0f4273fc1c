"""kill -9 of `dqa scan` and `dqa merge` at random instants (helper M's test_merge_crash covers
merge into HF and JSONL outputs at a few instants; this campaign covers scan, and merge into a
parquet shard folder, at many random instants, and also re-kills the cleanup run).

After every kill: the output path holds nothing, or a complete earlier result, never a partial
one (no findings without metrics, no summary that the metrics contradict, no merged folder with
a file missing); at most ``.tmp-*`` leftovers, which the next run removes or ignores. A final
uninterrupted run succeeds and equals a run made without any kill.

Soak (DQA_SOAK=1): 40 kills per command instead of 8.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

KILLS = 40 if os.environ.get("DQA_SOAK") == "1" else 8


def dataset_folder(root: Path, rows: int = 60_000, files: int = 6) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    per = rows // files
    for k in range(files):
        ids, masks = [], []
        for i in range(per):
            prompt = [151644, 872, 198, *rng.integers(1000, 90000, 12).tolist(), 151645, 198, 151644, 77091, 198]
            answer = [151667, 271, 151668, 271, 3925, 13, 151645] if i % 4 == 0 else [*rng.integers(1000, 90000, 20).tolist(), 151645]
            ids.append(prompt + answer)
            masks.append([0] * len(prompt) + [1] * len(answer))
        pq.write_table(pa.table({"id": [f"f{k}-{i}" for i in range(per)], "input_ids": pa.array(ids, pa.list_(pa.int32())),
                                 "loss_mask": pa.array(masks, pa.list_(pa.uint8()))}), root / f"part-{k:02d}.parquet")
    return root


def run(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def kill_at(args: list, instant: float) -> int | None:
    """Start the command, kill -9 it after ``instant`` seconds; None when it finished first, else its exit status."""
    p = subprocess.Popen([sys.executable, "-m", "dqa.cli", *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(instant)
    if p.poll() is not None:
        return None
    p.send_signal(signal.SIGKILL)
    return p.wait()


def scan_state(out: Path) -> str:
    """'absent', or 'complete' (all four files, consistent with each other); anything else fails the test."""
    if not out.exists():
        return "absent"
    names = {p.name for p in out.iterdir()}
    assert names == {"findings.parquet", "metrics.parquet", "summary.json", "summary.md"}, f"partial scan folder: {names}"
    summary = json.loads((out / "summary.json").read_text())
    metrics = pq.read_table(out / "metrics.parquet", columns=["row", "failed"])
    findings = pq.read_table(out / "findings.parquet")
    assert metrics.num_rows == summary["rows"] and findings.num_rows == summary["failing_rows"]
    assert findings.num_rows == sum(metrics.column("failed").to_pylist())
    return "complete"


def test_kill_9_during_scan_never_leaves_a_partial_scan_folder(tmp_path):
    data = dataset_folder(tmp_path / "data")
    out = tmp_path / "scan"
    t0 = time.perf_counter()
    ref = run("scan", data, "--out", tmp_path / "reference", "--quiet")
    full = time.perf_counter() - t0
    assert ref.returncode == 1, ref.stderr
    rng = random.Random(5)
    states, landed = [], 0
    for k in range(KILLS):
        if k == KILLS // 2:  # from here on an earlier complete scan sits at --out: it must survive or be replaced whole
            assert run("scan", data, "--out", out, "--quiet").returncode == 1
        if kill_at(["scan", data, "--out", out, "--quiet"], rng.uniform(0.1, full * 1.1)) is not None:
            landed += 1
        states.append(scan_state(out))
    final = run("scan", data, "--out", out, "--quiet")
    assert final.returncode == 1, final.stderr
    assert scan_state(out) == "complete"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-scan")], "the rerun left temp folders"
    for name in ("findings.parquet", "metrics.parquet"):
        assert pq.read_table(out / name).equals(pq.read_table(tmp_path / "reference" / name)), name
    assert landed >= KILLS // 2, f"only {landed} kills landed before the scan finished"
    print(f"\nscan kill -9: {landed}/{KILLS} landed mid-run (scan takes {full:.1f} s); states after kills: "
          f"{states.count('absent')} absent, {states.count('complete')} complete (earlier scan kept)")


def test_kill_9_during_merge_into_a_shard_folder_never_leaves_a_partial_folder(tmp_path):
    from dqa.regen.journal import Result, results_table, write_table

    data = dataset_folder(tmp_path / "data", rows=24_000, files=4)
    table = pa.concat_tables([pq.read_table(p) for p in sorted(data.glob("*.parquet"))])
    ids = table.column("input_ids").to_pylist()
    regen = tmp_path / "regen"
    rng = np.random.default_rng(1)
    rows = list(range(0, table.num_rows, 4))
    results = [Result(r, table.column("id")[r].as_py(), np.array(ids[r][:20], np.int32),
                      rng.integers(1000, 90000, 40).astype(np.int32), "ok", "stop", None, "http://h:1", 1, 0.1, "m", "{}", r,
                      1.7e9) for r in rows]
    for k in range(3):
        write_table(regen / "shards" / f"part-s0of1-{k:06d}.parquet", results_table(results[k::3]))
    new = tmp_path / "merged"
    args = ["merge", data, "--regen", regen, "--out", new, "--batch-rows", "64", "--quiet"]
    t0 = time.perf_counter()
    ref = run(*args[:5], tmp_path / "reference", *args[6:])
    full = time.perf_counter() - t0
    assert ref.returncode == 0, ref.stderr
    r2 = random.Random(6)
    landed = 0
    for _ in range(KILLS):
        if kill_at(args, r2.uniform(0.1, full * 0.9)) is not None:
            landed += 1
        if new.exists():  # a finished earlier run: whole, with its report
            assert sorted(p.name for p in new.iterdir()) == sorted(p.name for p in data.iterdir())
            assert (tmp_path / "merged.merge-report.json").is_file()
            break
        assert not (tmp_path / "merged.merge-report.json").exists(), "a report without its merged folder"
    final = run(*args, "--force")
    assert final.returncode == 0, final.stderr
    for p in sorted(data.iterdir()):
        assert pq.read_table(new / p.name).equals(pq.read_table(tmp_path / "reference" / p.name)), p.name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-merged")], "temp folders left after a clean run"
    assert landed >= 3, f"only {landed} kills landed before the merge finished"
    print(f"\nmerge kill -9: {landed} kills landed mid-run (merge takes {full:.1f} s)")
