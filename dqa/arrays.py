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
