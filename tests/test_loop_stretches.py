"""A long loop is bad training data whatever else its turn holds: the longest repeated stretch.

``loop_tokens`` (metrics.parquet per sample, turns.parquet per trained turn) is the longest stretch
of supervised tokens covered by 8-grams that each occur more than once in the sample (turn): a
loop's whole extent, its first period included. ``repetition_loop`` flags a turn whose stretch
reaches ``min_loop_tokens`` (default 1,024) as well as one that a repeated 8-gram dominates
(``min_repeat_share``). The sets are built by SpecForge's rule with Qwen3's real tokenizer and
template; the exact, slow definition is checked against the kernel in
``tests/reliability/test_kernel_reference.py``.
"""

from __future__ import annotations

import random

import polars as pl

from chatdata import WORDS, sentence, write_parquet
from peer_conventions import Model, specforge
from dqa.audit.scan import ScanOptions, run_scan

LOOP = "Wait, let me recount the ledger entries from the top once more. "



def reply(thinking: str, answer: str) -> str:
    return f"<think>\n{thinking}\n</think>\n\n{answer}"


def row(model: Model, rng: random.Random, *replies: str) -> tuple[list[int], list[int]]:
    msgs = []
    for k, r in enumerate(replies):
        msgs += [{"role": "user", "content": f"Question {k}: {sentence(rng, 8)}"}, {"role": "assistant", "content": r}]
    return specforge(model, msgs)


def scan(rows, tmp_path, model: Model, **overrides):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_parquet(tmp_path / "set.parquet", rows, ids=[f"s{i}" for i in range(len(rows))])
    return run_scan(path, tmp_path / "out", ScanOptions(tokenizer=str(model.folder), overrides=overrides))


