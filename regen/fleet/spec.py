"""What `dqa fleet up` launches: ``FleetSpec`` (one field per option, as a caller gives them) and
``LaunchSpec`` (the checked form ``up.prepare_launch`` makes of it, what ``launch.build_commands``
and the server kinds' ``launch_argv`` read).

The two mirror each other (the engine options ``mtp``, ``mamba_extra_buffer``, ``sglang_version``
and ``deterministic`` are SGLang's and sit in both); one ``FleetSpec`` with a per-kind options
group is the next step.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from dqa.regen.config import (DEFAULT_BIND_HOST, DEFAULT_CONTEXT_LENGTH, DEFAULT_ENGINE, DEFAULT_GPUS, DEFAULT_MAMBA_EXTRA_BUFFER,
                              DEFAULT_MAX_RUNNING_REQUESTS, DEFAULT_PORT_BASE, DEFAULT_REASONING_PARSER, DEFAULT_UP_TIMEOUT)
from dqa.regen.fleet.file import DEFAULT_FLEET_FILE


@dataclass(frozen=True)
class FleetSpec:
    """What to launch: one field per `dqa fleet up` option, with its default.

    ``gpus`` is a list text (``"0-6"``, ``"0,2,5"``) or ids; ``env`` is ``KEY=VALUE`` texts or a
    dict; ``context_length``/``max_running_requests`` 0 mean the server's own default;
    ``reasoning_parser`` ``"none"`` leaves it off; ``python`` ``None`` is the running Python;
    ``log_dir`` ``None`` is ``fleet-logs/`` next to the fleet file; ``extra`` goes to every
    server unchanged. ``sglang_version`` ``None``: asked from ``python`` where a flag depends on
    it; ``deterministic`` adds ``--enable-deterministic-inference``.
    """

    model: str
    gpus: str | Sequence[str] = DEFAULT_GPUS
    engine: str = DEFAULT_ENGINE
    stage: Path | None = None
    mtp: bool = False
    mamba_extra_buffer: str = DEFAULT_MAMBA_EXTRA_BUFFER
    sglang_version: str | None = None
    deterministic: bool = False
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


@dataclass
class LaunchSpec:
    """What to launch. ``model`` is the path (or hub id) every server loads."""

    model: str
    gpus: list[str]
    engine: str = DEFAULT_ENGINE
    host: str = DEFAULT_BIND_HOST
    advertise_host: str | None = None
    port_base: int = DEFAULT_PORT_BASE
    context_length: int | None = DEFAULT_CONTEXT_LENGTH
    max_running_requests: int | None = DEFAULT_MAX_RUNNING_REQUESTS
    reasoning_parser: str | None = DEFAULT_REASONING_PARSER
    enable_metrics: bool = True
    mtp: bool = False
    mamba_extra_buffer: str = DEFAULT_MAMBA_EXTRA_BUFFER  # auto | on | off
    python: str = field(default_factory=lambda: sys.executable)
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path("fleet-logs")
    hybrid: bool | None = None  # hybrid Mamba model; None: read the model's config.json
    sglang_version: str | None = None  # the servers' SGLang release; None: the newest known (servers.sglang_releases.NEWEST_KNOWN)
    deterministic: bool = False  # --enable-deterministic-inference
