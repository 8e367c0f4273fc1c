"""axolotl's rule: the ``chat_template`` prompt strategy (axolotl-ai-cloud/axolotl,
``src/axolotl/prompt_strategies/chat_template.py``: ``ChatTemplateStrategy``; checked against the
PyPI release 0.19.0, whose turn finding is newer than the repository snapshot of 2026-07-24).

The defaults of ``StrategyLoader._get_strategy_params``: ``roles_to_train: ["assistant"]``,
``train_on_eos: "turn"``, ``train_on_eot`` = ``train_on_eos``, ``eot_tokens`` = ``[eos_token]``.
``_tokenize_single_prompt`` renders the whole conversation (``apply_chat_template(tokenize=True)``,
no generation prompt), sets every label to -100, and for each turn of a trained role finds the
turn's tokens with ``find_turn`` and trains them: ``labels[start:end]`` = the ids there. Then the
first end-of-turn token (``eot_tokens``) and the first EOS token from ``end`` on, when within 3
tokens of it, are trained (``"turn"``: for trained turns; ``"last"``: only the last one found;
``"all"``: also after untrained turns). The template's ``"\\n"`` after ``<|im_end|>`` is never
trained. Long samples are dropped by default (``excess_length_strategy: drop``); ``truncate``
keeps the first ``sequence_len`` tokens.

``find_turn`` (0.19.0): ``_find_turn_from_text`` renders the whole conversation as text twice more,
with the turn's content replaced by each of two sentinels (``"[[dummy_message]]"``,
``"zzdummymessagezz"``), takes the widest character span where the real render differs, and maps
it to tokens by the offsets of the render's tokenization (``_build_turn_locator``; used when that
tokenization equals ``input_ids``). Else, and in the repository snapshot always,
``_find_turn_from_tokens``: it renders the conversation only up to the turn, with the turn and
with the sentinel, and diffs the tokens from the start and from the end (``locate="tokens"``
here). Rendered only up to the turn, a Qwen history turn is the last message there and keeps its
think block, while the whole conversation drops it: the span lands past the turn, on the next
user message (see ``test_peer_conventions``).

The templates: the tokenizer's own (``chat_template: tokenizer_default``), or for Qwen
``axolotl_qwen_template``: axolotl's ``chat_template: qwen3`` / ``qwen3_5``
(``src/axolotl/utils/chat_templates/templates/qwen3.jinja``, ``qwen3_5.jinja``): the model's
template where a turn after the last user message gets a think block without reasoning only at
``real_last_index`` (default: the last message; Qwen3: rather than at ``loop.last``; Qwen3.5/3.6:
rather than always). Made here from the model's template by that one substitution.
"""

from __future__ import annotations

import bisect

from .models import Model

IGNORE_TOKEN_ID = -100
SENTINELS = ("[[dummy_message]]", "zzdummymessagezz")

# (the model's template's text, axolotl's) per model: the one condition axolotl's template changes.
_SUBSTITUTIONS = {
    "qwen3": ("{%- if loop.last or (not loop.last and reasoning_content) %}",
              "{%- if loop.index0 == real_last_index or (loop.index0 != real_last_index and reasoning_content) %}"),
    "qwen3.6": ("{%- if loop.index0 > ns.last_query_index %}",
                "{%- if loop.index0 > ns.last_query_index and (loop.index0 == real_last_index or reasoning_content) %}"),
}


def axolotl_qwen_template(model: Model) -> str:
    """axolotl's ``qwen3`` (Qwen3) or ``qwen3_5`` (Qwen3.5/3.6) template, made from the model's own
    template by the substitution in ``_SUBSTITUTIONS``."""
    old, new = _SUBSTITUTIONS[model.name]
    template = model.hf.chat_template
    assert template.count(old) == 1, f"{model.name}'s template changed: the rule above no longer applies"
    # axolotl's templates default real_last_index to the last message's index when the caller does not pass it.
    default = "{%- set real_last_index = real_last_index if real_last_index is defined and real_last_index is not none else messages|length - 1 %}"
    return default + template.replace(old, new)


def _render(model: Model, template: str, turns: list[dict], real_last_index: int) -> list[int]:
    return list(model.hf.apply_chat_template(turns, chat_template=template, tokenize=True, return_dict=False,
                                             real_last_index=real_last_index))


def _render_text(model: Model, template: str, turns: list[dict]) -> str:
    return model.hf.apply_chat_template(turns, chat_template=template, tokenize=False, add_generation_prompt=False)


