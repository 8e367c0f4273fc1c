"""Specification of dqa's front door for Python: ``dqa.scan``, ``dqa.gate`` (and the shape ``dqa.regenerate``
and ``dqa.merge`` share: inputs as arguments, a typed result, dqa's own errors, never ``sys.exit``).

The place to catch a bad generation is right after tokenizing, in the training script, before hidden
states are extracted. There the data is a ``datasets.Dataset`` (SpecForge's ``build_eagle3_dataset``,
a TRL ``SFTTrainer`` dataset), a ``pyarrow.Table`` or a polars DataFrame in memory:

- ``dqa.scan(ds, tokenizer=...)`` finds exactly what ``dqa scan`` finds on the same rows saved to disk
  (the set here: Qwen3's real tokenizer and chat template, masked by SpecForge's rule, a quarter of the
  answers the thinking-off "OK."), and writes nothing the caller must clean up;
- ``result.mask`` (True = the row passes) used with ``Dataset.select``/``Dataset.filter`` leaves exactly
  the rows no check flags;
- a ``datasets`` selection is scanned as selected, rows numbered in its own order;
- ``out=`` keeps the scan folder, as ``dqa scan --out`` does;
- bad input raises ``InputError``/``UsageError`` (``TypeError`` for an unknown option), never exits;
- ``dqa.gate`` returns the verdict ``dqa gate`` gives, with ``gate.json`` as its report; a failed gate is
  a result, not an error.
"""

from __future__ import annotations

import json
import random

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

import dqa
from chatdata import sentence
from dqa.errors import InputError, UsageError
from peer_conventions import specforge

datasets = pytest.importorskip("datasets")

ROWS = 48
OK_EVERY = 4  # rows 0, 4, 8, ...: the thinking-off "OK." answer


def conversation(i: int, rng: random.Random) -> list[dict]:
    question = {"role": "user", "content": f"Question {i}: {sentence(rng, 8)}"}
    if i % OK_EVERY == 0:  # what a generation with thinking off gave back
        return [question, {"role": "assistant", "content": "<think>\n\n</think>\n\nOK."}]
    return [question, {"role": "assistant", "content": f"<think>\n{sentence(rng, 20)}\n</think>\n\n{sentence(rng, 30)}"}]


