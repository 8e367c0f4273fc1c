"""The side-by-side table of ``dqa plan``: one column per scenario, rates per second, hour and day
next to each other so a unit slip ("5.4M/day") shows at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dqa.formatting import human_count, human_duration

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from dqa.regen.plan import Plan, PlanResult

PRICE_HINT = "cost: give --gpu-hour-cost (or --fleet-hour-cost) to price the run"


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}" if v < 100 else f"${v:,.0f}"


def table_rows(plans: list[Plan]) -> list[tuple[str, list[str]]]:
    """The rows of the table: ``(label, one cell per scenario)``, in the order shown."""
    return [
        ("samples", [f"{p.samples:,}" for p in plans]),
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


def plan_table(plans: list[Plan]) -> Table:
    """A rich ``Table`` titled "dqa plan": a label column, then one column per scenario."""
    from rich.table import Table

    table = Table(title="dqa plan", title_justify="left")
    table.add_column("")
    for p in plans:
        table.add_column(p.name, justify="right")
    for label, cells in table_rows(plans):
        table.add_row(label, *cells)
    return table


def print_plan(result: PlanResult, console: Console) -> None:
    """Print what ``dqa plan`` shows people: the calibration line (if any), the table, and a hint
    when a scenario has no price."""
    if result.calibration is not None:
        console.print(result.calibration.summary())
    console.print(plan_table(result.plans))
    if result.unpriced:
        console.print(PRICE_HINT)
