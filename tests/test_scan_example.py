"""`dqa scan` on the bundled example set finds every planted defect and nothing else.

The example builder (examples/build_example.py) records in truth.parquet which checks each
row should trigger (``planted``) and which assistant turn carries the defect
(``planted_turns``); the scan's findings must equal that, row by row and turn by turn, in
every format. The default set is Qwen3.6 masked the SpecForge way (scanned with
``--tokenizer qwen3.6``), where the seed's "OK." trains 6 tokens; the earlier Qwen3 set
(``template="qwen3"``, 7 tokens) still scans clean with the default preset.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from build_example import build_example  # noqa: E402

from dqa.audit.checks import TURN_CHECKS  # noqa: E402
from dqa.audit.scan import ScanOptions, run_scan  # noqa: E402

ROWS = 1200
KINDS = ["degenerate_template", "duplicate_response", "empty_thinking", "missing_thinking", "truncated",
         "repetition_loop", "mask_misaligned", "no_loss", "length_mismatch", "short_response"]
QWEN36 = ScanOptions(tokenizer="qwen3.6")


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


def compare_turns(findings: pl.DataFrame, truth: pl.DataFrame) -> pl.DataFrame:
    """Rows where the turns the scan flags differ from the planted turns. A planted turn is flagged
    when one of its row's planted checks judges turns (``TURN_CHECKS``); checks of whole samples
    (mask_misaligned, no_loss, length_mismatch) flag no turn."""
    per_turn = pl.lit(sorted(TURN_CHECKS), dtype=pl.List(pl.String))
    expected = pl.when(pl.col("planted").list.set_intersection(per_turn).list.len() > 0).then(pl.col("planted_turns"))
    got = truth.join(findings.select("row", "turns"), on="row", how="left").with_columns(
        expected.otherwise(pl.lit([], dtype=pl.List(pl.Int32))).alias("expected"),
        pl.col("turns").fill_null(pl.lit([], dtype=pl.List(pl.Int32))),
    )
    return got.filter(pl.col("expected") != pl.col("turns"))


def test_scan_finds_every_planted_defect_and_turn_and_no_false_alarm(example, tmp_path):
    path, truth = example
    result = run_scan(path, tmp_path / "scan", QWEN36)
    assert compare(result.findings, truth).height == 0
    assert compare_turns(result.findings, truth).height == 0
    good = truth.filter(pl.col("planted").list.len() == 0)
    assert good.height > ROWS // 2
    assert result.findings.join(good, on="row").height == 0
    for kind in KINDS:
        assert result.summary["checks"][kind]["count"] > 0, kind
    top = result.summary["degenerate_templates"][0]
    assert top["text"] == "</think>\n\nOK.<|im_end|>\n" and top["tokens"] == 6  # the seed's finding


def test_hf_and_jsonl_copies_give_the_same_findings(example, tmp_path):
    _, truth = example
    for fmt in ("hf", "jsonl"):
        path = build_example(tmp_path / fmt, rows=ROWS, seed=7, fmt=fmt)
        findings = run_scan(path, tmp_path / f"scan-{fmt}", QWEN36).findings
        assert compare(findings, truth).height == 0, fmt
        assert compare_turns(findings, truth).height == 0, fmt


def test_the_earlier_qwen3_set_still_scans_clean(tmp_path):
    """The qwen3 set is frozen byte for byte, canned history answers included: every assistant turn is
    trained there, so a per-turn duplicate_response (when that check judges turns) also flags rows whose
    history turn repeats another conversation's; that is the only difference allowed."""
    path = build_example(tmp_path / "qwen3", rows=600, seed=7, template="qwen3")
    truth = pl.read_parquet(tmp_path / "qwen3" / "truth.parquet")
    result = run_scan(path, tmp_path / "scan")
    diff = compare(result.findings, truth)
    if "duplicate_response" in TURN_CHECKS:
        extra = diff.with_columns(pl.col("reasons").list.set_difference(pl.col("planted")).alias("extra"))
        assert extra.filter(pl.col("planted").list.set_difference(pl.col("reasons")).list.len() > 0).height == 0
        assert extra.filter(pl.col("extra") != pl.lit(["duplicate_response"], dtype=pl.List(pl.String))).height == 0
    else:
        assert diff.height == 0
    top = result.summary["degenerate_templates"][0]
    assert top["text"] == "<think>\n\n</think>\n\nOK.<|im_end|>" and top["tokens"] == 7
