"""What a repair round will cost before it starts, and what the last round's regen run says
(samples cut by the length limit, the servers' context) for the next one.

A round's plan (``plan_round``) has one of three bases, named in its ``basis``:

- ``measured``: a round ran before: the expected output tokens are the rows x the mean output
  tokens per sample of the last round that ran, the seconds come from the fleet throughput
  measured over every round so far, the cost from the cost per second those rounds were billed;
- ``calibration``: round 1 with a ``dqa plan --calibrate --json`` file (``--plan``): its
  calibration's mean output tokens and output tok/s, priced at ``gpus`` x ``gpu_hour_cost``;
- ``max_new_tokens``: round 1 without one: at most ``max_new_tokens`` per turn it will regenerate
  (an upper bound): ``turns_to_regenerate`` counts them from the scan (``--turns flagged``: from
  each row's first flagged turn to its last assistant turn; ``all``: every assistant turn;
  ``last``: one per row), and no time or cost until the round measures the throughput.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dqa.errors import InputError

MEASURED, CALIBRATION, MAX_NEW_TOKENS = "measured", "calibration", "max_new_tokens"


@dataclass(frozen=True)
class RoundPlan:
    """A round's plan: ``rows`` to send, ``tokens`` expected (``per_sample`` each; basis
    ``max_new_tokens``: ``per_sample`` per turn, over ``turns`` turns), ``seconds`` at
    ``tok_per_s``, ``cost_usd`` at the cost per second; each None where the ``basis`` (see the
    module docstring) does not give it; ``budget_left``: None without a budget."""

    rows: int
    tokens: float | None
    seconds: float | None
    cost_usd: float | None
    budget_left: float | None
    basis: str = MEASURED
    per_sample: float | None = None
    tok_per_s: float | None = None
    turns: int | None = None

    @property
    def over_budget(self) -> bool:
        """True when the budget is spent, or the planned cost is more than what is left."""
        return self.budget_left is not None and (self.budget_left <= 0 or (self.cost_usd is not None and self.cost_usd > self.budget_left))

    def describe(self) -> str:
        """The plan in one line: rows, expected tokens and where that figure comes from, time, cost, budget left."""
        left = f"; budget left ${self.budget_left:,.2f}" if self.budget_left is not None else ""
        if self.basis == MAX_NEW_TOKENS:
            tokens = (f"at most {self.tokens:,.0f} output tokens ({self.per_sample:,.0f} per turn x {self.turns:,} turns: "
                      "--max-new-tokens, an upper bound)") if self.tokens is not None else "output tokens unknown"
            return f"plan: {self.rows:,} rows, {tokens}; no throughput measured yet: time and cost unknown until this round measures them{left}"
        source = "the last round's mean" if self.basis == MEASURED else "the plan's calibration"
        speed = "the fleet throughput measured so far" if self.basis == MEASURED else "the plan's calibrated throughput"
        text = (f"plan: {self.rows:,} rows, ~{self.tokens:,.0f} output tokens ({self.per_sample:,.0f} per sample, {source}), "
                f"~{self.seconds:,.0f} s at {self.tok_per_s:,.0f} tok/s ({speed})")
        text += f", ~${self.cost_usd:,.2f}" if self.cost_usd is not None else ", cost unknown (no --gpu-hour-cost)"
        return text + left

    def describe_budget(self) -> str:
        """Why the round is not started."""
        if self.budget_left is not None and self.budget_left <= 0:
            return f"the budget is spent (${-self.budget_left:,.2f} over)" if self.budget_left < 0 else "the budget is spent"
        cost = f"~${self.cost_usd:,.2f}" if self.cost_usd is not None else "an unknown amount"
        return f"it would cost {cost}, over the ${self.budget_left:,.2f} left of the budget"

    def as_dict(self) -> dict[str, Any]:
        """The plan as repair.json records it."""
        return asdict(self)


def _cost_per_s(regen: dict[str, Any]) -> float | None:
    """Dollars per second of the servers from ``gpus`` (else the fleet files' GPU count, else one per
    endpoint) x ``gpu_hour_cost``; None without a price. Raises ``InputError`` for an unreadable fleet file."""
    gpus = regen.get("gpus")
    if not gpus and regen.get("fleet"):
        from dqa.regen.fleet.file import read_fleets

        gpus = read_fleets(regen["fleet"]).gpu_count  # one fleet file or several
    gpus = gpus or len(regen.get("endpoints") or ())
    price = float(regen.get("gpu_hour_cost") or 0.0)
    return gpus * price / 3600.0 if gpus and price else None


def read_calibration(path: str | Path) -> dict[str, float]:
    """``{"mean_output_tokens", "output_tok_per_s"}`` of a ``dqa plan --calibrate --json`` file.
    Raises ``InputError`` naming the file when it is not one, or its calibration measured nothing."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"--plan {p}: not readable JSON ({exc}); expected the output of dqa plan --calibrate --json") from None
    cal = data.get("calibration") if isinstance(data, dict) else None
    if not isinstance(cal, dict):
        raise InputError(f"--plan {p}: no calibration; expected the output of dqa plan --calibrate --json")
    try:
        mean, tps = float(cal["mean_output_tokens"]), float(cal["output_tok_per_s"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"--plan {p}: calibration without mean_output_tokens and output_tok_per_s") from None
    if mean <= 0 or tps <= 0:
        raise InputError(f"--plan {p}: the calibration measured no output (mean_output_tokens {mean}, output_tok_per_s {tps})")
    return {"mean_output_tokens": mean, "output_tok_per_s": tps}


def plan_round(rows: int, earlier: list[dict[str, Any]], regen: dict[str, Any], budget_usd: float | None,
               spent: float, max_new_tokens: int | None = None, calibration: dict[str, float] | None = None,
               turns: int | None = None) -> RoundPlan:
    """The plan of a round sending ``rows`` samples (see the module docstring for its basis), from
    the ``earlier`` rounds' repair.json records, ``regen``'s options (``gpus``, ``endpoints``,
    ``gpu_hour_cost``), what is left of ``budget_usd`` after ``spent``, and for round 1 the
    ``calibration`` of a plan file (``read_calibration``) or ``max_new_tokens`` per turn of the
    ``turns`` it regenerates (``turns_to_regenerate``; None: one per row)."""
    ran = [r for r in earlier if "regen" in r.get("done", ()) and int(r.get("selected") or 0)]
    left = None if budget_usd is None else budget_usd - spent
    tokens = sum(int(r.get("output_tokens") or 0) for r in ran)
    elapsed = sum(float(r.get("elapsed_s") or 0.0) for r in ran)
    if ran and tokens and elapsed > 0:
        last = ran[-1]
        per_sample = int(last.get("output_tokens") or 0) / int(last["selected"])
        tps = tokens / elapsed
        cost = sum(float(r.get("cost_usd") or 0.0) for r in ran)
        per_s = cost / elapsed if cost else _cost_per_s(regen)
        expect = rows * per_sample
        seconds = expect / tps
        return RoundPlan(rows, expect, seconds, seconds * per_s if per_s else None, left, MEASURED, per_sample, tps)
    if calibration is not None:
        per_sample, tps = calibration["mean_output_tokens"], calibration["output_tok_per_s"]
        per_s = _cost_per_s(regen)
        expect = rows * per_sample
        seconds = expect / tps
        return RoundPlan(rows, expect, seconds, seconds * per_s if per_s else None, left, CALIBRATION, per_sample, tps)
    n = rows if turns is None else int(turns)
    return RoundPlan(rows, n * max_new_tokens if max_new_tokens else None, None, None, left, MAX_NEW_TOKENS,
                     float(max_new_tokens) if max_new_tokens else None, None, n)


def turns_to_regenerate(scan_dir: Path, mode: str) -> int | None:
    """The assistant turns a regen run with ``--turns mode`` will generate for the failing rows of
    the scan in ``scan_dir``: per row, ``flagged`` from its first flagged turn (``findings.parquet``'s
    ``turns``; none, or out of range: the final turn) to its last (``metrics.parquet``'s
    ``assistant_turns``), ``all`` every assistant turn, ``last`` one; at least one per row. None
    when the scan has no ``assistant_turns`` (an older scan: count one per row). Raises
    ``OSError``/polars errors for unreadable files."""
    import polars as pl

    from dqa.audit.scan_folder import METRICS_FILE, findings_file

    findings = pl.read_parquet(findings_file(scan_dir))
    metrics_file = Path(scan_dir) / METRICS_FILE
    if not metrics_file.is_file() or "assistant_turns" not in pl.read_parquet_schema(metrics_file):
        return None
    heads = pl.read_parquet(metrics_file, columns=["row", "assistant_turns"])
    t = findings.select("row", *(["turns"] if "turns" in findings.columns else [])).join(heads, on="row", how="left")
    n = pl.col("assistant_turns").fill_null(1).clip(lower_bound=1)
    if mode == "all":
        per = n
    elif mode == "last" or "turns" not in t.columns:  # no turns column: no turn flagged, the final one is regenerated
        return t.height
    else:
        first = pl.col("turns").list.min().cast(pl.Int64)
        first = pl.when(first.is_not_null() & (first >= 0) & (first < n)).then(first).otherwise(n - 1)
        per = n - first
    return int(t.select(per.clip(lower_bound=1).sum()).item() or 0)


@dataclass(frozen=True)
class RegenFigures:
    """What a round's regen run tells the next round: ``cut`` samples ended by the length limit,
    ``cannot_fit`` of them already at the servers' ``context`` (None: unknown; their dataset rows
    in ``cannot_fit_rows``: later rounds hold them back)."""

    cut: int
    cannot_fit: int
    context: int | None
    cannot_fit_rows: tuple[int, ...] = ()

    def next_max_new(self, max_new: int) -> int | None:
        """A larger ``max_new_tokens`` for the next round (double, at most the context), or None
        when no sample that can fit was cut, or the context is unknown or already reached."""
        if self.cut - self.cannot_fit <= 0 or self.context is None or max_new >= self.context:
            return None
        return min(2 * max_new, self.context)


def cut_rows(regen_dir: Path) -> tuple[int, int, int | None]:
    """(samples with status ``length``, those whose prompt + output already fill the servers'
    context less the speculative reserve, that context or None) of a regen run folder."""
    cut, full, context = _cut_and_full(regen_dir)
    return cut, len(full), context


def _cut_and_full(regen_dir: Path) -> tuple[int, list[int], int | None]:
    """(samples cut by the length limit, the dataset rows of those whose prompt + output reached the
    most any of the run's servers accepts (``ServerFacts.output_cap``: the context less the
    speculative reserve, one less where equal is over), the context or None)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    context, limit = _context(regen_dir)
    shards = sorted((regen_dir / "shards").glob("*.parquet"))
    if not shards:
        return 0, [], context
    t = pads.dataset([str(s) for s in shards], format="parquet").to_table(columns=["row", "status", "prompt_len", "output_tokens"])
    cut = t.filter(pc.equal(t.column("status"), "length"))
    if context is None or cut.num_rows == 0:
        return cut.num_rows, [], context
    used = pc.add(cut.column("prompt_len"), cut.column("output_tokens"))
    full = cut.filter(pc.greater_equal(used, limit)).column("row")
    return cut.num_rows, sorted(int(r) for r in pc.unique(full).to_pylist()), context


def regen_figures(regen_dir: Path) -> RegenFigures:
    """The ``RegenFigures`` of a round's regen run folder."""
    cut, full, context = _cut_and_full(regen_dir)
    return RegenFigures(cut, len(full), context, cannot_fit_rows=tuple(full))


def _context(regen_dir: Path) -> tuple[int | None, int]:
    """(the smallest context length the run's servers reported, or None; the least prompt + output
    tokens that any of them accepts at most, ``ServerFacts.output_cap`` of an empty prompt), read
    from the run's run.json through ``RunManifest`` (``servers``)."""
    from dqa.regen.servers.facts import ServerFacts
    from dqa.regen.store.folder import RunFolder, RunManifest

    try:
        servers = RunManifest.read(RunFolder(regen_dir).run_json).servers or {}
    except InputError:  # no run.json, or not one dqa regen wrote: no context known
        return None, 0
    facts = [ServerFacts(kind=str(f.get("server") or "unknown"), version=f.get("version"), context_length=int(f["context_length"]),
                         reserve=int(f.get("speculative_reserve") or 0))
             for f in servers.values() if isinstance(f, dict) and f.get("context_length")]
    if not facts:
        return None, 0
    return min(f.context_length for f in facts), min(int(f.output_cap(0)) for f in facts)
