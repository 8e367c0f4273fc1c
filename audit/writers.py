"""Write a dataset in the same on-disk format and layout as one that ``open_dataset`` read.

``DatasetWriter(like, out)`` takes record batches in dataset order, each tagged with the
input file it came from, and writes them to ``out`` in ``like``'s format:

- a parquet file, or a folder of parquet shards (same relative file names, same rows per
  file, the input's compression codec);
- an Arrow IPC file or stream (file format in, file format out);
- JSONL, a file or a folder of files (one JSON object per line, written by polars);
- an HF ``save_to_disk`` folder: the Arrow stream data files under their original names, a
  ``state.json`` listing them and a ``dataset_info.json`` whose features describe every
  column, so ``datasets.load_from_disk`` reads it back.

Output schema: each file keeps its input schema; columns the caller adds are appended, and
where the input carries Hugging Face feature metadata (the ``huggingface`` schema key, or
``dataset_info.json``) the new columns are added to the features.

Crash safety: the output is built whole in a work folder beside ``out``
(``dqa.atomic.make_work_dir``: ``.tmp-NAME.PID.*``), each file through ``dqa.atomic.atomic_path``,
and ``commit`` renames it into place (``dqa.atomic.replace_dir`` for a folder, one rename for a
file), then moves any companion files (a report) beside it. Until then nothing named ``out``
exists, so a crash never leaves a half dataset that looks complete; the next writer of ``out``
removes work folders whose process is gone (never those of a run still going). Files and
folders get the modes a plain ``open``/``mkdir`` would give (umask).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from dqa.atomic import atomic_path, fsync_dir, make_work_dir, replace_dir
from dqa.audit.dataset_files import file_schema
from dqa.audit.readers import Dataset
from dqa.errors import InputError

HF_META_KEY = b"huggingface"


def output_is_folder(like: Dataset) -> bool:
    """True when ``like`` is a folder dataset (shards or HF), so its copy is a folder too."""
    return like.path.is_dir()


def check_output_path(like: Dataset, out: Path, force: bool) -> None:
    """Validate ``out`` as a destination for a dataset shaped like ``like``.

    Raises ``InputError`` when ``out`` is the input or lies inside it (or the input inside
    ``out``), when it exists and ``force`` is false, or when a single-file output's suffix
    would make the readers take it for another format.
    """
    src = like.path.resolve()
    dst = out.resolve()
    if dst == src or src in dst.parents or dst in src.parents:
        raise InputError(f"--out {out}: refusing to overwrite or nest inside the input dataset {like.path}")
    if out.exists() and not force:
        raise InputError(f"--out {out}: already exists (use --force to replace it)")
    if out.exists() and out.is_dir() != output_is_folder(like):
        kind = "a folder" if out.is_dir() else "a file"
        raise InputError(f"--out {out}: is {kind}, but the input {like.path} is not; refusing to replace it")
    if not output_is_folder(like):
        want = _suffix_family(like.path.name)
        have = _suffix_family(out.name)
        if want != have:
            raise InputError(
                f"--out {out}: the input is {like.format}; name the output with a {_SUFFIX_HINT[want]} suffix "
                "(merge writes the input's format)"
            )


_SUFFIX_HINT = {"parquet": ".parquet", "arrow": ".arrow", "jsonl": ".jsonl", None: "matching"}


def _suffix_family(name: str) -> str | None:
    from dqa.audit.readers import ARROW_SUFFIXES, JSONL_SUFFIXES, PARQUET_SUFFIXES

    name = name.lower()
    for suffixes, fam in ((PARQUET_SUFFIXES, "parquet"), (ARROW_SUFFIXES, "arrow"), (JSONL_SUFFIXES, "jsonl")):
        if name.endswith(suffixes):
            return fam
    return None


# --- Hugging Face feature metadata ------------------------------------------------------------


def hf_feature(t: pa.DataType) -> Any:
    """The ``datasets`` feature dict for an Arrow type (Value, List, struct dicts).

    Raises ``InputError`` for types this writer cannot describe.
    """
    if pa.types.is_struct(t):
        return {t.field(i).name: hf_feature(t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        out: dict[str, Any] = {"feature": hf_feature(t.value_type), "_type": "LargeList" if pa.types.is_large_list(t) else "List"}
        return out
    if pa.types.is_fixed_size_list(t):
        return {"feature": hf_feature(t.value_type), "length": t.list_size, "_type": "List"}
    if pa.types.is_timestamp(t):
        tz = f", tz={t.tz}" if t.tz else ""
        return {"dtype": f"timestamp[{t.unit}{tz}]", "_type": "Value"}
    names = {
        pa.string(): "string", pa.large_string(): "large_string", pa.bool_(): "bool", pa.null(): "null",
        pa.int8(): "int8", pa.int16(): "int16", pa.int32(): "int32", pa.int64(): "int64",
        pa.uint8(): "uint8", pa.uint16(): "uint16", pa.uint32(): "uint32", pa.uint64(): "uint64",
        pa.float16(): "float16", pa.float32(): "float32", pa.float64(): "float64",
        pa.binary(): "binary", pa.large_binary(): "large_binary",
    }
    if t in names:
        return {"dtype": names[t], "_type": "Value"}
    raise InputError(f"cannot describe Arrow type {t} as a Hugging Face feature")


def _with_hf_features(info: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """``info`` (a datasets info dict) whose ``features`` also describe columns of ``schema`` it lacks."""
    info = dict(info)
    feats = dict(info.get("features") or {})
    for f in schema:
        if f.name not in feats:
            feats[f.name] = hf_feature(f.type)
    info["features"] = {f.name: feats[f.name] for f in schema}
    return info


def _schema_with_hf_meta(schema: pa.Schema) -> pa.Schema:
    meta = dict(schema.metadata or {})
    if HF_META_KEY not in meta:
        return schema
    try:
        hf = json.loads(meta[HF_META_KEY])
    except ValueError:
        return schema
    hf["info"] = _with_hf_features(hf.get("info") or {}, schema)
    meta[HF_META_KEY] = json.dumps(hf).encode()
    return schema.with_metadata(meta)


# --- per-file writers -------------------------------------------------------------------------


class _Discarded(Exception):
    """Thrown into ``atomic_path`` to make it remove the temporary file."""


class _FileSink:
    """Writes one output file at a temporary name (``dqa.atomic.atomic_path``); ``close`` renames it to ``dest``."""

    def __init__(self, dest: Path, fmt: str, schema: pa.Schema | None, compression: str | None):
        self.dest = dest
        self.fmt = fmt
        self._atomic = atomic_path(dest)
        self.tmp = self._atomic.__enter__()
        self.schema = _schema_with_hf_meta(schema) if schema is not None else None
        self.rows = 0
        self._w: Any = None
        self._fh: Any = None
        try:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                self._w = pq.ParquetWriter(str(self.tmp), self.schema, compression=compression or "snappy")
            elif fmt == "arrow-file":
                self._fh = pa.OSFile(str(self.tmp), "wb")
                self._w = pa.ipc.new_file(self._fh, self.schema)
            elif fmt in ("arrow-stream", "hf"):
                self._fh = pa.OSFile(str(self.tmp), "wb")
                self._w = pa.ipc.new_stream(self._fh, self.schema)
            else:
                self._fh = open(self.tmp, "wb")
        except BaseException:
            self.discard()
            raise

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.rows += batch.num_rows
        if self.fmt == "jsonl":
            import polars as pl

            buf = io.BytesIO()
            pl.from_arrow(batch).write_ndjson(buf)  # type: ignore[union-attr]
            self._fh.write(buf.getbuffer())
            return
        if batch.schema != self.schema:
            batch = _conform(batch, self.schema)
        self._w.write_batch(batch)

    def close(self) -> None:
        """Finish the file, fsync it and rename it to ``dest``. Raises ``OSError`` (naming the file)."""
        try:
            if self._w is not None:
                self._w.close()
            if self._fh is not None:
                self._fh.close()
        except BaseException as exc:
            self._atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._atomic.__exit__(None, None, None)

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            if self._w is not None:
                self._w.close()
        with contextlib.suppress(Exception):
            if self._fh is not None:
                self._fh.close()
        with contextlib.suppress(_Discarded, OSError):
            self._atomic.__exit__(_Discarded, _Discarded(), None)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the writer's column order, types and metadata."""
    if batch.schema.names != schema.names:
        missing = [n for n in schema.names if n not in batch.schema.names]
        if missing:
            raise InputError(f"batch lacks column {missing[0]!r} of the output schema")
        batch = batch.select(schema.names)
    return batch.cast(schema)