def find_turn_from_text(model: Model, template: str, turns: list[dict], i: int, locator) -> tuple[int, int] | None:
    """``_find_turn_from_text``: diff the whole render against the whole conversation with turn ``i``'s content
    replaced by each sentinel, in characters; the widest span, mapped to tokens by the offsets."""
    text, starts, ends = locator
    spans = []
    for sentinel in SENTINELS:
        dummy = _render_text(model, template, turns[:i] + [{"role": turns[i]["role"], "content": sentinel}] + turns[i + 1:])
        limit = min(len(text), len(dummy))
        a = next((k for k in range(limit) if text[k] != dummy[k]), limit)
        tail = next((k for k in range(limit - a) if text[-1 - k] != dummy[-1 - k]), limit - a)
        spans.append((a, len(text) - tail))
    a, b = min(s for s, _ in spans), max(e for _, e in spans)
    if b <= a:
        return -1, -1
    start, end = bisect.bisect_right(ends, a), bisect.bisect_left(starts, b)
    if start >= len(ends) or end > len(ends):
        return None
    return start, end


def find_turn_from_tokens(model: Model, template: str, turns: list[dict], i: int) -> tuple[int, int] | None:
    """``_find_turn_from_tokens``: the conversation up to turn ``i`` rendered with the turn and with the first
    sentinel, diffed in tokens from the start and from the end."""
    last = len(turns) - 1
    dummy = _render(model, template, turns[:i] + [{"role": turns[i]["role"], "content": SENTINELS[0]}], last)
    full = _render(model, template, turns[: i + 1], last)
    n = min(len(dummy), len(full))
    start = next((k for k in range(n) if dummy[k] != full[k]), None)
    end = next((len(full) - k for k in range(n) if dummy[len(dummy) - 1 - k] != full[len(full) - 1 - k]), None)
    if start is None or end is None:
        return None
    return start, end


def find_turn(model: Model, template: str, turns: list[dict], i: int, locator=None) -> tuple[int, int]:
    """``ChatTemplateStrategy.find_turn``: the turn's token span [start, end), or (-1, -1)."""
    span = find_turn_from_text(model, template, turns, i, locator) if locator is not None else None
    if span is None:
        span = find_turn_from_tokens(model, template, turns, i)
    if span is None or -1 in span or span[1] <= span[0]:
        return -1, -1
    return span


def turn_locator(model: Model, template: str, turns: list[dict], input_ids: list[int]):
    """``_build_turn_locator``: the whole render's text and its tokens' character offsets, or None when the
    text does not re-tokenize to ``input_ids`` (then turns are found by the token diff)."""
    text = _render_text(model, template, turns)
    enc = model.hf(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != list(input_ids):
        return None
    return text, [a for a, _ in enc["offset_mapping"]], [b for _, b in enc["offset_mapping"]]


def axolotl(model: Model, messages: list[dict], template: str | None = None, roles_to_train=("assistant",),
            train_on_eos: str = "turn", train_on_eot: str | None = None, eot_tokens: list[str] | None = None,
            sequence_len: int | None = None, locate: str = "text") -> tuple[list[int], list[int]]:
    """axolotl's rule (see the module docstring): ``(input_ids, labels)``; ``sequence_len`` truncates
    (``excess_length_strategy: truncate``); ``locate="tokens"``: find turns by the token diff only (the
    fallback; the only way before the character diff)."""
    template = template or model.template()
    train_on_eot = train_on_eos if train_on_eot is None else train_on_eot
    eot_ids = set()
    for tok in eot_tokens if eot_tokens is not None else [model.hf.eos_token]:
        ids = model.encode(tok)
        if len(ids) == 1:
            eot_ids.add(ids[0])
    eos_id = model.hf.eos_token_id
    input_ids = _render(model, template, messages, len(messages) - 1)
    labels = [IGNORE_TOKEN_ID] * len(input_ids)
    locator = turn_locator(model, template, messages, input_ids) if locate == "text" else None

    def first(ids, start):
        return next((k for k in range(start, len(input_ids)) if input_ids[k] in ids), -1)

    last_idx = {"eot": -1, "eos": -1}
    for i, turn in enumerate(messages):
        train = turn["role"] in roles_to_train
        if not train and train_on_eos != "all" and train_on_eot != "all":
            continue
        start, end = find_turn(model, template, messages, i, locator)
        if train and start != -1:
            labels[start:end] = input_ids[start:end]
        for kind, ids, option in (("eot", eot_ids, train_on_eot), ("eos", {eos_id}, train_on_eos)):
            k = first(ids, end)
            if k != -1 and abs(k - end) <= 3:
                last_idx[kind] = k
                if option == "all" or (option == "turn" and train):
                    labels[k] = input_ids[k]
    for kind, option in (("eot", train_on_eot), ("eos", train_on_eos)):
        if option == "last" and last_idx[kind] != -1:
            labels[last_idx[kind]] = input_ids[last_idx[kind]]
    if sequence_len is not None:
        input_ids, labels = input_ids[:sequence_len], labels[:sequence_len]
    return input_ids, labels
