"""Specification of dataset identity: one dataset's scan, findings, validations and gates never pass
for another's, and outputs made from an earlier scan are never shown as current.

The README's own loop is the first case: scan the example set, merge the regenerated rows into
``release/example.parquet`` (same file name), scan and gate the release. Both used to land in
``dqa-out/example/``: the release's scan replaced the original's, and its gate verdict then sat
beside a rescan of the original.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dqa.errors import InputError
from gate_data import clean_rows, ok_mode_rows, write_set


@pytest.fixture()
def two_examples(tmp_path, monkeypatch):
    """``data/example.parquet`` (10 'OK.' samples among 30) and ``release/example.parquet`` (30 clean), cwd = tmp_path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "release").mkdir()
    original = write_set(tmp_path / "data" / "example.parquet", clean_rows(20, seed=1) + ok_mode_rows(10))
    release = write_set(tmp_path / "release" / "example.parquet", clean_rows(30, seed=2))
    return Path("data/example.parquet"), Path("release/example.parquet"), original, release


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def touch_later(path: Path) -> None:
    """Change a file's mtime as an edit would (coarse file systems keep the old one otherwise)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def rewrite(path: Path, rows) -> None:
    write_set(path, rows)
    touch_later(path)


# --- dqa scan: one dataset per scan folder --------------------------------------------------


def test_the_readme_loop_keeps_the_original_scan_and_the_release_scan_apart(cli, two_examples, tmp_path):
    original, release, original_abs, release_abs = two_examples
    assert cli("scan", original, "--quiet").exit_code == 1
    first = summary_of(tmp_path / "dqa-out" / "example")
    metrics_bytes = (tmp_path / "dqa-out" / "example" / "metrics.parquet").read_bytes()

    assert cli("scan", release, "--quiet").exit_code == 0
    # The first dataset of a name keeps dqa-out/<name>/; the second gets dqa-out/<parent>-<name>/.
    assert summary_of(tmp_path / "dqa-out" / "example")["dataset_path"] == str(original_abs.resolve())
    assert (tmp_path / "dqa-out" / "example" / "metrics.parquet").read_bytes() == metrics_bytes
    assert summary_of(tmp_path / "dqa-out" / "example") == first
    assert summary_of(tmp_path / "dqa-out" / "release-example")["dataset_path"] == str(release_abs.resolve())

    # Later commands find each dataset's own scan, whichever order they run in.
    assert cli("gate", release, "--no-docs", "-q").exit_code == 0
    assert (tmp_path / "dqa-out" / "release-example" / "gate" / "gate.json").is_file()
    assert not (tmp_path / "dqa-out" / "example" / "gate").exists()
    assert cli("scan", original, "--quiet").exit_code == 1
    assert (tmp_path / "dqa-out" / "release-example" / "gate" / "gate.json").is_file()
    assert summary_of(tmp_path / "dqa-out" / "example")["failing_rows"] == 10


def test_an_explicit_out_holding_another_datasets_scan_is_refused(cli, two_examples, tmp_path):
    original, release, original_abs, _ = two_examples
    assert cli("scan", original, "--out", tmp_path / "shared", "--quiet").exit_code == 1
    before = (tmp_path / "shared" / "summary.json").read_text()
    r = cli("scan", release, "--out", tmp_path / "shared", "--quiet")
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1  # one line
    assert f"shared/ holds the scan of {original_abs.resolve()}, not release/example.parquet" in r.stderr
    assert "--out DIR (e.g. dqa-out/example)" in r.stderr  # this dataset's own default folder
    assert (tmp_path / "shared" / "summary.json").read_text() == before  # nothing written


def test_a_rescan_of_the_same_dataset_is_allowed_and_drops_what_the_old_scan_made(cli, two_examples, tmp_path):
    original, _, original_abs, _ = two_examples
    out = tmp_path / "dqa-out" / "example"
    assert cli("scan", original, "--quiet").exit_code == 1
    assert cli("gate", out, "--no-docs", "-q").exit_code == 1
    assert cli("validate", out, "--no-docs", "-q").exit_code == 1
    (out / "report.html").write_text("<html>old</html>")
    (out / "notes.txt").write_text("mine")

    rewrite(original_abs, clean_rows(30, seed=3))  # the dataset is fixed in place
    r = cli("scan", original)
    assert r.exit_code == 0, r.output
    assert "removed gate, report.html, validation-release" in r.stderr
    assert summary_of(out)["failing_rows"] == 0
    assert not (out / "gate").exists() and not (out / "validation-release").exists() and not (out / "report.html").exists()
    assert (out / "notes.txt").read_text() == "mine"  # not dqa's: kept


def test_gate_and_validation_record_the_scan_they_were_made_from(cli, two_examples, tmp_path):
    from dqa.audit.identity import fingerprint_digest

    original, _, original_abs, _ = two_examples
    out = tmp_path / "dqa-out" / "example"
    cli("scan", original, "--quiet")
    cli("gate", out, "--no-docs", "-q")
    cli("validate", out, "--no-docs", "-q")
    want = {"folder": str(out.resolve()), "dataset": str(original_abs.resolve()),
            "fingerprint": fingerprint_digest(summary_of(out)["fingerprint"])}
    gate = json.loads((out / "gate" / "gate.json").read_text())
    assert gate["scan"] == want and gate["validation"]["scan"] == want
    assert summary_of(out / "gate" / "validation")["scan"] == want
    assert summary_of(out / "validation-release")["scan"] == want


# --- dqa regen: findings of this dataset, as it is now --------------------------------------


def open_ds(path):
    from dqa.audit.readers import open_dataset

    return open_dataset(path)


def test_regen_refuses_the_findings_of_another_dataset(cli, two_examples, tmp_path):
    from dqa.regen.jobs.rows import check_findings_for

    original, release, original_abs, release_abs = two_examples
    cli("scan", original, "--quiet")
    findings = (tmp_path / "dqa-out" / "example" / "findings.parquet").resolve()
    check_findings_for(findings, open_ds(original))  # its own: fine
    with pytest.raises(InputError) as err:
        check_findings_for(findings, open_ds(release))
    msg = str(err.value)
    assert f"findings of {original_abs.resolve()}, not of release/example.parquet" in msg
    assert "dqa scan release/example.parquet" in msg and "--findings DIR" in msg


def test_regen_refuses_findings_of_a_dataset_that_changed_since_the_scan(cli, two_examples, tmp_path):
    from dqa.regen.jobs.rows import check_findings_for

    original, _, original_abs, _ = two_examples
    cli("scan", original, "--quiet")
    rewrite(original_abs, clean_rows(20, seed=1) + ok_mode_rows(10, seed=5))
    with pytest.raises(InputError, match=r"earlier state of data/example.parquet .*was modified since the scan.*rescan it"):
        check_findings_for(tmp_path / "dqa-out" / "example", open_ds(original))


def test_regen_default_findings_are_the_datasets_own(cli, two_examples, tmp_path):
    from dqa.regen.jobs.rows import findings_for

    original, release, _, _ = two_examples
    cli("scan", release, "--quiet")  # the release first, this time: it takes dqa-out/example/
    cli("scan", original, "--quiet")
    assert findings_for(release) == Path("dqa-out/example/findings.parquet")
    assert findings_for(original) == Path("dqa-out/data-example/findings.parquet")


def bare_findings(folder: Path, rows: list[int], ids: list[str] | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cols = {"row": pa.array(rows, pa.int64())}
    if ids is not None:
        cols["id"] = pa.array(ids, pa.string())
    cols["reasons"] = pa.array([["degenerate_template"]] * len(rows), pa.list_(pa.string()))
    pq.write_table(pa.table(cols), folder / "findings.parquet")
    return folder / "findings.parquet"


def test_bare_findings_are_checked_by_their_ids(two_examples, tmp_path):
    """No summary.json beside findings.parquet: its ids must be the dataset's ids at those rows."""
    from dqa.regen.jobs.rows import check_findings_for

    original, _, _, _ = two_examples  # ids s0..s29
    check_findings_for(bare_findings(tmp_path / "ok", [3, 21, 29], ["s3", "s21", "s29"]), open_ds(original))
    check_findings_for(bare_findings(tmp_path / "no-ids", [3, 21], None), open_ds(original))  # nothing to compare
    with pytest.raises(InputError, match=r"row 21 has id 'x21', but that row of data/example.parquet has id 's21'"):
        check_findings_for(bare_findings(tmp_path / "other", [3, 21], ["s3", "x21"]), open_ds(original))


