"""`dqa fleet up|status|down`: launch, watch and stop one model server per GPU."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import List, Optional

import typer

from dqa.commands.common import console, handles_errors, help_text, stderr_is_tty
from dqa.regen.config import (DEFAULT_BIND_HOST, DEFAULT_CONTEXT_LENGTH, DEFAULT_ENGINE, DEFAULT_GPUS, DEFAULT_MAMBA_EXTRA_BUFFER,
                              DEFAULT_MAX_RUNNING_REQUESTS, DEFAULT_PORT_BASE, DEFAULT_REASONING_PARSER, DEFAULT_ROUTER_POLICY,
                              DEFAULT_ROUTER_PORT, DEFAULT_ROUTER_TIMEOUT, DEFAULT_STATUS_TIMEOUT, DEFAULT_UP_TIMEOUT)
from dqa.regen.fleet.file import DEFAULT_FLEET_FILE as DEFAULT_FLEET

fleet_app = typer.Typer(
    name="fleet",
    help=(
        "Launch, watch and stop a generation fleet: one model server per GPU.\n\n"
        "dqa fleet up --model /models/Qwen3-27B --gpus 0-6 --stage /dev/shm --mtp\n\n"
        "dqa fleet status --watch\n\n"
        "dqa fleet down\n\n"
        "The fleet file (default ./fleet.json, or $DQA_FLEET) records the servers; `dqa regen --fleet` "
        "and `dqa plan --fleet` read it. Across nodes, run `fleet up --host 0.0.0.0` on each node with its own "
        "fleet file, and give every file: --fleet a.json --fleet b.json."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)


# ------------------------------------------------------------------------------------- up


@handles_errors
def up(
    model: str = typer.Option(..., "--model", "-m", help="Model folder (or hub id) every server loads."),
    gpus: str = typer.Option(DEFAULT_GPUS, "--gpus", help="GPU ids, one server each: 0-6, 0,2,5 or 0-3,6."),
    engine: str = typer.Option(
        DEFAULT_ENGINE, "--engine", help="sglang (GPU nodes) or transformers (`transformers serve`, runs on a CPU)."
    ),
    stage: Optional[Path] = typer.Option(
        None, "--stage", help="Copy the model folder here first (a RAM disk such as /dev/shm); skipped when an identical copy is there."
    ),
    mtp: bool = typer.Option(
        False, "--mtp", help="SGLang speculative decoding with the model's MTP heads: NEXTN, 3 steps, top-k 1, 4 draft tokens."
    ),
    mamba_extra_buffer: str = typer.Option(
        DEFAULT_MAMBA_EXTRA_BUFFER, "--mamba-extra-buffer", help="With --mtp: select the extra_buffer Mamba cache strategy, with the flag of the SGLang release (--mamba-scheduler-strategy up to 0.5.13, --mamba-radix-cache-strategy 0.5.14-0.5.19, nothing from 0.5.20: the default picks it). auto: when config.json is a hybrid Mamba model; on; off."
    ),
    sglang_version: Optional[str] = typer.Option(
        None, "--sglang-version", help="SGLang release on the servers, for the flags that differ between releases (the Mamba cache strategy). Default: asked from --python when it matters; else the newest known (a note says so)."
    ),
    deterministic: bool = typer.Option(
        False, "--deterministic", help="SGLang --enable-deterministic-inference: the per-row seeds then reproduce outputs (sampling is slower). Without it SGLang ignores them."
    ),
    port_base: int = typer.Option(DEFAULT_PORT_BASE, "--port-base", help="GPU k of the list listens on port-base + k."),
    host: str = typer.Option(DEFAULT_BIND_HOST, "--host", help="Address the servers bind (0.0.0.0 for other machines)."),
    advertise_host: Optional[str] = typer.Option(
        None, "--advertise-host", help="Host name written into endpoint URLs (default: the bind host, or this machine's address for 0.0.0.0)."
    ),
    context_length: int = typer.Option(DEFAULT_CONTEXT_LENGTH, "--context-length", help="SGLang --context-length (0: the model's own)."),
    max_running_requests: int = typer.Option(DEFAULT_MAX_RUNNING_REQUESTS, "--max-running-requests", help="SGLang concurrent requests per server (0: SGLang's default)."),
    reasoning_parser: str = typer.Option(DEFAULT_REASONING_PARSER, "--reasoning-parser", help="SGLang --reasoning-parser ('none' to leave it off)."),
    metrics: bool = typer.Option(True, "--metrics/--no-metrics", help="SGLang --enable-metrics (Prometheus /metrics for `fleet status`)."),
    python: Optional[str] = typer.Option(None, "--python", help="Python that has sglang (default: the one running dqa)."),
    env: List[str] = typer.Option([], "--env", help="Extra environment for every server, KEY=VALUE (repeatable), e.g. OMP_NUM_THREADS=1."),
    fleet: Path = typer.Option(Path(DEFAULT_FLEET), "--fleet", "-f", help="Fleet file to write."),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="One log per GPU here (default: NAME-logs/ next to the fleet file NAME.json: fleet-logs/ for fleet.json)."),
    timeout: float = typer.Option(DEFAULT_UP_TIMEOUT, "--timeout", help="Seconds to wait for every server to become healthy."),
    keep_on_failure: bool = typer.Option(False, "--keep-on-failure", help="Leave the other servers running when one fails to start."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the exact commands (a bash script) and start nothing. The model folder need not be on this machine (a note says what was assumed without it)."),
    force: bool = typer.Option(False, "--force", help="Overwrite a --fleet file that cannot be read as a fleet file (by default dqa refuses)."),
    router: bool = typer.Option(
        False, "--router", help="Start SGLang's gateway in front of the SGLang servers once they are healthy: `smg launch` (pip install smg==1.13.0) when smg is installed, else sglang-router (pip install sglang-router==0.3.2); it says which (refused with --engine transformers): Prometheus port on, --tokenizer-path the model folder, the regen circuit-breaker settings. Its URL goes in the fleet file; `dqa regen --fleet` sends to it."
    ),
    router_policy: str = typer.Option(DEFAULT_ROUTER_POLICY, "--router-policy", help="With --router: cache_aware, round_robin, power_of_two or random."),
    router_port: int = typer.Option(DEFAULT_ROUTER_PORT, "--router-port", help="With --router: its port (0: a free one). Its metrics port is always a free one."),
    router_timeout: float = typer.Option(DEFAULT_ROUTER_TIMEOUT, "--router-timeout", help="With --router: seconds for it to see a healthy worker."),
    router_gateway: str = typer.Option("auto", "--router-gateway", help="With --router: auto (smg when installed, else sglang-router), smg or sglang-router."),
    json_out: bool = typer.Option(False, "--json", help="Print the fleet file on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing on success (errors still go to stderr)."),
    extra: Optional[List[str]] = typer.Argument(
        None, metavar="[-- SERVER FLAGS...]", help="Flags passed to every server unchanged, after --, e.g. -- --kv-cache-dtype fp8_e4m3."
    ),
) -> None:
    """Start one model server per GPU, wait until each generates, and write the fleet file.

    Each server gets CUDA_VISIBLE_DEVICES=<gpu>, its own port and its own log. Health is
    /health_generate for SGLang (a real 1-token generation) and /health for transformers.
    When a server exits or is not healthy within --timeout, the error names its GPU and the
    tail of its log is shown; the servers already started are stopped.

    Examples:

      dqa fleet up --model /models/Qwen3.6-27B --gpus 0-6 --stage /dev/shm --mtp --dry-run

      dqa fleet up --model ./tiny --gpus 0-1 --engine transformers --port-base 18000 --env OMP_NUM_THREADS=1

      dqa fleet up --model /dev/shm/Qwen3.6-27B --gpus 0-6 --router    # smg (else sglang-router) in front, cache_aware
    """
    import json

    from dqa.regen.fleet.spec import FleetSpec
    from dqa.regen.fleet.up import launch_fleet, prepare_launch
    from dqa.regen.servers.sglang import SglangOptions

    # The SGLang flags go to SGLang's options whatever the engine: another engine refuses the
    # ones that would change what runs (--mtp, --deterministic) and drops the rest.
    sglang = SglangOptions(mtp=mtp, mamba_extra_buffer=mamba_extra_buffer, sglang_version=sglang_version, deterministic=deterministic)
    spec = FleetSpec(
        model=model,
        gpus=gpus,
        engine=engine,
        engine_options=sglang,
        stage=stage,
        port_base=port_base,
        host=host,
        advertise_host=advertise_host,
        context_length=context_length,
        max_running_requests=max_running_requests,
        reasoning_parser=reasoning_parser,
        metrics=metrics,
        python=python,
        env=tuple(env),
        fleet=fleet,
        log_dir=log_dir,
        timeout=timeout,
        keep_on_failure=keep_on_failure,
        force=force,
        extra=tuple(extra or ()),
        router=router,
        router_policy=router_policy,
        router_port=router_port,
        router_timeout=router_timeout,
        router_gateway=router_gateway,
    )
    if dry_run:
        prepared = prepare_launch(spec, dry_run=True)
        if not quiet:
            for note in prepared.notes:
                print(f"note: {note}", file=sys.stderr)
        typer.echo(prepared.script(), nl=False)
        return

    result = launch_fleet(spec, _CliLaunchEvents())
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    elif not quiet:
        from dqa.reports.fleet_table import up_lines

        for line in up_lines(result):
            typer.echo(line)


class _CliLaunchEvents:
    """The hooks of ``dqa.regen.fleet.up.LaunchEvents`` as `fleet up` shows them: bars and a
    spinner on a terminal; a failing server's log tail and servers that could not be stopped on
    stderr, always. (Not a subclass, so that `dqa --help` does not import the launcher.)"""

    def __init__(self) -> None:
        self.err = console(stderr=True)
        self.tty = stderr_is_tty()

    @contextlib.contextmanager
    def staging(self, src):
        if not self.tty:
            yield None
            return
        from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=self.err, transient=True) as prog:
            task = prog.add_task(f"staging {src.name}", total=None)
            yield lambda d, t: prog.update(task, completed=d, total=t)

    def staged(self, src, dest, copied) -> None:
        if self.tty:
            self.err.print(f"staged {src} -> {dest}" if copied else f"staged copy already current: {dest}")

    @contextlib.contextmanager
    def waiting(self, servers, engine):
        if not self.tty:
            yield None
            return
        with self.err.status(f"waiting for {servers} {engine} server(s) to become healthy") as status:
            yield lambda h, n: status.update(f"{h}/{n} servers healthy")

    def server_failed(self, gpu, log, tail) -> None:
        print(f"--- last lines of {log} (GPU {gpu}) ---", file=sys.stderr)
        for line in tail:
            print(f"  gpu{gpu}| {line}", file=sys.stderr)

    def not_stopped(self, gpu, pid, outcome) -> None:
        print(f"GPU {gpu}: pid {pid}: {outcome}", file=sys.stderr)


# --------------------------------------------------------------------------------- status


@handles_errors
def status(
    fleet: List[Path] = typer.Option(
        [], "--fleet", "-f", help=f"Fleet file written by `dqa fleet up`; repeatable, one per node: their endpoints together. \\[default: {DEFAULT_FLEET}]"
    ),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh every --interval seconds until Ctrl-C."),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between refreshes with --watch."),
    timeout: float = typer.Option(DEFAULT_STATUS_TIMEOUT, "--timeout", help="Per-request timeout in seconds."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout (one object per refresh with --watch)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; exit code only (0 all up, 3 any down). Not with --watch."),
) -> None:
    """Show each endpoint: up/down, gen tok/s, running and queued requests, KV use, speculative
    accept length, request and token totals, and the sums over the fleet.

    Figures come from SGLang's /metrics (--enable-metrics), else the latest "Decode batch" line
    of the server's log; transformers serve has neither (up/down only). A fleet started with
    --router also shows the router: up/ready, and from its Prometheus port each worker's health
    and circuit state, its retries and its upstream replies by status code.
    Exit code: 0 when every endpoint (and the router) is up, 3 when any is down; with --watch, as of the last
    refresh before Ctrl-C.

    Example: dqa fleet status --fleet fleet.json --watch

    Across nodes (one fleet file each): dqa fleet status --fleet fleets/node-a.json --fleet fleets/node-b.json
    """
    import json
    import time

    from dqa.errors import EXIT_RUNTIME, UsageError
    from dqa.regen.fleet import file as ff
    from dqa.regen.fleet import router as fr
    from dqa.regen.fleet import status as fs
    from dqa.reports.fleet_table import router_lines, status_table

    if quiet and watch:
        raise UsageError("--quiet prints nothing, so --watch would show nothing; drop one")
    files = list(fleet) or [Path(DEFAULT_FLEET)]
    rec = ff.read_fleets(files)

    router_st: list = []  # the routers' statuses (fleets started with --router)

    def snapshot():
        nonlocal router_st
        statuses = fs.fleet_set_status(rec, timeout=timeout)
        router_st = [st for st in (fr.fleet_router_status(f, timeout) for f in rec.fleets) if st is not None]
        return statuses, fs.totals(statuses)

    def common(name):
        values = {getattr(f, name) for f in rec.fleets}
        return values.pop() if len(values) == 1 else None

    def as_json(statuses, totals):
        named = str(files[0]) if len(files) == 1 else [str(f) for f in files]
        out = {"fleet": named, "engine": common("engine"), "model": common("model"), "endpoints": [s.to_dict() for s in statuses], "total": totals}
        if router_st:  # one router: its object; several fleet files with routers: a list
            out["router"] = router_st[0].to_dict() if len(router_st) == 1 else [st.to_dict() for st in router_st]
        return json.dumps(out)

    def extra_lines():
        return [line for st in router_st for line in router_lines(st)]

    out = console(stderr=False)
    if not out.is_terminal:
        out.width = max(out.width, 160)  # piped to a file or a pager: do not squeeze the table
    statuses, totals = snapshot()
    if watch:
        try:
            if json_out or not out.is_terminal:
                while True:
                    if json_out:
                        typer.echo(as_json(statuses, totals))
                    else:
                        table, notes = status_table(rec.fleets, statuses, totals)
                        out.print(table)
                        for line in extra_lines():
                            out.print(line, markup=False, highlight=False)
                    time.sleep(interval)
                    statuses, totals = snapshot()
            else:
                from rich.console import Group
                from rich.live import Live
                from rich.text import Text

                def render(statuses, totals):
                    table, notes = status_table(rec.fleets, statuses, totals)
                    return Group(table, *notes, *(Text(line) for line in extra_lines()), f"refreshed {totals['checked_at']} every {interval:g} s; Ctrl-C to stop")

                with Live(render(statuses, totals), console=out, auto_refresh=False) as live:
                    while True:
                        time.sleep(interval)
                        statuses, totals = snapshot()
                        live.update(render(statuses, totals), refresh=True)
        except KeyboardInterrupt:
            pass  # the exit code below reflects the last refresh
    elif json_out:
        typer.echo(as_json(statuses, totals))
    elif not quiet:
        table, notes = status_table(rec.fleets, statuses, totals)
        out.print(table)
        for n in notes:
            out.print(n)
        for line in extra_lines():
            out.print(line, markup=False, highlight=False)
    if totals["up"] < totals["endpoints"] or any(not st.up for st in router_st):
        raise typer.Exit(EXIT_RUNTIME)


# ----------------------------------------------------------------------------------- down


@handles_errors
def down(
    fleet: List[Path] = typer.Option(
        [], "--fleet", "-f", help=f"Fleet file written by `dqa fleet up`; repeatable. Only this machine's servers are stopped (run it on each node). \\[default: {DEFAULT_FLEET}]"
    ),
    grace: float = typer.Option(30.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
    json_out: bool = typer.Option(False, "--json", help="Print the outcome per endpoint as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; exit code only (0 all stopped, 3 one could not be)."),
) -> None:
    """Stop exactly the servers `dqa fleet up` started: SIGTERM, then SIGKILL after --grace.

    A recorded pid is signalled only while it still is the process dqa started (same start
    time), so a reused pid is never touched. Nothing is deleted: logs and the fleet file stay.
    Exit code: 0 when every server is stopped (or was not running), 3 when one could not be:
    still alive after SIGKILL, or not verifiably ours (another machine's, no pid recorded).

    Example: dqa fleet down --fleet fleet.json
    """
    import json

    from dqa.errors import RuntimeFailure
    from dqa.regen.fleet import file as ff
    from dqa.regen.fleet import launch as fl

    files = list(fleet) or [Path(DEFAULT_FLEET)]
    fleets = ff.read_fleets(files).fleets
    # The routers go first, so that none sees its workers vanish under live traffic.
    routers = [{"url": f.router.url, "pid": f.router.pid, "outcome": fl.stop_endpoint(f.router, grace=grace)}
               for f in fleets if f.router is not None]
    endpoints = [e for f in fleets for e in f.endpoints]
    outcomes = fl.stop_endpoints(endpoints, grace=grace)
    rows = [{"gpu": e.gpu, "url": e.url, "pid": e.pid, "outcome": o} for e, o in zip(endpoints, outcomes)]
    if json_out:
        named = str(files[0]) if len(files) == 1 else [str(f) for f in files]
        extra = {"router": routers[0] if len(routers) == 1 else routers} if routers else {}
        typer.echo(json.dumps({"fleet": named, "endpoints": rows, **extra}))
    elif not quiet:
        for router in routers:
            typer.echo(f"router: {router['url']} pid {router['pid']}: {router['outcome']}")
        for r in rows:
            typer.echo(f"GPU {r['gpu']}: {r['url']} pid {r['pid']}: {r['outcome']}")
    left = [r for r in rows if not fl.stopped(r["outcome"])]
    left[:0] = [{"gpu": "router", "pid": r["pid"], "outcome": r["outcome"]} for r in routers if not fl.stopped(r["outcome"])]
    if left:
        raise RuntimeFailure(f"{len(left)} server(s) not stopped: GPU {left[0]['gpu']} pid {left[0]['pid']}: {left[0]['outcome']}")


for _command in (up, status, down):
    fleet_app.command(_command.__name__, help=help_text(_command.__doc__))(_command)


def register(app: typer.Typer) -> None:
    """Add the `fleet` command group to the dqa app."""
    app.add_typer(fleet_app, name="fleet")
