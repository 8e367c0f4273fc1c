"""A real S3 API server for the tests, and a proxy in front of it that can fail.

``S3Server`` runs moto in server mode (``moto_server``, its own process) on a free loopback port,
as s3fs's and pandas' own tests do. ``store_env`` gives the standard AWS environment that points
an SDK at it (``AWS_ENDPOINT_URL`` and test credentials): dqa is told about the store only that
way. ``FaultProxy`` is a small aiohttp reverse proxy in front of the server, run in a thread: it
counts the requests and the response bytes it passes on, answers ``503 SlowDown`` (S3's
throttling reply) to every n-th request, and can play dead (reset every connection) after a
number of writes, or until healed.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class S3Server:
    """``moto_server`` on 127.0.0.1, port chosen by the OS. ``url``: its endpoint."""

    def __init__(self, auth: bool = False):
        env = dict(os.environ)
        if auth:  # every request must carry an access key the server knows (none does): InvalidAccessKeyId
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        self.proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", "0"], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.monotonic() + 60
        seen = []
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"moto_server exited: {''.join(seen)}")
            seen.append(line)
            m = re.search(r"Running on (http://127\.0\.0\.1:\d+)", line)
            if m:
                self.url = m.group(1)
                break
        else:
            raise RuntimeError("moto_server did not start in 60 s")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def store_env(endpoint: str, key: str = "testing") -> dict[str, str]:
    """The standard AWS environment for a test store: endpoint, region, test credentials, no instance metadata."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": f"{key}-secret-do-not-print",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_MAX_ATTEMPTS": "4",
    }


def new_bucket(endpoint: str) -> str:
    """A fresh bucket on the server (one per test). Returns its name."""
    import boto3

    name = f"t-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return name


def upload(endpoint: str, local: Path, url: str) -> None:
    """Copy a local file or folder to ``s3://bucket/prefix`` (``url``) with boto3, as a user's own tooling would."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    for f in files:
        key = prefix if local.is_file() else f"{prefix.rstrip('/')}/{f.relative_to(local).as_posix()}"
        client.upload_file(str(f), bucket, key)
        # moto works out an object's ETag on first use, reading its buffer without the lock its GETs take: two
        # first requests at once can read torn bytes. One HEAD here does it before any reader comes.
        client.head_object(Bucket=bucket, Key=key)


def keys(endpoint: str, url: str) -> list[str]:
    """The keys of the files under ``s3://bucket/prefix``, relative to the prefix, sorted."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    prefix = prefix.rstrip("/") + "/"
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        # Keys ending in "/" are the empty folder markers pyarrow's S3 filesystem keeps: folders, not files.
        out += [o["Key"][len(prefix):] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    return sorted(out)


class FaultProxy:
    """A reverse proxy to ``upstream`` on a free loopback port (``url``), with counters and faults.

    ``slow_down_every``: answer 503 SlowDown to every n-th request (0: never). ``dead``: reset
    every connection. ``die_after_writes``: play dead once that many PUT/POST requests passed.
    ``bytes_out``: response body bytes passed to clients; ``requests``: (method, path) seen.
    """

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.slow_down_every = 0
        self.dead = False
        self.die_after_writes: int | None = None
        self.writes = 0
        self.bytes_out = 0
        self.requests: list[tuple[str, str]] = []
        self.throttled = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("proxy did not start")

    def reset_counts(self) -> None:
        with self._lock:
            self.bytes_out = 0
            self.requests = []
            self.throttled = 0
            self.writes = 0

    def _serve(self) -> None:
        from aiohttp import ClientSession, web

        async def handle(request: "web.Request") -> "web.StreamResponse":
            with self._lock:
                self.requests.append((request.method, request.path_qs))
                n = len(self.requests)
                if request.method in ("PUT", "POST"):
                    self.writes += 1
                    if self.die_after_writes is not None and self.writes > self.die_after_writes:
                        self.dead = True
                dead = self.dead
                throttle = bool(self.slow_down_every) and n % self.slow_down_every == 0
                if throttle:
                    self.throttled += 1
            if dead:
                assert request.transport is not None
                request.transport.abort()  # the store is gone: the connection resets mid-request
                raise asyncio.CancelledError
            body = await request.read()
            if throttle:
                return web.Response(status=503, body=SLOW_DOWN, content_type="application/xml")
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length", "transfer-encoding")}
            async with session.request(request.method, self.upstream + request.path_qs, headers=headers, data=body,
                                       allow_redirects=False, auto_decompress=False) as up:
                data = await up.read()
                out = {k: v for k, v in up.headers.items() if k.lower() not in ("content-length", "transfer-encoding", "connection")}
                with self._lock:
                    self.bytes_out += len(data)
                resp = web.Response(status=up.status, body=data, headers=out)
                if request.method == "HEAD":
                    resp.headers["Content-Length"] = up.headers.get("Content-Length", "0")
                return resp

        async def main() -> None:
            nonlocal session
            session = ClientSession(auto_decompress=False)
            app = web.Application(client_max_size=1 << 30)
            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            site = web.SockSite(runner, sock)
            await site.start()
            self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            self._ready.set()
            await asyncio.Event().wait()

        session: Any = None
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(main())
        except RuntimeError:
            pass