# --- dqa validate / gate: no other dataset's metrics ----------------------------------------


def test_validate_refuses_the_metrics_of_another_dataset_or_of_a_changed_one(cli, two_examples, tmp_path):
    original, release, original_abs, _ = two_examples
    cli("scan", original, "--quiet")
    scan = tmp_path / "dqa-out" / "example"
    r = cli("validate", release, "--metrics", scan, "--no-docs", "-q")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"metrics of {original_abs.resolve()}, not of release/example.parquet" in r.stderr
    assert cli("validate", original, "--metrics", scan, "--no-docs", "-q").exit_code == 1  # its own: validated

    rewrite(original_abs, clean_rows(30, seed=4))
    r = cli("validate", original, "--metrics", scan, "--no-docs", "-q")
    assert r.exit_code == 2 and "rescan it (dqa scan data/example.parquet" in r.stderr


def test_a_scan_out_folder_of_another_dataset_is_refused_by_validate(cli, two_examples, tmp_path):
    original, release, _, _ = two_examples
    cli("scan", original, "--quiet")
    r = cli("validate", release, "--scan-out", "dqa-out/example", "--no-docs", "-q")
    assert r.exit_code == 2 and "dqa-out/example/ holds the scan of" in r.stderr
    assert "pass --scan-out DIR (e.g. dqa-out/release-example)" in r.stderr
    assert summary_of(tmp_path / "dqa-out" / "example")["failing_rows"] == 10


