"""``ScanOptions``: everything ``dqa scan`` can be told, and its defaults. Importing it is cheap (no numpy,
pyarrow or polars), so the CLI can show the defaults in ``--help`` without loading the scanner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Rows per streamed batch. Memory is bounded by the batch, and a smaller batch also faults fewer fresh pages in:
# in a pool of two, 1,024 rows scanned the 200M-token benchmark sets 9-15% faster than 2,048 (bench/README.md).
DEFAULT_BATCH_ROWS = 1024


@dataclass
class ScanOptions:
    """Everything ``dqa scan`` can be told. Column names left None are detected."""

    tokenizer: str | None = None
    ids_column: str | None = None
    mask_column: str | None = None
    labels_column: str | None = None
    id_column: str | None = None
    thinking: str = "auto"  # auto | expected | off
    only: list[str] | None = None
    skip: list[str] = field(default_factory=list)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    batch_rows: int = DEFAULT_BATCH_ROWS
    last_turn_only: bool = False  # conversation JSONL: train only the last assistant turn (SpecForge's train_only_last_turn)
    # Processes that scan row groups / files; None: 1. In a library call the caller's process may hold
    # other threads, and the pool forks it: so one unless asked. `dqa scan` defaults to the CPUs.
    workers: int | None = None
    # A Ray cluster to run the units on (``dqa.audit.executors.ray_tasks.connect``: auto, local, HOST:PORT,
    # ray://HOST:PORT); None: this machine. With ``local``, ``workers`` is the local cluster's CPUs.
    ray: str | None = None
