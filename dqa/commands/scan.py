"""``dqa scan``: audit a tokenized dataset with the named checks."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Iterator, List, Optional

import typer

from dqa.audit.scan_options import DEFAULT_BATCH_ROWS
from dqa.commands.common import console, handles_errors, help_text, stderr_is_tty, storage_option_param
from dqa.errors import EXIT_OK, EXIT_QUALITY
from dqa.reports.trackers import REPORT_TO_HELP


def _list_checks() -> None:
    from dqa.audit.checks import CHECKS, GLOBAL_DEFAULTS

    out = console(stderr=False)
    from rich.table import Table

    t = Table(title="dqa checks", title_justify="left",
              caption="priority: when several checks flag a sample, the lowest number names its primary reason (the root "
              "cause); judges: each trained assistant turn (and the sample), or the sample as a whole",
              caption_justify="left")
    t.add_column("check", style="bold")
    t.add_column("priority", justify="right")
    t.add_column("judges")
    t.add_column("flags a sample when")
    t.add_column("defaults")
    for c in sorted(CHECKS, key=lambda c: (c.priority, c.name)):
        judges = "turns" if c.turn_rule is not None else "sample"
        t.add_row(c.name, str(c.priority), judges, f"{c.flags_when}\n[dim]why: {c.why}[/]",
                  ", ".join(f"{k}={v}" for k, v in c.defaults.items()) or "-")
    t.add_row("[dim](scan)[/]", "", "", "thinking is expected when this share of samples thinks",
              ", ".join(f"{k}={v}" for k, v in GLOBAL_DEFAULTS.items()))
    out.print(t)


def scan(
    dataset: Optional[str] = typer.Argument(
        None, help="Parquet file or folder of shards, HF save_to_disk folder, Arrow IPC file, or JSONL; a path or a URL (s3://bucket/train/, gs://, hf://datasets/org/name/).", show_default=False
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", "-t", help="Local HF tokenizer folder (its chat template gives the format: ChatML, Llama 3, DeepSeek, MiniMax, GLM), or a preset: qwen3 (the default), qwen3.6."
    ),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder or URL (default: dqa-out/<dataset name>/). In a store, summary.json is written last: a folder without it is incomplete."),
    ids_column: Optional[str] = typer.Option(None, help="Token ids column (default: input_ids)."),
    mask_column: Optional[str] = typer.Option(None, help="0/1 loss mask column (default: loss_mask, if present)."),
    labels_column: Optional[str] = typer.Option(None, help="Labels column, -100 = unsupervised (default: labels)."),
    id_column: Optional[str] = typer.Option(None, help="Sample id column (default: id, if present)."),
    thinking: str = typer.Option("auto", help="Is thinking expected? auto (inferred from the set), expected, off."),
    checks: Optional[str] = typer.Option(None, "--checks", help="Comma-separated checks to run (default: all)."),
    skip: Optional[str] = typer.Option(None, "--skip", help="Comma-separated checks to skip."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML file of thresholds: \\[checks.NAME] tables and \\[scan] (docs/scan.md, --config)."),
    set_: List[str] = typer.Option([], "--set", help="Override a threshold: CHECK.PARAM=VALUE (repeatable)."),
    max_fail_share: float = typer.Option(0.0, help="Exit 1 when the failing share exceeds this (0..1)."),
    batch_rows: int = typer.Option(DEFAULT_BATCH_ROWS, help="Rows per streamed batch (memory is bounded by the batch)."),
    workers: int = typer.Option(0, "--workers", "-j", help="Processes that scan parquet row groups or files in parallel; 0 (the default): the CPUs this process may run on (its affinity: taskset -c 0 means 1). Findings are the same for every N; formats that cannot be cut without reading them (JSONL, Arrow streams, conversations) and sets of one batch use one. Each worker holds a batch in memory; one that dies (out of memory) fails the scan with exit 3."),
    ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS", show_default=False, help="Scan the units as Ray tasks on a cluster (pip install 'dqa\\[ray]'): --ray auto: RAY_ADDRESS, else the cluster running on this machine; --ray local: start one here (--workers CPUs, 127.0.0.1 only) for this scan; --ray HOST:PORT or ray://HOST:PORT (a cluster with token authentication at an address named so, or in RAY_ADDRESS, needs RAY_AUTH_MODE=token and its token). Each task reads its rows on its own node, so DATASET must be a URL or a path every node sees; the findings are those of --workers N."),
    last_turn_only: bool = typer.Option(False, "--last-turn-only", help="Conversation JSONL: train only the last assistant turn (SpecForge's train_only_last_turn; default: every assistant turn)."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json on stdout instead of the table."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No table, no progress; exit code only."),
    report_to: List[str] = typer.Option([], "--report-to", metavar="NAME", help=REPORT_TO_HELP),
    list_checks: bool = typer.Option(False, "--list-checks", help="List the checks (priority, whether they judge turns, defaults) and exit."),
    storage_option: List[str] = storage_option_param(),
) -> None:
    """Audit a tokenized training set: every sample gets the named checks.

    Reads `input_ids` plus `loss_mask` (or `labels`), streams it in batches, and writes
    `findings.parquet` (failing rows and reasons), `metrics.parquet` (per-sample numbers),
    `summary.json` and `summary.md` to the output folder.

    Example:  dqa scan data/train/ --tokenizer ./Qwen3-8B --max-fail-share 0.01

    Exit codes: 0 failing share within --max-fail-share, 1 above it, 2 bad input or usage.
    """
    if list_checks:
        _list_checks()
        raise typer.Exit(EXIT_OK)
    code = _run(dataset, tokenizer, out, ids_column, mask_column, labels_column, id_column, thinking, checks, skip,
                config, set_, max_fail_share, batch_rows, as_json, quiet, last_turn_only, workers, storage_option, report_to, ray)
    raise typer.Exit(code)


@handles_errors
def _run(dataset, tokenizer, out, ids_column, mask_column, labels_column, id_column, thinking, checks, skip, config,
         set_, max_fail_share, batch_rows, as_json, quiet, last_turn_only=False, workers=0, storage_option=(), report_to=(),
         ray=None) -> int:
    from dqa import api, storage
    from dqa.errors import UsageError

    storage.configure(storage_option)
    if dataset is None:
        raise UsageError("missing DATASET (see dqa scan --help)")
    if not 0.0 <= max_fail_share <= 1.0:
        raise UsageError(f"--max-fail-share {max_fail_share}: expected a share between 0 and 1")
    if workers < 0:
        raise UsageError(f"--workers {workers}: expected 0 (the CPUs this process may run on) or a count of processes")
    from dqa.reports import trackers

    report_to = trackers.require(report_to)  # before the scan: a missing library is exit 2 at once
    if workers == 0:
        from dqa.audit.scan_workers import default_workers

        workers = default_workers()
    show = stderr_is_tty() and not quiet and not as_json
    with _progress_bar(show) as (on_start, update):
        result = api.scan(dataset, tokenizer, out=out, checks=checks, skip=skip, config=config, thresholds=set_,
                          progress=update, on_start=on_start, ids_column=ids_column, mask_column=mask_column,
                          labels_column=labels_column, id_column=id_column, thinking=thinking, batch_rows=batch_rows,
                          last_turn_only=last_turn_only, workers=workers, ray=ray)
    summary = result.summary
    if report_to:
        from dqa.reports.trackers.feed import report_scan

        trackers.report(report_to, "scan", summary.get("dataset_path") or dataset, result.out_dir, report_scan, summary,
                        result.out_dir, quiet=quiet)
    if result.dropped and not quiet:
        _note_dropped(result.out_dir, result.dropped)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
    elif not quiet:
        from dqa.reports.scan_terminal import print_scan_table

        # The table is the command's result: stdout, so it can be piped or saved.
        print_scan_table(summary, str(result.out_dir), console(stderr=False))
    return EXIT_QUALITY if summary["failing_share"] > max_fail_share else EXIT_OK


def _note_dropped(out_dir: Path, dropped: list[str]) -> None:
    """Say on stderr which outputs of the previous scan the rescan removed (they described other data)."""
    typer.echo(f"note: removed {', '.join(dropped)} from {out_dir}: made from the previous scan, which this one replaces",
               err=True)


@contextlib.contextmanager
def _progress_bar(show: bool) -> Iterator[tuple[Any, Any]]:
    """``(on_start, update)`` callbacks of ``dqa.scan`` drawing a transient progress bar on stderr,
    or ``(None, None)`` when ``show`` is false."""
    if not show:
        yield None, None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TextColumn("rows · {task.fields[tok]} tokens"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    bar: Progress | None = None
    task = None

    def on_start(total: int | None) -> None:  # after the options and paths are checked: the bar appears then
        nonlocal bar, task
        bar = Progress(*columns, console=console(stderr=True), transient=True)
        bar.start()
        task = bar.add_task("scan", total=total, tok="0")

    def update(rows: int, tokens: int) -> None:
        bar.update(task, completed=rows, tok=f"{tokens:,}")

    try:
        yield on_start, update
    finally:
        if bar is not None:
            bar.stop()


def register(app: typer.Typer) -> None:
    """Add ``scan`` to the CLI."""
    app.command("scan", help=help_text(scan.__doc__))(scan)
