"""LLaMA-Factory's rule: the supervised processor (hiyouga/LLaMA-Factory).

``src/llamafactory/data/processor/supervised.py`` (``SupervisedDatasetProcessor._encode_data_example``):
``template.encode_multiturn`` cuts the conversation into (source, target) pairs, one per
user/assistant round; each pair is cut to fit ``cutoff_len`` by ``infer_seqlen``
(``processor_utils.py``); labels are -100 over every source and the target's ids over every
target (``train_on_prompt=False``), or -100 over all but the last target with
``mask_history=True`` (the pairs then taken from the last one back). ``efficient_eos`` is off
for these templates.

``src/llamafactory/data/template.py``: each message becomes the template's slots, and each
string slot is tokenized on its own (``tokenizer.encode(slot, add_special_tokens=False)``;
``{"bos_token"}``/``{"eos_token"}`` slots are the token's id), so tokens never merge across a
slot boundary. The templates used (``register_template``):

- ``qwen3`` and ``qwen3_6``: user ``<|im_start|>user\\n{{content}}<|im_end|>\\n<|im_start|>assistant\\n``
  (the assistant header is part of the untrained source), assistant ``{{content}}<|im_end|>\\n``
  (the newline trained), ``ReasoningTemplate`` with thought words ``("<think>\\n", "\\n</think>\\n\\n")``.
  ``ReasoningTemplate.encode_multiturn``: with ``enable_thinking`` (the default) every turn keeps
  its reasoning, and a turn without think tags gets the empty thought ``<think>\\n\\n</think>\\n\\n``
  put before its target (trained); with ``enable_thinking=False`` every turn's reasoning is
  removed and the empty thought goes to the end of the source (untrained); with
  ``mask_history`` (and ``preserve_thinking`` off) the history turns lose their reasoning and
  only the last turn gets the empty thought.
- ``llama3``: prefix ``{"bos_token"}``, user ``<|start_header_id|>user<|end_header_id|>\\n\\n{{content}}<|eot_id|>``
  ``<|start_header_id|>assistant<|end_header_id|>\\n\\n``, assistant ``{{content}}<|eot_id|>``.
- ``deepseek3``: prefix ``{"bos_token"}``, user ``<｜User｜>{{content}}<｜Assistant｜>``, assistant
  the default ``{{content}}`` + ``{"eos_token"}``.
"""

from __future__ import annotations

import re
from copy import deepcopy
from dataclasses import dataclass

from .models import Model

IGNORE_INDEX = -100
BOS, EOS = object(), object()


@dataclass(frozen=True)
class Template:
    prefix: tuple
    user: str
    assistant: tuple
    system: str
    reasoning: bool
    thought_words: tuple[str, str] = ("<think>\n", "\n</think>\n\n")


_QWEN = Template(
    prefix=(),
    user="<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n",
    assistant=("{{content}}<|im_end|>\n",),
    system="<|im_start|>system\n{{content}}<|im_end|>\n",
    reasoning=True,
)
TEMPLATES = {
    "qwen3": _QWEN,
    "qwen3.6": _QWEN,  # "qwen3_6": the same slots
    "llama3": Template(
        prefix=(BOS,),
        user="<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        assistant=("{{content}}<|eot_id|>",),
        system="<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>",
        reasoning=False,
    ),
    "deepseek-v3": Template(
        prefix=(BOS,), user="<｜User｜>{{content}}<｜Assistant｜>", assistant=("{{content}}", EOS), system="{{content}}", reasoning=False
    ),
}


def _ids(model: Model, slots) -> list[int]:
    out: list[int] = []
    for s in slots:
        if s is BOS:
            out.append(model.hf.bos_token_id)
        elif s is EOS:
            out.append(model.hf.eos_token_id)
        elif s:
            out += model.encode(s)
    return out


def _fill(slot, content: str):
    return slot.replace("{{content}}", content, 1) if isinstance(slot, str) else slot


def _encode(model: Model, t: Template, messages: list[dict], system: str | None) -> list[list[int]]:
    """``Template._encode``: one id list per message (the prefix and system go with the first)."""
    out = []
    for i, m in enumerate(messages):
        slots: list = []
        if i == 0:
            slots += t.prefix
            if system:
                slots.append(_fill(t.system, system))
        if m["role"] == "user":
            slots.append(_fill(t.user, m["content"]))
        else:
            slots += [_fill(s, m["content"]) for s in t.assistant]
        out.append(_ids(model, slots))
    return out


def _remove_thought(t: Template, content: str) -> str:
    pattern = re.compile(f"{re.escape(t.thought_words[0])}(.*?){re.escape(t.thought_words[1])}", re.DOTALL)
    return re.sub(pattern, "", content).lstrip("\n")


def encode_multiturn(model: Model, messages: list[dict], system: str | None = None, enable_thinking: bool = True,
                     discarding_history_cot: bool = False) -> list[tuple[list[int], list[int]]]:
    """``Template.encode_multiturn`` / ``ReasoningTemplate.encode_multiturn``: the (source, target) pairs."""
    t = TEMPLATES[model.name]
    messages = deepcopy(messages)
    if not t.reasoning:
        enc = _encode(model, t, messages, system)
        return [(enc[i], enc[i + 1]) for i in range(0, len(enc), 2)]
    if enable_thinking is False:
        for i in range(1, len(messages), 2):
            messages[i]["content"] = _remove_thought(t, messages[i]["content"])
    if discarding_history_cot:
        for i in range(1, len(messages) - 2, 2):
            messages[i]["content"] = _remove_thought(t, messages[i]["content"])
    enc = _encode(model, t, messages, system)
    empty = model.encode(t.thought_words[0] + t.thought_words[1])
    for i in [len(messages) - 2] if discarding_history_cot else range(0, len(messages), 2):
        reply = messages[i + 1]["content"]
        if t.thought_words[0].strip() not in reply and t.thought_words[1].strip() not in reply:
            if not enable_thinking:
                enc[i] = enc[i] + empty
            else:
                enc[i + 1] = empty + enc[i + 1]
    return [(enc[i], enc[i + 1]) for i in range(0, len(enc), 2)]


def infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """``processor_utils.infer_seqlen``."""
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def llamafactory(model: Model, messages: list[dict], cutoff_len: int = 100_000, mask_history: bool = False,
                 enable_thinking: bool = True, preserve_thinking: bool = False, system: str | None = None) -> tuple[list[int], list[int]]:
    """LLaMA-Factory's rule (see the module docstring): ``(input_ids, labels)``."""
    if messages[0]["role"] == "system":
        system, messages = messages[0]["content"], messages[1:]
    pairs = encode_multiturn(model, messages, system, enable_thinking, mask_history and not preserve_thinking)
    if mask_history:
        pairs = pairs[::-1]
    input_ids: list[int] = []
    labels: list[int] = []
    total = 0
    for k, (source, target) in enumerate(pairs):
        if total >= cutoff_len:
            break
        s, t = infer_seqlen(len(source), len(target), cutoff_len - total)
        source, target = source[:s], target[:t]
        total += s + t
        source_label = [IGNORE_INDEX] * s
        target_label = [IGNORE_INDEX] * t if mask_history and k != 0 else target
        if mask_history:
            input_ids, labels = source + target + input_ids, source_label + target_label + labels
        else:
            input_ids, labels = input_ids + source + target, labels + source_label + target_label
    return input_ids, labels
