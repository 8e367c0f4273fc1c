"""What each command reports to ``--report-to`` trackers: plain dicts the commands already
write (summary.json, progress.json, repair.json, gate.json) turned into tracker calls.

Tags (docs/trackers.md):

- scan: ``scan/rows``, ``scan/failing_rows``, ``scan/failing_share``, ``scan/thinking_share``,
  ``scan/CHECK/samples`` and ``scan/CHECK/share`` per check that ran; histograms
  ``scan/turn_K/supervised_tokens`` and ``scan/turn_K/thinking_tokens`` for each assistant turn
  K (0-based, from turns.parquet; turns past ``MAX_TURNS`` share ``turn_16+``); text
  ``scan/root_cause_template``: the most frequent degenerate template (when one is flagged).
- regen (live, each ~2 s progress update, and the final figures): ``regen/req_per_s``,
  ``regen/output_tok_per_s``, ``regen/done``, ``regen/ok``, ``regen/failed``, ``regen/cut``
  (status length), ``regen/output_tokens``, ``regen/cost_so_far``, ``regen/cost_projected``,
  ``regen/eta_s``; the step is the run's working seconds, which a resumed run continues.
- repair: per round (step = round number) ``repair/selected``, ``repair/regenerated_ok``,
  ``repair/regen_failed``, ``repair/cut``, ``repair/output_tokens``, ``repair/elapsed_s``,
  ``repair/cost_usd``, ``repair/still_failing``, ``repair/cannot_fit``, ``repair/planned_cost_usd``;
  then, at the last round's step, ``repair/spent_usd``, ``repair/still_failing_final``, ``repair/rounds`` and
  ``repair/gate_passed``.
- gate: ``gate/passed`` (1/0), ``gate/reasons``, ``gate/drift/CHECK`` (the drift statistic) and
  ``gate/drift/CHECK_passed``; text ``gate/verdict``: PASS or FAIL and the reasons.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from dqa.reports.trackers import Trackers

MAX_TURNS = 16


def report_scan(trackers: Trackers, summary: Mapping[str, Any], scan_dir: str | Path) -> int:
    """Report a scan (its ``summary.json`` object and folder). Returns the step used; raises what
    reading turns.parquet or a tracker raises."""
    values: dict[str, float] = {"scan/rows": summary.get("rows", 0), "scan/failing_rows": summary.get("failing_rows", 0),
                                "scan/failing_share": summary.get("failing_share", 0.0)}
    if summary.get("thinking_share") is not None:
        values["scan/thinking_share"] = summary["thinking_share"]
    for name, c in (summary.get("checks") or {}).items():
        if c.get("enabled", True):
            values[f"scan/{name}/samples"] = c.get("count", 0)
            values[f"scan/{name}/share"] = c.get("share", 0.0)
    step = trackers.scalars(values)
    for tag, arr in turn_histograms(scan_dir).items():
        trackers.histogram(tag, arr, step)
    templates = summary.get("degenerate_templates") or []
    if templates:
        top = templates[0]
        trackers.text("scan/root_cause_template",
                      f"{top.get('samples', top.get('count', 0))} samples ({top.get('share', 0.0):.1%}) train on this "
                      f"{top.get('tokens', '?')}-token turn:\n\n```\n{top.get('text', '')}\n```", step)
    return step


def turn_histograms(scan_dir: str | Path) -> dict[str, Any]:
    """``{tag: values}``: supervised and thinking tokens of each trained assistant turn, by turn
    index, from ``turns.parquet`` (empty when the folder has none). Raises what polars raises."""
    import numpy as np

    from dqa.audit.scan_folder import TURNS_FILE

    path = Path(scan_dir) / TURNS_FILE
    if not path.is_file():
        return {}
    import polars as pl

    turns = pl.read_parquet(path, columns=["turn", "supervised_tokens", "thinking_tokens"])
    idx = np.minimum(turns["turn"].to_numpy(), MAX_TURNS)
    out: dict[str, Any] = {}
    for k in np.unique(idx):
        label = f"turn_{k}" if k < MAX_TURNS else f"turn_{MAX_TURNS}+"
        sel = idx == k
        for col in ("supervised_tokens", "thinking_tokens"):
            out[f"scan/{label}/{col}"] = turns[col].to_numpy()[sel]
    return out


def regen_values(snap: Mapping[str, Any]) -> dict[str, float]:
    """The regen figures of one progress snapshot (progress.json's object)."""
    generated = (snap.get("ok") or 0) + (snap.get("truncated") or 0)
    values = {"regen/req_per_s": snap.get("req_per_s"), "regen/output_tok_per_s": snap.get("output_tok_per_s"),
              "regen/done": snap.get("done"), "regen/total": snap.get("total"), "regen/ok": snap.get("ok"),
              "regen/failed": snap.get("failed"), "regen/cut": snap.get("truncated"),
              "regen/output_tokens": round((snap.get("mean_output_tokens") or 0.0) * generated),
              "regen/cost_so_far": snap.get("cost_so_far"), "regen/cost_projected": snap.get("cost_projected"),
              "regen/eta_s": snap.get("eta_s")}
    return {k: v for k, v in values.items() if v is not None}


def regen_step(snap: Mapping[str, Any]) -> int:
    """A snapshot's step: the run's working seconds (``elapsed_s``), continued by a resumed run."""
    return int(snap.get("elapsed_s") or 0)


def report_regen_live(trackers: Trackers, snap: Mapping[str, Any]) -> None:
    """One live progress update of a running regen; a failing tracker warns and sits out (``Trackers.live``)."""
    trackers.live(regen_values(snap), regen_step(snap))


def report_regen(trackers: Trackers, snap: Mapping[str, Any]) -> int:
    """The final figures of a regen run. Returns the step used; raises what a tracker raises."""
    return trackers.scalars(regen_values(snap), regen_step(snap))


def report_repair(trackers: Trackers, record: Mapping[str, Any]) -> None:
    """Each finished round of ``repair.json``'s record (its steps done through the rescan) not reported yet (round
    number >= the runs' next step), then, once the repair has finished (``status``), the final figures. A round
    still under way (a repair stopped in it) is left to the rerun, which reports it whole. Returns nothing; raises
    what a tracker raises."""
    rounds = [r for r in record.get("rounds") or [] if "rescan" in (r.get("done") or ())]
    for r in rounds:
        k = int(r.get("round", 0))
        if k < trackers.step:
            continue
        values = {f"repair/{key}": r.get(key) for key in ("selected", "regenerated_ok", "regen_failed", "cut", "output_tokens",
                                                           "elapsed_s", "cost_usd", "still_failing", "cannot_fit")}
        values["repair/planned_cost_usd"] = (r.get("plan") or {}).get("cost_usd")
        trackers.scalars({k_: v for k_, v in values.items() if isinstance(v, (int, float))}, k)
    if record.get("status") != "finished":
        return
    final = record.get("final") or {}
    values = {"repair/spent_usd": final.get("spent_usd"), "repair/still_failing_final": final.get("still_failing"),
              "repair/rounds": len(rounds)}
    if final.get("gate_passed") is not None:
        values["repair/gate_passed"] = 1.0 if final["gate_passed"] else 0.0
    # at the last round's step, so a rerun's next round (step = its number) is still after what the run holds
    trackers.scalars({k: v for k, v in values.items() if isinstance(v, (int, float))}, len(rounds))


def report_gate(trackers: Trackers, report: Mapping[str, Any]) -> int:
    """The gate's verdict (gate.json's object). Returns the step used; raises what a tracker raises."""
    passed = report.get("verdict") == "pass"
    reasons = list(report.get("reasons") or [])
    values = {"gate/passed": 1.0 if passed else 0.0, "gate/reasons": len(reasons)}
    for c in (report.get("drift") or {}).get("checks", []):
        if isinstance(c.get("value"), (int, float)):
            values[f"gate/drift/{c['name']}"] = c["value"]
        values[f"gate/drift/{c['name']}_passed"] = 1.0 if c.get("passed") else 0.0
    step = trackers.scalars(values)
    lines = [f"dqa gate: **{'PASS' if passed else 'FAIL'}**"] + [f"- {r}" for r in reasons]
    trackers.text("gate/verdict", "\n".join(lines), step)
    return step
