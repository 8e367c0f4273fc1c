"""regen's transport (aiohttp under dqa's ``Transport`` seam) reads every reply a server may
honestly send, reuses connections, never sends a request twice, and turns every failure, and
every reply that breaks the rules, into a ``TransportError`` of the right kind within its
deadline and within its size limit.

The server here is a raw asyncio socket server that answers each request with scripted bytes, so
the tests control framing exactly: ``Content-Length``, chunked, ``Connection: close``, an HTTP/1.0
reply that runs to the end of the connection, a reply in one-byte pieces, a connection closed while
idle or mid-reply, a server that never answers, and the hostile ones (tests/reliability/
test_hostile_servers.py drives the same through ``dqa regen``).
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import zlib

import pytest

from dqa.regen.wire.transport import AiohttpTransport, TransportError

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
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        if hasattr(self.server, "close_clients"):
            self.server.close_clients()
        await self.server.wait_closed()


async def two_posts(t, url):
    """Client steps: two requests, one after the other."""
    return await t.post(url, b"{}"), await t.post(url, b"{}")


async def failed_post(t, url, limit=None):
    """Client steps: one request that must fail; returns its TransportError."""
    with pytest.raises(TransportError) as info:
        await t.post(url, b"{}", limit)
    return info.value


async def timed_failed_post(t, url, limit=None):
    """``failed_post``, and how long the request took to fail."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    return await failed_post(t, url, limit), loop.time() - t0


def run(replies, client_steps, **transport_kwargs):
    """Start a scripted server, run ``client_steps(transport, url)``, return (its result, server)."""

    async def main():
        srv = Scripted(replies)
        url = await srv.start()
        t = AiohttpTransport({"Authorization": "Bearer k", "Content-Type": "application/json"}, **transport_kwargs)
        try:
            return await client_steps(t, url), srv
        finally:
            await t.close()
            await srv.stop()

    return asyncio.run(main())


def header_lines(request: bytes) -> list[bytes]:
    return [line.lower() for line in request.partition(b"\r\n\r\n")[0].split(b"\r\n")]


def test_a_kept_alive_connection_serves_every_request_and_the_request_is_well_formed():
    async def steps(t, url):
        return [await t.post(url, b'{"n":%d}' % i) for i in range(3)]

    out, srv = run([ok(), ok(b"{}"), ok(b"[]")], steps)
    assert out == [(200, JSON_OK), (200, b"{}"), (200, b"[]")]
    assert srv.connections == 1
    head, _, body = srv.requests[1].partition(b"\r\n\r\n")
    lines = header_lines(srv.requests[1])
    assert lines[0] == b"post /generate http/1.1" and body == b'{"n":1}'
    assert b"authorization: bearer k" in lines and b"content-type: application/json" in lines
    assert b"content-length: 7" in lines and any(line.startswith(b"host: 127.0.0.1:") for line in lines)
    assert not any(line.startswith(b"cookie") for line in lines)


def test_a_chunked_reply_is_reassembled():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n6;ext=1\r\n:[1,2]\r\n1\r\n}\r\n0\r\n\r\n"

    out, srv = run([chunked, ok()], two_posts)
    assert out == ((200, b'{"a":[1,2]}'), (200, JSON_OK)) and srv.connections == 1


def test_gzip_and_deflate_replies_are_decoded():
    body = b'{"output_ids":[1,2,3]}'
    gz = gzip.compress(body)
    df = zlib.compress(body)
    replies = [
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz) + gz,
        b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n" % len(df) + df,
    ]
    out, srv = run(replies, lambda t, url: two_posts(t, url))
    assert out == ((200, body), (200, body))
    assert any(line.startswith(b"accept-encoding: gzip, deflate") for line in header_lines(srv.requests[0]))


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
    "reply, kind, words",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"partial", "reply", "body is broken"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":", "reply", "body is broken"),
        (b"HTTP/1.1 200 OK\r\nContent-Len", "io", "closed the connection before a full reply"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "reply", "not valid HTTP"),
    ],
)
def test_a_broken_reply_is_an_error_naming_what_broke(reply, kind, words):
    async def send_and_close(writer):
        writer.write(reply)
        await writer.drain()
        writer.close()

    err, _ = run([send_and_close], failed_post)
    assert err.kind == kind and words in str(err) and "127.0.0.1" in str(err)


