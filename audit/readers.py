"""Read tokenized datasets as a stream of flat token batches.

Formats: a parquet file or a folder of parquet shards, a folder written by HF
datasets' ``save_to_disk`` (Arrow stream files listed in ``state.json``), an
Arrow IPC file (file or stream format), or JSONL. Columns: ``input_ids`` plus
either ``loss_mask`` (0/1, any int or bool type) or ``labels`` (-100 for
unsupervised), and an optional ``id``.

``open_dataset`` inspects schemas only; ``Dataset.batches`` streams
``TokenBatch`` objects whose token lists are flattened into numpy arrays with
row offsets, so the kernels never loop over rows. Memory is bounded by the
batch. Every malformed input raises ``InputError`` naming the file, the
column and (where it applies) the 0-based dataset row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from dqa.arrays import ranks as _ranks, segment_sum as _segment_sum
from dqa.errors import InputError

IDS_DEFAULT = "input_ids"
MASK_DEFAULT = "loss_mask"
LABELS_DEFAULT = "labels"
ID_DEFAULT = "id"
IGNORE_INDEX = -100
MAX_BATCH_TOKENS = 8_000_000

PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


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


class Dataset:
    """A tokenized dataset on disk: its format, files, columns and row count.

    Create with ``open_dataset``. Iterate with ``batches`` (flat token batches
    for the checks) or ``record_batches`` (all columns, for rewriting).
    """

    def __init__(self, path: Path, fmt: str, files: list[Path], columns: Columns, schema: pa.Schema):
        self.path = path
        self.format = fmt
        self.files = files
        self.columns = columns
        self.schema = schema

    @property
    def name(self) -> str:
        """A short name for output folders (see ``dataset_name``)."""
        return dataset_name(self.path)

    @property
    def num_rows(self) -> int | None:
        """Total rows when the format records it cheaply (parquet, Arrow file, HF); None for JSONL."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return sum(pq.ParquetFile(f).metadata.num_rows for f in self.files)
        if self.format in ("arrow-file",):
            total = 0
            for f in self.files:
                with pa.memory_map(str(f)) as src:
                    reader = pa.ipc.open_file(src)
                    total += sum(reader.get_record_batch(i).num_rows for i in range(reader.num_record_batches))
            return total
        return None

    def _needed(self) -> list[str]:
        cols = [self.columns.ids, self.columns.supervision]
        if self.columns.id:
            cols.append(self.columns.id)
        return cols

    def record_batches(self, batch_rows: int = 8192, columns: list[str] | None = None) -> Iterator[tuple[Path, pa.RecordBatch]]:
        """Yield ``(file, record_batch)`` in dataset order with ``columns`` (default: all).

        Raises ``InputError`` for unreadable or truncated files and malformed JSONL lines.
        """
        for f in self.files:
            yield from ((f, b) for b in _iter_file(f, self.format, batch_rows, columns))

    def batches(self, batch_rows: int = 4096, max_tokens: int = MAX_BATCH_TOKENS) -> Iterator[TokenBatch]:
        """Yield flattened ``TokenBatch`` objects in dataset order; validates as it goes.

        A batch holds at most ``batch_rows`` rows and, unless a single row is longer,
        at most ``max_tokens`` tokens, so memory stays bounded whatever the row lengths.

        Raises ``InputError`` naming file, column and row for nulls, non-integer
        values, masks outside {0, 1}, or labels that are neither -100 nor ids.
        """
        start = 0
        cols = self._needed()
        for f, rb in self.record_batches(batch_rows, cols):
            if rb.num_rows == 0:
                continue
            _check_schema(rb.schema, self.columns, f, self.columns.convention)
            for piece in _token_slices(rb, self.columns.ids, max_tokens):
                yield _to_token_batch(piece, self.columns, f, start)
                start += piece.num_rows

    def batches_with_rows(self, rows: Iterable[int], batch_rows: int = 4096) -> Iterator[TokenBatch]:
        """Yield token batches that together hold every dataset row in ``rows`` (and maybe others).

        Parquet reads only the row groups holding those rows (located from the file footers);
        other formats stream from the start and stop after the last wanted row.
        """
        want = np.unique(np.fromiter(rows, dtype=np.int64))
        if want.size == 0:
            return
        if self.format != "parquet":
            for batch in self.batches(batch_rows):
                yield batch
                if batch.start_row + batch.num_rows > want[-1]:
                    return
            return
        import pyarrow.parquet as pq

        start = 0
        for f in self.files:
            pf = pq.ParquetFile(f)
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if np.any((want >= start) & (want < start + n)):
                    try:
                        rb = pf.read_row_group(g, columns=self._needed())
                    except (pa.ArrowException, OSError) as exc:
                        raise InputError(f"{f}: unreadable parquet file ({_short(exc)})") from None
                    for piece in rb.to_batches():
                        yield _to_token_batch(piece, self.columns, f, start)
                        start += piece.num_rows
                else:
                    start += n


