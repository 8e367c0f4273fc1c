"""What one attempt produced, the same for every server kind: ``Outcome`` and its ``kind``.

The ``kind`` says what the dispatcher does next (see docs/sglang.md, client rules):
``ok``/``length`` are recorded, ``retry`` is retried with backoff, ``fail`` is
recorded as a failure without retrying, ``fatal`` stops the run without recording the row:
the request itself is wrong for this server whatever the row (SGLang 0.5.22+ rejecting an
unknown ``sampling_params`` field: a dqa bug; a 404 for the generate route: the wrong
``--protocol``), so every other row would fail the same way.

How a server's reply shapes read as outcomes (SGLang's error objects, its aborts, which
statuses are retried) is the server kinds' knowledge: ``dqa.regen.servers.replies`` and each
kind's ``Protocol.parse`` / ``Protocol.classify``. Here are only the values every kind returns and
the helpers that quote and count; nothing here imports aiohttp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

OK = "ok"
LENGTH = "length"
RETRY = "retry"
FAIL = "fail"
FATAL = "fatal"

EMPTY_IDS = np.zeros(0, dtype=np.int32)


@dataclass
class Outcome:
    """What one attempt produced.

    ``endpoint_fault`` marks failures that speak against the endpoint
    (connection refused or dropped, 5xx, read timeout) rather than the request.
    """

    kind: str
    output_ids: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    finish_reason: str = ""
    error: str | None = None
    endpoint_fault: bool = False
    refused: bool = False
    route: str = ""  # openai: servers.openai.TOKEN_EXACT or TEXT, the route the reply took ("" when not known)
    cached_tokens: int | None = None  # prompt tokens the server says it had in its prefix cache (None: not said)


def short(text: Any, n: int = 300) -> str:
    """``text`` as one line (runs of whitespace made one space), at most ``n`` characters: how an
    error message quotes a reply."""
    return " ".join(str(text).split())[:n]


def count_or_none(value: Any) -> int | None:
    """``value`` when it is a count (an int >= 0, not a bool), else None: how a reply's optional
    figures (``meta_info.cached_tokens``) are read."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
