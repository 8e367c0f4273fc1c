"""Small numpy building blocks for ragged (list-of-lists) data held as flat values + offsets."""

from __future__ import annotations

import numpy as np


def ranks(lengths: np.ndarray) -> np.ndarray:
    """``concat(arange(n) for n in lengths)`` without a Python loop (int64)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)


def segment_sum(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sum of ``values[offsets[r]:offsets[r+1]]`` for every segment ``r`` (int64; 0 when empty)."""
    cs = np.concatenate(([0], np.cumsum(values, dtype=np.int64)))
    return cs[offsets[1:]] - cs[offsets[:-1]]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values``, sorted, as a 1-d array: ``np.unique(values)`` for plain arrays (of any
    shape: like ``np.unique``, this flattens).

    ``np.unique`` imports ``numpy.ma`` on its first call (to rule out masked arrays): 25-35 ms in every
    process that calls it, which in a scan is every worker and the serial tail after the pass."""
    return dedupe_sorted(np.sort(values, axis=None))


def dedupe_sorted(values: np.ndarray) -> np.ndarray:
    """The distinct values of the sorted 1-d ``values`` (the first of each run of equal ones)."""
    if values.size == 0:
        return values
    keep = np.ones(values.size, dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]
