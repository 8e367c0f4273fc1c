"""Markdown for people (and GitHub's job summary): the validation and gate verdicts.

Sample ids come from the dataset and are untrusted: they are escaped so a table cell can
neither break the table nor inject HTML. Text shown as code goes in ``<code>`` with HTML
escaping (``md_code``), not in a backtick code span: Markdown shows a code span's content
verbatim, so an escaped ``&lt;think&gt;`` would show as those characters, and a raw ``|``
would still split a table row. Output is capped in bytes (GitHub rejects a step summary over
1 MiB); ``append_step_summary`` appends to ``$GITHUB_STEP_SUMMARY`` within that cap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dqa.markdown import md_code, md_escape

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub's limit for one step's summary
MAX_MARKDOWN_BYTES = 512 * 1024
IDS_SHOWN = 10
ICON = {"pass": "✅", "fail": "❌", "warn": "⚠️", "error": "💥"}


def fmt_number(value: Any) -> str:
    """Integers with thousands separators, floats with 4 significant digits, others as text."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e3 else f"{value:,.0f}"
    return str(value)


def describe_kwargs(kwargs: dict[str, Any]) -> str:
    """The bounds of an expectation in a few words: ``min 16, max 32768, mostly 0.99``."""
    parts = []
    if kwargs.get("min_value") is not None:
        parts.append(f"min {fmt_number(kwargs['min_value'])}")
    if kwargs.get("max_value") is not None:
        parts.append(f"max {fmt_number(kwargs['max_value'])}")
    if "value_set" in kwargs:
        parts.append("in " + "{" + ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in kwargs["value_set"]) + "}")
    q = kwargs.get("quantile_ranges")
    if isinstance(q, dict):
        for quant, rng in zip(q.get("quantiles", []), q.get("value_ranges", [])):
            lo, hi = (rng + [None, None])[:2]
            parts.append(f"p{round(quant * 100)} in [{fmt_number(lo) if lo is not None else '-∞'}, {fmt_number(hi) if hi is not None else '∞'}]")
    if kwargs.get("mostly") is not None:
        parts.append(f"mostly {kwargs['mostly']}")
    return ", ".join(parts)


def describe_observed(e: dict[str, Any]) -> str:
    """What GX saw: the observed value of an aggregate, or ``unexpected / element`` counts."""
    obs = e.get("observed_value")
    if isinstance(obs, dict) and "values" in obs:
        qs = obs.get("quantiles", [])
        return ", ".join(f"p{round(q * 100)}={fmt_number(v)}" for q, v in zip(qs, obs["values"]))
    if obs is not None:
        return fmt_number(obs)
    if e.get("element_count") is not None:
        return f"{fmt_number(e['element_count'])} rows"
    return ""


def describe_unexpected(e: dict[str, Any]) -> str:
    n = e.get("unexpected_count")
    if n is None:
        return ""
    pct = e.get("unexpected_percent") or 0.0
    return f"{n:,} ({pct:.2f}%)"


def _cap(lines: list[str], max_bytes: int, where: str) -> str:
    out: list[str] = []
    size = 0
    for i, line in enumerate(lines):
        b = len(line.encode("utf-8")) + 1
        if size + b > max_bytes - 200:
            out.append(f"\n… {len(lines) - i} more lines cut to stay under {max_bytes:,} bytes; the full figures are in {where}.")
            break
        out.append(line)
        size += b
    return "\n".join(out) + "\n"


