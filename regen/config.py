"""``RegenConfig``: every option of ``dqa regen``, as small checked objects.

As httpx keeps ``Timeout`` and ``Limits`` apart from the client, a run's options come in groups,
each frozen and checking its own fields when built (``UsageError``, exit 2, worded as the CLI
option):

* ``DatasetSpec``: the dataset, its column overrides and the chat format (``--tokenizer``);
* ``Selection``: which rows and turns (findings, reasons, ``--all``, shard, limit, turns, retry);
* ``SamplingSpec``: what each request asks for (temperature, top_p, top_k, max_new_tokens, seed base);
* ``DispatchSpec``: the servers and how they are driven (endpoints or fleet, protocol, model, key,
  concurrency, cost figures) with ``Timeouts`` and ``Retries``;
* ``OutputSpec``: where results go (``--out``, mirrors) and how often they are made durable.

``RegenConfig(data=..., selection=..., ...)`` builds a config from the groups; the flat keyword
form ``RegenConfig(dataset=..., out=..., endpoints=[...], max_in_flight=8, ...)`` (one keyword per
option, the names of the earlier flat dataclass) is kept for in-process callers and tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from dqa.errors import UsageError
from dqa.regen.jobs.prompts import TURN_MODES
from dqa.regen.jobs.rows import parse_shard
from dqa.regen.servers import PROTOCOLS


@dataclass(frozen=True)
class DatasetSpec:
    """The dataset (a path or URL as ``dqa scan`` takes it), the column overrides given (None:
    detected) and the chat format (a tokenizer folder or the preset ``qwen3``)."""

    path: str
    ids_column: str | None = None
    mask_column: str | None = None
    labels_column: str | None = None
    id_column: str | None = None
    tokenizer: str | None = "qwen3"

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
    turns: str = "flagged"
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
    ``max_new_tokens`` 8192 covers the long tail of thinking traces and must fit the servers'
    context with the prompt); the per-row seed is ``seed_base`` + row."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_new_tokens: int = 8192
    seed_base: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise UsageError("--max-new-tokens must be >= 1")

    def sampling(self):
        """The request sampling (``dqa.regen.jobs.job.Sampling``)."""
        from dqa.regen.jobs.job import Sampling

        return Sampling(self.temperature, self.top_p, self.top_k, self.max_new_tokens)


@dataclass(frozen=True)
class Timeouts:
    """Seconds: one attempt's whole reply, from its connection to the last byte (``request``),
    getting a connection (``connect``, on its own clock before that), between health checks
    (``health_interval``) and for one (``health``), no healthy endpoint before the run stops
    (``down_deadline``), and connect tries at start-up before an endpoint counts as unreachable
    (``preflight_window``)."""

    request: float = 3600.0
    connect: float = 10.0
    health_interval: float = 15.0
    health: float = 30.0
    down_deadline: float = 600.0
    preflight_window: float = 6.0


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
    """The servers (``endpoints`` or a ``fleet`` file, not both) and how they are driven:
    ``protocol`` (sglang | openai; default the fleet file's, else sglang), ``model``, the API key's
    environment variable, requests in flight per endpoint; ``gpus`` and ``gpu_hour_cost`` for the
    cost figures (``gpus`` default: the fleet file's, else one per endpoint); ``ca_bundle``: the
    CA certificates that verify ``https://`` servers (None: ``$SSL_CERT_FILE``,
    ``$REQUESTS_CA_BUNDLE``, else the system's; ``http_policy``)."""

    endpoints: tuple[str, ...] = ()
    fleet: str | None = None
    protocol: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    max_in_flight: int = 48
    gpus: int | None = None
    gpu_hour_cost: float = 0.0
    ca_bundle: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    retries: Retries = field(default_factory=Retries)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", tuple(self.endpoints or ()))
        if bool(self.endpoints) == bool(self.fleet):
            raise UsageError("give --endpoint URL (repeatable) or --fleet FILE, not both and not neither")
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise UsageError(f"--protocol {self.protocol!r}: expected sglang or openai")
        if self.max_in_flight < 1:
            raise UsageError("--max-in-flight must be >= 1")
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


# flat keyword (the earlier RegenConfig field) -> (group, attribute[, attribute of the nested group])
_FLAT: dict[str, tuple[str, ...]] = {
    "dataset": ("data", "path"),
    "ids_column": ("data", "ids_column"),
    "mask_column": ("data", "mask_column"),
    "labels_column": ("data", "labels_column"),
    "id_column": ("data", "id_column"),
    "tokenizer": ("data", "tokenizer"),
    "failed_only": ("selection", "failed_only"),
    "findings": ("selection", "findings"),
    "reasons": ("selection", "reasons"),
    "limit": ("selection", "limit"),
    "shard": ("selection", "shard"),
    "turns": ("selection", "turns"),
    "retry_failed": ("selection", "retry_failed"),
    "temperature": ("sampling", "temperature"),
    "top_p": ("sampling", "top_p"),
    "top_k": ("sampling", "top_k"),
    "max_new_tokens": ("sampling", "max_new_tokens"),
    "seed_base": ("sampling", "seed_base"),
    "endpoints": ("dispatch", "endpoints"),
    "fleet": ("dispatch", "fleet"),
    "protocol": ("dispatch", "protocol"),
    "model": ("dispatch", "model"),
    "api_key_env": ("dispatch", "api_key_env"),
    "max_in_flight": ("dispatch", "max_in_flight"),
    "gpus": ("dispatch", "gpus"),
    "gpu_hour_cost": ("dispatch", "gpu_hour_cost"),
    "ca_bundle": ("dispatch", "ca_bundle"),
    "request_timeout": ("dispatch", "timeouts", "request"),
    "connect_timeout": ("dispatch", "timeouts", "connect"),
    "health_interval": ("dispatch", "timeouts", "health_interval"),
    "health_timeout": ("dispatch", "timeouts", "health"),
    "down_deadline": ("dispatch", "timeouts", "down_deadline"),
    "preflight_window": ("dispatch", "timeouts", "preflight_window"),
    "max_attempts": ("dispatch", "retries", "max_attempts"),
    "backoff_base": ("dispatch", "retries", "backoff_base"),
    "backoff_max": ("dispatch", "retries", "backoff_max"),
    "fail_threshold": ("dispatch", "retries", "fail_threshold"),
    "out": ("output", "out"),
    "mirror": ("output", "mirror"),
    "shard_rows": ("output", "shard_rows"),
    "shard_seconds": ("output", "shard_seconds"),
    "commit_interval": ("output", "commit_interval"),
    "progress_interval": ("output", "progress_interval"),
}
_NESTED = {"timeouts": Timeouts, "retries": Retries}


@dataclass(frozen=True, init=False)
class RegenConfig:
    """Every option of ``dqa regen`` (defaults: the CLI's), in checked groups; plus presentation:
    ``live`` (None: a live display when stderr is a terminal), ``log`` (one-line events; None:
    printed to stderr) and ``install_signal_handlers`` (the CLI: drain on the first SIGINT/SIGTERM).

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

    def __init__(self, data: DatasetSpec | None = None, selection: Selection | None = None, sampling: SamplingSpec | None = None,
                 dispatch: DispatchSpec | None = None, output: OutputSpec | None = None, *, live: bool | None = None,
                 log: Callable[[str], None] | None = None, install_signal_handlers: bool = True, **options: Any) -> None:
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


__all__ = ["DatasetSpec", "DispatchSpec", "OutputSpec", "RegenConfig", "Retries", "SamplingSpec", "Selection", "Timeouts"]
