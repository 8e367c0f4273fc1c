"""``RegenConfig``: every option of ``dqa regen``, as small checked objects, and the one home of
regen's defaults.

As httpx keeps ``Timeout`` and ``Limits`` apart from the client, a run's options come in groups,
each frozen and checking its own fields when built (``UsageError``, exit 2, worded as the CLI
option):

* ``DatasetSpec``: the dataset, its column overrides and the chat format (``--tokenizer``);
* ``Selection``: which rows and turns (findings, reasons, ``--all``, shard, limit, turns, retry);
* ``SamplingSpec``: what each request asks for (temperature, top_p, top_k, max_new_tokens, seed
  base); the server kinds' protocols send it as it is;
* ``DispatchSpec``: the servers and how they are driven (endpoints or fleet, protocol, model, key,
  concurrency, cost figures) with ``Timeouts`` and ``Retries``;
* ``OutputSpec``: where results go (``--out``, mirrors) and how often they are made durable.

Every default is written once: a group field's default is the option's (the CLI reads it from
the class, ``SamplingSpec.temperature``), and a default other modules share is a ``DEFAULT_*``
name below (``DEFAULT_MAX_NEW_TOKENS``, ``DEFAULT_MAX_IN_FLIGHT``, ``DEFAULT_CONNECT_TIMEOUT``, the
``TURN_MODES`` ...). At load this module imports nothing from dqa but ``dqa.errors``, so the CLI
reads it at load and every module may import it; ``DispatchSpec.http_policy`` imports
``dqa.regen.wire.http_policy`` when it is called (checking ``--ca-bundle``).

``RegenConfig(data=..., selection=..., ...)`` builds a config from the groups; the flat keyword
form ``RegenConfig(dataset=..., out=..., endpoints=[...], max_in_flight=8, ...)`` (one keyword per
option, the names of the earlier flat dataclass, derived from the groups' fields) is kept for
in-process callers and tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from dqa.errors import UsageError

# ------------------------------------------------------------------------ defaults shared by modules

# Output token limit per request: covers the long tail of thinking traces; prompt + this must fit
# the servers' context (`dqa regen`, `dqa plan --calibrate`).
DEFAULT_MAX_NEW_TOKENS = 8192
# Requests in flight per endpoint; `dqa fleet up --max-running-requests` matches it.
DEFAULT_MAX_IN_FLIGHT = 48
# Seconds (``Timeouts``' defaults, and of every request outside a run's options): one attempt's whole
# reply, getting a connection, connect tries at start-up before an endpoint counts as unreachable,
# and the most one discovery request (server_info, models, a health probe) waits.
DEFAULT_REQUEST_TIMEOUT = 3600.0
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_PREFLIGHT_WINDOW = 6.0
DEFAULT_PROBE_TIMEOUT = 10.0
DEFAULT_TOKENIZER = "qwen3"  # the chat format preset (--tokenizer)
TURN_MODES = ("flagged", "all", "last")  # --turns: from the first flagged turn on, every turn, the last
DEFAULT_TURNS = "flagged"
PROTOCOLS = ("sglang", "openai")  # --protocol; the server kinds (dqa.regen.servers.KINDS) speak these
DEFAULT_PROTOCOL = "sglang"  # without --protocol and without a fleet file that names one

# `dqa plan`: prompts a --calibrate run sends; auxiliary layers of offline hidden states (EAGLE-3
# (SpecForge, speculators): three auxiliary layers, plus the final one).
DEFAULT_CALIBRATE_SAMPLE = 32
DEFAULT_AUX_LAYERS = 3

# `dqa merge --batch-rows`: rows per streamed batch (memory is bounded by the batch).
DEFAULT_MERGE_BATCH_ROWS = 2048

# `dqa fleet up` (fleet.spec.FleetSpec; the Mamba mode: servers.sglang.SglangOptions) and `dqa fleet status`.
DEFAULT_ENGINE = "sglang"
DEFAULT_GPUS = "0"
DEFAULT_PORT_BASE = 30000  # GPU k of the list listens on port-base + k
DEFAULT_BIND_HOST = "127.0.0.1"
DEFAULT_CONTEXT_LENGTH = 8192  # SGLang's --context-length per server
DEFAULT_MAX_RUNNING_REQUESTS = DEFAULT_MAX_IN_FLIGHT  # SGLang's concurrent requests per server: what regen sends
DEFAULT_REASONING_PARSER = "qwen3"
DEFAULT_MAMBA_EXTRA_BUFFER = "auto"  # auto | on | off
DEFAULT_UP_TIMEOUT = 900.0  # seconds for every server to become healthy
DEFAULT_STATUS_TIMEOUT = 3.0  # `dqa fleet status`: seconds per request
# `dqa fleet up --router` (fleet.router): SGLang's gateway (smg, else sglang-router) in front of the launched servers.
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
DEFAULT_ROUTER_POLICY = "cache_aware"  # a conversation's next turn to the worker holding its prefix
DEFAULT_ROUTER_PORT = 0  # 0: a free port chosen by the OS
DEFAULT_ROUTER_TIMEOUT = 60.0  # seconds for the router to see a healthy worker (/readiness 200)
# The settings docs/regen.md ("Through the SGLang router") recommends for a regen run: a request timeout
# above regen's --request-timeout (3600 s), circuits re-closed after 10 s rather than 60 s.
ROUTER_REGEN_FLAGS = ("--request-timeout-secs", "7200", "--cb-timeout-duration-secs", "10", "--health-check-interval-secs", "5")


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"i/N"`` -> ``(i, N)``; None -> ``(0, 1)``. Raises ``UsageError`` unless ``0 <= i < N``."""
    if not text:
        return 0, 1
    try:
        a, b = text.split("/")
        i, n = int(a), int(b)
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected i/N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"--shard {text!r}: expected 0 <= i < N")
    return i, n