def long_thought(rng: random.Random, words: int) -> str:
    return " ".join(sentence(rng, 12) for _ in range(words // 12))


def loop_tokens_of(model: Model, text: str) -> int:
    return len(model.hf(text, add_special_tokens=False)["input_ids"])


def test_a_6k_token_loop_inside_a_22k_token_thought_is_flagged_by_its_stretch(qwen3, tmp_path):
    """The issue's case: 6K tokens of one sentence inside a 22K-token thought is about a quarter of the
    turn, under min_repeat_share 0.5, but 6K tokens of loop."""
    rng = random.Random(1)
    repeats = 6000 // loop_tokens_of(qwen3, LOOP)
    loop = LOOP * repeats
    thinking = long_thought(rng, 7200) + " " + loop + long_thought(rng, 7200)
    looping = row(qwen3, rng, reply(thinking, sentence(rng, 40)))
    clean = [row(qwen3, rng, reply(long_thought(rng, 600), sentence(rng, 30))) for _ in range(12)]
    result = scan(clean + [looping], tmp_path, qwen3)
    m = result.metrics.row(12, named=True)
    assert m["supervised_tokens"] > 20_000
    assert m["ngram_repeat_share"] < 0.5  # the share alone misses it
    expected = loop_tokens_of(qwen3, loop)
    assert abs(m["loop_tokens"] - expected) <= 64, (m["loop_tokens"], expected)  # the loop's whole extent, within a few 8-grams
    assert result.findings["row"].to_list() == [12]
    assert result.findings["reasons"].to_list() == [["repetition_loop"]]
    turn = pl.read_parquet(result.out_dir / "turns.parquet").filter(pl.col("row") == 12).row(0, named=True)
    assert turn["loop_tokens"] == m["loop_tokens"] and turn["reasons"] == ["repetition_loop"]
    # The clean rows repeat an 8-gram now and then, never over a long stretch.
    assert result.metrics.filter(pl.col("row") < 12)["loop_tokens"].max() < 100


def test_min_loop_tokens_is_a_threshold_like_the_others(qwen3, tmp_path):
    """--set repetition_loop.min_loop_tokens=N: a ~2K-token loop is flagged at the default 1,024 and at a
    limit just under its length, not at 4,000 (where the share, a sixth of the turn, does not flag it either)."""
    rng = random.Random(2)
    loop = LOOP * (2100 // loop_tokens_of(qwen3, LOOP))
    size = loop_tokens_of(qwen3, loop)
    looping = row(qwen3, rng, reply(long_thought(rng, 4000) + " " + loop + long_thought(rng, 4000), sentence(rng, 40)))
    clean = [row(qwen3, rng, reply(long_thought(rng, 300), sentence(rng, 30))) for _ in range(12)]
    for limit, flagged in ((None, True), (size - 100, True), (4000, False)):
        overrides = {} if limit is None else {"repetition_loop": {"min_loop_tokens": limit}}
        result = scan(clean + [looping], tmp_path / str(limit), qwen3, **overrides)
        assert abs(result.metrics.row(12, named=True)["loop_tokens"] - size) <= 64
        assert result.findings["row"].to_list() == ([12] if flagged else []), limit
        assert result.summary["params"]["repetition_loop"]["min_loop_tokens"] == (1024 if limit is None else limit)


def test_a_loop_of_tokens_that_hold_no_sampled_8_gram_is_measured_exactly(qwen3, tmp_path):
    """The share samples 8-grams that start at a fixed 1/8 of the vocabulary; a loop of a sentence whose
    tokens are all outside that eighth has no sampled 8-gram. Its anchor-free stretch is measured on
    every 8-gram, so its length is still found."""
    from dqa.audit.kernels import KernelTables
    from dqa.audit.template import load_template

    anchor = KernelTables.build(load_template(str(qwen3.folder))).anchor
    words = [w for w in WORDS if not any(anchor[t] for t in qwen3.hf(" " + w, add_special_tokens=False)["input_ids"])]
    assert len(words) >= 6
    rng = random.Random(3)
    unit = " " + " ".join(words[:6])  # no full stop: "." might be an anchor
    assert not any(anchor[t] for t in qwen3.hf(unit * 3, add_special_tokens=False)["input_ids"])
    loop = unit * (1500 // loop_tokens_of(qwen3, unit))
    looping = row(qwen3, rng, reply(long_thought(rng, 3000) + loop + " " + long_thought(rng, 3000), sentence(rng, 40)))
    clean = [row(qwen3, rng, reply(long_thought(rng, 300), sentence(rng, 30))) for _ in range(12)]
    result = scan(clean + [looping], tmp_path, qwen3)
    m = result.metrics.row(12, named=True)
    assert abs(m["loop_tokens"] - loop_tokens_of(qwen3, loop)) <= 16, m["loop_tokens"]
    assert result.findings["row"].to_list() == [12] and result.findings["reasons"].to_list() == [["repetition_loop"]]


def test_a_long_loop_in_one_turn_of_three_is_that_turns(qwen3, tmp_path):
    """Per turn: the middle reply of three holds a 1.5K-token loop after 4K tokens of clean text (a quarter of
    that turn): turns.parquet gives that turn the stretch, findings name it, the other turns have none."""
    rng = random.Random(4)
    loop = LOOP * (1500 // loop_tokens_of(qwen3, LOOP))
    replies = [sentence(rng, 200), long_thought(rng, 3000) + " " + loop + long_thought(rng, 1500), sentence(rng, 200)]
    looping = row(qwen3, rng, *replies)
    clean = [row(qwen3, rng, sentence(rng, 200), sentence(rng, 200), sentence(rng, 200)) for _ in range(12)]
    result = scan(clean + [looping], tmp_path, qwen3)
    turns = pl.read_parquet(result.out_dir / "turns.parquet").filter(pl.col("row") == 12).sort("turn")
    stretches = turns["loop_tokens"].to_list()
    assert abs(stretches[1] - loop_tokens_of(qwen3, loop)) <= 64 and stretches[0] < 100 and stretches[2] < 100
    assert turns["ngram_repeat_share"][1] < 0.5
    assert turns["reasons"].to_list() == [[], ["repetition_loop"], []]
    assert result.findings.filter(pl.col("row") == 12)["turns"].to_list() == [[1]]
    assert result.findings["row"].to_list() == [12]
