"""``dqa repair``: from a broken set to a gated release in one command, round after round."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from dqa.commands.common import handles_errors, help_text, storage_option_param
from dqa.errors import RuntimeFailure
from dqa.regen.config import DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_NEW_TOKENS, DEFAULT_PROTOCOL, DEFAULT_TURNS
from dqa.repair import DEFAULT_ROUNDS
from dqa.reports.trackers import REPORT_TO_HELP


def repair(
    dataset: str = typer.Argument(..., help="The dataset to repair (any format `dqa scan` reads; a path or a URL).", show_default=False),
    out: str = typer.Option(..., "--out", "-o", help="The release to write (a new path or URL; same format as DATASET).", show_default=False),
    endpoint: List[str] = typer.Option([], "--endpoint", "-e", help="A generation server's URL (repeatable)."),
    fleet: List[str] = typer.Option([], "--fleet", help="A fleet file from `dqa fleet up` instead of --endpoint; repeatable, one per node: the servers are their union."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", "-t", help="Tokenizer folder or preset (qwen3, qwen3.6) for the scans, regen and the gate."),
    rounds: int = typer.Option(DEFAULT_ROUNDS, "--rounds", help="At most this many rounds of regen + merge + rescan."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="Start no round whose planned cost would pass this (needs --gpu-hour-cost)."),
    gpu_hour_cost: float = typer.Option(0.0, "--gpu-hour-cost", help="Price of one GPU hour, for the cost of each round."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs the servers use (default: the fleet file's, else one per endpoint)."),
    plan: Optional[Path] = typer.Option(None, "--plan", help="A `dqa plan --calibrate --json` file: its calibration estimates round 1's tokens, time and cost. \\[default: round 1 estimated from --max-new-tokens, cost unknown until it ran]"),
    work: Optional[str] = typer.Option(None, "--work", help="The work folder or URL (every round's scan, regen run and merge, repair.json; in a store: staged here and published back, repair.json last). \\[default: dqa-out/NAME-repair/]"),
    failed: str = typer.Option("keep", "--failed", help="Samples still failing after the last round: keep (as the last round left them) or drop (left out of the release, in any format the merge writes)."),
    max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, "--max-new-tokens", help="Output tokens per sample in round 1 (doubled for samples cut by it, within the servers' context)."),
    max_in_flight: int = typer.Option(DEFAULT_MAX_IN_FLIGHT, "--max-in-flight", help="Requests in flight per endpoint."),
    protocol: str = typer.Option(DEFAULT_PROTOCOL, "--protocol", help="sglang (/generate) or openai (/v1/chat/completions)."),
    turns: str = typer.Option(DEFAULT_TURNS, "--turns", help="Turns of a conversation to regenerate: flagged, all, last."),
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
    as_json: bool = typer.Option(False, "--json", help="Print repair.json's final record on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines; exit code (and --json) only."),
    storage_option: List[str] = storage_option_param(),
    report_to: List[str] = typer.Option([], "--report-to", metavar="NAME", help=REPORT_TO_HELP),
) -> None:
    """Repair DATASET into a release that passes the gate: scan, regenerate the failing samples,
    merge, rescan, and again for what still fails, then gate.

    Each round regenerates the samples still failing with new seeds; samples cut by the length
    limit get twice the --max-new-tokens, as far as the servers' context allows; those cut at the
    context cannot fit: they are named, held back from later rounds and listed as still failing
    ("cannot fit in C tokens of context"). The loop stops when nothing fails, when only samples
    that cannot fit fail, after --rounds, when a round fixed nothing
    (and the next would not get more tokens), or before a round whose plan would pass
    --budget-usd. Before each round its plan is printed: its samples x the mean output tokens of
    the last round, at the fleet throughput measured so far; round 1 from --plan's calibration,
    else at most --max-new-tokens per turn it regenerates (counted from the scan and --turns; time
    and cost unknown until it ran). The last line
    says what was spent and what is left. Rerunning the same command
    after a crash or kill -9 continues where it stopped; the work folder refuses another dataset
    or other options.

    Example:  dqa repair data/train.parquet --fleet fleet.json --out release/train.v2.parquet --budget-usd 500 --gpu-hour-cost 6.5

    Exit codes: 0 the release passes the gate, 1 samples still fail after the last round (the
    release is written, listing them in the work folder's repair.json) or the gate fails, 2 usage
    or input error, 3 runtime failure (a regen run stopped: rerun to resume).
    """
    raise typer.Exit(_run(dataset, out, endpoint, fleet, tokenizer, rounds, budget_usd, gpu_hour_cost, gpus, plan, work, failed,
                          max_new_tokens, max_in_flight, protocol, turns, force, as_json, quiet, storage_option, report_to))


@handles_errors
def _run(dataset, out, endpoint, fleet, tokenizer, rounds, budget_usd, gpu_hour_cost, gpus, plan, work, failed, max_new_tokens,
         max_in_flight, protocol, turns, force, as_json, quiet, storage_option=(), report_to=()) -> int:
    import json
    import sys

    from dqa import storage

    storage.configure(storage_option)
    from dqa.repair import RepairOptions, repair as run_repair
    from dqa.reports import trackers

    report_to = trackers.require(report_to)

    # One fleet file is recorded as its path, as before several could be given (a work folder
    # started then still resumes); several as the list of paths.
    regen = {"endpoints": tuple(endpoint), "fleet": fleet[0] if len(fleet) == 1 else tuple(fleet), "max_new_tokens": max_new_tokens, "max_in_flight": max_in_flight,
             "protocol": protocol, "turns": turns, "gpu_hour_cost": gpu_hour_cost}
    if gpus is not None:
        regen["gpus"] = gpus
    regen = {k: v for k, v in regen.items() if v not in (None, ())}
    opts = RepairOptions(tokenizer=tokenizer, rounds=rounds, budget_usd=budget_usd, failed=failed, regen=regen,
                         plan=str(plan) if plan is not None else None)
    log = None if quiet else (lambda msg: print(f"dqa repair: {msg}", file=sys.stderr, flush=True))
    try:
        result = run_repair(dataset, out, opts, work=work, log=log, force=force)
    except (RuntimeFailure, KeyboardInterrupt):  # stopped in a round: its finished rounds are reported now, not at the rerun's end
        if report_to:
            _report_stopped(report_to, dataset, work, quiet or as_json)
        raise
    record = json.loads((result.work / "repair.json").read_text())  # read once: for the trackers and --json
    if report_to:
        from dqa.reports.trackers.feed import report_repair

        trackers.report(report_to, "repair", dataset, result.work, report_repair, record, quiet=quiet or as_json)
    if as_json:
        print(json.dumps(record, indent=2))
    elif not quiet:
        print(result.message)
    return result.exit_code


def _report_stopped(report_to: list[str], dataset: str, work: str | None, quiet: bool) -> None:
    """Report to the trackers of ``report_to`` the rounds a stopped repair of ``dataset`` finished, as its work
    folder's ``repair.json`` records them (``feed.report_repair`` reports finished rounds only, so the rerun reports
    the rest). Nothing happens for a work folder in a store or a record of another dataset's repair. Never raises:
    a failure here (a tracker's, the work folder's) is one line on stderr unless ``quiet``, and the repair's own
    error is the one the command ends with."""
    try:
        from dqa import storage
        from dqa.audit import identity
        from dqa.repair.work import WorkFolder, default_work_dir
        from dqa.reports import trackers
        from dqa.reports.trackers.feed import report_repair

        folder = work if work is not None else default_work_dir(dataset)
        if storage.is_url(folder) or storage.is_url(dataset):
            return
        record = WorkFolder.peek(folder)
        if record.get("rounds") and record.get("dataset") == identity.dataset_path(dataset):
            trackers.report(report_to, "repair", dataset, folder, report_repair, record, quiet=quiet)
    except Exception as exc:  # noqa: BLE001 - shown, not raised: the repair's own error is the one to show
        if not quiet:
            print(f"dqa repair: --report-to: the finished rounds were not reported ({type(exc).__name__}: {exc})",
                  file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command(name="repair", help=help_text(repair.__doc__))(repair)
