"""The fleet file: which servers `dqa fleet up` started, for every command that talks to them.

`dqa fleet up` writes it; `dqa regen --fleet`, `dqa plan --fleet` and `dqa fleet status|down`
read it. Format (FORMATS.md, "Fleet file")::

    {"version": 1, "engine": "sglang", "protocol": "sglang", "model": "/dev/shm/Qwen3-27B",
     "created_at": "2026-11-30T08:00:00Z",
     "endpoints": [{"url": "http://10.0.0.5:30000", "gpu": "0", "pid": 4242,
                    "log": "logs/gpu0.log", "host": "10.0.0.5", "cmd": ["python", "..."],
                    "port": 30000, "started": 1796024085.12}]}

With `dqa fleet up --router` the file also has ``"router": {"url", "metrics_url", "gateway", "pid",
"started", "log", "host", "port", "cmd"}`` (``Fleet.router``, an ``Endpoint``; ``gateway`` is
``{"name": "smg" | "sglang-router", "version": "1.13.0"}``, the package it started); `regen
--fleet` then sends to its URL (``Fleet.send_urls``) and takes the gateway's release from there
(``FleetSet.declared``: the gateway does not say it over HTTP).

``started`` (the process start time, seconds since the epoch) lets `fleet down` check that a
recorded pid still is the process `fleet up` started before it signals it. A relative ``log``
is relative to the fleet file's folder. The file never holds an API key: values of secret
flags in ``cmd`` are replaced by ``***`` when the file is written.

A fleet across nodes is one fleet file per node (each node's `dqa fleet up`), read together by
``read_fleets``: a ``FleetSet`` whose servers are the union, in the order the files are given.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dqa.atomic import write_json
from dqa.errors import InputError
from dqa.regen.config import DEFAULT_ENGINE

FLEET_VERSION = 1
# The --fleet default of every fleet command: ./fleet.json, or $DQA_FLEET.
DEFAULT_FLEET_FILE = os.environ.get("DQA_FLEET", "fleet.json")
# Which engines and protocols a fleet file may name: dqa.regen.servers (ENGINES, PROTOCOLS, and
# each kind's protocol as the default), imported when a file is parsed, not when dqa starts.
# Flags whose value is a credential; their values never reach the fleet file.
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--hf-token", "--token")
REDACTED = "***"


@dataclass
class Endpoint:
    """One server of the fleet. ``pid``/``started``/``log``/``cmd`` are absent for servers dqa did not start."""

    url: str
    gpu: str | None = None
    pid: int | None = None
    log: str | None = None
    host: str | None = None
    cmd: list[str] = field(default_factory=list)
    port: int | None = None
    started: float | None = None
    metrics_url: str | None = None  # the router's Prometheus port (only on the fleet's "router")
    gateway: dict[str, str] | None = None  # the router's package and release: {"name", "version"} (only on "router")


@dataclass
class Fleet:
    """A fleet as recorded in the fleet file; ``path`` is where it was read from (not stored)."""

    engine: str
    protocol: str
    model: str
    endpoints: list[Endpoint]
    created_at: str = ""
    version: int = FLEET_VERSION
    path: Path | None = None
    router: Endpoint | None = None  # sglang-router in front of the endpoints (`fleet up --router`)

    @property
    def send_urls(self) -> list[str]:
        """Where `dqa regen --fleet` sends: the router's URL when the fleet has one, else the endpoints."""
        return [self.router.url] if self.router is not None else self.urls

    @property
    def gpu_count(self) -> int:
        """GPUs the fleet uses: the ids each endpoint lists (``"0,1"`` for a TP-2 server), one
        for an endpoint without a ``gpu``."""
        return sum(len([g for g in (e.gpu or "").split(",") if g.strip()]) or 1 for e in self.endpoints)

    @property
    def urls(self) -> list[str]:
        """The endpoint base URLs, in GPU order."""
        return [e.url for e in self.endpoints]

    def log_path(self, endpoint: Endpoint) -> Path | None:
        """The endpoint's log file, a relative path resolved against the fleet file's folder."""
        if not endpoint.log:
            return None
        p = Path(endpoint.log)
        if not p.is_absolute() and self.path is not None:
            p = self.path.parent / p
        return p


