"""`dqa fleet up --router`: SGLang's real gateway (a Rust process) in front of the servers a fleet
launched, and what `dqa fleet status` reads from it.

``find_gateway`` picks the package: the Shepherd Model Gateway (PyPI ``smg``, run as ``python -m
smg launch``, the ``smg launch`` of dqa's own Python) when it is installed, else sglang-router
(``python -m sglang_router.launch_router``); ``--router-gateway`` names one. Not the ``smg`` on
PATH: sglang-router 0.3.2 installs an ``smg`` script of its own, so that name says nothing of which
package answers. Both take the same flags. ``router_command`` builds the command with the policy
(``cache_aware`` by default), the Prometheus port on, ``--tokenizer-path`` the model folder (so it never reaches
for the network) and ``config.ROUTER_REGEN_FLAGS`` (the request timeout and circuit-breaker
settings docs/regen.md, "Through the SGLang router", recommends). The router takes no port 0, so its ports
are found by binding port 0 here and handing the number on (``free_port``). ``start_router`` runs
it in its own session with its log in the fleet's log folder and returns its fleet-file record (an
``Endpoint`` with ``metrics_url``); ``wait_ready`` waits for ``/readiness`` (200 once a worker is
healthy behind it). ``router_status`` probes ``/health`` and ``/readiness`` and reads its
Prometheus port; what the metrics mean (per worker health, circuit state, requests in flight,
retries, upstream replies by status code) is ``servers.sglang_router.parse_metrics``, with the rest
of what dqa knows about the router.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dqa.errors import RuntimeFailure, UsageError
from dqa.regen.config import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES, ROUTER_REGEN_FLAGS
from dqa.regen.fleet.file import Endpoint, Fleet
from dqa.regen.servers.sglang_router import GATEWAYS, SGLANG_ROUTER, SMG, RouterStatus, parse_metrics
from dqa.regen.wire.http_probe import answers_ok, http_get

AUTO = "auto"
# {gateway: (its importable module, the arguments after `python` that launch it)}
LAUNCHERS = {SMG: ("smg", ("-m", "smg", "launch")), SGLANG_ROUTER: ("sglang_router", ("-m", "sglang_router.launch_router"))}
INSTALL = "pip install smg==1.13.0 (or sglang-router==0.3.2)"


@dataclass(frozen=True)
class Gateway:
    """The gateway package `fleet up --router` starts: ``name`` (``smg`` | ``sglang-router``), its
    installed ``version`` and the ``launch`` arguments after the Python."""

    name: str
    version: str
    launch: tuple[str, ...]

    def record(self) -> dict[str, str]:
        """What the fleet file's ``router.gateway`` holds."""
        return {"name": self.name, "version": self.version}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install, or blocked in sys.modules
        return False


def find_gateway(choice: str = AUTO) -> Gateway:
    """The gateway to start: ``choice`` (``auto``: smg when installed for this Python, else
    sglang-router). Returns its ``Gateway``; raises ``UsageError`` for an unknown choice or when
    the package is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    if choice != AUTO and choice not in LAUNCHERS:
        raise UsageError(f"--router-gateway {choice!r}: expected {AUTO}, {' or '.join(GATEWAYS)}")
    names = GATEWAYS if choice == AUTO else (choice,)
    for name in names:
        module, launch = LAUNCHERS[name]
        if _installed(module):
            try:
                release = version(name)
            except PackageNotFoundError:
                release = "unknown"
            return Gateway(name, release, launch)
    which = "neither smg nor sglang-router is" if choice == AUTO else f"the {choice} package is not"
    raise UsageError(f"--router: {which} installed for {sys.executable} ({INSTALL if choice == AUTO else f'pip install {choice}'})")


def check_router(policy: str, tokenizer: str, port: int = 0, gateway: str = AUTO) -> Gateway:
    """The gateway `fleet up --router` will start (``find_gateway``). Raises ``UsageError`` for an
    unknown ``policy``, a ``port`` outside 0-65535, a ``tokenizer`` that is not a local folder (the
    router would reach for the network), or no gateway package installed for this Python."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--router-port {port}: expected 0 (a free port) to 65535")
    if policy not in ROUTER_POLICIES:
        raise UsageError(f"--router-policy {policy!r}: expected one of {', '.join(ROUTER_POLICIES)}")
    if not Path(tokenizer).is_dir():
        raise UsageError(f"--router needs the model as a local folder (its tokenizer); {tokenizer} is not one")
    return find_gateway(gateway)


