"""Which columns of a tokenized dataset hold what, and what their types must be.

The defaults (``input_ids``, ``loss_mask`` or ``labels`` with ``IGNORE_INDEX`` -100, ``id``),
``Columns`` (the choice for one dataset: ``choose_columns``), the type checks every shard's
schema passes (``check_schema``, ``is_int_list``, ``is_nested_list``), and the ``[1, L]`` token
columns SpecForge stores (``list<list<int>>``, one list per row): ``flatten_token_lists`` reads
them as flat lists, ``nest_token_lists`` writes them back. Used by the readers
(``dqa.audit.readers``), the writers and merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa

from dqa.errors import InputError

IDS_DEFAULT = "input_ids"
MASK_DEFAULT = "loss_mask"
LABELS_DEFAULT = "labels"
ID_DEFAULT = "id"
ATTENTION_DEFAULT = "attention_mask"
IGNORE_INDEX = -100


@dataclass(frozen=True)
class Columns:
    """Which columns hold the tokens, the supervision and the sample id.

    Exactly one of ``mask`` and ``labels`` is set.
    """

    ids: str
    mask: str | None
    labels: str | None
    id: str | None

    @property
    def supervision(self) -> str:
        """The name of the column that says what is supervised."""
        return self.mask or self.labels  # type: ignore[return-value]

    @property
    def convention(self) -> str:
        """``loss_mask`` or ``labels``."""
        return "loss_mask" if self.mask else "labels"


def choose_columns(
    schema: pa.Schema, f: Path, ids: str | None, mask: str | None, labels: str | None, id_col: str | None
) -> Columns:
    """The ``Columns`` of a dataset whose first file ``f`` has ``schema``: the given names, else the
    defaults (``loss_mask`` before ``labels``; ``id`` when present). Raises ``InputError`` naming the
    file and its columns for a missing column or both ``mask`` and ``labels`` given."""
    names = set(schema.names)
    if mask and labels:
        raise InputError("give --mask-column or --labels-column, not both")
    ids = ids or IDS_DEFAULT
    if ids not in names:
        raise InputError(f"{f}: no column {ids!r} (columns: {', '.join(schema.names)}); use --ids-column")
    if mask is None and labels is None:
        if MASK_DEFAULT in names:
            mask = MASK_DEFAULT
        elif LABELS_DEFAULT in names:
            labels = LABELS_DEFAULT
        else:
            raise InputError(
                f"{f}: expected a {MASK_DEFAULT!r} (0/1) or {LABELS_DEFAULT!r} (-100 = unsupervised) column "
                f"(columns: {', '.join(schema.names)}); use --mask-column or --labels-column"
            )
    for c in (mask, labels):
        if c is not None and c not in names:
            raise InputError(f"{f}: no column {c!r} (columns: {', '.join(schema.names)})")
    if id_col is not None and id_col not in names:
        raise InputError(f"{f}: no column {id_col!r} for --id-column")
    if id_col is None and ID_DEFAULT in names:
        id_col = ID_DEFAULT
    return Columns(ids=ids, mask=mask, labels=labels, id=id_col)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def is_nested_list(t: pa.DataType) -> bool:
    """Whether ``t`` is a list of lists (a ``[1, L]`` token column stores ``list<list<int>>``)."""
    return _is_list(t) and _is_list(t.value_type)


def is_int_list(t: pa.DataType, allow_bool: bool = False, nested: bool = False) -> bool:
    """Whether ``t`` is a list of integers (or, with ``allow_bool``, booleans); with ``nested``,
    also a list of such lists (read as ``[1, L]`` rows)."""
    if nested and is_nested_list(t):
        t = t.value_type
    if not _is_list(t):
        return False
    v = t.value_type
    return pa.types.is_integer(v) or (allow_bool and pa.types.is_boolean(v)) or pa.types.is_null(v)


def check_schema(schema: pa.Schema, columns: Columns, f: Path, convention: str, nested: bool = False) -> None:
    """Refuse a file ``f`` whose ``schema`` lacks the ids or supervision column of ``columns`` (a shard
    of another ``convention``), or holds them with the wrong types (``nested``: a ``[1, L]`` list of
    lists per row is accepted too). Raises ``InputError`` naming the file, the column and the type."""
    names = set(schema.names)
    sup = columns.supervision
    if sup not in names:
        other = LABELS_DEFAULT if columns.mask else MASK_DEFAULT
        hint = f" (it has {other!r}: shards mix conventions)" if other in names else ""
        raise InputError(f"{f}: no column {sup!r}{hint}; every shard must use the {convention} convention")
    if columns.ids not in names:
        raise InputError(f"{f}: no column {columns.ids!r}")
    either = " (or one [1, L] list of them per row)" if nested else ""
    t = schema.field(columns.ids).type
    if not is_int_list(t, nested=nested):
        raise InputError(f"{f}: column {columns.ids!r} must be a list of integer token ids{either}, found {t}")
    t = schema.field(sup).type
    if not is_int_list(t, allow_bool=columns.mask is not None, nested=nested):
        kind = "0/1 integers or booleans" if columns.mask else "integers (-100 = unsupervised)"
        raise InputError(f"{f}: column {sup!r} must be a list of {kind}{either}, found {t}")


# --- [1, L] token columns ------------------------------------------------------------------


def flatten_token_lists(
    rb: pa.RecordBatch, columns: Sequence[str], f: Path | str, start_row: int
) -> tuple[pa.RecordBatch, dict[str, pa.DataType]]:
    """``rb`` with each of ``columns`` that holds a list of lists per row (``list<list<int>>``)
    replaced by its one inner list per row; returns it and the stored types of the columns it
    unwrapped (``nest_token_lists`` puts them back).

    Vectorized: the outer list lengths are checked at once and the outer level dropped with
    Arrow's ``flatten``. Raises ``InputError`` naming the file, the column, the first bad row
    (0-based dataset row, ``start_row`` being the batch's first) and the shape found, for a
    null outer list or any shape other than ``[1, L]`` (``[2, L]``, ``[0]``, ragged).
    """
    import pyarrow.compute as pc

    nested: dict[str, pa.DataType] = {}
    for name in columns:
        i = rb.schema.get_field_index(name)
        if i < 0 or not is_nested_list(rb.schema.field(i).type):
            continue
        arr = rb.column(i)
        if arr.null_count:
            row = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
            raise InputError(f"{f}: column {name!r}, row {start_row + row}: null (expected one [1, L] list of tokens)")
        outer = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(outer != 1)
        if bad.size:
            row = int(bad[0])
            raise InputError(
                f"{f}: column {name!r}, row {start_row + row}: shape {_shape_of(arr.slice(row, 1))} "
                "(expected [1, L]: one list of tokens per row)"
            )
        nested[name] = arr.type
        rb = rb.set_column(i, rb.schema.field(i).with_type(arr.type.value_type), arr.flatten())
    return rb, nested


def _shape_of(row: pa.Array) -> str:
    """``[k, L]`` for one row of a list-of-lists column; ``[k, ragged: a, b, ...]`` when the inner lengths differ."""
    import pyarrow.compute as pc

    inner = row.flatten()
    k = len(inner)
    if k == 0:
        return "[0]"
    lengths = pc.fill_null(pc.list_value_length(inner), 0).to_numpy(zero_copy_only=False)
    if (lengths == lengths[0]).all():
        return f"[{k}, {int(lengths[0])}]"
    shown = ", ".join(str(int(v)) for v in lengths[:6]) + (", ..." if k > 6 else "")
    return f"[{k}, ragged: {shown}]"


def nest_token_lists(rb: pa.RecordBatch, nested: dict[str, pa.DataType]) -> pa.RecordBatch:
    """``rb`` with each column of ``nested`` (name -> stored type, from ``flatten_token_lists``)
    wrapped back into one ``[1, L]`` list per row of that type (vectorized)."""
    for name, typ in nested.items():
        i = rb.schema.get_field_index(name)
        if i < 0:
            continue
        arr = rb.column(i)
        n = len(arr)
        if pa.types.is_fixed_size_list(typ):
            outer = pa.FixedSizeListArray.from_arrays(arr, 1)
        elif pa.types.is_large_list(typ):
            outer = pa.LargeListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int64)), arr)
        else:
            outer = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), arr)
        rb = rb.set_column(i, rb.schema.field(i).with_type(typ), outer.cast(typ))
    return rb
