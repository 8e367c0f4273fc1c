"""Merge regenerated samples back into a dataset: ``dqa merge DATASET --regen DIR --out NEW``.

What it writes
    ``NEW`` is a copy of DATASET in the same format and file layout (see
    ``dqa.audit.writers``) where every row that ``dqa regen`` completed (shard rows with
    status ``ok`` or ``length``) replaces its original:

    - the ids column gets the shard's ``input_ids`` (prompt + output);
    - the supervision column, in the input's convention and value type: ``loss_mask`` gets
      the shard's mask; ``labels`` gets the id where the mask is 1, else -100 (both are
      rewritten when the input has both);
    - an ``attention_mask`` column, when present, becomes all ones of the new length;
    - a token column stored as one ``[1, L]`` list per row (``list<list<int>>``, SpecForge's
      ``datasets`` cache) is written back in that layout, so NEW keeps the input's schema;
    - every other column is kept as it was (an ``id``, a ``messages`` column, ...);
    - a provenance column ``dqa_regen`` is added: a struct of ``endpoint``, ``model``,
      ``finish_reason``, ``status``, ``sampling`` (JSON text) and ``completed_at``
      (timestamp, UTC), null for rows that were not replaced. In JSONL it is the same
      object as JSON text, and the text ``null`` for untouched rows: JSONL readers infer a
      column's type from the first rows and reject a null column that later holds objects.
      Where the token columns are ``[1, L]`` lists it is the same JSON text (null for
      untouched rows): such a dataset is read as torch tensors (SpecForge calls
      ``set_format(type="torch")``), which cannot hold a timestamp.
      Merging a merged dataset keeps the earlier provenance of rows it does not replace.

    Rows keep their order. Rows that could not be regenerated — shard status ``failed``,
    or selected for the run (``run.json``'s selection) but absent from the shards — keep
    their original (``--failed keep``, the default) or are left out (``--failed drop``).

The report
    ``NEW.merge-report.json`` next to NEW (also when NEW is a folder: a file inside a
    dataset folder could be taken for data) lists each row that could not be regenerated
    with ``row``, ``id`` and ``reason``, plus the counts of ``MergeSummary``. It is staged
    with NEW and renamed into place right after it (an earlier report is removed before NEW
    is replaced), so a report never describes a NEW that is not there.

Safety
    The input is streamed in batches (memory: one batch plus the shard row groups that the
    current batch needs). Before replacing a row the merge checks that the shard's ``id``
    (when both have one) and its prompt tokens (``input_ids[:prompt_len]``) match the
    dataset row, so shards of another dataset are refused. NEW is built under a temporary
    name and renamed into place at the end: a crash leaves no NEW.

Errors
    ``InputError`` (exit 2): missing regen folder or shards, an unreadable or truncated
    shard, a shard row beyond the dataset, an id or prompt mismatch, NEW existing without
    ``force``, NEW being the input. ``RuntimeFailure`` (exit 3): a row present twice in the
    shards (the run broke its exactly-once promise; the merge will not pick one).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dqa.arrays import ranks as _ranks
from dqa.audit import formats
from dqa.audit.readers import IGNORE_INDEX, _is_int_list, flatten_token_lists, is_nested_list, nest_token_lists
from dqa.errors import InputError, RuntimeFailure

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
STATUSES = ("ok", "length", "failed")
_OK, _LENGTH, _FAILED = 0, 1, 2
REPORT_SUFFIX = ".merge-report.json"
CACHE_BYTES = 1 << 30  # shard row groups held at once, beyond those the current batch needs
_SHARD_DATA_COLUMNS = ("input_ids", "loss_mask", "prompt_len", "id") + tuple(f.name for f in PROVENANCE_TYPE)


@dataclass
class MergeSummary:
    """What a merge did. ``kept``/``dropped`` count rows that could not be regenerated."""

    dataset: str
    regen: list[str]
    output: str
    report: str
    format: str
    failed_policy: str
    rows_in: int = 0
    rows_out: int = 0
    replaced: int = 0
    truncated: int = 0
    unregenerated: int = 0
    kept: int = 0
    dropped: int = 0
    untouched: int = 0
    elapsed_s: float = 0.0
    selection: list[str] = field(default_factory=list)  # per regen folder: where the selected rows came from
    unregenerated_rows: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def as_dict(self, with_rows: bool = False) -> dict[str, Any]:
        d = asdict(self)
        rows = d.pop("unregenerated_rows")
        if with_rows:
            d["unregenerated_rows"] = rows
        return d


def report_path(out: Path) -> Path:
    """Where the merge report of output ``out`` goes: ``NEW.merge-report.json`` beside it."""
    return out.parent / (out.name + REPORT_SUFFIX)


# --- the regen shards -----------------------------------------------------------------------


@dataclass
class RegenIndex:
    """Where each regenerated row lives, sorted by dataset row.

    ``rows`` int64 (sorted, unique), ``status`` int8 (0 ok, 1 length, 2 failed), ``file`` /
    ``group`` / ``offset``: shard file index, row group and position inside it. ``ids`` and
    ``errors`` are string arrays aligned with ``rows`` (null when absent).
    """

    files: list[Path]
    rows: np.ndarray
    status: np.ndarray
    file: np.ndarray
    group: np.ndarray
    offset: np.ndarray
    ids: pa.Array
    errors: pa.Array
    selected: np.ndarray | None  # rows the runs meant to regenerate (sorted), when run.json says
    selection_notes: list[str] = field(default_factory=list)  # per folder: where the selection came from
    dataset_rows: int | None = None  # the row count of the dataset the runs read (run.json)

    @property
    def last_use(self) -> dict[tuple[int, int], int]:
        """For each (file, group) holding replacement rows: the largest dataset row it serves."""
        rep = self.status != _FAILED
        keys = self.file[rep].astype(np.int64) << 32 | self.group[rep].astype(np.int64)
        out: dict[tuple[int, int], int] = {}
        if keys.size:
            uniq, last = _group_max(keys, self.rows[rep])
            out = {(int(k >> 32), int(k & 0xFFFFFFFF)): int(r) for k, r in zip(uniq, last)}
        return out


def _group_max(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((values, keys))
    k, v = keys[order], values[order]
    ends = np.flatnonzero(np.append(k[1:] != k[:-1], True))
    return k[ends], v[ends]


def _shard_files(d: Path) -> list[Path]:
    if not d.exists():
        raise InputError(f"--regen {d}: no such folder")
    if not d.is_dir():
        raise InputError(f"--regen {d}: not a folder (expected the --out folder of dqa regen)")
    shards = d / "shards"
    if not shards.is_dir():
        raise InputError(f"--regen {d}: no shards/ folder (expected the --out folder of dqa regen)")
    return sorted(p for p in shards.glob("*.parquet") if not p.name.startswith("."))


@dataclass
class RunSelection:
    """What ``DIR/run.json`` says about the run: the rows it selected (None when they cannot be
    reconstructed, with ``note`` saying why) and the dataset row count it was made for."""

    rows: np.ndarray | None
    dataset_rows: int | None
    note: str


def _read_run_json(d: Path) -> dict[str, Any] | None:
    """``d/run.json`` as a dict; None when missing. Raises ``InputError`` when it is not a JSON object."""
    run = d / "run.json"
    if not run.is_file():
        return None
    try:
        cfg = json.loads(run.read_text())
    except (ValueError, OSError) as exc:
        raise InputError(f"{run}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{run}: not a JSON object")
    return cfg


def read_run_selection(d: Path) -> RunSelection:
    """Reconstruct the rows ``dqa regen`` selected in folder ``d`` from its ``run.json``.

    run.json records the findings file (an absolute path), ``--reasons``, ``--shard``,
    ``--limit`` and ``identity.selection.rows_sha256`` (``selection_digest`` of the selected
    rows before shard and limit); the selection is recomputed with
    ``dqa.regen.selection`` and accepted only when the digest matches (the findings file may
    have been rescanned since). Never raises for a missing or changed findings file: the
    result then has ``rows=None`` and a ``note``. Raises ``InputError`` when run.json exists
    but is not JSON.
    """
    run = d / "run.json"
    cfg = _read_run_json(d)
    if cfg is None:
        return RunSelection(None, None, f"{run}: missing; only failed shard rows are listed")
    ident = cfg.get("identity")
    sel = ident.get("selection") if isinstance(ident, dict) else None
    ds_rows = None
    if isinstance(ident, dict) and isinstance(ident.get("dataset"), dict):
        r = ident["dataset"].get("rows")
        ds_rows = int(r) if isinstance(r, int) else None
    if not isinstance(sel, dict) or ds_rows is None:
        return RunSelection(None, ds_rows, f"{run}: no selection recorded; only failed shard rows are listed")
    from dqa.regen.selection import narrow, parse_shard, selected_rows, selection_digest

    failed_only = bool(sel.get("failed_only", True))
    findings = Path(cfg["findings"]) if failed_only and cfg.get("findings") else None
    if failed_only:
        if findings is None:
            return RunSelection(None, ds_rows, f"{run}: no findings path recorded; only failed shard rows are listed")
        if not findings.exists():
            return RunSelection(None, ds_rows, f"{findings}: findings of the run not found; only failed shard rows are listed")
    try:
        everything = selected_rows(ds_rows, findings, failed_only, sel.get("reasons") or None)
        if sel.get("rows_sha256") and selection_digest(everything) != sel["rows_sha256"]:
            return RunSelection(None, ds_rows, f"{findings}: changed since the run (rescanned?); only failed shard rows are listed")
        rows = narrow(everything, parse_shard(sel.get("shard")), cfg.get("limit"))
    except InputError as exc:
        return RunSelection(None, ds_rows, f"selection of the run not reconstructed ({exc}); only failed shard rows are listed")
    return RunSelection(np.asarray(rows, dtype=np.int64), ds_rows, f"{run}: {rows.size} rows selected")


COLUMN_KEYS = ("ids", "mask", "labels", "id")


def run_columns(dirs: Iterable[Path]) -> dict[str, str | None]:
    """The column overrides given to ``dqa regen`` (run.json ``columns``: ``ids``, ``mask``,
    ``labels``, ``id``; None where none was given). Raises ``InputError`` when the folders'
    runs were given different ones."""
    found: dict[str, str | None] | None = None
    for d in dirs:
        cfg = _read_run_json(Path(d))
        cols = cfg.get("columns") if cfg else None
        mine = {k: (cols.get(k) if isinstance(cols, dict) else None) for k in COLUMN_KEYS}
        if found is not None and mine != found:
            raise InputError(f"--regen {d}: its run was given other column options ({mine}) than the other folders' ({found})")
        found = mine
    return found or dict.fromkeys(COLUMN_KEYS)


def load_regen_index(dirs: Iterable[Path]) -> RegenIndex:
    """Read the ``row``/``status``/``id``/``error`` columns of every shard under each ``DIR/shards``.

    Raises ``InputError`` for a missing folder, an unreadable or truncated shard, a shard
    lacking a required column, null or negative rows, or an unknown status; and
    ``RuntimeFailure`` when a row appears twice.
    """
    import pyarrow.parquet as pq

    files: list[Path] = []
    parts: dict[str, list[Any]] = {k: [] for k in ("rows", "status", "file", "group", "offset", "ids", "errors")}
    selections: list[np.ndarray] = []
    notes: list[str] = []
    dataset_rows: set[int] = set()
    for d in dirs:
        d = Path(d)
        shard_files = _shard_files(d)
        run = read_run_selection(d)
        notes.append(run.note)
        if run.rows is not None:
            selections.append(run.rows)
        if run.dataset_rows is not None:
            dataset_rows.add(run.dataset_rows)
        for p in shard_files:
            try:
                pf = pq.ParquetFile(p)
                names = set(pf.schema_arrow.names)
                for col in ("row", "status", "input_ids", "loss_mask"):
                    if col not in names:
                        raise InputError(f"{p}: regen shard lacks column {col!r} (see FORMATS.md)")
                st = pf.schema_arrow
                if not pa.types.is_integer(st.field("row").type):
                    raise InputError(f"{p}: column 'row' must be integers, found {st.field('row').type}")
                if not _is_int_list(st.field("input_ids").type):
                    raise InputError(f"{p}: column 'input_ids' must be a list of integers, found {st.field('input_ids').type}")
                if not _is_int_list(st.field("loss_mask").type, allow_bool=True):
                    raise InputError(f"{p}: column 'loss_mask' must be a list of 0/1, found {st.field('loss_mask').type}")
                cols = ["row", "status"] + [c for c in ("id", "error") if c in names]
                t = pf.read(columns=cols)
            except InputError:
                raise
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise InputError(f"{p}: unreadable or truncated regen shard ({' '.join(str(exc).split())[:160]})") from None
            fi = len(files)
            files.append(p)
            rows = t.column("row").combine_chunks()
            if rows.null_count:
                raise InputError(f"{p}: null in column 'row'")
            rows_np = rows.to_numpy().astype(np.int64)
            if rows_np.size and rows_np.min() < 0:
                raise InputError(f"{p}: negative row {int(rows_np.min())}")
            status = t.column("status").combine_chunks().cast(pa.string())
            code = np.full(len(rows_np), -1, dtype=np.int8)
            for i, name in enumerate(STATUSES):
                code[pc.fill_null(pc.equal(status, name), False).to_numpy(zero_copy_only=False)] = i
            if (code < 0).any():
                j = int(np.flatnonzero(code < 0)[0])
                raise InputError(f"{p}: row {int(rows_np[j])}: status {status[j].as_py()!r} (expected ok, length or failed)")
            sizes = np.array([pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)], dtype=np.int64)
            starts = np.concatenate(([0], np.cumsum(sizes)))
            pos = np.arange(len(rows_np), dtype=np.int64)
            grp = np.searchsorted(starts, pos, side="right") - 1
            parts["rows"].append(rows_np)
            parts["status"].append(code)
            parts["file"].append(np.full(len(rows_np), fi, dtype=np.int32))
            parts["group"].append(grp.astype(np.int32))
            parts["offset"].append(pos - starts[grp])
            parts["ids"].append(_as_strings(t.column("id")) if "id" in t.column_names else pa.nulls(len(rows_np), pa.string()))
            parts["errors"].append(_as_strings(t.column("error")) if "error" in t.column_names else pa.nulls(len(rows_np), pa.string()))
    rows = np.concatenate(parts["rows"]) if parts["rows"] else np.zeros(0, np.int64)
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    file_ = np.concatenate(parts["file"])[order] if parts["file"] else np.zeros(0, np.int32)
    dup = np.flatnonzero(rows[1:] == rows[:-1])
    if dup.size:
        j = int(dup[0])
        a, b = files[int(file_[j])], files[int(file_[j + 1])]
        where = a.name if a == b else f"{a} and {b}"
        raise RuntimeFailure(
            f"regen shards hold row {int(rows[j])} twice ({where}); refusing to pick one (the regen run broke exactly-once)"
        )
    take = pa.array(order)
    selected = np.unique(np.concatenate(selections)) if selections else None
    if len(dataset_rows) > 1:
        raise InputError(f"the --regen folders were made from datasets of different sizes ({sorted(dataset_rows)} rows)")
    return RegenIndex(
        files=files,
        rows=rows,
        status=np.concatenate(parts["status"])[order] if parts["status"] else np.zeros(0, np.int8),
        file=file_,
        group=np.concatenate(parts["group"])[order] if parts["group"] else np.zeros(0, np.int32),
        offset=np.concatenate(parts["offset"])[order] if parts["offset"] else np.zeros(0, np.int64),
        ids=pa.concat_arrays(parts["ids"]).take(take) if parts["ids"] else pa.nulls(0, pa.string()),
        errors=pa.concat_arrays(parts["errors"]).take(take) if parts["errors"] else pa.nulls(0, pa.string()),
        selected=selected,
        selection_notes=notes,
        dataset_rows=dataset_rows.pop() if dataset_rows else None,
    )


def _as_strings(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col if col.type == pa.string() else col.cast(pa.string())


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


# --- the replacement kernel ----------------------------------------------------------------------


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


def _cast_to(arr: pa.Array, typ: pa.DataType, column: str) -> pa.Array:
    try:
        return arr.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"column {column!r} of type {typ} cannot hold the regenerated rows ({' '.join(str(exc).split())[:120]})") from None


@dataclass
class _Replacement:
    """The shard data for the rows of one batch that get replaced, in row order."""

    local: np.ndarray  # positions in the batch
    table: pa.Table  # input_ids, loss_mask, provenance columns, ...


class Merger:
    """Stream a dataset and a ``RegenIndex`` into a merged dataset; see the module docstring."""

    def __init__(self, dataset: Any, index: RegenIndex, failed: str = "keep", check_prompts: bool = True,
                 cache_bytes: int = CACHE_BYTES):
        if failed not in ("keep", "drop"):
            raise InputError(f"--failed {failed}: expected keep or drop")
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
        return pa.string() if self.json_provenance else PROVENANCE_TYPE

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
                _as_strings(rb.column(self.id_col).take(pa.array(bad))) if self.id_col else pa.nulls(bad.size, pa.string())
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
        """``regeneration failed: <the shard's error>`` for the index positions ``sel``."""
        errs = self.index.errors.take(pa.array(sel, type=pa.int64()))
        text = pc.binary_join_element_wise("regeneration failed: ", errs, "")
        return pc.fill_null(text, "regeneration failed").to_numpy(zero_copy_only=False).astype(object)

    def _check_ids(self, rb: pa.RecordBatch, local: np.ndarray, shard_ids: pa.Array, rows: np.ndarray, lo: int) -> None:
        mine = _as_strings(rb.column(self.id_col).take(pa.array(local)))
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
        if "prompt_len" not in t.column_names:
            return
        plen = t.column("prompt_len").chunk(0)
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
        prov = self._provenance(rb, rep, keep)
        arrays, fields = [], []
        for f in rb.schema:
            col = rb.column(f.name)
            if f.name == PROVENANCE_COLUMN:
                col, f = prov, pa.field(PROVENANCE_COLUMN, prov.type)
            elif f.name in replaced:
                col = pa.concat_arrays([col, _cast_to(replaced[f.name], f.type, f.name)]).take(take_arr)
            elif keep_arr is not None:
                col = col.filter(keep_arr)
            arrays.append(col)
            fields.append(f)
        if PROVENANCE_COLUMN not in rb.schema.names:
            arrays.append(prov)
            fields.append(pa.field(PROVENANCE_COLUMN, prov.type))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=rb.schema.metadata))

    def _provenance(self, rb: pa.RecordBatch, rep: _Replacement | None, keep: np.ndarray | None) -> pa.Array:
        n = rb.num_rows
        existing = rb.column(PROVENANCE_COLUMN) if PROVENANCE_COLUMN in rb.schema.names else None
        typ = self.provenance_type
        if existing is not None and existing.type != typ:
            try:
                existing = existing.cast(typ)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise InputError(
                    f"column {PROVENANCE_COLUMN!r} exists in the dataset with type {existing.type}; expected {typ}"
                ) from None
        if existing is None:
            existing = pa.repeat(pa.scalar("null"), n) if self.untyped else pa.nulls(n, typ)
        if rep is None:
            return existing if keep is None else existing.filter(pa.array(keep))
        new = self._provenance_of(rep.table)
        take = np.arange(n, dtype=np.int64)
        take[rep.local] = n + np.arange(rep.local.size)
        if keep is not None:
            take = take[keep]
        return pa.concat_arrays([existing, new]).take(pa.array(take))

    def _provenance_of(self, t: pa.Table) -> pa.Array:
        arrays = []
        for f in PROVENANCE_TYPE:
            if f.name in t.column_names:
                arrays.append(_cast_to(t.column(f.name).combine_chunks(), f.type, f"shard {f.name}"))
            else:
                arrays.append(pa.nulls(t.num_rows, f.type))
        st = pa.StructArray.from_arrays(arrays, fields=list(PROVENANCE_TYPE))
        if not self.json_provenance:
            return st
        import polars as pl

        return pl.from_arrow(st).struct.json_encode().to_arrow().cast(pa.string())  # type: ignore[union-attr]

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


