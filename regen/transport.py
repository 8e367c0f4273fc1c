"""The HTTP transport of regen's hot path: one POST per attempt, over kept-alive connections.

``Transport`` is the extension point: ``post(url, body)`` (a generation request: the hot path)
and ``request(method, url, ...)`` (health checks and start-up probes, with their own timeout)
return ``(status, body)`` or raise a ``TransportError`` saying what went wrong (the dispatcher
retries those). Two implementations:

- ``Http11Transport`` (the default): a small HTTP/1.1 client on asyncio protocols. Regen sends the
  same request shape millions of times to a handful of servers, so the request head is built from a
  cached prefix and the reply is parsed for exactly what it needs (status, ``Content-Length`` or
  chunked body, ``Connection: close``). It costs about a third of aiohttp's client CPU per request
  (bench/README.md, regen client), which on a large fleet is the dispatcher's own ceiling.
  Health checks and probes use it too, so a run never imports aiohttp (0.1-0.2 s of start-up).
- ``AiohttpTransport``: the same over an ``aiohttp.ClientSession`` (tests may pass a session).

Timeouts follow aiohttp's ``sock_connect`` / ``sock_read``: ``connect`` bounds opening a
connection, ``read`` the wait for the next bytes of the reply (a non-streamed generation sends
nothing until it is done, so this bounds the whole reply); 0 or less means no limit. A request is
never sent twice by the transport: a failure goes back to the dispatcher, which retries it.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import defaultdict
from urllib.parse import unquote, urlsplit

# Idle connections older than this are closed instead of reused: uvicorn (SGLang's HTTP server)
# closes kept-alive connections after 5 idle seconds, and a request sent as the server closes one
# would fail for nothing. A busy run reuses its connections within milliseconds.
IDLE_EXPIRY = 4.0


class TransportError(Exception):
    """A request that got no complete reply. ``kind``: ``connect`` (no connection could be made:
    refused, unreachable, a bad address), ``timeout`` (connecting took over ``connect`` seconds, no
    reply bytes came for ``read`` seconds, or ``request``'s reply did not come in full within its
    ``timeout``) or ``io`` (the connection broke, or the reply was not HTTP). ``connected``: whether
    a connection was made (False for ``connect``, and for a timeout while connecting): something
    that accepts connections is there."""

    def __init__(self, kind: str, message: str, connected: bool | None = None):
        super().__init__(message)
        self.kind = kind
        self.connected = kind != "connect" if connected is None else connected


class Transport:
    """Posts request bodies; see the module docstring."""

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``url``; return ``(status, reply body)``. Raises ``TransportError``."""
        raise NotImplementedError

    async def request(self, method: str, url: str, body: bytes | None = None, timeout: float = 10.0,
                      connect_timeout: float | None = None) -> tuple[int, bytes]:
        """``method`` (GET, or POST with a JSON ``body``) to ``url``, redirects not followed:
        connecting within ``connect_timeout`` seconds (default ``timeout``), then the whole reply
        within ``timeout`` seconds. Returns ``(status, reply body)``; raises ``TransportError``."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close every connection."""


