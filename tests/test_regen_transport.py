"""regen's HTTP/1.1 transport reads every reply shape a server may send, reuses connections, and
turns every failure into a ``TransportError`` of the right kind.

The server here is a raw asyncio socket server that answers each request with scripted bytes, so
the tests control framing exactly: ``Content-Length``, chunked, ``Connection: close``, an HTTP/1.0
reply that runs to the end of the connection, a reply in one-byte pieces, a connection closed while
idle or mid-reply, a server that never answers.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from dqa.regen.transport import Http11Transport, TransportError

JSON_OK = b'{"ok":true}'


def ok(body: bytes = JSON_OK, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body


class Scripted:
    """A socket server answering request ``i`` (over all connections) with ``replies[i]``: bytes to
    send, or a callable ``(writer) -> awaitable`` for anything else. Records requests and connections."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests: list[bytes] = []
        self.connections = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/generate"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                reply = self.replies.pop(0)
                if callable(reply):
                    await reply(writer)
                    if writer.is_closing():
                        return
                else:
                    writer.write(reply)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


async def two_posts(t, url):
    """Client steps: two requests, one after the other."""
    return await t.post(url, b"{}"), await t.post(url, b"{}")


async def failed_post(t, url):
    """Client steps: one request that must fail; returns its TransportError."""
    with pytest.raises(TransportError) as info:
        await t.post(url, b"{}")
    return info.value


