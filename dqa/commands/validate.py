"""``dqa validate``: run a Great Expectations suite over a dataset's scan metrics."""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from dqa.commands.common import console, handles_errors, help_text, stderr_is_tty, storage_option_param
from dqa.errors import EXIT_OK, EXIT_QUALITY


def validate(
    dataset: Optional[str] = typer.Argument(
        None, help="A dataset (scanned first) or a scan folder holding metrics.parquet (reused); a path or a URL (s3://...).", show_default=False
    ),
    suite: str = typer.Option("release", "--suite", "-s", help="Suite JSON file, or a bundled suite: release, regen."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder or URL (validation.json written last). \\[default: SCAN_FOLDER/validation-SUITE/]"),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="Reuse this scan folder's metrics instead of scanning (a scan of DATASET, files unchanged since)."),
    scan_out: Optional[str] = typer.Option(None, "--scan-out", help="Where a fresh scan is written. \\[default: dqa-out/<dataset name>/]"),
    fail_on: str = typer.Option("critical", "--fail-on", help="Lowest severity that fails the run: critical or warning."),
    max_ids: int = typer.Option(20, "--max-ids", help="Failing sample ids listed per expectation in the reports."),
    no_docs: bool = typer.Option(False, "--no-docs", help="Skip building GX Data Docs."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", "-t", help="For a fresh scan: tokenizer folder or preset (qwen3)."),
    thinking: str = typer.Option("auto", help="For a fresh scan: is thinking expected? auto, expected, off."),
    as_json: bool = typer.Option(False, "--json", help="Print the validation summary JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; exit code only."),
    storage_option: List[str] = storage_option_param(),
) -> None:
    """Validate a dataset release against a Great Expectations suite (over `dqa scan` metrics).

    Scans DATASET (or reuses a scan folder), runs the suite through GX's ephemeral context and
    writes to the output folder: `validation.json` (GX's result), `summary.json`,
    `failing_samples.parquet` (every failing row of every expectation, with ids),
    `junit.xml` (one test case per expectation), `summary.md` (also appended to
    $GITHUB_STEP_SUMMARY when set, under 1 MiB) and `data_docs/index.html` (GX Data Docs).

    Severity lives in each expectation's `meta.severity`: critical (default) fails the run,
    warning is reported and fails only with --fail-on warning.

    Example:  dqa validate data/release.parquet --suite release --out ci/validation

    Exit codes: 0 passed, 1 an expectation at or above --fail-on failed, 2 bad input or suite,
    3 runtime failure.
    """
    raise typer.Exit(_run(dataset, suite, out, metrics, scan_out, fail_on, max_ids, no_docs, tokenizer, thinking, as_json, quiet,
                          storage_option))


@handles_errors
def _run(dataset, suite, out, metrics, scan_out, fail_on, max_ids, no_docs, tokenizer, thinking, as_json, quiet,
         storage_option=()) -> int:
    from dqa import storage
    from dqa.storage import location

    storage.configure(storage_option)
    from dqa.audit.identity import scan_record
    from dqa.audit.scan_folder import METRICS_FILE
    from dqa.errors import UsageError
    from dqa.expectations.source import obtain_scan
    from dqa.expectations.suites import check_fail_on, load_suite
    from dqa.expectations.validate import validate_to_folder
    from dqa.reports.markdown_validation import append_step_summary

    if dataset is None and metrics is None:
        raise UsageError("missing DATASET (a dataset or a scan folder; see dqa validate --help)")
    if max_ids < 0:
        raise UsageError("--max-ids must be 0 or more")
    fail_on = check_fail_on(fail_on)
    spec = load_suite(suite)
    scan = obtain_scan(dataset or metrics, metrics, scan_out, tokenizer, thinking, progress=scan_progress(quiet or as_json))
    out_dir = out or scan.path / f"validation-{spec.name}"
    v = validate_to_folder(scan.metrics, spec, out_dir, fail_on, max_ids, docs=not no_docs,
                           source=str(scan.path / METRICS_FILE), scan=scan_record(scan.path, scan.summary))
    summary = v.summary()
    append_step_summary((location(out_dir) / "summary.md").read_text(encoding="utf-8"))
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
    elif not quiet:
        print_validation(summary, str(out_dir))
    return EXIT_OK if v.success else EXIT_QUALITY


def scan_progress(silent: bool):
    """A progress callback for a fresh scan when stderr is a terminal (else None)."""
    if silent or not stderr_is_tty():
        return None
    cons = console(stderr=True)

    def update(rows: int, tokens: int) -> None:
        cons.print(f"scanning: {rows:,} rows, {tokens:,} tokens", end="\r")

    return update


def print_validation(summary: dict, out_dir: str) -> None:
    """The expectation table for people, on stdout."""
    from rich.markup import escape
    from rich.table import Table

    from dqa.reports.markdown_validation import describe_kwargs, describe_observed, describe_unexpected

    style = {"pass": "green", "fail": "bold red", "warn": "yellow", "error": "bold magenta"}
    t = Table(title=f"dqa validate · suite {escape(summary['suite'])} · {summary['rows']:,} rows", title_justify="left")
    t.add_column("", no_wrap=True)
    t.add_column("severity", no_wrap=True)
    for col in ("expectation", "bounds", "observed", "unexpected", "first failing samples"):
        t.add_column(col, overflow="fold")
    for e in summary["expectations"]:
        ids = ", ".join(str(i) for i in e["failing_ids"][:3]) if e["status"] != "pass" else ""
        observed = describe_observed(e) if e.get("observed_value") is not None else ""
        cells = [short_title(e), describe_kwargs(e["kwargs"]), observed, describe_unexpected(e), ids]
        t.add_row(f"[{style[e['status']]}]{e['status']}[/]", e["severity"], *(escape(c) for c in cells))
    out = console(stderr=False)
    if not out.is_terminal:  # logs and files: no need to squeeze the table into 80 columns
        out.width = max(out.width, 150)
    out.print(t, markup=True)
    verdict = "[green]PASS[/]" if summary["success"] else "[bold red]FAIL[/]"
    out.print(f"{verdict} (fail on {summary['fail_on']}) · results in {escape(out_dir)}", markup=True)


def short_title(e: dict) -> str:
    """``supervised_tokens: values to be between`` for ``expect_column_values_to_be_between(supervised_tokens)``."""
    kind = e["type"]
    for prefix in ("expect_column_", "expect_table_", "expect_"):
        if kind.startswith(prefix):
            kind = kind[len(prefix):]
            break
    where = ", ".join(e["columns"]) or "table"
    return f"{where}: {kind.replace('_', ' ')}"


def register(app: typer.Typer) -> None:
    """Add ``validate`` to the CLI."""
    app.command("validate", help=help_text(validate.__doc__))(validate)
