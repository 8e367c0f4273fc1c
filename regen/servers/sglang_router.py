"""SGLang's gateway in front of SGLang workers, in either of its two packages: sglang-router (PyPI
``sglang-router``, "SGLang Model Gateway", last release 0.3.2) and the Shepherd Model Gateway
(PyPI ``smg``, its successor, ``smg launch``). How dqa recognises one and what it does to a
``/generate`` request (see docs/sglang.md, "The SGLang router").

- Recognised (``gateway_of``) by ``GET /get_server_info`` answering ``{"router_manager": true,
  ...}`` (sglang-router: its own object, no version, no context length), or by ``GET
  /server_info`` answering 404 with smg's own error code ``unknown_url`` (smg 1.13.0 passes
  ``/get_server_info`` on to ONE of its workers, so that reply says nothing of the others). Neither
  says its own version over HTTP. What the workers are is asked of the workers themselves:
  ``GET /workers`` lists them (``{"workers": [{"url": ..., "is_healthy": ...}, ...]}``, both).
- Both rewrite request bodies: unknown top-level fields and unknown ``sampling_params`` keys are
  dropped before the request reaches a worker. ``PASSED_SAMPLING_PARAMS`` holds, per gateway and
  release, the keys it passes on (observed by sending each SGLang 0.5.23 sampling key through the
  real gateway to a worker that records bodies; ``tests/test_gateways.py`` checks the table
  against the installed gateways), so run.json can say per field dqa sends whether it was
  ``applied`` or ``dropped``; a gateway or release the table does not hold gives ``unknown``
  (``sampling_fields``), never a guess.
- Their metrics (Prometheus, on their own port; the same names in both): per worker health
  (``smg_worker_health``), circuit state (``smg_worker_cb_state``: 0 closed, 1 open, 2 half open)
  and requests in flight (``smg_worker_requests_active``, sglang-router only), retries
  (``smg_worker_retries_total``, ``smg_worker_retries_exhausted_total``) and upstream replies by
  status code (``smg_router_upstream_responses_total``), read by ``parse_metrics`` into a
  ``RouterStatus`` (`dqa fleet status`).
- Their 503 ``no_available_workers`` (``says_no_workers``), which ``servers.facts.ServerFacts.no_capacity``
  turns into "send nothing there until its health answers".

Nothing here does I/O; ``servers.facts.discover`` asks the gateway and its workers, and
``fleet.router`` launches and probes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

SGLANG_ROUTER = "sglang-router"  # PyPI sglang-router: python -m sglang_router.launch_router
SMG = "smg"  # PyPI smg, the Shepherd Model Gateway: smg launch
GATEWAYS = (SMG, SGLANG_ROUTER)  # `dqa fleet up --router` starts the first one installed

# The keys both releases below pass on to the worker on POST /generate.
_PASSED_BY_BOTH = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "no_stop_trim",
    "regex", "ebnf", "json_schema", "min_new_tokens", "n", "sampling_seed",
})  # fmt: skip
# {(gateway, release): the sampling_params keys it passes on}; any other key is dropped. Both drop
# stop_regex, structural_tag, logit_bias, spaces_between_special_tokens, stream_interval, beam_width,
# watermark, choice (SGLang 0.5.23's other keys) and keys SGLang does not know.
PASSED_SAMPLING_PARAMS: dict[tuple[str, str], frozenset[str]] = {
    (SGLANG_ROUTER, "0.3.2"): _PASSED_BY_BOTH,
    (SMG, "1.13.0"): _PASSED_BY_BOTH | {"custom_params"},
}

APPLIED = "applied"
DROPPED = "dropped"
UNKNOWN = "unknown"  # the gateway or its release is not in the table: not known, not guessed
UNKNOWN_URL = "unknown_url"  # smg's error code for a route it does not have


def is_router(server_info: Any) -> bool:
    """Whether a ``/get_server_info`` reply is sglang-router's own (``router_manager`` true)."""
    return isinstance(server_info, dict) and server_info.get("router_manager") is True


