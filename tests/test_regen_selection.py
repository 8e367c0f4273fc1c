"""Which rows regen takes: the findings' failing rows, narrowed by --reasons, split by --shard, cut by --limit."""

from __future__ import annotations

import numpy as np
import pytest

from dqa.errors import InputError, UsageError
from dqa.regen.config import parse_shard
from dqa.regen.jobs.rows import read_findings, select_rows
from regen_helpers import write_findings


@pytest.fixture()
def findings(tmp_path):
    return write_findings(
        tmp_path / "scan",
        [7, 2, 5, 11],
        [["degenerate_template"], ["empty_thinking", "short_response"], ["truncated"], ["degenerate_template", "truncated"]],
    )


def test_failing_rows_come_sorted_from_findings_file_or_folder(findings):
    assert read_findings(findings, None).tolist() == [2, 5, 7, 11]
    assert read_findings(findings.parent, None).tolist() == [2, 5, 7, 11]


def test_reasons_keep_rows_flagged_by_any_of_them(findings):
    assert read_findings(findings, ["truncated"]).tolist() == [5, 11]
    assert read_findings(findings, ["short_response", "degenerate_template"]).tolist() == [2, 7, 11]
    assert read_findings(findings, ["repetition_loop"]).tolist() == []  # a known check nobody failed


def test_an_unknown_reason_is_an_input_error_naming_it(findings):
    with pytest.raises(InputError, match="degenerate_templat'"):
        read_findings(findings, ["degenerate_templat"])


def test_missing_findings_say_how_to_make_them(tmp_path):
    with pytest.raises(InputError, match="dqa scan"):
        read_findings(tmp_path / "nope", None)


def test_shards_partition_the_rows_deterministically(findings):
    parts = [select_rows(20, findings, True, None, (i, 3), None) for i in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == [2, 5, 7, 11]
    assert all(len(set(a) & set(b)) == 0 for k, a in enumerate(parts) for b in parts[k + 1 :])
    assert select_rows(20, findings, True, None, (1, 3), None).tolist() == parts[1].tolist()


def test_limit_takes_the_first_rows_of_this_shard(findings):
    assert select_rows(20, findings, True, None, (0, 1), 2).tolist() == [2, 5]
    assert select_rows(20, findings, True, None, (1, 2), 1).tolist() == [5]


def test_all_selects_every_row_and_refuses_reasons(findings):
    assert select_rows(4, None, False, None, (0, 1), None).tolist() == [0, 1, 2, 3]
    with pytest.raises(UsageError):
        select_rows(4, None, False, ["truncated"], (0, 1), None)


def test_findings_of_a_longer_dataset_are_refused(findings):
    with pytest.raises(InputError, match="row 11 is past the dataset's end"):
        select_rows(10, findings, True, None, (0, 1), None)


@pytest.mark.parametrize("text", ["3", "1/0", "2/2", "-1/2", "a/b"])
def test_bad_shard_specs_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_shard(text)


def test_shard_spec_parses():
    assert parse_shard("2/8") == (2, 8)
    assert parse_shard(None) == (0, 1)
