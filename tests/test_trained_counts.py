"""The scan's sparse count of trained tokens equals the dense prefix sum it replaced.

``_TrainedCounts`` answers "how many trained tokens before position p" and "where is the last
trained token before e" from the positions of the rarer of trained and untrained tokens; both
answers must equal those of ``cumsum(mask)`` for every position, whichever side is rarer.
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


def test_both_representations_are_exercised():
    mostly = np.ones(50, dtype=bool)
    mostly[[0, 1, 7, 8, 9, 49]] = False
    assert _TrainedCounts(mostly).by_untrained and not _TrainedCounts(~mostly).by_untrained
    for mask in (mostly, ~mostly, np.zeros(0, dtype=bool), np.zeros(5, dtype=bool), np.ones(5, dtype=bool)):
        cs, last = dense(mask.astype(np.uint8))
        p = np.arange(mask.size + 1)
        assert _TrainedCounts(mask)[p].tolist() == cs.tolist()
        assert _TrainedCounts(mask).last_before(p).tolist() == last.tolist()
