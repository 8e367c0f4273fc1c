"""What SGLang's replies other than a generation say, read into ``Outcome``s: its error objects,
its statuses, an error inside a 200 (docs/sglang.md, "Client rules" and "Aborts").

- ``classify_status``: a non-200 reply. 408/429/5xx are retried with backoff (5xx counts
  against the endpoint); a 400 "unknown field `x`" (SGLang 0.5.22+ validates ``sampling_params``
  strictly) and a 404 for the generate route are fatal (the request is wrong whatever the row);
  a 400 "Duplicate request ID" is retried (an earlier run's request may still be aborting);
  any other status is a recorded failure.
- ``error_in_body``: an ``{"error": ...}`` object inside an HTTP 200 (how SGLang streams errors).
- Aborts: a plain abort is an HTTP 200 whose ``finish_reason`` is ``{"type": "abort",
  "status_code": null}`` with partial ``output_ids`` (retried, the partial output not kept:
  ``servers.sglang.SglangProtocol.parse``); an abort with a status code arrives as a real HTTP
  400/500/503 and is classified like any such status.

``base.Protocol.classify`` uses ``classify_status``; the kinds' ``parse`` use ``error_in_body``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dqa.regen.wire.outcome import FAIL, FATAL, RETRY, Outcome, short

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# Statuses that say the endpoint itself is in trouble (count towards taking it out).
ENDPOINT_FAULT_STATUS = frozenset({500, 502, 503, 504})

_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")


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
