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
