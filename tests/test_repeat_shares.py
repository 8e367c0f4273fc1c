"""The loop detector's one-sort labelling of sampled 8-grams equals counting rows and turns apart.

``_row_and_turn_repeat_shares`` labels each sampled 8-gram with the row and turn that hold it whole
from a step function evaluated only where rows and turns start and stop holding 8-grams; the two-sort
path (kept for batches whose indices do not fit the sort key) assigns every 8-gram by its own
binary searches. Both must give the same shares for any rows, gaps, short rows and turns.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dqa.audit import repeats
from dqa.audit.repeats import NGRAM, _anchor_ngrams, _row_and_turn_repeat_shares, _row_and_turn_repeat_shares_by_two_sorts
from dqa.audit.sequence_hash import PrefixSums, splitmix64


def _layout(seed: int, n_rows: int, loops: bool):
    """Rows (with gaps between them), turns inside rows, and a token sequence with some repeats."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 60, n_rows)
    gaps = rng.integers(0, 4, n_rows) * rng.integers(0, 2, n_rows)
    lo = np.cumsum(gaps + np.r_[0, lengths[:-1]])  # row r starts after row r - 1 and its gap
    hi = lo + lengths
    size = int(hi[-1]) if n_rows else 0
    vocab = 6 if loops else 5000  # a small vocabulary repeats 8-grams
    tokens = rng.integers(0, vocab, size)
    t_lo, t_hi, t_row = [], [], []
    for r in range(n_rows):  # a test fixture: a loop over a few dozen rows
        cut = np.sort(rng.integers(lo[r], hi[r] + 1, 2 * int(rng.integers(0, 3))))
        for a, b in zip(cut[0::2], cut[1::2]):
            t_lo.append(a), t_hi.append(b), t_row.append(r)
    as_int = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return tokens, as_int(lo), as_int(hi), as_int(t_lo), as_int(t_hi), as_int(t_row)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 40), st.booleans(), st.sampled_from([2, 5, repeats.SORT_BLOCK]))
def test_one_sort_equals_two_sorts(seed, n_rows, loops, block):
    """Also with the one sort made in blocks of a few keys (``SORT_BLOCK``), so that rows span several blocks'
    worth of keys and blocks hold several rows."""
    tokens, lo, hi, t_lo, t_hi, t_row = _layout(seed, n_rows, loops)
    old, repeats.SORT_BLOCK = repeats.SORT_BLOCK, block
    try:
        _check_one_sort_equals_two_sorts(tokens, lo, hi, t_lo, t_hi, t_row)
    finally:
        repeats.SORT_BLOCK = old


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=30), st.integers(1, 64), st.integers(0, 2**32 - 1))
def test_sorting_by_row_blocks_sorts_the_whole_array(per_row, block, seed):
    rng = np.random.default_rng(seed)
    counts = np.asarray(per_row, dtype=np.int64)
    rows = np.repeat(np.arange(counts.size, dtype=np.uint64), counts)
    key = (rows << np.uint64(40)) | rng.integers(0, 1 << 40, rows.size, dtype=np.uint64)
    old, repeats.SORT_BLOCK = repeats.SORT_BLOCK, block
    try:
        repeats._sort_by_row_blocks(key, counts)
    finally:
        repeats.SORT_BLOCK = old
    assert np.array_equal(key, np.sort(key))


def _check_one_sort_equals_two_sorts(tokens, lo, hi, t_lo, t_hi, t_row):
    tables_mix = splitmix64(np.arange(5000, dtype=np.uint64)) | np.uint64(1)
    mix = tables_mix[tokens]
    seq = PrefixSums(mix)
    pos, h = _anchor_ngrams(seq, np.flatnonzero(mix < (np.uint64(1) << repeats.ANCHOR_SHIFT)))
    one = _row_and_turn_repeat_shares(seq, pos, h, lo, hi, t_lo, t_hi, t_row)
    two = _row_and_turn_repeat_shares_by_two_sorts(seq, pos, h, lo, hi, t_lo, t_hi, t_row)
    assert np.allclose(one[0], two[0]) and np.allclose(one[1], two[1])
    assert np.array_equal(one[2], two[2]) and np.array_equal(one[3], two[3])  # the longest repeated stretches


def test_a_loop_inside_one_turn_is_that_turns_and_its_rows():
    loop = np.tile(np.arange(10, 30), 10)  # a 20-token loop, 200 tokens
    tokens = np.r_[np.arange(1000, 1300), loop, np.arange(2000, 2300)]
    mix = (splitmix64(np.arange(3000, dtype=np.uint64)) | np.uint64(1))[tokens]
    every = np.arange(tokens.size - NGRAM + 1)  # every start an anchor: exact shares
    seq = PrefixSums(mix)
    pos, h = every, repeats._hash_ngrams(seq, every)
    lo, hi = np.array([0]), np.array([tokens.size])
    t_lo, t_hi, t_row = np.array([0, 300, 500]), np.array([300, 500, 800]), np.array([0, 0, 0])
    rows, turns, row_stretch, turn_stretch = _row_and_turn_repeat_shares(seq, pos, h, lo, hi, t_lo, t_hi, t_row)
    assert turns[0] == 0 and turns[2] == 0
    assert turns[1] == (200 - NGRAM + 1 - 20) / (200 - NGRAM + 1)  # all but the first period repeat
    assert rows[0] == (200 - NGRAM + 1 - 20) / (tokens.size - NGRAM + 1)
    # the stretch is the whole loop, its first period included: 8-grams from its start to the last one inside it
    assert turn_stretch.tolist() == [0, 200, 0] and row_stretch.tolist() == [200]
