"""A record batch of token lists made flat and checked: ``TokenBatch`` and ``to_token_batch``.

``to_token_batch`` turns the ids and supervision columns of one Arrow record batch into numpy
arrays (all rows' ids concatenated, row offsets, a 0/1 mask aligned with the ids), checking
every value on the way with whole-array operations, never a loop over rows: nulls, negative or
out-of-range ids, masks outside {0, 1}, labels that are neither -100 nor ids. ``token_slices``
cuts a record batch so a batch stays under a token budget. Errors are ``InputError`` naming the
file, the column and the 0-based dataset row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from dqa.arrays import ranks as _ranks, segment_sum as _segment_sum
from dqa.audit.token_columns import IGNORE_INDEX, Columns
from dqa.errors import InputError


@dataclass
class TokenBatch:
    """A batch of rows, flattened.

    Attributes:
        start_row: dataset row of the batch's first row (0-based, dataset order).
        source: the file the rows came from.
        ids: int32 token ids of all rows, concatenated.
        offsets: int64, ``len == rows + 1``; row ``r`` is ``ids[offsets[r]:offsets[r+1]]``.
        mask: uint8 0/1 supervision aligned with ``ids`` (rows whose mask length
            differs from their ids length get all zeros here).
        mask_lengths: the supervision list length of each row, as stored.
        label_mismatch: per row, supervised positions whose label differs from the
            input id (labels convention only; zeros otherwise).
        row_ids: the id column as an Arrow array, or None.
        max_id: the largest token id (already computed while validating), or None.
    """

    start_row: int
    source: str
    ids: np.ndarray
    offsets: np.ndarray
    mask: np.ndarray
    mask_lengths: np.ndarray
    label_mismatch: np.ndarray
    row_ids: pa.Array | None
    max_id: int | None = None

    @property
    def num_rows(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def arrow_view(values: np.ndarray) -> pa.Array:
    """An Arrow array of the 1-D numeric or bool numpy ``values``: over their buffer (no copy) when numeric and
    contiguous; bools are packed into Arrow's bitmap. What ``pa.array`` would make of them, minus its per-call
    checks and type inference, and without its first call importing pandas (``numpy_view``)."""
    values = np.ascontiguousarray(values)
    if values.dtype == np.bool_:
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def numpy_view(arr: pa.Array) -> np.ndarray:
    """The values of the Arrow array ``arr`` as numpy: a zero-copy, read-only view for a fixed-width integer or
    float array without nulls, else ``to_numpy`` (a copy). Not ``to_numpy`` always: on first use pyarrow's
    conversion imports pandas where it is installed (0.13-0.2 s of every scanning process)."""
    t = arr.type
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        dtype = np.dtype(t.to_pandas_dtype())  # a numpy dtype; pandas is not involved
        buf = arr.buffers()[1]
        if buf is None or len(arr) == 0:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    return arr.to_numpy(zero_copy_only=False)


def _list_parts(arr: pa.Array, f: Path, col: str, start_row: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat values (numpy) and row offsets (int64, starting at 0) of a list array; rejects nulls."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    if arr.null_count:
        row = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"{f}: column {col!r}, row {start_row + row}: null list (expected a list of token ids)")
    offsets = numpy_view(arr.offsets).astype(np.int64)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0])
    offsets = offsets - offsets[0]
    if values.null_count:
        pos = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        row = int(np.searchsorted(offsets, pos, side="right") - 1)
        raise InputError(f"{f}: column {col!r}, row {start_row + row}: null inside the list (expected integers)")
    if pa.types.is_null(values.type):
        return np.zeros(0, dtype=np.int64), offsets
    return numpy_view(values), offsets


def _row_of(offsets: np.ndarray, pos: int) -> int:
    return int(np.searchsorted(offsets, pos, side="right") - 1)


def to_token_batch(rb: pa.RecordBatch, columns: Columns, f: Path, start_row: int) -> TokenBatch:
    """``rb`` (rows ``start_row``... of the dataset, from file ``f``) as a checked ``TokenBatch``.

    Raises ``InputError`` naming the file, the column and the dataset row for a null list or value,
    a negative or out-of-range id, a mask value outside {0, 1}, or a label neither -100 nor an id.
    """
    ids_vals, offsets = _list_parts(rb.column(columns.ids), f, columns.ids, start_row)
    lo = hi = -1
    if ids_vals.size:
        lo, hi = int(ids_vals.min()), int(ids_vals.max())
        if lo < 0:
            pos = int(np.argmax(ids_vals < 0))
            raise InputError(f"{f}: column {columns.ids!r}, row {start_row + _row_of(offsets, pos)}: negative token id {int(lo)}")
        if hi > np.iinfo(np.int32).max:
            pos = int(np.argmax(ids_vals > np.iinfo(np.int32).max))
            raise InputError(f"{f}: column {columns.ids!r}, row {start_row + _row_of(offsets, pos)}: token id {int(hi)} out of range")
    ids = ids_vals.astype(np.int32, copy=False)

    sup_col = columns.supervision
    sup_vals, sup_off = _list_parts(rb.column(sup_col), f, sup_col, start_row)
    lengths = np.diff(offsets)
    sup_lengths = np.diff(sup_off)
    if columns.mask:
        if sup_vals.dtype == np.bool_:
            mvals = sup_vals.view(np.uint8)
        else:
            if sup_vals.size and (sup_vals.min() < 0 or sup_vals.max() > 1):
                pos = int(np.flatnonzero((sup_vals < 0) | (sup_vals > 1))[0])
                raise InputError(
                    f"{f}: column {sup_col!r}, row {start_row + _row_of(sup_off, pos)}: value {int(sup_vals[pos])} (expected 0 or 1)"
                )
            mvals = sup_vals.view(np.uint8) if sup_vals.dtype == np.int8 else sup_vals.astype(np.uint8)
        label_vals = None
    else:
        bad = (sup_vals < 0) & (sup_vals != IGNORE_INDEX)
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"{f}: column {sup_col!r}, row {start_row + _row_of(sup_off, pos)}: label {int(sup_vals[pos])} "
                f"(expected {IGNORE_INDEX} or a token id)"
            )
        mvals = (sup_vals != IGNORE_INDEX).view(np.uint8)
        label_vals = sup_vals

    aligned = lengths == sup_lengths
    label_mismatch = np.zeros(len(lengths), dtype=np.int64)
    if aligned.all():
        mask = mvals
        if label_vals is not None:
            diff = ((label_vals != ids) & (mvals == 1)).view(np.uint8)
            label_mismatch = _segment_sum(diff, offsets)
    else:
        # Rows whose supervision length differs get an all-zero mask; copy the rest in place.
        mask = np.zeros(ids.size, dtype=np.uint8)
        rows = np.flatnonzero(aligned)
        if rows.size:
            take_len = lengths[rows]
            dst = np.repeat(offsets[rows], take_len) + _ranks(take_len)
            src = np.repeat(sup_off[rows], take_len) + _ranks(take_len)
            mask[dst] = mvals[src]
            if label_vals is not None:
                diff = ((label_vals[src] != ids[dst]) & (mvals[src] == 1)).astype(np.uint8)
                full = np.zeros(ids.size, dtype=np.uint8)
                full[dst] = diff
                label_mismatch = _segment_sum(full, offsets)
    row_ids = rb.column(columns.id) if columns.id else None
    if isinstance(row_ids, pa.ChunkedArray):
        row_ids = row_ids.combine_chunks()
    return TokenBatch(
        start_row=start_row,
        source=str(f),
        ids=ids,
        offsets=offsets,
        mask=np.ascontiguousarray(mask),
        mask_lengths=sup_lengths,
        label_mismatch=label_mismatch,
        row_ids=row_ids,
        max_id=hi,
    )


def token_slices(rb: pa.RecordBatch, ids_column: str, max_tokens: int) -> Iterator[pa.RecordBatch]:
    """Cut ``rb`` into consecutive slices of at most ``max_tokens`` tokens (a longer row stands alone)."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(rb.column(ids_column))
    # A null list counts 0 here (to_token_batch names it). Not pc.fill_null: its pa.scalar imports pandas.
    lengths = numpy_view(lengths) if lengths.null_count == 0 else np.nan_to_num(lengths.to_numpy(zero_copy_only=False))
    cum = np.cumsum(lengths, dtype=np.int64)
    if rb.num_rows == 0 or cum[-1] <= max_tokens:
        yield rb
        return
    start = 0
    while start < rb.num_rows:  # one iteration per slice, not per row
        base = cum[start - 1] if start else 0
        end = max(int(np.searchsorted(cum, base + max_tokens, side="right")), start + 1)
        yield rb.slice(start, end - start)
        start = end
