"""Launch, wait for and stop a fleet of model servers: one server process per GPU.

``build_commands`` turns a ``FleetSpec`` (checked) into one ``ServerCommand`` per GPU: an argument
list (never a shell string; user text such as a model path with spaces passes through intact),
the environment it adds (``CUDA_VISIBLE_DEVICES=i``), its port and its log file. The argument list
itself is the engine's server kind's (``dqa.regen.servers``: each kind's ``launch_argv`` reads the
generic options and its own ``engine_options``), and so is the health path ``wait_healthy``
polls.
``stage.stage_model`` copies the model folder to a RAM disk once. ``start_servers`` +
``wait_healthy`` bring the fleet up; ``stop_endpoint`` stops exactly a recorded process after
checking it still is the one dqa started. The whole of `dqa fleet up` (checks, staging, start,
fleet file, wait, clean-up on failure) is ``up.launch_fleet``; a server's log is read with ``logs``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from dqa.errors import InputError, RuntimeFailure, UsageError
from dqa.regen.config import DEFAULT_PROBE_TIMEOUT
from dqa.regen.fleet.file import Endpoint, redact
from dqa.regen.fleet.spec import FleetSpec
from dqa.regen.servers import ENGINES, KINDS
from dqa.regen.wire.http_probe import answers_ok

# Per engine: the health path `fleet up` waits on.
HEALTH_PATH = {name: KINDS[name].health_paths[0] for name in ENGINES}
KILL_WAIT_S = 5.0  # how long a SIGKILLed process may take to disappear before it counts as "not stopped"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass
class ServerCommand:
    """One server: ``argv`` runs with the current environment plus ``env``; output goes to ``log``."""

    gpu: str
    port: int
    url: str
    host: str
    argv: list[str]
    env: dict[str, str]
    log: Path

    def shell_line(self) -> str:
        """The command as one bash line an operator can paste: env, argv, log redirect, background."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cmd = shlex.join(self.argv)
        return f"{env} {cmd} > {shlex.quote(str(self.log))} 2>&1 &".lstrip()


def advertised_host(bind_host: str, advertise: str | None) -> str:
    """The host name to put in endpoint URLs: ``advertise`` if given, the bind host unless it is a
    wildcard, else this machine's primary address (no packet is sent), else 127.0.0.1."""
    if advertise:
        return advertise
    if bind_host not in WILDCARD_HOSTS:
        return bind_host
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    return "127.0.0.1"


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def server_argv(spec: FleetSpec, port: int) -> list[str]:
    """The argument list of one server of ``spec`` (checked) listening on ``port``: its engine's
    ``launch_argv``. Raises ``UsageError`` for an engine dqa cannot launch."""
    if spec.engine not in ENGINES:
        raise UsageError(f"--engine {spec.engine!r}: expected one of {', '.join(ENGINES)}")
    return KINDS[spec.engine].launch_argv(spec, port)


def build_commands(spec: FleetSpec) -> list[ServerCommand]:
    """One command per GPU: GPU ``gpus[k]`` gets port ``port_base + k`` and log ``gpu<id>.log``.
    ``spec`` is checked first (``FleetSpec.checked``); ``up.prepare_launch`` also settles the
    model path and what the engine options depend on.

    Raises ``UsageError`` for what ``checked`` refuses (an unknown engine, a GPU list, an
    environment key that is not a variable name, engine options the kind refuses) and a port
    past 65535.
    """
    spec = spec.checked()
    if spec.port_base < 1 or spec.port_base + len(spec.gpus) - 1 > 65535:
        raise UsageError(f"--port-base {spec.port_base}: ports {spec.port_base}..{spec.port_base + len(spec.gpus) - 1} must lie in 1..65535")
    host = advertised_host(spec.host, spec.advertise_host)
    out = []
    for k, gpu in enumerate(spec.gpus):
        port = spec.port_base + k
        env = {"CUDA_VISIBLE_DEVICES": gpu, **spec.env}
        out.append(
            ServerCommand(
                gpu=gpu,
                port=port,
                url=_url(host, port),
                host=host,
                argv=server_argv(spec, port),
                env=env,
                log=spec.log_dir / f"gpu{gpu}.log",
            )
        )
    return out


def dry_run_script(cmds: Sequence[ServerCommand], engine: str, stage: tuple[Path, Path] | None = None) -> str:
    """A bash script that does what ``fleet up`` would: optional staging copy, then every server in
    the background with its log. Every line is shell-quoted, so it runs unchanged."""
    lines = [f"# dqa fleet up --dry-run: {len(cmds)} {engine} server(s), one per GPU"]
    if stage is not None:
        src, dest = stage
        lines.append(f"mkdir -p {shlex.quote(str(dest))} && cp -a {shlex.quote(str(src))}/. {shlex.quote(str(dest))}/")
    log_dirs = sorted({str(c.log.parent) for c in cmds})
    lines.append("mkdir -p " + " ".join(shlex.quote(d) for d in log_dirs))
    lines.extend(c.shell_line() for c in cmds)
    health = HEALTH_PATH[engine]
    probe = shlex.quote(cmds[0].url + health)
    lines.append(f"# ready when each answers 200: curl -sf {probe}" + (" (and the others)" if len(cmds) > 1 else ""))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- start / wait


