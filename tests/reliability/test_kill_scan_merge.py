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
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

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


def start(args: list) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dqa.cli", *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for_work_folder(p: subprocess.Popen, out: Path, timeout: float = 120) -> bool:
    """Wait until ``p`` has made its work folder beside ``out`` (``.tmp-NAME.PID.*``: it has started
    writing); False when ``p`` ended first."""
    prefix = f".tmp-{out.name}.{p.pid}."
    deadline = time.monotonic() + timeout
    while p.poll() is None:
        if any(x.name.startswith(prefix) for x in out.parent.iterdir()):
            return True
        assert time.monotonic() < deadline, f"no work folder {prefix}* after {timeout} s"
        time.sleep(0.005)
    return False


def write_phase(args: list, out: Path) -> tuple[float, float]:
    """Run the command once; return (seconds until its work folder appeared, seconds from then until it ended)."""
    p = start(args)
    t0 = time.perf_counter()
    assert wait_for_work_folder(p, out), "the command ended without making a work folder"
    t1 = time.perf_counter()
    p.wait(300)
    return t1 - t0, time.perf_counter() - t1


def kill_landing(args: list, out: Path, rng: random.Random, before: float, phase: float,
                 on_finished: Callable[[], None] = lambda: None, tries: int = 6) -> str:
    """kill -9 the command at a random instant, retrying (sooner each time) until a kill lands before its commit.

    One kill in four falls in start-up (within ``before`` seconds, before any output); the others
    a random part of ``phase`` after the command's work folder appeared. Where a kill fell is
    observed, not inferred from the clock: 'writing' when the command's work folder was still
    there at the kill, 'startup' when it had not appeared yet. A try that ran past its commit
    (it finished, or its work folder was already renamed into place) calls ``on_finished()`` (to
    check the output and put ``out`` back as it was) and is retried sooner. Returns 'writing',
    'startup' or 'missed' (every try ran past its commit).
    """
    startup = rng.random() < 0.25
    share = rng.random()
    for k in range(tries):
        inode = out.stat().st_ino if out.exists() else None
        p = start(args)
        prefix = f".tmp-{out.name}.{p.pid}."
        if startup:
            time.sleep(share * before / 2**k)
        elif wait_for_work_folder(p, out):
            time.sleep(share * phase / 2**k)
        seen = any(x.name.startswith(prefix) for x in out.parent.iterdir())
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
            if seen:
                return "writing"
            if (out.stat().st_ino if out.exists() else None) == inode:  # nothing renamed into place yet
                return "startup"
        else:
            p.wait()
        on_finished()
    return "missed"


def scan_state(out: Path) -> str:
    """'absent', or 'complete' (all five files, consistent with each other); anything else fails the test."""
    if not out.exists():
        return "absent"
    names = {p.name for p in out.iterdir()}
    assert names == {"findings.parquet", "metrics.parquet", "summary.json", "summary.md", "turns.parquet"}, f"partial scan folder: {names}"
    summary = json.loads((out / "summary.json").read_text())
    metrics = pq.read_table(out / "metrics.parquet", columns=["row", "failed"])
    findings = pq.read_table(out / "findings.parquet")
    assert metrics.num_rows == summary["rows"] and findings.num_rows == summary["failing_rows"]
    assert findings.num_rows == sum(metrics.column("failed").to_pylist())
    return "complete"


def test_kill_9_during_scan_never_leaves_a_partial_scan_folder(tmp_path):
    data = dataset_folder(tmp_path / "data")
    out = tmp_path / "scan"
    ref = run("scan", data, "--out", tmp_path / "reference", "--quiet")
    assert ref.returncode == 1, ref.stderr
    before, phase = write_phase(["scan", data, "--out", tmp_path / "timing", "--quiet"], tmp_path / "timing")
    rng = random.Random(5)
    states, where = [], []
    for k in range(KILLS):
        if k == KILLS // 2:  # from here on an earlier complete scan sits at --out: it must survive or be replaced whole
            assert run("scan", data, "--out", out, "--quiet").returncode == 1
        complete_before = out.exists()

        def finished() -> None:  # a try that ran to the end: its scan is whole; keep the campaign's premise
            assert scan_state(out) == "complete"
            if not complete_before:
                shutil.rmtree(out)

        where.append(kill_landing(["scan", data, "--out", out, "--quiet"], out, rng, before, phase, finished))
        states.append(scan_state(out))
    final = run("scan", data, "--out", out, "--quiet")
    assert final.returncode == 1, final.stderr
    assert scan_state(out) == "complete"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-scan")], "the rerun left temp folders"
    for name in ("findings.parquet", "metrics.parquet"):
        assert pq.read_table(out / name).equals(pq.read_table(tmp_path / "reference" / name)), name
    assert where.count("writing") >= KILLS // 2, f"kills: {where}"
    print(f"\nscan kill -9: {where.count('writing')} of {KILLS} kills landed while writing, {where.count('startup')} in "
          f"start-up (start-up {before:.1f} s, writing {phase:.1f} s); states after kills: "
          f"{states.count('absent')} absent, {states.count('complete')} complete (earlier scan kept)")


def test_kill_9_during_merge_into_a_shard_folder_never_leaves_a_partial_folder(tmp_path):
    from dqa.regen.store.journal import Result, results_table, write_table

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
    report = tmp_path / "merged.merge-report.json"
    args = ["merge", data, "--regen", regen, "--out", new, "--batch-rows", "64", "--quiet"]
    ref = run(*args[:5], tmp_path / "reference", *args[6:])
    assert ref.returncode == 0, ref.stderr
    before, phase = write_phase([*args[:5], tmp_path / "timing", *args[6:]], tmp_path / "timing")
    r2 = random.Random(6)
    where = []

    def finished() -> None:  # a try that ran to the end: whole, with its report; start over
        assert sorted(p.name for p in new.iterdir()) == sorted(p.name for p in data.iterdir())
        assert report.is_file()
        shutil.rmtree(new)
        report.unlink()

    for _ in range(KILLS):
        where.append(kill_landing(args, new, r2, before, phase * 0.9, finished))
        assert not new.exists(), "a killed merge left a dataset at --out"
        assert not report.exists(), "a report without its merged folder"
    final = run(*args, "--force")
    assert final.returncode == 0, final.stderr
    for p in sorted(data.iterdir()):
        assert pq.read_table(new / p.name).equals(pq.read_table(tmp_path / "reference" / p.name)), p.name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-merged")], "temp folders left after a clean run"
    assert where.count("writing") >= KILLS // 2, f"kills: {where}"
    print(f"\nmerge kill -9: {where.count('writing')} of {KILLS} kills landed while writing (start-up {before:.1f} s, "
          f"writing {phase:.1f} s)")