def test_gate_baseline_that_is_the_release_is_refused(cli, two_examples):
    original, _, _, _ = two_examples
    r = cli("gate", original, "--baseline", original, "--no-docs")
    assert r.exit_code == 2 and "resolves to the release's own scan folder" in r.stderr


# --- dqa report: only this scan's validation and gate ---------------------------------------


def test_report_skips_a_stale_gate_beside_a_rescan_with_a_note(cli, two_examples, tmp_path):
    original, _, original_abs, _ = two_examples
    scan = tmp_path / "dqa-out" / "example"
    cli("scan", original, "--quiet")
    assert cli("gate", scan, "--no-docs", "-q").exit_code == 1
    shutil.copytree(scan / "gate", tmp_path / "old-gate")
    rewrite(original_abs, clean_rows(30, seed=3))
    assert cli("scan", original, "--quiet").exit_code == 0
    shutil.copytree(tmp_path / "old-gate", scan / "gate")  # as a rescan by an older dqa left it

    r = cli("report", scan, "--out", tmp_path / "r.html")
    assert r.exit_code == 0, r.output
    assert "gate/validation not shown: not for this scan (made from an earlier scan of" in r.stderr
    page = (tmp_path / "r.html").read_text()
    assert "Gate: FAIL" not in page and "Suite release" not in page
    assert "not shown: not for this scan" in page  # the reader of the page is told too

    # Explicitly asked for: refused, one line, nothing written.
    r = cli("report", scan, "--validation", scan / "gate" / "validation", "--out", tmp_path / "r2.html")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "made from an earlier scan" in r.stderr and f"dqa validate {scan}" in r.stderr
    assert not (tmp_path / "r2.html").exists()

    # A fresh gate of this scan is shown again.
    assert cli("gate", scan, "--no-docs", "-q").exit_code == 0
    assert cli("report", scan, "--out", tmp_path / "r3.html").exit_code == 0
    assert "Gate: PASS" in (tmp_path / "r3.html").read_text()


def test_report_refuses_a_validation_or_regen_run_of_another_dataset(cli, two_examples, tmp_path):
    original, release, original_abs, release_abs = two_examples
    cli("scan", original, "--quiet")
    cli("scan", release, "--quiet")
    mine, theirs = tmp_path / "dqa-out" / "example", tmp_path / "dqa-out" / "release-example"
    assert cli("validate", theirs, "--out", tmp_path / "v-release", "--no-docs", "-q").exit_code == 0
    r = cli("report", mine, "--validation", tmp_path / "v-release", "--out", tmp_path / "r.html")
    assert r.exit_code == 2
    assert f"made from the scan of {release_abs.resolve()}, not of {original_abs.resolve()}" in r.stderr

    regen = tmp_path / "regen"
    (regen / "shards").mkdir(parents=True)
    (regen / "run.json").write_text(json.dumps({"dataset_path": str(release_abs.resolve())}))
    r = cli("report", mine, "--regen", regen, "--out", tmp_path / "r.html")
    assert r.exit_code == 2 and f"a regen run of {release_abs.resolve()}" in r.stderr
    assert not (tmp_path / "r.html").exists()


# --- gate reasons read as sentences ---------------------------------------------------------


