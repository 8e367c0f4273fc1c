"""``dqa scan``: audit a tokenized dataset with the named checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from dqa.commands.common import console, handles_errors, help_text, stderr_is_tty
from dqa.errors import EXIT_OK, EXIT_QUALITY


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
    dataset: Optional[Path] = typer.Argument(
        None, help="Parquet file or folder of shards, HF save_to_disk folder, Arrow IPC file, or JSONL.", show_default=False
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", "-t", help="Local HF tokenizer folder (its chat template gives the format: ChatML, Llama 3, DeepSeek), or a preset: qwen3 (the default), qwen3.6."
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default: dqa-out/<dataset name>/)."),
    ids_column: Optional[str] = typer.Option(None, help="Token ids column (default: input_ids)."),
    mask_column: Optional[str] = typer.Option(None, help="0/1 loss mask column (default: loss_mask, if present)."),
    labels_column: Optional[str] = typer.Option(None, help="Labels column, -100 = unsupervised (default: labels)."),
    id_column: Optional[str] = typer.Option(None, help="Sample id column (default: id, if present)."),
    thinking: str = typer.Option("auto", help="Is thinking expected? auto (inferred from the set), expected, off."),
    checks: Optional[str] = typer.Option(None, "--checks", help="Comma-separated checks to run (default: all)."),
    skip: Optional[str] = typer.Option(None, "--skip", help="Comma-separated checks to skip."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML file with \\[checks.NAME] tables of thresholds (see README)."),
    set_: List[str] = typer.Option([], "--set", help="Override a threshold: CHECK.PARAM=VALUE (repeatable)."),
    max_fail_share: float = typer.Option(0.0, help="Exit 1 when the failing share exceeds this (0..1)."),
    batch_rows: int = typer.Option(2048, help="Rows per streamed batch (memory is bounded by the batch)."),
    last_turn_only: bool = typer.Option(False, "--last-turn-only", help="Conversation JSONL: train only the last assistant turn (SpecForge's train_only_last_turn; default: every assistant turn)."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json on stdout instead of the table."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No table, no progress; exit code only."),
    list_checks: bool = typer.Option(False, "--list-checks", help="List the checks (priority, whether they judge turns, defaults) and exit."),
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
                config, set_, max_fail_share, batch_rows, as_json, quiet, last_turn_only)
    raise typer.Exit(code)


@handles_errors
def _run(dataset, tokenizer, out, ids_column, mask_column, labels_column, id_column, thinking, checks, skip, config,
         set_, max_fail_share, batch_rows, as_json, quiet, last_turn_only=False) -> int:
    from dqa.audit import checks as checks_mod
    from dqa.audit.scan import ScanOptions, default_out_dir, run_scan
    from dqa.errors import UsageError

    if dataset is None:
        raise UsageError("missing DATASET (see dqa scan --help)")
    if not 0.0 <= max_fail_share <= 1.0:
        raise UsageError(f"--max-fail-share {max_fail_share}: expected a share between 0 and 1")
    if batch_rows < 1:
        raise UsageError("--batch-rows must be at least 1")
    overrides: dict = {}
    if config is not None:
        for k, v in checks_mod.load_config(str(config)).items():
            overrides.setdefault(k, {}).update(v)
    for k, v in checks_mod.parse_set(set_).items():
        overrides.setdefault(k, {}).update(v)
    options = ScanOptions(
        tokenizer=tokenizer,
        ids_column=ids_column,
        mask_column=mask_column,
        labels_column=labels_column,
        id_column=id_column,
        thinking=thinking,
        only=[c.strip() for c in checks.split(",") if c.strip()] if checks else None,
        skip=[c.strip() for c in skip.split(",") if c.strip()] if skip else [],
        overrides=overrides,
        batch_rows=batch_rows,
        last_turn_only=last_turn_only,
    )
    out_dir = out or default_out_dir(dataset)
    _check_before_tokenizer(dataset, out_dir)
    show = stderr_is_tty() and not quiet and not as_json
    if show:
        result = _scan_with_progress(dataset, out_dir, options)
    else:
        result = run_scan(dataset, out_dir, options)
    summary = result.summary
    if result.dropped and not quiet:
        _note_dropped(out_dir, result.dropped)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
    elif not quiet:
        from dqa.reports.scan_terminal import print_scan_table

        # The table is the command's result: stdout, so it can be piped or saved.
        print_scan_table(summary, str(out_dir), console(stderr=False))
    return EXIT_QUALITY if summary["failing_share"] > max_fail_share else EXIT_OK


def _note_dropped(out_dir: Path, dropped: list[str]) -> None:
    """Say on stderr which outputs of the previous scan the rescan removed (they described other data)."""
    typer.echo(f"note: removed {', '.join(dropped)} from {out_dir}: made from the previous scan, which this one replaces",
               err=True)


def _check_before_tokenizer(dataset: Path, out_dir: Path) -> None:
    """Refuse a missing dataset or an unusable --out before anything loads a tokenizer.

    ``run_scan`` checks these too (the same calls), but the output folder only after the
    template (with a tokenizer folder, ``tokenizer.json``) is loaded; a usage error should not
    wait for that. Check names and --thinking are checked by ``run_scan`` before the load.
    """
    from dqa import atomic
    from dqa.audit import identity
    from dqa.audit.scan_folder import is_scan_folder, read_summary
    from dqa.errors import InputError

    if not Path(dataset).exists():
        raise InputError(f"{dataset}: no such file or folder")
    out = Path(out_dir)
    atomic.check_output_dir(out, [Path(dataset)], is_scan_folder, "dqa scan folder")
    identity.check_scan_folder(out, dataset, read_summary(out) if is_scan_folder(out) else None)


def _scan_with_progress(dataset, out_dir, options):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from dqa.audit.readers import open_dataset
    from dqa.audit.scan import run_scan

    total = open_dataset(dataset, options.ids_column, options.mask_column, options.labels_column, options.id_column).num_rows
    columns = [TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TextColumn("rows · {task.fields[tok]} tokens"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("scan", total=total, tok="0")

        def update(rows: int, tokens: int) -> None:
            bar.update(task, completed=rows, tok=f"{tokens:,}")

        return run_scan(dataset, out_dir, options, progress=update)


def register(app: typer.Typer) -> None:
    """Add ``scan`` to the CLI."""
    app.command("scan", help=help_text(scan.__doc__))(scan)
