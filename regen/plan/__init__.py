"""The plan room: budget a regeneration before renting GPUs (tokens, wall time, GPU-hours, cost).
It owns ``PlanInputs`` and ``make_plan``, the entry points that ``dqa plan`` and Python share.

The house: ``budget`` (one scenario's arithmetic, ``Scenario`` -> ``Plan``), ``counts`` (rows,
turns and tokens read from a scan), ``storage`` (the disk offline hidden states need) and
``calibrate`` (the only module that runs a regen: a short real run that measures the rate).

From Python, ``make_plan(PlanInputs(...))`` does what ``dqa plan`` does (checks, sample count
from a scan, GPU count from a fleet file, optional calibration run, scenarios) and returns a
``PlanResult``; ``budget.compute(Scenario(...))`` works out one scenario. The table is
``dqa.reports.plan_table``.

    >>> round(make_plan(PlanInputs(samples=914_000, avg_output_tokens=2_500, tok_per_s=1_600)).plans[0].wall_days, 1)
    16.5
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

from dqa.errors import UsageError

from .budget import Plan, Scenario, compute, parse_scenario
from .calibrate import Calibration
from .calibrate import calibrate as run_calibration
from dqa.regen.config import DEFAULT_AUX_LAYERS, DEFAULT_CALIBRATE_SAMPLE, DEFAULT_MAX_NEW_TOKENS, DEFAULT_TURNS, TURN_MODES

from .counts import TurnCounts, count_findings, count_turns, scan_tokens
from .storage import HiddenStateStorage, hidden_state_storage, read_model_config, training_set_tokens


@dataclass(frozen=True)
class PlanInputs:
    """What ``dqa plan`` is told (one field per option, ``None`` where not given).

    The sample count is ``samples`` or the failing rows of the scan ``findings``; the throughput
    one of ``tok_per_s``, ``tok_per_gpu``, ``req_per_s``, or measured (``calibrate``: a short
    real regeneration of ``sample`` prompts of ``dataset`` on ``fleet`` or ``endpoints``, read with
    ``tokenizer``'s chat format, default qwen3); more
    scenarios as ``name:gpus:tok_per_gpu[:cost_per_gpu_hour]`` texts. ``fleet`` is one fleet
    file or several (one per node; kept as a tuple of paths). ``gpus`` defaults to the fleet
    files' GPU count (all of them together), else the endpoints' count when calibrating, else 1.
    """

    samples: int | None = None
    findings: str | Path | None = None
    avg_output_tokens: float | None = None
    tok_per_s: float | None = None
    tok_per_gpu: float | None = None
    req_per_s: float | None = None
    gpus: int | None = None
    fleet: str | Path | tuple[str, ...] | None = None
    gpu_hour_cost: float | None = None
    fleet_hour_cost: float | None = None
    scenarios: tuple[str, ...] = ()
    calibrate: bool = False
    endpoints: tuple[str, ...] = ()
    sample: int = DEFAULT_CALIBRATE_SAMPLE
    dataset: str | Path | None = None
    calibrate_out: str | Path | None = None
    tokenizer: str | None = None
    protocol: str | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    turns: str = DEFAULT_TURNS
    model: str | Path | None = None
    aux_layers: int = DEFAULT_AUX_LAYERS
    storage_tokens: float | None = None
    ca_bundle: str | None = None

    def __post_init__(self) -> None:
        from dqa.regen.fleet.file import fleet_paths

        object.__setattr__(self, "fleet", fleet_paths(self.fleet) or None)


@dataclass(frozen=True)
class PlanResult:
    """The plans, one per scenario in the order given (the ``given``/``measured`` one first), the
    calibration they came from (``None`` without ``--calibrate``), the selection in turns (``None``
    without a scan that has them) and the offline hidden-state storage (``None`` without
    ``--model``)."""

    plans: list[Plan]
    calibration: Calibration | None = None
    turns: TurnCounts | None = None
    hidden_states: HiddenStateStorage | None = None

    @property
    def unpriced(self) -> bool:
        """True when some scenario has no price (no cost per GPU-hour or fleet-hour given)."""
        return any(p.cost is None for p in self.plans)

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``dqa plan --json``: ``{"scenarios": [...], "calibration": {...} | None,
        "turns": {...} | None, "hidden_states": {...} | None}``."""
        return {
            "scenarios": [p.to_dict() for p in self.plans],
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "turns": self.turns.to_dict() if self.turns else None,
            "hidden_states": self.hidden_states.to_dict() if self.hidden_states else None,
        }


def make_plan(
    inputs: PlanInputs,
    progress: Callable[[str], ContextManager[Any]] | None = None,
) -> PlanResult:
    """Work out every scenario of ``inputs`` (what ``dqa plan`` prints).

    ``progress(message)`` is entered around the calibration run (e.g. a spinner). Every input
    check runs before the calibration, which spends minutes of real generation. Raises
    ``UsageError`` for missing or contradictory inputs, ``InputError`` for an unreadable fleet
    file or findings, and ``RuntimeFailure`` when the calibration measures nothing.
    """
    i = inputs
    if i.samples is not None and i.findings is not None:
        raise UsageError("give --samples or --findings, not both")
    if i.fleet_hour_cost is not None and i.gpu_hour_cost is not None:
        raise UsageError("give --gpu-hour-cost or --fleet-hour-cost, not both")
    gpus = i.gpus
    if gpus is not None and gpus < 1:
        raise UsageError(f"--gpus {gpus}: a fleet has at least 1 GPU")
    if i.fleet is not None:
        from dqa.regen.fleet.file import read_fleets

        fleets = read_fleets(i.fleet)
        if gpus is None:
            gpus = fleets.gpu_count
    samples = i.samples
    if i.turns not in TURN_MODES:
        raise UsageError(f"--turns {i.turns!r}: expected one of {', '.join(TURN_MODES)}")
    turns = None
    if i.findings is not None:
        samples = count_findings(i.findings)
        turns = count_turns(i.findings, i.turns)
    # Checked before the calibration, which spends minutes of real generation.
    if samples is None:
        raise UsageError("say how many samples: --samples N or --findings DIR")
    shape = read_model_config(i.model) if i.model is not None else None
    if shape is None and (i.storage_tokens is not None or i.aux_layers != DEFAULT_AUX_LAYERS):
        raise UsageError("--aux-layers and --storage-tokens size the offline hidden states: give --model (its config.json) too")
    scan = None
    if shape is not None:
        hidden_state_storage(shape, i.storage_tokens or 0, "", i.aux_layers)  # the checks only
        if i.storage_tokens is None and i.findings is not None:
            scan = scan_tokens(i.findings)
    for text in i.scenarios:
        parse_scenario(text, samples, 1.0, None)  # syntax only; the real parse follows

    tok_per_s, tok_per_gpu, req_per_s = i.tok_per_s, i.tok_per_gpu, i.req_per_s
    avg_output_tokens = i.avg_output_tokens
    calibration = None
    if i.calibrate:
        if tok_per_s is not None or tok_per_gpu is not None or req_per_s is not None:
            raise UsageError("--calibrate measures the throughput; drop --tok-per-s/--tok-per-gpu/--req-per-s")
        if i.dataset is None:
            raise UsageError("--calibrate needs --dataset (the prompts to send)")
        if not i.endpoints and i.fleet is None:
            raise UsageError("--calibrate needs --fleet FILE or --endpoint URL")
        if i.endpoints and i.fleet is not None:
            raise UsageError("give --fleet or --endpoint, not both")
        if gpus is None:
            gpus = len(i.endpoints) if i.endpoints else 1
        with progress(f"calibrating: regenerating {i.sample} prompts") if progress else contextlib.nullcontext():
            calibration = run_calibration(
                dataset=i.dataset,
                findings=i.findings,
                sample=i.sample,
                fleet=i.fleet,
                endpoints=list(i.endpoints),
                out=i.calibrate_out,
                **({"tokenizer": str(i.tokenizer)} if i.tokenizer else {}),
                protocol=i.protocol,
                max_new_tokens=i.max_new_tokens,
                ca_bundle=i.ca_bundle,
            )
        req_per_s = calibration.req_per_s
        if avg_output_tokens is None:
            avg_output_tokens = calibration.mean_output_tokens

    if gpus is None:
        gpus = 1
    gpu_hour_cost = i.gpu_hour_cost
    if i.fleet_hour_cost is not None:
        gpu_hour_cost = i.fleet_hour_cost / gpus
    if avg_output_tokens is None:
        raise UsageError("say the mean output tokens per sample: --avg-output-tokens (or --calibrate)")

    scenarios: list[Scenario] = []
    given = [x for x in (tok_per_s, tok_per_gpu, req_per_s) if x is not None]
    if len(given) > 1:
        raise UsageError("give the throughput once: --tok-per-s, --tok-per-gpu or --req-per-s")
    if given:
        scenarios.append(
            Scenario(
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
        parse_scenario(
            s, samples, avg_output_tokens,
            default_cost=None if i.fleet_hour_cost is not None else gpu_hour_cost,
            default_fleet_cost=i.fleet_hour_cost,
        )
        for s in i.scenarios
    ]  # fmt: skip
    if not scenarios:
        raise UsageError("say the throughput: --tok-per-s, --tok-per-gpu, --req-per-s, --scenario or --calibrate")
    names = [s.name for s in scenarios]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise UsageError(f"--scenario name {dup!r} is used twice")
    storage = None
    if shape is not None:
        if i.storage_tokens is not None:
            tokens, basis = float(i.storage_tokens), "as given (--storage-tokens)"
        else:
            tokens, basis = training_set_tokens(scan, samples, avg_output_tokens)
        storage = hidden_state_storage(shape, tokens, basis, i.aux_layers)
    return PlanResult(plans=[compute(s) for s in scenarios], calibration=calibration, turns=turns, hidden_states=storage)
