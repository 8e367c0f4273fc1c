"""``dqa.audit.sequence_hash``: the sequence hashes a scan stores (``supervised_hash``, ``prompt_hash``) and the
loop detector's 8-gram hashes, against their definitions computed with Python integers modulo 2**64.

The stored hashes are compared across scans (duplicates, templates, merge), so their values are part of the
format: a faster way of computing them must give the same numbers."""

from __future__ import annotations

import numpy as np
import pytest

from dqa.audit.kernels import KernelTables
from dqa.audit.sequence_hash import PrefixSums, _range_hash
from dqa.audit.template import qwen3_preset

MASK = (1 << 64) - 1
_K = 0x9E3779B97F4A7C15  # the definition's constants, written out: the module's own would follow a change
_C = 0xD6E8FEB86659FD93
TABLES = KernelTables.build(qwen3_preset(decode=False))


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _polynomial(mix: list[int], lo: int, hi: int) -> int:
    """sum_i mix[lo + i] * K**i over the range, i counted from its start."""
    return sum(m * pow(_K, i, 1 << 64) for i, m in enumerate(mix[lo:hi])) & MASK


@pytest.fixture
def mix() -> np.ndarray:
    ids = np.random.default_rng(7).integers(0, 151_000, 300)
    return TABLES.mix[ids]


def test_a_stored_hash_is_the_documented_polynomial_mixed_with_the_length(mix):
    values = [int(v) for v in mix]
    lo = np.array([0, 5, 17, 40, 299, 120], dtype=np.int64)
    hi = np.array([300, 5, 60, 41, 300, 250], dtype=np.int64)  # the whole, an empty range, overlapping ones
    got = _range_hash(PrefixSums(mix, TABLES), lo, hi, TABLES).tolist()
    want = [0 if a == b else _splitmix64(_polynomial(values, a, b) ^ (((b - a) * _C) & MASK)) for a, b in zip(lo.tolist(), hi.tolist())]
    assert got == want
    # and the numbers themselves, as every scan so far has stored them (token ids 1000-1009)
    ten = TABLES.mix[1000:1010]
    assert _range_hash(PrefixSums(ten, TABLES), np.array([0, 3]), np.array([10, 7]), TABLES).tolist() == [
        0x5DE1B6128B6A38E2, 0xAAF1A61E1CC5383C]


def test_equal_token_runs_hash_equally_wherever_they_sit():
    run = TABLES.mix[np.arange(1000, 1050)]
    mix = np.concatenate((TABLES.mix[np.arange(5, 12)], run, TABLES.mix[np.arange(9, 30)], run))
    h = _range_hash(PrefixSums(mix, TABLES), np.array([7, 78]), np.array([57, 128]), TABLES)
    assert h[0] == h[1] != 0


def test_an_8_gram_hash_is_the_polynomial_of_its_eight_tokens(mix):
    values = [int(v) for v in mix]
    pos = np.array([0, 1, 100, 292], dtype=np.int64)  # 292: the last 8-gram
    got = PrefixSums(mix, TABLES).windows(pos, 8).tolist()
    assert got == [_polynomial(values, p, p + 8) for p in pos]
    # computed without the scan's tables (tests, tools): the same numbers
    assert PrefixSums(mix).windows(pos, 8).tolist() == got


def test_an_empty_sequence_has_only_empty_ranges():
    sums = PrefixSums(np.zeros(0, dtype=np.uint64), TABLES)
    assert sums.size == 0 and sums(np.array([0]), np.array([0])).tolist() == [0]
