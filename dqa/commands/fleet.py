"""`dqa fleet up|status|down`: launch, watch and stop one model server per GPU."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dqa.commands.common import console, handles_errors, help_text, stderr_is_tty
from dqa.regen.fleet_file import DEFAULT_FLEET_FILE as DEFAULT_FLEET

fleet_app = typer.Typer(
    name="fleet",
    help=(
        "Launch, watch and stop a generation fleet: one model server per GPU.\n\n"
        "dqa fleet up --model /models/Qwen3-27B --gpus 0-6 --stage /dev/shm --mtp\n\n"
        "dqa fleet status --watch\n\n"
        "dqa fleet down\n\n"
        "The fleet file (default ./fleet.json, or $DQA_FLEET) records the servers; `dqa regen --fleet` "
        "and `dqa plan --fleet` read it."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)


def _fmt(v, spec: str = ",.0f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


# ------------------------------------------------------------------------------------- up


@handles_errors
def up(
    model: str = typer.Option(..., "--model", "-m", help="Model folder (or hub id) every server loads."),
    gpus: str = typer.Option("0", "--gpus", help="GPU ids, one server each: 0-6, 0,2,5 or 0-3,6."),
    engine: str = typer.Option(
        "sglang", "--engine", help="sglang (GPU nodes) or transformers (`transformers serve`, runs on a CPU)."
    ),
    stage: Optional[Path] = typer.Option(
        None, "--stage", help="Copy the model folder here first (a RAM disk such as /dev/shm); skipped when an identical copy is there."
    ),
    mtp: bool = typer.Option(
        False, "--mtp", help="SGLang speculative decoding with the model's MTP heads: NEXTN, 3 steps, top-k 1, 4 draft tokens."
    ),
    mamba_extra_buffer: str = typer.Option(
        "auto", "--mamba-extra-buffer", help="With --mtp: add --mamba-scheduler-strategy extra_buffer (auto: when config.json is a hybrid Mamba model; on; off)."
    ),
    port_base: int = typer.Option(30000, "--port-base", help="GPU k of the list listens on port-base + k."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the servers bind (0.0.0.0 for other machines)."),
    advertise_host: Optional[str] = typer.Option(
        None, "--advertise-host", help="Host name written into endpoint URLs (default: the bind host, or this machine's address for 0.0.0.0)."
    ),
    context_length: int = typer.Option(8192, "--context-length", help="SGLang --context-length (0: the model's own)."),
    max_running_requests: int = typer.Option(48, "--max-running-requests", help="SGLang concurrent requests per server (0: SGLang's default)."),
    reasoning_parser: str = typer.Option("qwen3", "--reasoning-parser", help="SGLang --reasoning-parser ('none' to leave it off)."),
    metrics: bool = typer.Option(True, "--metrics/--no-metrics", help="SGLang --enable-metrics (Prometheus /metrics for `fleet status`)."),
    python: Optional[str] = typer.Option(None, "--python", help="Python that has sglang (default: the one running dqa)."),
    env: List[str] = typer.Option([], "--env", help="Extra environment for every server, KEY=VALUE (repeatable), e.g. OMP_NUM_THREADS=1."),
    fleet: Path = typer.Option(Path(DEFAULT_FLEET), "--fleet", "-f", help="Fleet file to write."),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="One log per GPU here (default: fleet-logs/ next to the fleet file)."),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds to wait for every server to become healthy."),
    keep_on_failure: bool = typer.Option(False, "--keep-on-failure", help="Leave the other servers running when one fails to start."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the exact commands (a bash script) and start nothing."),
    force: bool = typer.Option(False, "--force", help="Overwrite a --fleet file that cannot be read as a fleet file (by default dqa refuses)."),
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
    """
    import json
    import os
    import signal
    import sys
    import time

    from dqa.errors import InputError, RuntimeFailure, UsageError
    from dqa.regen import fleet_file as ff
    from dqa.regen import fleet_launch as fl

    if engine not in ff.ENGINES:
        raise UsageError(f"--engine {engine!r}: expected one of {', '.join(ff.ENGINES)}")
    gpu_list = fl.parse_gpus(gpus)
    env_map = fl.parse_env(env)
    if log_dir is None:
        log_dir = fleet.parent / "fleet-logs"

    model_path = Path(model).expanduser()
    local = model_path.exists()
    model_arg = str(model_path.resolve()) if local else model
    if stage is not None and not local:
        raise UsageError(f"--stage needs a local model folder; {model} does not exist")
    stage_pair = None
    if stage is not None:
        stage_dest = Path(os.path.abspath(stage)) / model_path.resolve().name
        stage_pair = (model_path.resolve(), stage_dest)
        model_arg = str(stage_dest)

    spec = fl.LaunchSpec(
        model=model_arg,
        gpus=gpu_list,
        engine=engine,
        host=host,
        advertise_host=advertise_host,
        port_base=port_base,
        context_length=context_length or None,
        max_running_requests=max_running_requests or None,
        reasoning_parser=None if reasoning_parser.lower() in ("", "none") else reasoning_parser,
        enable_metrics=metrics,
        mtp=mtp,
        mamba_extra_buffer=mamba_extra_buffer,
        python=python or sys.executable,
        extra=list(extra or []),
        env=env_map,
        log_dir=log_dir,
        # Read from the source folder: a staged copy may not exist yet (--dry-run).
        hybrid=fl.is_hybrid_mamba(str(model_path)) if local else None,
    )
    if mtp and engine != "sglang":
        raise UsageError("--mtp is an SGLang option; drop it with --engine transformers")
    if dry_run:
        cmds = fl.build_commands(spec)
        typer.echo(fl.dry_run_script(cmds, engine, stage_pair), nl=False)
        return

    # Refuse to overwrite the record of a fleet that is still running, or a file we cannot read
    # (it may be the only record of a running fleet, or not a fleet file at all).
    if fleet.is_file():
        try:
            old = ff.read_fleet(fleet)
        except InputError as exc:
            if not force:
                raise InputError(f"{exc}; refusing to overwrite it (pass --force, or another --fleet)") from None
            old = None
        if old is not None and any(fl.endpoint_alive(e) for e in old.endpoints):
            raise UsageError(f"{fleet} records a fleet that is still running; `dqa fleet down --fleet {fleet}` first or pass another --fleet")

    err = console(stderr=True)
    tty = stderr_is_tty()
    if stage_pair is not None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

        if tty:
            with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err, transient=True) as prog:
                task = prog.add_task(f"staging {stage_pair[0].name}", total=None)
                dest, copied = fl.stage_model(stage_pair[0], stage, lambda d, t: prog.update(task, completed=d, total=t))
        else:
            dest, copied = fl.stage_model(stage_pair[0], stage)
        if tty:
            err.print(f"staged {stage_pair[0]} -> {dest}" if copied else f"staged copy already current: {dest}")

    cmds = fl.build_commands(spec)
    fl.check_ports_free(cmds, host)
    t0 = time.monotonic()
    servers = fl.start_servers(cmds)
    record = ff.Fleet(
        engine=engine,
        protocol=fl.PROTOCOL[engine],
        model=model_arg,
        endpoints=[s.endpoint() for s in servers],
        created_at=ff.now_iso(),
    )
    # Written before the wait, so `fleet down` can stop the servers even if dqa is killed here.
    ff.write_fleet(fleet, record)

    def _terminated(signum, frame):  # SIGTERM while waiting: clean up like Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        if tty:
            with err.status(f"waiting for {len(servers)} {engine} server(s) to become healthy") as status:
                fl.wait_healthy(servers, engine, timeout, on_progress=lambda h, n: status.update(f"{h}/{n} servers healthy"))
        else:
            fl.wait_healthy(servers, engine, timeout)
    except BaseException as exc:
        if isinstance(exc, fl.ServerFailed):
            print(f"--- last lines of {exc.log} (GPU {exc.gpu}) ---", file=sys.stderr)
            for line in fl.log_tail(exc.log):
                print(f"  gpu{exc.gpu}| {line}", file=sys.stderr)
        left = []
        if not keep_on_failure:
            outcomes = fl.stop_started(servers, grace=10.0)
            left = [(s, o) for s, o in zip(servers, outcomes) if not fl.stopped(o)]
            if left:  # keep the record so `fleet down` can retry them
                for s, o in left:
                    print(f"GPU {s.command.gpu}: pid {s.process.pid}: {o}", file=sys.stderr)
            else:
                fleet.unlink(missing_ok=True)
        if isinstance(exc, KeyboardInterrupt):
            what = "interrupted" if keep_on_failure else "interrupted while waiting for the fleet; servers stopped"
            if left:
                what = f"interrupted; {len(left)} server(s) could not be stopped, see {fleet}"
            raise RuntimeFailure(what) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    elapsed = time.monotonic() - t0
    if json_out:
        typer.echo(json.dumps(ff.to_dict(record), indent=2))
        return
    if quiet:
        return
    typer.echo(f"fleet up: {len(servers)} {engine} server(s) healthy in {elapsed:.1f} s; fleet file {fleet}")
    for e in record.endpoints:
        typer.echo(f"  GPU {e.gpu}: {e.url} pid {e.pid} log {e.log}")


