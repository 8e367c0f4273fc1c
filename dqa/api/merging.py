"""``dqa.merge``: put regenerated samples back into a new copy of the dataset; what ``dqa merge`` runs.

::

    summary = dqa.merge("train.parquet", ["regen-out/"], "train.v2.parquet")
    summary.replaced, summary.unregenerated, summary.report

The new dataset keeps the input's format and layout; the merge report is written beside it
(``NEW.merge-report.json``). See ``dqa.regen.merge`` for what replaces what. Any of the paths may be a URL
(``dqa.storage``): the dataset is streamed from its store, a regen run is read from a local copy, and a NEW in
a store is written locally first and uploaded, its report last.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from dqa.errors import InputError, UsageError
from dqa.regen.config import DEFAULT_MERGE_BATCH_ROWS
from dqa.storage import input_folder, is_url, location, output_path, url_of

if TYPE_CHECKING:
    from dqa.regen.merge import MergeSummary


def merge(dataset: str | Path, regen: str | Path | Iterable[str | Path], out: str | Path, *, failed: str = "keep",
          accept: str | Iterable[str] = "ok", batch_rows: int = DEFAULT_MERGE_BATCH_ROWS, **options: Any) -> "MergeSummary":
    """Merge the shards of the ``regen`` folder(s) (``dqa regen``'s ``out``) into a copy of ``dataset`` at ``out``.

    ``failed``: ``keep`` (the original row) or ``drop`` the rows that could not be regenerated;
    ``accept``: ``ok`` or ``ok,length`` (also replies cut by the length limit). ``options``: the other
    fields of ``dqa.regen.merge.MergeOptions`` (``force``, ``check_prompts``, ``ids_column``, ``mask_column``,
    ``labels_column``, ``id_column``, ``on_start(total)``, ``on_batch(rows)``).

    Returns the ``MergeSummary`` (also in the report). Raises ``UsageError`` for a bad ``failed``,
    ``accept`` or ``batch_rows``, ``InputError``/``RuntimeFailure`` for bad inputs (see
    ``dqa merge --help``: nothing is written then), ``OSError`` naming ``out`` when writing fails.
    """
    from dqa.atomic import named_os_error
    from dqa.regen.merge import ACCEPT_CHOICES, MergeOptions
    from dqa.regen.merge import merge as run_merge

    if failed not in ("keep", "drop"):
        raise UsageError(f"--failed {failed}: expected keep or drop")
    given = accept if isinstance(accept, str) else ",".join(accept)
    accepted = [a.strip() for a in given.split(",") if a.strip()]
    if not accepted or "ok" not in accepted or any(a not in ACCEPT_CHOICES for a in accepted):
        raise UsageError(f"--accept {given}: expected ok or ok,length")
    if batch_rows < 1:
        raise UsageError(f"--batch-rows {batch_rows}: expected a positive number")
    regen_dirs = [regen] if isinstance(regen, (str, Path)) else list(regen)
    opts = MergeOptions(failed=failed, batch_rows=batch_rows, accept=accepted, **options)
    if is_url(out):
        return _merge_to_store(dataset, regen_dirs, str(out), opts)
    try:
        return run_merge(dataset, [_local_run(d) for d in regen_dirs], out, opts)
    except OSError as exc:  # writing NEW failed (disk full ...): name it in the one-line error
        raise named_os_error(exc, out) from exc


def _local_run(run: str | Path) -> str | Path:
    """A regen run folder to read: itself, or for a URL its local copy (refused when an upload left it incomplete)."""
    from dqa.regen.store.folder import RUN_JSON

    return input_folder(run, RUN_JSON) if is_url(run) else run


def _merge_to_store(dataset: str | Path, regen_dirs: list[str | Path], out: str, opts: Any) -> "MergeSummary":
    """Merge into a local staging path, then upload NEW (a folder under ``.dqa-incomplete`` until whole, a file as
    one object) and its report last (``dqa.storage.output_path``). The report names the URLs, not the staging path."""
    import json

    from dqa.atomic import write_json
    from dqa.regen.merge import merge as run_merge
    from dqa.regen.merge.report import report_path

    loc = location(out)
    if url_of(out) == url_of(dataset):
        raise InputError(f"--out {loc}: the output would replace the input dataset; choose another --out")
    if loc.exists() and not opts.force:
        raise InputError(f"--out {loc}: exists in the store; choose another --out or give --force")
    runs = [_local_run(d) for d in regen_dirs]
    with output_path(loc) as local:
        summary = run_merge(dataset, runs, local, opts)
        summary.output, summary.report = str(loc), str(loc.parent / report_path(local).name)
        summary.regen = [url_of(d) for d in regen_dirs]
        report = json.loads(report_path(local).read_text())
        report.update({k: getattr(summary, k) for k in ("output", "report", "regen")})
        write_json(report_path(local), report)
    return summary
