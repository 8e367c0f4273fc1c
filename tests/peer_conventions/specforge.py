"""SpecForge's rule: ``GeneralParser.parse`` (sgl-project/SpecForge, ``specforge/data/parse.py``).

Render the whole conversation with the chat template (``add_generation_prompt=False``; the
``thinking`` parser passes ``enable_thinking=True``), find the assistant spans with the regex
``escape(assistant_header) + r"([\\s\\S]*?(?:" + escape(end_of_turn_token) + "|$))"`` over the
rendered text, and set the mask from ``len(encode(text[:span start]))`` to
``len(encode(text[:span end]))``: everything after the header through the end-of-turn string,
which for Qwen is ``"<|im_end|>\\n"`` (the newline is trained). ``max_length`` truncates the
tokens (a long sample loses its end); ``train_only_last_turn`` keeps the last span. The
templates' strings (``SPECFORGE``) are SpecForge's registry entries (``specforge/data/template.py``):
``qwen3-thinking``, ``qwen3.5`` (its header includes ``<think>\\n``), ``llama3``, ``deepseek-v3``,
``glm-5.2`` and MiniMax's (pull request #534's ``minimax-m2.5``/``minimax-m2.7``, used here for MiniMax-M3).

SpecForge's GLM rule (``GLMParser`` and the ``glm`` assistant pattern): render with
``enable_thinking=False`` unless given, match ``escape("<|assistant|><think>") + "(?:</think>)?" +
"([\\s\\S]*?(?:" + escape("<|user|>") + "|$))"`` (the turn runs to the next user token or the end of
the text), mask the groups as above, then zero every ``ignore_token`` (``<|user|>``) found in the text,
positioned by prefix encoding the same way. A parser's ``system_prompt`` (MiniMax's "You are a helpful
assistant.") is put first when the conversation has no system message of its own.
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
    "glm-5.2": ("<|assistant|><think>", "<|user|>", "glm"),  # "glm-5.2"
    "minimax-m3": ("]~b]ai\n", "[e~[\n", "general"),  # "minimax-m2.5" / "minimax-m2.7" (PR #534)
}
# The registry entries' system_prompt, for the entries above that dqa's tests give one (None elsewhere), and ignore_token.
SYSTEM_PROMPT = {"minimax-m3": "You are a helpful assistant."}
IGNORE_TOKENS = {"glm-5.2": ("<|user|>",)}


def specforge(model: Model, messages: list[dict], max_length: int = 100_000, train_only_last_turn: bool = False) -> tuple[list[int], list[int]]:
    """SpecForge's rule (see the module docstring): regex spans over the rendered text, prefix-encoded positions."""
    header, eot, parser = SPECFORGE[model.name]
    kwargs = {"enable_thinking": True} if parser == "thinking" else {"enable_thinking": False} if parser == "glm" else {}
    if SYSTEM_PROMPT.get(model.name) and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": SYSTEM_PROMPT[model.name]}, *messages]
    text = model.render(messages, **kwargs)
    ids = model.encode(text)[:max_length]
    return ids, specforge_mask(model, text, ids, train_only_last_turn)


def specforge_mask(model: Model, text: str, ids: list[int], train_only_last_turn: bool = False) -> list[int]:
    """SpecForge's loss mask of a rendered ``text`` whose (possibly cut) tokens are ``ids``: the regex spans and
    the ignore tokens, positioned by prefix encoding (see the module docstring)."""
    header, eot, parser = SPECFORGE[model.name]
    mask = [0] * len(ids)
    optional_close = r"(?:</think>)?" if parser == "glm" else ""
    pattern = re.escape(header) + optional_close + r"([\s\S]*?(?:" + re.escape(eot) + "|$))"
    matches = list(re.finditer(pattern, text, re.DOTALL))
    if train_only_last_turn and matches:
        matches = matches[-1:]
    for m in matches:
        a = min(len(model.encode(text[: m.start(1)])), len(ids))
        b = min(len(model.encode(text[: m.end(1)])), len(ids))
        mask[a:b] = [1] * (b - a)
    for token in IGNORE_TOKENS.get(model.name, ()):
        for m in re.finditer(re.escape(token), text):
            a = min(len(model.encode(text[: m.start()])), len(ids))
            b = min(len(model.encode(text[: m.end()])), len(ids))
            mask[a:b] = [0] * (b - a)
    return mask
