"""``StorePath``: a file or folder in an object store, with the part of ``pathlib.Path`` dqa reads through.

``location(s)`` is the one place a command's path-or-URL argument becomes something to open:
a ``pathlib.Path`` for a local path (and ``file://``), a ``StorePath`` for any other URL.
A ``StorePath`` holds a pyarrow filesystem (``filesystems``), the path inside it and the URL's
scheme; ``str()`` is the URL, never with credentials (an ``s3://KEY:SECRET@bucket/`` URL's keys
go to the filesystem, and the text shown drops them). It pickles with its filesystem, so a scan's worker processes open their units
from the store themselves. ``open_input`` / ``open_stream`` give the random-access file or the
stream a reader wants, for either kind of path.
"""

from __future__ import annotations

import fnmatch
from urllib.parse import unquote
import os
import posixpath
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterator, NamedTuple


_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>.*)$")


class StoreStat(NamedTuple):
    """What ``StorePath.stat`` gives: the object's size and modification time (the store's clock)."""

    st_size: int
    st_mtime_ns: int


def is_url(s: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` other than ``file://`` (a local path)."""
    if isinstance(s, StorePath):
        return True
    m = _URL.match(str(s)) if isinstance(s, str) else None
    return bool(m) and m["scheme"].lower() != "file"


def location(s: "str | os.PathLike[str] | StorePath") -> "Path | StorePath":
    """The ``Path`` or ``StorePath`` of a command's argument.

    Raises ``InputError`` for a URL with credentials in it or a backend that is not installed.
    """
    if isinstance(s, (StorePath, Path)):
        return s
    text = os.fspath(s)
    m = _URL.match(text)
    if not m:
        return Path(text)
    scheme, rest = m["scheme"].lower(), m["rest"]
    if scheme == "file":
        return Path(rest)
    netloc = rest.split("/", 1)[0]
    from dqa.storage.filesystems import NATIVE, filesystem

    given: dict[str, str] = {}
    if NATIVE.get(scheme) == "s3" and "@" in netloc:  # s3://KEY:SECRET@bucket/..., as pyarrow's from_uri reads it
        userinfo, netloc = netloc.rsplit("@", 1)
        access, _, secret = userinfo.partition(":")
        given = {"access_key": unquote(access), "secret_key": unquote(secret)}
        rest = netloc + rest[len(userinfo) + 1 + len(netloc):]
    fs, native = filesystem(scheme, netloc, given)
    key = rest.strip("/") if native else _fsspec_path(fs, f"{scheme}://{rest}")
    return StorePath(fs, scheme, key)


def _fsspec_path(fs: Any, url: str) -> str:
    handler = getattr(fs, "handler", None)
    inner = getattr(handler, "fs", None)
    return inner._strip_protocol(url).rstrip("/") if inner is not None else url.split("://", 1)[1].strip("/")


def url_of(p: "str | os.PathLike[str] | StorePath") -> str:
    """The text dqa records and shows for a path or URL: a local path resolved, a URL as given (no credentials)."""
    loc = location(p)
    return str(loc) if isinstance(loc, StorePath) else str(Path(loc).resolve())


def open_input(p: "Path | StorePath", memory_map: bool = False) -> Any:
    """A random-access pyarrow file over ``p``: the store's ranged reads, or a local (memory-mapped) file."""
    import pyarrow as pa

    if isinstance(p, StorePath):
        return p.open("rb")
    return pa.memory_map(str(p)) if memory_map else pa.OSFile(str(p), "rb")


def open_stream(p: "Path | StorePath") -> Any:
    """A sequential pyarrow input stream over ``p`` (JSONL: read once, front to back)."""
    import pyarrow as pa

    if isinstance(p, StorePath):
        from dqa.storage.faults import store_errors

        with store_errors(str(p)):
            return p.fs.open_input_stream(p.key)
    return pa.OSFile(str(p), "rb")


def open_binary(p: "Path | StorePath") -> Any:
    """A Python binary file over ``p``, buffered, readable line by line. Raises ``OSError`` (local) or the store's errors."""
    if isinstance(p, StorePath):
        import io

        return io.BufferedReader(open_stream(p), buffer_size=1 << 20)
    return open(p, "rb")


class StorePath:
    """A path in a store: ``fs`` (a pyarrow filesystem), ``scheme`` and ``key`` (the path inside ``fs``)."""

    __slots__ = ("fs", "scheme", "key", "_info")

    def __init__(self, fs: Any, scheme: str, key: str, info: Any = None):
        self.fs = fs
        self.scheme = scheme
        self.key = key.rstrip("/") or key
        self._info = info  # a pyarrow FileInfo from a listing, so a listed file needs no second request

    # --- names ---------------------------------------------------------------------------
    def __str__(self) -> str:
        if self.scheme == "file":
            return self.key
        from dqa.storage.faults import without_credentials

        return without_credentials(f"{self.scheme}://{self.key.lstrip('/')}")  # an fsspec path may keep user:password@

    @classmethod
    def local(cls, path: "str | os.PathLike[str]") -> "StorePath":
        """A local folder or file as a ``StorePath`` (pyarrow's local filesystem), for code that copies to either."""
        import pyarrow.fs as pafs

        return cls(pafs.LocalFileSystem(), "file", str(Path(path).absolute()))

    def __repr__(self) -> str:
        return f"StorePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorePath) and (self.scheme, self.key) == (other.scheme, other.key)

    def __lt__(self, other: "StorePath") -> bool:
        return self.key < other.key

    def __hash__(self) -> int:
        return hash((self.scheme, self.key))

    def __reduce__(self) -> tuple:
        return (StorePath, (self.fs, self.scheme, self.key, None))

    def __truediv__(self, name: "str | os.PathLike[str]") -> "StorePath":
        return StorePath(self.fs, self.scheme, posixpath.join(self.key, os.fspath(name)))

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def suffixes(self) -> list[str]:
        return PurePosixPath(self.name).suffixes

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem

    @property
    def parent(self) -> "StorePath":
        return StorePath(self.fs, self.scheme, posixpath.dirname(self.key) or self.key)

    @property
    def parents(self) -> list["StorePath"]:
        out, key = [], self.key
        while "/" in key.strip("/"):
            key = posixpath.dirname(key)
            out.append(StorePath(self.fs, self.scheme, key))
        return out

    def with_name(self, name: str) -> "StorePath":
        return self.parent / name

    def relative_to(self, other: "StorePath") -> PurePosixPath:
        return PurePosixPath(self.key).relative_to(other.key)

    def resolve(self) -> "StorePath":
        return self

    # --- what is there -------------------------------------------------------------------
    def info(self) -> Any:
        """The store's ``FileInfo`` for this path (one request, remembered). Raises ``DqaError`` when the store fails."""
        if self._info is None:
            from dqa.storage.faults import store_errors

            with store_errors(str(self)):
                self._info = self.fs.get_file_info(self.key)
        return self._info

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self.info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        import pyarrow.fs as pafs

        return self.info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        import pyarrow.fs as pafs

        return self.info().type == pafs.FileType.Directory

    def stat(self) -> StoreStat:
        """Size and modification time. Raises ``FileNotFoundError`` naming the URL for a missing object."""
        info = self.info()
        if info.size is None:
            raise FileNotFoundError(2, "no such object", str(self))
        return StoreStat(int(info.size), int(info.mtime_ns or 0))

    def iterdir(self) -> Iterator["StorePath"]:
        yield from self._list(recursive=False)

    def rglob(self, pattern: str) -> Iterator["StorePath"]:
        """Every file and folder under this path whose name matches ``pattern``, from one recursive listing."""
        for p in self._list(recursive=True):
            if fnmatch.fnmatchcase(p.name, pattern):
                yield p

    def glob(self, pattern: str) -> Iterator["StorePath"]:
        for p in self._list(recursive=False):
            if fnmatch.fnmatchcase(p.name, pattern):
                yield p

    def _list(self, recursive: bool) -> list["StorePath"]:
        import pyarrow.fs as pafs

        from dqa.storage.faults import store_errors

        with store_errors(str(self)):
            infos = self.fs.get_file_info(pafs.FileSelector(self.key, recursive=recursive, allow_not_found=True))
        return [StorePath(self.fs, self.scheme, i.path, i) for i in sorted(infos, key=lambda i: i.path)]

    # --- reading -------------------------------------------------------------------------
    def open(self, mode: str = "rb") -> Any:
        """A random-access pyarrow file (ranged reads). Only ``rb``: dqa writes to stores through ``folders``."""
        if mode != "rb":
            raise ValueError(f"{self}: StorePath opens for reading only")
        from dqa.storage.faults import store_errors

        with store_errors(str(self)):
            return self.fs.open_input_file(self.key)

    def read_bytes(self) -> bytes:
        with self.open() as fh:
            return fh.read()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)
