"""An Arrow table in memory read as a ``Dataset``: how ``dqa.scan`` reads a ``pyarrow.Table``, a
polars DataFrame or an HF ``datasets.Dataset`` without writing it to a file.

``open_table`` picks and checks the columns as ``open_dataset`` does (the same defaults, options
and errors); ``TableDataset`` streams the table's record batches in row order (zero-copy slices)
through the same flattening and checks as the on-disk formats, so a scan of a table finds what a
scan of the same rows in a file finds. Its format is ``table``, its files none, and its path a
label such as ``<pyarrow.Table>`` (what summaries and messages name it by).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from dqa.arrays import sorted_unique
from dqa.audit.readers import MAX_BATCH_TOKENS, Dataset
from dqa.audit.token_batch import TokenBatch
from dqa.audit.token_columns import Columns, check_schema, choose_columns

FORMAT = "table"


class TableDataset(Dataset):
    """A ``pyarrow.Table`` held in memory, read like a dataset on disk (see the module docstring)."""

    def __init__(self, table: pa.Table, label: str, columns: Columns):
        super().__init__(Path(label), FORMAT, [], columns, table.schema)
        self.table = table

    @property
    def num_rows(self) -> int:
        """The table's rows (always known)."""
        return self.table.num_rows

    def record_batches(self, batch_rows: int = 8192, columns: list[str] | None = None) -> Iterator[tuple[Path, pa.RecordBatch]]:
        """Yield ``(label path, record_batch)`` in row order with ``columns`` (default: all), at most
        ``batch_rows`` rows each (slices of the table's own chunks, not copies)."""
        table = self.table if columns is None else self.table.select(columns)
        for rb in table.to_batches(max_chunksize=max(batch_rows, 1)):
            yield self.path, rb

    def work_units(self, min_rows: int) -> None:
        """None: a table in memory is scanned as one stream, in this process."""
        return None

    def batches_with_rows(self, rows: Iterable[int], batch_rows: int = 4096) -> Iterator[TokenBatch]:
        """Yield one token batch per wanted row (a one-row slice of the table), in row order."""
        cols = self._needed()
        for row in sorted_unique(np.fromiter(rows, dtype=np.int64)):  # a few rows (the decoded templates' examples)
            piece = self.table.select(cols).slice(int(row), 1)
            yield from self._token_batches(((self.path, rb) for rb in piece.to_batches()), int(row), MAX_BATCH_TOKENS)


def open_table(
    table: pa.Table,
    label: str = "<pyarrow.Table>",
    ids_column: str | None = None,
    mask_column: str | None = None,
    labels_column: str | None = None,
    id_column: str | None = None,
) -> TableDataset:
    """Detect the column convention of ``table`` (``open_dataset``'s rules) and wrap it.

    Returns a ``TableDataset`` named ``label``. Raises ``InputError`` (naming ``label``) when the
    token or supervision column is absent or not a list of integers, or both a mask and a labels
    column are given.
    """
    where = Path(label)
    columns = choose_columns(table.schema, where, ids_column, mask_column, labels_column, id_column)
    check_schema(table.schema, columns, where, columns.convention, nested=True)
    return TableDataset(table, label, columns)
