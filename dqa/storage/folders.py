"""dqa's outputs in a store, written so a reader can trust them, and read back.

A command writes its output folder (a scan folder, a gate folder, a release) locally, as it does
for a local ``--out``: ``output_folder(dest)`` yields the local folder to write, a private staging
folder per URL (``stage_dir``), and on success ``publish``es it:

1. ``.dqa-incomplete`` is put first (readers refuse a folder holding it, naming what is missing);
2. the file that makes the folder complete (a scan's ``summary.json``) is deleted if present, so
   new parts never sit beside an old summary;
3. every other file is uploaded (in parallel threads; one object PUT is atomic on every store),
   then the store's files the new folder no longer has are deleted;
4. the complete file is uploaded, and ``.dqa-incomplete`` deleted.

A kill -9 anywhere leaves the marker or no complete file, never a folder that looks complete;
rerunning the command stages and publishes again and gives the same result as one clean run.
``input_folder(src)`` gives a local copy of a folder dqa wrote (kept in sync by size and mtime,
so a second read fetches nothing), refusing an incomplete one; ``check_complete`` is the
refusal alone, for readers that stream from the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from dqa.errors import InputError, RuntimeFailure
from dqa.storage.faults import store_errors
from dqa.storage.store_path import StorePath, is_url, location

INCOMPLETE = ".dqa-incomplete"
FETCHED = ".dqa-fetched.json"  # in a local copy: what was fetched, [size, mtime_ns] per file
UPLOAD_THREADS = 8
CHUNK_BYTES = 8 << 20


def stage_dir(url: str, kind: str) -> Path:
    """A private local folder for ``url`` (a ``StorePath``'s text: no credentials) under ``kind``.

    The root is ``$XDG_CACHE_HOME/dqa`` when that variable is set, else ``<tempdir>/dqa-<uid>``,
    made ``0700``. Raises ``RuntimeFailure`` when the root exists but is a link or belongs to
    another user (someone could read or plant files there).
    """
    h = hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:16]
    cache = os.environ.get("XDG_CACHE_HOME")
    root = Path(cache) / "dqa" if cache else Path(tempfile.gettempdir()) / f"dqa-{os.getuid()}"
    _private_dir(root)
    return root / kind / h


def _private_dir(d: Path) -> None:
    """Make ``d`` (mode 0700) or check that the existing one is a real folder of ours, closed to others."""
    d.parent.mkdir(parents=True, exist_ok=True)
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = d.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise RuntimeFailure(f"{d}: staging folder is not a folder owned by this user; remove it or set XDG_CACHE_HOME")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(d, 0o700)


def _listing(root: StorePath) -> dict[str, StorePath]:
    """``{relative path: file}`` of every file under ``root`` (none for a missing prefix)."""
    return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}


def check_complete(src: "Path | StorePath", complete: str | None = None) -> None:
    """Refuse a folder in a store that an interrupted upload left incomplete.

    Raises ``InputError`` naming the folder and what is missing when ``.dqa-incomplete`` is there,
    or when ``complete`` is given and not there.
    """
    if not isinstance(src, StorePath):
        return
    if (src / INCOMPLETE).is_file():
        what = _marker_says(src / INCOMPLETE)
        raise InputError(f"{src}: incomplete (an upload was interrupted{what}); rerun the command that writes it")
    if complete is not None and not (src / complete).is_file():
        raise InputError(f"{src}: incomplete or not written by dqa ({complete} is missing)")


def _marker_says(marker: StorePath) -> str:
    try:
        said = json.loads(marker.read_text())
        return f"; {said['complete']} not yet written" if said.get("complete") else ""
    except (ValueError, KeyError, TypeError, OSError, InputError, RuntimeFailure):
        return ""


def input_folder(src: "str | os.PathLike[str] | StorePath", complete: str | None = None) -> Path:
    """A local folder holding what ``src`` holds: ``src`` itself when local, else a synced copy.

    Raises ``InputError`` for a missing or incomplete folder (see ``check_complete``) and the
    store's errors as ``store_errors`` does.
    """
    loc = location(src)
    if not isinstance(loc, StorePath):
        return loc
    check_complete(loc, complete)
    files = _listing(loc)
    if not files:
        raise InputError(f"{loc}: no such folder in the store (nothing under this prefix)")
    local = stage_dir(str(loc), "inputs")
    _sync_down(loc, files, local)
    return local


def _sync_down(root: StorePath, files: dict[str, StorePath], local: Path) -> None:
    """Make ``local`` hold exactly ``files``: fetch the new and changed ones, delete the rest."""
    import pyarrow.fs as pafs

    local.mkdir(parents=True, exist_ok=True)
    record_file = local / FETCHED
    try:
        had = json.loads(record_file.read_text())
    except (OSError, ValueError):
        had = {}
    want = {rel: list(p.stat()) for rel, p in files.items() if rel != INCOMPLETE}
    for rel in set(had) - set(want):
        with contextlib.suppress(FileNotFoundError):
            (local / rel).unlink()
    todo = [rel for rel, sig in want.items() if had.get(rel) != sig or not (local / rel).is_file()]
    lfs = pafs.LocalFileSystem()

    def fetch(rel: str) -> None:
        dest = local / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".tmp-{dest.name}")
        with store_errors(str(files[rel])):
            pafs.copy_files(files[rel].key, str(tmp), source_filesystem=root.fs, destination_filesystem=lfs)
        tmp.replace(dest)

    _parallel(fetch, todo)
    from dqa.atomic import write_json

    write_json(record_file, want)


def local_if_written(arg: "str | os.PathLike[str] | None", marks: tuple[str, ...]) -> "str | os.PathLike[str] | None":
    """``arg`` itself, unless it is a URL of a folder holding one of ``marks`` (a folder dqa wrote: a scan's
    ``summary.json``, a run's ``run.json``): then its local copy (``input_folder``). A dataset URL stays a
    URL, to be streamed."""
    if arg is None or not is_url(arg):
        return arg
    loc = location(arg)
    assert isinstance(loc, StorePath)
    if any((loc / m).is_file() for m in marks) or (loc / INCOMPLETE).is_file():
        return input_folder(loc)
    return arg


@contextlib.contextmanager
def output_folder(dest: "str | os.PathLike[str] | StorePath", complete: str | None = None,
                  on_error: bool = False) -> Iterator[Path]:
    """Yield the local folder to write ``dest`` in; for a URL, ``publish`` it when the block ends without error
    (``on_error``: also when it raises, for a work folder a rerun resumes from; the block's error is raised).

    A URL's staging folder starts as a copy of what the store holds there (so a rerun sees its
    earlier output, as a local folder would), or empty when an interrupted publish left it
    incomplete (the rerun writes it anew). Raises the store's errors as ``store_errors``.
    """
    loc = location(dest)
    if not isinstance(loc, StorePath):
        yield loc
        return
    local = stage_dir(str(loc), "outputs")
    files = _listing(loc)
    if INCOMPLETE in files:  # an interrupted publish of this folder: written again from scratch
        files = {}
    if local.exists():
        shutil.rmtree(local)
    if files:
        _sync_down(loc, files, local)
        (local / FETCHED).unlink()
    else:
        local.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield local
    except BaseException:
        if on_error and local.exists():
            with contextlib.suppress(Exception):
                publish(local, loc, complete)
        raise
    if local.exists():
        publish(local, loc, complete)


@contextlib.contextmanager
def output_path(dest: "str | os.PathLike[str] | StorePath", fetch: bool = False) -> Iterator[Path]:
    """Yield a local path to write the file or folder ``dest`` at; for a URL, upload it when the block ends
    without error, then the files the command wrote beside it (``NAME.*``: a merge report), last.

    A folder is ``publish``ed (under ``.dqa-incomplete`` until whole); a file is one PUT, which a
    store shows whole or not at all. Nothing else under the URL's parent is touched. The local
    path starts empty (``fetch``: as a copy of what the store holds at ``dest``, for a command that may
    keep it); the caller checks what ``dest`` holds in the store first.
    """
    loc = location(dest)
    if not isinstance(loc, StorePath):
        yield loc
        return
    local = staged_path(loc)
    stage = local.parent
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    if fetch and loc.exists():
        import pyarrow.fs as pafs

        with store_errors(str(loc)):
            pafs.copy_files(loc.key, str(local), source_filesystem=loc.fs, destination_filesystem=pafs.LocalFileSystem())
    yield local
    if local.is_dir():
        publish(local, loc)
    elif local.is_file():
        put_file(local, loc)
    for beside in sorted(p for p in stage.iterdir() if p != local and p.is_file() and p.name.startswith(loc.name + ".")):
        put_file(beside, loc.parent / beside.name)


def staged_path(dest: StorePath) -> Path:
    """Where ``output_path`` writes ``dest`` before uploading it (the same path on every run on this machine)."""
    return stage_dir(str(dest), "outputs") / dest.name


def publish(local: Path, dest: StorePath, complete: str | None = None) -> None:
    """Upload the folder ``local`` to ``dest`` in the order the module docstring gives; ``dest`` then holds exactly it.

    Raises the store's errors (``store_errors``); an interrupted publish leaves ``.dqa-incomplete``.
    """
    mine = sorted(str(p.relative_to(local)) for p in local.rglob("*")
                  if p.is_file() and not p.name.startswith(".tmp-") and p.name not in (FETCHED, INCOMPLETE))
    with store_errors(str(dest)):
        there = set(_listing(dest))
        marker = json.dumps({"complete": complete, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()})
        with dest.fs.open_output_stream((dest / INCOMPLETE).key) as fh:
            fh.write(marker.encode())
        if complete is not None and complete in there:
            dest.fs.delete_file((dest / complete).key)

        def put(rel: str) -> None:
            put_file(local / rel, dest / rel)

        _parallel(put, [rel for rel in mine if rel != complete])
        for rel in sorted(there - set(mine) - {INCOMPLETE, complete or ""}):
            dest.fs.delete_file((dest / rel).key)
        if complete is not None and complete in mine:
            put(complete)
        dest.fs.delete_file((dest / INCOMPLETE).key)


def repoint(obj: Any, local: Path, url: "str | StorePath") -> Any:
    """``obj`` (a JSON value) with every string naming ``local`` or a path under it naming ``url`` instead:
    what an output staged locally records about itself once it is published."""
    prefix, target = str(local), str(url).rstrip("/")
    if isinstance(obj, str):
        return target + obj[len(prefix):] if obj == prefix or obj.startswith(prefix + "/") else obj
    if isinstance(obj, list):
        return [repoint(v, local, url) for v in obj]
    if isinstance(obj, dict):
        return {k: repoint(v, local, url) for k, v in obj.items()}
    return obj


def repoint_files(local: Path, url: "str | StorePath", names: tuple[str, ...]) -> None:
    """Rewrite the JSON files ``names`` of the staged folder ``local`` with ``repoint`` (before publishing)."""
    from dqa.atomic import write_json

    for name in names:
        f = local / name
        if f.is_file():
            write_json(f, repoint(json.loads(f.read_text()), local, url))


def put_file(local: Path, dest: StorePath) -> None:
    """Upload one local file to ``dest`` as one object (the SDK goes multipart for a large one; the object
    appears only when whole). No folder-marker objects are made. Raises the store's errors."""
    import pyarrow as pa

    with store_errors(str(dest)), pa.OSFile(str(local), "rb") as src, dest.fs.open_output_stream(dest.key) as out:
        while True:
            chunk = src.read(CHUNK_BYTES)
            if not chunk:
                break
            out.write(chunk)


def _parallel(fn: Any, items: list[str]) -> None:
    """``fn(item)`` for every item on a few threads (store requests wait on the network); the first error is raised."""
    if len(items) <= 1:
        for it in items:
            fn(it)
        return
    with ThreadPoolExecutor(min(UPLOAD_THREADS, len(items))) as pool:
        for _ in pool.map(fn, items):
            pass
