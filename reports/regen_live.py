"""The live display of a running ``dqa regen`` on stderr (rich), one terminal view among
``scan_terminal``, ``fleet_table`` and ``plan_table``: ``render`` draws a progress snapshot
(``dqa.regen.dispatch.progress.Progress.snapshot``, the dict progress.json holds) as a summary line
and a per-endpoint table; ``LiveProgress`` keeps it on screen while the run dispatches.
"""

from __future__ import annotations

from typing import Any, Callable

from dqa.formatting import human_duration


def render(snap: dict[str, Any]):
    """A rich renderable of a snapshot: one summary line and a per-endpoint table."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    total = max(snap["total"], 1)
    head = Table.grid(padding=(0, 1))
    head.add_row(
        ProgressBar(total=total, completed=snap["done"], width=30),
        f"{snap['done']:,}/{snap['total']:,}",
        f"[green]ok {snap['ok']:,}[/] [yellow]length {snap['truncated']:,}[/] [red]failed {snap['failed']:,}[/]",
        f"{snap['state']}",
    )
    cost = ""
    if snap["gpu_hour_cost"]:
        proj = snap["cost_projected"]
        cost = f" | cost ${snap['cost_so_far']:,.2f} -> ${proj:,.2f}" if proj is not None else f" | cost ${snap['cost_so_far']:,.2f}"
    line = (
        f"{snap['req_per_s']:.1f} req/s | {snap['output_tok_per_s']:,.0f} out tok/s | mean out {snap['mean_output_tokens']:,.0f} tok"
        f" | in flight {snap['in_flight']} | elapsed {human_duration(snap['elapsed_s'])} | ETA {human_duration(snap['eta_s'])}{cost}"
    )
    if snap.get("same_endpoint_share") is not None:
        line += f" | same endpoint {snap['same_endpoint_share']:.0%} of {snap['consecutive_turns']:,} next turns, {snap['turns_moved']:,} moved"
    eps = Table(box=None, padding=(0, 1), show_edge=False)
    for c in ("endpoint", "health", "in flight", "done", "failed", "out tokens"):
        eps.add_column(c, justify="left" if c == "endpoint" else "right")
    for url, e in snap["endpoints"].items():
        eps.add_row(url, "[green]up[/]" if e["healthy"] else "[red]down[/]", str(e["in_flight"]), f"{e['done']:,}", f"{e['failed']:,}", f"{e['output_tokens']:,}")
    grid = Table.grid()
    grid.add_row(head)
    grid.add_row(line)
    grid.add_row(eps)
    return grid


class LiveProgress:
    """A rich ``Live`` display on stderr, started at once with ``snapshot()``'s state, redrawn by
    ``update(snap)`` and left on screen with the last state by ``stop()``."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        from rich.console import Console
        from rich.live import Live

        self._snapshot = snapshot
        self._live = Live(render(snapshot()), console=Console(stderr=True), refresh_per_second=4, transient=False)
        self._live.start()

    def update(self, snap: dict[str, Any]) -> None:
        """Redraw with the snapshot ``snap``."""
        self._live.update(render(snap))

    def stop(self) -> None:
        """Draw the latest snapshot once more and stop refreshing (the display stays)."""
        self._live.update(render(self._snapshot()))
        self._live.stop()