@dataclass(frozen=True)
class DatasetSpec:
    """The dataset (a path or URL as ``dqa scan`` takes it), the column overrides given (None:
    detected) and the chat format (a tokenizer folder or the preset ``qwen3``)."""

    path: str = field(metadata={"flat": "dataset"})
    ids_column: str | None = None
    mask_column: str | None = None
    labels_column: str | None = None
    id_column: str | None = None
    tokenizer: str | None = DEFAULT_TOKENIZER

    def __post_init__(self) -> None:
        if isinstance(self.path, os.PathLike):
            object.__setattr__(self, "path", os.fspath(self.path))
        if not isinstance(self.path, str) or not self.path:
            raise UsageError("give the dataset to regenerate (a path)")

    @property
    def columns(self) -> dict[str, str | None]:
        """run.json's ``columns``: the overrides given, by key ``ids``, ``mask``, ``labels``, ``id``."""
        return {"ids": self.ids_column, "mask": self.mask_column, "labels": self.labels_column, "id": self.id_column}


@dataclass(frozen=True)
class Selection:
    """Which rows, and which of their assistant turns, to regenerate: the findings' failing rows
    (``failed_only``; narrowed to ``reasons``) or every row, then ``shard`` (``i/N``) and the first
    ``limit``; ``turns`` is flagged (from the first flagged turn on), all or last;
    ``retry_failed`` sends rows recorded as failed again on resume."""

    failed_only: bool = True
    findings: str | None = None  # findings.parquet or its folder; None: where `dqa scan` writes
    reasons: tuple[str, ...] | None = None
    limit: int | None = None
    shard: str | None = None
    turns: str = DEFAULT_TURNS
    retry_failed: bool = False

    def __post_init__(self) -> None:
        if self.reasons is not None:
            object.__setattr__(self, "reasons", tuple(self.reasons))
        parse_shard(self.shard)  # UsageError for anything but i/N with 0 <= i < N
        if self.turns not in TURN_MODES:
            raise UsageError(f"--turns {self.turns!r}: expected one of {', '.join(TURN_MODES)}")

    @property
    def shard_pair(self) -> tuple[int, int]:
        """``shard`` as ``(i, N)``; ``(0, 1)`` when not given."""
        return parse_shard(self.shard)


