"""The tokenized merge: stream a token-column dataset and swap in the regenerated rows.

``merge_tokens`` streams the input in batches through a ``Merger``: per batch it checks the input
(null lists, negative ids, mask or label values ``dqa scan`` refuses), gathers the shard rows that
replace some of the batch's rows (``_GroupCache``: a shard row group is decoded once and kept
until its last row has passed), checks their ids and prompt tokens against the dataset row,
rebuilds them in the input's ``Convention`` and swaps them in with one Arrow ``take`` per column,
writing on a second thread behind the merging.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dqa.arrays import ranks as _ranks
from dqa.audit import formats
from dqa.audit.token_columns import IGNORE_INDEX, flatten_token_lists, is_nested_list, nest_token_lists
from dqa.errors import InputError
from dqa.regen.merge.columns import as_strings, cast_to
from dqa.regen.merge.convention import Convention, rebuild_in_convention, run_convention
from dqa.regen.merge.index import RegenIndex, check_rows_in_range
from dqa.regen.merge.options import CACHE_BYTES, MergeOptions
from dqa.regen.merge.provenance import PROVENANCE_COLUMN, PROVENANCE_TYPE, merged_provenance, provenance_type
from dqa.regen.merge.report import MergeSummary, report_path
from dqa.regen.store.shards import ShardStatus

_LENGTH, _FAILED = ShardStatus.LENGTH.code, ShardStatus.FAILED.code
_SHARD_DATA_COLUMNS = ("input_ids", "loss_mask", "prompt_len", "kept_len", "id") + tuple(f.name for f in PROVENANCE_TYPE)


class _GroupCache:
    """Decoded shard row groups: kept until the last dataset row they serve has passed, and
    otherwise bounded by ``budget`` bytes (least recently used first; re-read if needed again)."""

    def __init__(self, index: RegenIndex, budget: int = CACHE_BYTES):
        import pyarrow.parquet as pq

        self.index = index
        self.budget = budget
        self.last_use = index.last_use
        self._files: dict[int, Any] = {}
        self._pq = pq
        self._tables: OrderedDict[tuple[int, int], pa.Table] = OrderedDict()
        self.reads = 0

    def get(self, key: tuple[int, int]) -> pa.Table:
        t = self._tables.get(key)
        if t is not None:
            self._tables.move_to_end(key)
            return t
        fi, g = key
        path = self.index.files[fi]
        try:
            pf = self._files.get(fi) or self._pq.ParquetFile(path)
            self._files[fi] = pf
            names = set(pf.schema_arrow.names)
            t = pf.read_row_group(g, columns=[c for c in _SHARD_DATA_COLUMNS if c in names])
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InputError(f"{path}: unreadable or truncated regen shard ({' '.join(str(exc).split())[:160]})") from None
        self.reads += 1
        self._tables[key] = t
        return t

    def release(self, passed_row: int) -> None:
        """Drop groups whose rows all lie before ``passed_row``; then shrink to the budget (oldest use first)."""
        for key in [k for k in self._tables if self.last_use.get(k, -1) < passed_row]:
            del self._tables[key]
        total = sum(t.nbytes for t in self._tables.values())
        for key in list(self._tables):
            if total <= self.budget:
                break
            total -= self._tables.pop(key).nbytes
            self._files.pop(key[0], None)


def _flat(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Values (numpy) and absolute offsets (int64, ``len == n + 1``) of a list array."""
    offs = np.asarray(arr.offsets, dtype=np.int64)
    vals = arr.values
    return (vals.to_numpy(zero_copy_only=False) if len(vals) else np.zeros(0, np.int64)), offs


