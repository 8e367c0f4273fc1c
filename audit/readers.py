"""Read tokenized datasets as a stream of flat token batches.

Formats (``dqa.audit.formats``; each file is recognised by its content, not its name): a parquet
file, an Arrow IPC file or stream (such as a Hugging Face ``datasets`` cache file, e.g.
SpecForge's tokenized ``CACHE_DIR/KEY.pkl``), JSONL, conversation JSONL (rendered with a chat
format at read time: ``Dataset.set_chat_format``, see ``dqa.audit.format_conversations``); or a folder: one written by HF datasets'
``save_to_disk`` (Arrow stream files listed in ``state.json``), or a folder of shards of one
format (see ``_detect_folder``). Columns: ``input_ids`` plus either ``loss_mask`` (0/1, any int
or bool type) or ``labels`` (-100 for unsupervised), and an optional ``id``. A token column may
also hold one ``[1, L]`` list of lists per row (``list<list<int>>``, as SpecForge's
preprocessing stores its ``[1, L]`` tensors): it is read as the flat ``L`` tokens.

``open_dataset`` inspects schemas only; ``Dataset.batches`` streams ``TokenBatch`` objects whose
token lists are flattened into numpy arrays with row offsets, so the kernels never loop over
rows. Memory is bounded by the batch. Every malformed input raises ``InputError`` naming the
file, the column and (where it applies) the 0-based dataset row.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from dqa.arrays import ranks as _ranks, segment_sum as _segment_sum
from dqa.audit import formats
from dqa.audit.formats.base import FileFormat, short
from dqa.errors import InputError

IDS_DEFAULT = "input_ids"
MASK_DEFAULT = "loss_mask"
LABELS_DEFAULT = "labels"
ID_DEFAULT = "id"
ATTENTION_DEFAULT = "attention_mask"
IGNORE_INDEX = -100
MAX_BATCH_TOKENS = 8_000_000

PARQUET_SUFFIXES = formats.suffixes("parquet")
ARROW_SUFFIXES = formats.suffixes("arrow")
JSONL_SUFFIXES = formats.suffixes("jsonl")


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


@dataclass(frozen=True)
class WorkUnit:
    """A piece of a dataset that one process can scan on its own (``Dataset.work_units``): rows
    ``[start_row, start_row + rows)`` of dataset order, all in ``Dataset.files[file]``; parquet row
    groups ``row_groups`` of that file, or the whole file (None)."""

    file: int
    start_row: int
    rows: int
    row_groups: tuple[int, ...] | None = None


class Dataset:
    """A tokenized dataset on disk: its format, files, columns and row count.

    Create with ``open_dataset``. Iterate with ``batches`` (flat token batches
    for the checks) or ``record_batches`` (all columns as stored, for rewriting).
    """

    def __init__(self, path: Path, fmt: str, files: list[Path], columns: Columns, schema: pa.Schema):
        self.path = path
        self.format = fmt
        self.files = files
        self.columns = columns
        self.schema = schema
        self.renderer = None  # conversation JSONL: a format_conversations.Renderer (set_chat_format)

    def set_chat_format(self, chat_format, last_turn_only: bool = False) -> "Dataset":
        """Give conversation JSONL the chat format it is rendered and masked with (every assistant turn
        trained, or with ``last_turn_only`` the last); returns ``self``. Other formats ignore the format;
        ``last_turn_only`` on them is an ``InputError`` (their mask is stored). Raises ``InputError`` for
        a format without a chat template to render with."""
        if self.format == "conversations":
            from dqa.audit.formats.conversations import Renderer

            self.renderer = Renderer(chat_format, last_turn_only)
        elif last_turn_only:
            raise InputError(f"{self.path}: --last-turn-only applies to conversation JSONL; this {self.format} dataset stores its own mask")
        return self

    @property
    def name(self) -> str:
        """A short name for output folders (see ``dataset_name``)."""
        return dataset_name(self.path)

    @property
    def num_rows(self) -> int | None:
        """Total rows when the format records it cheaply (parquet, Arrow file); None for streams and JSONL."""
        fmt = formats.get(self.format)
        counts = []
        for f in self.files:
            n = fmt.num_rows(f)
            if n is None:
                return None
            counts.append(n)
        return sum(counts)

    def _needed(self) -> list[str]:
        cols = [self.columns.ids, self.columns.supervision]
        if self.columns.id:
            cols.append(self.columns.id)
        return cols

    @property
    def token_columns(self) -> list[str]:
        """The columns holding per-token lists: ids, supervision, and ``loss_mask`` / ``labels`` /
        ``attention_mask`` where present (the ones a ``[1, L]`` layout is flattened in)."""
        names = set(self.schema.names)
        cols = [self.columns.ids, self.columns.supervision, MASK_DEFAULT, LABELS_DEFAULT, ATTENTION_DEFAULT]
        return [c for c in dict.fromkeys(cols) if c in names]

    def record_batches(self, batch_rows: int = 8192, columns: list[str] | None = None) -> Iterator[tuple[Path, pa.RecordBatch]]:
        """Yield ``(file, record_batch)`` in dataset order with ``columns`` (default: all), as stored
        (a ``[1, L]`` token column stays ``list<list<int>>``; see ``flatten_token_lists``).

        Raises ``InputError`` for unreadable or truncated files and malformed JSONL lines.
        """
        for f in self.files:
            yield from ((f, b) for b in _iter_file(f, self.format, batch_rows, columns, self.renderer))

    def batches(self, batch_rows: int = 4096, max_tokens: int = MAX_BATCH_TOKENS) -> Iterator[TokenBatch]:
        """Yield flattened ``TokenBatch`` objects in dataset order; validates as it goes.

        A batch holds at most ``batch_rows`` rows and, unless a single row is longer,
        at most ``max_tokens`` tokens, so memory stays bounded whatever the row lengths.

        Raises ``InputError`` naming file, column and row for nulls, non-integer
        values, masks outside {0, 1}, labels that are neither -100 nor ids, or a
        nested token list that is not of shape ``[1, L]``.
        """
        yield from self._token_batches(self.record_batches(batch_rows, self._needed()), 0, max_tokens)

    def _token_batches(self, records: Iterator[tuple[Path, pa.RecordBatch]], start: int, max_tokens: int) -> Iterator[TokenBatch]:
        """Flatten and check ``records`` (in dataset order, the first at dataset row ``start``) into ``TokenBatch``es."""
        tokens = [self.columns.ids, self.columns.supervision]
        for f, rb in records:
            if rb.num_rows == 0:
                continue
            rb, _ = flatten_token_lists(rb, tokens, f, start)
            _check_schema(rb.schema, self.columns, f, self.columns.convention)
            for piece in _token_slices(rb, self.columns.ids, max_tokens):
                yield _to_token_batch(piece, self.columns, f, start)
                start += piece.num_rows

    def work_units(self, min_rows: int) -> list[WorkUnit] | None:
        """The dataset cut into pieces that separate processes can scan (``unit_batches``), in dataset order:
        parquet files by runs of whole row groups of at least ``min_rows`` rows (a file's last run may be
        shorter), other files whose row count the format records (Arrow files) one unit each. None when a
        file's row count is not known without reading it all (Arrow streams, JSONL, conversations): then the
        dataset is read as one stream. Reads file footers only."""
        fmt = formats.get(self.format)
        if self.format == "conversations":
            return None
        units: list[WorkUnit] = []
        start = 0
        for k, f in enumerate(self.files):
            if fmt.row_groups:
                import pyarrow.parquet as pq

                try:
                    meta = pq.ParquetFile(f).metadata
                except (pa.ArrowException, OSError) as exc:
                    raise InputError(f"{f}: unreadable parquet file ({_short(exc)})") from None
                sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], dtype=np.int64)
                # Runs of row groups: a new run starts where the rows since the last start reach min_rows.
                group = 0
                while group < sizes.size:  # one iteration per unit, not per row
                    cum = np.cumsum(sizes[group:])
                    end = group + min(int(np.searchsorted(cum, max(min_rows, 1), side="left")) + 1, sizes.size - group)
                    n = int(sizes[group:end].sum())
                    if n:
                        units.append(WorkUnit(k, start, n, tuple(range(group, end))))
                    start += n
                    group = end
                continue
            n = fmt.num_rows(f)
            if n is None:
                return None
            if n:
                units.append(WorkUnit(k, start, n))
            start += n
        return units

    def unit_batches(self, unit: WorkUnit, batch_rows: int = 4096, max_tokens: int = MAX_BATCH_TOKENS) -> Iterator[TokenBatch]:
        """``batches`` of one ``WorkUnit`` only: the same rows, checks and errors (rows named in dataset order)."""
        f = self.files[unit.file]
        cols = self._needed()
        if unit.row_groups is None:
            records = ((f, b) for b in _iter_file(f, self.format, batch_rows, cols, self.renderer))
        else:
            records = ((f, b) for b in _iter_row_groups(f, unit.row_groups, batch_rows, cols))
        yield from self._token_batches(records, unit.start_row, max_tokens)

    def batches_with_rows(self, rows: Iterable[int], batch_rows: int = 4096) -> Iterator[TokenBatch]:
        """Yield token batches that together hold every dataset row in ``rows`` (and maybe others).

        Parquet reads only the row groups holding those rows (located from the file footers);
        other formats stream from the start and stop after the last wanted row.
        """
        want = np.unique(np.fromiter(rows, dtype=np.int64))
        if want.size == 0:
            return
        if not formats.get(self.format).row_groups:
            for batch in self.batches(batch_rows):
                yield batch
                if batch.start_row + batch.num_rows > want[-1]:
                    return
            return
        import pyarrow.parquet as pq

        start = 0
        tokens = [self.columns.ids, self.columns.supervision]
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
                        piece, _ = flatten_token_lists(piece, tokens, f, start)
                        yield _to_token_batch(piece, self.columns, f, start)
                        start += piece.num_rows
                else:
                    start += n


def dataset_name(path: str | Path) -> str:
    """A short name for a dataset's output folders: the folder name, or the file name without
    its known format suffix (``train.v2.parquet`` -> ``train.v2``, ``d.jsonl.gz`` -> ``d``)."""
    p = Path(path)
    name = p.name
    suffixes = (*formats.suffixes(), ".gz", ".zst")
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
    chat_format=None,
    last_turn_only: bool = False,
) -> Dataset:
    """Detect the format and the column convention of the dataset at ``path``.

    ``chat_format`` (a ``ChatFormat``) and ``last_turn_only``: for conversation JSONL, see
    ``Dataset.set_chat_format`` (it can also be given later, before reading).

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
        _check_schema(s, columns, f, columns.convention, nested=True)
    ds = Dataset(path, fmt, files, columns, schemas[0])
    if chat_format is not None or last_turn_only:
        ds.set_chat_format(chat_format, last_turn_only)
    return ds


