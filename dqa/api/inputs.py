"""What ``dqa.scan`` accepts as data: a path, or a table in memory given as an Arrow table.

``in_memory_table`` turns a ``pyarrow.Table`` (or ``RecordBatch``), a polars DataFrame or an HF
``datasets.Dataset`` into a ``pyarrow.Table`` without copying the token columns where the library
allows it (polars' and ``datasets``' own Arrow data; a ``datasets`` selection or filter is applied
by its indices), and returns None for a path, which the readers open from disk.
"""

from __future__ import annotations

import os
from typing import Any

from dqa.errors import InputError

EXPECTED = "a path (str or os.PathLike), a pyarrow.Table, a polars DataFrame or a datasets.Dataset"


def in_memory_table(data: Any) -> tuple[Any, str] | None:
    """``(pyarrow.Table, label)`` for a table in memory; None for a path or a URL.

    The label names the data in summaries and messages (``<pyarrow.Table>``,
    ``<polars.DataFrame>``, ``<datasets.Dataset>``). Raises ``InputError`` for anything else
    (a ``DatasetDict``: name one split; an ``IterableDataset``: not held in memory).
    """
    from dqa.storage import StorePath

    if isinstance(data, (str, os.PathLike, StorePath)):  # a path or a URL (dqa.storage)
        return None
    import pyarrow as pa

    if isinstance(data, pa.Table):
        return data, "<pyarrow.Table>"
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data]), "<pyarrow.RecordBatch>"
    kind = type(data)
    top, name = kind.__module__.split(".")[0], kind.__name__
    if top == "polars" and name == "DataFrame":
        return data.to_arrow(), "<polars.DataFrame>"
    if top == "datasets":
        if name == "Dataset":
            # The arrow view of every row, in order: the table itself, or its selection/filter taken by indices.
            return data.with_format("arrow")[:], "<datasets.Dataset>"
        if name == "DatasetDict":
            raise InputError(f"a datasets.DatasetDict; pass one split (splits: {', '.join(map(str, data))})")
        if name == "IterableDataset":
            raise InputError("a datasets.IterableDataset is streamed, not held in memory; pass a datasets.Dataset or a path")
    raise InputError(f"cannot scan a {kind.__module__}.{name}: expected {EXPECTED}")
