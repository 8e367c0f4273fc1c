"""Every HTTP request dqa regen makes to a generation server, over aiohttp.

``Transport`` is the seam (tests inject their own): ``post(url, body, limit)`` is a generation
request (the hot path), ``request(method, url, ...)`` a health check, discovery or preflight
request; both return ``(status, body)`` or raise ``TransportError``. ``AiohttpTransport`` is the
one implementation: one ``aiohttp.ClientSession`` per run (opened on first use, in the run's event
loop), kept-alive connections pooled per endpoint, at most ``per_host`` at once to each.

aiohttp parses the HTTP (its C parser: header count and line limits, one ``Content-Length``, no
``Content-Length`` beside ``Transfer-Encoding``, strict chunk sizes) and decodes gzip and deflate
replies. On top of it, the guards a generation client needs that no library sets by default:

- **one deadline per attempt**: ``request_timeout`` bounds the whole reply, from the moment the
  request has a connection (the request is sent) to its last byte, however the server paces it; a
  reply that trickles in a byte at a time is cut off like a silent one. ``connect_timeout`` bounds
  getting the connection (DNS, TCP, TLS, proxy) before that, on its own clock;
- **a size limit per reply** (``post``'s ``limit``, from the request: ``call.reply_limit``; the
  probes' ``PROBE_REPLY_LIMIT``): a ``Content-Length`` over it fails at once, a body (decoded)
  that grows past it fails when it does, so memory stays bounded whatever the server sends;
- **never resend**: a POST whose connection breaks is not sent again here (aiohttp retries only
  idempotent methods on a reused connection); the dispatcher decides about retrying;
- **no redirects followed**, no cookies kept, no proxy or CA taken from anywhere but
  ``http_policy.HttpPolicy`` (the one policy of every HTTP call dqa makes).

Credentials in an endpoint URL (``http://user:pass@host``) are sent as HTTP basic auth unless the
headers already carry an ``Authorization`` (``--api-key-env``).
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass
from typing import Any

# Imported here, not inside the event loop: a SIGTERM/Ctrl-C during this (0.1-0.2 s) import must
# land in plain start-up code, not in a task of the preflight (where it left a task's exception
# unretrieved and a traceback on stderr).
import aiohttp
import yarl

from dqa.regen.config import DEFAULT_CONNECT_TIMEOUT, DEFAULT_PROBE_TIMEOUT, DEFAULT_REQUEST_TIMEOUT
from dqa.regen.wire.http_policy import HttpPolicy
from dqa.regen.wire.urls import strip_userinfo

# Idle connections older than this are closed instead of reused: uvicorn (SGLang's HTTP server)
# closes kept-alive connections after 5 idle seconds, and a request sent as the server closes one
# would fail for nothing. A busy run reuses its connections within milliseconds.
IDLE_EXPIRY = 4.0
# Health, server_info, models and probe replies are small; a server sending more is not a model server.
PROBE_REPLY_LIMIT = 1 << 20
# How often the one deadline timer looks at the requests in flight: a reply is cut off at most
# this late. A per-request timer (asyncio.timeout, moved once the connection is had) cost ~8% of
# the event loop at 4,000 requests/s; one sweep costs a set lookup per request.
SWEEP_S = 0.05


class TransportError(Exception):
    """A request that got no complete, well-formed reply. ``kind``:

    - ``connect``: no connection could be made (refused, unreachable, no such host, not an
      http(s) URL, the proxy unreachable);
    - ``timeout``: connecting took over ``connect_timeout``, or the reply was not complete within
      its deadline;
    - ``tls``: the TLS handshake failed (an untrusted certificate, or the server speaks plain HTTP);
    - ``reply``: the reply broke the rules (not HTTP, too many or too long headers, conflicting
      framing, a bad chunk or encoding, over its size limit);
    - ``io``: the connection broke before the reply was complete.

    ``connected``: whether a connection was made (something that accepts connections is there).
    """

    def __init__(self, kind: str, message: str, connected: bool | None = None):
        super().__init__(message)
        self.kind = kind
        self.connected = kind not in ("connect",) if connected is None else connected


class Transport:
    """Posts request bodies; see the module docstring."""

    async def post(self, url: str, body: bytes, limit: int | None = None) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``url``; return ``(status, reply body)``, the body at most
        ``limit`` bytes (None: no limit). Raises ``TransportError``."""
        raise NotImplementedError

    async def request(self, method: str, url: str, body: bytes | None = None, timeout: float = DEFAULT_PROBE_TIMEOUT,
                      connect_timeout: float | None = None, limit: int = PROBE_REPLY_LIMIT) -> tuple[int, bytes]:
        """``method`` (GET, or POST with a JSON ``body``) to ``url``, redirects not followed:
        connecting within ``connect_timeout`` seconds (default ``timeout``), then the whole reply
        within ``timeout`` seconds, at most ``limit`` bytes. Returns ``(status, reply body)``;
        raises ``TransportError``."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close every connection."""