def _refuse_bad_values(arr: pa.Array, where: Callable[[int], str], col: str, kind: str) -> None:
    """Raise ``InputError`` naming ``where(row)`` and ``col`` for a null list, a null inside a list,
    a negative token id (``kind`` ids), a mask value outside 0/1 (mask) or a negative label other
    than -100 (labels): what ``dqa scan`` refuses, checked with whole-array kernels."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        r = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"{where(r)}: column {col!r}: null list (expected a list of integers)")
    vals = pc.list_flatten(arr)
    if len(vals) == 0 or pa.types.is_boolean(vals.type) or not pa.types.is_integer(vals.type):
        bad = None if vals.null_count == 0 else vals.is_null()
    elif kind == "mask":
        bad = pc.or_kleene(pc.less(vals, 0), pc.greater(vals, 1))
    elif kind == "labels":
        bad = pc.and_kleene(pc.less(vals, 0), pc.not_equal(vals, -100))
    else:
        bad = pc.less(vals, 0)
    if bad is None or not pc.any(pc.fill_null(bad, True)).as_py():
        return
    pos = int(np.flatnonzero(pc.fill_null(bad, True).to_numpy(zero_copy_only=False))[0])
    row = int(pc.list_parent_indices(arr)[pos].as_py())
    value = vals[pos].as_py()
    if value is None:
        what = "null inside the list (expected integers)"
    elif kind == "ids":
        what = f"negative token id {value}"
    else:
        what = f"value {value} (expected {'0 or 1' if kind == 'mask' else '-100 or a token id'})"
    raise InputError(f"{where(row)}: column {col!r}: {what}")


def _list_array(values: np.ndarray, offsets: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A list array of ``typ`` from flat ``values`` and absolute ``offsets`` into them."""
    lo, hi = int(offsets[0]), int(offsets[-1])
    vals = pa.array(values[lo:hi])
    offs = pa.array(offsets - lo, type=pa.int64() if pa.types.is_large_list(typ) else pa.int32())
    cls = pa.LargeListArray if pa.types.is_large_list(typ) else pa.ListArray
    return cls.from_arrays(offs, vals).cast(typ)


@dataclass
class _Replacement:
    """The shard data for the rows of one batch that get replaced, in row order."""

    local: np.ndarray  # positions in the batch
    table: pa.Table  # input_ids, loss_mask, provenance columns, ...


