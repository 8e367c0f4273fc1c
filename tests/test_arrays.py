"""``dqa.arrays``: the numpy building blocks the kernels and the scan's tail share."""

from __future__ import annotations

import numpy as np
import pytest

from dqa.arrays import sorted_unique


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32])
@pytest.mark.parametrize("size", [0, 1, 2, 7, 1000])
def test_sorted_unique_gives_what_np_unique_gives(dtype, size):
    values = np.random.default_rng(size).integers(0, max(size // 3, 1), size).astype(dtype)
    got = sorted_unique(values)
    assert got.dtype == dtype and np.array_equal(got, np.unique(values))


def test_sorted_unique_leaves_its_input_alone():
    values = np.array([3, 1, 3, 2], dtype=np.int64)
    assert sorted_unique(values).tolist() == [1, 2, 3] and values.tolist() == [3, 1, 3, 2]


@pytest.mark.parametrize("values", [np.array(5), np.array([[3, 1], [1, 2]]), np.zeros((0, 3), dtype=np.int64)])
def test_sorted_unique_flattens_what_is_not_1d_as_np_unique_does(values):
    got = sorted_unique(values)
    assert got.ndim == 1 and np.array_equal(got, np.unique(values))
