"""What a running fleet is doing: per endpoint up/down, throughput, queue, KV use, spec accept
length and totals, summed over the fleet.

Sources, best first: SGLang's Prometheus ``/metrics`` (``--enable-metrics``), parsed with
``prometheus_client``'s text parser; else the latest ``Decode batch`` line of the server's log
(regexes tolerant to format drift between versions); ``transformers serve`` has neither, so only
up/down from ``/health`` is known and the status says metrics are unavailable.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .fleet_file import Endpoint, Fleet
from .fleet_launch import is_local_host, read_tail, verify_process
from .http_probe import http_get

# Metric (name without the "sglang:" prefix) -> (status field, how label sets combine).
METRICS = {
    "gen_throughput": ("gen_tok_per_s", "sum"),
    "num_running_reqs": ("running", "sum"),
    "num_queue_reqs": ("queued", "sum"),
    "token_usage": ("kv_usage", "mean"),
    "spec_accept_length": ("accept_len", "mean"),
    "spec_accept_rate": ("accept_rate", "mean"),
    "num_requests_total": ("requests_total", "sum"),
    "num_aborted_requests_total": ("aborted_total", "sum"),
    "prompt_tokens_total": ("prompt_tokens_total", "sum"),
    "generation_tokens_total": ("generation_tokens_total", "sum"),
    "cached_tokens_total": ("cached_tokens_total", "sum"),
    "e2e_request_latency_seconds_sum": ("_e2e_sum", "sum"),
    "e2e_request_latency_seconds_count": ("_e2e_count", "sum"),
}

# Decode log line fields; each regex tolerates the wording drift seen across SGLang versions.
DECODE_LINE = re.compile(r"decode batch", re.IGNORECASE)
LOG_FIELDS = {
    "running": re.compile(r"#running[- _]reqs?\s*:\s*(\d+)", re.IGNORECASE),
    "tokens": re.compile(r"#(?:full[- ])?tokens?\s*:\s*(\d+)", re.IGNORECASE),
    "kv_usage": re.compile(r"(?<![a-z])(?:full )?token usage\s*:\s*([0-9.]+)", re.IGNORECASE),
    "accept_len": re.compile(r"accept(?:ance)?[ _]len(?:gth)?\s*:\s*([0-9.]+)", re.IGNORECASE),
    "accept_rate": re.compile(r"accept(?:ance)?[ _]rate\s*:\s*([0-9.]+)", re.IGNORECASE),
    "gen_tok_per_s": re.compile(r"gen throughput\s*\((?:token|tok)s?/s\)\s*:\s*([0-9.]+)", re.IGNORECASE),
    "queued": re.compile(r"#queue[- _]reqs?\s*:\s*(\d+)", re.IGNORECASE),
}
LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")


@dataclass
class EndpointStatus:
    """One endpoint's state. Figures are ``None`` when the source does not report them."""

    url: str
    gpu: str | None
    up: bool
    source: str  # metrics | log | none
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


def _metric_key(name: str) -> str | None:
    for prefix in ("sglang:", "sglang_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return None


def parse_metrics(text: str) -> dict[str, float]:
    """Parse a Prometheus text exposition from SGLang into status fields.

    Label sets of one metric (tp/dp ranks, cache sources) are summed for counters and
    throughputs and averaged for ratios. Counters are matched with or without the ``_total``
    suffix. Returns only the fields present. Raises ``ValueError`` on text that is not
    Prometheus exposition format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    acc: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _metric_key(sample.name)
            if key is None:
                continue
            if key not in METRICS and key + "_total" in METRICS:
                key += "_total"
            if key not in METRICS:
                continue
            acc.setdefault(key, []).append(float(sample.value))
    out: dict[str, float] = {}
    for key, values in acc.items():
        field, how = METRICS[key]
        out[field] = sum(values) if how == "sum" else sum(values) / len(values)
    e2e_sum, e2e_count = out.pop("_e2e_sum", None), out.pop("_e2e_count", None)
    if e2e_sum is not None and e2e_count:
        out["mean_e2e_s"] = e2e_sum / e2e_count
    return out


def parse_decode_line(line: str) -> dict[str, float]:
    """The figures of one ``Decode batch`` log line (only those present)."""
    out: dict[str, float] = {}
    for field, rx in LOG_FIELDS.items():
        m = rx.search(line)
        if m:
            out[field] = float(m.group(1))
    return out


def last_decode_stats(log: Path | None, max_bytes: int = 1 << 20) -> tuple[dict[str, float], str | None] | None:
    """The figures and timestamp of the latest ``Decode batch`` line in the last ``max_bytes``
    of ``log``; ``None`` when there is no such line or the log cannot be read."""
    data = read_tail(log, max_bytes)
    if data is None:
        return None
    for line in reversed(data.split("\n")):
        if DECODE_LINE.search(line):
            stats = parse_decode_line(line)
            if stats:
                m = LOG_TIME.search(line)
                return stats, (m.group(1) if m else None)
    return None


def endpoint_status(fleet: Fleet, ep: Endpoint, timeout: float = 3.0) -> EndpointStatus:
    """Probe one endpoint: ``/health``, then ``/metrics`` (SGLang), else its decode log."""
    process = None
    if ep.pid is not None and is_local_host(ep.host):
        process = "running" if verify_process(ep)[0] is not None else "not running"
    r = http_get(ep.url + "/health", timeout)
    st = EndpointStatus(url=ep.url, gpu=ep.gpu, up=r is not None and r.status_code == 200, source="none", process=process)
    if fleet.engine == "transformers":
        st.note = "metrics unavailable (transformers serve has no /metrics or decode log)"
        return st
    note = None
    if st.up:
        m = http_get(ep.url + "/metrics", timeout)
        if m is not None and m.status_code == 200:
            try:
                figures = parse_metrics(m.text)
            except ValueError:
                figures = {}
                note = "unparsable /metrics"
            if figures:
                for k, v in figures.items():
                    setattr(st, k, v)
                st.source = "metrics"
                return st
        elif m is not None:
            note = f"/metrics answered {m.status_code} (start SGLang with --enable-metrics)"
    found = last_decode_stats(fleet.log_path(ep))
    if found is not None:
        stats, when = found
        for k in ("gen_tok_per_s", "running", "queued", "kv_usage", "accept_len", "accept_rate"):
            if k in stats:
                setattr(st, k, stats[k])
        st.source = "log"
        st.log_time = when
        st.note = "from the latest Decode batch log line" + (f"; {note}" if note else "")
    else:
        st.note = note or ("no metrics and no decode log line yet" if st.up else None)
    return st


def fleet_status(fleet: Fleet, timeout: float = 3.0) -> list[EndpointStatus]:
    """Probe every endpoint of ``fleet`` concurrently; results in fleet order."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(fleet.endpoints)))) as pool:
        return list(pool.map(lambda ep: endpoint_status(fleet, ep, timeout), fleet.endpoints))


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
