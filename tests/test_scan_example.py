"""`dqa scan` on the bundled example set finds every planted defect and nothing else.

The example builder (examples/build_example.py) records in truth.parquet which checks each
row should trigger; the scan's findings must equal that, row by row, in every format.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from build_example import build_example  # noqa: E402

from dqa.audit.scan import run_scan  # noqa: E402

ROWS = 1200


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    out = tmp_path_factory.mktemp("example")
    path = build_example(out, rows=ROWS, seed=7)
    return path, pl.read_parquet(out / "truth.parquet")


def compare(findings: pl.DataFrame, truth: pl.DataFrame) -> pl.DataFrame:
    """Rows where the scan's reasons differ from the planted ones."""
    got = truth.select("row", "planted").join(findings.select("row", "reasons"), on="row", how="left")
    got = got.with_columns(pl.col("reasons").fill_null(pl.lit([], dtype=pl.List(pl.String))))
    return got.filter(pl.col("planted").list.sort() != pl.col("reasons").list.sort())


def test_scan_finds_every_planted_defect_and_no_false_alarm(example, tmp_path):
    path, truth = example
    result = run_scan(path, tmp_path / "scan")
    assert compare(result.findings, truth).height == 0
    good = truth.filter(pl.col("planted").list.len() == 0)
    assert good.height > ROWS // 2
    assert result.findings.join(good, on="row").height == 0
    for kind in ["degenerate_template", "duplicate_response", "empty_thinking", "missing_thinking", "truncated",
                 "repetition_loop", "mask_misaligned", "no_loss", "length_mismatch", "short_response"]:
        assert result.summary["checks"][kind]["count"] > 0, kind
    top = result.summary["degenerate_templates"][0]
    assert top["text"] == "<think>\n\n</think>\n\nOK.<|im_end|>" and top["tokens"] == 7


def test_hf_and_jsonl_copies_give_the_same_findings(example, tmp_path):
    _, truth = example
    for fmt in ("hf", "jsonl"):
        path = build_example(tmp_path / fmt, rows=ROWS, seed=7, fmt=fmt)
        assert compare(run_scan(path, tmp_path / f"scan-{fmt}").findings, truth).height == 0, fmt