def free_port(host: str) -> int:
    """A port free on ``host`` right now: the one the OS gives a socket bound to port 0."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class RouterCommand:
    """The router's argument list, its URLs, its log and the gateway it starts."""

    argv: list[str]
    url: str
    metrics_url: str
    host: str
    port: int
    log: Path
    gateway: Gateway


def router_command(workers: Sequence[str], tokenizer: str, log_dir: Path, bind_host: str, url_host: str, gateway: Gateway,
                   policy: str = DEFAULT_ROUTER_POLICY, port: int = 0, metrics_port: int = 0) -> RouterCommand:
    """The command that starts ``gateway`` in front of ``workers`` (base URLs), bound on
    ``bind_host`` and reached as ``url_host``; ``port``/``metrics_port`` 0: a free one each."""
    port = port or free_port(bind_host)
    metrics_port = metrics_port or free_port(bind_host)
    while metrics_port == port:
        metrics_port = free_port(bind_host)
    argv = [sys.executable, *gateway.launch, "--host", bind_host, "--port", str(port),
            "--worker-urls", *workers, "--policy", policy,
            "--prometheus-host", bind_host, "--prometheus-port", str(metrics_port),
            "--tokenizer-path", str(tokenizer), *ROUTER_REGEN_FLAGS]  # fmt: skip
    host = f"[{url_host}]" if ":" in url_host else url_host
    return RouterCommand(argv, f"http://{host}:{port}", f"http://{host}:{metrics_port}", url_host, port,
                         Path(log_dir) / "router.log", gateway)


def start_router(cmd: RouterCommand) -> tuple[subprocess.Popen, Endpoint]:
    """Start the router in its own session (Ctrl-C on dqa does not stop it), output appended to
    its log. Returns the process and its fleet-file record. Raises ``RuntimeFailure`` when it
    cannot be started."""
    import psutil

    cmd.log.parent.mkdir(parents=True, exist_ok=True)
    with open(cmd.log, "ab") as log:
        log.write(f"\n=== dqa fleet up: router: {' '.join(cmd.argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(cmd.argv, env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)  # fmt: skip
        except OSError as exc:
            raise RuntimeFailure(f"router: cannot start {cmd.argv[0]!r}: {exc.strerror or exc}") from None
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        started = time.time()
    ep = Endpoint(url=cmd.url, pid=proc.pid, log=str(cmd.log.resolve()), host=cmd.host, cmd=list(cmd.argv),
                  port=cmd.port, started=started, metrics_url=cmd.metrics_url, gateway=cmd.gateway.record())  # fmt: skip
    return proc, ep


def wait_ready(proc: subprocess.Popen, ep: Endpoint, timeout: float, poll_s: float = 0.3) -> None:
    """Wait until the router's ``/readiness`` is 200 (a worker is healthy behind it). Raises
    ``RuntimeFailure`` naming its log when it exits or is not ready within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not answers_ok(ep.url + "/readiness", 2.0):
        rc = proc.poll()
        if rc is not None:
            raise RuntimeFailure(f"router ({ep.url}) exited with code {rc} before it was ready; log: {ep.log}")
        if time.monotonic() > deadline:
            raise RuntimeFailure(f"router ({ep.url}/readiness) not ready after {timeout:.0f} s; log: {ep.log}")
        time.sleep(poll_s)


def router_status(ep: Endpoint, timeout: float, process: str | None = None) -> RouterStatus:
    """Probe the router of a fleet file: ``/health``, ``/readiness``, then its metrics port."""
    r = http_get(ep.url + "/health", timeout)
    st = RouterStatus(url=ep.url, metrics_url=ep.metrics_url, up=r is not None and r.status_code == 200,
                      ready=answers_ok(ep.url + "/readiness", timeout), process=process)  # fmt: skip
    if not ep.metrics_url:
        st.note = "no metrics URL recorded"
        return st
    m = http_get(ep.metrics_url + "/metrics", timeout)
    if m is None or m.status_code != 200:
        st.note = f"metrics unavailable ({ep.metrics_url}/metrics: {'no answer' if m is None else m.status_code})"
        return st
    parse_metrics(m.text, st)
    return st


def fleet_router_status(fleet: Fleet, timeout: float) -> RouterStatus | None:
    """``router_status`` of the fleet's router, with whether its recorded process still runs
    (on this machine); None when the fleet has no router."""
    from dqa.regen.fleet.launch import is_local_host, verify_process

    ep = fleet.router
    if ep is None:
        return None
    process = None
    if ep.pid is not None and is_local_host(ep.host):
        process = "running" if verify_process(ep)[0] is not None else "not running"
    st = router_status(ep, timeout, process)
    st.gateway = ep.gateway
    return st