@dataclass(frozen=True)
class SamplingSpec:
    """Sampling sent with every request (defaults: Qwen3's thinking-mode recommendation;
    ``max_new_tokens``: ``DEFAULT_MAX_NEW_TOKENS``); the per-row seed is ``seed_base`` + row.
    Protocols send ``as_dict()`` with every request."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed_base: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise UsageError("--max-new-tokens must be >= 1")

    def as_dict(self) -> dict[str, Any]:
        """The request's sampling parameters (the seed is per row): temperature, top_p, top_k, max_new_tokens."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "max_new_tokens": self.max_new_tokens}


@dataclass(frozen=True)
class Timeouts:
    """Seconds: one attempt's whole reply, from its connection to the last byte (``request``),
    getting a connection (``connect``, on its own clock before that), between health checks
    (``health_interval``) and for one (``health``), no healthy endpoint before the run stops
    (``down_deadline``), connect tries at start-up before an endpoint counts as unreachable
    (``preflight_window``), and how long a conversation's next turn waits for the endpoint that
    served its previous turn (and holds that prefix in its cache) while it is at its in-flight
    limit, before the conversation moves to another (``sticky_wait``)."""

    request: float = field(default=DEFAULT_REQUEST_TIMEOUT, metadata={"flat": "request_timeout"})
    connect: float = field(default=DEFAULT_CONNECT_TIMEOUT, metadata={"flat": "connect_timeout"})
    health_interval: float = 15.0
    health: float = field(default=30.0, metadata={"flat": "health_timeout"})
    down_deadline: float = 600.0
    preflight_window: float = DEFAULT_PREFLIGHT_WINDOW
    sticky_wait: float = 2.0


@dataclass(frozen=True)
class Retries:
    """Attempts per row before it is recorded as failed, the backoff between them (seconds), and
    the consecutive failures that mark an endpoint unhealthy."""

    max_attempts: int = 6
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    fail_threshold: int = 3

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UsageError("--max-attempts must be >= 1")


@dataclass(frozen=True)
class DispatchSpec:
    """The servers (``endpoints`` or ``fleet`` files, not both) and how they are driven:
    ``fleet`` is one fleet file or several (one per node: the servers are their union; kept as a
    tuple of paths); ``protocol`` (sglang | openai; default the fleet files', else sglang),
    ``model``, the API key's environment variable, requests in flight per endpoint; ``gpus`` and
    ``gpu_hour_cost`` for the cost figures (``gpus`` default: the fleet files' GPUs, else one per
    endpoint); ``ca_bundle``: the
    CA certificates that verify ``https://`` servers (None: ``$SSL_CERT_FILE``,
    ``$REQUESTS_CA_BUNDLE``, else the system's; ``http_policy``); ``context_length``: the servers'
    context length where they do not say it (an SGLang router whose workers cannot be asked), the
    smaller one where they do (None: what they say); ``sticky``: a conversation's next
    turn goes to the endpoint that answered its previous turn (``Timeouts.sticky_wait``); False
    only for comparisons (bench/bench_regen_sticky.py): every request to the least busy endpoint."""

    endpoints: tuple[str, ...] = ()
    fleet: str | tuple[str, ...] | None = None
    protocol: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    gpus: int | None = None
    gpu_hour_cost: float = 0.0
    ca_bundle: str | None = None
    context_length: int | None = None
    sticky: bool = True
    timeouts: Timeouts = field(default_factory=Timeouts)
    retries: Retries = field(default_factory=Retries)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", tuple(self.endpoints or ()))
        if self.fleet is not None:
            files = (self.fleet,) if isinstance(self.fleet, (str, os.PathLike)) else tuple(self.fleet)
            object.__setattr__(self, "fleet", tuple(os.fspath(f) for f in files) or None)
        if bool(self.endpoints) == bool(self.fleet):
            raise UsageError("give --endpoint URL (repeatable) or --fleet FILE (repeatable), not both and not neither")
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise UsageError(f"--protocol {self.protocol!r}: expected {' or '.join(PROTOCOLS)}")
        if self.max_in_flight < 1:
            raise UsageError("--max-in-flight must be >= 1")
        if self.context_length is not None and self.context_length < 2:
            raise UsageError("--context-length must be >= 2 (the servers' context length in tokens)")
        if self.ca_bundle is not None:
            object.__setattr__(self, "ca_bundle", os.fspath(self.ca_bundle))
            self.http_policy()  # UsageError for a bundle that is not a file, before anything is read

    def http_policy(self):
        """TLS trust and proxies of every request to the servers (``http_policy.HttpPolicy``).
        Raises ``UsageError`` for a CA bundle that is not a file."""
        from dqa.regen.wire.http_policy import HttpPolicy

        return HttpPolicy(self.ca_bundle)


