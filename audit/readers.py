"""Read tokenized datasets as a stream of flat token batches.

Formats (``dqa.audit.formats``; each file is recognised by its content, not its name): a parquet
file, an Arrow IPC file or stream (such as a Hugging Face ``datasets`` cache file, e.g.
SpecForge's tokenized ``CACHE_DIR/KEY.pkl``), JSONL, conversation JSONL (rendered with a chat
format at read time: ``Dataset.set_chat_format``, see ``dqa.audit.formats.conversations``); or
a folder: one written by HF datasets' ``save_to_disk`` (Arrow stream files listed in
``state.json``), or a folder of shards of one format (``dqa.audit.dataset_files``). Columns
(``dqa.audit.token_columns``): ``input_ids`` plus either ``loss_mask`` (0/1, any int or bool
type) or ``labels`` (-100 for unsupervised), and an optional ``id``. A token column may also
hold one ``[1, L]`` list of lists per row (``list<list<int>>``, as SpecForge's preprocessing
stores its ``[1, L]`` tensors): it is read as the flat ``L`` tokens.

``open_dataset`` inspects schemas only; ``Dataset.batches`` streams ``TokenBatch`` objects
(``dqa.audit.token_batch``) whose token lists are flattened into numpy arrays with row offsets,
so the kernels never loop over rows. Memory is bounded by the batch. Every malformed input
raises ``InputError`` naming the file, the column and (where it applies) the 0-based dataset
row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from dqa.arrays import sorted_unique
from dqa.audit import formats
from dqa.audit.dataset_files import detect_files, read_schema
from dqa.audit.formats.base import unreadable
from dqa.audit.formats.parquet import parquet_file
from dqa.audit.token_batch import TokenBatch, to_token_batch, token_slices
from dqa.audit.token_columns import (
    ATTENTION_DEFAULT, LABELS_DEFAULT, MASK_DEFAULT, Columns, check_schema, choose_columns, flatten_token_lists,
)
from dqa.errors import InputError
from dqa.storage import is_url, location

MAX_BATCH_TOKENS = 8_000_000
SEEK_ROWS = 128  # rows per batch when reading a few rows out of a row group (``Dataset.batches_with_rows``)

PARQUET_SUFFIXES = formats.suffixes("parquet")
ARROW_SUFFIXES = formats.suffixes("arrow")
JSONL_SUFFIXES = formats.suffixes("jsonl")


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
            check_schema(rb.schema, self.columns, f, self.columns.convention)
            for piece in token_slices(rb, self.columns.ids, max_tokens):
                yield to_token_batch(piece, self.columns, f, start)
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
                try:
                    meta = parquet_file(f).metadata
                except (pa.ArrowException, OSError) as exc:
                    raise unreadable(f, "parquet file", exc) from None
                sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], dtype=np.int64)
                cum = np.cumsum(sizes)  # rows through each row group
                # Runs of row groups: a new run starts where the rows since the last start reach min_rows.
                group = before = 0  # the run's first row group, and the file's rows before it
                while group < sizes.size:  # one iteration per unit, not per row
                    end = min(int(np.searchsorted(cum, before + max(min_rows, 1), side="left")) + 1, sizes.size)
                    n = int(cum[end - 1]) - before
                    if n:
                        units.append(WorkUnit(k, start, n, tuple(range(group, end))))
                    start += n
                    before += n
                    group = end
                continue
            n = fmt.num_rows(f)
            if n is None:
                return None
            if n:
                units.append(WorkUnit(k, start, n))
            start += n
        return units

    def unit_batches(self, unit: WorkUnit, batch_rows: int = 4096, max_tokens: int = MAX_BATCH_TOKENS,
                     threads: bool = True) -> Iterator[TokenBatch]:
        """``batches`` of one ``WorkUnit`` only: the same rows, checks and errors (rows named in dataset order).
        ``threads=False`` decodes parquet in the calling thread (a pool worker, one of as many as there are cores)."""
        f = self.files[unit.file]
        cols = self._needed()
        if unit.row_groups is None:
            records = ((f, b) for b in _iter_file(f, self.format, batch_rows, cols, self.renderer))
        else:
            records = ((f, b) for b in _iter_row_groups(f, unit.row_groups, batch_rows, cols, threads))
        yield from self._token_batches(records, unit.start_row, max_tokens)

    def batches_with_rows(self, rows: Iterable[int], batch_rows: int = 4096) -> Iterator[TokenBatch]:
        """Yield token batches that together hold every dataset row in ``rows`` (and maybe others).

        Parquet reads only the row groups holding those rows (located from the file footers), memory-mapped, in
        batches of ``SEEK_ROWS`` up to the group's last wanted row, and yields one single-row batch per wanted row
        (decoding a whole row group for one row faulted ~10x the fresh pages and took ~2x the time of stopping
        early, measured on 2,048-row groups; flattening a whole group for a few rows cost more than reading it);
        other formats stream from the start and stop after the last wanted row.
        """
        want = sorted_unique(np.fromiter(rows, dtype=np.int64))
        if want.size == 0:
            return
        if not formats.get(self.format).row_groups:
            for batch in self.batches(batch_rows):
                yield batch
                if batch.start_row + batch.num_rows > want[-1]:
                    return
            return

        start = 0
        tokens = [self.columns.ids, self.columns.supervision]
        for f in self.files:
            pf = parquet_file(f, memory_map=True)
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                here = want[(want >= start) & (want < start + n)]  # a few rows, not the group's
                seen = start
                try:
                    batches = pf.iter_batches(SEEK_ROWS, row_groups=[g], columns=self._needed(), use_threads=False)
                    while here.size:
                        rb = next(batches, None)
                        if rb is None:
                            raise InputError(f"{f}: row group {g} holds fewer rows than its footer says ({n})")
                        for row in here[here < seen + rb.num_rows]:
                            piece, _ = flatten_token_lists(rb.slice(int(row) - seen, 1), tokens, f, int(row))
                            yield to_token_batch(piece, self.columns, f, int(row))
                        here = here[here >= seen + rb.num_rows]
                        seen += rb.num_rows
                except (pa.ArrowException, OSError) as exc:
                    raise unreadable(f, "parquet file", exc) from None
                start += n


def dataset_name(path: str | Path) -> str:
    """A short name for a dataset's output folders: the folder name, or the file name without
    its known format suffix (``train.v2.parquet`` -> ``train.v2``, ``d.jsonl.gz`` -> ``d``)."""
    p = location(path)
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
    path = location(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder" + (" in the store" if is_url(path) else ""))
    fmt, files = detect_files(path)
    schemas = [read_schema(f, fmt) for f in files]
    columns = choose_columns(schemas[0], files[0], ids_column, mask_column, labels_column, id_column)
    for f, s in zip(files, schemas):
        check_schema(s, columns, f, columns.convention, nested=True)
    ds = Dataset(path, fmt, files, columns, schemas[0])
    if chat_format is not None or last_turn_only:
        ds.set_chat_format(chat_format, last_turn_only)
    return ds


# --- reading -----------------------------------------------------------------------------


def _iter_file(f: Path, fmt: str, batch_rows: int, columns: list[str] | None, renderer=None) -> Iterator[pa.RecordBatch]:
    try:
        if fmt == "conversations":
            yield from formats.get(fmt).batches(f, batch_rows, columns, renderer)  # type: ignore[call-arg]
            return
        yield from formats.get(fmt).batches(f, batch_rows, columns)
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise unreadable(f, f"{fmt} file", exc) from None


def _iter_row_groups(f: Path, groups: Sequence[int], batch_rows: int, columns: list[str] | None,
                     threads: bool = True) -> Iterator[pa.RecordBatch]:
    """The record batches of some row groups of the parquet file ``f`` (memory-mapped, as ``Parquet.batches``),
    decoded by Arrow's threads or (``threads=False``) in the calling one."""
    try:
        yield from parquet_file(f, memory_map=True).iter_batches(batch_size=batch_rows, row_groups=list(groups),
                                                                   columns=columns, use_threads=threads)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise unreadable(f, "parquet file", exc) from None
