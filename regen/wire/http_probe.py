"""One HTTP GET for probing model servers: health checks and metrics scrapes.

`fleet up` (waiting for health), `fleet status` (health and /metrics) and `plan --calibrate`
(is any endpoint up?) all probe servers the same way: a plain GET with a timeout, where a
connection error or timeout means "no answer" rather than an exception. TLS trust and proxies
are ``http_policy.HttpPolicy``'s, the same as ``dqa regen``'s requests.

One HTTP stack: the GET goes over ``transport.AiohttpTransport``, the client of every ``dqa regen``
request, in an event loop of its own (callers are plain functions, some in worker threads). httpx
was the probes' client before; two stacks meant two parsers, two proxy and TLS code paths and two
sets of failure modes for one policy, and httpx's pool collapses at regen's concurrency
(docs/design.md), so regen could not move the other way. A probe pays for its own loop and
session, and that is cheaper than the httpx client it replaces: measured on loopback on a shared
2-core machine (200 GETs each, a 2-byte /health and a 40 kB /metrics), 1.4-3.3 ms median per GET
here against 22-56 ms for a fresh ``httpx.Client`` per GET (its TLS context is built every time).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass

from dqa.regen.wire.http_policy import HttpPolicy

# A probe's reply is a health answer or a Prometheus page: an SGLang server's /metrics is tens of
# kB, a router's grows with its workers. Past this it is not a model server's reply.
PROBE_GET_LIMIT = 64 << 20


@dataclass(frozen=True)
class ProbeReply:
    """What a probe got back: the HTTP ``status_code`` and the (decoded) body ``content``."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        """The body as text (UTF-8, undecodable bytes replaced)."""
        return self.content.decode("utf-8", "replace")


async def _get(url: str, timeout: float, policy: HttpPolicy) -> ProbeReply | None:
    from dqa.regen.wire.transport import AiohttpTransport, TransportError  # aiohttp: only when a probe runs

    transport = AiohttpTransport(connect_timeout=timeout, request_timeout=timeout, per_host=1, policy=policy)
    try:
        status, body = await transport.request("GET", url, timeout=timeout, limit=PROBE_GET_LIMIT)
    except TransportError:
        return None
    finally:
        await transport.close()
    return ProbeReply(status, body)


def http_get(url: str, timeout: float, policy: HttpPolicy | None = None) -> ProbeReply | None:
    """``GET url`` (redirects not followed); the ``ProbeReply`` (any status), or ``None`` when
    nothing answered in ``timeout`` seconds (refused, reset, timed out, bad URL, TLS failed, a
    reply over ``PROBE_GET_LIMIT`` or not valid HTTP). ``policy``: TLS trust and proxy (default:
    the environment's). Raises ``UsageError`` for a CA bundle that is not a file of certificates.
    Called from a thread whose event loop is running, it waits for the GET in a worker thread."""
    coro = _get(url, timeout, policy or HttpPolicy())
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dqa-probe") as pool:
        return pool.submit(asyncio.run, coro).result()


def answers_ok(url: str, timeout: float, policy: HttpPolicy | None = None) -> bool:
    """True when ``GET url`` answers 200 within ``timeout`` seconds."""
    r = http_get(url, timeout, policy)
    return r is not None and r.status_code == 200
