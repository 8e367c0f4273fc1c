"""Arrow column helpers the merge modules share: a cast into a stored column's type that names
the column when it fails, and a column (ids, errors) as one string array."""

from __future__ import annotations

import pyarrow as pa

from dqa.errors import InputError


def cast_to(arr: pa.Array, typ: pa.DataType, column: str) -> pa.Array:
    """``arr`` cast to ``typ``; raises ``InputError`` naming ``column`` when it cannot be."""
    try:
        return arr.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"column {column!r} of type {typ} cannot hold the regenerated rows ({' '.join(str(exc).split())[:120]})") from None


def as_strings(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``col`` as one string array (ids, errors: whatever type they were stored as)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col if col.type == pa.string() else col.cast(pa.string())
