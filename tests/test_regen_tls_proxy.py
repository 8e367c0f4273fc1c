"""TLS and proxies as a user sets them (issue 20): ``dqa regen`` verifies ``https://`` servers
against ``--ca-bundle``, ``$SSL_CERT_FILE`` or ``$REQUESTS_CA_BUNDLE``; a certificate it cannot
verify stops the run in seconds with one line naming the fix; and every HTTP call dqa makes
(``regen``'s, ``fleet status``'s) goes through ``HTTP_PROXY`` unless ``NO_PROXY`` names the host.

The server is the SGLang stand-in (tests/servers/sglang_contract.py), serving https with
SGLang's own ``--ssl-certfile``/``--ssl-keyfile`` flags and a certificate made here with
``openssl``; the proxy is a real forwarding HTTP proxy on the loopback (absolute-form requests
relayed to the origin), which records what it relayed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from regen_helpers import degenerate_dataset, read_shards, write_findings
from servers.in_thread import InThreadServer
from servers.sglang_contract import StubServer

ROWS = 5


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM), made with openssl."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def regen(tmp_path: Path, url: str, *extra: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """``dqa regen`` of 5 degenerate rows against ``url`` in a real process; ``(result, wall seconds)``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = degenerate_dataset(tmp_path / "data.parquet", ROWS)
    findings = write_findings(tmp_path / "scan", list(range(ROWS)))
    e = {k: v for k, v in os.environ.items() if k not in ("DQA_DEBUG", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
         and k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")}
    e.update(env or {})
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "dqa.cli", "regen", str(data), "--findings", str(findings), "--endpoint", url,
                        "--out", str(tmp_path / "out"), "--tokenizer", "qwen3", "--max-new-tokens", "512", *extra],
                       capture_output=True, text=True, env=e, timeout=120)
    return r, time.monotonic() - t0


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("dqa: error:")]
    assert len(errors) == 1, r.stderr[-2000:]
    return errors[0]


@pytest.fixture()
def https_stub(tmp_path, certificate):
    cert, key = certificate
    stub = StubServer(tmp_path / "stub", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)).start()
    yield stub
    stub.stop()


def test_an_untrusted_certificate_stops_the_run_in_seconds_naming_the_fix(tmp_path, https_stub):
    r, wall = regen(tmp_path, https_stub.url)
    line = one_error_line(r)
    assert r.returncode == 2 and wall < 30, (r.returncode, wall)
    assert "certificate verify failed" in line and "--ca-bundle" in line and "http://" in line, line
    assert read_shards(tmp_path / "out").num_rows == 0


@pytest.mark.parametrize("how", ["--ca-bundle", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"])
def test_the_ca_bundle_from_the_option_or_the_environment_verifies_the_server(tmp_path, https_stub, certificate, how):
    cert = str(certificate[0])
    extra, env = ((how, cert), {}) if how.startswith("--") else ((), {how: cert})
    r, _ = regen(tmp_path, https_stub.url, *extra, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [s["status"] for s in read_shards(tmp_path / "out").to_pylist()] == ["ok"] * ROWS


def test_https_to_a_plain_http_server_names_http_as_the_fix(tmp_path):
    stub = StubServer(tmp_path / "stub").start()
    try:
        r, wall = regen(tmp_path, stub.url.replace("http://", "https://"))
    finally:
        stub.stop()
    line = one_error_line(r)
    assert r.returncode == 2 and wall < 30 and "TLS failed" in line and "use http://" in line, line


def test_a_missing_ca_bundle_is_a_usage_error_before_anything_is_read(tmp_path):
    r, wall = regen(tmp_path, "https://127.0.0.1:9", "--ca-bundle", str(tmp_path / "nope.pem"))
    line = one_error_line(r)
    assert r.returncode == 2 and "--ca-bundle" in line and "no such file" in line, line


# ------------------------------------------------------------------------------------ proxies


class ForwardProxy(InThreadServer):
    """A forwarding HTTP proxy on a free loopback port: takes absolute-form requests
    (``GET http://host:port/path HTTP/1.1``), relays each to its origin on a connection of its
    own and the reply back, and records ``(method, origin, path)`` of every request."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, str, str]] = []

    async def _serve(self, reader, writer) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                first, *lines = [line for line in head.split("\r\n") if line]
                method, target, _ = first.split(" ")
                u = urlsplit(target)
                self.seen.append((method, f"{u.hostname}:{u.port}", u.path))
                length = next((int(v) for k, _, v in (line.partition(":") for line in lines) if k.strip().lower() == "content-length"), 0)
                body = await reader.readexactly(length)
                keep = [line for line in lines if not line.lower().startswith(("connection:", "proxy-", "keep-alive:"))]
                path = u.path + (f"?{u.query}" if u.query else "")
                r2, w2 = await asyncio.open_connection(u.hostname, u.port)
                w2.write((f"{method} {path} HTTP/1.1\r\n" + "\r\n".join(keep) + "\r\nConnection: close\r\n\r\n").encode("latin-1") + body)
                reply = await r2.read()  # the origin closes after its reply (Connection: close)
                w2.close()
                writer.write(reply)
                await writer.drain()
                writer.close()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture()
def proxy():
    p = ForwardProxy().start()
    yield p
    p.stop()


def test_regen_goes_through_http_proxy_and_no_proxy_bypasses_it(tmp_path, proxy):
    stub = StubServer(tmp_path / "stub").start()
    origin = f"127.0.0.1:{stub.port}"
    try:
        r, _ = regen(tmp_path / "via", stub.url, env={"HTTP_PROXY": proxy.url})
        assert r.returncode == 0, r.stderr[-2000:]
        posts = [s for s in proxy.seen if s == ("POST", origin, "/generate")]
        assert len(posts) == ROWS and ("GET", origin, "/health") in proxy.seen  # generation and probes alike
        proxy.seen.clear()
        r, _ = regen(tmp_path / "direct", stub.url, env={"http_proxy": proxy.url, "no_proxy": "localhost,127.0.0.1"})
        assert r.returncode == 0, r.stderr[-2000:]
        assert proxy.seen == []
    finally:
        stub.stop()
    assert [s["status"] for s in read_shards(tmp_path / "via" / "out").to_pylist()] == ["ok"] * ROWS


def test_fleet_status_takes_the_same_proxy(tmp_path, proxy):
    stub = StubServer(tmp_path / "stub").start()
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"version": 1, "engine": "sglang", "model": "m", "endpoints": [{"url": stub.url, "gpu": "0"}]}))
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "no_proxy")}
    try:
        r = subprocess.run([sys.executable, "-m", "dqa.cli", "fleet", "status", "--fleet", str(fleet), "--json"],
                           capture_output=True, text=True, env={**env, "HTTP_PROXY": proxy.url}, timeout=60)
    finally:
        stub.stop()
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("GET", f"127.0.0.1:{stub.port}", "/health") in proxy.seen


def test_a_proxy_that_is_down_stops_the_run_at_start_up_naming_it(tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    r, wall = regen(tmp_path, "http://127.0.0.1:9", env={"HTTP_PROXY": dead})
    line = one_error_line(r)
    assert r.returncode == 3 and wall < 40, (r.returncode, wall)
    assert "proxy" in line and dead in line and "NO_PROXY" in line, line