# --------------------------------------------------------------------------------- status


def _status_table(fleet_rec, statuses, totals):
    from rich.table import Table

    t = Table(title=f"fleet: {fleet_rec.engine}, {fleet_rec.model}", title_justify="left")
    for col in ("GPU", "endpoint", "up", "gen tok/s", "running", "queued", "KV", "accept", "requests", "gen tokens", "cache hit", "source"):
        left = col in ("GPU", "endpoint", "up", "source")
        t.add_column(col, justify="left" if left else "right", no_wrap=col == "endpoint")

    def hit(prompt, cached):
        return "-" if not prompt or cached is None else f"{cached / prompt:.0%}"

    for s in statuses:
        t.add_row(
            s.gpu or "-",
            s.url,
            "[green]up[/]" if s.up else "[red]down[/]",
            _fmt(s.gen_tok_per_s),
            _fmt(s.running),
            _fmt(s.queued),
            _fmt(s.kv_usage, ".0%"),
            _fmt(s.accept_len, ".2f"),
            _fmt(s.requests_total),
            _fmt(s.generation_tokens_total),
            hit(s.prompt_tokens_total, s.cached_tokens_total),
            s.source,
        )
    t.add_section()
    t.add_row(
        "all",
        f"{totals['endpoints']} endpoints",
        f"{totals['up']}/{totals['endpoints']}",
        _fmt(totals["gen_tok_per_s"]),
        _fmt(totals["running"]),
        _fmt(totals["queued"]),
        _fmt(totals["kv_usage"], ".0%"),
        _fmt(totals["accept_len"], ".2f"),
        _fmt(totals["requests_total"]),
        _fmt(totals["generation_tokens_total"]),
        hit(totals["prompt_tokens_total"], totals["cached_tokens_total"]),
        "",
    )
    notes = sorted({s.note for s in statuses if s.note})
    return t, notes


