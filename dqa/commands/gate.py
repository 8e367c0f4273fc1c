"""``dqa gate``: the CI step: validate a release, compare with the previous one, one verdict."""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from dqa.commands.common import console, handles_errors, help_text, storage_option_param
from dqa.errors import EXIT_OK, EXIT_QUALITY
from dqa.reports.trackers import REPORT_TO_HELP


def gate(
    release: Optional[str] = typer.Argument(
        None, help="The candidate release: a dataset (scanned first) or a scan folder (reused); a path or a URL (s3://...).", show_default=False
    ),
    baseline: Optional[str] = typer.Option(None, "--baseline", "-b", help="The previous release (dataset or scan folder, a path or a URL) for drift checks."),
    suite: str = typer.Option("release", "--suite", "-s", help="Suite JSON file, or a bundled suite: release, regen."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder or URL (gate.json written last). \\[default: RELEASE_SCAN_FOLDER/gate/]"),
    fail_on: str = typer.Option("critical", "--fail-on", help="Lowest expectation severity that fails the gate: critical or warning."),
    max_row_drop: float = typer.Option(0.05, help="Fail when the release has this share fewer rows than the baseline."),
    max_row_growth: Optional[float] = typer.Option(None, help="Fail when the release has this share more rows. \\[default: no limit]"),
    max_failing_share_increase: float = typer.Option(0.01, help="Fail when the share of flagged samples rises by more than this."),
    max_ks: float = typer.Option(0.10, help="Fail when the supervised-token KS statistic exceeds this (and is significant)."),
    ks_alpha: float = typer.Option(0.001, help="Significance level the KS statistic must also pass before it fails the gate."),
    max_ids: int = typer.Option(20, "--max-ids", help="Failing sample ids listed per expectation in the reports."),
    no_docs: bool = typer.Option(False, "--no-docs", help="Skip building GX Data Docs."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", "-t", help="For fresh scans: tokenizer folder or preset (qwen3)."),
    thinking: str = typer.Option("auto", help="For fresh scans: is thinking expected? auto, expected, off."),
    as_json: bool = typer.Option(False, "--json", help="Print gate.json on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; exit code only."),
    storage_option: List[str] = storage_option_param(),
    report_to: List[str] = typer.Option([], "--report-to", metavar="NAME", help=REPORT_TO_HELP),
) -> None:
    """Gate a dataset release in CI: expectation suite + drift against the previous release.

    Validates RELEASE with the suite (see `dqa validate`), and with --baseline compares row
    count, the share of flagged samples and the supervised-token distribution (KS statistic;
    quantile shifts are reported). Writes `gate.json`, `gate.md` (also appended to
    $GITHUB_STEP_SUMMARY), `junit.xml` (expectations and drift checks as test cases) and
    `validation/` (GX result, Data Docs, failing samples) to the output folder.

    Example:  dqa gate releases/v7/ --baseline releases/v6/ --out gate-report

    Exit codes: 0 pass, 1 fail, 2 usage or input error, 3 runtime failure.
    """
    raise typer.Exit(_run(release, baseline, suite, out, fail_on, max_row_drop, max_row_growth, max_failing_share_increase,
                          max_ks, ks_alpha, max_ids, no_docs, tokenizer, thinking, as_json, quiet, storage_option, report_to))


@handles_errors
def _run(release, baseline, suite, out, fail_on, max_row_drop, max_row_growth, max_failing_share_increase, max_ks, ks_alpha,
         max_ids, no_docs, tokenizer, thinking, as_json, quiet, storage_option=(), report_to=()) -> int:
    from dqa import api, storage

    storage.configure(storage_option)
    from dqa.commands.validate import scan_progress
    from dqa.errors import UsageError
    from dqa.reports import trackers
    from dqa.reports.markdown_validation import append_step_summary

    report_to = trackers.require(report_to)

    if release is None:
        raise UsageError("missing RELEASE (a dataset or a scan folder; see dqa gate --help)")
    result = api.gate(release, baseline, suite=suite, out=out, fail_on=fail_on, max_ids=max_ids, docs=not no_docs,
                      tokenizer=tokenizer, thinking=thinking, progress=scan_progress(quiet or as_json),
                      max_row_drop=max_row_drop, max_row_growth=max_row_growth,
                      max_failing_share_increase=max_failing_share_increase, max_ks=max_ks, ks_alpha=ks_alpha)
    append_step_summary((result.out_dir / "gate.md").read_text(encoding="utf-8"))
    if report_to:
        from dqa.reports.trackers.feed import report_gate

        trackers.report(report_to, "gate", release, result.out_dir, report_gate, result.report, quiet=quiet or as_json)
    if as_json:
        sys.stdout.write(json.dumps(result.report, indent=2, default=str) + "\n")
    elif not quiet:
        _print(result.report, str(result.out_dir))
    return EXIT_OK if result.passed else EXIT_QUALITY


def _print(result: dict, out_dir: str) -> None:
    from rich.markup import escape

    from dqa.commands.validate import print_validation

    print_validation(result["validation"], f"{out_dir.rstrip('/')}/validation")
    out = console(stderr=False)
    if not out.is_terminal:
        out.width = max(out.width, 150)
    if result.get("drift"):
        for c in result["drift"]["checks"]:
            mark = "[green]ok[/]" if c["passed"] else "[bold red]FAIL[/]"
            out.print(f"drift {mark} {c['name']}: {c['value']:.4g} (allowed: {escape(c['threshold_text'])})", markup=True)
    verdict = "[bold green]PASS[/]" if result["verdict"] == "pass" else "[bold red]FAIL[/]"
    out.print(f"gate {verdict} · {escape(out_dir)}", markup=True)
    for r in result["reasons"]:
        out.print(f"  - {escape(r)}", markup=True)


def register(app: typer.Typer) -> None:
    """Add ``gate`` to the CLI."""
    app.command("gate", help=help_text(gate.__doc__))(gate)
