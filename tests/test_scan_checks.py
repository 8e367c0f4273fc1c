"""Specification of the named checks, on samples rendered with the real Qwen3 chat template.

Each test builds a small set of good conversations plus the broken samples one check is
about, scans it, and states exactly which rows each check flags (and that good rows pass).
"""

from __future__ import annotations

import random

import polars as pl
import pytest

from chatdata import END_THINK, IM_END, IM_START, NLNL, THINK, conversation, render, sentence, to_labels, write_parquet
from dqa.audit.scan import ScanOptions, run_scan



def good_rows(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """``n`` distinct, clean thinking samples."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        q = f"Question {i}: {sentence(rng, 8)}"
        rows.append(render(conversation(q, sentence(rng, 30), sentence(rng, 20))))
    return rows


def scan_rows(tmp_path, rows, **options):
    """Write ``rows`` as a parquet set in ``tmp_path`` and scan it with ``options``."""
    path = write_parquet(tmp_path / "set.parquet", rows, ids=[f"s{i}" for i in range(len(rows))])
    return run_scan(path, tmp_path / "out", ScanOptions(**options))


def flagged(result, check: str) -> list[int]:
    return result.metrics.filter(pl.col(check))["row"].to_list()


def test_clean_thinking_set_has_no_findings(tmp_path):
    result = scan_rows(tmp_path, good_rows(40))
    assert result.findings.height == 0
    assert result.summary["thinking_expected"] is True
    assert result.summary["failing_share"] == 0.0


def test_ok_mode_is_a_degenerate_template_reported_decoded(tmp_path):
    rng = random.Random(1)
    ok = [render(conversation(f"Ask {i}: {sentence(rng, 6)}", None, "OK."), enable_thinking=False) for i in range(20)]
    result = scan_rows(tmp_path, good_rows(40) + ok)
    bad = list(range(40, 60))
    assert flagged(result, "degenerate_template") == bad
    # The OK. rows are also short and have empty thinking; nothing else is flagged.
    assert set(result.findings["row"].to_list()) == set(bad)
    top = result.summary["degenerate_templates"][0]
    assert top["text"] == "<think>\n\n</think>\n\nOK.<|im_end|>"
    assert (top["tokens"], top["count"]) == (7, 20)
    assert top["share"] == pytest.approx(20 / 60)


def test_degenerate_threshold_is_a_share_and_a_minimum_count(tmp_path):
    rng = random.Random(2)
    ok = [render(conversation(f"Ask {i}: {sentence(rng, 6)}", "x y z", "Fine then.")) for i in range(9)]
    result = scan_rows(tmp_path, good_rows(30) + ok)
    # 9 identical responses (< min_rows 10) are duplicates, not a degenerate template.
    assert flagged(result, "degenerate_template") == []
    assert flagged(result, "duplicate_response") == list(range(30, 39))
    lowered = scan_rows(tmp_path, good_rows(30) + ok, overrides={"degenerate_template": {"min_rows": 5}})
    assert flagged(lowered, "degenerate_template") == list(range(30, 39))


def test_same_response_to_different_prompts_is_a_duplicate(tmp_path):
    rng = random.Random(3)
    answer, thinking = sentence(rng, 25), sentence(rng, 15)
    dups = [render(conversation(f"Different question {i}?", thinking, answer)) for i in range(2)]
    same_prompt = render(conversation("Same question?", thinking, sentence(rng, 25)))
    result = scan_rows(tmp_path, good_rows(30) + dups + [same_prompt, same_prompt])
    assert flagged(result, "duplicate_response") == [30, 31]


def test_short_response_counts_content_without_boilerplate(tmp_path):
    short = render(conversation("Is it raining?", "Look outside", "Yes."))
    result = scan_rows(tmp_path, good_rows(30) + [short])
    assert flagged(result, "short_response") == [30]
    row = result.metrics.row(30, named=True)
    # "Look outside" (2) + "Yes." (2): think tags, blank lines and <|im_end|> are not content.
    assert row["content_tokens"] == 4
    assert flagged(scan_rows(tmp_path, good_rows(30) + [short], overrides={"short_response": {"min_content_tokens": 3}}), "short_response") == []


def test_empty_thinking_when_the_set_thinks(tmp_path):
    rng = random.Random(4)
    empty = [render(conversation(f"Explain {i}", None, sentence(rng, 20)), enable_thinking=False) for i in range(3)]
    result = scan_rows(tmp_path, good_rows(30) + empty)
    assert flagged(result, "empty_thinking") == [30, 31, 32]
    assert set(result.findings["row"].to_list()) == {30, 31, 32}


def test_a_set_that_never_thinks_is_not_flagged_for_thinking_unless_told(tmp_path):
    rng = random.Random(5)
    rows = [render(conversation(f"Q{i} {sentence(rng, 5)}", None, sentence(rng, 20)), enable_thinking=False) for i in range(30)]
    inferred = scan_rows(tmp_path, rows)
    assert inferred.summary["thinking_expected"] is False
    assert inferred.findings.height == 0
    told = scan_rows(tmp_path, rows, thinking="expected")
    assert len(flagged(told, "empty_thinking")) == 30


def test_missing_thinking_in_the_final_turn(tmp_path):
    ids, mask = render(conversation("Tell me a fact", "some thought here", "Carbon has six protons in its nucleus, always."))
    cut_from, cut_to = ids.index(THINK), ids.index(END_THINK) + 2  # drop <think> ... </think>\n\n
    ids, mask = ids[:cut_from] + ids[cut_to:], mask[:cut_from] + mask[cut_to:]
    result = scan_rows(tmp_path, good_rows(30) + [(ids, mask)])
    assert flagged(result, "missing_thinking") == [30]
    assert result.findings.filter(pl.col("row") == 30)["reasons"].to_list() == [["missing_thinking"]]


def test_history_turns_without_thinking_are_not_findings(tmp_path):
    rng = random.Random(6)
    rows = []
    for i in range(20):
        msgs = [
            {"role": "user", "content": f"First {i}: {sentence(rng, 5)}"},
            {"role": "assistant", "content": f"<think>\n{sentence(rng, 10)}\n</think>\n\n{sentence(rng, 12)}"},
            {"role": "user", "content": f"Second {i}: {sentence(rng, 5)}"},
            {"role": "assistant", "content": f"<think>\n{sentence(rng, 10)}\n</think>\n\n{sentence(rng, 12)}"},
        ]
        rows.append(render(msgs))
    result = scan_rows(tmp_path, rows)
    assert result.findings.height == 0
    # The rendered history turn really has lost its think block.
    assert all(ids.count(THINK) == 1 for ids, _ in rows)


def test_truncated_generation_without_end_of_turn(tmp_path):
    ids, mask = render(conversation("Long one", sentence(random.Random(7), 40), sentence(random.Random(8), 30)))
    cut = ids.index(END_THINK) - 5  # cut inside the thinking
    answer_cut = len(ids) - 6  # cut inside the answer (drops <|im_end|>\n and a few tokens)
    result = scan_rows(tmp_path, good_rows(30) + [(ids[:cut], mask[:cut]), (ids[:answer_cut], mask[:answer_cut])])
    assert flagged(result, "truncated") == [30, 31]


def test_repetition_loop_in_thinking(tmp_path):
    loop = "Wait, let me recount the apples in the second basket once more. " * 40
    rows = good_rows(30) + [render(conversation("How many apples?", loop, "There are twelve apples in total here."))]
    result = scan_rows(tmp_path, rows)
    assert flagged(result, "repetition_loop") == [30]
    assert result.metrics.row(30, named=True)["ngram_repeat_share"] > 0.9
    assert result.metrics.filter(pl.col("row") < 30)["ngram_repeat_share"].max() < 0.2


def test_mask_over_header_or_user_text_is_misaligned(tmp_path):
    ids, mask = render(conversation("Question about tides", "moon pulls water", "The moon's gravity drives tides daily."))
    header_at = max(i for i in range(len(ids) - 1) if ids[i] == IM_START)
    header_mask = mask.copy()
    header_mask[header_at : header_at + 3] = [1, 1, 1]
    user_mask = [1 if ids[i] != IM_START else 0 for i in range(len(ids))]  # everything trained
    result = scan_rows(tmp_path, good_rows(30) + [(ids, header_mask), (ids, user_mask)])
    assert flagged(result, "mask_misaligned") == [30, 31]
    assert result.metrics.row(30, named=True)["misaligned_tokens"] == 3


def test_no_loss_and_length_mismatch(tmp_path):
    ids, mask = render(conversation("Zero", "thinking about zero", "Zero is the additive identity element."))
    rows = good_rows(30) + [(ids, [0] * len(ids)), (ids, mask[:-1])]
    result = scan_rows(tmp_path, rows)
    assert flagged(result, "no_loss") == [30]
    assert flagged(result, "length_mismatch") == [31]
    assert result.findings.filter(pl.col("row") == 31)["reasons"].to_list() == [["length_mismatch"]]


def test_labels_convention_gives_the_same_findings(tmp_path):
    ok = [render(conversation(f"Ask {i}", None, "OK."), enable_thinking=False) for i in range(12)]
    rows = good_rows(30) + ok
    by_mask = scan_rows(tmp_path, rows)
    labelled = [(ids, to_labels(ids, mask)) for ids, mask in rows]
    path = write_parquet(tmp_path / "labels.parquet", labelled, mask_name="labels")
    by_labels = run_scan(path, tmp_path / "labels-out")
    assert by_labels.summary["convention"] == "labels"
    assert by_labels.findings["row"].to_list() == by_mask.findings["row"].to_list() == list(range(30, 42))


def test_shifted_labels_are_misaligned(tmp_path):
    rows = good_rows(20)
    ids, mask = rows[0]
    labels = to_labels(ids, mask)
    shifted = labels[1:] + [-100]  # the classic off-by-one: labels pre-shifted for the trainer
    path = write_parquet(tmp_path / "x.parquet", [(i, to_labels(i, m)) for i, m in rows[1:]] + [(ids, shifted)], mask_name="labels")
    result = run_scan(path, tmp_path / "out")
    assert flagged(result, "mask_misaligned") == [19]


def test_only_and_skip_select_checks(tmp_path):
    ids, mask = render(conversation("Zero", "thinking about zero", "Zero is the additive identity element."))
    rows = good_rows(30) + [(ids, [0] * len(ids))]
    assert scan_rows(tmp_path, rows, skip=["no_loss"]).findings.height == 0
    assert scan_rows(tmp_path, rows, only=["no_loss"]).findings["row"].to_list() == [30]


def test_boilerplate_sequence_of_the_ok_mode(tmp_path):
    """The 7 supervised tokens of the incident's OK. samples, as the template renders them."""
    ids, mask = render(conversation("hi", None, "OK."), enable_thinking=False)
    supervised = [t for t, m in zip(ids, mask) if m]
    assert supervised == [THINK, NLNL, END_THINK, NLNL, 3925, 13, IM_END]


@pytest.mark.parametrize("seed", range(6))
def test_loops_of_every_period_are_measured(seed):
    """The n-gram sample must not miss short-period loops: periods 2..40 all read as loops,
    and random text does not."""
    import numpy as np

    from dqa.audit.kernels import KernelTables
    from dqa.audit.repeats import _ngram_repeat_share
    from dqa.audit.template import qwen3_preset

    tables = KernelTables.build(qwen3_preset())
    rng = np.random.default_rng(seed)
    rows = [np.tile(rng.integers(0, 150_000, period), 600 // period + 1)[:600] for period in range(2, 41)]
    rows += [rng.integers(0, 150_000, 600) for _ in range(10)]
    bounds = np.concatenate(([0], np.cumsum([len(r) for r in rows])))
    tokens = np.concatenate(rows)
    share = _ngram_repeat_share(tables.mix[tokens], np.flatnonzero(tables.anchor[tokens]), bounds)
    assert (share[:39] > 0.8).all(), share[:39]
    assert (share[39:] < 0.05).all()