@dataclass(eq=False)
class _Attempt:
    """One request in flight: its task, and its deadline (``when``, loop time; None: none),
    tightened once its connection is had (see ``_Connector``)."""

    task: Any  # the asyncio.Task sending it
    when: float | None
    reply_s: float | None  # seconds from the connection to the reply's last byte
    connected: bool = False
    expired: bool = False  # the sweep cancelled the task for its deadline
    cancelling: int = 0  # the task's pending cancellations before this request (3.11+)


class _Deadlines:
    """One timer for every request in flight, instead of one per request: every ``SWEEP_S``
    while any request is in flight, each request past its deadline has its task cancelled (and
    ``_send`` turns that cancellation into a timeout)."""

    def __init__(self) -> None:
        self._live: set[_Attempt] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, attempt: _Attempt, loop: asyncio.AbstractEventLoop) -> None:
        self._live.add(attempt)
        if self._timer is None or self._loop is not loop:
            self._loop = loop
            self._timer = loop.call_at(loop.time() + SWEEP_S, self._sweep)

    def discard(self, attempt: _Attempt) -> None:
        self._live.discard(attempt)

    def _sweep(self) -> None:
        self._timer = None
        loop = self._loop
        if loop is None or not self._live:
            return
        now = loop.time()
        for attempt in self._live:
            if attempt.when is not None and now >= attempt.when and not attempt.expired:
                attempt.expired = True
                attempt.task.cancel()
        self._timer = loop.call_at(now + SWEEP_S, self._sweep)


_ATTEMPT: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar("dqa_transport_attempt", default=None)


def _connector_class():
    class _Connector(aiohttp.TCPConnector):
        """A TCPConnector that tells the request in progress when it has its connection (new or
        pooled): from then on, the request's deadline is ``reply_s`` away."""

        async def connect(self, *args, **kwargs):
            conn = await super().connect(*args, **kwargs)
            attempt = _ATTEMPT.get()
            if attempt is not None and not attempt.connected:
                attempt.connected = True
                if attempt.reply_s is not None:
                    attempt.when = self._loop.time() + attempt.reply_s
            return conn

    return _Connector


@dataclass(frozen=True)
class _Target:
    """What a URL needs per request, worked out once: the parsed URL, its proxy and TLS context."""

    url: Any  # yarl.URL
    name: str  # without credentials, for messages
    proxy: str | None
    ssl: Any  # an SSLContext for https, True (aiohttp's default) otherwise


