"""Allocator tuning for batch-at-a-time numpy and Arrow work.

Both allocators a scan uses hand freed memory back to the kernel by default, so every batch's
temporaries fault their pages in again (and the kernel zeroes each one first; with transparent
huge pages, 2 MiB at a time):

- glibc serves large allocations (numpy's arrays) with fresh ``mmap`` pages and returns them on
  free. Raising the mmap and trim thresholds keeps freed batch memory in the heap for the next
  batch: for the scan kernels that was a quarter of the CPU time.
- Arrow's default pool (mimalloc in the pyarrow wheels) purges freed pages after a few
  milliseconds, so the parquet reader's decoded columns and every ``take`` refaulted their pages:
  12-15% of a scan's CPU, most of it zeroing huge pages. Arrow is pointed at its system pool,
  which allocates from glibc's heap and so keeps them too.

Peak memory is unchanged (it is bounded by the batch); the process just does not hand the pages
back between batches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def reuse_freed_memory(limit: int = 1 << 30) -> bool:
    """Ask glibc to keep freed blocks below ``limit`` bytes for reuse, and make glibc Arrow's
    default memory pool; True when applied.

    Process-wide, and done once. A no-op (False) on other platforms or C libraries, where both
    allocators stay as they were.
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
    if ok:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    _done = ok
    return ok