def gateway_of(server_info: Any, missing_info: Any) -> str | None:
    """Which gateway answered: ``SGLANG_ROUTER`` when ``server_info`` (the parsed info reply) is
    its own object, ``SMG`` when ``missing_info`` (the parsed body of a 404 to ``GET
    /server_info``) carries smg's error code ``unknown_url``; None for anything else (a model
    server)."""
    if is_router(server_info):
        return SGLANG_ROUTER
    error = missing_info.get("error") if isinstance(missing_info, dict) else None
    if isinstance(error, dict) and error.get("code") == UNKNOWN_URL:
        return SMG
    return None


def worker_urls(reply: Any) -> list[str]:
    """The worker base URLs of a ``GET /workers`` reply, in its order (empty when it lists none
    or is not that shape)."""
    workers = reply.get("workers") if isinstance(reply, dict) else None
    if not isinstance(workers, list):
        return []
    urls = [w.get("url") for w in workers if isinstance(w, dict)]
    return [u.rstrip("/") for u in urls if isinstance(u, str) and u.startswith(("http://", "https://"))]


def sampling_fields(sent: Iterable[str], gateway: str | None, release: str | None) -> dict[str, str]:
    """``{sampling key: "applied" | "dropped" | "unknown"}`` for the ``sampling_params`` keys dqa
    sends: whether ``gateway`` at ``release`` passes each on to the worker; every key ``unknown``
    when ``PASSED_SAMPLING_PARAMS`` does not hold that gateway and release (or either is None)."""
    passed = PASSED_SAMPLING_PARAMS.get((gateway or "", release or ""))
    if passed is None:
        return {k: UNKNOWN for k in sent}
    return {k: (APPLIED if k in passed else DROPPED) for k in sent}


NO_WORKERS = "no_available_workers"  # the router's 503 code: no healthy worker, or every circuit open


def says_no_workers(error: str | None) -> bool:
    """Whether an attempt's error text is the router's 503 ``no_available_workers`` (it has retried
    already; sending more only burns attempts until a worker is back)."""
    return bool(error) and NO_WORKERS in error


CB_STATES = {0: "closed", 1: "open", 2: "half_open"}  # smg_worker_cb_state's values (its HELP text)


@dataclass
class RouterWorker:
    """One worker as the router sees it: health 1/0, circuit state, requests in flight."""

    url: str
    healthy: bool | None = None
    circuit: str | None = None  # closed | open | half_open
    active: float | None = None


@dataclass
class RouterStatus:
    """The router's state: ``up`` (``/health`` 200), ``ready`` (``/readiness`` 200: a healthy
    worker), and from its metrics port (``source`` "metrics", else "none" with a ``note``) its
    workers, retries, retries exhausted and upstream replies by status code."""

    url: str
    metrics_url: str | None
    up: bool
    ready: bool
    process: str | None = None
    gateway: dict[str, str] | None = None  # {"name", "version"} as the fleet file records it
    source: str = "none"
    workers: list[RouterWorker] = field(default_factory=list)
    retries_total: float | None = None
    retries_exhausted_total: float | None = None
    responses: dict[str, float] = field(default_factory=dict)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def parse_metrics(text: str, st: RouterStatus) -> None:
    """Fill ``st`` from the router's Prometheus text (``prometheus_client``'s parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    workers: dict[str, RouterWorker] = {}
    retries = exhausted = None
    responses: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            url = s.labels.get("worker")
            if s.name == "smg_worker_health" and url:
                workers.setdefault(url, RouterWorker(url)).healthy = s.value >= 1
            elif s.name == "smg_worker_cb_state" and url:
                workers.setdefault(url, RouterWorker(url)).circuit = CB_STATES.get(int(s.value), str(s.value))
            elif s.name == "smg_worker_requests_active" and url:
                workers.setdefault(url, RouterWorker(url)).active = s.value
            elif s.name == "smg_worker_retries_total":
                retries = (retries or 0.0) + s.value
            elif s.name == "smg_worker_retries_exhausted_total":
                exhausted = (exhausted or 0.0) + s.value
            elif s.name == "smg_router_upstream_responses_total":
                code = s.labels.get("status_code", "?")
                responses[code] = responses.get(code, 0.0) + s.value
    st.workers = sorted(workers.values(), key=lambda w: w.url)
    # The counters appear once the router first counts one; with the metrics port answering, none yet is 0.
    st.retries_total, st.retries_exhausted_total, st.responses = retries or 0.0, exhausted or 0.0, responses
    st.source = "metrics"

