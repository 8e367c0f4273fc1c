"""One selected row on its way through the fleet (``Job``); the sampling every request of a run
carries is ``dqa.regen.config.SamplingSpec``.

A ``Job`` holds the prompt ids and what the attempts learn (the cached request body, the chat
messages, the latest ``max_new_tokens``); a conversation's turn is a ``turns.TurnJob``.
"""

from __future__ import annotations

import numpy as np


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