def redact(cmd: list[str]) -> list[str]:
    """Return ``cmd`` with the value of every secret flag (``--api-key X``, ``--api-key=X``) replaced by ``***``."""
    out: list[str] = []
    hide_next = False
    for arg in cmd:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if name in SECRET_FLAGS:
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def now_iso() -> str:
    """The current UTC time as ``2026-11-30T08:00:00Z``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_dict(fleet: Fleet) -> dict[str, Any]:
    """The JSON object for ``fleet`` (secret flag values redacted, ``None`` fields dropped)."""
    endpoints = []
    for e in fleet.endpoints:
        d = {k: v for k, v in asdict(e).items() if v is not None}
        d["cmd"] = redact(list(e.cmd))
        endpoints.append(d)
    out = {
        "version": fleet.version,
        "engine": fleet.engine,
        "protocol": fleet.protocol,
        "model": fleet.model,
        "created_at": fleet.created_at or now_iso(),
        "endpoints": endpoints,
    }
    if fleet.router is not None:
        out["router"] = {**{k: v for k, v in asdict(fleet.router).items() if v is not None}, "cmd": redact(list(fleet.router.cmd))}
    return out


def write_fleet(path: str | Path, fleet: Fleet) -> Path:
    """Atomically write ``fleet`` to ``path``; return the path. Raises ``OSError`` on a write failure."""
    path = Path(path)
    write_json(path, to_dict(fleet))
    fleet.path = path
    return path


def _bad(path: Path, what: str) -> InputError:
    return InputError(f"{path}: not a dqa fleet file: {what}")


def parse_fleet(obj: Any, path: Path) -> Fleet:
    """Validate a decoded fleet-file object; return the ``Fleet``. Raises ``InputError`` naming the field."""
    if not isinstance(obj, dict):
        raise _bad(path, "expected a JSON object")
    version = obj.get("version", FLEET_VERSION)
    if version != FLEET_VERSION:
        raise _bad(path, f"version {version!r}, expected {FLEET_VERSION}")
    from dqa.regen.servers import ENGINES, KINDS, PROTOCOLS

    engine = obj.get("engine", DEFAULT_ENGINE)
    if engine not in ENGINES:
        raise _bad(path, f"engine {engine!r}, expected one of {', '.join(ENGINES)}")
    protocol = obj.get("protocol", KINDS[engine].protocol)
    if protocol not in PROTOCOLS:
        raise _bad(path, f"protocol {protocol!r}, expected one of {', '.join(PROTOCOLS)}")
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(path, "'model' must be a non-empty string")
    raw = obj.get("endpoints")
    if not isinstance(raw, list) or not raw:
        raise _bad(path, "'endpoints' must be a non-empty list")
    endpoints = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict) or not isinstance(e.get("url"), str) or not e["url"].startswith(("http://", "https://")):
            raise _bad(path, f"endpoints[{i}].url must be an http(s) URL")
        pid = e.get("pid")
        if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
            raise _bad(path, f"endpoints[{i}].pid must be a positive integer")
        cmd = e.get("cmd") or []
        if not isinstance(cmd, list) or not all(isinstance(a, str) for a in cmd):
            raise _bad(path, f"endpoints[{i}].cmd must be a list of strings")
        started = e.get("started")
        if started is not None and not isinstance(started, (int, float)):
            raise _bad(path, f"endpoints[{i}].started must be a number")
        port = e.get("port")
        endpoints.append(
            Endpoint(
                url=e["url"].rstrip("/"),
                gpu=None if e.get("gpu") is None else str(e["gpu"]),
                pid=pid,
                log=e.get("log"),
                host=e.get("host"),
                cmd=list(cmd),
                port=port if isinstance(port, int) else None,
                started=None if started is None else float(started),
            )
        )
    return Fleet(
        engine=engine,
        protocol=protocol,
        model=model,
        endpoints=endpoints,
        created_at=str(obj.get("created_at", "")),
        version=version,
        path=path,
        router=parse_router(obj.get("router"), path),
    )


def parse_router(raw: Any, path: Path) -> Endpoint | None:
    """The fleet file's ``router`` object as an ``Endpoint`` (None when absent). Raises
    ``InputError`` naming the field that is malformed."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad(path, "'router' must be an object")
    for key in ("url", "metrics_url"):
        v = raw.get(key)
        if key == "url" or v is not None:
            if not isinstance(v, str) or not v.startswith(("http://", "https://")):
                raise _bad(path, f"router.{key} must be an http(s) URL")
    pid, started, cmd, port = raw.get("pid"), raw.get("started"), raw.get("cmd") or [], raw.get("port")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
        raise _bad(path, "router.pid must be a positive integer")
    if started is not None and not isinstance(started, (int, float)):
        raise _bad(path, "router.started must be a number")
    if not isinstance(cmd, list) or not all(isinstance(a, str) for a in cmd):
        raise _bad(path, "router.cmd must be a list of strings")
    gateway = raw.get("gateway")
    if gateway is not None and (not isinstance(gateway, dict) or not all(isinstance(gateway.get(k), str) for k in ("name", "version"))):
        raise _bad(path, 'router.gateway must be {"name": ..., "version": ...} (strings)')
    return Endpoint(
        url=raw["url"].rstrip("/"), pid=pid, log=raw.get("log"), host=raw.get("host"), cmd=list(cmd),
        port=port if isinstance(port, int) else None, started=None if started is None else float(started),
        metrics_url=None if raw.get("metrics_url") is None else raw["metrics_url"].rstrip("/"),
        gateway=None if gateway is None else {"name": gateway["name"], "version": gateway["version"]},
    )