async def timed_failed_post(t, url):
    """``failed_post``, and how long the request took to fail."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    return await failed_post(t, url), loop.time() - t0


def run(replies, client_steps, **transport_kwargs):
    """Start a scripted server, run ``client_steps(transport, url)``, return (its result, server)."""

    async def main():
        srv = Scripted(replies)
        url = await srv.start()
        t = Http11Transport({"Authorization": "Bearer k"}, **transport_kwargs)
        try:
            return await client_steps(t, url), srv
        finally:
            await t.close()
            await srv.stop()

    return asyncio.run(main())


def test_a_kept_alive_connection_serves_every_request_and_the_request_is_well_formed():
    async def steps(t, url):
        return [await t.post(url, b'{"n":%d}' % i) for i in range(3)]

    out, srv = run([ok(), ok(b"{}"), ok(b"[]")], steps)
    assert out == [(200, JSON_OK), (200, b"{}"), (200, b"[]")]
    assert srv.connections == 1
    head, _, body = srv.requests[1].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /generate HTTP/1.1" and body == b'{"n":1}'
    assert b"Authorization: Bearer k" in lines and b"Content-Type: application/json" in lines
    assert b"Content-Length: 7" in lines and any(line.startswith(b"Host: 127.0.0.1:") for line in lines)


def test_a_chunked_reply_is_reassembled():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n6;ext=1\r\n:[1,2]\r\n1\r\n}\r\n0\r\n\r\n"

    out, srv = run([chunked, ok()], two_posts)
    assert out == ((200, b'{"a":[1,2]}'), (200, JSON_OK)) and srv.connections == 1


def test_connection_close_and_http10_replies_are_read_and_the_next_request_reconnects():
    async def close_after(writer):
        writer.write(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n\r\nstarting up")
        await writer.drain()
        writer.close()

    async def steps(t, url):
        return [await t.post(url, b"{}") for _ in range(3)]

    out, srv = run([ok(extra=b"Connection: close\r\n"), close_after, ok()], steps)
    assert out == [(200, JSON_OK), (503, b"starting up"), (200, JSON_OK)]
    assert srv.connections == 3


def test_a_reply_arriving_one_byte_at_a_time_parses():
    async def trickle(writer):
        for i in range(len(payload)):
            writer.write(payload[i : i + 1])
            await writer.drain()

    payload = ok(b'{"output_ids":[1,2,3]}')
    out, _ = run([trickle], lambda t, url: t.post(url, b"{}"))
    assert out == (200, b'{"output_ids":[1,2,3]}')


def test_an_idle_connection_the_server_closed_is_replaced_without_an_error():
    async def reply_then_close(writer):
        writer.write(ok())
        await writer.drain()
        writer.close()  # keep-alive announced, then closed while idle (a server's idle timeout)

    async def steps(t, url):
        first = await t.post(url, b"{}")
        await asyncio.sleep(0.05)  # the close reaches the client while the connection is pooled
        return first, await t.post(url, b"{}")

    out, srv = run([reply_then_close, ok(b"{}")], steps)
    assert out == ((200, JSON_OK), (200, b"{}")) and srv.connections == 2


@pytest.mark.parametrize(
    "reply, words",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"partial", "after 9 of 50 reply bytes"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":", "inside a chunked reply"),
        (b"HTTP/1.1 200 OK\r\nContent-Len", "before a full reply"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not HTTP/1.x"),
    ],
)
def test_a_broken_reply_is_an_io_error_naming_what_broke(reply, words):
    async def send_and_close(writer):
        writer.write(reply)
        await writer.drain()
        writer.close()

    err, _ = run([send_and_close], failed_post)
    assert err.kind == "io" and words in str(err)


def test_no_reply_within_the_read_timeout_is_a_timeout():
    async def never(writer):
        await asyncio.sleep(5)

    (err, waited), _ = run([never], timed_failed_post, read_timeout=0.2)
    assert err.kind == "timeout" and "timed out" in str(err)
    assert waited < 4  # the timeout, not the server, ended the wait


def test_a_refused_connection_is_a_connect_error():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main():
        t = Http11Transport()
        try:
            with pytest.raises(TransportError) as info:
                await t.post(f"http://127.0.0.1:{port}/generate", b"{}")
            return info.value
        finally:
            await t.close()

    err = asyncio.run(main())
    assert err.kind == "connect" and str(port) in str(err)


def test_a_cancelled_request_closes_its_connection_and_the_next_one_works():
    async def slow_then_ok(writer):
        await asyncio.sleep(0.3)
        writer.write(ok())
        await writer.drain()

    async def steps(t, url):
        task = asyncio.ensure_future(t.post(url, b"{}"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await t.post(url, b"{}")

    out, srv = run([slow_then_ok, ok(b"{}")], steps)
    assert out == (200, b"{}") and srv.connections == 2


def test_a_reused_connection_dropped_without_a_reply_is_an_error_and_is_not_resent():
    """The server may have read the request before it dropped the connection: the transport never
    sends a request twice (the dispatcher decides about retrying), and the next request reconnects."""

    async def drop(writer):
        writer.close()

    async def steps(t, url):
        first = await t.post(url, b"{}")
        with pytest.raises(TransportError) as info:
            await t.post(url, b"{}")
        return first, info.value, await t.post(url, b"{}")

    (first, err, third), srv = run([ok(), drop, ok(b"{}")], steps)
    assert first == (200, JSON_OK) and err.kind == "io" and third == (200, b"{}")
    assert len(srv.requests) == 3 and srv.connections == 2


def test_a_fresh_connection_dropped_without_a_reply_is_an_error():
    async def drop(writer):
        writer.close()

    err, srv = run([drop], failed_post)
    assert err.kind == "io" and srv.connections == 1


def test_interim_1xx_replies_are_skipped():
    out, _ = run([b"HTTP/1.1 100 Continue\r\n\r\n" + ok()], lambda t, url: t.post(url, b"{}"))
    assert out == (200, JSON_OK)


def test_bytes_after_a_reply_make_its_connection_unfit_for_reuse():
    """Anything past the reply could only be mistaken for the next request's reply."""

    out, srv = run([ok() + b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n\"stale\"", ok(b"{}")], two_posts)
    assert out == ((200, JSON_OK), (200, b"{}")) and srv.connections == 2


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
])
def test_malformed_framing_fails_at_once_as_an_io_error(reply):
    (err, waited), _ = run([reply], timed_failed_post, read_timeout=30)
    assert err.kind == "io" and "malformed" in str(err) and waited < 5


