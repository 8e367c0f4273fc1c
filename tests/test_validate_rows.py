"""The failing rows of a GX result become an int64 array, whatever GX put in its index list."""

from __future__ import annotations

import numpy as np

from dqa.expectations.validate import _int_rows


def test_integer_index_lists_come_back_as_int64():
    out = _int_rows([5, 2, np.int64(9)])
    assert out.dtype == np.int64 and out.tolist() == [5, 2, 9]
    assert _int_rows([]).dtype == np.int64 and _int_rows([]).size == 0


def test_entries_that_are_not_row_numbers_are_left_out():
    assert _int_rows([{"row": 3}, 4, "x"]).tolist() == [4]
    assert _int_rows([{"row": 3}]).tolist() == []
