"""Staging: copy the model folder to a RAM disk (``/dev/shm``) once, so every server of the fleet
loads it from memory. ``stage_model`` copies (or finds an identical copy, recorded in
``STAGE_MARKER``) and ``staged_copy_is_current`` says whether a copy matches its source.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Callable

from dqa.errors import InputError, RuntimeFailure

STAGE_MARKER = ".dqa-stage.json"


def _manifest(src: Path) -> dict[str, list[int]]:
    """Relative path -> [size, mtime_ns] of every file under ``src`` (symlinks followed)."""
    if src.is_file():
        st = src.stat()
        return {src.name: [st.st_size, st.st_mtime_ns]}
    files: dict[str, list[int]] = {}
    for root, dirs, names in os.walk(src, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".tmp-"))
        for name in sorted(names):
            p = Path(root) / name
            st = p.stat()
            files[str(p.relative_to(src))] = [st.st_size, st.st_mtime_ns]
    return files


def staged_copy_is_current(src: Path, dest: Path, manifest: dict[str, list[int]] | None = None) -> bool:
    """True when ``dest`` is a complete dqa copy of ``src`` as it is now (same files, sizes,
    mtimes). ``manifest`` is ``_manifest(src)`` when the caller already has it."""
    marker = dest / STAGE_MARKER
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if manifest is None:
        manifest = _manifest(src)
    if recorded.get("files") != manifest:
        return False
    return all((dest / rel).is_file() and (dest / rel).stat().st_size == size for rel, (size, _) in manifest.items())


def stage_model(
    src: str | Path,
    stage_dir: str | Path,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[Path, bool]:
    """Copy the model folder ``src`` into ``stage_dir`` (a RAM disk such as /dev/shm) once.

    Returns ``(copy_path, copied)``; ``copied`` is False when an identical copy was already
    there. ``on_progress(done_bytes, total_bytes)`` is called while copying. Raises
    ``InputError`` when ``src`` is missing, when ``stage_dir`` lacks the space, or when the
    destination exists but is not a dqa copy (it is never deleted then).
    """
    src = Path(src).resolve()
    stage_dir = Path(stage_dir)
    if not src.exists():
        raise InputError(f"--model {src}: no such file or folder to stage")
    dest = stage_dir.resolve() / src.name
    if dest == src:
        return dest, False
    stage_dir.mkdir(parents=True, exist_ok=True)
    manifest = _manifest(src)  # walked once: a model folder can hold thousands of files
    if staged_copy_is_current(src, dest, manifest):
        return dest, False
    if dest.exists() and not (dest / STAGE_MARKER).is_file():
        raise InputError(f"--stage {stage_dir}: {dest} exists and is not a dqa copy of {src}; remove it or pick another --stage folder")
    total = sum(size for size, _ in manifest.values())
    free = shutil.disk_usage(stage_dir).free
    if free < total + (64 << 20):
        raise InputError(
            f"--stage {stage_dir}: needs {total / 2**30:.2f} GiB for {src.name}, only {free / 2**30:.2f} GiB free"
        )
    partial = dest.with_name(".tmp-" + dest.name)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    done = 0
    chunk = 16 << 20
    try:
        for rel in manifest:
            s = src if src.is_file() else src / rel
            d = partial / rel
            d.parent.mkdir(parents=True, exist_ok=True)
            with open(s, "rb") as fi, open(d, "wb") as fo:
                while True:
                    buf = fi.read(chunk)
                    if not buf:
                        break
                    fo.write(buf)
                    done += len(buf)
                    if on_progress is not None:
                        on_progress(done, total)
            shutil.copystat(s, d)
        (partial / STAGE_MARKER).write_text(json.dumps({"source": str(src), "files": manifest}), encoding="utf-8")
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise RuntimeFailure(f"--stage {stage_dir}: disk full while copying {src.name}") from None
        raise
    if dest.exists():  # an older dqa copy of a changed source: replace it
        shutil.rmtree(dest)
    partial.rename(dest)
    return dest, True