def merge(
    dataset: str | Path,
    regen_dirs: list[str | Path],
    out: str | Path,
    failed: str = "keep",
    force: bool = False,
    batch_rows: int = 2048,
    check_prompts: bool = True,
    ids_column: str | None = None,
    mask_column: str | None = None,
    labels_column: str | None = None,
    id_column: str | None = None,
    on_batch: Callable[[int], None] | None = None,
    on_start: Callable[[int | None], None] | None = None,
    cache_bytes: int = CACHE_BYTES,
) -> MergeSummary:
    """Merge the regen shards of ``regen_dirs`` into a copy of ``dataset`` at ``out``.

    Returns a ``MergeSummary`` (also written, with the unregenerated rows, to
    ``report_path(out)``). Raises ``InputError`` / ``RuntimeFailure`` as described in the
    module docstring; on any error ``out`` is not created.
    """
    from dqa.audit.readers import open_dataset
    from dqa.audit.writers import DatasetWriter, check_output_path

    t0 = time.perf_counter()
    out = Path(out)
    regen = [Path(d) for d in regen_dirs]
    if not regen:
        raise InputError("give --regen DIR (the --out folder of dqa regen)")
    cols = (ids_column, mask_column, labels_column, id_column)
    if not any(cols):  # none given here: the ones given to dqa regen, so both read the same columns
        cols = tuple(run_columns(regen)[k] for k in COLUMN_KEYS)
    ds = open_dataset(dataset, *cols)
    check_output_path(ds, out, force)
    for d in regen:
        shards = (d / "shards").resolve()
        if shards == out.resolve() or shards in out.resolve().parents:
            raise InputError(f"--out {out}: inside the regen shards folder {shards}; choose another place")
    index = load_regen_index(regen)
    total = ds.num_rows
    if total is not None:
        _check_rows_in_range(index, total, ds.path)
    merger = Merger(ds, index, failed, check_prompts, cache_bytes)
    summary = MergeSummary(
        dataset=str(ds.path), regen=[str(d) for d in regen], output=str(out), report=str(report_path(out)),
        format=ds.format, failed_policy=failed,
    )
    if on_start:
        on_start(total)
    with DatasetWriter(ds, out, merger.output_schema, force=force) as writer:
        rows_in = merger.run(batch_rows, writer, on_batch)
        _check_rows_in_range(index, rows_in, ds.path)
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


def _check_rows_in_range(index: RegenIndex, total: int, path: Path) -> None:
    if index.dataset_rows is not None and index.dataset_rows != total:
        raise InputError(
            f"regen run.json: the run read a dataset of {index.dataset_rows} rows but {path} has {total} "
            "(regen output of another dataset?)"
        )
    if index.rows.size and index.rows[-1] >= total:
        shard = index.files[int(index.file[-1])]
        raise InputError(
            f"{shard}: row {int(index.rows[-1])} is beyond the dataset {path} ({total} rows; regen output of another dataset?)"
        )
    if index.selected is not None and index.selected.size and index.selected[-1] >= total:
        raise InputError(f"regen run.json selects row {int(index.selected[-1])} but the dataset {path} has {total} rows")


def _unregen_list(m: Merger) -> list[dict[str, Any]]:
    if not m.unregen_rows:
        return []
    rows = np.concatenate(m.unregen_rows).tolist()
    reasons = np.concatenate(m.unregen_reasons).tolist()
    ids = pa.concat_arrays(m.unregen_ids).to_pylist()
    return [{"row": r, "id": i, "reason": why} for r, i, why in zip(rows, ids, reasons)]
