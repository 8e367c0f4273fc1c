"""What `dqa fleet up` launches: one ``FleetSpec``, one field per option as a caller gives them,
and its checked form (``FleetSpec.checked()``: the same class, each field in one shape), which
``launch.build_commands`` and the server kinds' ``launch_argv`` read.

The options every server engine has a counterpart of (GPUs, ports, context length, concurrent
requests, reasoning parser, metrics, extra flags) are fields here; the options only one kind has
are its ``engine_options``, a ``servers.base.EngineOptions`` owned by that kind's module
(``servers.sglang.SglangOptions``: MTP, the Mamba cache strategy, the SGLang release,
deterministic inference). This module never reads their fields: the kind checks, settles and turns
them into flags. ``parse_gpus`` and ``parse_env`` read the list options' texts.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dqa.errors import UsageError
from dqa.regen.config import (DEFAULT_BIND_HOST, DEFAULT_CONTEXT_LENGTH, DEFAULT_ENGINE, DEFAULT_GPUS, DEFAULT_MAX_RUNNING_REQUESTS,
                              DEFAULT_PORT_BASE, DEFAULT_REASONING_PARSER, DEFAULT_ROUTER_POLICY, DEFAULT_ROUTER_PORT,
                              DEFAULT_ROUTER_TIMEOUT, DEFAULT_UP_TIMEOUT)
from dqa.regen.fleet.file import DEFAULT_FLEET_FILE
from dqa.regen.servers import ENGINES, KINDS
from dqa.regen.servers.base import EngineOptions

# A POSIX shell variable name: anything else in `KEY=value` would be run by the dry-run script.
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class FleetSpec:
    """What to launch: one field per `dqa fleet up` option, with its default.

    ``gpus`` is a list text (``"0-6"``, ``"0,2,5"``) or ids; ``engine_options`` the engine's own
    options (``servers.sglang.SglangOptions`` for sglang; None: the engine's defaults; another
    engine's options are refused where they would change what runs, else dropped); ``env`` is
    ``KEY=VALUE`` texts or a dict; ``context_length``/``max_running_requests`` 0 mean the server's
    own default; ``reasoning_parser`` ``"none"`` leaves it off; ``python`` ``None`` is the running
    Python; ``log_dir`` ``None`` is ``<fleet file name>-logs/`` next to the fleet file
    (``fleet-logs/`` for ``fleet.json``; ``node-a-logs/`` for ``node-a.json``, so fleets of several
    nodes with their files in one shared folder keep their logs apart); ``extra`` goes to every
    server unchanged. ``router`` starts SGLang's gateway in front of the servers once they are
    healthy (``router_gateway``: ``auto`` is smg when installed, else sglang-router; ``router_policy``; ``router_port`` 0: a free port; ``router_timeout`` seconds for it
    to see a healthy worker).
    """

    model: str
    gpus: str | Sequence[str] = DEFAULT_GPUS
    engine: str = DEFAULT_ENGINE
    engine_options: EngineOptions | None = None
    stage: Path | None = None
    port_base: int = DEFAULT_PORT_BASE
    host: str = DEFAULT_BIND_HOST
    advertise_host: str | None = None
    context_length: int = DEFAULT_CONTEXT_LENGTH
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS
    reasoning_parser: str = DEFAULT_REASONING_PARSER
    metrics: bool = True
    python: str | None = None
    env: Sequence[str] | dict[str, str] = ()
    fleet: Path = Path(DEFAULT_FLEET_FILE)
    log_dir: Path | None = None
    timeout: float = DEFAULT_UP_TIMEOUT
    keep_on_failure: bool = False
    force: bool = False
    extra: Sequence[str] = ()
    router: bool = False
    router_policy: str = DEFAULT_ROUTER_POLICY
    router_port: int = DEFAULT_ROUTER_PORT
    router_timeout: float = DEFAULT_ROUTER_TIMEOUT
    router_gateway: str = "auto"  # auto (smg when installed, else sglang-router) | smg | sglang-router

    def checked(self) -> FleetSpec:
        """This spec with each field in one shape: ``gpus`` a tuple of ids, ``env`` a dict,
        ``engine_options`` the engine's own (checked by its kind), ``python`` and ``log_dir`` set,
        ``reasoning_parser`` ``""`` when off, ``extra`` a tuple. Checking a checked spec changes
        nothing. Raises ``UsageError`` for an unknown engine, a malformed GPU list or ``--env``
        item, or engine options the kind refuses."""
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r}: expected one of {', '.join(ENGINES)}")
        gpus = parse_gpus(self.gpus if isinstance(self.gpus, str) else ",".join(self.gpus))
        if isinstance(self.env, dict):
            for key in self.env:
                check_env_key(key)
            env = dict(self.env)
        else:
            env = parse_env(self.env)
        parser = "" if self.reasoning_parser.lower() in ("", "none") else self.reasoning_parser
        return dataclasses.replace(
            self,
            gpus=tuple(gpus),
            env=env,
            engine_options=KINDS[self.engine].launch_options(self.engine_options),
            python=self.python or sys.executable,
            log_dir=Path(self.log_dir) if self.log_dir is not None else default_log_dir(Path(self.fleet)),
            reasoning_parser=parser,
            extra=tuple(self.extra or ()),
        )


def default_log_dir(fleet: Path) -> Path:
    """Where `dqa fleet up` writes the servers' logs without ``--log-dir``: ``<name>-logs/`` next
    to the fleet file ``<name>.json`` (``fleet-logs/`` for ``fleet.json``)."""
    return fleet.parent / f"{fleet.stem}-logs"


def check_env_key(key: str, given: str | None = None) -> None:
    """Raise ``UsageError`` unless ``key`` is a shell variable name (``[A-Za-z_][A-Za-z0-9_]*``);
    ``given`` is the option text to quote in the message."""
    if not ENV_KEY.fullmatch(key):
        shown = given if given is not None else f"{key}=..."
        raise UsageError(f"--env {shown!r}: {key!r} is not a variable name (letters, digits and _, not starting with a digit)")


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``["OMP_NUM_THREADS=1", "A=x=y"]`` -> ``{"OMP_NUM_THREADS": "1", "A": "x=y"}``.

    Raises ``UsageError`` for an item without ``=`` or whose key is not a variable name.
    """
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        check_env_key(key, item)
        out[key] = value
    return out


def parse_gpus(text: str) -> list[str]:
    """``"0-6"`` -> ``["0", ..., "6"]``; ``"0,2,5"``; ``"0-3,6"``. A single number is one GPU id.

    Raises ``UsageError`` on a malformed list or a repeated GPU.
    """
    out: list[str] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            if dash:
                a, b = int(lo), int(hi)
                if a > b or a < 0:
                    raise ValueError
                out.extend(str(i) for i in range(a, b + 1))
            else:
                if int(part) < 0:
                    raise ValueError
                out.append(str(int(part)))
        except ValueError:
            raise UsageError(f"--gpus {text!r}: expected GPU ids like 0-6, 0,2,5 or 0-3,6") from None
    if not out:
        raise UsageError(f"--gpus {text!r}: no GPU ids")
    dup = sorted({g for g in out if out.count(g) > 1}, key=int)
    if dup:
        raise UsageError(f"--gpus {text!r}: GPU {dup[0]} is listed twice")
    return out
