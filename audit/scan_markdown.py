"""Render a scan summary (``summary.json``) as Markdown for people and CI step summaries.

Decoded template text is untrusted and holds markup (``<think>``, ``<|im_end|>``): it is shown
with ``md_code`` (``<code>`` + HTML escaping), which GitHub renders literally, also in a table.

``summary.md`` is one of the scan folder's files (``scan_folder.SCAN_FILES``), written by the scan
with the others (``scan_results``), so its renderer lives with the scan, in ``dqa.audit``; the
terminal table (``dqa.reports.scan_terminal``) borrows ``template_repr``.
"""

from __future__ import annotations

from typing import Any

from dqa.markdown import md_code, md_escape

from dqa.audit.scan_order import checks_by_samples, root_cause, root_cause_legend


def template_repr(text: str, limit: int = 80) -> str:
    """A one-line, quoted, escape-visible rendering of decoded template text (``\\n`` shown as such)."""
    shown = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return f'"{shown}"'


def render_scan_markdown(summary: dict[str, Any]) -> str:
    """Return the Markdown text of ``summary.md``."""
    rows = summary["rows"]
    lines = [
        f"# dqa scan: {summary['dataset']}",
        "",
        f"{summary['failing_rows']:,} of {rows:,} samples fail ({summary['failing_share']:.1%}); "
        f"{summary['tokens']:,} tokens, {summary['supervised_tokens']:,} supervised. "
        f"Thinking {'expected' if summary['thinking_expected'] else 'not expected'}"
        f" ({'inferred' if summary['thinking_inferred'] else 'given'}; {summary['thinking_share']:.1%} of samples think).",
        "",
    ]
    multi = bool(summary.get("multi_turn"))  # a multi-turn set: flagged trained turns beside the samples
    if multi:
        lines += ["| check | samples | turns | share | flags a sample when |", "| --- | ---: | ---: | ---: | --- |"]
    else:
        lines += ["| check | samples | share | flags a sample when |", "| --- | ---: | ---: | --- |"]
    cause = root_cause(summary)
    ordered = checks_by_samples(summary)
    for name, c in ordered:
        mark = " ◀ root cause" if cause and name == cause[0] else ""
        turns = (" " + ("·" if c.get("turns") is None else f"{c['turns']:,}") + " |") if multi else ""
        lines.append(f"| `{name}`{mark} | {c['count']:,} |{turns} {c['share']:.1%} | {md_escape(c['flags_when'], 400)} |")
    if not ordered:
        lines.append("| (none) | 0 |" + (" 0 |" if multi else "") + " 0.0% | every check passed |")
    if cause:
        lines += ["", f"◀ {root_cause_legend(*cause)}."]
    cuts = summary.get("truncation_cuts") or []
    if cuts:  # the truncated rows pile up on one length: the limit that cut them
        lines += ["", "## Cuts", ""] + [f"- {c['text']}." for c in cuts]  # dqa's own words and numbers, no data
    conv = summary.get("conventions") or {}
    if conv.get("eot_trained") is False:  # a set-level convention, not a per-row finding (axolotl's train_on_eos: none)
        eot = md_code((conv.get("format") or {}).get("end_of_turn") or "end of turn", None)
        share = conv.get("eot_trained_share") or 0.0
        lines += ["", (f"**End of turn untrained: the model will not learn to stop.** {eot} is trained in {share:.0%} of the "
                       "samples with a closed trained turn.")]
    if summary.get("degenerate_templates"):
        # The text is what is trained: one turn's supervised tokens (the whole sample's where it has no assistant turn).
        if multi:
            lines += ["", "## Degenerate templates", "", "| samples | turns | share | tokens | trained text of the turn | example |",
                      "| ---: | ---: | ---: | ---: | --- | --- |"]
        else:
            lines += ["", "## Degenerate templates", "", "| samples | share | tokens | supervised text |", "| ---: | ---: | ---: | --- |"]
        for t in summary["degenerate_templates"]:
            text = md_code(template_repr(t["text"], 120), None)
            samples = t.get("samples", t["count"])
            if multi:
                turn = t.get("example_turn")
                example = f"row {t.get('example_row')}" + ("" if turn is None else f", turn {turn}")
                lines.append(f"| {samples:,} | {t['count']:,} | {t['share']:.1%} | {t['tokens']} | {text} | {example} |")
            else:
                lines.append(f"| {samples:,} | {t['share']:.1%} | {t['tokens']} | {text} |")
    d = summary["supervised_tokens_distribution"]
    if "p50" in d:
        lines += [
            "",
            "## Supervised tokens per sample",
            "",
            f"mean {d['mean']:.1f}, min {d['min']}, p10 {d['p10']:.0f}, median {d['p50']:.0f}, p90 {d['p90']:.0f}, "
            f"p99 {d['p99']:.0f}, max {d['max']}",
            "",
            "| from | to (excl.) | samples |",
            "| ---: | ---: | ---: |",
        ]
        edges, counts = d["histogram"]["edges"], d["histogram"]["counts"]
        for lo, hi, n in zip(edges, edges[1:], counts):
            if n:
                lines.append(f"| {lo} | {hi} | {n:,} |")
    lines.append("")
    return "\n".join(lines)
