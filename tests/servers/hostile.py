"""A generation server that misbehaves on purpose, for ``dqa regen``'s hostile-server tests.

It answers SGLang's read-only routes honestly (``/health``, ``/health_generate``,
``/server_info``, ``/get_server_info``, ``/v1/models``, ``GET /generate`` 405) so that dqa's
preflight and health checks see an ordinary SGLang 0.5.23 server, and answers every
``POST /generate`` with one of the ``BEHAVIOURS``: raw bytes written on the socket, so every
framing a real (or broken, or malicious) peer might send can be produced. It runs on an asyncio
loop in a thread of the test process; ``dqa regen`` runs as a separate process against it.
"""

from __future__ import annotations

import asyncio
import gzip
import json

from servers.in_thread import InThreadServer

INFO = {"version": "0.5.23", "context_length": 40960, "served_model_name": "Qwen/Qwen3-8B", "model_path": "Qwen/Qwen3-8B"}
MODELS = {"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "max_model_len": 40960}]}
# A well-formed /generate reply: a short thought and "Four." (Qwen3 ids), finished.
GOOD_REPLY = {"text": "x", "output_ids": [151667, 198, 40, 1744, 13, 198, 151668, 271, 26972, 13, 151645],
              "meta_info": {"finish_reason": {"type": "stop"}, "prompt_tokens": 20, "completion_tokens": 11}}


def _reply(status: int, body: bytes, *headers: str) -> bytes:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _drain(writer) -> None:
    """``writer.drain()``, ending the behaviour once the client has hung up (asyncio would only log
    each write to a closed socket)."""
    if writer.is_closing():
        raise ConnectionResetError("the client hung up")
    await writer.drain()


async def endless_headers(writer):
    writer.write(b"HTTP/1.1 200 OK\r\n")
    for i in range(10_000_000):
        writer.write(b"X-Padding-%d: %s\r\n" % (i, b"a" * 100))
        if i % 100 == 0:
            await _drain(writer)


async def huge_content_length(writer):
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000000\r\n\r\n{\"output_ids\":[")
    while True:
        writer.write(b"1," * 32768)
        await _drain(writer)


async def endless_chunked(writer):
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"1," * 2048
    while True:
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await _drain(writer)


async def trickle(writer):
    """A well-formed reply, one byte every 0.2 s (~50 s in all): never silent for long, never done soon."""
    for i, byte in enumerate(_reply(200, json.dumps(GOOD_REPLY).encode())):
        writer.write(bytes([byte]))
        await _drain(writer)
        if i > 100:  # the head at once, then the body a byte at a time
            await asyncio.sleep(0.2)


async def trickle_huge(writer):
    """One byte every 0.5 s of a reply announced as 1 GB: it would never end."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n")
    while True:
        writer.write(b" ")
        await _drain(writer)
        await asyncio.sleep(0.5)


async def two_content_lengths(writer):
    """The first length covers a smuggled second reply (a well-formed one) that a lenient client reads as the answer."""
    smuggled = _reply(200, json.dumps(GOOD_REPLY).encode())
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: %d\r\n\r\n{}" % (2 + len(smuggled)) + smuggled)
    await writer.drain()
    await asyncio.sleep(30)


async def signed_chunk_size(writer):
    body = json.dumps(GOOD_REPLY).encode()
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n+0x%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    await writer.drain()
    await asyncio.sleep(30)


async def underscore_chunk_size(writer):
    body = json.dumps(GOOD_REPLY).encode()
    size = b"%x" % len(body)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + size[:1] + b"_" + size[1:]
                 + b"\r\n" + body + b"\r\n0\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(30)


async def gzip_reply(writer):
    """A well-formed reply, gzip-encoded (as a compressing proxy in front of a server sends it)."""
    body = gzip.compress(json.dumps(GOOD_REPLY).encode())
    writer.write(_reply(200, body, "Content-Encoding: gzip"))
    await writer.drain()


BEHAVIOURS = {f.__name__: f for f in (endless_headers, huge_content_length, endless_chunked, trickle, trickle_huge, two_content_lengths,
                                      signed_chunk_size, underscore_chunk_size, gzip_reply)}


class HostileServer(InThreadServer):
    """``HostileServer("trickle").start()``: listening on a free loopback port (``url``) until
    ``stop()``; ``posts`` counts the generation requests it got."""

    def __init__(self, behaviour: str):
        super().__init__()
        self.behaviour = BEHAVIOURS[behaviour]
        self.posts = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = next((int(v) for k, _, v in (line.partition(":") for line in lines[1:]) if k.strip().lower() == "content-length"), 0)
                await reader.readexactly(length)
                if method == "POST" and path == "/generate":
                    self.posts += 1
                    await self.behaviour(writer)
                    writer.close()
                    return
                writer.write(self._honest(method, path))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _honest(method: str, path: str) -> bytes:
        if path in ("/health", "/health_generate"):
            return _reply(200, b"")
        if path in ("/server_info", "/get_server_info"):
            return _reply(200, json.dumps(INFO).encode())
        if path == "/v1/models":
            return _reply(200, json.dumps(MODELS).encode())
        if path == "/generate":
            return _reply(405, b'{"detail":"Method Not Allowed"}', "Allow: POST")
        return _reply(404, b'{"detail":"Not Found"}')
