"""One selected row on its way through the fleet (``Job``), and the sampling every request of a run
carries (``Sampling``).

A ``Job`` holds the prompt ids and what the attempts learn (the cached request body, the chat
messages, the latest ``max_new_tokens``); a conversation's turn is a ``turns.TurnJob``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Sampling:
    """Sampling parameters sent with every request (seed is per sample)."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_new_tokens: int = 8192

    def as_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "max_new_tokens": self.max_new_tokens}


class Job:
    """One selected row on its way through the fleet."""

    __slots__ = ("row", "sample_id", "key", "prompt", "seed", "attempts", "last_endpoint", "error", "body_cache", "messages", "max_new", "rid_prefix", "prompt_text")

    def __init__(self, row: int, sample_id: str | None, prompt: np.ndarray, seed: int, error: str | None = None):
        self.row = row
        self.sample_id = sample_id
        self.key = sample_id if sample_id is not None else str(row)
        self.prompt = prompt
        self.seed = seed
        self.attempts = 0
        self.last_endpoint: str | None = None
        self.error = error  # set when the row cannot be sent at all (no assistant header)
        self.body_cache: bytes | None = None
        self.messages: list[dict] | None = None
        self.max_new = 0  # max_new_tokens of the latest attempt
        self.rid_prefix: bytes | None = None
        self.prompt_text: bytes | None = None  # the prompt ids as JSON list items, b"1,2,3" (prebuilt per batch)
