"""Order-sensitive 64-bit hashes of token sequences and of any ranges of them, in wrapping uint64.

A token's hash is ``mix[token]`` (``splitmix64`` of its id, never zero: ``KernelTables.mix``). The
hash of a range ``[lo, hi)`` of a sequence is ``sum_i mix_i * K**i`` with ``i`` counted from the
range start, mixed with the length (``_finish_hash``), so equal token sequences hash equally
whatever batch or row they sit in. The terms ``mix_i * K**i`` are formed once per sequence
(``_weighted``) and any set of ranges is summed from one ``reduceat`` pass (``_RangeSums``); the
global power is divided out with the inverse power (``KernelTables.powers``, built by
``_powers``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from dqa.arrays import sorted_unique

_K = 0x9E3779B97F4A7C15  # odd multiplier of the polynomial sequence hash
_K_INV = pow(_K, -1, 1 << 64)
_A, _B, _C = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0xD6E8FEB86659FD93)


class Powers(Protocol):
    """What the range hashes need of the kernel's tables (``KernelTables.powers``)."""

    def powers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(K**i, K**-i) mod 2**64`` for ``i < n``."""
        ...


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on a uint64 array (a stable, well-mixed hash of each value)."""
    x = x.astype(np.uint64, copy=True)
    x += np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= _A
    x ^= x >> np.uint64(27)
    x *= _B
    x ^= x >> np.uint64(31)
    return x


def _powers(base: int, size: int) -> np.ndarray:
    """``base**i mod 2**64`` for ``i < size`` (wrapping uint64 products), by block doubling:
    ``p[m:2m] = p[:m] * base**m``, a few vector multiplies instead of a serial cumprod."""
    p = np.empty(max(size, 1), dtype=np.uint64)
    p[0] = 1
    m = 1
    while m < size:
        step = min(m, size - m)
        np.multiply(p[:step], np.uint64(pow(base, m, 1 << 64)), out=p[m : m + step])
        m += step
    return p


def _weighted(tokens_mix: np.ndarray, tables: Powers) -> np.ndarray:
    """``mix_i * K**i`` over the sequence: the terms every range hash of it sums."""
    p, _ = tables.powers(tokens_mix.size + 1)
    return np.multiply(tokens_mix, p[: tokens_mix.size])


def _finish_hash(sums: np.ndarray, lo: np.ndarray, hi: np.ndarray, tables: Powers) -> np.ndarray:
    """The 64-bit hash of each range ``[lo, hi)`` from the sum of its weighted terms (``_weighted``):
    the global power is divided out with the inverse power, so that ``i`` counts from the range
    start, and the length is mixed in; 0 for an empty range. Equal sequences hash equally
    wherever they sit."""
    if len(lo) == 0:
        return np.zeros(0, dtype=np.uint64)
    _, p_inv = tables.powers(int(np.max(lo)) + 1)
    lengths = (hi - lo).astype(np.uint64)
    h = splitmix64((sums * p_inv[lo]) ^ (lengths * _C))
    h[lengths == 0] = 0
    return h


class _RangeSums:
    """Wrapping uint64 sums of ``values`` over any ranges whose ends are among ``points``.

    One ``reduceat`` pass over the data gives the sums between consecutive points, a running sum
    over those the prefix ``W(x) = values[:x].sum()`` at every point, and each range is
    ``W(hi) - W(lo)`` (exact in wrapping arithmetic). However many range sets a batch asks for
    (rows, turns, what precedes each turn), the data is read once.
    """

    def __init__(self, values: np.ndarray, points: np.ndarray):
        self.points = sorted_unique(np.concatenate(([0], points)))  # sorted; 0 <= point <= values.size
        self.prefix = np.zeros(self.points.size, dtype=np.uint64)
        inner = self.points[self.points < values.size]
        if inner.size:
            between = np.add.reduceat(values, inner)  # values[p_i:p_i+1], the last to the end
            np.cumsum(between[: self.points.size - 1], out=self.prefix[1:])

    def __call__(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Sum of ``values[lo[r]:hi[r]]`` per range (0 for an empty one); every end must be a point."""
        at = self.prefix
        return at[np.searchsorted(self.points, hi)] - at[np.searchsorted(self.points, lo)]


def _range_hash(sums: _RangeSums, lo: np.ndarray, hi: np.ndarray, tables: Powers) -> np.ndarray:
    """Order-sensitive 64-bit hash of each range ``[lo[r], hi[r])`` of a sequence whose ``_weighted``
    terms ``sums`` adds up: ``sum_i mix_i * K**i`` with ``i`` counted from the range start, mixed
    with the length; 0 for an empty range. Ranges may overlap."""
    return _finish_hash(sums(lo, hi), lo, hi, tables)