@dataclass(frozen=True)
class OutputSpec:
    """Where results go (``out``: a folder or an fsspec URL; ``mirror``: more URLs each closed shard
    is copied to) and how often: a shard closes at ``shard_rows`` rows or ``shard_seconds``, the
    journal commits every ``commit_interval`` s, progress.json is rewritten every
    ``progress_interval`` s."""

    out: str
    mirror: tuple[str, ...] = ()
    shard_rows: int = 20_000
    shard_seconds: float = 300.0
    commit_interval: float = 0.1
    progress_interval: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mirror", tuple(self.mirror or ()))
        if isinstance(self.out, os.PathLike):
            object.__setattr__(self, "out", os.fspath(self.out))
        if not isinstance(self.out, str) or not self.out:
            raise UsageError("give --out (a folder or an fsspec URL)")
        if self.shard_rows < 1:
            raise UsageError("--shard-rows must be >= 1")


_GROUPS = {"data": DatasetSpec, "selection": Selection, "sampling": SamplingSpec, "dispatch": DispatchSpec, "output": OutputSpec}
_NESTED = {"timeouts": Timeouts, "retries": Retries}


def _flat_names() -> dict[str, tuple[str, ...]]:
    """Returns {flat keyword (the earlier RegenConfig field): (group, attribute[, attribute of the
    nested group])}, from the groups' fields: a field's keyword is its name, or its ``flat``
    metadata where the earlier name differed (``dataset``, ``request_timeout``, ...)."""
    flat: dict[str, tuple[str, ...]] = {}
    for group, cls in _GROUPS.items():
        for f in fields(cls):
            inner = _NESTED.get(f.name)
            for g in fields(inner) if inner else (f,):
                flat[g.metadata.get("flat", g.name)] = (group, f.name, g.name) if inner else (group, f.name)
    return flat


_FLAT = _flat_names()


@dataclass(frozen=True, init=False)
class RegenConfig:
    """Every option of ``dqa regen`` (defaults: the CLI's), in checked groups; plus presentation:
    ``live`` (None: a live display when stderr is a terminal), ``log`` (one-line events; None:
    printed to stderr), ``install_signal_handlers`` (the CLI: drain on the first SIGINT/SIGTERM) and
    ``on_progress`` (called with each progress snapshot as progress.json is rewritten, from a worker
    thread; ``--report-to``'s live figures).

    Build it from the groups (``RegenConfig(data=DatasetSpec(...), output=OutputSpec(...),
    dispatch=DispatchSpec(...), selection=..., sampling=...)``) or, for compatibility, from flat
    keywords, one per option (``RegenConfig(dataset=..., out=..., endpoints=[...], ...)``); not both.
    Raises ``UsageError`` for an option a group refuses, ``TypeError`` for an unknown keyword."""

    data: DatasetSpec
    selection: Selection
    sampling: SamplingSpec
    dispatch: DispatchSpec
    output: OutputSpec
    live: bool | None
    log: Callable[[str], None] | None
    install_signal_handlers: bool
    on_progress: Callable[[dict[str, Any]], None] | None

    def __init__(self, data: DatasetSpec | None = None, selection: Selection | None = None, sampling: SamplingSpec | None = None,
                 dispatch: DispatchSpec | None = None, output: OutputSpec | None = None, *, live: bool | None = None,
                 log: Callable[[str], None] | None = None, install_signal_handlers: bool = True,
                 on_progress: Callable[[dict[str, Any]], None] | None = None, **options: Any) -> None:
        groups: dict[str, Any] = {"data": data, "selection": selection, "sampling": sampling, "dispatch": dispatch, "output": output}
        if options:
            unknown = sorted(set(options) - set(_FLAT))
            if unknown:
                raise TypeError(f"RegenConfig: unknown option {unknown[0]!r}")
            given = [k for k, v in groups.items() if v is not None]
            if given:
                raise TypeError(f"RegenConfig: give the {given[0]} group or flat options, not both")
            groups = _groups_from_flat(options)
        if groups["data"] is None or groups["output"] is None:
            raise TypeError("RegenConfig: the dataset (data=DatasetSpec or dataset=) and the output (output=OutputSpec or out=) are required")
        if groups["dispatch"] is None:
            groups["dispatch"] = DispatchSpec()  # raises: neither endpoints nor fleet
        for name, default in (("selection", Selection), ("sampling", SamplingSpec)):
            if groups[name] is None:
                groups[name] = default()
        for name, value in groups.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "live", live)
        object.__setattr__(self, "log", log)
        object.__setattr__(self, "install_signal_handlers", install_signal_handlers)
        object.__setattr__(self, "on_progress", on_progress)


