"""What a repair round will cost before it starts, and what the last round's regen run says
(samples cut by the length limit, the servers' context) for the next one."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RoundPlan:
    """A round's plan from the rounds before it: ``rows`` to send, ``tokens`` expected (their mean
    output tokens per sample), ``seconds`` at the throughput measured so far and ``cost_usd`` at
    their cost per second; None where no round has run yet."""

    rows: int
    tokens: float | None
    seconds: float | None
    cost_usd: float | None
    budget_left: float | None

    @property
    def over_budget(self) -> bool:
        return self.budget_left is not None and (self.budget_left <= 0 or (self.cost_usd is not None and self.cost_usd > self.budget_left))

    def describe(self) -> str:
        if self.tokens is None:
            return "no throughput measured yet: the first round measures it" + (
                f"; budget left ${self.budget_left:,.2f}" if self.budget_left is not None else "")
        text = f"~{self.tokens:,.0f} output tokens, ~{self.seconds:,.0f} s at the throughput so far"
        if self.cost_usd is not None:
            text += f", ~${self.cost_usd:,.2f}"
        if self.budget_left is not None:
            text += f"; budget left ${self.budget_left:,.2f}"
        return text

    def describe_budget(self) -> str:
        cost = f"~${self.cost_usd:,.2f}" if self.cost_usd is not None else "an unknown amount"
        return f"it would cost {cost}, over the ${self.budget_left:,.2f} left of the budget"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_round(rows: int, earlier: list[dict[str, Any]], regen: dict[str, Any], budget_usd: float | None,
               spent: float) -> RoundPlan:
    """The plan of a round sending ``rows`` samples, from the ``earlier`` rounds' records."""
    ran = [r for r in earlier if "regen" in r.get("done", ())]
    sent = sum(int(r.get("selected") or 0) for r in ran)
    tokens = sum(int(r.get("output_tokens") or 0) for r in ran)
    elapsed = sum(float(r.get("elapsed_s") or 0.0) for r in ran)
    cost = sum(float(r.get("cost_usd") or 0.0) for r in ran)
    left = None if budget_usd is None else budget_usd - spent
    if not sent or not tokens or elapsed <= 0:
        return RoundPlan(rows, None, None, None, left)
    expect = rows * tokens / sent
    seconds = expect / (tokens / elapsed)
    per_s = cost / elapsed if cost else (float(regen.get("gpus") or 0) * float(regen.get("gpu_hour_cost") or 0) / 3600.0)
    return RoundPlan(rows, expect, seconds, seconds * per_s if per_s else None, left)


@dataclass(frozen=True)
class RegenFigures:
    """What a round's regen run tells the next round: ``cut`` samples ended by the length limit,
    ``cannot_fit`` of them already at the servers' ``context`` (None: unknown), and whether the
    round fixed nothing (``no_progress``)."""

    cut: int
    cannot_fit: int
    context: int | None
    no_progress: bool

    def next_max_new(self, max_new: int) -> int | None:
        """A larger ``max_new_tokens`` for the next round (double, at most the context), or None
        when no sample that can fit was cut, or the context is unknown or already reached."""
        if self.cut - self.cannot_fit <= 0 or self.context is None or max_new >= self.context:
            return None
        return min(2 * max_new, self.context)


def cut_rows(regen_dir: Path) -> tuple[int, int, int | None]:
    """(samples with status ``length``, those whose prompt + output already fill the servers'
    context less the speculative reserve, that context or None) of a regen run folder."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    context, reserve = _context(regen_dir)
    shards = sorted((regen_dir / "shards").glob("*.parquet"))
    if not shards:
        return 0, 0, context
    t = pads.dataset([str(s) for s in shards], format="parquet").to_table(columns=["status", "prompt_len", "output_tokens"])
    cut = t.filter(pc.equal(t.column("status"), "length"))
    if context is None or cut.num_rows == 0:
        return cut.num_rows, 0, context
    used = pc.add(pc.add(cut.column("prompt_len"), cut.column("output_tokens")), reserve)
    full = int(pc.sum(pc.greater_equal(used, context)).as_py() or 0)
    return cut.num_rows, full, context


def regen_figures(rec: dict[str, Any], regen_dir: Path, selected: int) -> RegenFigures:
    """The ``RegenFigures`` of round ``rec`` (its repair.json record) and its run folder."""
    cut, full, context = cut_rows(regen_dir)
    return RegenFigures(cut, full, context, no_progress=int(rec.get("still_failing") or 0) >= selected)


def _context(regen_dir: Path) -> tuple[int | None, int]:
    """(the smallest context length the run's servers reported, or None; their largest speculative reserve)."""
    try:
        servers = json.loads((regen_dir / "run.json").read_text()).get("servers") or {}
    except (OSError, ValueError):
        return None, 0
    facts = [f for f in servers.values() if isinstance(f, dict)]
    lengths = [int(f["context_length"]) for f in facts if f.get("context_length")]
    reserve = max([int(f.get("speculative_reserve") or 0) for f in facts] or [0])
    return (min(lengths) if lengths else None), reserve
