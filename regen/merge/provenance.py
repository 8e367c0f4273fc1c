"""Provenance: the ``dqa_regen`` column that says where each replaced row came from.

A struct of ``endpoint``, ``model``, ``finish_reason``, ``status``, ``sampling`` and
``completed_at`` (``PROVENANCE_TYPE``), or the same object as JSON text where a struct cannot go
(JSONL; token columns held as ``[1, L]`` tensors); null for rows that were not replaced, and an
earlier merge's provenance kept for rows this one does not replace.
``merged_provenance`` builds the column of a tokenized batch; ``provenance_rows`` the objects of
the conversation merge.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from dqa.errors import InputError
from dqa.regen.merge.columns import cast_to
from dqa.regen.merge.index import RegenIndex

PROVENANCE_COLUMN = "dqa_regen"
PROVENANCE_TYPE = pa.struct(
    [
        ("endpoint", pa.string()),
        ("model", pa.string()),
        ("finish_reason", pa.string()),
        ("status", pa.string()),
        ("sampling", pa.string()),
        ("completed_at", pa.timestamp("us", tz="UTC")),
    ]
)


def provenance_type(as_json: bool) -> pa.DataType:
    """The provenance column's type in an output: JSON text (``as_json``), else ``PROVENANCE_TYPE``."""
    return pa.string() if as_json else PROVENANCE_TYPE


def merged_provenance(rb: pa.RecordBatch, shard: pa.Table | None, local: np.ndarray | None, keep: np.ndarray | None,
                      as_json: bool, untyped: bool) -> pa.Array:
    """The provenance column of the merged batch ``rb``: the provenance of the ``shard`` rows at batch
    positions ``local``, the batch's own (an earlier merge's; else null, the text ``null`` when
    ``untyped``) elsewhere, rows not in ``keep`` left out. Raises ``InputError`` when the dataset
    already has a ``dqa_regen`` column of another type, or a shard's provenance column cannot be
    cast to its field's type."""
    n = rb.num_rows
    existing = rb.column(PROVENANCE_COLUMN) if PROVENANCE_COLUMN in rb.schema.names else None
    typ = provenance_type(as_json)
    if existing is not None and existing.type != typ:
        try:
            existing = existing.cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InputError(
                f"column {PROVENANCE_COLUMN!r} exists in the dataset with type {existing.type}; expected {typ}"
            ) from None
    if existing is None:
        existing = pa.repeat(pa.scalar("null"), n) if untyped else pa.nulls(n, typ)
    if shard is None:
        return existing if keep is None else existing.filter(pa.array(keep))
    new = provenance_of(shard, as_json)
    take = np.arange(n, dtype=np.int64)
    take[local] = n + np.arange(local.size)
    if keep is not None:
        take = take[keep]
    return pa.concat_arrays([existing, new]).take(pa.array(take))


def provenance_of(t: pa.Table, as_json: bool) -> pa.Array:
    """The provenance of each row of the shard table ``t`` (fields it lacks are null), as a
    ``PROVENANCE_TYPE`` struct array or, with ``as_json``, JSON text. Raises ``InputError`` when a
    shard column cannot be cast to its field's type."""
    arrays = []
    for f in PROVENANCE_TYPE:
        if f.name in t.column_names:
            arrays.append(cast_to(t.column(f.name).combine_chunks(), f.type, f"shard {f.name}"))
        else:
            arrays.append(pa.nulls(t.num_rows, f.type))
    st = pa.StructArray.from_arrays(arrays, fields=list(PROVENANCE_TYPE))
    if not as_json:
        return st
    import polars as pl

    return pl.from_arrow(st).struct.json_encode().to_arrow().cast(pa.string())  # type: ignore[union-attr]


def provenance_rows(index: RegenIndex, rows: np.ndarray) -> dict[int, dict[str, Any]]:
    """The ``dqa_regen`` object (JSON-ready) of each replaced row, from its final record."""
    import pyarrow.parquet as pq

    out: dict[int, dict[str, Any]] = {}
    if rows.size == 0:
        return out
    pos = np.searchsorted(index.rows, rows)
    groups: dict[tuple[int, int], pa.Table] = {}
    names = [f.name for f in PROVENANCE_TYPE]
    for k, r in zip(pos.tolist(), rows.tolist()):
        key = (int(index.file[k]), int(index.group[k]))
        if key not in groups:
            pf = pq.ParquetFile(index.files[key[0]])
            groups[key] = pf.read_row_group(key[1], columns=[c for c in names if c in pf.schema_arrow.names])
        rec = groups[key].slice(int(index.offset[k]), 1).to_pylist()[0]
        out[int(r)] = {f.name: (rec.get(f.name).isoformat() if f.name == "completed_at" and rec.get(f.name) is not None else rec.get(f.name))
                       for f in PROVENANCE_TYPE}
    return out