def test_a_chunked_reply_with_a_trailer_leaves_the_connection_clean():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Checksum: 1\r\n\r\n"

    out, srv = run([chunked, ok()], two_posts)
    assert out == ((200, b"{}"), (200, JSON_OK)) and srv.connections == 1


def test_connection_close_among_other_tokens_closes():
    out, srv = run([ok(extra=b"Connection: close, TE\r\n"), ok()], two_posts)
    assert srv.connections == 2


def test_a_zero_read_timeout_means_no_limit():
    async def late(writer):
        await asyncio.sleep(0.3)
        writer.write(ok())
        await writer.drain()

    out, _ = run([late], lambda t, url: t.post(url, b"{}"), read_timeout=0, connect_timeout=0)
    assert out == (200, JSON_OK)


def test_credentials_in_the_endpoint_url_are_sent_as_basic_auth():
    async def steps(t, url):
        t.headers.pop("Authorization")
        return await t.post(url.replace("http://", "http://user:p%40ss@"), b"{}")

    _, srv = run([ok()], steps)
    head = srv.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    assert b"Authorization: Basic dXNlcjpwQHNz" in head  # base64 of "user:p@ss"
    assert not any(line.startswith(b"Host: user") for line in head)


def test_an_idle_connection_past_its_expiry_is_not_reused(monkeypatch):
    from dqa.regen import transport

    monkeypatch.setattr(transport, "IDLE_EXPIRY", 0.05)

    async def steps(t, url):
        first = await t.post(url, b"{}")
        await asyncio.sleep(0.1)
        return first, await t.post(url, b"{}")

    out, srv = run([ok(), ok()], steps)
    assert srv.connections == 2


# ---------------------------------------------------------------------------- request(): health checks and probes


def test_a_get_carries_no_body_and_shares_the_pool_with_posts():
    async def steps(t, url):
        return await t.request("GET", url.replace("/generate", "/health"), timeout=5), await t.post(url, b"{}")

    out, srv = run([ok(b""), ok()], steps)
    assert out == ((200, b""), (200, JSON_OK)) and srv.connections == 1
    head, _, body = srv.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"GET /health HTTP/1.1" and body == b""
    assert b"Authorization: Bearer k" in lines
    assert not any(line.lower().startswith((b"content-length", b"content-type")) for line in lines)


def test_a_post_request_sends_its_body():
    async def steps(t, url):
        return await t.request("POST", url, b'{"x":1}', timeout=5)

    out, srv = run([ok()], steps)
    assert out == (200, JSON_OK)
    assert srv.requests[0].endswith(b"Content-Length: 7\r\n\r\n{\"x\":1}")


def test_a_request_ends_at_its_own_timeout_and_a_connection_was_made():
    async def never(writer):
        await asyncio.sleep(5)

    async def steps(t, url):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TransportError) as info:
            await t.request("GET", url, timeout=0.2)
        return info.value, loop.time() - t0

    (err, waited), _ = run([never], steps, read_timeout=60)
    assert err.kind == "timeout" and err.connected
    assert waited < 4  # its own 0.2 s, not the transport's 60 s read timeout


def test_a_refused_or_unconnectable_request_says_no_connection_was_made(monkeypatch):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main():
        t = Http11Transport()
        errors = []
        try:
            for url in (f"http://127.0.0.1:{port}/health", "ftp://example/health"):
                with pytest.raises(TransportError) as info:
                    await t.request("GET", url, timeout=5)
                errors.append(info.value)
            loop = asyncio.get_running_loop()

            async def hangs(*args, **kwargs):  # a SYN nobody answers
                await asyncio.sleep(30)

            monkeypatch.setattr(loop, "create_connection", hangs)
            with pytest.raises(TransportError) as info:
                await t.request("GET", f"http://127.0.0.1:{port}/health", timeout=5, connect_timeout=0.1)
            errors.append(info.value)
            return errors
        finally:
            await t.close()

    refused, bad_url, hung = asyncio.run(main())
    assert refused.kind == "connect" and not refused.connected and str(port) in str(refused)
    assert bad_url.kind == "connect" and not bad_url.connected
    assert hung.kind == "timeout" and not hung.connected and "connecting" in str(hung)


