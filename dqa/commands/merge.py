"""``dqa merge``: put regenerated samples back into the dataset, in the dataset's own format."""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from dqa.commands.common import handles_errors, help_text, stderr_is_tty, storage_option_param
from dqa.regen.config import DEFAULT_MERGE_BATCH_ROWS


def merge(
    dataset: str = typer.Argument(
        ..., help="The dataset dqa regen read: parquet file or folder, HF save_to_disk folder, Arrow IPC file, or JSONL; a path or a URL (s3://...).",
        show_default=False,
    ),
    regen: List[str] = typer.Option(
        ..., "--regen", "-r", metavar="DIR", show_default=False,
        help="The --out folder or URL of dqa regen (repeatable: one per --shard i/N driver).",
    ),
    out: str = typer.Option(
        ..., "--out", "-o", metavar="NEW", show_default=False, help="The new dataset: a file or folder of the input's format, or a URL (written locally, then uploaded; a folder stays marked incomplete until whole, the report comes last)."
    ),
    failed: str = typer.Option(
        "keep", "--failed", metavar="keep|drop", help="Rows that could not be regenerated: keep the original, or drop the row."
    ),
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists (never the input)."),
    check_prompts: bool = typer.Option(
        True, "--check-prompts/--no-check-prompts",
        help="Refuse shards whose prompt tokens are not the dataset row's first prompt_len tokens.",
    ),
    accept: str = typer.Option("ok", "--accept", help="Which regenerated conversations replace their originals: ok (default: only complete replies; one cut by --max-new-tokens has unclosed thinking and no end of turn, which the release scan flags as truncated and which trains the model to stop mid-thought, so the original is kept and listed in the report) or ok,length (also those cut by the length limit)."),
    batch_rows: int = typer.Option(DEFAULT_MERGE_BATCH_ROWS, help="Rows per streamed batch (memory is bounded by the batch)."),
    ids_column: Optional[str] = typer.Option(None, help="Token ids column (default: the one given to dqa regen, else input_ids)."),
    mask_column: Optional[str] = typer.Option(None, help="0/1 loss mask column (default: the one given to dqa regen, else loss_mask, if present)."),
    labels_column: Optional[str] = typer.Option(None, help="Labels column, -100 = unsupervised (default: the one given to dqa regen, else labels)."),
    id_column: Optional[str] = typer.Option(None, help="Sample id column (default: the one given to dqa regen, else id, if present)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout (instead of the summary line)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line, no notes, no progress bar; exit code only."),
    storage_option: List[str] = storage_option_param(),
) -> None:
    """Merge regenerated samples into a new copy of the dataset.

    Writes NEW in the input's format and file layout (parquet file or shard folder with the
    same file names, Arrow IPC file or stream, JSONL, HF save_to_disk folder). Each
    conversation that dqa regen completed replaces its original: every turn it regenerated
    finished ok (with --accept ok,length the final turn may also have been cut by the length
    limit). The new sample is the regenerated history (earlier regenerated turns as the chat
    template renders history: Qwen3 drops their reasoning) plus the final turn, masked in the
    input's own convention (the scan's conventions, else detected from the input): every
    assistant turn trained or only the last, the newline after end of turn trained or not, a
    `<think>\n` in the untrained header or trained, the assistant header trained or not, the end
    of turn trained or not (axolotl's train_on_eos: none); loss_mask in the input's value type, or
    labels = the id where the mask is 1 and -100 elsewhere; attention_mask, if present, all
    ones. Other columns stay. A `dqa_regen` column records endpoint, model, finish_reason,
    status, sampling and completed_at (null for untouched rows; JSON text in JSONL, `null`
    for untouched rows). Row order is kept.

    Rows that could not be regenerated (a failed turn, a length cut not accepted, a
    conversation the run has not finished, or selected in the run but absent from its shards)
    keep their original row (--failed keep) or are dropped (--failed drop); either way they
    are listed with row, id and reason in NEW.merge-report.json, written beside NEW. NEW
    appears only when complete (built under a temporary name, then renamed).

    Example:  dqa merge data/train.parquet --regen regen-out/ --out data/train.v2.parquet

    Exit codes: 0 merged; 2 bad input (missing regen folder, unreadable or truncated
    shard, shard rows beyond the dataset or of another dataset, NEW exists without --force,
    NEW is the input); 3 a row appears twice in the shards.
    """
    raise typer.Exit(_run(dataset, regen, out, failed, force, check_prompts, batch_rows, ids_column, mask_column,
                          labels_column, id_column, as_json, quiet, accept, storage_option))


@handles_errors
def _run(dataset, regen, out, failed, force, check_prompts, batch_rows, ids_column, mask_column, labels_column,
         id_column, as_json, quiet, accept="ok", storage_option=()) -> int:
    from dqa import api, storage

    storage.configure(storage_option)
    progress = None
    task = None
    on_start = on_batch = None
    if stderr_is_tty() and not quiet:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from dqa.commands.common import console

        def on_start(total):  # noqa: ANN001  (after the inputs are checked: the bar appears then)
            nonlocal progress, task
            progress = Progress(TextColumn("merging"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=console(stderr=True), transient=True)
            progress.start()
            task = progress.add_task("merge", total=total)

        def on_batch(rows):  # noqa: ANN001
            progress.advance(task, rows)

    try:
        summary = api.merge(
            dataset, regen, out, failed=failed, accept=accept, batch_rows=batch_rows, force=force,
            check_prompts=check_prompts, ids_column=ids_column, mask_column=mask_column, labels_column=labels_column,
            id_column=id_column, on_batch=on_batch, on_start=on_start,
        )
    finally:
        if progress is not None:
            progress.stop()
    if not quiet:
        for note in summary.selection:  # a warning, not the result: stderr
            if "only failed" in note:
                print(f"dqa merge: note: {note}", file=sys.stderr)
    if as_json:
        sys.stdout.write(json.dumps(summary.as_dict()) + "\n")
    elif not quiet:
        trunc = f" ({summary.truncated:,} truncated: status length)" if summary.truncated else ""
        fate = ""
        if summary.unregenerated:
            fate = " (kept as they were)" if failed == "keep" else " (dropped)"
        print(
            f"dqa merge: {summary.rows_in:,} rows in, {summary.replaced:,} replaced{trunc}, "
            f"{summary.unregenerated:,} could not be regenerated{fate}, {summary.rows_out:,} rows out "
            f"-> {summary.output} (report: {summary.report}) in {summary.elapsed_s:.1f}s"
        )
    return 0


def register(app: typer.Typer) -> None:
    """Add ``dqa merge`` to ``app``."""
    app.command("merge", help=help_text(merge.__doc__))(merge)
