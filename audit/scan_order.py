"""The order of the checks in every scan report, and which check is the root cause.

Rows follow the samples each check flags (the number the reports show), most first, ties by
name. The root cause is named apart: the check that is the first reason (by priority, see
``primary_reason`` in FORMATS.md) of the most failing samples. A degenerate "OK." sample is also
short and has empty thinking, so ``short_response`` or ``empty_thinking`` may flag more samples
while ``degenerate_template`` explains more.

Read by the scan's own summary.md (``scan_markdown``) and by ``dqa.reports`` (terminal table,
HTML report), so it lives with the checks, in ``dqa.audit``.
"""

from __future__ import annotations

from typing import Any


def checks_by_samples(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The checks of a scan summary (``summary.json``) that flagged at least one sample, as
    ``(name, check)`` pairs: most samples (``count``) first, ties by name."""
    items = [(n, c) for n, c in summary["checks"].items() if c["count"] > 0]
    return sorted(items, key=lambda kv: (-kv[1]["count"], kv[0]))


def root_cause(summary: dict[str, Any]) -> tuple[str, int] | None:
    """``(name, primary)`` of the check that is the primary reason of the most failing samples
    (``checks[name]["primary"]``: each failing sample counted once, under its highest-priority
    check), ties by samples flagged, then name; ``None`` when no sample fails."""
    items = [(n, c) for n, c in summary["checks"].items() if c["count"] > 0 and c.get("primary", 0) > 0]
    if not items:
        return None
    name, c = min(items, key=lambda kv: (-kv[1]["primary"], -kv[1]["count"], kv[0]))
    return name, int(c["primary"])


def root_cause_legend(name: str, primary: int) -> str:
    """The one line that explains the root-cause mark, e.g. "root cause: degenerate_template,
    first reason of 360 failing samples (each counted once, by check priority)"."""
    return f"root cause: {name}, first reason of {primary:,} failing samples (each counted once, by check priority)"