class AiohttpTransport(Transport):
    """``Transport`` over one ``aiohttp.ClientSession``: see the module docstring.

    ``headers`` go with every request (the bearer token); ``connect_timeout`` and
    ``request_timeout`` are ``post``'s (0 or less: no limit); ``per_host`` caps the connections
    to one endpoint; ``policy`` gives TLS trust and proxies. ``session``: an open session to use
    instead of one of its own (its connector and settings apply; the transport leaves it open).
    Used within one event loop and closed with ``close`` there.
    """

    def __init__(self, headers: dict[str, str] | None = None, *, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 per_host: int = 64, policy: HttpPolicy | None = None, session=None):
        # The body's content type goes with the body (a GET carries none).
        self.headers = {k: v for k, v in (headers or {}).items() if k.lower() != "content-type"}
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.per_host = per_host
        self.policy = policy or HttpPolicy()
        self._session = session
        self._own = session is None
        self._targets: dict[str, _Target] = {}
        self._post_timeout = None
        self._deadlines = _Deadlines()

    def _open(self):
        if self._session is None:
            connector = _connector_class()(limit=0, limit_per_host=self.per_host, keepalive_timeout=IDLE_EXPIRY)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self.headers, trust_env=False, cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            try:
                u = yarl.URL(url)
            except (ValueError, TypeError) as exc:
                raise TransportError("connect", f"{strip_userinfo(url)}: not a URL ({exc})") from None
            if u.scheme not in ("http", "https") or not u.host:
                raise TransportError("connect", f"{strip_userinfo(url)}: not an http(s) URL")
            if u.user is not None and any(k.lower() == "authorization" for k in self.headers):
                u = u.with_user(None)  # the header's credentials win (aiohttp refuses both)
            ssl = self.policy.ssl_context() if u.scheme == "https" else True
            target = _Target(u, strip_userinfo(url), self.policy.proxy_for(url), ssl)
            self._targets[url] = target
        return target

    async def post(self, url: str, body: bytes, limit: int | None = None) -> tuple[int, bytes]:
        if self._post_timeout is None:
            self._post_timeout = _client_timeout(self.connect_timeout)
        return await self._send("POST", url, body, self._post_timeout, self.connect_timeout, self.request_timeout, limit)

    async def request(self, method: str, url: str, body: bytes | None = None, timeout: float = DEFAULT_PROBE_TIMEOUT,
                      connect_timeout: float | None = None, limit: int = PROBE_REPLY_LIMIT) -> tuple[int, bytes]:
        if method not in ("GET", "POST"):
            raise ValueError(f"method {method!r}: GET or POST")
        connect = timeout if connect_timeout is None else connect_timeout
        return await self._send(method, url, body, _client_timeout(connect), connect, timeout, limit)

    async def _send(self, method: str, url: str, body: bytes | None, client_timeout, connect_s: float, reply_s: float,
                    limit: int | None) -> tuple[int, bytes]:
        target = self._target(url)
        session = self._open()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        reply = reply_s if reply_s > 0 else None
        # Until the connection is had, the bound is connect + reply (a session of the caller's
        # never says when it connects); the connector then moves it to `reply` from that moment.
        start_bound = None if reply is None else loop.time() + (connect_s if connect_s > 0 else 0.0) + reply
        attempt = _Attempt(task, start_bound, reply, connected=not self._own)
        if hasattr(task, "cancelling"):
            attempt.cancelling = task.cancelling()
        data = aiohttp.BytesPayload(body, content_type="application/json") if body is not None else None
        if start_bound is not None:
            self._deadlines.add(attempt, loop)
        token = _ATTEMPT.set(attempt)
        try:
            async with session.request(method, target.url, data=data, proxy=target.proxy, ssl=target.ssl,
                                       headers=None if self._own else self.headers,
                                       timeout=client_timeout, allow_redirects=False) as resp:
                attempt.connected = True
                return resp.status, await _read(resp, limit, target.name)
        except TransportError:
            raise
        except asyncio.CancelledError:
            # The sweep's cancellation is this request's timeout; any other (the dispatcher
            # taking the endpoint out, Ctrl-C) stays a cancellation.
            if attempt.expired and (not hasattr(task, "uncancel") or task.uncancel() <= attempt.cancelling):
                raise _timeout(None, target, attempt, connect_s, reply_s) from None
            raise
        except asyncio.TimeoutError as exc:
            raise _timeout(exc, target, attempt, connect_s, reply_s) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise _classify(exc, target, self.policy) from None
        finally:
            _ATTEMPT.reset(token)
            self._deadlines.discard(attempt)

    async def close(self) -> None:
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None