def test_the_aiohttp_transport_answers_requests_the_same_way():
    import aiohttp

    from dqa.regen.transport import AiohttpTransport

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]

    async def main():
        srv = Scripted([ok()])
        url = await srv.start()
        async with aiohttp.ClientSession() as session:
            t = AiohttpTransport(session, {"Authorization": "Bearer k"})
            try:
                got = await t.request("GET", url, timeout=5)
                with pytest.raises(TransportError) as info:
                    await t.request("GET", f"http://127.0.0.1:{closed_port}/health", timeout=5)
                return got, info.value, srv
            finally:
                await srv.stop()

    got, refused, srv = asyncio.run(main())
    assert got == (200, JSON_OK) and srv.requests[0].startswith(b"GET /generate HTTP/1.1")
    assert refused.kind == "connect" and not refused.connected


@pytest.mark.parametrize("kind", ["http11", "aiohttp"])
def test_a_reply_that_trickles_on_fails_as_a_timeout_of_the_whole_reply(kind):
    """``request(timeout=...)`` bounds the whole reply, not each read: a server sending a byte of a
    chunked reply every 50 ms (for 30 s in all) is cut off, not waited for."""
    import aiohttp

    from dqa.regen.transport import AiohttpTransport

    async def trickle(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(600):
            writer.write(b"1\r\n \r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def main():
        srv = Scripted([trickle])
        url = await srv.start()
        async with aiohttp.ClientSession() as session:
            t = Http11Transport() if kind == "http11" else AiohttpTransport(session)
            try:
                with pytest.raises(TransportError) as info:
                    await t.request("GET", url, timeout=1.0)
                return info.value
            finally:
                await t.close()
                await srv.stop()

    err = asyncio.run(main())
    assert err.kind == "timeout" and err.connected


def _framing_by_lines(head: bytes, keep: bool):
    """The framing rules read line by line (RFC 9112): the reference the transport's shortcut must match."""
    length, chunked = None, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        tokens = {t.strip() for t in value.split(b",")} - {b""}
        if name.strip() == b"content-length":
            if len(tokens) != 1 or not next(iter(tokens)).isdigit():
                return "error"
            length = int(next(iter(tokens)))
        elif name.strip() == b"transfer-encoding":
            chunked = b"chunked" in tokens
        elif name.strip() == b"connection":
            keep = b"keep-alive" in tokens or (keep and b"close" not in tokens)
    return length, chunked, keep


def test_reply_framing_matches_the_line_by_line_rules_for_every_header_mix():
    import itertools
    import random

    from dqa.regen.transport import _framing

    pool = [b"content-type: application/json", b"date: mon", b"server: uvicorn", b"content-length: 12",
            b"content-length:7", b"content-length: 12, 12", b"content-length: x1", b"content-length : 5",
            b"transfer-encoding: chunked", b"transfer-encoding: gzip", b"connection: close", b"connection: keep-alive",
            b"connection: upgrade, close", b"x-content-length: 99", b"content-length: 3 "]
    rng = random.Random(0)
    cases = [list(c) for n in range(4) for c in itertools.combinations(pool, n)]
    cases += [rng.sample(pool, rng.randint(1, 6)) for _ in range(300)]
    for lines in cases:
        head = b"".join(b"\r\n" + line for line in lines)
        for keep in (True, False):
            want = _framing_by_lines(head, keep)
            if want == "error":
                with pytest.raises(ValueError):
                    _framing(head, keep)
            else:
                assert _framing(head, keep) == want, lines
