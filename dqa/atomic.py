"""Crash-safe writes: every file dqa produces appears complete or not at all.

A writer fills a temporary file in the destination folder, flushes and fsyncs
it, then renames it over the final name (atomic on POSIX within a
filesystem). A crash at any instant leaves either the old file or the new one,
plus at most a stray ``.tmp-*`` file that readers ignore and the next run
removes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

TMP_PREFIX = ".tmp-"


def fsync_dir(path: Path) -> None:
    """Flush a directory entry so a completed rename survives power loss (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def new_temp(dest: str | os.PathLike[str]) -> Path:
    """A new empty temporary file next to ``dest`` (named so that ``remove_stale_temps`` clears it
    after a crash), with the mode a plain ``open()`` would give ``dest``."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + dest.name + ".", dir=dest.parent)
    os.close(fd)
    # mkstemp makes 0600 files; give the result the mode a plain open() would (0666 & ~umask).
    os.chmod(tmp, 0o666 & ~_umask())
    return Path(tmp)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; on clean exit fsync it and rename it to ``dest``.

    On an exception the temporary file is removed and ``dest`` is untouched.
    Raises whatever the body raises, or ``OSError`` from the rename.
    """
    tmp_path = new_temp(dest)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, dest)
        fsync_dir(dest.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise named_os_error(exc, dest) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


def named_os_error(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """``exc`` itself when it names a file; else an ``OSError`` with the same errno that names ``path``.

    pyarrow's write errors ("Error writing bytes to file ... No space left on device") carry no
    file name; the CLI's one-line error message needs one.
    """
    if getattr(exc, "filename", None):
        return exc
    return OSError(exc.errno, exc.strerror or " ".join(str(exc).split()), str(path))


def write_bytes(dest: str | os.PathLike[str], data: bytes) -> None:
    """Atomically replace ``dest`` with ``data``."""
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)


def write_text(dest: str | os.PathLike[str], text: str) -> None:
    """Atomically replace ``dest`` with UTF-8 ``text``."""
    write_bytes(dest, text.encode("utf-8"))


def write_json(dest: str | os.PathLike[str], obj: Any) -> None:
    """Atomically replace ``dest`` with ``obj`` as indented JSON."""
    write_text(dest, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def remove_stale_temps(folder: str | os.PathLike[str]) -> int:
    """Delete leftover temporary files of interrupted writes in ``folder``; return how many."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    removed = 0
    for p in folder.glob(TMP_PREFIX + "*"):
        with contextlib.suppress(OSError):
            p.unlink()
            removed += 1
    return removed


def make_work_dir(dest: Path) -> Path:
    """A new empty folder next to ``dest`` (``.tmp-NAME.PID.*``) to build ``dest`` in.

    First removes such folders left by earlier runs whose process no longer exists (killed
    with -9 or by power loss); a folder of a run still going is left alone.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    prefix = TMP_PREFIX + dest.name + "."
    for d in dest.parent.glob(prefix + "*"):
        pid = d.name[len(prefix):].split(".")[0]
        if d.is_dir() and pid.isdigit() and not _process_exists(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", dir=dest.parent))
    os.chmod(work, 0o777 & ~_umask())  # mkdtemp makes 0700; the result should look like a plain mkdir
    return work


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_output_dir(dest: Path, inputs: Sequence[Path], owned: Callable[[Path], bool], what: str) -> None:
    """Refuse an output folder whose replacement would destroy anything but dqa's own earlier output.

    ``dest`` may not be, contain, or (for folder inputs) sit inside any of ``inputs``; an
    existing non-empty ``dest`` must satisfy ``owned`` (it holds an earlier ``what``).
    Raises ``InputError`` naming the folder.
    """
    from dqa.errors import InputError

    d = dest.resolve()
    for inp in inputs:
        if "://" in str(inp):  # an object in a store is never a local folder
            continue
        i = Path(inp).resolve()
        if d == i or d in i.parents:
            raise InputError(f"{dest}: the output folder would replace the input {inp}; choose another --out")
        if i.is_dir() and i in d.parents:
            raise InputError(f"{dest}: the output folder lies inside the input folder {inp}; choose another --out")
    if d.exists():
        if not d.is_dir():
            raise InputError(f"{dest}: exists and is not a folder")
        if any(d.iterdir()) and not owned(d):
            raise InputError(f"{dest}: exists and is not an earlier {what}; choose another --out or remove it")


def replace_dir(src: Path, dest: Path, keep: Callable[[str], bool] | None = None) -> None:
    """Move the finished folder ``src`` to ``dest``, replacing an earlier folder there.

    Two renames (old aside, new in), then the old copy is deleted: a crash in between
    leaves ``dest`` missing and a ``.tmp-*.old`` folder, never a half-written ``dest``.
    Entries of the old folder whose name ``keep`` accepts (and that the new one lacks) move
    into the new folder first: outputs other commands put there survive a rerun.
    Raises ``InputError`` when ``dest`` exists and is not a folder.
    """
    from dqa.errors import InputError

    if dest.exists():
        if not dest.is_dir():
            raise InputError(f"{dest}: exists and is not a folder")
        old = dest.with_name(TMP_PREFIX + dest.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
        os.replace(src, dest)
        if keep is not None:
            for entry in old.iterdir():
                if keep(entry.name) and not (dest / entry.name).exists():
                    os.replace(entry, dest / entry.name)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dest)
    fsync_dir(dest.parent)
