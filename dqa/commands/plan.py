"""`dqa plan`: how long and how much a regeneration takes, before renting the GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dqa.commands.common import console, handles_errors, help_text, stderr_is_tty
from dqa.regen.config import DEFAULT_AUX_LAYERS, DEFAULT_CALIBRATE_SAMPLE, DEFAULT_MAX_NEW_TOKENS, DEFAULT_TURNS


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
    fleet: List[Path] = typer.Option([], "--fleet", "-f", help="Fleet file: its endpoint count is the GPU count; --calibrate sends where regen --fleet does (its router, if it records one). Repeatable, one per node: the GPUs of all of them."),
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
    sample: int = typer.Option(DEFAULT_CALIBRATE_SAMPLE, "--sample", "-k", help="With --calibrate: how many failing prompts to send."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="With --calibrate: the dataset the prompts come from."),
    calibrate_out: Optional[Path] = typer.Option(
        None, "--calibrate-out", help="With --calibrate: keep the regen output folder here (default: a temporary folder, removed)."
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help="With --calibrate: tokenizer folder or preset (qwen3, qwen3.6) the dataset is read with, as for `dqa regen`. \\[default: qwen3]"
    ),
    protocol: Optional[str] = typer.Option(
        None, "--protocol", help="With --calibrate and --endpoint: sglang (default) or openai (e.g. transformers serve)."
    ),
    max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, "--max-new-tokens", help="With --calibrate: output limit per prompt (as in the real run)."),
    ca_bundle: Optional[str] = typer.Option(None, "--ca-bundle", help="With --calibrate: CA certificates (PEM) that verify https:// servers (default: $SSL_CERT_FILE, $REQUESTS_CA_BUNDLE, else the system's)."),
    turns: str = typer.Option(
        DEFAULT_TURNS, "--turns",
        help="With --findings of a multi-turn set: the turns regen sends, as `dqa regen --turns`: flagged (from the first flagged turn on), all or last. Every mode's count is shown.",
    ),
    model: Optional[Path] = typer.Option(
        None, "--model",
        help="Model folder (or its config.json): size offline hidden states for drafter training, tokens x hidden_size x (aux layers + 1) x bytes.",
    ),
    aux_layers: int = typer.Option(DEFAULT_AUX_LAYERS, "--aux-layers", help="With --model: auxiliary layers captured besides the final one (EAGLE-3: 3)."),
    storage_tokens: Optional[float] = typer.Option(
        None, "--storage-tokens",
        help="With --model: tokens of the training set (default: from the scan of --findings, else samples x avg output tokens).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; exit code only (with --calibrate: no spinner either)."),
) -> None:
    """Estimate wall time, GPU-hours and cost of a regeneration, scenarios side by side.

    total tokens = samples x avg output tokens; wall time = total tokens / fleet tok/s;
    GPU-hours = GPUs x wall hours; cost = GPU-hours x price per GPU-hour. Rates are shown per
    second, per hour and per day next to each other, so a unit slip stands out
    (1,500 tok/s is 5.4M tokens per hour, 129.6M per day).

    With --findings of a multi-turn set the selection is counted in turns too, for each
    `dqa regen --turns` mode. With --model, the disk that offline hidden states for drafter
    training need: tokens x hidden_size x (aux layers + 1) x bytes, from the model's config.json,
    for every token of the training set (914,000 x 2,500 tokens on Qwen3.6-27B: 93.6 TB).

    Examples:

      dqa plan --samples 914000 --avg-output-tokens 2500 --tok-per-s 1600

      dqa plan --samples 913786 --avg-output-tokens 2306 --req-per-s 5.6 --gpus 7 --fleet-hour-cost 27

      dqa plan --findings dqa-out/train --avg-output-tokens 2500 --scenario pro6000:4:400:1.5 --scenario b200:7:2300:3.86

      dqa plan --calibrate --fleet fleet.json --dataset train.parquet --findings dqa-out/train --sample 64

      dqa plan --samples 914000 --avg-output-tokens 2500 --tok-per-s 1600 --model /models/Qwen3.6-27B
    """
    import json

    from dqa.regen.plan import PlanInputs, make_plan
    from dqa.reports.plan_table import print_plan

    inputs = PlanInputs(
        samples=samples,
        findings=findings,
        avg_output_tokens=avg_output_tokens,
        tok_per_s=tok_per_s,
        tok_per_gpu=tok_per_gpu,
        req_per_s=req_per_s,
        gpus=gpus,
        fleet=tuple(fleet) or None,
        gpu_hour_cost=gpu_hour_cost,
        fleet_hour_cost=fleet_hour_cost,
        scenarios=tuple(scenario),
        calibrate=calibrate,
        endpoints=tuple(endpoint),
        sample=sample,
        dataset=dataset,
        calibrate_out=calibrate_out,
        tokenizer=tokenizer,
        protocol=protocol,
        max_new_tokens=max_new_tokens,
        ca_bundle=ca_bundle,
        turns=turns,
        model=model,
        aux_layers=aux_layers,
        storage_tokens=storage_tokens,
    )
    spinner = None
    if stderr_is_tty() and not quiet:
        spinner = console(stderr=True).status  # entered around the calibration run only
    result = make_plan(inputs, progress=spinner)

    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    elif not quiet:
        print_plan(result, console(stderr=False))


def register(app: typer.Typer) -> None:
    """Add ``plan`` to the CLI."""
    app.command("plan", help=help_text(plan.__doc__))(plan)