def read_fleet(path: str | Path) -> Fleet:
    """Read and validate a fleet file. Raises ``InputError`` when it is missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: fleet file not found (start a fleet with `dqa fleet up`, or pass --fleet FILE)")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"invalid JSON ({exc})") from None
    return parse_fleet(obj, path)


# Hosts only the machine itself reaches: a fleet file with them serves no other node.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass
class FleetSet:
    """The fleet files of one run, read together (one per node): ``fleets`` in the order given.
    Its servers are the union of theirs; no URL is in two files (``read_fleets`` checks)."""

    fleets: list[Fleet]

    @property
    def paths(self) -> list[Path]:
        """Where each fleet was read from."""
        return [f.path for f in self.fleets if f.path is not None]

    @property
    def urls(self) -> list[str]:
        """Every endpoint's base URL: the first file's, then the next file's, ..."""
        return [u for f in self.fleets for u in f.urls]

    @property
    def send_urls(self) -> list[str]:
        """Where `dqa regen --fleet` sends: each fleet's router, or its endpoints where it has none."""
        return [u for f in self.fleets for u in f.send_urls]

    @property
    def declared(self) -> dict[str, dict[str, str]]:
        """``{URL: {"name": ..., "version": ...}}``: what the files record of the server behind a
        URL they send to that it cannot say itself over HTTP (a router's package and release)."""
        return {f.router.url: dict(f.router.gateway) for f in self.fleets if f.router is not None and f.router.gateway}

    @property
    def gpu_count(self) -> int:
        """GPUs of all the fleets together (``Fleet.gpu_count`` summed)."""
        return sum(f.gpu_count for f in self.fleets)

    def agreed(self, name: str, option: str) -> str:
        """The value of ``name`` (``engine``, ``protocol``, ``model``) that every file records.
        Raises ``InputError`` naming two files that differ and the ``option`` that settles it."""
        first = self.fleets[0]
        for other in self.fleets[1:]:
            if getattr(other, name) != getattr(first, name):
                raise InputError(
                    f"--fleet: {first.path} has {name} {getattr(first, name)!r} but {other.path} has {getattr(other, name)!r}; "
                    f"the fleet files of one run must agree (or pass {option})"
                )
        return getattr(first, name)


def fleet_paths(given: str | os.PathLike | Sequence[str | os.PathLike] | None) -> tuple[str, ...]:
    """``--fleet`` as given (one path, several, or None) -> the paths as texts, in order."""
    if given is None:
        return ()
    if isinstance(given, (str, os.PathLike)):
        return (os.fspath(given),)
    return tuple(os.fspath(g) for g in given)


def _loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def read_fleets(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> FleetSet:
    """Read the fleet files of several nodes as one ``FleetSet``. Raises ``InputError`` (one line)
    naming a file that is missing or malformed (``read_fleet``), a file given twice, or an
    endpoint URL that two files list (naming both files); ``UsageError`` for no file at all."""
    from dqa.errors import UsageError

    files = fleet_paths(paths)
    if not files:
        raise UsageError("give --fleet FILE (repeatable: one fleet file per node)")
    fleets: list[Fleet] = []
    seen: dict[Path, Path] = {}
    owner: dict[str, Path] = {}
    for text in files:
        path = Path(text)
        key = path.resolve()
        if key in seen:
            raise UsageError(f"--fleet {path}: given twice" + ("" if str(seen[key]) == str(path) else f" (as {seen[key]})"))
        seen[key] = path
        fleet = read_fleet(path)
        for url in fleet.urls:
            if url in owner and owner[url] != path:
                hint = (
                    "; a loopback URL reaches only its own machine: start each node's fleet with --host 0.0.0.0 (or --advertise-host NAME)"
                    if _loopback(url) else ""
                )
                raise InputError(f"--fleet: {url} is in both {owner[url]} and {path}: a server belongs to one fleet file{hint}")
            owner.setdefault(url, path)
        fleets.append(fleet)
    return FleetSet(fleets)