class Merger:
    """Stream a dataset and a ``RegenIndex`` into a merged dataset; see the module docstring."""

    def __init__(self, dataset: Any, index: RegenIndex, failed: str = "keep", check_prompts: bool = True,
                 cache_bytes: int = CACHE_BYTES, fmt: Any = None, convention: Convention | None = None):
        if failed not in ("keep", "drop"):
            raise InputError(f"--failed {failed}: expected keep or drop")
        self.fmt = fmt  # the run's chat format: with ``convention``, replaced rows are rebuilt in the input's masking
        self.convention = convention
        self.ds = dataset
        self.index = index
        self.drop = failed == "drop"
        self.check_prompts = check_prompts
        self.cache = _GroupCache(index, cache_bytes)
        cols = dataset.columns
        names = set(dataset.schema.names)
        self.ids_col = cols.ids
        self.mask_cols = [c for c in dict.fromkeys([cols.mask, "loss_mask" if cols.mask is None else None]) if c and c in names]
        self.label_cols = [c for c in dict.fromkeys([cols.labels, "labels" if cols.labels is None else None]) if c and c in names]
        self.attention_col = "attention_mask" if "attention_mask" in names else None
        self.token_cols = [self.ids_col, *self.mask_cols, *self.label_cols] + ([self.attention_col] if self.attention_col else [])
        # Provenance as JSON text where a struct cannot go: JSONL (no stored types), and a dataset whose
        # token columns hold [1, L] tensors (SpecForge's cache: set_format("torch") cannot tensorize a timestamp).
        self.tensor_layout = any(is_nested_list(dataset.schema.field(c).type) for c in self.token_cols)
        self.untyped = not formats.get(dataset.format).typed
        self.json_provenance = self.untyped or self.tensor_layout
        self.id_col = cols.id
        self.unregen_rows: list[np.ndarray] = []
        self.unregen_reasons: list[np.ndarray] = []
        self.unregen_ids: list[pa.Array] = []
        self.replaced = self.truncated = self.dropped = self.kept = 0

    # provenance column type in the output
    @property
    def provenance_type(self) -> pa.DataType:
        return provenance_type(self.json_provenance)

    def output_schema(self, stored: pa.Schema) -> pa.Schema:
        """The output schema of an input file with stored schema ``stored``."""
        if PROVENANCE_COLUMN in stored.names:
            return stored
        return stored.append(pa.field(PROVENANCE_COLUMN, self.provenance_type))

    def merge_batch(self, start: int, rb: pa.RecordBatch) -> pa.RecordBatch:
        """The merged version of ``rb`` (dataset rows ``start .. start + len``), token columns flat
        (``run`` unwraps ``[1, L]`` columns before and wraps them back after)."""
        n = rb.num_rows
        idx = self.index
        lo, hi = np.searchsorted(idx.rows, [start, start + n])
        rows = idx.rows[lo:hi]
        status = idx.status[lo:hi]
        local = rows - start
        if hi > lo and self.id_col is not None:
            self._check_ids(rb, local, idx.ids.slice(lo, hi - lo), rows, lo)
        rep_sel = np.flatnonzero(status != _FAILED)
        failed_sel = np.flatnonzero(status == _FAILED)
        rep = self._fetch(lo + rep_sel, local[rep_sel]) if rep_sel.size else None
        if rep is not None and self.check_prompts:
            self._check_prompt(rb, rep, start)
        if rep is not None and self.fmt is not None and self.convention is not None:
            rep = self._in_convention(rep)

        # rows that could not be regenerated: failed in the shards, or selected and absent
        bad_local = [local[failed_sel]]
        bad_reason = [self._failed_reasons(lo + failed_sel)]
        if idx.selected is not None:
            s_lo, s_hi = np.searchsorted(idx.selected, [start, start + n])
            missing = np.setdiff1d(idx.selected[s_lo:s_hi], rows, assume_unique=True) - start
            if missing.size:
                bad_local.append(missing)
                bad_reason.append(np.full(missing.size, "selected for regeneration but absent from the shards", dtype=object))
        bad = np.concatenate(bad_local)
        if bad.size:
            order = np.argsort(bad, kind="stable")
            bad = bad[order]
            self.unregen_rows.append(bad + start)
            self.unregen_reasons.append(np.concatenate(bad_reason)[order])
            self.unregen_ids.append(
                as_strings(rb.column(self.id_col).take(pa.array(bad))) if self.id_col else pa.nulls(bad.size, pa.string())
            )
            if self.drop:
                self.dropped += bad.size
            else:
                self.kept += bad.size

        keep = None
        if self.drop and bad.size:
            keep = np.ones(n, dtype=bool)
            keep[bad] = False
        out = self._assemble(rb, rep, keep)
        if rep is not None:
            self.replaced += rep.local.size
            self.truncated += int(np.count_nonzero(status[rep_sel] == _LENGTH))
        self.cache.release(start + n)
        return out

    def _in_convention(self, rep: _Replacement) -> _Replacement:
        """The replacement rows with ``input_ids``/``loss_mask`` rebuilt by ``rebuild_in_convention``."""
        t = rep.table
        ids = t.column("input_ids").chunk(0)
        vals, offs = _flat(ids)
        vals, offs, mask = rebuild_in_convention(vals[offs[0]:offs[-1]], offs - offs[0], self.fmt, self.convention)
        new_ids = _list_array(vals, offs, ids.type)
        new_mask = _list_array(mask, offs, t.column("loss_mask").type)
        t = t.set_column(t.column_names.index("input_ids"), "input_ids", new_ids)
        t = t.set_column(t.column_names.index("loss_mask"), "loss_mask", new_mask)
        return _Replacement(local=rep.local, table=t.combine_chunks())

    def _check_input(self, src: Path, start: int, rb: pa.RecordBatch) -> None:
        """Refuse null lists or values, negative ids, and mask/label values scan would refuse."""
        def where(r: int) -> str:
            return f"{src}: row {start + r}"

        _refuse_bad_values(rb.column(self.ids_col), where, self.ids_col, "ids")
        for c in self.mask_cols:
            _refuse_bad_values(rb.column(c), where, c, "mask")
        for c in self.label_cols:
            _refuse_bad_values(rb.column(c), where, c, "labels")

    def _failed_reasons(self, sel: np.ndarray) -> np.ndarray:
        """Why the conversations at index positions ``sel`` were not regenerated (``load_regen_index``:
        ``regeneration failed: <the shard's error>``, a length cut not accepted, a conversation not finished)."""
        errs = self.index.errors.take(pa.array(sel, type=pa.int64()))
        return pc.fill_null(errs, "regeneration failed").to_numpy(zero_copy_only=False).astype(object)

    def _check_ids(self, rb: pa.RecordBatch, local: np.ndarray, shard_ids: pa.Array, rows: np.ndarray, lo: int) -> None:
        mine = as_strings(rb.column(self.id_col).take(pa.array(local)))
        differ = pc.fill_null(pc.not_equal(mine, shard_ids), False).to_numpy(zero_copy_only=False)
        if differ.any():
            j = int(np.flatnonzero(differ)[0])
            shard = self.index.files[int(self.index.file[lo + j])]
            raise InputError(
                f"{shard}: row {int(rows[j])} has id {shard_ids[j].as_py()!r} but dataset row {int(rows[j])} has id "
                f"{mine[j].as_py()!r} (regen output of another dataset?)"
            )

    def _fetch(self, sel: np.ndarray, local: np.ndarray) -> _Replacement:
        """Gather the shard rows ``sel`` (positions in the index) in row order, grouped by row group."""
        idx = self.index
        keys = idx.file[sel].astype(np.int64) << 32 | idx.group[sel].astype(np.int64)
        uniq, inverse = np.unique(keys, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        pieces = []
        for u, k in enumerate(uniq):
            members = order[np.searchsorted(inverse[order], u): np.searchsorted(inverse[order], u, side="right")]
            t = self.cache.get((int(k >> 32), int(k & 0xFFFFFFFF)))
            pieces.append(t.take(pa.array(idx.offset[sel[members]])))
        if len(pieces) == 1:  # the usual case: one row group serves the batch, already in row order
            table = pieces[0].combine_chunks()
        else:
            back = np.empty(order.size, dtype=np.int64)
            back[order] = np.arange(order.size)
            table = pa.concat_tables(pieces, promote_options="permissive").take(pa.array(back)).combine_chunks()
        self._validate(table, sel)
        return _Replacement(local=local, table=table)

    def _validate(self, t: pa.Table, sel: np.ndarray) -> None:
        idx = self.index

        def where(j: int) -> str:
            return f"{idx.files[int(idx.file[sel[j]])]}: row {int(idx.rows[sel[j]])}"

        ids = t.column("input_ids").chunk(0) if t.num_rows else None
        mask = t.column("loss_mask").chunk(0) if t.num_rows else None
        if ids is None:
            return
        for name, arr in (("input_ids", ids), ("loss_mask", mask)):
            if arr.null_count:
                j = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                raise InputError(f"{where(j)}: null {name} in a row with status ok/length")
        _refuse_bad_values(ids, where, "input_ids", "ids")
        il = pc.list_value_length(ids).to_numpy()
        ml = pc.list_value_length(mask).to_numpy()
        if (il != ml).any():
            j = int(np.flatnonzero(il != ml)[0])
            raise InputError(f"{where(j)}: input_ids has {int(il[j])} tokens but loss_mask {int(ml[j])}")
        mv, moff = _flat(mask)
        mv = mv[moff[0]:moff[-1]].astype(np.int64)
        if mv.size and (mv.min() < 0 or mv.max() > 1):
            pos = int(np.flatnonzero((mv < 0) | (mv > 1))[0])
            j = int(np.searchsorted(moff - moff[0], pos, side="right") - 1)
            raise InputError(f"{where(j)}: loss_mask value {int(mv[pos])} (expected 0 or 1)")

    def _check_prompt(self, rb: pa.RecordBatch, rep: _Replacement, start: int) -> None:
        """Refuse a replacement whose prompt tokens are not the dataset row's first ``prompt_len`` tokens."""
        t = rep.table
        # Multi-turn: only the tokens before the first regenerated turn come from the row unchanged.
        name = "kept_len" if "kept_len" in t.column_names else "prompt_len"
        if name not in t.column_names:
            return
        plen = t.column(name).chunk(0)
        known = ~plen.is_null().to_numpy(zero_copy_only=False)
        p = pc.fill_null(plen, 0).to_numpy().astype(np.int64)
        orig = rb.column(self.ids_col)
        ov, ooff = _flat(orig)
        nv, noff = _flat(t.column("input_ids").chunk(0))
        olen = ooff[rep.local + 1] - ooff[rep.local]
        nlen = noff[1:] - noff[:-1]
        bad_len = known & ((p > olen) | (p > nlen) | (p < 0))
        if bad_len.any():
            j = int(np.flatnonzero(bad_len)[0])
            raise InputError(
                f"{self._where(rep, j, start)}: prompt_len {int(p[j])} exceeds the dataset row ({int(olen[j])} tokens) "
                "or the regenerated sample (regen output of another dataset?)"
            )
        p = np.where(known, p, 0)
        r = _ranks(p)
        a = ov[np.repeat(ooff[rep.local], p) + r]
        b = nv[np.repeat(noff[:-1], p) + r]
        diff = a != b
        if diff.any():
            pos = int(np.flatnonzero(diff)[0])
            j = int(np.searchsorted(np.cumsum(p), pos, side="right"))
            raise InputError(
                f"{self._where(rep, j, start)}: the regenerated prompt differs from the dataset row's tokens "
                "(regen output of another dataset, or the dataset changed since the run)"
            )

    def _where(self, rep: _Replacement, j: int, start: int) -> str:
        row = int(rep.local[j]) + start
        k = int(np.searchsorted(self.index.rows, row))
        return f"{self.index.files[int(self.index.file[k])]}: row {row}"

    def _assemble(self, rb: pa.RecordBatch, rep: _Replacement | None, keep: np.ndarray | None) -> pa.RecordBatch:
        """Columns of ``rb`` with the replacement rows swapped in (one ``take`` per replaced column),
        rows not in ``keep`` left out, and the provenance column last (or in its existing place)."""
        n = rb.num_rows
        replaced: dict[str, pa.Array] = {}
        take_arr = None
        if rep is not None:
            take = np.arange(n, dtype=np.int64)
            take[rep.local] = n + np.arange(rep.local.size)
            take_arr = pa.array(take if keep is None else take[keep])
            new_ids = rep.table.column("input_ids").chunk(0)
            new_mask = rep.table.column("loss_mask").chunk(0)
            iv, ioff = _flat(new_ids)
            replaced[self.ids_col] = new_ids
            for c in self.mask_cols:
                replaced[c] = new_mask
            if self.label_cols:
                mv, moff = _flat(new_mask)
                sup = mv[moff[0]:moff[-1]].astype(np.int64) == 1
                vals = np.where(sup, iv[ioff[0]:ioff[-1]].astype(np.int64), IGNORE_INDEX)
                labels = _list_array(vals, ioff - ioff[0], pa.list_(pa.int64()))
                for c in self.label_cols:
                    replaced[c] = labels
            if self.attention_col:
                ones = np.ones(int(ioff[-1] - ioff[0]), np.int8)
                replaced[self.attention_col] = _list_array(ones, ioff - ioff[0], pa.list_(pa.int8()))
        keep_arr = pa.array(keep) if keep is not None else None
        shard, local = (rep.table, rep.local) if rep is not None else (None, None)
        prov = merged_provenance(rb, shard, local, keep, self.json_provenance, self.untyped)
        arrays, fields = [], []
        for f in rb.schema:
            col = rb.column(f.name)
            if f.name == PROVENANCE_COLUMN:
                col, f = prov, pa.field(PROVENANCE_COLUMN, prov.type)
            elif f.name in replaced:
                col = pa.concat_arrays([col, cast_to(replaced[f.name], f.type, f.name)]).take(take_arr)
            elif keep_arr is not None:
                col = col.filter(keep_arr)
            arrays.append(col)
            fields.append(f)
        if PROVENANCE_COLUMN not in rb.schema.names:
            arrays.append(prov)
            fields.append(pa.field(PROVENANCE_COLUMN, prov.type))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=rb.schema.metadata))

    def run(self, batch_rows: int, writer: Any, on_batch: Callable[[int], None] | None = None) -> int:
        """Stream the dataset through ``merge_batch`` into ``writer``; return the number of input rows.

        Writing (compression, disk) happens on a second thread, at most two merged batches
        behind, so it overlaps the reading and merging of the next batch. A failure on either
        side stops both and is raised here.
        """
        import queue
        import threading

        pending: queue.Queue = queue.Queue(maxsize=2)
        failure: list[BaseException] = []

        def write_behind() -> None:
            while True:
                item = pending.get()
                if item is None:
                    return
                if not failure:
                    try:
                        writer.write(*item)
                    except BaseException as exc:  # handed to the merging thread
                        failure.append(exc)

        thread = threading.Thread(target=write_behind, name="dqa-merge-writer", daemon=True)
        thread.start()
        start = 0
        try:
            for src, rb in self.ds.record_batches(batch_rows):
                if failure:
                    break
                if rb.num_rows == 0:
                    continue
                flat, nested = flatten_token_lists(rb, self.token_cols, src, start)
                self._check_input(src, start, flat)
                pending.put((src, nest_token_lists(self.merge_batch(start, flat), nested)))
                start += rb.num_rows
                if on_batch:
                    on_batch(rb.num_rows)
        finally:
            pending.put(None)
            thread.join()
        if failure:
            raise failure[0]
        return start