# --- detection ---------------------------------------------------------------------------


def _detect(path: Path) -> tuple[str, list[Path]]:
    """The format name and the data files (in dataset order) of the dataset at ``path``."""
    if path.is_file():
        return formats.detect_file(path).name, [path]
    # A folder: HF save_to_disk, or shards of one format.
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
    return _detect_folder(path)


def _detect_folder(path: Path) -> tuple[str, list[Path]]:
    """The shards of a folder (files under it, at any depth, in sorted path order; names starting
    with ``.`` are skipped).

    A file named with a dataset suffix (``.parquet``, ``.arrow``, ``.jsonl``, ...) is a shard, of
    the format its content shows (``formats.detect_file``: an empty or unrecognisable one is an
    error, never skipped). A file with another name is a shard when its magic bytes show parquet
    or Arrow IPC, and is otherwise left alone (a README, a licence, a ``.pt`` file). The first
    family present is read: parquet, then Arrow, then JSONL.

    Arrow streams are read as ``datasets`` wrote them: indices files (``.filter``/``.select``
    output, one ``indices`` column) are skipped, and streams with another name (SpecForge's
    ``KEY.pkl``, or ``KEY_00000_of_00008.pkl`` ... from ``num_proc`` processes) must be the shards
    of one cache, all of them present.
    """
    by_family: dict[str, list[tuple[Path, FileFormat, bool]]] = {}
    broken: dict[str, InputError] = {}  # per family: the first file named like it that is not
    for p in sorted(q for q in path.rglob("*") if q.is_file() and not q.name.startswith(".")):
        claimed = formats.family_of_name(p.name)
        if claimed is None:
            fmt = formats.sniff_magic(p)
        else:
            try:
                fmt = formats.detect_file(p)
            except InputError as exc:
                broken.setdefault(claimed, exc)
                continue
        if fmt is not None:
            by_family.setdefault(fmt.family, []).append((p, fmt, claimed is not None))
    for family in ("parquet", "arrow", "jsonl"):
        if family in broken:
            raise broken[family]
        found = by_family.get(family)
        if not found:
            continue
        if family == "arrow":
            found = _arrow_shards(path, found)
            if not found:
                break
        kinds = {fmt.name for _, fmt, _ in found}
        if family == "jsonl" and len(kinds) > 1:
            a = next(p for p, fmt, _ in found if fmt.name == "jsonl")
            b = next(p for p, fmt, _ in found if fmt.name == "conversations")
            raise InputError(f"{path}: mixes tokenized JSONL ({a.name}) and conversation JSONL ({b.name}); keep one kind per folder")
        if len(kinds) > 1:
            a = next(p for p, fmt, _ in found if fmt.name == "arrow-file")
            b = next(p for p, fmt, _ in found if fmt.name == "arrow-stream")
            raise InputError(f"{path}: mixes Arrow IPC files ({a.name}) and streams ({b.name}); keep one format per folder")
        return found[0][1].name, [p for p, _, _ in found]
    raise InputError(f"{path}: folder holds no dataset files (expected {formats.EXPECTED})")


