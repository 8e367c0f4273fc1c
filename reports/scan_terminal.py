"""The terminal table of ``dqa scan``: the biggest problem first, readable in five seconds."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dqa.reports.scan_markdown import ranked_checks, template_repr


def print_scan_table(summary: dict[str, Any], out_dir: str, console: Console) -> None:
    """Print the per-check table and the verdict line for ``summary`` to ``console``."""
    rows = summary["rows"]
    table = Table(title=f"dqa scan · {rows:,} samples · {summary['tokens']:,} tokens", title_justify="left", expand=False)
    table.add_column("check", style="bold", no_wrap=True, min_width=19)
    table.add_column("share", justify="right", no_wrap=True, min_width=6)
    table.add_column("samples", justify="right", no_wrap=True, min_width=7)
    table.add_column("detail", overflow="ellipsis", no_wrap=True, max_width=max(20, console.width - 48))
    templates = summary.get("degenerate_templates") or []
    for name, c in ranked_checks(summary):
        detail = c.get("label") or c["flags_when"]
        if name == "degenerate_template" and templates:
            t = templates[0]
            detail = f"{template_repr(t['text'])} ({t['tokens']} tokens)"
        detail = escape(detail)  # decoded sample text is data, not rich markup
        style = "red" if c["share"] >= 0.10 else "yellow"
        table.add_row(name, f"[{style}]{c['share']:.1%}[/]", f"{c['count']:,}", detail)
    if not ranked_checks(summary):
        table.add_row("[green]all checks[/]", "0.0%", "0", "no sample flagged")
    console.print(table)
    if len(templates) > 1 or (templates and len(template_repr(templates[0]["text"])) > console.width - 60):
        console.print("[bold]degenerate templates[/] (samples, share, tokens, supervised text):")
        for t in templates[:5]:
            console.print(f"  {t['count']:>9,}  {t['share']:6.1%}  {t['tokens']:>5}  {template_repr(t['text'], 200)}", markup=False, highlight=False)
    share = summary["failing_share"]
    colour = "green" if summary["failing_rows"] == 0 else "red"
    console.print(
        f"[{colour}]{summary['failing_rows']:,} of {rows:,} samples fail ({share:.1%})[/] · "
        f"thinking {'expected' if summary['thinking_expected'] else 'not expected'} · "
        f"findings: {escape(out_dir)}/findings.parquet"
    )