@pytest.fixture(scope="module")
def tokenized(qwen3):
    """The set as a training script holds it after tokenizing: ``{"id", "input_ids", "loss_mask"}`` columns."""
    rng = random.Random(0)
    rows = [specforge(qwen3, conversation(i, rng)) for i in range(ROWS)]
    return {"id": [f"s{i}" for i in range(ROWS)], "input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows]}


@pytest.fixture(scope="module")
def hf_set(tokenized):
    return datasets.Dataset.from_dict(tokenized)


@pytest.fixture(scope="module")
def cli_scan(hf_set, qwen3, tmp_path_factory):
    """``dqa scan`` (the CLI) on the set's ``save_to_disk`` folder: its scan folder."""
    from typer.testing import CliRunner

    from dqa.cli import app

    d = tmp_path_factory.mktemp("on-disk")
    hf_set.save_to_disk(str(d / "hf"))
    r = CliRunner().invoke(app, ["scan", str(d / "hf"), "--tokenizer", str(qwen3.folder), "--out", str(d / "scan"), "--quiet"],
                           catch_exceptions=False)
    assert r.exit_code == 1, r.output  # defects found
    return d / "scan"


@pytest.fixture()
def private_tmp(tmp_path, monkeypatch):
    """The temporary folder ``dqa.scan`` may use for in-memory data, watched by the test."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_an_in_memory_dataset_gets_the_findings_dqa_scan_gives_on_its_saved_folder(hf_set, qwen3, cli_scan, private_tmp):
    result = dqa.scan(hf_set, tokenizer=str(qwen3.folder))

    assert isinstance(result, dqa.ScanResult)
    assert_frame_equal(result.findings, pl.read_parquet(cli_scan / "findings.parquet"))
    assert result.findings.height > 0 and "degenerate_template" in result.findings["reasons"].explode().to_list()
    assert result.findings["row"].to_list()[:3] == [0, 4, 8]
    assert_frame_equal(result.turns, pl.read_parquet(cli_scan / "turns.parquet"))
    on_disk = json.loads((cli_scan / "summary.json").read_text())
    for key in ("rows", "tokens", "supervised_tokens", "failing_rows", "failing_share", "checks", "conventions", "template"):
        assert result.summary[key] == on_disk[key], key
    assert (result.summary["format"], result.summary["dataset"]) == ("table", "<datasets.Dataset>")
    # Nothing written for the caller to clean up: the scan folder was temporary.
    assert result.out_dir is None and list(private_tmp.iterdir()) == []


def test_a_pyarrow_table_and_a_polars_dataframe_get_the_same_findings(tokenized, qwen3, cli_scan, private_tmp):
    expected = pl.read_parquet(cli_scan / "findings.parquet")
    table = pa.table(tokenized)
    frame = pl.DataFrame(tokenized)  # polars' Arrow: large_list<int64>, large_string ids
    for data, label in ((table, "<pyarrow.Table>"), (frame, "<polars.DataFrame>")):
        result = dqa.scan(data, tokenizer=str(qwen3.folder))
        assert_frame_equal(result.findings, expected)
        assert result.summary["dataset"] == label
    assert list(private_tmp.iterdir()) == []


def test_the_mask_selects_or_filters_exactly_the_passing_rows(hf_set, qwen3):
    result = dqa.scan(hf_set, tokenizer=str(qwen3.folder))
    failing = set(result.findings["row"].to_list())
    passing = [i for i in range(ROWS) if i not in failing]

    assert result.mask.dtype == bool and len(result.mask) == len(hf_set)
    assert np.flatnonzero(result.mask).tolist() == passing
    fast = hf_set.select(np.flatnonzero(result.mask))  # the fast way: one indices mapping
    slow = hf_set.filter(lambda _, i: result.mask[i], with_indices=True)  # Python once per row
    for kept in (fast, slow):
        assert kept["id"] == [f"s{i}" for i in passing]
    # What is left passes.
    assert dqa.scan(fast, tokenizer=str(qwen3.folder)).summary["failing_rows"] == 0


def test_a_selection_of_a_dataset_is_scanned_as_selected(hf_set, qwen3):
    picked = hf_set.select([8, 1, 2, 3, 4, 5, 0] + list(range(9, ROWS)))  # an indices mapping over the same table
    result = dqa.scan(picked, tokenizer=str(qwen3.folder))
    assert result.summary["rows"] == len(picked)
    flagged = result.findings["id"].to_list()
    assert flagged[:3] == ["s8", "s4", "s0"] and result.findings["row"].to_list()[:3] == [0, 4, 6]


def test_out_keeps_the_scan_folder_as_dqa_scan_does(hf_set, qwen3, cli_scan, tmp_path):
    result = dqa.scan(hf_set, tokenizer=str(qwen3.folder), out=tmp_path / "scan")
    assert result.out_dir == tmp_path / "scan"
    for name in ("findings.parquet", "metrics.parquet", "turns.parquet", "summary.json", "summary.md"):
        assert (tmp_path / "scan" / name).is_file(), name
    assert_frame_equal(pl.read_parquet(tmp_path / "scan" / "findings.parquet"), pl.read_parquet(cli_scan / "findings.parquet"))
    assert_frame_equal(result.turns, pl.read_parquet(cli_scan / "turns.parquet"))


def test_options_and_thresholds_are_the_clis(hf_set, qwen3):
    only = dqa.scan(hf_set, tokenizer=str(qwen3.folder), checks=["no_loss"], batch_rows=7)
    assert only.summary["failing_rows"] == 0 and only.mask.all()
    # degenerate_template needs 10 identical rows: raising that past the 12 "OK." rows clears them.
    raised = dqa.scan(hf_set, tokenizer=str(qwen3.folder), thresholds={"degenerate_template": {"min_rows": 13}})
    assert raised.summary["checks"]["degenerate_template"]["count"] == 0
    as_set = dqa.scan(hf_set, tokenizer=str(qwen3.folder), thresholds=["degenerate_template.min_rows=13"])
    assert_frame_equal(as_set.findings, raised.findings)


def test_bad_input_raises_dqas_errors(hf_set, tokenized, qwen3, tmp_path):
    with pytest.raises(InputError, match=r"<pyarrow.Table>: no column 'input_ids'"):
        dqa.scan(pa.table({"tokens": tokenized["input_ids"]}), tokenizer=str(qwen3.folder))
    with pytest.raises(InputError, match="DatasetDict; pass one split"):
        dqa.scan(datasets.DatasetDict({"train": hf_set}))
    with pytest.raises(InputError, match="cannot scan a builtins.list"):
        dqa.scan([1, 2, 3])
    with pytest.raises(InputError, match="no such file or folder"):
        dqa.scan(tmp_path / "nope.parquet")
    with pytest.raises(UsageError, match="--batch-rows must be at least 1"):
        dqa.scan(hf_set, batch_rows=0)
    with pytest.raises(InputError, match="unknown check 'nope'"):
        dqa.scan(hf_set, tokenizer=str(qwen3.folder), checks="nope")
    with pytest.raises(TypeError):
        dqa.scan(hf_set, colour="blue")
    with pytest.raises(UsageError, match="--failed maybe: expected keep or drop"):
        dqa.merge(tmp_path / "d.parquet", tmp_path / "regen", tmp_path / "new.parquet", failed="maybe")


def test_gate_returns_the_verdict_dqa_gate_gives(cli, clean_scan, defect_scan, tmp_path):
    passed = dqa.gate(clean_scan, out=tmp_path / "pass", docs=False)
    assert isinstance(passed, dqa.GateResult)
    assert passed.passed and passed.verdict == "pass" and passed.reasons == []
    assert passed.out_dir == tmp_path / "pass"
    assert passed.report == json.loads((tmp_path / "pass" / "gate.json").read_text())

    failed = dqa.gate(defect_scan, clean_scan, out=tmp_path / "fail", docs=False, max_ks=0.5)  # a failed gate is a result
    assert not failed.passed and any(r.startswith("drift: failing_share") for r in failed.reasons)
    r = cli("gate", defect_scan, "--baseline", clean_scan, "--out", tmp_path / "cli", "--no-docs", "--max-ks", "0.5", "--json")
    assert r.exit_code == 1
    cli_report = json.loads(r.stdout)
    assert (cli_report["verdict"], cli_report["reasons"]) == (failed.verdict, failed.reasons)

    with pytest.raises(UsageError, match="--max-ks 2: expected a share between 0 and 1"):
        dqa.gate(clean_scan, max_ks=2)
    with pytest.raises(UsageError, match="resolves to the release's own scan folder"):
        dqa.gate(clean_scan, clean_scan)
    with pytest.raises(UsageError, match="unknown option 'max_kss'"):
        dqa.gate(clean_scan, max_kss=0.2)