def dataset_name(path: str | Path) -> str:
    """A short name for a dataset's output folders: the folder name, or the file name without
    its known format suffix (``train.v2.parquet`` -> ``train.v2``, ``d.jsonl.gz`` -> ``d``)."""
    p = Path(path)
    name = p.name
    suffixes = (*PARQUET_SUFFIXES, *ARROW_SUFFIXES, *JSONL_SUFFIXES, ".gz", ".zst")
    while not p.is_dir():  # strip known suffixes from the end, one at a time (".jsonl.gz")
        match = next((x for x in suffixes if name.lower().endswith(x) and len(name) > len(x)), None)
        if match is None:
            break
        name = name[: -len(match)]
    return name or "dataset"


def open_dataset(
    path: str | Path,
    ids_column: str | None = None,
    mask_column: str | None = None,
    labels_column: str | None = None,
    id_column: str | None = None,
) -> Dataset:
    """Detect the format and the column convention of the dataset at ``path``.

    Returns a ``Dataset``. Raises ``InputError`` when the path is missing or
    empty, the format is unknown, a file is unreadable, the token or
    supervision column is absent or of the wrong type, or shards disagree on
    the convention.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    fmt, files = _detect(path)
    schemas = [_read_schema(f, fmt) for f in files]
    columns = _choose_columns(schemas[0], files[0], ids_column, mask_column, labels_column, id_column)
    for f, s in zip(files, schemas):
        _check_schema(s, columns, f, columns.convention)
    return Dataset(path, fmt, files, columns, schemas[0])


# --- detection ---------------------------------------------------------------------------


def _detect(path: Path) -> tuple[str, list[Path]]:
    if path.is_file():
        name = path.name.lower()
        if name.endswith(PARQUET_SUFFIXES):
            return "parquet", [path]
        if name.endswith(ARROW_SUFFIXES):
            return _arrow_kind(path), [path]
        if name.endswith(JSONL_SUFFIXES):
            return "jsonl", [path]
        raise InputError(f"{path}: unknown format (expected .parquet, .arrow/.feather, .jsonl, or a folder)")
    # A folder: HF save_to_disk, or parquet / arrow / jsonl shards.
    if (path / "dataset_dict.json").is_file():
        try:
            splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        except (ValueError, AttributeError, OSError) as exc:
            raise InputError(f"{path / 'dataset_dict.json'}: not a datasets DatasetDict file ({exc})") from None
        raise InputError(f"{path}: a DatasetDict; point dqa at one split folder ({', '.join(map(str, splits)) or 'none listed'})")
    if (path / "state.json").is_file():
        try:
            state = json.loads((path / "state.json").read_text())
            files = [path / d["filename"] for d in state["_data_files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{path / 'state.json'}: not a datasets save_to_disk state file ({exc})") from None
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise InputError(f"{missing[0]}: listed in state.json but missing")
        return "hf", files
    for suffixes, kind in ((PARQUET_SUFFIXES, "parquet"), (ARROW_SUFFIXES, None), (JSONL_SUFFIXES, "jsonl")):
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(suffixes) and not p.name.startswith("."))
        if files:
            return (kind or _arrow_kind(files[0])), files
    raise InputError(f"{path}: folder holds no .parquet, .arrow or .jsonl files")


def _arrow_kind(f: Path) -> str:
    try:
        with open(f, "rb") as fh:
            magic = fh.read(6)
    except OSError as exc:
        raise InputError(f"{f}: cannot read ({exc.strerror})") from None
    return "arrow-file" if magic == b"ARROW1" else "arrow-stream"


def file_schema(f: Path, fmt: str) -> pa.Schema | None:
    """The stored schema of one file (with its metadata); None for JSONL, which has none stored.

    Raises pyarrow or OS errors for unreadable files (``_read_schema`` turns them into ``InputError``).
    """
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(f).schema_arrow
    if fmt == "arrow-file":
        with pa.memory_map(str(f)) as src:
            return pa.ipc.open_file(src).schema
    if fmt in ("arrow-stream", "hf"):
        with pa.memory_map(str(f)) as src:
            return pa.ipc.open_stream(src).schema
    return None


def _read_schema(f: Path, fmt: str) -> pa.Schema:
    try:
        return file_schema(f, fmt) or _jsonl_schema(f)
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{f}: unreadable {fmt} file ({_short(exc)})") from None


def _jsonl_schema(f: Path) -> pa.Schema:
    for _, rb in zip(range(1), _iter_jsonl(f, 64, None)):
        return rb.schema
    raise InputError(f"{f}: empty JSONL file (no rows)")


def _choose_columns(
    schema: pa.Schema, f: Path, ids: str | None, mask: str | None, labels: str | None, id_col: str | None
) -> Columns:
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


def _is_int_list(t: pa.DataType, allow_bool: bool = False) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        return False
    v = t.value_type
    return pa.types.is_integer(v) or (allow_bool and pa.types.is_boolean(v)) or pa.types.is_null(v)


def _check_schema(schema: pa.Schema, columns: Columns, f: Path, convention: str) -> None:
    names = set(schema.names)
    sup = columns.supervision
    if sup not in names:
        other = LABELS_DEFAULT if columns.mask else MASK_DEFAULT
        hint = f" (it has {other!r}: shards mix conventions)" if other in names else ""
        raise InputError(f"{f}: no column {sup!r}{hint}; every shard must use the {convention} convention")
    if columns.ids not in names:
        raise InputError(f"{f}: no column {columns.ids!r}")
    t = schema.field(columns.ids).type
    if not _is_int_list(t):
        raise InputError(f"{f}: column {columns.ids!r} must be a list of integer token ids, found {t}")
    t = schema.field(sup).type
    if not _is_int_list(t, allow_bool=columns.mask is not None):
        kind = "0/1 integers or booleans" if columns.mask else "integers (-100 = unsupervised)"
        raise InputError(f"{f}: column {sup!r} must be a list of {kind}, found {t}")


# --- reading -----------------------------------------------------------------------------


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _iter_file(f: Path, fmt: str, batch_rows: int, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(f)
            yield from pf.iter_batches(batch_size=batch_rows, columns=columns, use_threads=True)
        elif fmt == "arrow-file":
            with pa.memory_map(str(f)) as src:
                reader = pa.ipc.open_file(src)
                for i in range(reader.num_record_batches):
                    yield from _split(_select(reader.get_record_batch(i), columns), batch_rows)
        elif fmt in ("arrow-stream", "hf"):
            with pa.memory_map(str(f)) as src:
                for rb in pa.ipc.open_stream(src):
                    yield from _split(_select(rb, columns), batch_rows)
        else:
            yield from _iter_jsonl(f, batch_rows, columns)
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{f}: unreadable {fmt} file ({_short(exc)})") from None


def _select(rb: pa.RecordBatch, columns: list[str] | None) -> pa.RecordBatch:
    return rb if columns is None else rb.select(columns)


def _split(rb: pa.RecordBatch, batch_rows: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, rb.num_rows, batch_rows):
        yield rb.slice(start, batch_rows)


def _iter_jsonl(f: Path, batch_rows: int, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    """Parse JSONL with pyarrow's block reader; on a parse error, find the offending line for the message."""
    import pyarrow.json as pj

    try:
        reader = pj.open_json(f, read_options=pj.ReadOptions(block_size=1 << 24))
        for rb in reader:
            yield from _split(_select(rb, columns), batch_rows)
    except (pa.ArrowInvalid, ValueError) as exc:
        line = _first_bad_jsonl_line(f)
        where = f"line {line}: " if line else ""
        raise InputError(f"{f}: {where}malformed JSONL ({_short(exc)})") from None


