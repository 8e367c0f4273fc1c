"""Bring a fleet up from Python: what `dqa fleet up` does, without printing.

    from dqa.regen.servers.sglang import SglangOptions   # the engine's own options

    spec = FleetSpec(model="/models/Qwen3.6-27B", gpus="0-6", stage=Path("/dev/shm"),
                     engine_options=SglangOptions(mtp=True), extra=("--kv-cache-dtype", "fp8_e4m3"))
    print(prepare_launch(spec, dry_run=True).script())   # the bash script, nothing started
    result = launch_fleet(spec)                           # servers healthy, fleet file written

``prepare_launch`` checks the options, works out the model path each server loads (the staged
copy with ``stage``), lets the engine's server kind settle what its options depend on
(``ServerKind.prepare``; SGLang: whether the model is hybrid Mamba, the release a flag depends on)
and builds one command per GPU; nothing is started or written. With ``dry_run=True`` a model
folder that is not on this machine is allowed: the script is made anyway and ``notes`` say which
model-dependent choices were made without it. ``launch_fleet``
stages the model, starts the servers, writes the fleet file and waits until every server
generates; ``LaunchEvents`` is how a caller shows progress (the CLI: bars, log tails).
What is launched is ``spec``; the building blocks (argument lists, health, stopping) are in ``launch``, staging in ``stage``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

from dqa.errors import InputError, RuntimeFailure, UsageError
from dqa.regen.fleet import file as ff
from dqa.regen.fleet import launch as fl
from dqa.regen.fleet import router as fr
from dqa.regen.fleet.logs import log_tail
from dqa.regen.fleet.spec import FleetSpec
from dqa.regen.fleet.stage import stage_model
from dqa.regen.servers import KINDS

Progress = Callable[[int, int], None]


@dataclass
class PreparedLaunch:
    """A prepared ``FleetSpec``: ``spec`` as given, ``launch`` its checked form with the model
    path the servers load and the engine options settled, one command per GPU, the staging copy
    ``(source folder, copy)`` if any, and ``notes``: model-dependent choices made without the
    model (only with ``dry_run`` and a model folder that is not here), and what the engine's kind
    assumed (SGLang: the release, when a flag depends on it and the servers' Python could not say)."""

    spec: FleetSpec
    launch: FleetSpec
    commands: list[fl.ServerCommand]
    stage: tuple[Path, Path] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def fleet_path(self) -> Path:
        """The fleet file to write."""
        return Path(self.spec.fleet)

    def script(self) -> str:
        """The bash script of ``--dry-run``: the notes as comment lines, the staging copy, then
        every server in the background with its log (see ``launch.dry_run_script``)."""
        text = fl.dry_run_script(self.commands, self.spec.engine, self.stage)
        if not self.notes:
            return text
        head, _, rest = text.partition("\n")
        return "\n".join([head, *(f"# note: {n}" for n in self.notes), rest])


@dataclass
class LaunchResult:
    """A fleet that is up: its record (as written to ``fleet_path``) and how long the servers
    took to become healthy."""

    fleet_path: Path
    record: ff.Fleet
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        """The fleet file's JSON object (what `dqa fleet up --json` prints)."""
        return ff.to_dict(self.record)


class LaunchEvents:
    """What ``launch_fleet`` reports as it goes; every hook does nothing here. Subclass it to
    show progress (the CLI shows bars on a terminal and log tails on stderr)."""

    def staging(self, src: Path) -> ContextManager[Progress | None]:
        """Entered around the staging copy of ``src``; yields ``on_progress(done, total)`` bytes or None."""
        return contextlib.nullcontext(None)

    def staged(self, src: Path, dest: Path, copied: bool) -> None:
        """The copy is in place (``copied`` False: an identical copy was there already)."""

    def waiting(self, servers: int, engine: str) -> ContextManager[Progress | None]:
        """Entered while waiting for health; yields ``on_progress(healthy, total)`` or None."""
        return contextlib.nullcontext(None)

    def server_failed(self, gpu: str, log: Path, tail: list[str]) -> None:
        """A server exited or was not healthy in time; ``tail``: the last lines of its log."""

    def not_stopped(self, gpu: str, pid: int, outcome: str) -> None:
        """After a failed start, a server that could not be stopped (its record is kept)."""


def _model_is_a_path(model: str, stage: Path | None) -> bool:
    """True when ``model`` names a folder rather than a hub id: an absolute path, one starting
    with . or ~, or anything to be staged (only a folder can be copied)."""
    return stage is not None or os.path.isabs(model) or model.startswith((".", "~"))


def _missing_model_notes(spec: FleetSpec, model: str) -> list[str]:
    """What a dry run without the model folder decided without it (see ``prepare_launch``)."""
    notes = [f"model folder {model} not found on this machine; the script needs it where it runs"]
    notes += KINDS[spec.engine].missing_model_notes(spec)  # what the engine's options needed the model for
    if spec.stage is not None:
        notes.append(
            f"--stage free-space check needs the model's size: not done (`dqa fleet up` checks {spec.stage} at run time; the script's cp does not)"
        )
    return notes


def prepare_launch(spec: FleetSpec, dry_run: bool = False) -> PreparedLaunch:
    """Check ``spec`` and build the server commands; starts and writes nothing.

    Raises ``UsageError`` for what ``FleetSpec.checked`` refuses (an unknown engine, a malformed
    GPU list or ``--env`` item, engine options the kind refuses: SGLang's ``--mtp`` or
    ``--deterministic`` with another engine, a bad Mamba mode or release number), ``router`` with
    an engine the SGLang gateway cannot front (``ServerKind.no_router``: transformers), a bad port
    range, and ``stage`` with a model folder that does not exist (allowed with ``dry_run``: then
    ``notes`` say what was decided without it).
    """
    checked = spec.checked()
    kind = KINDS[checked.engine]
    if spec.router and kind.no_router:
        raise UsageError(f"--router with --engine {checked.engine}: {kind.no_router}")
    model_path = Path(spec.model).expanduser()
    local = model_path.exists()
    missing = not local and dry_run and _model_is_a_path(spec.model, spec.stage)
    model_arg = str(model_path.resolve()) if local else spec.model
    if spec.stage is not None and not local and not missing:
        raise UsageError(f"--stage needs a local model folder; {spec.model} does not exist")
    stage_pair = None
    if spec.stage is not None:
        src = model_path.resolve() if local else Path(os.path.abspath(model_path))
        stage_dest = Path(os.path.abspath(spec.stage)) / src.name
        stage_pair = (src, stage_dest)
        model_arg = str(stage_dest)

    launch = dataclasses.replace(checked, model=model_arg)
    notes = _missing_model_notes(launch, str(model_path)) if missing else []
    # The kind reads the source folder (a staged copy may not exist yet: --dry-run) and may ask
    # the servers' Python (SGLang: hybrid Mamba, the release a flag depends on).
    options = kind.prepare(launch, model_path if local else None, notes)
    launch = dataclasses.replace(launch, engine_options=options)
    commands = fl.build_commands(launch)
    if spec.router and dry_run:
        notes.append("--router: the router starts once the servers are healthy, on free ports; `dqa fleet up --router` starts it (not this script)")
    return PreparedLaunch(spec=spec, launch=launch, commands=commands, stage=stage_pair, notes=notes)


def _refuse_to_overwrite(fleet: Path, force: bool) -> None:
    """Raise ``UsageError`` when ``fleet`` records a fleet that still runs (this machine's: its
    processes; another machine's, e.g. a node sharing the folder: its servers answer ``/health``),
    and ``InputError`` when it cannot be read as a fleet file (it may be the only record of a
    running fleet, or not a fleet file at all) unless ``force``."""
    if not fleet.is_file():
        return
    try:
        old = ff.read_fleet(fleet)
    except InputError as exc:
        if not force:
            raise InputError(f"{exc}; refusing to overwrite it (pass --force, or another --fleet)") from None
        old = None
    if old is None:
        return
    if any(fl.endpoint_alive(e) for e in old.endpoints + ([old.router] if old.router else [])):
        raise UsageError(f"{fleet} records a fleet that is still running; `dqa fleet down --fleet {fleet}` first or pass another --fleet")
    remote = [e for e in old.endpoints if not fl.is_local_host(e.host)]
    running = next((e for e in remote if fl.probe_health(e.url, "/health", timeout=3.0)), None)
    if running is not None:
        raise UsageError(
            f"{fleet} records servers of another machine ({running.host}) that still answer; "
            "give each node its own fleet file (e.g. --fleet fleets/$(hostname).json)"
        )


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Inside, SIGTERM cleans up like Ctrl-C (only in the main thread, where signals land)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _terminated(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch_fleet(spec: FleetSpec, events: LaunchEvents | None = None) -> LaunchResult:
    """Start one server per GPU, write the fleet file, and wait until every server is healthy;
    with ``spec.router``, then start the SGLang gateway (smg, else sglang-router) in front of them (``fleet.router``), record it in
    the fleet file and wait until it sees a healthy worker.

    The fleet file is written before the wait, so `dqa fleet down` can stop the servers even if
    this process dies. When a server fails (or on Ctrl-C/SIGTERM once they are started) the
    servers already started are stopped (unless ``keep_on_failure``) and the fleet file is removed,
    kept only while one could not be stopped. Returns the ``LaunchResult``. Raises
    ``UsageError``/``InputError`` for bad options (see ``prepare_launch``), a fleet file that
    records a running fleet or cannot be read, or a busy port; ``launch.ServerFailed``
    naming the GPU and log of a server that exited or timed out; ``RuntimeFailure`` when
    interrupted while waiting, or when the router exits or is not ready in time (servers and
    router stopped). ``--router`` with a model that is not a local folder, an unknown policy, no
    gateway package (smg, sglang-router) or an engine the router cannot front (transformers) is a ``UsageError``
    before anything starts.
    """
    events = events or LaunchEvents()
    prepared = prepare_launch(spec)
    fleet = prepared.fleet_path
    _refuse_to_overwrite(fleet, spec.force)
    if spec.router:  # refused before anything starts
        tokenizer = str(prepared.stage[0]) if prepared.stage is not None else prepared.launch.model
        gateway = fr.check_router(spec.router_policy, tokenizer, spec.router_port, spec.router_gateway)

    if prepared.stage is not None:
        src = prepared.stage[0]
        with events.staging(src) as on_progress:
            dest, copied = stage_model(src, spec.stage, on_progress)
        events.staged(src, dest, copied)

    cmds = prepared.commands
    fl.check_ports_free(cmds, spec.host)
    t0 = time.monotonic()
    servers = fl.start_servers(cmds)
    # From here on, a failure, Ctrl-C or SIGTERM (even one that lands while the fleet file is
    # being written) stops the servers just started.
    try:
        with _sigterm_as_interrupt():
            record = ff.Fleet(
                engine=spec.engine,
                protocol=KINDS[spec.engine].protocol,
                model=prepared.launch.model,
                endpoints=[s.endpoint() for s in servers],
                created_at=ff.now_iso(),
            )
            # Written before the wait, so `fleet down` can stop the servers even if dqa is killed here.
            ff.write_fleet(fleet, record)
            with events.waiting(len(servers), spec.engine) as on_progress:
                fl.wait_healthy(servers, spec.engine, spec.timeout, on_progress=on_progress)
            if spec.router:
                _start_router(prepared, record, fleet, gateway)
    except BaseException as exc:
        if isinstance(exc, fl.ServerFailed):
            events.server_failed(exc.gpu, exc.log, log_tail(exc.log))
        left = []
        if not spec.keep_on_failure:
            outcomes = fl.stop_started(servers, grace=10.0)
            left = [(s, o) for s, o in zip(servers, outcomes) if not fl.stopped(o)]
            if left:  # keep the record so `fleet down` can retry them
                for s, o in left:
                    events.not_stopped(s.command.gpu, s.process.pid, o)
            else:
                fleet.unlink(missing_ok=True)
        if isinstance(exc, KeyboardInterrupt):
            what = "interrupted" if spec.keep_on_failure else "interrupted while waiting for the fleet; servers stopped"
            if left:
                what = f"interrupted; {len(left)} server(s) could not be stopped, see {fleet}"
            raise RuntimeFailure(what) from None
        raise
    return LaunchResult(fleet_path=fleet, record=record, elapsed_s=time.monotonic() - t0)


def _start_router(prepared: PreparedLaunch, record: ff.Fleet, fleet: Path, gateway: "fr.Gateway"):
    """Start ``gateway`` (smg or sglang-router) in front of ``record``'s servers (healthy by now), record it in the
    fleet file before waiting (so `fleet down` can stop it), and wait until it sees a healthy
    worker; on a failure (or Ctrl-C) the router is stopped again before the error goes on. Returns
    its process. Raises ``RuntimeFailure`` when it exits or is not ready in time."""
    spec, launch = prepared.spec, prepared.launch
    url_host = fl.advertised_host(spec.host, spec.advertise_host)
    cmd = fr.router_command(record.urls, launch.model, Path(launch.log_dir), spec.host, url_host, gateway,
                            policy=spec.router_policy, port=spec.router_port)  # fmt: skip
    proc, record.router = fr.start_router(cmd)
    try:
        ff.write_fleet(fleet, record)
        fr.wait_ready(proc, record.router, spec.router_timeout)
    except BaseException:
        fl.stop_endpoint(record.router, grace=5.0)
        raise
    return proc
