"""The scan's sparse count of trained tokens equals the dense prefix sum it replaced.

``_TrainedCounts`` answers "how many trained tokens before position p" and "where is the last
trained token before e" from the runs of equal mask values; both answers must equal those of
``cumsum(mask)`` for every position, whatever the runs (first run trained or not, one run, none).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dqa.audit.kernels import _TrainedCounts


def dense(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference: counts ``[0, c0, c0+c1, ...]`` and, per end ``e``, the last trained position before it."""
    cs = np.r_[0, np.cumsum(mask, dtype=np.int64)]
    last = np.searchsorted(cs, cs, side="left") - 1
    return cs, last


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), max_size=200), st.floats(0.0, 1.0))
def test_counts_and_last_trained_position_equal_the_dense_prefix_sum(bits, density):
    rng = np.random.default_rng(len(bits))
    mask = np.asarray(bits, dtype=bool) | (rng.random(len(bits)) < density * 0.5)
    counts = _TrainedCounts(mask)
    cs, last = dense(mask.astype(np.uint8))
    p = np.arange(mask.size + 1)
    assert counts[p].tolist() == cs.tolist()
    assert counts.last_before(p).tolist() == last.tolist()


def test_edge_masks_equal_the_dense_prefix_sum():
    mostly = np.ones(50, dtype=bool)
    mostly[[0, 1, 7, 8, 9, 49]] = False
    alternating = np.arange(9) % 2 == 0
    cases = (mostly, ~mostly, alternating, ~alternating, np.zeros(0, dtype=bool), np.zeros(1, dtype=bool),
             np.ones(1, dtype=bool), np.zeros(5, dtype=bool), np.ones(5, dtype=bool))
    for mask in cases:
        cs, last = dense(mask.astype(np.uint8))
        p = np.arange(mask.size + 1)
        assert _TrainedCounts(mask)[p].tolist() == cs.tolist()
        assert _TrainedCounts(mask).last_before(p).tolist() == last.tolist()


def test_runs_are_few_for_a_chat_mask():
    """A trained span per turn is two runs, whatever its length: the counts' size follows turns, not tokens."""
    mask = np.zeros(10_000, dtype=bool)
    for a in (100, 3_000, 7_000):
        mask[a : a + 900] = True
    assert _TrainedCounts(mask).starts.size == 7
