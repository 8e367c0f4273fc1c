"""One HTTP request per attempt, the same for every server kind: ``call``, and what it returns.

What goes into the request and how the reply is read is the server kind's ``Protocol``
(``dqa.regen.servers``): ``servers.sglang.SglangProtocol`` (``POST /generate``, token-exact) and
``servers.openai.OpenAIProtocol`` (``POST /v1/chat/completions``, token-exact where the server
allows it, else the reply rendered back into tokens). Both are importable from here too, with the
openai route names ``TOKEN_EXACT``, ``TEXT`` and ``TOKEN_FIELDS``.

A call returns an ``Outcome``; it never raises for server behaviour. The
``kind`` says what the dispatcher does next (see SGLANG.md, client rules):
``ok``/``length`` are recorded, ``retry`` is retried with backoff, ``fail`` is
recorded as a failure without retrying, ``fatal`` stops the run without recording the row:
the request itself is wrong for this server whatever the row (SGLang 0.5.22+ rejecting an
unknown ``sampling_params`` field: a dqa bug; a 404 for the generate route: the wrong
``--protocol``), so every other row would fail the same way.

Aborts follow SGLang (SGLANG.md, "Aborts"): a plain abort is an HTTP 200 whose
``finish_reason`` is ``{"type": "abort", "status_code": null}`` with partial ``output_ids``
(retried; the partial output is not kept); an abort with a status code arrives as a real HTTP
400/500/503 and is classified like any such status.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dqa.regen.transport import AiohttpTransport, Transport, TransportError

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


def _short(text: Any, n: int = 300) -> str:
    return " ".join(str(text).split())[:n]


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
    text = _short(body.decode("utf-8", "replace"))
    err = f"HTTP {status}: {text}" if text else f"HTTP {status}"
    field_name = unknown_field(status, body)
    if field_name is not None:
        msg = _short(error_message(body), 400)
        return Outcome(FATAL, error=(
            f"BUG: the server rejects the request field `{field_name}` (HTTP 400: {msg}); dqa sent a field this "
            f"SGLang version does not accept. Please report it with the server's version; no row was recorded "
            f"for it, so rerunning the same command resumes once fixed"))
    if status == 404:
        return Outcome(FATAL, error=f"HTTP 404 for the generate route ({_short(error_message(body), 160)}): wrong --protocol, endpoint URL or --model?")
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
    return Outcome(kind, error=f"error in reply{f' ({code})' if code else ''}: {_short(msg)}", endpoint_fault=kind == RETRY)


def reply_limit(max_new: int, request_bytes: int) -> int:
    """The most bytes an honest reply to a request of ``request_bytes`` asking for ``max_new``
    output tokens can take: 256 per output token (its id, its text JSON-escaped and, on the chat
    route, the reasoning split), twice the request (a route that echoes the prompt's ids) and
    1 MiB for the rest (meta_info, usage). A reply past it is not a generation reply: the
    attempt fails instead of buffering whatever the server sends."""
    return (1 << 20) + 2 * request_bytes + 256 * max(max_new, 0)


def transport_outcome(exc: TransportError) -> Outcome:
    """The outcome of an attempt that got no usable reply: retried, and counted against the
    endpoint; a refused connection takes it out at once. A TLS failure is fatal: every request
    to that server fails the same way (its message names the fix)."""
    text = _short(exc, 240)
    if exc.kind == "tls":
        return Outcome(FATAL, error=text)
    if exc.kind == "timeout":
        return Outcome(RETRY, error=text, endpoint_fault=True)
    if exc.kind == "connect":
        return Outcome(RETRY, error=f"connection failed: {text}", endpoint_fault=True, refused=True)
    if exc.kind == "reply":
        return Outcome(RETRY, error=f"bad reply: {text}", endpoint_fault=True)
    return Outcome(RETRY, error=f"connection error: {text}", endpoint_fault=True)


async def call(
    transport, url: str, protocol, job: Job, attempt: int, headers: dict | None, extras_off: frozenset[str], max_new: int, timeout=None
) -> tuple[Outcome, frozenset[str]]:
    """POST one attempt to ``url`` (the endpoint's generate URL); return its outcome and the optional fields the server rejected (to drop next time).

    ``transport`` is a ``dqa.regen.transport.Transport`` (or an open ``aiohttp.ClientSession``,
    used with ``headers`` and ``timeout``, the reply's deadline in seconds). ``protocol`` is a
    ``servers.base.Protocol``: it builds the body, reads the reply, and may leave out optional
    fields for this endpoint or learn from its replies (its hooks). The reply may be at most
    ``reply_limit(max_new, len(body))`` bytes. Never raises for HTTP or connection trouble;
    ``asyncio.CancelledError`` propagates.
    """
    if not isinstance(transport, Transport):
        transport = AiohttpTransport(headers, session=transport, request_timeout=timeout or 0)
    off = protocol.extras_for(url)
    if off:
        extras_off = extras_off | off
    try:
        body = protocol.body(job, attempt, extras_off, max_new)
    except ValueError as exc:
        return Outcome(FAIL, error=f"row {job.row}: cannot build request ({exc})"), frozenset()
    try:
        status, raw = await transport.post(url, body, reply_limit(max_new, len(body)))
    except TransportError as exc:
        return transport_outcome(exc), frozenset()
    if status != 200:
        rejected = protocol.rejected(url, status, raw, extras_off)
        if rejected:
            return Outcome(RETRY, error=f"HTTP {status}: server rejects {sorted(rejected)}"), rejected
        return classify_status(status, raw), frozenset()
    try:
        obj = json.loads(raw)
    except ValueError:
        return Outcome(RETRY, error=f"reply is not JSON: {_short(raw[:120])}", endpoint_fault=True), frozenset()
    outcome = protocol.parse(obj, job)
    protocol.replied(url, outcome, extras_off)  # e.g. openai: a token-exact request's reply says whether the server is
    return outcome, frozenset()


# The protocols live with their server kinds (dqa.regen.servers), which import this module; they
# are importable from here as well, loaded on first use.
_MOVED = {
    "SglangProtocol": "dqa.regen.servers.sglang",
    "OpenAIProtocol": "dqa.regen.servers.openai",
    "TOKEN_EXACT": "dqa.regen.servers.openai",
    "TEXT": "dqa.regen.servers.openai",
    "TOKEN_FIELDS": "dqa.regen.servers.openai",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
