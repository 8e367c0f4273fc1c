"""The HTTP transport of regen's hot path: one POST per attempt, over kept-alive connections.

``Transport`` is the extension point: ``post(url, body)`` returns ``(status, body)`` or raises a
``TransportError`` saying what went wrong (the dispatcher retries those). Two implementations:

- ``Http11Transport`` (the default): a small HTTP/1.1 client on asyncio protocols. Regen sends the
  same request shape millions of times to a handful of servers, so the request head is built from a
  cached prefix and the reply is parsed for exactly what it needs (status, ``Content-Length`` or
  chunked body, ``Connection: close``). It costs about a third of aiohttp's client CPU per request
  (bench/README.md, regen client), which on a large fleet is the dispatcher's own ceiling.
- ``AiohttpTransport``: the same over an ``aiohttp.ClientSession`` (health checks and discovery
  keep using aiohttp; tests may pass a session).

Timeouts follow aiohttp's ``sock_connect`` / ``sock_read``: ``connect`` bounds opening a
connection, ``read`` the wait for the next bytes of the reply (a non-streamed generation sends
nothing until it is done, so this bounds the whole reply).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import defaultdict
from urllib.parse import urlsplit


class TransportError(Exception):
    """A request that got no complete reply. ``kind``: ``connect`` (no connection could be made:
    refused, unreachable, a bad address), ``timeout`` (connecting took over ``connect`` seconds, or
    no reply bytes came for ``read`` seconds) or ``io`` (the connection broke, or the reply was not
    HTTP)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Transport:
    """Posts request bodies; see the module docstring."""

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``url``; return ``(status, reply body)``. Raises ``TransportError``."""
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


class _Reply(asyncio.Protocol):
    """One connection: writes a request, parses the HTTP/1.1 reply into ``(status, body, keep)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.got_bytes = False
        self.last_read = 0.0  # loop time of the request's send or its latest reply bytes (read timeout)
        self.read_timeout = 0.0

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self._parse(eof=True)
            if not self.waiter.done():
                why = f": {exc}" if exc else ""
                self._fail("io", f"the server closed the connection before a full reply{why}")

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.got_bytes = True
        if self.waiter is not None and not self.waiter.done():
            self.last_read = self.loop.time()
            self._parse(eof=False)

    def eof_received(self) -> bool:
        return False  # close our side too: connection_lost follows

    # -- one request
    def send(self, data: bytes, read_timeout: float) -> asyncio.Future:
        self.buf.clear()
        self.got_bytes = False
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
        """Drop the connection (the request was cancelled)."""
        if self.transport is not None:
            self.transport.close()

    def _fail(self, kind: str, message: str) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(TransportError(kind, message))
        if self.transport is not None:
            self.transport.close()

    def _done(self, status: int, body: bytes, keep: bool) -> None:
        assert self.waiter is not None
        self.waiter.set_result((status, body, keep))

    def _parse(self, eof: bool) -> None:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if eof:
                self._fail("io", "the server closed the connection before a full reply")
            return
        lines = bytes(buf[:end]).split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            self._fail("io", f"the reply is not HTTP/1.x: {bytes(lines[0][:80])!r}")
            return
        status = int(parts[1])
        length, chunked, keep = None, False, parts[0] != b"HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip() or b"0")
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                v = value.strip().lower()
                keep = v == b"keep-alive" or (keep and v != b"close")
        start = end + 4
        if chunked:
            body = _dechunk(buf, start)
            if body is None:
                if eof:
                    self._fail("io", "the server closed the connection inside a chunked reply")
                return
            self._done(status, body, keep)
        elif length is not None:
            if len(buf) - start < length:
                if eof:
                    self._fail("io", f"the server closed the connection after {len(buf) - start} of {length} reply bytes")
                return
            self._done(status, bytes(buf[start : start + length]), keep)
        elif status in (204, 304) or 100 <= status < 200:
            self._done(status, b"", keep)
        elif eof:  # no length: the body runs to the end of the connection
            self._done(status, bytes(buf[start:]), False)


def _dechunk(buf: bytearray, pos: int) -> bytes | None:
    """The body of a complete chunked reply starting at ``pos``; None while incomplete."""
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip() or b"0", 16)
        pos = eol + 2
        if size == 0:
            return bytes(out) if buf.find(b"\r\n", pos) >= 0 else None  # the (empty) trailer's end
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
        self._heads: dict[str, tuple[tuple[str, str, int], bytes]] = {}
        self._all: set[_Reply] = set()
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.Task | None = None

    def _head(self, url: str) -> tuple[tuple[str, str, int], bytes]:
        """The pool key and the request head up to ``Content-Length: `` for ``url`` (cached)."""
        cached = self._heads.get(url)
        if cached is None:
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise TransportError("connect", f"{url}: not an http(s) URL")
            port = u.port or (443 if u.scheme == "https" else 80)
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            host = u.netloc.rsplit("@", 1)[-1]
            lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Accept: */*"]
            lines += [f"{k}: {v}" for k, v in self.headers.items()]
            cached = ((u.scheme, u.hostname, port), ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1"))
            self._heads[url] = cached
        return cached

    async def _connect(self, key: tuple[str, str, int]) -> _Reply:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        context = self._ssl if scheme == "https" else None
        try:
            _, proto = await asyncio.wait_for(loop.create_connection(lambda: _Reply(loop), host, port, ssl=context),
                                              self.connect_timeout)
        except asyncio.TimeoutError:
            raise TransportError("timeout", f"connecting to {host}:{port} timed out after {self.connect_timeout:g} s") from None
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

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        if self._sweeper is None or self._sweeper.done():  # started with the first request, in its loop
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        key, head = self._head(url)
        data = b"".join((head, str(len(body)).encode(), b"\r\n\r\n", body))
        idle = self._idle[key]
        while True:
            reused = False
            while idle:
                conn = idle.pop()
                if not conn.closed:
                    reused = True
                    break
                self._all.discard(conn)
            else:
                conn = await self._connect(key)
            try:
                status, reply, keep = await conn.send(data, self.read_timeout)
            except TransportError as exc:
                self._all.discard(conn)
                if reused and exc.kind == "io" and not conn.got_bytes:
                    continue  # the server had closed this idle connection: send again on a fresh one
                raise
            except asyncio.CancelledError:
                self._all.discard(conn)
                conn.abort()
                raise
            if keep and not conn.closed:
                idle.append(conn)
            else:
                self._all.discard(conn)
                if conn.transport is not None:
                    conn.transport.close()
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