def validation_lines(summary: dict[str, Any], heading: str = "##") -> list[str]:
    """Markdown lines for a validation ``summary.json``."""
    st = summary["statistics"]
    icon = ICON["pass" if summary["success"] else "fail"]
    verdict = "passed" if summary["success"] else "failed"
    lines = [
        f"{heading} {icon} dqa validate: suite {md_code(summary['suite'])} {verdict}",
        "",
        f"{fmt_number(summary['rows'])} rows from {md_code(summary['source'], 200)}; fail on: **{summary['fail_on']}**. "
        f"{st['evaluated']} expectations: {st['passed']} passed, {st['failed']} failed, "
        f"{st['warnings']} warnings, {st['errors']} errors.",
        "",
        "| | severity | expectation | bounds | observed | unexpected | failing samples |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in summary["expectations"]:
        ids = ""
        if e["status"] != "pass" and e.get("failing_ids"):
            shown = e["failing_ids"][:IDS_SHOWN]
            ids = ", ".join(md_escape(i, 40) for i in shown)
            if (e.get("unexpected_count") or 0) > len(shown):
                ids += f" … (+{e['unexpected_count'] - len(shown):,})"
        if e["status"] == "error":
            ids = md_escape(e.get("exception") or "error", 120)
        lines.append(
            f"| {ICON[e['status']]} | {e['severity']} | {md_code(e['title'], 100)} | {md_escape(describe_kwargs(e['kwargs']), 120)} "
            f"| {md_escape(describe_observed(e), 80)} | {describe_unexpected(e)} | {ids} |"
        )
    lines += ["", "Every failing row of every expectation: `failing_samples.parquet`; GX Data Docs: `data_docs/index.html`."]
    return lines


def render_validation_markdown(summary: dict[str, Any], max_bytes: int = MAX_MARKDOWN_BYTES) -> str:
    """The validation summary as Markdown, at most ``max_bytes`` bytes."""
    return _cap(validation_lines(summary), max_bytes, "summary.json")


def gate_lines(gate: dict[str, Any]) -> list[str]:
    """Markdown lines for a gate result (``gate.json``)."""
    ok = gate["verdict"] == "pass"
    lines = [f"## {ICON['pass' if ok else 'fail']} dqa gate: **{gate['verdict'].upper()}** for {md_code(gate['release'], 200)}", ""]
    if gate.get("reasons"):
        lines += [f"- {md_escape(r, 300)}" for r in gate["reasons"]] + [""]
    drift = gate.get("drift")
    if drift:
        lines += [
            f"### Drift against {md_code(gate.get('baseline') or '', 200)}",
            "",
            "| | check | baseline | release | change | threshold |",
            "|---|---|---|---|---|---|",
        ]
        for d in drift["checks"]:
            lines.append(
                f"| {ICON['pass' if d['passed'] else 'fail']} | {md_escape(d['name'])} | {fmt_number(d.get('baseline'))} "
                f"| {fmt_number(d.get('release'))} | {fmt_number(d.get('value'))} | {md_escape(d.get('threshold_text', ''), 80)} |"
            )
        q = drift.get("quantiles")
        if q:
            lines += ["", "Supervised tokens per sample, baseline → release: " + ", ".join(
                f"{k} {fmt_number(v['baseline'])} → {fmt_number(v['release'])}" for k, v in q.items())]
        lines.append("")
    if gate.get("validation"):
        lines += validation_lines(gate["validation"], heading="###")
    return lines


def render_gate_markdown(gate: dict[str, Any], max_bytes: int = MAX_MARKDOWN_BYTES) -> str:
    """The gate verdict, drift table and validation table as Markdown, at most ``max_bytes`` bytes."""
    return _cap(gate_lines(gate), max_bytes, "gate.json")


def append_step_summary(markdown: str, env: dict[str, str] | None = None) -> Path | None:
    """Append ``markdown`` to ``$GITHUB_STEP_SUMMARY`` when set, keeping that file under 1 MiB.

    Returns the file's path, or None when the variable is unset. The text is cut at a line
    boundary (with a note) to fit what the file has left.
    """
    env = os.environ if env is None else env
    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    used = path.stat().st_size if path.exists() else 0
    room = STEP_SUMMARY_LIMIT - used - 1
    data = markdown.encode("utf-8")
    if room <= 256:
        return path
    if len(data) > room:
        text = _cap(markdown.splitlines(), room, "the job's artifacts")
        data = text.encode("utf-8")
    with open(path, "ab") as fh:
        fh.write(data)
    return path
