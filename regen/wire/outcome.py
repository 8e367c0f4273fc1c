"""What one attempt produced, the same for every server kind: ``Outcome`` and its ``kind``.

The ``kind`` says what the dispatcher does next (see SGLANG.md, client rules):
``ok``/``length`` are recorded, ``retry`` is retried with backoff, ``fail`` is
recorded as a failure without retrying, ``fatal`` stops the run without recording the row:
the request itself is wrong for this server whatever the row (SGLang 0.5.22+ rejecting an
unknown ``sampling_params`` field: a dqa bug; a 404 for the generate route: the wrong
``--protocol``), so every other row would fail the same way.

Aborts follow SGLang (SGLANG.md, "Aborts"): a plain abort is an HTTP 200 whose
``finish_reason`` is ``{"type": "abort", "status_code": null}`` with partial ``output_ids``
(retried; the partial output is not kept); an abort with a status code arrives as a real HTTP
400/500/503 and is classified like any such status.

The server kinds (``dqa.regen.servers``) read their replies into outcomes with these helpers;
nothing here imports aiohttp.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OK = "ok"
LENGTH = "length"
RETRY = "retry"
FAIL = "fail"
FATAL = "fatal"

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# Statuses that say the endpoint itself is in trouble (count towards taking it out).
ENDPOINT_FAULT_STATUS = frozenset({500, 502, 503, 504})
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


_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")


def count_or_none(value: Any) -> int | None:
    """``value`` when it is a count (an int >= 0, not a bool), else None: how a reply's optional
    figures (``meta_info.cached_tokens``) are read."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def error_message(body: bytes) -> str:
    """The error text of an error reply: ``{"error": "..."}`` (SGLang's schema check, a string),
    ``{"error": {"message": ...}}``, ``{"message": ...}`` or ``{"detail": ...}``; else the body."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, str):
            return err
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        for key in ("message", "detail"):
            if isinstance(obj.get(key), str):
                return obj[key]
    return body.decode("utf-8", "replace")


def unknown_field(status: int, body: bytes) -> str | None:
    """The field named by a 400 "unknown field `x`" (SGLang 0.5.22+ validates ``sampling_params``
    strictly), else None."""
    if status != 400:
        return None
    m = _UNKNOWN_FIELD.search(error_message(body))
    return m.group(1) if m else None


def classify_status(status: int, body: bytes) -> Outcome:
    """Map a non-200 HTTP status to an outcome (retry with backoff, a recorded failure, or fatal)."""
    text = short(body.decode("utf-8", "replace"))
    err = f"HTTP {status}: {text}" if text else f"HTTP {status}"
    field_name = unknown_field(status, body)
    if field_name is not None:
        msg = short(error_message(body), 400)
        return Outcome(FATAL, error=(
            f"BUG: the server rejects the request field `{field_name}` (HTTP 400: {msg}); dqa sent a field this "
            f"SGLang version does not accept. Please report it with the server's version; no row was recorded "
            f"for it, so rerunning the same command resumes once fixed"))
    if status == 404:
        return Outcome(FATAL, error=f"HTTP 404 for the generate route ({short(error_message(body), 160)}): wrong --protocol, endpoint URL or --model?")
    if status in RETRY_STATUS:
        return Outcome(RETRY, error=err, endpoint_fault=status in ENDPOINT_FAULT_STATUS)
    if status == 400 and "duplicate request id" in text.lower():
        # A request of an earlier run with the same rid may still be aborting on the server.
        return Outcome(RETRY, error=err)
    return Outcome(FAIL, error=err)


def error_in_body(obj: Any) -> Outcome | None:
    """An ``{"error": ...}`` object inside a 200 reply (how SGLang streams errors) as an outcome, else None."""
    if not isinstance(obj, dict) or "error" not in obj or obj.get("choices") or obj.get("output_ids"):
        return None
    err = obj["error"]
    code = err.get("code") if isinstance(err, dict) else None
    msg = err.get("message") if isinstance(err, dict) else err
    try:
        code = int(code) if code is not None else None
    except (TypeError, ValueError):
        code = None
    kind = FAIL if code is not None and 400 <= code < 500 and code not in RETRY_STATUS else RETRY
    return Outcome(kind, error=f"error in reply{f' ({code})' if code else ''}: {short(msg)}", endpoint_fault=kind == RETRY)