def test_no_reply_within_the_request_timeout_is_a_timeout():
    async def never(writer):
        await asyncio.sleep(5)

    (err, waited), _ = run([never], timed_failed_post, request_timeout=0.2)
    assert err.kind == "timeout" and err.connected and "within 0.2 s" in str(err)
    assert waited < 4  # the timeout, not the server, ended the wait


def test_a_refused_connection_is_a_connect_error():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main():
        t = AiohttpTransport()
        try:
            with pytest.raises(TransportError) as info:
                await t.post(f"http://127.0.0.1:{port}/generate", b"{}")
            return info.value
        finally:
            await t.close()

    err = asyncio.run(main())
    assert err.kind == "connect" and not err.connected and str(port) in str(err)


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


def test_a_timed_out_request_leaves_its_task_uncancelled_and_an_outside_cancel_stays_a_cancel():
    async def never(writer):
        await asyncio.sleep(3)

    async def steps(t, url):
        err = await failed_post(t, url)  # the deadline's cancellation became a timeout ...
        await asyncio.sleep(0.01)  # ... and nothing of it is left pending on this task
        task = asyncio.current_task()
        leftover = task.cancelling() if hasattr(task, "cancelling") else 0
        # A cancel from outside, before the deadline, is the caller's: it stays a cancel.
        inner = asyncio.ensure_future(t.post(url, b"{}"))
        await asyncio.sleep(0.1)
        inner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await inner
        return err, leftover

    (err, leftover), _ = run([never, never], steps, request_timeout=0.3)
    assert err.kind == "timeout" and leftover == 0


def test_a_reused_connection_dropped_without_a_reply_is_an_error_and_is_not_resent():
    """The server may have read the request before it dropped the connection: the transport never
    sends a POST twice (the dispatcher decides about retrying), and the next request reconnects."""

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
    assert err.kind == "io" and srv.connections == 1 and len(srv.requests) == 1


def test_interim_1xx_replies_are_skipped():
    out, _ = run([b"HTTP/1.1 100 Continue\r\n\r\n" + ok()], lambda t, url: t.post(url, b"{}"))
    assert out == (200, JSON_OK)


def test_bytes_after_a_reply_are_never_taken_for_the_next_reply():
    """A server that sends a second reply nobody asked for: the next request must not read it."""

    out, srv = run([ok() + b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n\"stale\"", ok(b"{}")], two_posts)
    assert out[0] == (200, JSON_OK)
    assert out[1] == (200, b"{}") and len(srv.requests) == 2


@pytest.mark.parametrize("reply, words", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\n{}", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}", "Content-Length"),
    # two lengths: the first covers a smuggled second reply
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 45\r\n\r\n{}HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", "Duplicate Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "Transfer-Encoding"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", "chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+0x2\r\n{}\r\n0\r\n\r\n", "chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0_2\r\n{}\r\n0\r\n\r\n", "chunk size"),
])
def test_conflicting_or_malformed_framing_fails_at_once_and_is_never_a_reply(reply, words):
    async def send_and_wait(writer):
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(10)

    (err, waited), _ = run([send_and_wait], timed_failed_post, request_timeout=30)
    assert err.kind == "reply" and words in str(err) and waited < 5