def _parquet_compression(f: Path) -> str | None:
    from dqa.audit.formats.parquet import parquet_file

    md = parquet_file(f).metadata
    if md.num_row_groups == 0 or md.num_columns == 0:
        return None
    codec = md.row_group(0).column(0).compression
    return None if codec in (None, "UNCOMPRESSED") else codec.lower()


# --- the dataset writer -----------------------------------------------------------------------


class DatasetWriter:
    """Write a dataset shaped like ``like`` (format, file layout) to ``out``.

    Args:
        like: the input dataset (from ``open_dataset``).
        out: the destination file or folder; must not exist unless ``force``.
        schema_for: maps an input file's stored schema to that output file's schema (default:
            unchanged). Used for files that get no rows and for Arrow/parquet writers.
        force: replace an existing ``out`` at commit.

    Use as a context manager: ``write(src_file, batch)`` in dataset order, then ``commit()``.
    Leaving the block without ``commit`` (an exception, Ctrl-C) removes everything written.
    Raises ``InputError`` for a bad destination (see ``check_output_path``).
    """

    def __init__(
        self,
        like: Dataset,
        out: str | os.PathLike[str],
        schema_for: Callable[[pa.Schema], pa.Schema] | None = None,
        force: bool = False,
    ):
        self.like = like
        self.out = Path(out)
        self.force = force
        self.schema_for = schema_for or (lambda s: s)
        check_output_path(like, self.out, force)
        self.folder = output_is_folder(like)
        self.rows_written = 0
        self._committed = False
        self._sinks: dict[Path, _FileSink] = {}
        self._done: list[Path] = []
        self._current: Path | None = None
        self.work = make_work_dir(self.out)  # removes work folders of dead earlier runs
        # A folder output is built as work/data; a file output as work/NAME.
        self.root = self.work / "data" if self.folder else self.work
        self.root.mkdir(exist_ok=True)

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._committed:
            self.abort()

    def _dest(self, src: Path) -> Path:
        if not self.folder:
            return self.root / self.out.name
        return self.root / src.resolve().relative_to(self.like.path.resolve())

    def _open(self, src: Path) -> _FileSink:
        fmt = self.like.format
        stored = file_schema(src, fmt)
        schema = self.schema_for(stored) if stored is not None else None
        compression = _parquet_compression(src) if fmt == "parquet" else None
        return _FileSink(self._dest(src), fmt, schema, compression)

    def write(self, src: Path, batch: pa.RecordBatch) -> None:
        """Append ``batch`` (rows from input file ``src``, in dataset order) to its output file."""
        if self._current != src:
            self._finish_current()
            self._current = src
            self._sinks[src] = self._open(src)
        self._sinks[src].write(batch)
        self.rows_written += batch.num_rows

    def _finish_current(self) -> None:
        if self._current is not None and not self.folder:
            return  # the single file stays open until commit
        if self._current is not None:
            sink = self._sinks.pop(self._current)
            sink.close()
            self._done.append(self._current)

    def commit(self, companions: dict[Path, bytes] | None = None) -> Path:
        """Close every file, write the folder's metadata and move the result to ``out``; return ``out``.

        ``companions`` (path -> content) are files that describe ``out`` (a merge report): they
        are written in the work folder first and renamed into place right after ``out``, so
        none appears without ``out``; an earlier copy is removed before ``out`` is replaced.
        Input files that received no rows still get an (empty) output file with their schema.
        Raises ``InputError`` when ``out`` appeared meanwhile and ``force`` is false.
        """
        self._finish_current()
        if not self.folder and not self._sinks:
            self._sinks[self.like.files[0]] = self._open(self.like.files[0])
        if self.folder:
            for f in self.like.files:
                if f not in self._done and f not in self._sinks:
                    self._open(f).close()
            self._copy_other_files()
            if self.like.format == "hf":
                self._write_hf_metadata()
        else:
            (sink,) = self._sinks.values()
            sink.close()
            self._sinks.clear()
        staged = []
        for k, (dest, data) in enumerate((companions or {}).items()):
            tmp = self.work / f"companion-{k}"
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            staged.append((tmp, Path(dest)))
        if self.out.exists() and not self.force:
            raise InputError(f"--out {self.out}: appeared while merging (use --force to replace it)")
        for _, dest in staged:
            with contextlib.suppress(FileNotFoundError):
                dest.unlink()
        fsync_dir(self.root)
        if self.folder:
            replace_dir(self.root, self.out)
        else:
            os.replace(self.root / self.out.name, self.out)
        for tmp, dest in staged:
            os.replace(tmp, dest)
        fsync_dir(self.out.parent)
        self._committed = True
        shutil.rmtree(self.work, ignore_errors=True)
        return self.out

    def _copy_other_files(self) -> None:
        """Copy the input folder's non-data files (README, licences, ...) unchanged; HF metadata is rewritten."""
        data = {f.resolve() for f in self.like.files}
        skip = {"state.json", "dataset_info.json"} if self.like.format == "hf" else set()
        base = self.like.path.resolve()
        for p in base.rglob("*"):
            rel = p.relative_to(base)
            if any(part.startswith(".") for part in rel.parts) or not p.is_file() or p.resolve() in data:
                continue
            if p.parent == base and p.name in skip:
                continue
            if _is_stale_indices(p):
                continue  # datasets' filter/select row lists point into the old data: never reuse them
            dest = self.root / rel
            with atomic_path(dest) as tmp:
                shutil.copyfile(p, tmp)

    def _write_hf_metadata(self) -> None:
        from dqa.atomic import write_json

        base = self.like.path
        state = json.loads((base / "state.json").read_text())
        state["_fingerprint"] = secrets.token_hex(8)
        info_path = base / "dataset_info.json"
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        schema = self.schema_for(file_schema(self.like.files[0], "hf"))  # type: ignore[arg-type]
        info = _with_hf_features(info, schema)
        # Sizes and split counts describe the old data; drop them rather than state wrong numbers.
        for key in ("splits", "download_checksums", "download_size", "dataset_size", "size_in_bytes"):
            info.pop(key, None)
        write_json(self.root / "state.json", state)
        write_json(self.root / "dataset_info.json", info)

    def abort(self) -> None:
        """Remove everything written so far; ``out`` is untouched."""
        for sink in self._sinks.values():
            sink.discard()
        self._sinks.clear()
        shutil.rmtree(self.work, ignore_errors=True)


def _is_stale_indices(p: Path) -> bool:
    """True for a ``datasets`` indices file (``cache-*.arrow`` written by ``.filter``/``.select``
    beside a cache): its row positions belong to the input, not to the merged output."""
    if p.suffix != ".arrow":
        return False
    from dqa.audit.formats.arrow import is_indices_file
    import pyarrow as pa

    try:
        with pa.memory_map(str(p)) as src:
            return is_indices_file(pa.ipc.open_stream(src).schema)
    except (pa.ArrowInvalid, OSError):
        return False