def _first_bad_jsonl_line(f: Path) -> int | None:
    """1-based number of the first line that is not one JSON object (error path only)."""
    with open(f, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                return n
            if not isinstance(obj, dict):
                return n
    return None


def _list_parts(arr: pa.Array, f: Path, col: str, start_row: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat values (numpy) and row offsets (int64, starting at 0) of a list array; rejects nulls."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    if arr.null_count:
        row = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"{f}: column {col!r}, row {start_row + row}: null list (expected a list of token ids)")
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0])
    offsets = offsets - offsets[0]
    if values.null_count:
        pos = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        row = int(np.searchsorted(offsets, pos, side="right") - 1)
        raise InputError(f"{f}: column {col!r}, row {start_row + row}: null inside the list (expected integers)")
    if pa.types.is_null(values.type):
        return np.zeros(0, dtype=np.int64), offsets
    return values.to_numpy(zero_copy_only=False), offsets


def _row_of(offsets: np.ndarray, pos: int) -> int:
    return int(np.searchsorted(offsets, pos, side="right") - 1)


def _to_token_batch(rb: pa.RecordBatch, columns: Columns, f: Path, start_row: int) -> TokenBatch:
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


def _token_slices(rb: pa.RecordBatch, ids_column: str, max_tokens: int) -> Iterator[pa.RecordBatch]:
    """Cut ``rb`` into consecutive slices of at most ``max_tokens`` tokens (a longer row stands alone)."""
    import pyarrow.compute as pc

    col = rb.column(ids_column)
    lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
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