class AiohttpTransport(Transport):
    """``Transport`` over an ``aiohttp.ClientSession`` (its headers and timeouts apply)."""

    def __init__(self, session, headers: dict[str, str] | None = None, timeout=None):
        self.session = session
        self.headers = headers
        self.timeout = timeout

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        import aiohttp

        try:
            async with self.session.post(url, data=body, headers=self.headers, timeout=self.timeout) as resp:
                return resp.status, await resp.read()
        except asyncio.TimeoutError:
            raise TransportError("timeout", "timed out waiting for the reply") from None
        except aiohttp.ClientConnectorError as exc:
            raise TransportError("connect", str(exc)) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise TransportError("io", f"{type(exc).__name__}: {exc}") from None

    async def request(self, method: str, url: str, body: bytes | None = None, timeout: float = 10.0,
                      connect_timeout: float | None = None) -> tuple[int, bytes]:
        import aiohttp

        connect = timeout if connect_timeout is None else connect_timeout
        # aiohttp has no clock that starts once connected (its total would also cut a slow DNS
        # lookup and then say "connected"): the head is bounded by the read timeout, the body by
        # ``timeout`` after it.
        t = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=timeout)
        try:
            async with self.session.request(method, url, data=body, headers=self.headers, timeout=t, allow_redirects=False) as resp:
                try:
                    return resp.status, await asyncio.wait_for(resp.read(), timeout)
                except asyncio.TimeoutError:
                    raise TransportError("timeout", f"the reply did not come in full within {timeout:g} s") from None
        except asyncio.TimeoutError as exc:
            connected = not isinstance(exc, getattr(aiohttp, "ConnectionTimeoutError", ()))
            raise TransportError("timeout", "timed out", connected=connected) from None
        except (aiohttp.ClientConnectorError, aiohttp.InvalidURL) as exc:
            raise TransportError("connect", str(exc)) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise TransportError("io", f"{type(exc).__name__}: {exc}") from None