def _arrow_shards(path: Path, found: list[tuple[Path, FileFormat, bool]]) -> list[tuple[Path, FileFormat, bool]]:
    """The Arrow files of a folder without ``datasets`` indices files; refuses several caches in one folder."""
    from dqa.audit.formats.arrow import cache_name, is_indices_file

    kept = []
    for p, fmt, named in found:
        if fmt.name == "arrow-stream" and is_indices_file(_read_schema(p, fmt.name)):
            continue
        kept.append((p, fmt, named))
    caches: dict[tuple[Path, str, int], set[int]] = {}
    for p, fmt, named in kept:
        if fmt.name == "arrow-stream" and not named:
            base, rank, count = cache_name(p)
            caches.setdefault((p.parent, base, count), set()).add(rank)
    if len(caches) > 1:
        names = ", ".join(sorted(str((d / b).relative_to(path)) for d, b, _ in caches))
        raise InputError(
            f"{path}: holds more than one datasets cache ({names}); point dqa at one cache file, "
            "or at a folder holding one cache's files"
        )
    for (d, base, count), ranks in caches.items():
        missing = sorted(set(range(count)) - ranks)
        if missing:
            stem, ext = os.path.splitext(base)  # as datasets splits the cache_file_name
            miss = f"{stem}_{missing[0]:05d}_of_{count:05d}{ext}"
            raise InputError(f"{d / miss}: missing ({len(ranks)} of the {count} files of datasets cache {base} are there)")
    return kept