def _client_timeout(connect_s: float):
    """aiohttp's timeouts for one request: only the connection's (a free slot, DNS, TCP, TLS,
    proxy); the reply's deadline is the transport's own."""
    return aiohttp.ClientTimeout(total=None, connect=connect_s if connect_s > 0 else None)


async def _read(resp, limit: int | None, name: str) -> bytes:
    """The (decoded) body of ``resp``, at most ``limit`` bytes. Raises ``TransportError`` (reply)
    past it: at once for a ``Content-Length`` over it, else when the body grows past it."""
    if limit is None:
        return await resp.read()
    length = resp.content_length
    if length is not None and length > limit:
        raise TransportError("reply", f"{name}: reply of {length:,} bytes (Content-Length), over the {limit:,}-byte limit for this request")
    if length is not None and "Content-Encoding" not in resp.headers:
        return await resp.read()  # the usual reply: exactly `length` bytes
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        buf += chunk
        if len(buf) > limit:
            raise TransportError("reply", f"{name}: reply over the {limit:,}-byte limit for this request (body still coming)")
    return bytes(buf)


def _timeout(exc: BaseException | None, target: _Target, attempt: _Attempt, connect_s: float, reply_s: float) -> TransportError:
    if isinstance(exc, getattr(aiohttp, "ConnectionTimeoutError", ())) or not attempt.connected:
        where = f" through the proxy {strip_userinfo(target.proxy)}" if target.proxy else ""
        return TransportError("timeout", f"{target.name}: connecting{where} timed out after {connect_s:g} s", connected=False)
    return TransportError("timeout", f"{target.name}: the reply did not come in full within {reply_s:g} s", connected=True)


def _classify(exc: BaseException, target: _Target, policy: HttpPolicy) -> TransportError:
    """The ``TransportError`` for an aiohttp or socket error of a request to ``target`` (a TLS
    failure's message names the fix, from ``policy``)."""
    text = " ".join(str(exc).split())[:200]
    if isinstance(exc, (aiohttp.ClientConnectorCertificateError,)):
        reason = getattr(getattr(exc, "certificate_error", None), "verify_message", None) or text
        return TransportError("tls", policy.tls_fix(target.name, f"certificate verify failed: {reason}"), connected=True)
    if isinstance(exc, (aiohttp.ClientConnectorSSLError, aiohttp.ClientSSLError)):
        return TransportError("tls", policy.tls_fix(target.name, f"handshake failed: {text}"), connected=True)
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return TransportError("connect", f"cannot connect to the proxy {strip_userinfo(target.proxy or '')} (HTTP(S)_PROXY; "
                                         f"NO_PROXY=<host> goes direct): {getattr(exc, 'strerror', None) or text}")
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return TransportError("io", f"the proxy {strip_userinfo(target.proxy or '')} refused {target.name}: HTTP {exc.status} {exc.message}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return TransportError("connect", f"cannot connect to {target.name}: {getattr(exc, 'strerror', None) or text}")
    if isinstance(exc, (aiohttp.InvalidURL, ValueError)) and not isinstance(exc, aiohttp.ClientResponseError):
        return TransportError("connect", f"{target.name}: {text}")
    if isinstance(exc, aiohttp.ClientResponseError):  # raised by the parser only: dqa never calls raise_for_status
        return TransportError("reply", f"{target.name}: the reply is not valid HTTP ({' '.join(str(exc.message).split())[:160]})")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return TransportError("reply", f"{target.name}: the reply body is broken ({text})")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return TransportError("io", f"{target.name}: the server closed the connection before a full reply")
    return TransportError("io", f"{target.name}: {type(exc).__name__}: {text}")
