"""A real small filesystem for disk-full tests: tmpfs of a given size, else a loop-mounted ext4 image.

Both need root (or CAP_SYS_ADMIN). ``small_filesystem`` yields the mount point and always
unmounts in teardown; ``fill`` leaves a chosen number of bytes free with a filler file
(delete it, or ``remount``, to free space again).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator


class MountUnavailable(RuntimeError):
    """Neither tmpfs nor a loop-mounted ext4 image could be mounted here."""


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True)


@contextlib.contextmanager
def small_filesystem(where: Path, size_kib: int) -> Iterator[Path]:
    """Mount a ``size_kib`` KiB filesystem at ``where`` (created); yield it; unmount on exit.

    Raises ``MountUnavailable`` with both reasons when neither kind can be mounted.
    """
    where.mkdir(parents=True, exist_ok=True)
    kind = None
    r = _run("mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0777", "tmpfs", str(where))
    if r.returncode == 0:
        kind = "tmpfs"
    else:
        image = where.parent / (where.name + ".ext4")
        with open(image, "wb") as fh:
            fh.truncate(max(size_kib, 1024) * 1024)
        mk = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
        lo = _run("mount", "-o", "loop", str(image), str(where)) if mk.returncode == 0 else mk
        if lo.returncode != 0:
            image.unlink(missing_ok=True)
            raise MountUnavailable(f"tmpfs: {r.stderr.strip()}; loop ext4: {lo.stderr.strip()}")
        kind = "ext4"
    try:
        yield where
    finally:
        if _run("umount", str(where)).returncode != 0:
            _run("umount", "-l", str(where))
        if kind == "ext4":
            (where.parent / (where.name + ".ext4")).unlink(missing_ok=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(mount: Path, leave_bytes: int) -> Path:
    """Write ``mount/filler`` until at most ``leave_bytes`` are free; returns the filler's path."""
    filler = mount / "filler"
    chunk = os.urandom(64 * 1024)
    with open(filler, "ab") as fh:
        while free_bytes(mount) > leave_bytes:
            want = min(len(chunk), free_bytes(mount) - leave_bytes)
            try:
                fh.write(chunk[: max(want, 4096)])
                fh.flush()
                os.fsync(fh.fileno())
            except OSError:
                break
    return filler


def remount(mount: Path, size_kib: int) -> None:
    """Grow a tmpfs in place (its files stay)."""
    r = _run("mount", "-o", f"remount,size={size_kib}k", str(mount))
    if r.returncode != 0:
        raise MountUnavailable(f"remount: {r.stderr.strip()}")


def tree(folder: Path) -> dict[str, int]:
    """Relative path -> size of every file under ``folder`` (for 'nothing left behind' checks)."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