def _groups_from_flat(options: dict[str, Any]) -> dict[str, Any]:
    """The groups from flat keywords (the earlier RegenConfig's fields)."""
    kw: dict[str, dict[str, Any]] = {"data": {}, "selection": {}, "sampling": {}, "dispatch": {}, "output": {}}
    nested: dict[str, dict[str, Any]] = {name: {} for name in _NESTED}
    for key, value in options.items():
        where = _FLAT[key]
        if len(where) == 3:
            nested[where[1]][where[2]] = value
        else:
            kw[where[0]][where[1]] = value
    for name, cls in _NESTED.items():
        if nested[name]:
            kw["dispatch"][name] = cls(**nested[name])
    if "path" not in kw["data"]:
        raise TypeError("RegenConfig: missing the dataset (dataset=)")
    if "out" not in kw["output"]:
        raise TypeError("RegenConfig: missing the output (out=)")
    # Checked in the order the run used to check them: servers, sampling, selection, then the rest.
    dispatch = DispatchSpec(**kw["dispatch"])
    sampling = SamplingSpec(**kw["sampling"])
    selection = Selection(**kw["selection"])
    return {"data": DatasetSpec(**kw["data"]), "selection": selection, "sampling": sampling, "dispatch": dispatch,
            "output": OutputSpec(**kw["output"])}


__all__ = ["DEFAULT_AUX_LAYERS", "DEFAULT_BIND_HOST", "DEFAULT_CALIBRATE_SAMPLE", "DEFAULT_CONNECT_TIMEOUT", "DEFAULT_CONTEXT_LENGTH", "DEFAULT_ENGINE",
           "DEFAULT_GPUS", "DEFAULT_MAMBA_EXTRA_BUFFER", "DEFAULT_MAX_IN_FLIGHT", "DEFAULT_MAX_NEW_TOKENS",
           "DEFAULT_MAX_RUNNING_REQUESTS", "DEFAULT_MERGE_BATCH_ROWS", "DEFAULT_PORT_BASE", "DEFAULT_PREFLIGHT_WINDOW",
           "DEFAULT_PROBE_TIMEOUT", "DEFAULT_PROTOCOL",
           "DEFAULT_REASONING_PARSER", "DEFAULT_REQUEST_TIMEOUT", "DEFAULT_ROUTER_POLICY", "DEFAULT_ROUTER_PORT", "DEFAULT_ROUTER_TIMEOUT",
           "DEFAULT_STATUS_TIMEOUT", "DEFAULT_TOKENIZER", "DEFAULT_TURNS", "DEFAULT_UP_TIMEOUT",
           "PROTOCOLS", "ROUTER_POLICIES", "ROUTER_REGEN_FLAGS", "TURN_MODES", "parse_shard",
           "DatasetSpec", "DispatchSpec", "OutputSpec", "RegenConfig", "Retries", "SamplingSpec", "Selection", "Timeouts"]
