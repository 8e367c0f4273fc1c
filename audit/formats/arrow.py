"""Arrow IPC: the file format (``ARROW1`` magic) and the stream format (messages that start with the
continuation marker ``0xFFFFFFFF``).

The stream format is what Hugging Face ``datasets`` writes: the data files of a ``save_to_disk``
folder (format ``hf``, see ``readers``) and the cache file of ``Dataset.map(cache_file_name=...)``,
whatever its name. SpecForge caches its tokenized dataset that way as ``CACHE_DIR/KEY.pkl``
(``specforge/data/preprocessing.py``, ``build_eagle3_dataset``), or, with ``num_proc`` N > 1, as
``KEY_00000_of_0000N.pkl`` ... (datasets' ``suffix_template``).

Two things in a ``datasets`` cache folder are not data: the indices files that ``.filter`` /
``.select`` write (one ``indices`` column; ``is_indices_file``), and, when a folder holds several
caches, the others (``cache_name`` groups the shards of one cache).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from dqa.audit.formats.base import FileFormat, select, split
from dqa.storage import open_input

FILE_MAGIC = b"ARROW1"
CONTINUATION = b"\xff\xff\xff\xff"
_SHARD_NAME = re.compile(r"^(?P<base>.+)_(?P<rank>\d{5})_of_(?P<count>\d{5})(?P<ext>\.[^.]*)?$")


class _IpcSink:
    def __init__(self, path: Path, schema: pa.Schema, stream: bool, compression: str | None = None):
        self._fh = pa.OSFile(str(path), "wb")
        try:
            options = pa.ipc.IpcWriteOptions(compression=compression)
            open_ipc = pa.ipc.new_stream if stream else pa.ipc.new_file
            self._w: Any = open_ipc(self._fh, schema, options=options)
        except BaseException:
            self._fh.close()
            raise

    def write(self, batch: pa.RecordBatch) -> None:
        self._w.write_batch(batch)

    def close(self) -> None:
        try:
            self._w.close()
        finally:
            self._fh.close()


class ArrowFile(FileFormat):
    name = "arrow-file"
    family = "arrow"
    suffixes = (".arrow", ".feather", ".ipc")
    label = "an Arrow IPC file"

    def sniff(self, head: bytes, tail: bytes) -> bool:
        return head[:6] == FILE_MAGIC

    def schema(self, f: Path) -> pa.Schema:
        with open_input(f, memory_map=True) as src:
            return pa.ipc.open_file(src).schema

    def batches(self, f: Path, batch_rows: int, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        with open_input(f, memory_map=True) as src:
            reader = pa.ipc.open_file(src)
            for i in range(reader.num_record_batches):
                yield from split(select(reader.get_record_batch(i), columns), batch_rows)

    def num_rows(self, f: Path) -> int:
        with open_input(f, memory_map=True) as src:
            reader = pa.ipc.open_file(src)
            return sum(reader.get_record_batch(i).num_rows for i in range(reader.num_record_batches))

    def sink(self, path: Path, schema: pa.Schema | None, compression: str | None = None) -> _IpcSink:
        assert schema is not None
        return _IpcSink(path, schema, stream=False, compression=compression)


class ArrowStream(FileFormat):
    name = "arrow-stream"
    family = "arrow"
    suffixes = (".arrow", ".feather", ".ipc")
    label = "an Arrow IPC stream"

    def __init__(self, name: str = "arrow-stream"):
        self.name = name

    def sniff(self, head: bytes, tail: bytes) -> bool:
        return len(head) >= 8 and head[:4] == CONTINUATION

    def schema(self, f: Path) -> pa.Schema:
        with open_input(f, memory_map=True) as src:
            return pa.ipc.open_stream(src).schema

    def batches(self, f: Path, batch_rows: int, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        with open_input(f, memory_map=True) as src:
            for rb in pa.ipc.open_stream(src):
                yield from split(select(rb, columns), batch_rows)

    def sink(self, path: Path, schema: pa.Schema | None, compression: str | None = None) -> _IpcSink:
        assert schema is not None
        return _IpcSink(path, schema, stream=True, compression=compression)


ARROW_FILE = ArrowFile()
ARROW_STREAM = ArrowStream()
HF = ArrowStream("hf")  # the data files of a datasets save_to_disk folder


def is_indices_file(schema: pa.Schema) -> bool:
    """Whether an Arrow stream with ``schema`` is a ``datasets`` indices mapping (written by
    ``.filter``/``.select``/``.shuffle`` beside the data: one ``indices`` column of uint64), not data."""
    return schema.names == ["indices"] and pa.types.is_unsigned_integer(schema.field(0).type)


def cache_name(f: Path) -> tuple[str, int, int]:
    """``(cache file name, shard rank, shard count)`` of a ``datasets`` cache file: ``KEY_00003_of_00008.pkl``
    is shard 3 of 8 of ``KEY.pkl``; any other name is the whole cache (shard 0 of 1)."""
    m = _SHARD_NAME.match(f.name)
    if not m:
        return f.name, 0, 1
    return m["base"] + (m["ext"] or ""), int(m["rank"]), int(m["count"])