@dataclass
class StartedServer:
    """A server process started by ``start_servers``."""

    command: ServerCommand
    process: subprocess.Popen
    started: float

    def endpoint(self) -> Endpoint:
        """The fleet-file record of this server."""
        return Endpoint(
            url=self.command.url,
            gpu=self.command.gpu,
            pid=self.process.pid,
            log=str(self.command.log.resolve()),
            host=self.command.host,
            cmd=list(self.command.argv),
            port=self.command.port,
            started=self.started,
        )


class ServerFailed(RuntimeFailure):
    """A server exited or did not become healthy in time; ``gpu`` and ``log`` say which."""

    def __init__(self, message: str, gpu: str, log: Path):
        super().__init__(message)
        self.gpu = gpu
        self.log = log


def check_ports_free(cmds: Sequence[ServerCommand], bind_host: str) -> None:
    """Raise ``InputError`` naming the first port (and its GPU) that something already listens on."""
    for c in cmds:
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((bind_host, c.port))
            except OSError as exc:
                raise InputError(
                    f"port {c.port} for GPU {c.gpu} on {bind_host or '*'} is not free ({exc.strerror}); choose another --port-base"
                ) from None


def start_servers(cmds: Sequence[ServerCommand]) -> list[StartedServer]:
    """Start every command in its own session (so Ctrl-C on dqa does not stop the fleet), output
    appended to its log. Returns the started servers. Raises ``RuntimeFailure`` when an
    executable is missing (servers already started are stopped first)."""
    import psutil

    started: list[StartedServer] = []
    for c in cmds:
        c.log.parent.mkdir(parents=True, exist_ok=True)
        with open(c.log, "ab") as log:
            log.write(f"\n=== dqa fleet up: GPU {c.gpu}: {shlex.join(redact(c.argv))}\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(
                    c.argv,
                    env={**os.environ, **c.env},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                stop_started(started, grace=5.0)
                raise RuntimeFailure(f"GPU {c.gpu}: cannot start {c.argv[0]!r}: {exc.strerror or exc}") from None
        try:
            t0 = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            t0 = time.time()
        started.append(StartedServer(command=c, process=proc, started=t0))
    return started


def probe_health(url: str, path: str, timeout: float = DEFAULT_PROBE_TIMEOUT) -> bool:
    """True when ``GET url+path`` answers 200 within ``timeout`` seconds."""
    return answers_ok(url + path, timeout)


def wait_healthy(
    servers: Sequence[StartedServer],
    engine: str,
    timeout: float,
    poll_s: float = 1.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> None:
    """Poll every server's health URL until all answer 200.

    Raises ``ServerFailed`` for the first server whose process exits, or, at ``timeout``, for
    the first one still not healthy. ``on_progress(healthy, total)`` reports progress.
    """
    path = HEALTH_PATH[engine]
    pending = {s.command.gpu: s for s in servers}
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(servers)))) as pool:
        while pending:
            for gpu, s in list(pending.items()):
                rc = s.process.poll()
                if rc is not None:
                    raise ServerFailed(
                        f"server on GPU {gpu} (port {s.command.port}) exited with code {rc} before it became healthy; log: {s.command.log}",
                        gpu,
                        s.command.log,
                    )
            left = deadline - time.monotonic()
            if left <= 0:
                gpu, s = next(iter(pending.items()))
                others = f" (also not healthy: GPU {', '.join(list(pending)[1:])})" if len(pending) > 1 else ""
                raise ServerFailed(
                    f"server on GPU {gpu} ({s.command.url}{path}) not healthy after {timeout:.0f} s{others}; log: {s.command.log}",
                    gpu,
                    s.command.log,
                )
            probe_timeout = max(1.0, min(DEFAULT_PROBE_TIMEOUT, left))
            results = dict(
                zip(pending, pool.map(lambda s: probe_health(s.command.url, path, probe_timeout), pending.values()))
            )
            for gpu, ok in results.items():
                if ok:
                    pending.pop(gpu)
            if on_progress is not None:
                on_progress(len(servers) - len(pending), len(servers))
            if pending:
                time.sleep(poll_s)


