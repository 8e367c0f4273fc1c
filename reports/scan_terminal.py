"""The terminal table of ``dqa scan``: rows by the samples each check flags, the root cause marked,
readable in five seconds."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dqa.audit.conventions import conventions_line
from dqa.audit.scan_folder import FINDINGS_FILE
from dqa.audit.scan_markdown import template_repr
from dqa.audit.scan_order import checks_by_samples, root_cause, root_cause_legend

ROOT_MARK = "◀"


def print_scan_table(summary: dict[str, Any], out_dir: str, console: Console) -> None:
    """Print the per-check table (most samples first, the root cause marked and explained in a
    line under it) and the verdict line for ``summary`` to ``console``."""
    rows = summary["rows"]
    checks = checks_by_samples(summary)
    root = root_cause(summary)
    table = Table(title=f"dqa scan · {rows:,} samples · {summary['tokens']:,} tokens", title_justify="left", expand=False)
    table.add_column("check", style="bold", no_wrap=True, min_width=19)
    table.add_column("share", justify="right", no_wrap=True, min_width=6)
    table.add_column("samples", justify="right", no_wrap=True, min_width=7)
    multi = bool(summary.get("multi_turn"))  # a multi-turn set: flagged trained turns beside the samples
    if multi:
        table.add_column("turns", justify="right", no_wrap=True, min_width=5)
    if root is not None:
        table.add_column("root cause", no_wrap=True)
    detail_width = max(20, console.width - (61 if root else 48) - (8 if multi else 0))  # what the other columns leave
    table.add_column("detail", overflow="ellipsis", no_wrap=True, max_width=detail_width)
    templates = summary.get("degenerate_templates") or []
    for name, c in checks:
        detail = c.get("label") or c["flags_when"]
        if name == "degenerate_template" and templates:
            t = templates[0]
            detail = f"{template_repr(t['text'])} ({t['tokens']} tokens)"
        detail = escape(detail)  # decoded sample text is data, not rich markup
        style = "red" if c["share"] >= 0.10 else "yellow"
        cells = [name, f"[{style}]{c['share']:.1%}[/]", f"{c['count']:,}"]
        if multi:
            cells.append("·" if c.get("turns") is None else f"{c['turns']:,}")  # "·": a whole-sample check
        if root is not None:
            cells.append(f"[bold]{ROOT_MARK} {root[1]:,}[/]" if name == root[0] else "")
        table.add_row(*cells, detail)
    if not checks:
        table.add_row("[green]all checks[/]", "0.0%", "0", *(["0"] if multi else []), "no sample flagged")
    console.print(table)
    if root is not None:
        console.print(f"{ROOT_MARK} {root_cause_legend(*root)}", markup=False, highlight=False)
    for cut in summary.get("truncation_cuts") or []:  # the truncated rows pile up on one length: name the limit
        console.print(f"cut: {cut['text']}", markup=False, highlight=False, style="bold yellow")
    cut = templates and len(f"{template_repr(templates[0]['text'])} ({templates[0]['tokens']} tokens)") > detail_width
    if len(templates) > 1 or cut or (multi and templates):
        # The text is what is trained: a turn's supervised tokens (the whole sample's where it has no assistant turn).
        what = "trained text of the turn" if multi else "supervised text"
        console.print(f"[bold]degenerate templates[/] (samples, share, tokens, {what}):")
        for t in templates[:5]:
            where = ""
            if multi and t.get("example_turn") is not None:
                where = f"  ({t['count']:,} turns; e.g. row {t['example_row']}, turn {t['example_turn']})"
            console.print(f"  {t.get('samples', t['count']):>9,}  {t['share']:6.1%}  {t['tokens']:>5}  "
                          f"{template_repr(t['text'], 200)}{where}", markup=False, highlight=False)
    if line := conventions_line(summary.get("conventions") or {}):  # chat format and masking conventions found
        # An untrained end of turn (axolotl's train_on_eos: none) is no per-row finding, but the line says so loudly.
        loud = (summary.get("conventions") or {}).get("eot_trained") is False
        console.print(line, markup=False, highlight=False, soft_wrap=True, style="bold red" if loud else None)
    share = summary["failing_share"]
    colour = "green" if summary["failing_rows"] == 0 else "red"
    console.print(
        f"[{colour}]{summary['failing_rows']:,} of {rows:,} samples fail ({share:.1%})[/] · "
        f"thinking {'expected' if summary['thinking_expected'] else 'not expected'} · "
        f"findings: {escape(out_dir)}/{FINDINGS_FILE}"
    )
