"""``dqa report``: one self-contained HTML file from a scan, a regen run and a validation."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from dqa.commands.common import handles_errors
from dqa.errors import EXIT_OK


def report(
    scan_dir: Optional[Path] = typer.Argument(None, help="A scan folder written by `dqa scan` (holds summary.json, metrics.parquet).",
                                              show_default=False),
    regen: Optional[Path] = typer.Option(None, "--regen", "-r", help="A `dqa regen` output folder: throughput over time, progress."),
    validation: Optional[Path] = typer.Option(None, "--validation", "-v",
                                              help="A `dqa validate` output folder. \\[default: the newest validation*/ in SCAN_DIR]"),
    after: Optional[Path] = typer.Option(None, "--after", "-a",
                                         help="A scan folder of the new release, for the 'after' histogram. \\[default: the regen outputs]"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The HTML file to write. \\[default: SCAN_DIR/report.html]"),
    as_json: bool = typer.Option(False, "--json", help="Print {\"report\": PATH} on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing."),
) -> None:
    """Write a self-contained HTML report (one file, works offline, no scripts).

    Shows the supervised-token histogram before and after, the findings table, the top
    degenerate templates (decoded, escaped), regen throughput over time (from the shards'
    completed_at and output_tokens) and the expectation results with the gate verdict.

    Example:  dqa report dqa-out/train --regen regen-out --after dqa-out/train-merged

    Exit codes: 0 written, 2 a missing or unreadable input, 3 could not write.
    """
    raise typer.Exit(_run(scan_dir, regen, validation, after, out, as_json, quiet))


@handles_errors
def _run(scan_dir, regen, validation, after, out, as_json, quiet) -> int:
    from dqa.errors import UsageError
    from dqa.reports.html import write_report

    if scan_dir is None:
        raise UsageError("missing SCAN_DIR (a folder written by `dqa scan`; see dqa report --help)")
    path = write_report(scan_dir, out, regen, validation, after)
    if as_json:
        sys.stdout.write(json.dumps({"report": str(path)}) + "\n")
    elif not quiet:
        typer.echo(str(path))
    return EXIT_OK


def register(app: typer.Typer) -> None:
    """Add ``report`` to the CLI."""
    app.command("report")(report)