@handles_errors
def status(
    fleet: Path = typer.Option(Path(DEFAULT_FLEET), "--fleet", "-f", help="Fleet file written by `dqa fleet up`."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh every --interval seconds until Ctrl-C."),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between refreshes with --watch."),
    timeout: float = typer.Option(3.0, "--timeout", help="Per-request timeout in seconds."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout (one object per refresh with --watch)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; exit code only (0 all up, 3 any down). Not with --watch."),
) -> None:
    """Show each endpoint: up/down, gen tok/s, running and queued requests, KV use, speculative
    accept length, request and token totals, and the sums over the fleet.

    Figures come from SGLang's /metrics (--enable-metrics), else the latest "Decode batch" line
    of the server's log; transformers serve has neither (up/down only).
    Exit code: 0 when every endpoint is up, 3 when any is down; with --watch, as of the last
    refresh before Ctrl-C.

    Example: dqa fleet status --fleet fleet.json --watch
    """
    import json
    import time

    from dqa.errors import EXIT_RUNTIME, UsageError
    from dqa.regen import fleet_file as ff
    from dqa.regen import fleet_status as fs

    if quiet and watch:
        raise UsageError("--quiet prints nothing, so --watch would show nothing; drop one")
    rec = ff.read_fleet(fleet)

    def snapshot():
        statuses = fs.fleet_status(rec, timeout=timeout)
        return statuses, fs.totals(statuses)

    def as_json(statuses, totals):
        return json.dumps({"fleet": str(fleet), "engine": rec.engine, "model": rec.model, "endpoints": [s.to_dict() for s in statuses], "total": totals})

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
                        table, notes = _status_table(rec, statuses, totals)
                        out.print(table)
                    time.sleep(interval)
                    statuses, totals = snapshot()
            else:
                from rich.console import Group
                from rich.live import Live

                def render(statuses, totals):
                    table, notes = _status_table(rec, statuses, totals)
                    return Group(table, *notes, f"refreshed {totals['checked_at']} every {interval:g} s; Ctrl-C to stop")

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
        table, notes = _status_table(rec, statuses, totals)
        out.print(table)
        for n in notes:
            out.print(n)
    if totals["up"] < totals["endpoints"]:
        raise typer.Exit(EXIT_RUNTIME)


# ----------------------------------------------------------------------------------- down


@handles_errors
def down(
    fleet: Path = typer.Option(Path(DEFAULT_FLEET), "--fleet", "-f", help="Fleet file written by `dqa fleet up`."),
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
    from dqa.regen import fleet_file as ff
    from dqa.regen import fleet_launch as fl

    rec = ff.read_fleet(fleet)
    outcomes = fl.stop_endpoints(rec.endpoints, grace=grace)
    rows = [{"gpu": e.gpu, "url": e.url, "pid": e.pid, "outcome": o} for e, o in zip(rec.endpoints, outcomes)]
    if json_out:
        typer.echo(json.dumps({"fleet": str(fleet), "endpoints": rows}))
    elif not quiet:
        for r in rows:
            typer.echo(f"GPU {r['gpu']}: {r['url']} pid {r['pid']}: {r['outcome']}")
    left = [r for r in rows if not fl.stopped(r["outcome"])]
    if left:
        raise RuntimeFailure(f"{len(left)} server(s) not stopped: GPU {left[0]['gpu']} pid {left[0]['pid']}: {left[0]['outcome']}")


for _command in (up, status, down):
    fleet_app.command(_command.__name__, help=help_text(_command.__doc__))(_command)


def register(app: typer.Typer) -> None:
    """Add the `fleet` command group to the dqa app."""
    app.add_typer(fleet_app, name="fleet")