def stop_started(servers: Sequence[StartedServer], grace: float = 20.0) -> list[str]:
    """Stop servers this process started (after a failed start), all at once: SIGTERM, then
    SIGKILL after ``grace``. Returns each server's outcome (see ``stop_endpoint``)."""
    outcomes = stop_endpoints([s.endpoint() for s in servers], grace=grace)
    for s in servers:
        with contextlib.suppress(Exception):
            s.process.wait(timeout=1)
    return outcomes


# ---------------------------------------------------------------- stop


def _cmdline_matches(live: list[str], recorded: list[str]) -> bool:
    """True when the live command line ends with the recorded arguments. A shebang script's
    interpreter is prepended by the kernel, so only the recorded argv[1:] and the script's
    base name are compared."""
    if not recorded:
        return False
    live_r, rec = redact(live), redact(recorded)
    tail = rec[1:]
    if len(live_r) < len(tail) + 1 or (tail and live_r[-len(tail):] != tail):
        return False
    head = live_r[: len(live_r) - len(tail)]
    return any(Path(h).name == Path(rec[0]).name for h in head)


def _gone(proc) -> bool:
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def is_local_host(host: str | None) -> bool:
    """True when ``host`` names this machine (loopback, its host name or one of its addresses);
    a pid recorded for another machine's server means nothing here."""
    import psutil

    if host is None or host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""):
        return True
    names = {socket.gethostname(), socket.getfqdn()}
    if host in names:
        return True
    addrs = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return host.strip("[]") in addrs


def verify_process(ep: Endpoint):
    """The live ``psutil.Process`` for ``ep`` when it still is the process dqa started, else None.

    Returns ``(process_or_None, reason)``; reason is ``running``, ``not running`` or why the pid
    is not ours (a reused pid is never signalled).
    """
    import psutil

    if ep.pid is None:
        return None, "no pid recorded"
    if not is_local_host(ep.host):
        return None, f"its host {ep.host} is not this machine (run dqa fleet down there)"
    try:
        proc = psutil.Process(ep.pid)
        if _gone(proc):
            return None, "not running"
        create_time = proc.create_time()
        cmdline = proc.cmdline()
    except psutil.NoSuchProcess:
        return None, "not running"
    except psutil.AccessDenied:
        return None, f"pid {ep.pid}: access denied"
    if ep.started is None and not ep.cmd:
        return None, f"pid {ep.pid}: nothing recorded to verify it"
    # The start time is the identity check (a server may retitle itself, e.g. setproctitle);
    # the command line is the fallback for records without one.
    if ep.started is not None:
        if abs(create_time - ep.started) > 1.0:
            return None, f"pid {ep.pid} is another process now (started at a different time)"
    elif not _cmdline_matches(cmdline, ep.cmd):
        return None, f"pid {ep.pid} is another process now (different command line)"
    return proc, "running"


def stop_endpoint(ep: Endpoint, grace: float = 20.0) -> str:
    """Stop the process recorded for ``ep`` and its child processes: SIGTERM, then SIGKILL for
    whatever is left after ``grace`` seconds. Returns ``stopped``, ``killed``, ``not running``,
    ``not stopped: <which pids>`` (alive ``KILL_WAIT_S`` after SIGKILL; a zombie counts as gone) or
    ``skipped: <why>`` (the pid is not verifiably ours, so nothing is signalled)."""
    import psutil

    proc, reason = verify_process(ep)
    if proc is None:
        return reason if reason == "not running" else f"skipped: {reason}"
    try:
        family = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return "not running"
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if all(_gone(p) for p in family):
            return "stopped"
        time.sleep(0.2)
    for p in family:
        if not _gone(p):
            with contextlib.suppress(psutil.Error):
                p.kill()
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and not all(_gone(p) for p in family):
        time.sleep(0.1)
    survivors = [p.pid for p in family if not _gone(p)]
    if survivors:  # e.g. stuck in uninterruptible I/O on a hung GPU driver
        return f"not stopped: pid {', '.join(map(str, survivors))} still running after SIGKILL"
    return "killed"


def stop_endpoints(endpoints: Sequence[Endpoint], grace: float = 20.0) -> list[str]:
    """``stop_endpoint`` for every endpoint at the same time (so the grace periods overlap);
    outcomes in the same order."""
    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(endpoints)))) as pool:
        return list(pool.map(lambda e: stop_endpoint(e, grace=grace), endpoints))


def stopped(outcome: str) -> bool:
    """True when a ``stop_endpoint`` outcome means the server no longer runs: stopped, killed,
    not running, or its pid now belongs to another process (ours exited)."""
    return outcome in ("stopped", "killed", "not running") or "another process" in outcome


def endpoint_alive(ep: Endpoint) -> bool:
    """True when the recorded process of ``ep`` is still running and still ours."""
    return verify_process(ep)[0] is not None
