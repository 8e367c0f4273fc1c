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


@pytest.mark.parametrize("workers", [1, 2])
def test_a_scan_never_imports_pandas(tmp_path, layouts, workers):
    """pyarrow imports pandas (0.13-0.2 s of CPU) on the first ``to_numpy``, ``pa.array`` or ``pa.table`` of a
    process, and a pool worker would pay it again: the scan converts between numpy and Arrow without them."""
    code = ("import sys; from dqa.audit.scan import ScanOptions, run_scan; "
            f"r = run_scan({str(layouts['row groups'])!r}, {str(tmp_path / 'o')!r}, ScanOptions(tokenizer='qwen3.6', workers={workers})); "
            "assert r.summary['failing_rows'] > 0; print('pandas' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]


def test_numpy_and_arrow_views_round_trip_numbers_bools_and_sliced_arrays():
    import numpy as np
    import pyarrow as pa

    from dqa.audit.token_batch import arrow_view, numpy_view

    for values in (np.arange(11, dtype=np.int32), np.linspace(0, 1, 7), np.array([True, False, True] * 5),
                   np.arange(20, dtype=np.uint64)[::3]):
        arr = arrow_view(values)
        assert arr.to_pylist() == values.tolist()
        assert numpy_view(arr).tolist() == values.tolist()
        assert numpy_view(arr.slice(2, 3)).tolist() == values[2:5].tolist()
    assert numpy_view(arrow_view(np.zeros(0, dtype=np.int64))).dtype == np.int64
    with_nulls = pa.array([1, None, 3], type=pa.int32())
    assert np.isnan(numpy_view(with_nulls)[1])  # not a view: to_numpy's copy
