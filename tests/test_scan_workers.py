"""`dqa scan --workers N`: the same findings, turns and metrics for every N.

The example set (the real Qwen3.6 tokenizer and chat template, planted defects, multi-turn rows)
written with small row groups and as a folder of shards, so the pool has units to cut; the
set-level checks (duplicates, template shares) count over the whole set whatever the cut.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

from build_example import build_example  # noqa: E402


def scan(cwd: Path, data: Path, out: Path, workers: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", "scan", str(data), "-t", "qwen3.6", "--out", str(out),
                           "--workers", str(workers), "--batch-rows", "64", "--json"], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ}, timeout=600)
    assert proc.returncode == 1, proc.stderr  # defects found
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    base = tmp_path_factory.mktemp("layouts")
    data = build_example(base / "data", rows=600, seed=4)
    table = pq.read_table(data)
    one = base / "row-groups.parquet"
    pq.write_table(table, one, row_group_size=40)  # 15 row groups
    shards = base / "shards"
    shards.mkdir()
    for k in range(4):
        pq.write_table(table.slice(k * 150, 150), shards / f"part-{k:05d}.parquet", row_group_size=50)
    return {"row groups": one, "shards": shards}


@pytest.mark.parametrize("layout", ["row groups", "shards"])
def test_findings_turns_and_metrics_are_the_same_for_every_number_of_workers(tmp_path, layouts, layout):
    data = layouts[layout]
    summaries, tables = {}, {}
    for n in (1, 2, 3):
        out = tmp_path / f"scan-{n}"
        summaries[n] = scan(tmp_path, data, out, n)
        tables[n] = {name: pl.read_parquet(out / f"{name}.parquet") for name in ("findings", "turns", "metrics")}
    assert tables[1]["findings"].height > 0
    for n in (2, 3):
        for name in ("findings", "turns", "metrics"):
            assert tables[n][name].equals(tables[1][name]), f"{name} differ with --workers {n}"
        for key in ("failing_rows", "checks", "degenerate_templates", "conventions", "thinking_share"):
            assert summaries[n][key] == summaries[1][key], key


def test_a_negative_worker_count_is_refused_naming_the_option(tmp_path, layouts):
    # 0 is the default: the CPUs the process may run on
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", "scan", str(layouts["row groups"]), "-t", "qwen3.6", "--out",
                           str(tmp_path / "s"), "--workers", "-1"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "--workers -1" in proc.stderr and "Traceback" not in proc.stderr
