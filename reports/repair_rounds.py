"""The rounds of a ``dqa repair``, from its ``repair.json`` (a plain dict): one row per round
(selected, regenerated ok, still failing by reason, output tokens, elapsed, cost) and the total,
as an HTML section with a chart of failing samples per round, and as a terminal table."""

from __future__ import annotations

from typing import Any

from dqa.formatting import human_duration
from dqa.reports.svg import Series, esc, grouped_bars

FAILING_RED = "#d1495b"  # svg.PALETTE[0]


def round_rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per round that regenerated: ``round``, ``selected``, ``regenerated_ok``,
    ``still_failing`` (None while the round has not rescanned), ``reasons`` ({reason: rows}),
    ``output_tokens``, ``elapsed_s``, ``cost_usd``, ``cannot_fit``, ``context``, ``held_back``
    (failing rows the round did not send: they cannot fit in the servers' context), ``changes``
    (the option changes the round started with, each ``{option, from, to, why}``)."""
    rows = []
    for r in state.get("rounds") or []:
        if "regen" not in (r.get("done") or ()):
            continue
        rows.append({
            "round": int(r.get("round") or len(rows) + 1),
            "selected": int(r.get("selected") or 0),
            "regenerated_ok": int(r.get("regenerated_ok") or 0),
            "still_failing": int(r["still_failing"]) if r.get("still_failing") is not None else None,
            "reasons": dict(r.get("still_failing_reasons") or {}),
            "output_tokens": int(r.get("output_tokens") or 0),
            "elapsed_s": float(r.get("elapsed_s") or 0.0),
            "cost_usd": float(r.get("cost_usd") or 0.0),
            "cannot_fit": int(r.get("cannot_fit") or 0),
            "context": r.get("context"),
            "held_back": int(r.get("held_back") or 0),
            "changes": [c for c in (r.get("changes") or []) if isinstance(c, dict)],
        })
    return rows


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds summed: ``selected`` (samples sent, a sample once per round), ``regenerated_ok``,
    ``output_tokens``, ``elapsed_s``, ``cost_usd``; ``still_failing``: the last round's."""
    return {
        "selected": sum(r["selected"] for r in rows),
        "regenerated_ok": sum(r["regenerated_ok"] for r in rows),
        "still_failing": rows[-1]["still_failing"] if rows else None,
        "output_tokens": sum(r["output_tokens"] for r in rows),
        "elapsed_s": sum(r["elapsed_s"] for r in rows),
        "cost_usd": sum(r["cost_usd"] for r in rows),
    }


def failing_per_round(state: dict[str, Any]) -> tuple[list[str], list[int]]:
    """The chart's bars: ``(["input", "round 1", ...], [failing samples of the input, after round 1, ...])``."""
    rows = round_rows(state)
    first = (state.get("rounds") or [{}])[0]
    labels, values = ["input"], [int(first.get("selected") or 0)]
    for r in rows:
        if r["still_failing"] is not None:
            labels.append(f"round {r['round']}")
            values.append(r["still_failing"])
    return labels, values


def reasons_text(reasons: dict[str, int]) -> str:
    """``"truncated 3, loop 1"``, or ``"-"`` for none."""
    return ", ".join(f"{k} {int(v):,}" for k, v in reasons.items()) or "-"


def _money(v: float) -> str:
    return f"${v:,.2f}"


def stop_line(state: dict[str, Any]) -> str:
    """How the repair ended (repair.json's ``final``), or that it is still running."""
    f = state.get("final") or {}
    if state.get("status") != "finished" or "exit_code" not in f:
        return "repair not finished: rerun the same dqa repair command to continue"
    budget = (state.get("options") or {}).get("budget_usd")
    left = f", {_money(float(budget) - float(f.get('spent_usd') or 0.0))} of the {_money(float(budget))} budget left" if budget else ""
    gate = "passed" if f.get("gate_passed") else "failed"
    full = int(f.get("cannot_fit") or 0)
    return (f"release {f.get('out')}: gate {gate}; stopped: {f.get('stop')}; {int(f.get('still_failing') or 0):,} samples still failing"
            + (f" ({full:,} cannot fit in the servers' context)" if full else "")
            + f"; spent {_money(float(f.get('spent_usd') or 0.0))}{left}")


def not_started_lines(state: dict[str, Any]) -> list[str]:
    """What repair.json's ``final.not_started`` says of the round the budget refused: ``["round K
    not started: WHY", "round K: N samples to regenerate (scan DIR); plan: ..."]``; ``[]`` when every round that was planned ran. For a
    work folder where no round ran, ``["no round ran"]`` first."""
    f = state.get("final") or {}
    ns = f.get("not_started") if isinstance(f.get("not_started"), dict) else None
    lines = [] if round_rows(state) else ["no round ran (nothing was regenerated)"]
    if ns:
        lines.append(f"round {ns.get('round')} not started: {ns.get('why')}")
        lines.append(f"round {ns.get('round')}: {int(ns.get('selected') or 0):,} samples to regenerate (scan {ns.get('scan')}); "
                     f"{ns.get('plan_line')}")
    elif not round_rows(state) and state.get("status") != "finished":
        lines.append("the repair stopped before round 1's regen run began")
    return lines


def html_section(state: dict[str, Any]) -> str:
    """The ``Repair rounds`` section of the HTML report: the chart of failing samples per round, the
    per-round table with its total row, the option changes and how the repair ended."""
    rows = round_rows(state)
    waiting = "".join(f'<p class="note">{esc(line)}</p>' for line in not_started_lines(state))
    if not rows:
        return f'<section><h2>Repair rounds</h2><p class="note">{esc(stop_line(state))}</p>{waiting}</section>'
    labels, values = failing_per_round(state)
    svg = grouped_bars("Failing samples per round", labels, [Series("failing samples", [float(v) for v in values], FAILING_RED)],
                       "samples", "after each round (input: before round 1)", value_labels=True)
    head = ("<tr><th>round</th><th>selected</th><th>regenerated ok</th><th>still failing</th><th>still failing by reason</th>"
            "<th>output tokens</th><th>elapsed</th><th>cost</th></tr>")
    body = []
    for r in rows:
        still = "-" if r["still_failing"] is None else f"{r['still_failing']:,}"
        cls = "ok" if r["still_failing"] == 0 else "bad"
        body.append(f'<tr class="{cls}"><td>{r["round"]}</td><td class="n">{r["selected"]:,}</td><td class="n">{r["regenerated_ok"]:,}</td>'
                    f'<td class="n">{still}</td><td>{esc(reasons_text(r["reasons"]))}</td><td class="n">{r["output_tokens"]:,}</td>'
                    f'<td class="n">{esc(human_duration(r["elapsed_s"]))}</td><td class="n">{esc(_money(r["cost_usd"]))}</td></tr>')
    t = totals(rows)
    if rows:
        still = "-" if t["still_failing"] is None else f"{t['still_failing']:,}"
        body.append(f'<tr class="total"><th>total</th><th class="n">{t["selected"]:,}</th><th class="n">{t["regenerated_ok"]:,}</th>'
                    f'<th class="n">{still}</th><th></th><th class="n">{t["output_tokens"]:,}</th>'
                    f'<th class="n">{esc(human_duration(t["elapsed_s"]))}</th><th class="n">{esc(_money(t["cost_usd"]))}</th></tr>')
    notes = []
    for r in rows:
        for c in r["changes"]:
            notes.append(f"round {r['round']}: {c.get('option')} {c.get('from')} → {c.get('to')} ({c.get('why')})")
        if r["held_back"]:
            notes.append(f"round {r['round']}: {r['held_back']:,} failing samples held back (they cannot fit in the servers' context)")
        if r["cannot_fit"] and r["context"]:
            notes.append(f"round {r['round']}: {r['cannot_fit']:,} samples cannot fit in {int(r['context']):,} tokens of context")
    notes_html = "".join(f'<li>{esc(n)}</li>' for n in notes)
    return (f'<section><h2>Repair rounds</h2><p class="note">{esc(stop_line(state))}</p>{svg}'
            f"<table>{head}{''.join(body)}</table>" + (f"<ul class=\"note\">{notes_html}</ul>" if notes else "") + waiting + "</section>")


def terminal_table(state: dict[str, Any]) -> Any:
    """The rounds as a ``rich.table.Table`` (a total row under them), titled with the dataset."""
    from rich.table import Table

    rows = round_rows(state)
    table = Table(title=f"dqa repair · {state.get('dataset', '')}", title_justify="left", caption=stop_line(state),
                  caption_justify="left", expand=False)
    for name, justify in (("round", "right"), ("selected", "right"), ("regenerated ok", "right"), ("still failing", "right"),
                          ("by reason", "left"), ("failing", "left"), ("output tokens", "right"), ("elapsed", "right"),
                          ("cost", "right")):
        table.add_column(name, justify=justify, no_wrap=name != "by reason")
    top = max([r["selected"] for r in rows] + [1])
    for r in rows:
        still = r["still_failing"]
        bar = "█" * max(1 if still else 0, round(12 * (still or 0) / top))
        table.add_row(str(r["round"]), f"{r['selected']:,}", f"{r['regenerated_ok']:,}", "-" if still is None else f"{still:,}",
                      reasons_text(r["reasons"]), bar, f"{r['output_tokens']:,}", human_duration(r["elapsed_s"]), _money(r["cost_usd"]))
    if rows:
        t = totals(rows)
        table.add_section()
        table.add_row("total", f"{t['selected']:,}", f"{t['regenerated_ok']:,}",
                      "-" if t["still_failing"] is None else f"{t['still_failing']:,}", "", "", f"{t['output_tokens']:,}",
                      human_duration(t["elapsed_s"]), _money(t["cost_usd"]), style="bold")
    return table
