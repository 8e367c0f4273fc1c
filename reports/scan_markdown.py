"""Render a scan summary (``summary.json``) as Markdown for people and CI step summaries.

Decoded template text is untrusted and holds markup (``<think>``, ``<|im_end|>``): it is shown
with ``md_code`` (``<code>`` + HTML escaping), which GitHub renders literally, also in a table.
"""

from __future__ import annotations

from typing import Any

from dqa.reports.markdown_validation import md_code, md_escape


def template_repr(text: str, limit: int = 80) -> str:
    """A one-line, quoted, escape-visible rendering of decoded template text (``\\n`` shown as such)."""
    shown = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return f'"{shown}"'


def ranked_checks(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Checks with at least one flagged sample, the biggest root cause first: by the samples the
    check explains best (``primary``: a degenerate "OK." sample counts for degenerate_template,
    not for the short_response it also is), then by all samples it flags."""
    items = [(n, c) for n, c in summary["checks"].items() if c["count"] > 0]
    return sorted(items, key=lambda kv: (-kv[1].get("primary", 0), -kv[1]["count"], kv[0]))


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
        "| check | samples | share | flags a sample when |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, c in ranked_checks(summary):
        lines.append(f"| `{name}` | {c['count']:,} | {c['share']:.1%} | {md_escape(c['flags_when'], 400)} |")
    if not ranked_checks(summary):
        lines.append("| (none) | 0 | 0.0% | every check passed |")
    if summary.get("degenerate_templates"):
        lines += ["", "## Degenerate templates", "", "| samples | share | tokens | supervised text |", "| ---: | ---: | ---: | --- |"]
        for t in summary["degenerate_templates"]:
            lines.append(f"| {t['count']:,} | {t['share']:.1%} | {t['tokens']} | {md_code(template_repr(t['text'], 120), None)} |")
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
