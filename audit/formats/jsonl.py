"""JSONL: one JSON object per line. Recognised by its suffix, or by a first non-blank ``{``; no stored
schema (column types are inferred from the rows by pyarrow's JSON reader)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from dqa.audit.formats.base import FileFormat, select, short, split
from dqa.errors import InputError
from dqa.storage import open_binary, open_stream

_BLANK = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"


class _JsonlSink:
    def __init__(self, path: Path):
        self._fh: Any = open(path, "wb")

    def write(self, batch: pa.RecordBatch) -> None:
        import polars as pl

        buf = io.BytesIO()
        pl.from_arrow(batch).write_ndjson(buf)  # type: ignore[union-attr]
        self._fh.write(buf.getbuffer())

    def close(self) -> None:
        self._fh.close()


class Jsonl(FileFormat):
    name = "jsonl"
    family = "jsonl"
    suffixes = (".jsonl", ".ndjson", ".json")
    label = "JSONL"
    typed = False

    def sniff(self, head: bytes, tail: bytes) -> bool:
        text = head[len(_BOM):] if head.startswith(_BOM) else head
        return text.lstrip(_BLANK)[:1] == b"{"

    def schema(self, f: Path) -> pa.Schema:
        for rb in self.batches(f, 64, None):
            return rb.schema
        raise InputError(f"{f}: empty JSONL file (no rows)")

    def batches(self, f: Path, batch_rows: int, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        """Parse with pyarrow's block reader; on a parse error, find the offending line for the message."""
        import pyarrow.json as pj

        try:
            reader = pj.open_json(open_stream(f), read_options=pj.ReadOptions(block_size=1 << 24))
            for rb in reader:
                yield from split(select(rb, columns), batch_rows)
        except (pa.ArrowInvalid, ValueError) as exc:
            line = first_bad_line(f)
            where = f"line {line}: " if line else ""
            raise InputError(f"{f}: {where}malformed JSONL ({short(exc)})") from None

    def sink(self, path: Path, schema: pa.Schema | None, compression: str | None = None) -> _JsonlSink:
        return _JsonlSink(path)


def first_bad_line(f: Path) -> int | None:
    """1-based number of the first line that is not one JSON object (error path only)."""
    with open_binary(f) as fh:
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


JSONL = Jsonl()
