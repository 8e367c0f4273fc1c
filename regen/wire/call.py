"""One HTTP request per attempt, the same for every server kind: ``call``, which returns an
``outcome.Outcome``.

What goes into the request and how the reply is read is the server kind's ``Protocol``
(``dqa.regen.servers``): ``servers.sglang.SglangProtocol`` (``POST /generate``, token-exact) and
``servers.openai.OpenAIProtocol`` (``POST /v1/chat/completions``, token-exact where the server
allows it, else the reply rendered back into tokens). A call never raises for server behaviour:
transport failures become outcomes here (``transport_outcome``), HTTP statuses through the
protocol (``Protocol.classify``: the server kind knows its error shapes).
"""

from __future__ import annotations

import json

from dqa.regen.jobs.job import Job
from dqa.regen.wire.outcome import FAIL, FATAL, RETRY, Outcome, short
from dqa.regen.wire.transport import AiohttpTransport, Transport, TransportError


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
    text = short(exc, 240)
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

    ``transport`` is a ``dqa.regen.wire.transport.Transport`` (or an open ``aiohttp.ClientSession``,
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
        return protocol.classify(status, raw), frozenset()
    try:
        obj = json.loads(raw)
    except ValueError:
        return Outcome(RETRY, error=f"reply is not JSON: {short(raw[:120])}", endpoint_fault=True), frozenset()
    outcome = protocol.parse(obj, job)
    protocol.replied(url, outcome, extras_off)  # e.g. openai: a token-exact request's reply says whether the server is
    return outcome, frozenset()
