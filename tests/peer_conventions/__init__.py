"""Training samples built by other tools' rules, not by dqa's renderer: the data dqa must read right.

Each builder turns a conversation (OpenAI-style ``messages``) into token rows the way one
public tool does, with a real tokenizer and chat template (``models``: transformers'
``AutoTokenizer`` on the PyPI packages' tokenizer files); one module per tool, its docstring
naming the source files whose rule it follows:

- ``specforge`` (sgl-project/SpecForge): regex spans over the rendered text; ``(input_ids, loss_mask)``.
- ``speculators`` (vllm-project/speculators): one row per assistant turn, masked from the
  render boundary; ``(input_ids, loss_mask)``.
- ``trl`` (huggingface/trl): ``SFTTrainer(assistant_only_loss=True)``: TRL's training chat
  template's ``{% generation %}`` blocks, ``return_assistant_tokens_mask``; ``(input_ids, labels)``.
- ``llamafactory`` (hiyouga/LLaMA-Factory): the supervised processor's per-turn (source,
  target) pairs from the template's slots; ``(input_ids, labels)``.
- ``axolotl`` (axolotl-ai-cloud/axolotl): the ``chat_template`` strategy's token diff against a
  dummy render; ``(input_ids, labels)``.

``build_rows(tool, model, messages)`` gives the rows a tool makes of one conversation and
``SUPERVISION[tool]`` the column it writes them to (``loss_mask`` or ``labels``, -100 untrained).
"""

from __future__ import annotations

from .axolotl import axolotl, axolotl_qwen_template
from .llamafactory import llamafactory
from .models import LLAMA3_TEMPLATE, TOKENIZER_OF, Model, load_model, package_dir, tokenizer_folder
from .specforge import SPECFORGE, specforge, specforge_mask
from .speculators import speculators
from .trl import trl

# axolotl's configuration per model, as its examples and docs give it: Qwen3 with ``chat_template: qwen3``
# (examples/qwen3/*.yaml), Qwen3.6 with ``qwen3_5``; Llama 3 with ``eot_tokens: ["<|eot_id|>"]`` (docs/dataset-formats/conversation.qmd:
# set it when the template's end of turn is not the EOS token; Llama 3.2's PyPI tokenizer's EOS is <|end_of_text|>).
# The others: the tokenizer's own template and the defaults.
AXOLOTL_CONFIG = {"llama3": {"eot_tokens": ["<|eot_id|>"]}}


def axolotl_config(model: Model) -> dict:
    if model.name in ("qwen3", "qwen3.6"):
        return {"template": axolotl_qwen_template(model)}
    return dict(AXOLOTL_CONFIG.get(model.name, {}))


SUPERVISION = {"specforge": "loss_mask", "speculators": "loss_mask", "trl": "labels", "llamafactory": "labels", "axolotl": "labels"}


def build_rows(tool: str, model: Model, messages: list[dict], max_length: int = 100_000) -> list[tuple[list[int], list[int]]]:
    """The rows ``tool`` makes of one conversation, each cut to ``max_length`` tokens by the tool's own
    means (SpecForge, TRL and axolotl keep the first tokens; LLaMA-Factory's ``cutoff_len`` shares the
    room between prompt and reply; speculators cuts each row)."""
    if tool == "specforge":
        return [specforge(model, messages, max_length)]
    if tool == "speculators":
        return speculators(model, messages, max_length)
    if tool == "trl":
        return [trl(model, messages, max_length)]
    if tool == "llamafactory":
        return [llamafactory(model, messages, cutoff_len=max_length)]
    if tool == "axolotl":
        return [axolotl(model, messages, sequence_len=max_length, **axolotl_config(model))]
    raise ValueError(f"unknown tool {tool!r}")


__all__ = ["LLAMA3_TEMPLATE", "SPECFORGE", "TOKENIZER_OF", "SUPERVISION", "Model", "axolotl", "axolotl_config", "axolotl_qwen_template", "build_rows", "llamafactory", "load_model",
           "package_dir", "specforge", "specforge_mask", "speculators", "tokenizer_folder", "trl"]
