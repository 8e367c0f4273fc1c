"""Regen prompts are the sample's own tokens up to its last assistant header, on real Qwen3 renderings."""

from __future__ import annotations

import numpy as np
import pytest

from chatdata import ASSISTANT, IM_END, IM_START, NL, NLNL, THINK, END_THINK, render, tokenizer
from dqa.regen.jobs.prompts import NO_HEADER, chatml_messages, prompt_ends, sample_seed

HEADER = (IM_START, ASSISTANT, NL)


def _ends(rows: list[list[int]]) -> np.ndarray:
    ids = np.concatenate([np.asarray(r, np.int32) for r in rows])
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return prompt_ends(ids, offsets, HEADER)


def _generation_prompt(messages: list[dict]) -> list[int]:
    tok = tokenizer()
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_empty_think_prefill_is_dropped_and_the_prompt_is_the_thinking_generation_prompt():
    msgs = [{"role": "user", "content": "Why is the sky blue?"}, {"role": "assistant", "content": "OK."}]
    ids, _ = render(msgs, enable_thinking=False)
    assert ids[-8:-1] == [THINK, NLNL, END_THINK, NLNL, 3925, 13, IM_END]  # the seed's degenerate sample
    end = int(_ends([ids])[0])
    assert ids[:end] == _generation_prompt(msgs[:-1])
    assert ids[end - 3 : end] == list(HEADER)


def test_multi_turn_keeps_history_and_cuts_at_the_last_assistant_header():
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "<think>\nSomething not 7.\n</think>\n\n11"},
    ]
    ids, _ = render(msgs)
    end = int(_ends([ids])[0])
    assert ids[:end] == _generation_prompt(msgs[:-1])
    assert ids[:end].count(IM_START) == 5  # system, user, assistant, user, the open header


def test_row_without_an_assistant_turn_has_no_prompt():
    ids, _ = render([{"role": "user", "content": "Hello"}])
    assert _ends([ids])[0] == NO_HEADER


def test_rows_are_independent_and_a_header_never_spans_two_rows():
    a = [IM_START, ASSISTANT]  # a header cut in half at the row boundary
    b = [NL, 5, 6]
    c, _ = render([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])
    ends = _ends([a, b, c, []])
    assert ends[0] == NO_HEADER and ends[1] == NO_HEADER and ends[3] == NO_HEADER
    assert ends[2] == c.index(ASSISTANT) + 2


def test_seed_is_stable_per_sample_and_differs_between_samples():
    assert sample_seed("sample-1") == sample_seed("sample-1")
    assert sample_seed("sample-1") != sample_seed("sample-2")
    assert sample_seed("sample-1", base=1) != sample_seed("sample-1")
    assert 0 <= sample_seed("x") < 2**31


def test_chatml_messages_render_back_to_the_same_prompt_tokens():
    msgs = [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Second question\nwith two lines"},
        {"role": "assistant", "content": "OK."},
    ]
    ids, _ = render(msgs, enable_thinking=False)
    end = int(_ends([ids])[0])
    decoded = chatml_messages(ids[:end], tokenizer(), IM_START, IM_END)
    assert decoded == msgs[:-1]
    assert _generation_prompt(decoded) == ids[:end]


def test_chatml_messages_reject_a_prompt_that_is_not_an_open_assistant_turn():
    ids, _ = render([{"role": "user", "content": "Hello"}])
    with pytest.raises(ValueError):
        chatml_messages(ids, tokenizer(), IM_START, IM_END)