def merge_tokens(ds: Any, regen: list[Path], out: Path, index: RegenIndex, options: MergeOptions, t0: float) -> MergeSummary:
    """``merge`` for a dataset of token columns (``ds``, opened by ``merge``; ``options.accept``
    already checked): NEW in the input's format and layout, with the replaced rows rebuilt in the
    input's convention and the report beside it. Returns the ``MergeSummary``; raises
    ``InputError`` / ``RuntimeFailure`` as ``merge`` describes, and NEW is then not created."""
    from dqa.audit.writers import DatasetWriter

    failed, accept = options.failed, options.accept
    total = ds.num_rows
    if total is not None:
        check_rows_in_range(index, total, ds.path)
    fmt, convention = run_convention(regen, ds)
    merger = Merger(ds, index, failed, options.check_prompts, options.cache_bytes, fmt, convention)
    summary = MergeSummary(
        dataset=str(ds.path), regen=[str(d) for d in regen], output=str(out), report=str(report_path(out)),
        format=ds.format, failed_policy=failed, accept=",".join(accept),
        convention=convention.describe() if convention is not None else None,
    )
    if options.on_start:
        options.on_start(total)
    with DatasetWriter(ds, out, merger.output_schema, force=options.force) as writer:
        rows_in = merger.run(options.batch_rows, writer, options.on_batch)
        check_rows_in_range(index, rows_in, ds.path)
        summary.rows_in = rows_in
        summary.rows_out = writer.rows_written
        summary.replaced = merger.replaced
        summary.truncated = merger.truncated
        summary.kept = merger.kept
        summary.dropped = merger.dropped
        summary.unregenerated = merger.kept + merger.dropped
        summary.untouched = rows_in - merger.replaced - summary.unregenerated
        summary.unregenerated_rows = _unregen_list(merger)
        summary.selection = index.selection_notes
        summary.elapsed_s = round(time.perf_counter() - t0, 3)
        report = json.dumps(summary.as_dict(with_rows=True), indent=2, default=str) + "\n"
        writer.commit(companions={report_path(out): report.encode()})
    return summary


def _unregen_list(m: Merger) -> list[dict[str, Any]]:
    if not m.unregen_rows:
        return []
    rows = np.concatenate(m.unregen_rows).tolist()
    reasons = np.concatenate(m.unregen_reasons).tolist()
    ids = pa.concat_arrays(m.unregen_ids).to_pylist()
    return [{"row": r, "id": i, "reason": why} for r, i, why in zip(rows, ids, reasons)]
