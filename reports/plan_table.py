"""The side-by-side table of ``dqa plan``: one column per scenario, rates per second, hour and day
next to each other so a unit slip ("5.4M/day") shows at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dqa.formatting import human_count, human_duration

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from dqa.regen.plan import PlanResult
    from dqa.regen.plan.budget import Plan
    from dqa.regen.plan.counts import TurnCounts

PRICE_HINT = "cost: give --gpu-hour-cost (or --fleet-hour-cost) to price the run"


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}" if v < 100 else f"${v:,.0f}"


def _count(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def turns_line(t: TurnCounts) -> str:
    """The selection in turns, every ``dqa regen --turns`` mode side by side, the planned one marked."""
    modes = [("flagged", t.flagged, "from the first flagged turn on"), ("all", t.all, "every turn"), ("last", t.last, "the last turn")]
    parts = [f"{_count(n)} {what} (--turns {m}{', planned' if m == t.mode else ''})" for m, n, what in modes]
    return f"turns to regenerate in {t.samples:,} samples: " + "; ".join(parts) + f"; {t.flagged_turns:,} turns flagged by the checks"


def table_rows(plans: list[Plan], turns: TurnCounts | None = None) -> list[tuple[str, list[str]]]:
    """The rows of the table: ``(label, one cell per scenario)``, in the order shown; with
    ``turns`` (a multi-turn selection) the turns of the planned ``--turns`` mode follow the samples."""
    turn_rows = [] if turns is None or not turns.multi_turn else [(f"turns (--turns {turns.mode})", [_count(turns.selected)] * len(plans))]
    return [
        ("samples", [f"{p.samples:,}" for p in plans]),
        *turn_rows,
        ("avg output tokens", [f"{p.avg_output_tokens:,.0f}" for p in plans]),
        ("total output tokens", [human_count(p.total_tokens) for p in plans]),
        ("GPUs", [str(p.gpus) for p in plans]),
        ("tok/s per GPU", [f"{p.tok_per_gpu:,.0f}" for p in plans]),
        ("tok/s (fleet)", [f"{p.tok_per_s:,.0f}" for p in plans]),
        ("req/s (fleet)", [f"{p.req_per_s:,.2f}" for p in plans]),
        ("tokens per hour", [human_count(p.tok_per_hour) for p in plans]),
        ("tokens per day", [human_count(p.tok_per_day) for p in plans]),
        ("wall time", [human_duration(p.wall_s) for p in plans]),
        ("wall time (hours)", [f"{p.wall_hours:,.1f} h" for p in plans]),
        ("wall time (days)", [f"{p.wall_days:,.2f} d" for p in plans]),
        ("GPU-hours", [f"{p.gpu_hours:,.0f}" if p.gpu_hours >= 10 else f"{p.gpu_hours:.2f}" for p in plans]),
        ("cost per GPU-hour", [_money(p.gpu_hour_cost) for p in plans]),
        ("cost per fleet-hour", [_money(p.fleet_hour_cost) for p in plans]),
        ("total cost", [_money(p.cost) for p in plans]),
    ]


def plan_table(plans: list[Plan], turns: TurnCounts | None = None) -> Table:
    """A rich ``Table`` titled "dqa plan": a label column, then one column per scenario."""
    from rich.table import Table

    table = Table(title="dqa plan", title_justify="left")
    table.add_column("")
    for p in plans:
        table.add_column(p.name, justify="right")
    for label, cells in table_rows(plans, turns):
        table.add_row(label, *cells)
    return table


def print_plan(result: PlanResult, console: Console) -> None:
    """Print what ``dqa plan`` shows people: the calibration line (if any), the table, the selection
    in turns (a multi-turn scan), the offline hidden-state storage (with ``--model``), and a hint
    when a scenario has no price."""
    if result.calibration is not None:
        console.print(result.calibration.summary())
    console.print(plan_table(result.plans, result.turns))
    if result.turns is not None and result.turns.multi_turn:
        console.print(turns_line(result.turns), markup=False, highlight=False)
    if result.hidden_states is not None:
        console.print(result.hidden_states.summary(), markup=False, highlight=False)
    if result.unpriced:
        console.print(PRICE_HINT)
