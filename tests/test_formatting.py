"""Counts and durations read the same in `dqa plan`, the regen live display and the HTML report."""

from __future__ import annotations

import pytest

from dqa.formatting import human_count, human_duration


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (2_285_000_000, "2.29B"),
        (5_400_000, "5.40M"),
        (129_600_000, "129.6M"),
        (12_913.6, "12.91K"),
        (999_999, "1.00M"),  # not "1000.0K"
        (256, "256"),
        (0.25, "0.25"),
        (12.5, "12.5"),
        (999.7, "1.00K"),
        (0, "0"),
    ],
)
def test_counts_keep_three_significant_digits_and_a_unit(x, text):
    assert human_count(x) == text


def test_axis_labels_drop_trailing_zeros():
    assert [human_count(v, trim=True) for v in (1000, 2_500_000, 1500, 40)] == ["1K", "2.5M", "1.5K", "40"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (1_428_125, "16.5 d"),  # the seed's 914K x 2.5K tokens at 1,600 tok/s
        (163_176, "45.3 h"),
        (150, "2.5 min"),
        (90, "90 s"),
        (0.25, "0.25 s"),
        (0.00006, "0 s"),
        (None, "?"),
    ],
)
def test_durations_use_one_unit(seconds, text):
    assert human_duration(seconds) == text
