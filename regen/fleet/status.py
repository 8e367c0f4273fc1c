"""What a running fleet is doing: per endpoint up/down, throughput, queue, KV use, spec accept
length and totals, summed over the fleet.

Up/down is ``/health`` answering 200, for every engine; the figures are what the engine's server
kind can read (``ServerKind.status``). SGLang (``servers.sglang``): its Prometheus ``/metrics``
(``--enable-metrics``), parsed with ``prometheus_client``'s text parser, else the latest ``Decode
batch`` line of the server's log (regexes tolerant to format drift between versions);
``transformers serve`` has neither, so only up/down is known and the status says metrics are
unavailable.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from dqa.regen.config import DEFAULT_STATUS_TIMEOUT
from dqa.regen.fleet.file import Endpoint, Fleet, FleetSet
from dqa.regen.fleet.launch import is_local_host, verify_process
from dqa.regen.servers import KINDS
from dqa.regen.wire.http_probe import http_get


@dataclass
class EndpointStatus:
    """One endpoint's state. Figures are ``None`` when the source does not report them."""

    url: str
    gpu: str | None
    up: bool
    source: str  # metrics | log | none
    fleet: str | None = None  # the fleet file that lists it
    process: str | None = None  # running | not running | None (not started by dqa / remote)
    gen_tok_per_s: float | None = None
    running: float | None = None
    queued: float | None = None
    kv_usage: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    requests_total: float | None = None
    aborted_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    cached_tokens_total: float | None = None
    mean_e2e_s: float | None = None
    log_time: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def endpoint_status(fleet: Fleet, ep: Endpoint, timeout: float = DEFAULT_STATUS_TIMEOUT) -> EndpointStatus:
    """Probe one endpoint: ``/health``, then what its engine reports (SGLang: ``/metrics``, else
    its decode log)."""
    process = None
    if ep.pid is not None and is_local_host(ep.host):
        process = "running" if verify_process(ep)[0] is not None else "not running"
    r = http_get(ep.url + "/health", timeout)
    st = EndpointStatus(url=ep.url, gpu=ep.gpu, up=r is not None and r.status_code == 200, source="none",
                        fleet=None if fleet.path is None else str(fleet.path), process=process)
    KINDS[fleet.engine].status(fleet, ep, st, timeout)
    return st


def fleet_status(fleet: Fleet, timeout: float = DEFAULT_STATUS_TIMEOUT) -> list[EndpointStatus]:
    """Probe every endpoint of ``fleet`` concurrently; results in fleet order."""
    return fleet_set_status(FleetSet([fleet]), timeout)


def fleet_set_status(fleets: FleetSet, timeout: float = DEFAULT_STATUS_TIMEOUT) -> list[EndpointStatus]:
    """Probe every endpoint of every fleet file of ``fleets`` (one per node) concurrently;
    results in file order, then fleet order."""
    pairs = [(f, ep) for f in fleets.fleets for ep in f.endpoints]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(pairs)))) as pool:
        return list(pool.map(lambda pair: endpoint_status(pair[0], pair[1], timeout), pairs))


def totals(statuses: list[EndpointStatus]) -> dict[str, Any]:
    """Fleet-wide figures: sums of rates, queues and totals; means of KV usage and accept
    length over the endpoints that report them; ``None`` where no endpoint reports."""

    def total(field: str) -> float | None:
        vals = [getattr(s, field) for s in statuses if getattr(s, field) is not None]
        return sum(vals) if vals else None

    def mean(field: str) -> float | None:
        vals = [getattr(s, field) for s in statuses if getattr(s, field) is not None]
        return sum(vals) / len(vals) if vals else None

    return {
        "endpoints": len(statuses),
        "up": sum(1 for s in statuses if s.up),
        "gen_tok_per_s": total("gen_tok_per_s"),
        "running": total("running"),
        "queued": total("queued"),
        "kv_usage": mean("kv_usage"),
        "accept_len": mean("accept_len"),
        "accept_rate": mean("accept_rate"),
        "requests_total": total("requests_total"),
        "aborted_total": total("aborted_total"),
        "prompt_tokens_total": total("prompt_tokens_total"),
        "generation_tokens_total": total("generation_tokens_total"),
        "cached_tokens_total": total("cached_tokens_total"),
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