def test_gate_reasons_read_naturally_with_or_without_bounds():
    from dqa.expectations.gate import expectation_reason

    base = {"index": 2, "severity": "critical", "status": "fail", "title": "expect_column_pair_values_to_be_equal(n_mask, n_tokens)",
            "kwargs": {"column_A": "n_mask", "column_B": "n_tokens"}, "unexpected_count": 28, "unexpected_percent": 0.9333,
            "observed_value": None}
    assert expectation_reason(base) == (
        "critical expectation #2 expect_column_pair_values_to_be_equal(n_mask, n_tokens) failed: 28 unexpected rows (0.93%)")
    one = {**base, "unexpected_count": 1, "unexpected_percent": 1.0869}
    assert expectation_reason(one).endswith("failed: 1 unexpected row (1.09%)")
    bounded = {**base, "title": "expect_column_values_to_be_between(supervised_tokens)",
               "kwargs": {"column": "supervised_tokens", "min_value": 16, "max_value": 32768, "mostly": 0.99}}
    assert expectation_reason(bounded) == ("critical expectation #2 expect_column_values_to_be_between(supervised_tokens) failed "
                                           "(expected min 16, max 32,768, mostly 0.99): 28 unexpected rows (0.93%)")
    aggregate = {**base, "title": "expect_column_mean_to_be_between(supervised_tokens)", "kwargs": {"min_value": 32},
                 "unexpected_count": None, "observed_value": 20.5}
    assert expectation_reason(aggregate).endswith("failed (expected min 32): observed 20.5")


def test_no_gate_reason_has_an_empty_parenthesis(cli, defect_scan, tmp_path):
    r = cli("gate", defect_scan, "--out", tmp_path / "g", "--no-docs", "--json")
    reasons = json.loads(r.stdout)["reasons"]
    assert reasons and not any("(;" in x or "()" in x for x in reasons)
    assert any(x.endswith("failed: 1 unexpected row (1.09%)") for x in reasons)  # the n_mask == n_tokens pair: no bounds


# --- the identity rules themselves ----------------------------------------------------------


def fake_scan(folder: Path, summary: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_default_scan_folders_go_name_then_parent_then_hash(tmp_path, monkeypatch):
    from dqa.audit.identity import candidate_dirs, default_scan_dir

    monkeypatch.chdir(tmp_path)
    a, b, c = "x/one/train.parquet", "y/one/train.parquet", "z/two/train.parquet"
    assert default_scan_dir(a) == Path("dqa-out/train")
    fake_scan(tmp_path / "dqa-out" / "train", {"dataset_path": str((tmp_path / a).resolve())})
    assert default_scan_dir(a) == Path("dqa-out/train")  # its own scan
    assert default_scan_dir(b) == Path("dqa-out/one-train")
    fake_scan(tmp_path / "dqa-out" / "one-train", {"dataset_path": str((tmp_path / b).resolve())})
    assert default_scan_dir(c) == Path("dqa-out/two-train")
    hashed = candidate_dirs(a)[-1]
    assert hashed.name.startswith("train-") and len(hashed.name) == len("train-") + 8
    assert default_scan_dir(a) == Path("dqa-out/train") and default_scan_dir(b) == Path("dqa-out/one-train")
    # once the first folder goes away, a dataset still finds its scan in the second
    shutil.rmtree(tmp_path / "dqa-out" / "train")
    assert default_scan_dir(b) == Path("dqa-out/one-train")


def test_scans_without_a_recorded_path_are_recognised_by_their_files(tmp_path):
    """summary.json written before `dataset_path` existed: the fingerprint's files tell; nothing recorded: cannot tell."""
    from dqa.audit.identity import same_dataset

    f = (tmp_path / "d.parquet").resolve()
    folder = (tmp_path / "shards").resolve()
    assert same_dataset({"dataset": "d.parquet", "fingerprint": {"files": [[str(f), 1, 2]]}}, f) is True
    assert same_dataset({"dataset": "d.parquet", "fingerprint": {"files": [[str(f), 1, 2]]}}, tmp_path / "e.parquet") is False
    assert same_dataset({"fingerprint": {"files": [[str(folder / "a.parquet"), 1, 2], [str(folder / "b.parquet"), 1, 2]]}}, folder) is True
    assert same_dataset({"dataset": str(f)}, f) is True  # an absolute path as given
    assert same_dataset({"dataset": "d.parquet"}, f) is None
    assert same_dataset(None, f) is None


def test_regen_refuses_the_findings_of_another_dataset_before_sending_anything(cli, two_examples, tmp_path):
    """`dqa regen B --findings <scan of A>`: exit 2, one line naming the findings' dataset; no output folder."""
    original, release, _, _ = two_examples
    cli("scan", original, "--quiet")
    r = cli("regen", release, "--findings", tmp_path / "dqa-out" / "example", "-e", "http://127.0.0.1:9",
            "--out", tmp_path / "regen-out")
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "findings" in r.stderr
    assert not (tmp_path / "regen-out").exists()
