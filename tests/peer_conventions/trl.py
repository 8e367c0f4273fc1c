"""TRL's rule: ``SFTTrainer`` with ``assistant_only_loss=True`` (huggingface/trl).

``trl/trainer/sft_trainer.py``: when the tokenizer's chat template has no ``{% generation %}``
markers, ``get_training_chat_template`` (``trl/chat_template_utils.py``) swaps in TRL's training
variant of a template it recognizes (``trl/chat_templates/*_training.jinja``); each conversation
is tokenized by ``apply_chat_template(messages, tokenize=True, return_dict=True,
return_assistant_tokens_mask=True, chat_template=...)`` (``trl/data_utils.py``: ``_tokenize``);
``build_labels`` makes ``labels`` = the id where ``assistant_masks`` is 1, else -100, and
``truncate`` keeps the first ``max_length`` tokens (``truncation_mode="keep_start"``).

The training templates, written here by the rules TRL documents for them
(``trl/chat_templates/README.md`` and each file's header), for conversations of system, user
and assistant messages (no tools):

- ``qwen3_training.jinja`` / ``qwen3_6_training.jinja``: the Qwen3 / Qwen3.6 template with the
  ``loop.index0 > ns.last_query_index`` conditional removed, so every assistant turn keeps its
  think block (``<think>\\n{reasoning}\\n</think>\\n\\n``, empty when the message has none), and
  ``{% generation %}`` around the turn after the header: the header ``<|im_start|>assistant\\n``
  is untrained; ``<think>`` ... ``<|im_end|>\\n`` (the newline too) are trained.
- ``llama3_training.jinja``: header untrained, ``content | trim + '<|eot_id|>'`` trained.
- ``deepseekv3_training.jinja``: ``{% generation %}`` wraps ``'<｜Assistant｜>' + content +
  '<｜end▁of▁sentence｜>'``, the role token included (content after ``</think>``, as DeepSeek V3's
  own template renders it).
"""

from __future__ import annotations

from .models import Model

# Qwen3 and Qwen3.6 (ChatML), by qwen3_training.jinja / qwen3_6_training.jinja's rule.
QWEN_TRAINING = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') + '<|im_end|>\\n' }}{%- endgeneration %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

LLAMA3_TRAINING = (
    "{%- for message in messages %}{%- if loop.index0 == 0 %}{{- bos_token }}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}"
    "{%- else %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

DEEPSEEK_V3_TRAINING = (
    "{%- set ns = namespace(system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{%- set ns.system_prompt = ns.system_prompt + ('\\n\\n' if ns.system_prompt else '') + message['content'] %}"
    "{%- endif %}{%- endfor %}"
    "{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{%- generation %}{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}{%- endgeneration %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{%- endif %}"
)

TRAINING_TEMPLATES = {"qwen3": QWEN_TRAINING, "qwen3.6": QWEN_TRAINING, "llama3": LLAMA3_TRAINING, "deepseek-v3": DEEPSEEK_V3_TRAINING}


def trl(model: Model, messages: list[dict], max_length: int | None = None) -> tuple[list[int], list[int]]:
    """TRL's rule (see the module docstring): ``(input_ids, labels)``, -100 outside the assistant masks."""
    out = model.hf.apply_chat_template(
        messages, chat_template=TRAINING_TEMPLATES[model.name], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    labels = [t if m else -100 for t, m in zip(ids, mask)]
    if max_length is not None:
        ids, labels = ids[:max_length], labels[:max_length]
    return ids, labels
