"""Allocator tuning for batch-at-a-time numpy work.

glibc serves large allocations with fresh ``mmap`` pages and returns them on
free, so every batch's temporaries fault their pages in again: for the scan
kernels that was a quarter of the CPU time. Raising the mmap and trim
thresholds keeps freed batch memory in the heap for the next batch. Peak
memory is unchanged (it is bounded by the batch); the process just does not
hand the pages back between batches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def reuse_freed_memory(limit: int = 1 << 30) -> bool:
    """Ask glibc to keep freed blocks below ``limit`` bytes for reuse; True when applied.

    A no-op (False) on other platforms or C libraries.
    """
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, limit) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2 * limit) == 1
    except (OSError, AttributeError):
        return False
    _done = ok
    return ok
