"""``dqa.merge``: put regenerated samples back into a new copy of the dataset; what ``dqa merge`` runs.

::

    summary = dqa.merge("train.parquet", ["regen-out/"], "train.v2.parquet")
    summary.replaced, summary.unregenerated, summary.report

The new dataset keeps the input's format and layout; the merge report is written beside it
(``NEW.merge-report.json``). See ``dqa.regen.merge`` for what replaces what.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from dqa.errors import UsageError
from dqa.regen.config import DEFAULT_MERGE_BATCH_ROWS

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
    try:
        return run_merge(dataset, regen_dirs, out, MergeOptions(failed=failed, batch_rows=batch_rows, accept=accepted, **options))
    except OSError as exc:  # writing NEW failed (disk full ...): name it in the one-line error
        raise named_os_error(exc, out) from exc
