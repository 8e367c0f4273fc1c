"""What a caller asks of ``merge``: ``MergeOptions``, and the defaults and choices it draws on.

A leaf module (it imports nothing of the merge) so that ``tokens`` and ``conversations``, which
``__init__`` imports, can read the options without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from dqa.regen.config import DEFAULT_MERGE_BATCH_ROWS
from dqa.regen.store.shards import ShardStatus

ACCEPT_CHOICES = (ShardStatus.OK.value, ShardStatus.LENGTH.value)
DEFAULT_ACCEPT = (ShardStatus.OK.value,)
CACHE_BYTES = 1 << 30  # shard row groups held at once, beyond those the current batch needs


@dataclass(frozen=True)
class MergeOptions:
    """How ``merge`` merges; every field has the default of ``dqa merge``.

    ``failed``: ``keep`` (rows that could not be regenerated keep their original) or ``drop``;
    ``force``: replace ``out`` if it exists (never the input); ``batch_rows``: rows per streamed
    batch; ``check_prompts``: refuse shards whose prompt tokens are not the dataset row's;
    ``ids_column`` / ``mask_column`` / ``labels_column`` / ``id_column``: column overrides (all
    None: the ones given to ``dqa regen``, from run.json); ``on_start(total rows or None)`` and
    ``on_batch(rows)``: progress callbacks; ``cache_bytes``: the budget of decoded shard row
    groups; ``accept``: the statuses that replace a row (``ok``, optionally ``length``).
    Nothing is checked here: ``merge`` raises ``InputError`` for a bad ``accept`` or ``failed``.
    """

    failed: str = "keep"
    force: bool = False
    batch_rows: int = DEFAULT_MERGE_BATCH_ROWS
    check_prompts: bool = True
    ids_column: str | None = None
    mask_column: str | None = None
    labels_column: str | None = None
    id_column: str | None = None
    on_batch: Callable[[int], None] | None = None
    on_start: Callable[[int | None], None] | None = None
    cache_bytes: int = CACHE_BYTES
    accept: Iterable[str] = DEFAULT_ACCEPT
