"""What every dataset file format shares: ``FileFormat`` (the base class each format module fills
in), ``Sink`` (an open output file), and the small helpers the format modules use on record
batches (``select``, ``split``) and on error messages (``short``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol

import pyarrow as pa


class Sink(Protocol):
    """An open output file of one format: ``write`` record batches, then ``close``."""

    def write(self, batch: pa.RecordBatch) -> None: ...

    def close(self) -> None: ...


class FileFormat:
    """One on-disk format. Subclasses (one per module) fill in the class attributes and methods."""

    name: str = ""  # recorded in summaries: parquet, arrow-file, arrow-stream, jsonl (hf: a folder of arrow-stream)
    family: str = ""  # the suffix family an output file of this format is named with: parquet, arrow, jsonl
    suffixes: tuple[str, ...] = ()
    label: str = ""  # for messages: "parquet", "an Arrow IPC file", ...
    typed: bool = True  # stores an Arrow schema (False for JSONL: types are inferred from the rows)
    row_groups: bool = False  # rows can be read by row group (parquet), located from the footer

    def sniff(self, head: bytes, tail: bytes) -> bool:
        """Whether a file starting with ``head`` and ending with ``tail`` is of this format."""
        return False

    def schema(self, f: Path) -> pa.Schema | None:
        """The stored schema of ``f`` (with its metadata); None when the format stores none."""
        raise NotImplementedError

    def batches(self, f: Path, batch_rows: int, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        """Record batches of ``f`` in file order, at most ``batch_rows`` rows each, with ``columns`` (all when None)."""
        raise NotImplementedError

    def num_rows(self, f: Path) -> int | None:
        """Rows of ``f`` when the format records them cheaply; None otherwise."""
        return None

    def sink(self, path: Path, schema: pa.Schema | None, compression: str | None = None) -> Sink:
        """Open ``path`` for writing record batches of ``schema`` in this format, compressed with ``compression``
        (a parquet codec; for Arrow IPC a buffer codec, ``lz4`` or ``zstd``; None: the format's default)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<format {self.name}>"


def select(rb: pa.RecordBatch, columns: list[str] | None) -> pa.RecordBatch:
    return rb if columns is None else rb.select(columns)


def split(rb: pa.RecordBatch, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``rb`` in consecutive slices of at most ``batch_rows`` rows (zero-copy)."""
    for start in range(0, rb.num_rows, batch_rows):
        yield rb.slice(start, batch_rows)


def unreadable(f: object, what: str, exc: BaseException) -> Exception:
    """The error for a file that could not be read: the store's error (exit 3 when the store failed,
    see ``dqa.storage.faults``) when a store raised it, else ``InputError`` naming ``f`` and ``what`` it should be."""
    from dqa.errors import InputError
    from dqa.storage.faults import is_store_error, store_error

    if is_store_error(exc):
        return store_error(exc, str(f))  # type: ignore[arg-type]
    return InputError(f"{f}: unreadable {what} ({short(exc)})")


def short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
