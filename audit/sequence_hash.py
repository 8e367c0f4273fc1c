"""Order-sensitive 64-bit hashes of token sequences and of any ranges of them, in wrapping uint64.

A token's hash is ``mix[token]`` (``splitmix64`` of its id, never zero: ``KernelTables.mix``). The
hash of a range ``[lo, hi)`` of a sequence is ``sum_i mix_i * K**i`` with ``i`` counted from the
range start, mixed with the length (``_finish_hash``), so equal token sequences hash equally
whatever batch or row they sit in. The terms ``mix_i * K**i`` are formed once per sequence and
summed into its running sum at every position (``PrefixSums``): any range's sum is two reads, the
global power is divided out with the inverse power (``KernelTables.powers``, built by ``_powers``),
and the loop detector's 8-gram hashes come from the same running sum (``PrefixSums.windows``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

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


def _finish_hash(sums: np.ndarray, lo: np.ndarray, hi: np.ndarray, tables: Powers) -> np.ndarray:
    """The 64-bit hash of each range ``[lo, hi)`` from the sum of its weighted terms (``PrefixSums``):
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


class PrefixSums:
    """The running sum ``W(x) = sum_{i < x} mix_i * K**i`` (wrapping uint64) of a sequence of token hashes
    ``mix``, at every position ``0 <= x <= mix.size``: a range's weighted sum is ``W(hi) - W(lo)`` (exact in
    wrapping arithmetic), and a window's hash ``(W(p + n) - W(p)) * K**-p``. ``tables`` gives the powers
    (``KernelTables.powers``); without it they are computed for this sequence alone (tests, tools).

    One multiply and one running sum over the sequence; every range and window after that is a few reads.
    The loop detector hashes ~1/8 of a batch's positions as 8-gram windows: three reads and a multiply each,
    where eight gathers from the tokens' hashes took ~2.3x as long."""

    def __init__(self, mix: np.ndarray, tables: Powers | None = None):
        n = mix.size
        p, self._inv = tables.powers(n + 1) if tables is not None else (_powers(_K, n + 1), _powers(_K_INV, n + 1))
        self.size = n
        self.prefix = np.empty(n + 1, dtype=np.uint64)
        self.prefix[0] = 0
        np.multiply(mix, p[:n], out=self.prefix[1:])
        np.cumsum(self.prefix[1:], out=self.prefix[1:])

    def __call__(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """``sum_{lo <= i < hi} mix_i * K**i`` per range (0 for an empty one)."""
        return self.prefix[hi] - self.prefix[lo]

    def windows(self, pos: np.ndarray, n: int) -> np.ndarray:
        """The hash ``sum_{k < n} mix[p + k] * K**k`` of the window of ``n`` tokens at each ``p`` in ``pos``
        (all in range): equal windows hash equally wherever they start."""
        h = self.prefix[pos + n]
        h -= self.prefix[pos]
        h *= self._inv[pos]
        return h


def _range_hash(sums: PrefixSums, lo: np.ndarray, hi: np.ndarray, tables: Powers) -> np.ndarray:
    """Order-sensitive 64-bit hash of each range ``[lo[r], hi[r])`` of the sequence ``sums`` holds:
    ``sum_i mix_i * K**i`` with ``i`` counted from the range start, mixed with the length; 0 for an
    empty range. Ranges may overlap."""
    return _finish_hash(sums(lo, hi), lo, hi, tables)
