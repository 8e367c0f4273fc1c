"""`dqa plan`: how long and how much a regeneration takes, before renting the GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dqa.commands.common import console, handles_errors, help_text, stderr_is_tty


@handles_errors
def plan(
    samples: Optional[int] = typer.Option(None, "--samples", "-n", help="How many samples to generate."),
    findings: Optional[Path] = typer.Option(
        None, "--findings", help="Scan output folder (or its findings.parquet): plan for its failing rows."
    ),
    avg_output_tokens: Optional[float] = typer.Option(
        None, "--avg-output-tokens", help="Mean output tokens per sample (thinking included), e.g. 2500."
    ),
    tok_per_s: Optional[float] = typer.Option(None, "--tok-per-s", help="Fleet output throughput, tokens/s in total."),
    tok_per_gpu: Optional[float] = typer.Option(None, "--tok-per-gpu", help="Output tokens/s per GPU (times --gpus)."),
    req_per_s: Optional[float] = typer.Option(None, "--req-per-s", help="Completed requests/s of the fleet (times --avg-output-tokens)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs in the fleet, >= 1 (default 1, or the endpoints of --fleet)."),
    fleet: Optional[Path] = typer.Option(None, "--fleet", "-f", help="Fleet file: its endpoint count is the GPU count (and --calibrate's servers)."),
    gpu_hour_cost: Optional[float] = typer.Option(None, "--gpu-hour-cost", help="Price per GPU-hour, e.g. 3.857 ($27/h for 7 GPUs)."),
    fleet_hour_cost: Optional[float] = typer.Option(
        None, "--fleet-hour-cost",
        help="Price per hour of the whole fleet (a node price), divided by its GPU count: --gpus, and each --scenario's own GPUs.",
    ),
    scenario: List[str] = typer.Option(
        [], "--scenario", help="Another scenario name:gpus:tok_per_gpu[:cost_per_gpu_hour], repeatable, e.g. b200:7:2300:3.86."
    ),
    calibrate: bool = typer.Option(False, "--calibrate", help="Measure throughput and output length with a short real regeneration first."),
    endpoint: List[str] = typer.Option([], "--endpoint", "-e", help="With --calibrate: a server URL (repeatable), instead of --fleet."),
    sample: int = typer.Option(32, "--sample", "-k", help="With --calibrate: how many failing prompts to send."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="With --calibrate: the dataset the prompts come from."),
    calibrate_out: Optional[Path] = typer.Option(
        None, "--calibrate-out", help="With --calibrate: keep the regen output folder here (default: a temporary folder, removed)."
    ),
    protocol: Optional[str] = typer.Option(
        None, "--protocol", help="With --calibrate and --endpoint: sglang (default) or openai (e.g. transformers serve)."
    ),
    max_new_tokens: int = typer.Option(8192, "--max-new-tokens", help="With --calibrate: output limit per prompt (as in the real run)."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; exit code only (with --calibrate: no spinner either)."),
) -> None:
    """Estimate wall time, GPU-hours and cost of a regeneration, scenarios side by side.

    total tokens = samples x avg output tokens; wall time = total tokens / fleet tok/s;
    GPU-hours = GPUs x wall hours; cost = GPU-hours x price per GPU-hour. Rates are shown per
    second, per hour and per day next to each other, so a unit slip stands out
    (1,500 tok/s is 5.4M tokens per hour, 129.6M per day).

    Examples:

      dqa plan --samples 914000 --avg-output-tokens 2500 --tok-per-s 1600

      dqa plan --samples 913786 --avg-output-tokens 2306 --req-per-s 5.6 --gpus 7 --fleet-hour-cost 27

      dqa plan --findings dqa-out/train --avg-output-tokens 2500 --scenario pro6000:4:400:1.5 --scenario b200:7:2300:3.86

      dqa plan --calibrate --fleet fleet.json --dataset train.parquet --findings dqa-out/train --sample 64
    """
    import json

    from dqa.errors import UsageError
    from dqa.regen import plan as planmod

    if samples is not None and findings is not None:
        raise UsageError("give --samples or --findings, not both")
    if fleet_hour_cost is not None and gpu_hour_cost is not None:
        raise UsageError("give --gpu-hour-cost or --fleet-hour-cost, not both")
    if gpus is not None and gpus < 1:
        raise UsageError(f"--gpus {gpus}: a fleet has at least 1 GPU")
    fleet_rec = None
    if fleet is not None:
        from dqa.regen.fleet_file import read_fleet

        fleet_rec = read_fleet(fleet)
        if gpus is None:
            gpus = fleet_rec.gpu_count
    if findings is not None:
        samples = planmod.count_findings(findings)
    # Checked before --calibrate, which spends minutes of real generation.
    if samples is None:
        raise UsageError("say how many samples: --samples N or --findings DIR")
    for text in scenario:
        planmod.parse_scenario(text, samples, 1.0, None)  # syntax only; the real parse follows

    calibration = None
    if calibrate:
        if tok_per_s is not None or tok_per_gpu is not None or req_per_s is not None:
            raise UsageError("--calibrate measures the throughput; drop --tok-per-s/--tok-per-gpu/--req-per-s")
        if dataset is None:
            raise UsageError("--calibrate needs --dataset (the prompts to send)")
        if not endpoint and fleet is None:
            raise UsageError("--calibrate needs --fleet FILE or --endpoint URL")
        if endpoint and fleet is not None:
            raise UsageError("give --fleet or --endpoint, not both")
        if gpus is None:
            gpus = len(endpoint) if endpoint else 1
        progress = None
        err = console(stderr=True)
        if stderr_is_tty() and not quiet:
            progress = err.status(f"calibrating: regenerating {sample} prompts")
            progress.start()
        try:
            calibration = planmod.calibrate(
                dataset=dataset,
                findings=findings,
                sample=sample,
                fleet=fleet,
                endpoints=list(endpoint),
                out=calibrate_out,
                protocol=protocol,
                max_new_tokens=max_new_tokens,
            )
        finally:
            if progress is not None:
                progress.stop()
        req_per_s = calibration.req_per_s
        if avg_output_tokens is None:
            avg_output_tokens = calibration.mean_output_tokens

    if gpus is None:
        gpus = 1
    if fleet_hour_cost is not None:
        gpu_hour_cost = fleet_hour_cost / gpus
    if avg_output_tokens is None:
        raise UsageError("say the mean output tokens per sample: --avg-output-tokens (or --calibrate)")

    scenarios: list[planmod.Scenario] = []
    given = [x for x in (tok_per_s, tok_per_gpu, req_per_s) if x is not None]
    if len(given) > 1:
        raise UsageError("give the throughput once: --tok-per-s, --tok-per-gpu or --req-per-s")
    if given:
        scenarios.append(
            planmod.Scenario(
                name="measured" if calibration else "given",
                samples=samples,
                avg_output_tokens=avg_output_tokens,
                gpus=gpus,
                tok_per_s=tok_per_s,
                tok_per_gpu=tok_per_gpu,
                req_per_s=req_per_s,
                gpu_hour_cost=gpu_hour_cost,
            )
        )
    # A scenario without its own price: the per-GPU price, or the fleet price over ITS GPUs.
    scenarios += [
        planmod.parse_scenario(
            s, samples, avg_output_tokens,
            default_cost=None if fleet_hour_cost is not None else gpu_hour_cost,
            default_fleet_cost=fleet_hour_cost,
        )
        for s in scenario
    ]
    if not scenarios:
        raise UsageError("say the throughput: --tok-per-s, --tok-per-gpu, --req-per-s, --scenario or --calibrate")
    names = [s.name for s in scenarios]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise UsageError(f"--scenario name {dup!r} is used twice")
    plans = [planmod.compute(s) for s in scenarios]

    if json_out:
        typer.echo(
            json.dumps(
                {"scenarios": [p.to_dict() for p in plans], "calibration": calibration.to_dict() if calibration else None},
                indent=2,
            )
        )
        return
    if quiet:
        return
    from rich.table import Table

    out = console(stderr=False)
    if calibration is not None:
        out.print(calibration.summary())
    table = Table(title="dqa plan", title_justify="left")
    table.add_column("")
    for p in plans:
        table.add_column(p.name, justify="right")
    for label, cells in planmod.table_rows(plans):
        table.add_row(label, *cells)
    out.print(table)
    if any(p.cost is None for p in plans):
        out.print("cost: give --gpu-hour-cost (or --fleet-hour-cost) to price the run")


def register(app: typer.Typer) -> None:
    """Add ``plan`` to the CLI."""
    app.command("plan", help=help_text(plan.__doc__))(plan)
