"""SpecForge's rule: ``GeneralParser.parse`` (sgl-project/SpecForge, ``specforge/data/parse.py``).

Render the whole conversation with the chat template (``add_generation_prompt=False``; the
``thinking`` parser passes ``enable_thinking=True``), find the assistant spans with the regex
``escape(assistant_header) + r"([\\s\\S]*?(?:" + escape(end_of_turn_token) + "|$))"`` over the
rendered text, and set the mask from ``len(encode(text[:span start]))`` to
``len(encode(text[:span end]))``: everything after the header through the end-of-turn string,
which for Qwen is ``"<|im_end|>\\n"`` (the newline is trained). ``max_length`` truncates the
tokens (a long sample loses its end); ``train_only_last_turn`` keeps the last span. The
templates' strings (``SPECFORGE``) are SpecForge's registry entries (``specforge/data/template.py``):
``qwen3-thinking``, ``qwen3.5`` (its header includes ``<think>\\n``), ``llama3`` and ``deepseek-v3``.
"""

from __future__ import annotations

import re

from .models import Model

# SpecForge's ChatTemplate strings (specforge/data/template.py): (assistant_header, end_of_turn_token, parser).
SPECFORGE = {
    "qwen3": ("<|im_start|>assistant\n", "<|im_end|>\n", "thinking"),  # "qwen3-thinking"
    "qwen3.6": ("<|im_start|>assistant\n<think>\n", "<|im_end|>\n", "thinking"),  # "qwen3.5"
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", "general"),  # "llama3"
    "deepseek-v3": ("<｜Assistant｜>", "<｜end▁of▁sentence｜>", "general"),  # "deepseek-v3"
}


def specforge(model: Model, messages: list[dict], max_length: int = 100_000, train_only_last_turn: bool = False) -> tuple[list[int], list[int]]:
    """SpecForge's rule (see the module docstring): regex spans over the rendered text, prefix-encoded positions."""
    header, eot, parser = SPECFORGE[model.name]
    kwargs = {"enable_thinking": True} if parser == "thinking" else {}
    text = model.render(messages, **kwargs)
    ids = model.encode(text)[:max_length]
    mask = [0] * len(ids)
    pattern = re.escape(header) + r"([\s\S]*?(?:" + re.escape(eot) + "|$))"
    matches = list(re.finditer(pattern, text, re.DOTALL))
    if train_only_last_turn and matches:
        matches = matches[-1:]
    for m in matches:
        a = min(len(model.encode(text[: m.start(1)])), len(ids))
        b = min(len(model.encode(text[: m.end(1)])), len(ids))
        mask[a:b] = [1] * (b - a)
    return ids, mask