def test_endless_or_overlong_headers_are_refused_at_once():
    async def endless(writer):
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(100_000):
            writer.write(b"X-H%d: %s\r\n" % (i, b"a" * 100))
            if i % 100 == 0:
                await writer.drain()

    async def long_line(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nX-A: ")
        for _ in range(10_000):
            writer.write(b"a" * 10_000)
            await writer.drain()

    for script in (endless, long_line):
        (err, waited), _ = run([script], timed_failed_post, request_timeout=30)
        assert err.kind == "reply" and "not valid HTTP" in str(err) and waited < 5


def test_a_reply_over_its_size_limit_fails_at_once_or_as_soon_as_it_grows_past_it():
    async def huge_length(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\n")
        for _ in range(100_000):
            writer.write(b"a" * 65536)
            await writer.drain()

    async def endless_chunks(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(1_000_000):
            writer.write(b"1000\r\n" + b"a" * 4096 + b"\r\n")
            await writer.drain()

    bomb = gzip.compress(b"0" * 50_000_000)  # 50 MB once decoded

    async def gzip_bomb(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb) + bomb)
        await writer.drain()
        await asyncio.sleep(10)

    for script, words in ((huge_length, "100,000,000,000 bytes"), (endless_chunks, "body still coming"), (gzip_bomb, "body still coming")):
        (err, waited), _ = run([script], lambda t, url: timed_failed_post(t, url, limit=1_000_000), request_timeout=30)
        assert err.kind == "reply" and "1,000,000-byte limit" in str(err) and words in str(err), script
        assert waited < 10


def test_a_reply_that_trickles_on_is_cut_off_by_the_deadline_of_the_whole_reply():
    """``request_timeout`` is one deadline from the connection to the reply's last byte, not an
    idle timer: a server sending a byte every 50 ms (30 s in all) is cut off at 1 s."""

    async def trickle(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
        for _ in range(600):
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    (err, waited), _ = run([trickle], timed_failed_post, request_timeout=1.0)
    assert err.kind == "timeout" and err.connected and "within 1 s" in str(err)
    assert 0.9 < waited < 4


def test_a_chunked_reply_with_a_trailer_leaves_the_connection_clean():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Checksum: 1\r\n\r\n"

    out, srv = run([chunked, ok()], two_posts)
    assert out == ((200, b"{}"), (200, JSON_OK)) and srv.connections == 1


def test_connection_close_among_other_tokens_closes():
    out, srv = run([ok(extra=b"Connection: close, TE\r\n"), ok()], two_posts)
    assert srv.connections == 2


def test_a_zero_timeout_means_no_limit():
    async def late(writer):
        await asyncio.sleep(0.3)
        writer.write(ok())
        await writer.drain()

    out, _ = run([late], lambda t, url: t.post(url, b"{}"), request_timeout=0, connect_timeout=0)
    assert out == (200, JSON_OK)


def test_credentials_in_the_endpoint_url_are_sent_as_basic_auth_unless_a_token_is_set():
    async def steps(t, url):
        creds = url.replace("http://", "http://user:p%40ss@")
        plain = AiohttpTransport()
        try:
            await plain.post(creds, b"{}")
        finally:
            await plain.close()
        return await t.post(creds, b"{}")  # t carries "Authorization: Bearer k"

    _, srv = run([ok(), ok()], steps)
    basic, bearer = header_lines(srv.requests[0]), header_lines(srv.requests[1])
    assert b"authorization: basic dxnlcjpwqhnz" in basic  # base64 of "user:p@ss", lower-cased
    assert b"authorization: bearer k" in bearer and not any(b"basic" in line for line in bearer)
    assert not any(line.startswith(b"host: user") for line in basic + bearer)


def test_an_idle_connection_past_its_expiry_is_not_reused(monkeypatch):
    from dqa.regen.wire import transport

    monkeypatch.setattr(transport, "IDLE_EXPIRY", 0.05)

    async def steps(t, url):
        first = await t.post(url, b"{}")
        await asyncio.sleep(1.2)  # aiohttp sweeps expired connections on a ~1 s clock
        return first, await t.post(url, b"{}")

    out, srv = run([ok(), ok()], steps)
    assert srv.connections == 2


def test_at_most_per_host_connections_are_open_to_one_endpoint():
    async def slow(writer):
        await asyncio.sleep(0.2)
        writer.write(ok())
        await writer.drain()

    async def steps(t, url):
        return await asyncio.gather(*[t.post(url, b"{}") for _ in range(6)])

    out, srv = run([slow] * 6, steps, per_host=2)
    assert out == [(200, JSON_OK)] * 6 and srv.connections == 2


# ---------------------------------------------------------------------------- request(): health checks and probes


def test_a_get_carries_no_body_and_shares_the_pool_with_posts():
    async def steps(t, url):
        return await t.request("GET", url.replace("/generate", "/health"), timeout=5), await t.post(url, b"{}")

    out, srv = run([ok(b""), ok()], steps)
    assert out == ((200, b""), (200, JSON_OK)) and srv.connections == 1
    head, _, body = srv.requests[0].partition(b"\r\n\r\n")
    lines = header_lines(srv.requests[0])
    assert lines[0] == b"get /health http/1.1" and body == b""
    assert b"authorization: bearer k" in lines
    assert not any(line.startswith((b"content-length: 1", b"content-type")) for line in lines)


def test_a_post_request_sends_its_body():
    async def steps(t, url):
        return await t.request("POST", url, b'{"x":1}', timeout=5)

    out, srv = run([ok()], steps)
    assert out == (200, JSON_OK)
    assert srv.requests[0].endswith(b"\r\n\r\n{\"x\":1}") and b"content-length: 7" in header_lines(srv.requests[0])


def test_a_redirect_is_returned_not_followed():
    reply = b"HTTP/1.1 308 Permanent Redirect\r\nLocation: https://elsewhere/generate\r\nContent-Length: 0\r\n\r\n"
    out, srv = run([reply], lambda t, url: t.request("GET", url, timeout=5))
    assert out == (308, b"") and len(srv.requests) == 1


def test_a_request_ends_at_its_own_timeout_and_a_connection_was_made():
    async def never(writer):
        await asyncio.sleep(5)

    async def steps(t, url):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TransportError) as info:
            await t.request("GET", url, timeout=0.2)
        return info.value, loop.time() - t0

    (err, waited), _ = run([never], steps, request_timeout=60)
    assert err.kind == "timeout" and err.connected
    assert waited < 4  # its own 0.2 s, not the transport's 60 s


def test_a_probe_reply_is_capped_too():
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n" + b"a" * 100
    err, _ = run([reply], lambda t, url: _failed_request(t, url))
    assert err.kind == "reply" and "limit" in str(err)


async def _failed_request(t, url):
    with pytest.raises(TransportError) as info:
        await t.request("GET", url, timeout=5)
    return info.value


def test_a_refused_or_unconnectable_request_says_no_connection_was_made(monkeypatch):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main():
        t = AiohttpTransport()
        errors = []
        try:
            for url in (f"http://127.0.0.1:{port}/health", "ftp://example/health"):
                with pytest.raises(TransportError) as info:
                    await t.request("GET", url, timeout=5)
                errors.append(info.value)
            loop = asyncio.get_running_loop()

            async def hangs(*args, **kwargs):  # a SYN nobody answers
                await asyncio.sleep(30)

            monkeypatch.setattr(loop, "sock_connect", hangs)  # aiohttp connects through aiohappyeyeballs
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


def test_a_session_of_the_callers_is_used_and_left_open():
    import aiohttp

    async def main():
        srv = Scripted([ok()])
        url = await srv.start()
        async with aiohttp.ClientSession() as session:
            t = AiohttpTransport({"Authorization": "Bearer k"}, session=session)
            got = await t.request("GET", url, timeout=5)
            await t.close()
            still_open = not session.closed
        await srv.stop()
        return got, still_open, srv

    got, still_open, srv = asyncio.run(main())
    assert got == (200, JSON_OK) and still_open and b"authorization: bearer k" in header_lines(srv.requests[0])
