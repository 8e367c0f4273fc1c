"""Dataset file formats: the registry and ``detect_file``; one module per format.

Each format (the modules ``parquet``, ``arrow``, ``jsonl``, ``conversations`` of this package)
is a ``FileFormat`` (``base``): its name (the ``format`` that summaries record), its suffix
family and suffixes, how to recognise a file by its first and last bytes (``sniff``), its
stored schema, its record batches, its row count where the format records it, and a sink that
writes it. ``FORMATS`` registers them, one line each.

A file is recognised by its content, whatever its name (``detect_file``):

- parquet: ``PAR1`` at the start (and, when whole, at the end: a file cut short is still
  parquet, and reading it fails naming the file);
- Arrow IPC file: ``ARROW1`` at the start;
- Arrow IPC stream: an IPC message, i.e. the continuation marker ``0xFFFFFFFF`` (what
  ``datasets`` writes for ``.map(cache_file_name=...)``, so SpecForge's ``*.pkl`` cache reads);
- JSONL: by its suffix (``.jsonl``, ``.ndjson``, ``.json``) or, for other names, a first
  non-blank character ``{``; a JSONL file whose first record holds a ``conversations`` or
  ``messages`` list of message objects and no ``input_ids`` is conversation JSONL
  (``conversations``: rendered with the chat template and masked at read time).

Anything else is an ``InputError`` naming the file and what was expected.
"""

from __future__ import annotations

from pathlib import Path

from dqa.audit.formats.arrow import ARROW_FILE, ARROW_STREAM, HF
from dqa.audit.formats.base import FileFormat
from dqa.audit.formats.conversations import CONVERSATIONS, is_conversation_file
from dqa.audit.formats.jsonl import JSONL
from dqa.audit.formats.parquet import PARQUET
from dqa.errors import InputError
from dqa.storage.faults import is_store_error, store_error

HEAD_BYTES = 4096  # enough to see past leading blank lines of a JSONL file
TAIL_BYTES = 1024
EXPECTED = (
    "a parquet file (starts with PAR1), an Arrow IPC file (ARROW1) or stream (0xFFFFFFFF), "
    "JSONL (.jsonl, or lines of JSON objects), or a folder of them"
)


# One line per format; the order is the order a folder's families are preferred in.
FORMATS: dict[str, FileFormat] = {f.name: f for f in (PARQUET, ARROW_FILE, ARROW_STREAM, HF, JSONL, CONVERSATIONS)}


def get(name: str) -> FileFormat:
    """The format recorded as ``name`` (``parquet``, ``arrow-file``, ``arrow-stream``, ``hf``, ``jsonl``, ``conversations``)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise InputError(f"unknown dataset format {name!r} (known: {', '.join(FORMATS)})") from None


def all_formats() -> list[FileFormat]:
    """The file formats, in the order a folder's families are preferred (parquet, Arrow, JSONL); no ``hf``."""
    return [f for f in FORMATS.values() if f.name != "hf"]


def by_magic() -> list[FileFormat]:
    """The formats recognised by magic bytes."""
    return [f for f in all_formats() if f.family != "jsonl"]


def suffixes(family: str | None = None) -> tuple[str, ...]:
    """The known file suffixes (of one family, or all)."""
    seen: dict[str, None] = {}
    for f in all_formats():
        if family is None or f.family == family:
            seen.update(dict.fromkeys(f.suffixes))
    return tuple(seen)


def family_of_name(name: str) -> str | None:
    """The suffix family (``parquet``, ``arrow``, ``jsonl``) a file name claims, or None."""
    low = name.lower()
    for f in all_formats():
        if low.endswith(f.suffixes):
            return f.family
    return None


def peek(path: Path, head_bytes: int = HEAD_BYTES) -> tuple[bytes, bytes, int]:
    """The first ``head_bytes`` bytes, the last 4 bytes and the size of ``path``."""
    from dqa.storage import StorePath, open_input

    try:
        with (open_input(path) if isinstance(path, StorePath) else open(path, "rb")) as fh:
            head = fh.read(head_bytes)
            size = fh.seek(0, 2)
            if size <= len(head):
                tail = head[-4:]
            else:
                # In a store, a 4-byte range cannot hold an error reply (a 503 SlowDown's XML), which the
                # SDK then cannot retry: read the last KiB.
                fh.seek(max(len(head), size - TAIL_BYTES))
                tail = fh.read(TAIL_BYTES)[-4:]
    except OSError as exc:
        if is_store_error(exc):
            raise store_error(exc, str(path)) from None
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return head, tail, size


def sniff_magic(path: Path) -> FileFormat | None:
    """The format whose magic bytes ``path`` carries (parquet, Arrow IPC file or stream), or None."""
    head, tail, _ = peek(path, 8)
    return next((f for f in by_magic() if f.sniff(head, tail)), None)


def detect_file(path: Path) -> FileFormat:
    """The format of the file at ``path``, by its content (see the module docstring).

    Raises ``InputError`` naming the file for an empty file (except a ``.jsonl``, which the
    JSONL reader reports as having no rows) and for content of no known format.
    """
    head, tail, size = peek(path)
    for f in by_magic():
        if f.sniff(head, tail):
            return f
    jsonl = get("jsonl")
    claimed = family_of_name(path.name)
    if claimed == "jsonl":
        return _jsonl_kind(path, size)
    if size == 0:
        raise InputError(f"{path}: empty file (0 bytes); expected {EXPECTED}")
    if claimed is None and jsonl.sniff(head, tail):
        return _jsonl_kind(path, size)
    named = f"named like {claimed} but " if claimed else ""
    pickled = ": a Python pickle, which dqa does not load" if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05") else ""
    raise InputError(f"{path}: unknown format ({named}starts with bytes {head[:8].hex(' ')}{pickled}); expected {EXPECTED}")


def _jsonl_kind(path: Path, size: int) -> FileFormat:
    """Tokenized JSONL, or conversation JSONL when the first record is a conversation (see the module docstring)."""
    return get("conversations") if size and is_conversation_file(path) else get("jsonl")
