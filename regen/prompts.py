"""Token-exact prompts for regeneration, the per-sample seed, and ChatML turns for the openai protocol.

The prompt of a sample is its own ``input_ids`` up to and including the LAST
assistant header (``<|im_start|>assistant\\n`` for Qwen3); everything after it
is dropped, which removes a prefilled empty ``<think>\\n\\n</think>\\n\\n``
block, so the model thinks. Nothing is re-tokenized.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

NO_HEADER = -1


def prompt_ends(ids: np.ndarray, offsets: np.ndarray, header: Sequence[int]) -> np.ndarray:
    """Per row, the prompt length: position just past the row's last ``header``, or ``NO_HEADER`` (-1).

    ``ids`` holds all rows concatenated and ``offsets`` (len rows + 1) their
    bounds, as in ``TokenBatch``. Vectorized: one pass per header token, no
    loop over rows. A header that would cross a row boundary does not count.
    """
    rows = len(offsets) - 1
    out = np.full(rows, NO_HEADER, dtype=np.int64)
    k = len(header)
    n = ids.size
    if rows == 0 or k == 0 or n < k:
        return out
    cand = np.flatnonzero(ids[: n - k + 1] == header[0])
    for j in range(1, k):
        cand = cand[ids[cand + j] == header[j]]
    if cand.size == 0:
        return out
    row = np.searchsorted(offsets, cand, side="right") - 1
    inside = cand + k <= offsets[row + 1]
    cand, row = cand[inside], row[inside]
    if cand.size == 0:
        return out
    # cand is sorted, so the last header of a row is where the next candidate is in another row.
    last = np.ones(cand.size, dtype=bool)
    last[:-1] = row[1:] != row[:-1]
    out[row[last]] = cand[last] + k - offsets[row[last]]
    return out


def sample_seed(key: str, base: int = 0) -> int:
    """A stable 31-bit seed for a sample (same id and base -> same seed, on every machine and run)."""
    digest = hashlib.blake2b(f"{base}:{key}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def chatml_messages(prompt: Sequence[int], tokenizer, turn_start: int, eot: int) -> list[dict]:
    """Decode ChatML prompt tokens into OpenAI ``messages`` (role + content per turn).

    The trailing open assistant header (the generation prompt) is dropped.
    Raises ``ValueError`` when the tokens are not a sequence of
    ``<|im_start|>role\\n...<|im_end|>`` turns ending in an open assistant turn.
    """
    ids = list(map(int, prompt))
    starts = [i for i, t in enumerate(ids) if t == turn_start]
    if not starts or starts[0] != 0:
        raise ValueError("prompt does not start with a turn opener")
    messages: list[dict] = []
    for n, s in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(ids)
        text = tokenizer.decode(ids[s + 1 : end], skip_special_tokens=False)
        last = n + 1 == len(starts)
        role, sep, body = text.partition("\n")
        if not sep:
            raise ValueError(f"turn {n} has no role line")
        if last:
            if role != "assistant" or body:
                raise ValueError("prompt does not end with an open assistant header")
            break
        closer = tokenizer.decode([eot], skip_special_tokens=False)
        if not body.endswith(closer + "\n") and not body.endswith(closer):
            raise ValueError(f"turn {n} ({role}) is not closed by the end-of-turn token")
        body = body[: body.rfind(closer)]
        messages.append({"role": role, "content": body})
    return messages


class ChatTokenizer:
    """The openai route's tokenizer: fast decoding now, the chat template only when a reply is rendered.

    ``decode`` (all ``chatml_messages`` needs) runs on a ``tokenizers.Tokenizer``:
    ``tokenizer`` when given (the object, or a function returning it, called once on first
    use: ``lambda: spec.tokenizer`` shares a template spec's lazily loaded one), else the
    folder's ``tokenizer.json`` loaded with ``tokenizers`` on first use.
    ``apply_chat_template`` and ``encode`` go to transformers' ``AutoTokenizer``, imported
    and loaded on their first call (importing transformers takes ~0.6 s and loading Qwen3's
    tokenizer with it ~0.7 s more, measured), so its exact template semantics are kept and a
    run that renders no reply never pays for it. ``chat_template`` reads the folder's files
    without loading anything.

    A drop-in for the ``AutoTokenizer`` that ``OpenAIProtocol`` takes: it calls only
    ``decode``, ``encode`` and ``apply_chat_template``.
    """

    def __init__(self, folder, tokenizer=None):
        from pathlib import Path

        self.folder = Path(folder)
        given = tokenizer is not None and hasattr(tokenizer, "decode")
        self._fast = tokenizer if given else None
        self._load_fast = tokenizer if tokenizer is not None and not given else None
        self._hf = None
        self._cleans_up: bool | None = None

    @property
    def fast(self):
        """The ``tokenizers.Tokenizer`` (loaded on first use)."""
        if self._fast is None:
            if self._load_fast is not None:
                self._fast = self._load_fast()
            if self._fast is None:
                from dqa.audit.template import _load_tokenizer

                self._fast = _load_tokenizer(self.folder)
        return self._fast

    @property
    def hf(self):
        """transformers' tokenizer for the folder (imported and loaded on first use)."""
        if self._hf is None:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(self.folder))
        return self._hf

    @property
    def chat_template(self):
        """The folder's chat template as transformers would find it, read without loading anything:
        ``chat_template.jinja``, else ``chat_template`` of ``chat_template.json`` or of
        ``tokenizer_config.json`` (a string, or a list of named templates); None when there is none."""
        import json

        f = self.folder
        if (f / "chat_template.jinja").is_file():
            return (f / "chat_template.jinja").read_text(encoding="utf-8")
        for name in ("chat_template.json", "tokenizer_config.json"):
            try:
                config = json.loads((f / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(config, dict) and config.get("chat_template"):
                return config["chat_template"]
        return None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Token ids to text (special tokens kept unless asked), as transformers decodes them.

        transformers decodes with the same Rust tokenizer and then, only when the folder's
        ``tokenizer_config.json`` sets ``clean_up_tokenization_spaces``, edits spaces; such a
        folder is decoded by transformers itself.
        """
        if self._cleans_up is None:
            self._cleans_up = bool(self._config().get("clean_up_tokenization_spaces"))
        if self._cleans_up:
            return self.hf.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)
        return self.fast.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def encode(self, text: str, **kwargs) -> list[int]:
        """transformers' ``encode`` (loads it)."""
        return self.hf.encode(text, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        """transformers' ``apply_chat_template`` (loads it)."""
        return self.hf.apply_chat_template(*args, **kwargs)

    def _config(self) -> dict:
        import json

        try:
            config = json.loads((self.folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return config if isinstance(config, dict) else {}