def file_schema(f: Path, fmt: str) -> pa.Schema | None:
    """The stored schema of one file (with its metadata); None for JSONL, which has none stored.

    Raises pyarrow or OS errors for unreadable files (``_read_schema`` turns them into ``InputError``).
    """
    ff = formats.get(fmt)
    return ff.schema(f) if ff.typed else None


def _read_schema(f: Path, fmt: str) -> pa.Schema:
    try:
        return formats.get(fmt).schema(f)  # type: ignore[return-value]  # every format yields one (JSONL: inferred)
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{f}: unreadable {fmt} file ({_short(exc)})") from None


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


def _check_schema(schema: pa.Schema, columns: Columns, f: Path, convention: str, nested: bool = False) -> None:
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


# --- reading -----------------------------------------------------------------------------


def _short(exc: BaseException) -> str:
    return short(exc)


def _iter_file(f: Path, fmt: str, batch_rows: int, columns: list[str] | None, renderer=None) -> Iterator[pa.RecordBatch]:
    try:
        if fmt == "conversations":
            yield from formats.get(fmt).batches(f, batch_rows, columns, renderer)  # type: ignore[call-arg]
            return
        yield from formats.get(fmt).batches(f, batch_rows, columns)
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{f}: unreadable {fmt} file ({_short(exc)})") from None


def _iter_row_groups(f: Path, groups: Sequence[int], batch_rows: int, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    """The record batches of some row groups of the parquet file ``f`` (memory-mapped, as ``Parquet.batches``)."""
    import pyarrow.parquet as pq

    try:
        yield from pq.ParquetFile(f, memory_map=True).iter_batches(batch_size=batch_rows, row_groups=list(groups),
                                                                   columns=columns, use_threads=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{f}: unreadable parquet file ({_short(exc)})") from None


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
