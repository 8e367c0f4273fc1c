"""Specification of `dqa validate`: GX suites over scan metrics, severities, failing ids, and its outputs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import polars as pl
import pytest

from gate_data import synthetic_metrics
from gate_fixtures import N_CLEAN, N_OK

OK_IDS = [f"s{i}" for i in range(N_CLEAN, N_CLEAN + N_OK)]


def expectation(summary: dict, type_: str, column: str) -> dict:
    [e] = [e for e in summary["expectations"] if e["type"] == type_ and column in e["columns"]]
    return e


def test_clean_release_passes_and_writes_every_output(cli, clean_scan, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    out = tmp_path / "val"
    r = cli("validate", clean_scan, "--out", out)
    assert r.exit_code == 0, r.output
    assert "PASS" in r.stdout
    for name in ("validation.json", "summary.json", "failing_samples.parquet", "junit.xml", "summary.md", "data_docs/index.html"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["success"] and summary["statistics"]["failed"] == 0 and summary["rows"] == N_CLEAN
    gx_result = json.loads((out / "validation.json").read_text())
    assert gx_result["success"] is True and len(gx_result["results"]) == len(summary["expectations"])
    junit = ET.parse(out / "junit.xml").getroot()
    assert len(junit.findall(".//testcase")) == len(summary["expectations"]) == 12
    assert junit.get("failures") == "0"
    docs = list((out / "data_docs" / "validations").rglob("*.html"))
    assert len(docs) == 1 and "release" in (out / "data_docs" / "index.html").read_text()


def test_ok_mode_release_fails_and_lists_the_failing_sample_ids(cli, defect_scan, tmp_path):
    out = tmp_path / "val"
    r = cli("validate", defect_scan, "--out", out, "--max-ids", "50", "--json")
    assert r.exit_code == 1, r.output
    summary = json.loads(r.stdout)
    assert summary["status"] == "fail"
    bounds = expectation(summary, "expect_column_values_to_be_between", "supervised_tokens")
    # s90's mask is shorter than its ids, so nothing in it counts as supervised.
    assert bounds["status"] == "fail" and bounds["failing_ids"] == OK_IDS + ["s90"]
    assert expectation(summary, "expect_column_pair_values_to_be_equal", "n_mask")["failing_ids"] == ["s90"]
    assert expectation(summary, "expect_column_values_to_be_between", "misaligned_tokens")["failing_ids"] == ["s91"]
    assert expectation(summary, "expect_column_values_to_be_in_set", "degenerate_template")["failing_ids"] == OK_IDS
    assert expectation(summary, "expect_column_proportion_of_unique_values_to_be_between", "supervised_hash")["status"] == "fail"
    # failing_samples.parquet holds every failing row of every expectation, with ids.
    fs = pl.read_parquet(out / "failing_samples.parquet")
    by = fs.filter(pl.col("expectation") == bounds["index"])
    assert by["id"].to_list() == OK_IDS + ["s90"] and by["row"].to_list() == list(range(N_CLEAN, N_CLEAN + N_OK + 1))
    md = (out / "summary.md").read_text()
    assert "❌" in md and "s60, s61" in md
    junit = ET.parse(out / "junit.xml").getroot()
    failures = junit.findall(".//failure")
    assert int(junit.get("failures")) == len(failures) == summary["statistics"]["failed"]
    assert any("s60" in (f.text or "") for f in failures)


def test_validate_scans_a_dataset_it_is_given(cli, tmp_path):
    from gate_data import clean_rows, write_set

    data = write_set(tmp_path / "fresh.parquet", clean_rows(20, seed=3))
    r = cli("validate", data, "--scan-out", tmp_path / "scan", "--no-docs", "--quiet")
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    assert (tmp_path / "scan" / "metrics.parquet").is_file()
    assert json.loads((tmp_path / "scan" / "validation-release" / "summary.json").read_text())["rows"] == 20
    assert not (tmp_path / "scan" / "validation-release" / "data_docs").exists()


def write_suite(path, expectations: list[dict]) -> str:
    path.write_text(json.dumps({"name": "custom", "expectations": expectations}))
    return str(path)


def test_warning_severity_is_reported_but_fails_only_with_fail_on_warning(cli, defect_scan, tmp_path):
    suite = write_suite(tmp_path / "warn.json", [
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "degenerate_template", "value_set": [False]},
         "meta": {"severity": "warning"}},
    ])
    r = cli("validate", defect_scan, "--suite", suite, "--out", tmp_path / "a", "--no-docs", "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["success"] is True and s["gx_success"] is False
    assert [e["status"] for e in s["expectations"]] == ["pass", "warn"]
    case = ET.parse(tmp_path / "a" / "junit.xml").getroot().findall(".//testcase")[1]
    assert case.find("failure") is None and case.find("system-out").text.startswith("WARNING")
    r = cli("validate", defect_scan, "--suite", suite, "--out", tmp_path / "b", "--no-docs", "--fail-on", "warning", "--json")
    assert r.exit_code == 1
    assert [e["status"] for e in json.loads(r.stdout)["expectations"]] == ["pass", "fail"]


def test_severity_comes_from_meta_or_gx_native_field():
    from dqa.errors import InputError
    from dqa.expectations.suites import counts_as_failure, severity_of

    assert severity_of({"type": "x"}) == "critical"
    assert severity_of({"meta": {"severity": "Warning"}}) == "warning"
    assert severity_of({"severity": "info"}) == "info"
    assert severity_of({"severity": "critical", "meta": {"severity": "warning"}}) == "warning"
    with pytest.raises(InputError):
        severity_of({"meta": {"severity": "fatal"}})
    assert counts_as_failure("critical", "critical") and not counts_as_failure("warning", "critical")
    assert counts_as_failure("warning", "warning") and not counts_as_failure("info", "warning")


@pytest.mark.parametrize(
    "content, expected",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"name": "x", "expectations": [{"type": "expect_no_such_thing", "kwargs": {}}]}), "expectation #0"),
        (json.dumps({"name": "x", "expectations": [{"type": "expect_column_values_to_be_between",
                                                     "kwargs": {"column": "no_such_column", "min_value": 1}}]}), "no_such_column"),
        (json.dumps({"name": "x", "expectations": [{"type": "expect_table_row_count_to_be_between", "kwargs": {},
                                                     "meta": {"severity": "fatal"}}]}), "severity 'fatal'"),
        (json.dumps({"expectations": []}), "non-empty string 'name'"),
    ],
)
def test_a_bad_suite_is_an_input_error_naming_the_file(cli, clean_scan, tmp_path, content, expected):
    suite = tmp_path / "bad.json"
    suite.write_text(content)
    r = cli("validate", clean_scan, "--suite", suite, "--out", tmp_path / "v", "--no-docs")
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and "bad.json" in r.stderr and expected in r.stderr
    assert not (tmp_path / "v").exists()


def test_usage_errors_exit_2(cli, clean_scan, tmp_path):
    assert cli("validate").exit_code == 2
    assert cli("validate", tmp_path / "missing.parquet").exit_code == 2
    r = cli("validate", clean_scan, "--fail-on", "info")
    assert r.exit_code == 2 and "--fail-on" in r.stderr


def test_markdown_goes_to_the_github_step_summary_under_one_mebibyte(cli, defect_scan, tmp_path, monkeypatch):
    fresh = tmp_path / "fresh.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(fresh))
    cli("validate", defect_scan, "--out", tmp_path / "a", "--no-docs", "-q")
    assert fresh.read_text() == (tmp_path / "a" / "summary.md").read_text()
    full = tmp_path / "full.md"
    full.write_bytes(b"x" * (1024 * 1024 - 1500) + b"\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(full))
    cli("validate", defect_scan, "--out", tmp_path / "b", "--no-docs", "-q")
    size = full.stat().st_size
    assert 1024 * 1024 - 1500 < size < 1024 * 1024
    assert "more lines cut" in full.read_text()


def test_untrusted_ids_are_escaped_in_markdown_and_junit(tmp_path):
    from dqa.expectations.suites import load_suite
    from dqa.expectations.validate import validate_to_folder

    n = 50
    ids = [f"m{i}" for i in range(n)]
    ids[3] = "<img src=x onerror=alert(1)>|`x`"
    lengths = np.full(n, 500)
    lengths[3] = 2
    m = synthetic_metrics(n, id=ids, supervised_tokens=lengths)
    validate_to_folder(m, load_suite("release"), tmp_path / "v", docs=False)
    md = (tmp_path / "v" / "summary.md").read_text()
    assert "<img" not in md and "&lt;img src=x onerror=alert(1)&gt;\\|'x'" in md
    root = ET.parse(tmp_path / "v" / "junit.xml").getroot()
    assert any("<img src=x onerror=alert(1)>" in (f.text or "") for f in root.iter("failure"))


def test_failing_rows_equal_a_polars_evaluation_of_the_same_rules(tmp_path):
    """The fast GX path (rows as an unnamed index) returns exactly the rows a polars filter finds."""
    from dqa.expectations.suites import load_suite
    from dqa.expectations.validate import run_validation

    n = 5000
    rng = np.random.default_rng(7)
    sup = rng.integers(0, 60, n)
    n_mask = np.where(rng.random(n) < 0.01, sup + 99, sup + 100)
    m = synthetic_metrics(n, supervised_tokens=sup, n_mask=n_mask, n_tokens=sup + 100,
                          truncated=rng.random(n) < 0.05, thinking_tokens=rng.integers(0, 3, n))
    m = m.with_columns(pl.col("row") + 1000)  # dataset rows need not start at 0 (a shard of a bigger set)
    v = run_validation(m, load_suite("release"), max_ids=5)
    got = {(o.expectation.type, tuple(o.expectation.columns)): o.failing_rows.tolist() for o in v.outcomes}
    floor = {
        ("expect_column_values_to_be_between", ("supervised_tokens",)): ~pl.col("supervised_tokens").is_between(16, 32768),
        ("expect_column_pair_values_to_be_equal", ("n_mask", "n_tokens")): pl.col("n_mask") != pl.col("n_tokens"),
        ("expect_column_values_to_be_in_set", ("truncated",)): pl.col("truncated"),
        ("expect_column_values_to_be_between", ("thinking_tokens",)): pl.col("thinking_tokens") < 1,
    }
    for key, expr in floor.items():
        assert got[key] == m.filter(expr)["row"].to_list(), key
        assert len(got[key]) > 0
    assert not v.success


def test_a_relative_out_folder_gets_data_docs(cli, clean_scan, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli("validate", clean_scan, "--out", "rel/val", "-q")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "rel" / "val" / "data_docs" / "index.html").is_file()
    assert not list((tmp_path / "rel").glob(".tmp-*"))


def regen_shards(folder, outputs: list[str]):
    """A regen output folder in the real shard format whose outputs are real Qwen3 renderings of ``outputs``."""
    from chatdata import tokenizer
    from dqa.regen.store.journal import Result, results_table, shard_path, write_table

    tok = tokenizer()
    results = []
    for i, text in enumerate(outputs):
        prompt = tok.apply_chat_template([{"role": "user", "content": f"Question {i}: why is the sky blue?"}],
                                         tokenize=False, add_generation_prompt=True)
        results.append(Result(row=i, sample_id=f"r{i}", prompt=np.array(tok(prompt)["input_ids"], np.int32),
                              output=np.array(tok(text)["input_ids"], np.int32), status="ok", finish_reason="stop",
                              error=None, endpoint="http://127.0.0.1:1", attempts=1, latency_s=1.0, model="m",
                              sampling="{}", seed=i, completed_at=1.79e9 + i))
    write_table(shard_path(folder, "a", 0), results_table(results))
    return folder / "shards"


def test_the_regen_suite_passes_good_regenerations_and_fails_ok_mode_ones(cli, tmp_path):
    from gate_data import sentence
    import random

    rng = random.Random(4)
    good = [f"<think>\n{sentence(rng, 40)}\n</think>\n\n{sentence(rng, 25)}<|im_end|>" for _ in range(30)]
    shards = regen_shards(tmp_path / "good", good)
    r = cli("validate", shards, "--suite", "regen", "--scan-out", tmp_path / "good-scan", "--no-docs", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["statistics"]["failed"] == 0
    bad = good[:18] + ["<think>\n\n</think>\n\nOK.<|im_end|>"] * 11 + [f"<think>\n{sentence(rng, 40)}"]
    shards = regen_shards(tmp_path / "bad", bad)
    r = cli("validate", shards, "--suite", "regen", "--scan-out", tmp_path / "bad-scan", "--no-docs", "--json")
    assert r.exit_code == 1
    s = json.loads(r.stdout)
    failed = {e["title"]: e["failing_ids"] for e in s["expectations"] if e["status"] == "fail"}
    ok_ids = [f"r{i}" for i in range(18, 29)]
    assert failed["expect_column_values_to_be_in_set(degenerate_template)"] == ok_ids
    assert failed["expect_column_values_to_be_between(thinking_tokens)"] == ok_ids  # r29 thinks, unclosed
    assert failed["expect_column_values_to_be_in_set(think_closed)"] == ["r29"]
    assert failed["expect_column_values_to_be_in_set(truncated)"] == ["r29"]
