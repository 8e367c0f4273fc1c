"""The `dqa scan` terminal table lists checks by the samples it shows (most first) and marks the
root cause: the check that is the first reason (by priority) of the most failing samples."""

from __future__ import annotations

from rich.console import Console

from dqa.audit.scan_order import checks_by_samples, root_cause
from dqa.reports.scan_terminal import ROOT_MARK, print_scan_table


def _check(count: int, primary: int, label: str) -> dict:
    return {"count": count, "share": count / 3000, "primary": primary, "enabled": True, "label": label, "flags_when": label}


def example_summary() -> dict:
    """The bundled example's figures: (samples flagged, primary) per check."""
    figures = {
        "no_loss": (30, 30), "length_mismatch": (30, 30), "degenerate_template": (360, 360),
        "duplicate_response": (60, 60), "short_response": (420, 30), "empty_thinking": (480, 120),
        "missing_thinking": (90, 90), "truncated": (130, 90), "repetition_loop": (60, 60),
        "mask_misaligned": (60, 60), "ok_check": (0, 0),
    }  # fmt: skip
    return {
        "rows": 3000, "tokens": 987_046, "failing_rows": 930, "failing_share": 0.31, "thinking_expected": True,
        "checks": {name: _check(n, p, f"label of {name}") for name, (n, p) in figures.items()},
        "degenerate_templates": [{"text": "<think>\n\n</think>\n\nOK.<|im_end|>", "tokens": 7, "count": 360, "share": 0.12}],
    }  # fmt: skip


def _render(summary: dict, width: int = 140) -> list[str]:
    console = Console(record=True, width=width, force_terminal=False, color_system=None)
    print_scan_table(summary, "dqa-out/example", console)
    return console.export_text().splitlines()


def test_rows_follow_the_samples_column_most_first_ties_by_name():
    assert [n for n, _ in checks_by_samples(example_summary())] == [
        "empty_thinking", "short_response", "degenerate_template", "truncated", "missing_thinking",
        "duplicate_response", "mask_misaligned", "repetition_loop", "length_mismatch", "no_loss",
    ]  # fmt: skip
    rows = [ln for ln in _render(example_summary()) if ln.startswith("│")]
    samples = [int(ln.split("│")[3].strip().replace(",", "")) for ln in rows]
    assert samples == sorted(samples, reverse=True) and samples[0] == 480
    assert not any("ok_check" in ln for ln in rows)  # a check that flagged nothing is not listed


def test_the_root_cause_is_the_check_with_the_most_primary_samples_and_is_marked_with_a_legend():
    summary = example_summary()
    assert root_cause(summary) == ("degenerate_template", 360)
    lines = _render(summary)
    marked = [ln for ln in lines if ROOT_MARK in ln and ln.startswith("│")]
    assert len(marked) == 1 and "degenerate_template" in marked[0] and f"{ROOT_MARK} 360" in marked[0]
    header = next(ln for ln in lines if "samples" in ln and "check" in ln)
    assert "root cause" in header
    legend = next(ln for ln in lines if ln.startswith(f"{ROOT_MARK} root cause"))
    assert "degenerate_template" in legend and "360" in legend


def test_primary_ties_go_to_the_check_that_flags_more_samples_then_to_the_name():
    summary = example_summary()
    summary["checks"]["empty_thinking"]["primary"] = 360
    assert root_cause(summary) == ("empty_thinking", 360)
    summary["checks"]["empty_thinking"]["count"] = 360
    assert root_cause(summary) == ("degenerate_template", 360)


def test_a_clean_scan_has_no_root_cause_and_no_marker_column():
    summary = example_summary()
    for c in summary["checks"].values():
        c["count"] = c["primary"] = 0
    summary.update(failing_rows=0, failing_share=0.0, degenerate_templates=[])
    assert root_cause(summary) is None and checks_by_samples(summary) == []
    text = "\n".join(_render(summary))
    assert "all checks" in text and "root cause" not in text and ROOT_MARK not in text


def test_a_template_cut_short_in_the_table_is_printed_whole_below_it():
    lines = _render(example_summary(), width=80)
    assert any(ln.startswith("degenerate templates") for ln in lines)
    assert any('"<think>\\n\\n</think>\\n\\nOK.<|im_end|>"' in ln for ln in lines)


def test_summary_md_and_the_html_report_use_the_same_order_and_mark():
    """summary.md lists checks by samples flagged, marks the root cause and explains the mark."""
    from dqa.audit.scan_markdown import render_scan_markdown

    summary = {
        "dataset": "d", "rows": 1000, "failing_rows": 900, "failing_share": 0.9, "tokens": 1, "supervised_tokens": 1,
        "thinking_expected": True, "thinking_inferred": True, "thinking_share": 0.9, "supervised_tokens_distribution": {},
        "checks": {
            "degenerate_template": {"count": 360, "share": 0.36, "primary": 360, "flags_when": "recurs"},
            "empty_thinking": {"count": 480, "share": 0.48, "primary": 120, "flags_when": "empty"},
            "short_response": {"count": 420, "share": 0.42, "primary": 0, "flags_when": "short"},
        },
    }
    md = render_scan_markdown(summary)
    order = [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| `")]
    assert order == ["`empty_thinking`", "`short_response`", "`degenerate_template` ◀ root cause"]
    assert "◀ root cause: degenerate_template, first reason of 360 failing samples" in md
