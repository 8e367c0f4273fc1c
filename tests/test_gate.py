"""Specification of `dqa gate`: one verdict from the suite and drift against the previous release."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import polars as pl
import pytest

from gate_data import clean_rows, synthetic_metrics, write_set


def test_gate_fails_a_release_with_defects(cli, defect_scan, tmp_path, monkeypatch):
    summary_md = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary_md))
    out = tmp_path / "gate"
    r = cli("gate", defect_scan, "--out", out)
    assert r.exit_code == 1, r.output
    gate = json.loads((out / "gate.json").read_text())
    assert gate["verdict"] == "fail" and gate["drift"] is None
    assert any("supervised_tokens" in reason for reason in gate["reasons"])
    assert (out / "validation" / "data_docs" / "index.html").is_file()
    assert (out / "validation" / "failing_samples.parquet").is_file()
    assert "dqa gate: **FAIL**" in summary_md.read_text()
    assert "gate FAIL" in r.stdout


def test_gate_passes_a_clean_release(cli, clean_scan, tmp_path):
    out = tmp_path / "gate"
    r = cli("gate", clean_scan, "--out", out, "--no-docs", "--json")
    assert r.exit_code == 0, r.output
    gate = json.loads(r.stdout)
    assert gate["verdict"] == "pass" and gate["reasons"] == []
    junit = ET.parse(out / "junit.xml").getroot()
    assert junit.get("failures") == "0" and len(junit.findall(".//testcase")) == 12


def test_gate_against_a_baseline_checks_drift(cli, clean_scan, defect_scan, tmp_path):
    # The clean set gated against the bigger defective one.
    r = cli("gate", clean_scan, "--baseline", defect_scan, "--out", tmp_path / "g1", "--no-docs", "--json")
    gate = json.loads(r.stdout)
    checks = {c["name"]: c for c in gate["drift"]["checks"]}
    # 60 rows against 92: a 35% drop fails; the failing share fell (fine); tokens shifted upward.
    assert not checks["row_count"]["passed"] and checks["row_count"]["value"] == pytest.approx(60 / 92 - 1)
    assert checks["failing_share"]["passed"] and checks["failing_share"]["value"] < 0
    assert not checks["supervised_tokens_ks"]["passed"]
    assert r.exit_code == 1 and gate["verdict"] == "fail"
    assert set(gate["drift"]["quantiles"]) == {"p10", "p50", "p90", "mean"}
    junit = ET.parse(tmp_path / "g1" / "junit.xml").getroot()
    drift_suite = [s for s in junit.findall("testsuite") if s.get("name") == "dqa.gate.drift"][0]
    assert [c.get("name") for c in drift_suite.findall("testcase")] == ["row_count", "failing_share", "supervised_tokens_ks"]
    assert len(drift_suite.findall(".//failure")) == 2
    # The defective release against the clean one: validation and the failing share both fail it.
    r = cli("gate", defect_scan, "--baseline", clean_scan, "--out", tmp_path / "g2", "--no-docs", "--json")
    gate = json.loads(r.stdout)
    checks = {c["name"]: c for c in gate["drift"]["checks"]}
    assert r.exit_code == 1 and not checks["failing_share"]["passed"] and checks["row_count"]["passed"]
    assert any(reason.startswith("drift: failing_share") for reason in gate["reasons"])


def test_gate_scans_datasets_and_keeps_same_named_releases_apart(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    write_set(tmp_path / "v1" / "data.parquet", clean_rows(40, seed=5))
    write_set(tmp_path / "v2" / "data.parquet", clean_rows(40, seed=6))
    r = cli("gate", "v2/data.parquet", "--baseline", "v1/data.parquet", "--no-docs", "--json")
    assert r.exit_code == 0, r.output
    gate = json.loads(r.stdout)
    assert gate["verdict"] == "pass"
    assert gate["release_scan"] != gate["baseline_scan"]
    assert (tmp_path / "dqa-out" / "data" / "gate" / "gate.json").is_file()
    # The baseline has the release's name: its scan goes to the next default folder, keyed by its parent.
    assert (tmp_path / "dqa-out" / "v1-data" / "metrics.parquet").is_file()
    assert json.loads((tmp_path / "dqa-out" / "data" / "summary.json").read_text())["dataset_path"] == str((tmp_path / "v2" / "data.parquet").resolve())


def test_gate_input_errors_exit_2(cli, clean_scan, tmp_path):
    assert cli("gate").exit_code == 2
    r = cli("gate", tmp_path / "nope.parquet")
    assert r.exit_code == 2 and "nope.parquet" in r.stderr
    r = cli("gate", clean_scan, "--baseline", clean_scan)
    assert r.exit_code == 2 and "baseline" in r.stderr and "resolves" in r.stderr
    assert cli("gate", clean_scan, "--max-ks", "2").exit_code == 2
    assert cli("gate", clean_scan, "--suite", tmp_path / "none.json").exit_code == 2


def brute_force_ks(a: np.ndarray, b: np.ndarray) -> float:
    points = sorted(set(a.tolist()) | set(b.tolist()))
    return max(abs((a <= x).mean() - (b <= x).mean()) for x in points)


def test_ks_statistic_matches_its_definition():
    from dqa.expectations.gate import ks_critical, ks_statistic

    rng = np.random.default_rng(3)
    for _ in range(5):
        a, b = rng.integers(0, 50, 200), rng.integers(5, 60, 150)
        assert ks_statistic(a, b) == pytest.approx(brute_force_ks(a, b))
    assert ks_statistic(a, a) == 0.0
    assert ks_critical(100, 100, 0.05) == pytest.approx(1.358 * np.sqrt(2 / 100), rel=1e-3)


def test_drift_thresholds():
    from dqa.expectations.gate import DriftThresholds, compute_drift

    rng = np.random.default_rng(0)
    old = synthetic_metrics(4000, supervised_tokens=rng.integers(200, 3000, 4000))
    same = synthetic_metrics(4000, seed=1, supervised_tokens=rng.integers(200, 3000, 4000))
    shifted = synthetic_metrics(4000, seed=2, supervised_tokens=rng.integers(600, 3400, 4000))
    thr = DriftThresholds()
    assert compute_drift(same, old, thr)["passed"]
    d = compute_drift(shifted, old, thr)
    assert not d["passed"] and [c["name"] for c in d["checks"] if not c["passed"]] == ["supervised_tokens_ks"]
    assert d["quantiles"]["p50"]["shift"] > 0.1
    # A large KS on 12 rows is not significant: small sets do not fail on noise.
    tiny_old = synthetic_metrics(12, supervised_tokens=np.arange(100, 112))
    tiny_new = synthetic_metrics(12, supervised_tokens=np.arange(104, 116))
    tiny = compute_drift(tiny_new, tiny_old, thr)
    ks = [c for c in tiny["checks"] if c["name"] == "supervised_tokens_ks"][0]
    assert ks["value"] > thr.max_ks and ks["passed"]
    grown = synthetic_metrics(5000)
    assert compute_drift(grown, old, thr)["passed"]
    assert not compute_drift(grown, old, DriftThresholds(max_row_growth=0.1))["passed"]
    worse = old.with_columns(pl.Series("failed", np.arange(4000) < 80))
    assert not compute_drift(worse, old, thr)["passed"]  # +2 points of flagged samples
    assert compute_drift(worse, old, DriftThresholds(max_failing_share_increase=0.05))["passed"]


def test_the_ci_workflow_example_runs_the_gate_and_the_report(defect_scan, tmp_path):
    """The shell of examples/ci/dqa-gate.yml's gate and report steps, run for real with bash."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    workflow = yaml.safe_load((root / "examples" / "ci" / "dqa-gate.yml").read_text())
    steps = {s.get("name"): s for s in workflow["jobs"]["gate"]["steps"]}
    outputs, summary = tmp_path / "github_output", tmp_path / "step_summary.md"
    env = dict(os.environ, RELEASE=str(defect_scan), BASELINE="", SUITE=str(root / "expectations" / "release.json"),
               GITHUB_OUTPUT=str(outputs), GITHUB_STEP_SUMMARY=str(summary),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    gate = subprocess.run(["bash", "-e", "-c", steps["Gate the release"]["run"]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert gate.returncode == 0, gate.stderr  # a FAIL verdict is recorded, not raised, so the report still runs
    assert "exit_code=1" in outputs.read_text(), gate.stdout + gate.stderr
    assert summary.is_file(), gate.stdout + gate.stderr
    assert "dqa gate: **FAIL**" in summary.read_text()
    report = subprocess.run(["bash", "-e", "-c", steps["HTML report"]["run"]], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert "Gate: FAIL" in (tmp_path / "gate-report" / "report.html").read_text()
    assert {"gate.json", "gate.md", "junit.xml", "validation"} <= {p.name for p in (tmp_path / "gate-report").iterdir()}


def test_an_output_folder_that_cannot_be_written_is_a_runtime_failure(cli, clean_scan, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    r = cli("gate", clean_scan, "--out", blocker / "gate", "--no-docs")
    assert r.exit_code == 3
    assert r.stderr.startswith("dqa: error:") and r.stderr.count("\n") == 1