class _Reply(asyncio.Protocol):
    """One connection: writes a request, parses the HTTP/1.1 reply into ``(status, body, keep)``.

    A connection that receives bytes it did not ask for (while idle, or after a complete reply) is
    not reused: they could only be mistaken for the next request's reply."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.reusable = True
        self.last_read = 0.0  # loop time of the request's send or its latest reply bytes (read timeout)
        self.read_timeout = 0.0
        self.idle_since = 0.0

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.waiting:
            self._parse(eof=True)
            if self.waiting:
                why = f": {exc}" if exc else ""
                self._fail("io", f"the server closed the connection before a full reply{why}")

    def data_received(self, data: bytes) -> None:
        if not self.waiting:
            self.reusable = False  # unasked-for bytes
            return
        self.buf += data
        self.last_read = self.loop.time()
        self._parse(eof=False)

    def eof_received(self) -> bool:
        return False  # close our side too: connection_lost follows

    # -- one request
    def send(self, data: bytes, read_timeout: float) -> asyncio.Future:
        self.buf.clear()
        self.waiter = self.loop.create_future()
        self.read_timeout = read_timeout
        self.last_read = self.loop.time()
        assert self.transport is not None
        self.transport.write(data)
        return self.waiter

    @property
    def waiting(self) -> bool:
        return self.waiter is not None and not self.waiter.done()

    def abort(self) -> None:
        """Drop the connection (the request was cancelled, or the connection is not to be reused)."""
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    def _fail(self, kind: str, message: str) -> None:
        if self.waiting:
            self.waiter.set_exception(TransportError(kind, message))  # type: ignore[union-attr]
        self.abort()

    def _parse(self, eof: bool) -> None:
        try:
            self._parse_reply(eof)
        except ValueError as exc:  # a malformed length or chunk size
            self._fail("io", f"malformed reply framing ({exc})")

    def _parse_reply(self, eof: bool) -> None:
        buf = self.buf
        while True:  # skips 1xx interim replies (a proxy's 100 Continue)
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if eof:
                    self._fail("io", "the server closed the connection before a full reply")
                return
            eol = buf.find(b"\r\n", 0, end + 2)
            parts = bytes(buf[:eol]).split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                self._fail("io", f"the reply is not HTTP/1.x: {bytes(buf[:min(eol, 80)])!r}")
                return
            status = int(parts[1])
            if 100 <= status < 200 and status != 101:
                del buf[: end + 4]
                continue
            break
        length, chunked, keep = _framing(bytes(buf[eol:end]).lower(), parts[0] != b"HTTP/1.0")
        start = end + 4
        if chunked:
            got = _dechunk(buf, start)
            if got is None:
                if eof:
                    self._fail("io", "the server closed the connection inside a chunked reply")
                return
            body, used = got
        elif length is not None:
            if len(buf) - start < length:
                if eof:
                    self._fail("io", f"the server closed the connection after {len(buf) - start} of {length} reply bytes")
                return
            body, used = bytes(buf[start : start + length]), start + length
        elif status in (204, 304):
            body, used = b"", start
        elif eof:  # no length: the body runs to the end of the connection
            body, used, keep = bytes(buf[start:]), len(buf), False
        else:
            return
        if used != len(buf):
            self.reusable = False  # bytes after the reply
        assert self.waiter is not None
        self.waiter.set_result((status, body, keep and self.reusable))


_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))  # the headers that frame a reply


def _framing(head: bytes, keep: bool) -> tuple[int | None, bool, bool]:
    """``(Content-Length or None, chunked, keep-alive)`` of a reply's lower-cased header lines
    (``head``: each line after ``\\r\\n``, the status line left out); ``keep`` is the default (HTTP/1.1).
    Raises ValueError for a Content-Length that is not one number."""
    at = head.find(b"\r\ncontent-length:")
    if at >= 0 and head.count(b"content-length") == 1 and b"transfer-encoding" not in head and b"connection" not in head:
        # The usual reply (one Content-Length, keep-alive by default): a few searches, no line loop.
        value_end = head.find(b"\r\n", at + 17)
        value = head[at + 17 : value_end if value_end >= 0 else len(head)].strip()
        if value.isdigit():
            return int(value), False, keep
    length, chunked = None, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip()
        if name not in _FRAMING:  # date, server, content-type, ...
            continue
        tokens = {t.strip() for t in value.split(b",")} - {b""}
        if name == b"content-length":
            if len(tokens) != 1 or not next(iter(tokens)).isdigit():
                raise ValueError(f"Content-Length {value.strip()[:40]!r}")
            length = int(next(iter(tokens)))
        elif name == b"transfer-encoding":
            chunked = b"chunked" in tokens
        else:
            keep = b"keep-alive" in tokens or (keep and b"close" not in tokens)
    return length, chunked, keep


def _with_body(head: bytes, body: bytes) -> bytes:
    """A POST request: its cached head (up to ``Content-Length: ``), the length and the body."""
    return b"".join((head, str(len(body)).encode(), b"\r\n\r\n", body))


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """The body of a complete chunked reply starting at ``pos`` and where the reply ends (after its
    trailer); None while incomplete. Raises ValueError for a chunk size that is not hexadecimal."""
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip(), 16)
        if size < 0:
            raise ValueError("negative chunk size")
        pos = eol + 2
        if size == 0:  # the trailer: header lines, then an empty line
            if buf[pos : pos + 2] == b"\r\n":
                return bytes(out), pos + 2
            end = buf.find(b"\r\n\r\n", pos)
            return (bytes(out), end + 4) if end >= 0 else None
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos : pos + size]
        pos += size + 2


class Http11Transport(Transport):
    """``Transport`` on asyncio protocols: HTTP/1.1 with keep-alive, one request per connection at a
    time, idle connections pooled per server (``http`` and ``https``). Used within one event loop
    (the dispatcher's), and closed with ``close`` there."""

    def __init__(self, headers: dict[str, str] | None = None, connect_timeout: float = 10.0, read_timeout: float = 3600.0):
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: dict[tuple[str, str, int], list[_Reply]] = defaultdict(list)
        self._heads: dict[str | tuple[str, str], tuple[tuple[str, str, int], bytes]] = {}  # POST by URL, others by (method, URL)
        self._all: set[_Reply] = set()
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.Task | None = None

    def _head(self, url: str, method: str = "POST") -> tuple[tuple[str, str, int], bytes]:
        """The pool key and the request head for ``url`` (cached): a POST's up to ``Content-Length: ``,
        a GET's whole (no body, no content type)."""
        cached = self._heads.get(url if method == "POST" else (method, url))
        if cached is None:
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise TransportError("connect", f"{url}: not an http(s) URL")
            port = u.port or (443 if u.scheme == "https" else 80)
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            host = u.netloc.rsplit("@", 1)[-1]
            lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Accept: */*"]
            lines += [f"{k}: {v}" for k, v in self.headers.items() if method == "POST" or k.lower() != "content-type"]
            if u.username is not None and not any(k.lower() == "authorization" for k in self.headers):
                # credentials in the endpoint URL (regen/urls.py): HTTP basic auth, as aiohttp sends them
                user_pass = f"{unquote(u.username)}:{unquote(u.password or '')}".encode()
                lines.append(f"Authorization: Basic {base64.b64encode(user_pass).decode()}")
            end = "\r\nContent-Length: " if method == "POST" else "\r\n\r\n"
            cached = ((u.scheme, u.hostname, port), ("\r\n".join(lines) + end).encode("latin-1"))
            self._heads[url if method == "POST" else (method, url)] = cached
        return cached

    async def _connect(self, key: tuple[str, str, int], timeout: float | None = None) -> _Reply:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        context = self._ssl if scheme == "https" else None
        limit = self.connect_timeout if timeout is None else timeout
        try:
            _, proto = await asyncio.wait_for(loop.create_connection(lambda: _Reply(loop), host, port, ssl=context),
                                              limit if limit > 0 else None)
        except asyncio.TimeoutError:
            raise TransportError("timeout", f"connecting to {host}:{port} timed out after {limit:g} s", connected=False) from None
        except OSError as exc:
            raise TransportError("connect", f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        self._all.add(proto)
        return proto

    async def _sweep(self) -> None:
        """Fail the requests whose reply has been silent for ``read_timeout``: one check of every
        connection per tick instead of a timer armed and cancelled for every request and read."""
        tick = min(1.0, self.read_timeout / 4)
        while True:
            await asyncio.sleep(tick)
            now = asyncio.get_running_loop().time()
            for conn in list(self._all):
                if conn.waiting and now - conn.last_read >= conn.read_timeout:
                    conn._fail("timeout", f"timed out waiting for the reply ({conn.read_timeout:g} s without a byte)")

    def _idle_connection(self, key: tuple[str, str, int]) -> _Reply | None:
        """A pooled connection to ``key`` still fit to reuse (others are closed and dropped), or None."""
        idle = self._idle[key]
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.reusable and now - conn.idle_since < IDLE_EXPIRY:
                return conn
            conn.abort()
            self._all.discard(conn)
        return None

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        if self.read_timeout > 0 and (self._sweeper is None or self._sweeper.done()):  # started with the first request
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        key, head = self._head(url)
        data = _with_body(head, body)
        conn = self._idle_connection(key) or await self._connect(key)
        return await self._round_trip(conn, key, data, self.read_timeout if self.read_timeout > 0 else float("inf"))

    async def request(self, method: str, url: str, body: bytes | None = None, timeout: float = 10.0,
                      connect_timeout: float | None = None) -> tuple[int, bytes]:
        if method not in ("GET", "POST"):
            raise ValueError(f"method {method!r}: GET or POST")
        key, head = self._head(url, method)
        data = _with_body(head, body or b"") if method == "POST" else head
        conn = self._idle_connection(key) or await self._connect(key, timeout if connect_timeout is None else connect_timeout)
        try:  # a timer per request: these are rare (health checks, probes), and their timeouts short
            return await asyncio.wait_for(self._round_trip(conn, key, data, float("inf")), timeout if timeout > 0 else None)
        except asyncio.TimeoutError:
            raise TransportError("timeout", f"timed out waiting for the reply ({timeout:g} s)") from None

    async def _round_trip(self, conn: _Reply, key: tuple[str, str, int], data: bytes, read_timeout: float) -> tuple[int, bytes]:
        """Send ``data`` on ``conn``, await the reply; pool the connection again when it may be reused."""
        try:
            status, reply, keep = await conn.send(data, read_timeout)
        except BaseException:  # TransportError, or the request was cancelled
            self._all.discard(conn)
            conn.abort()
            raise
        if keep and not conn.closed:
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle[key].append(conn)
        else:
            self._all.discard(conn)
            conn.abort()
        return status, reply

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing
