"""What the `dqa fleet` commands show people: the status table of `fleet status` and the lines
`fleet up` prints once the fleet is healthy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from rich.table import Table

    from dqa.regen.fleet.file import Fleet
    from dqa.regen.fleet.status import EndpointStatus
    from dqa.regen.fleet.up import LaunchResult

STATUS_COLUMNS = ("GPU", "endpoint", "up", "gen tok/s", "running", "queued", "KV", "accept", "requests", "gen tokens", "cache hit", "source")


def _fmt(v: float | None, spec: str = ",.0f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _hit(prompt: float | None, cached: float | None) -> str:
    return "-" if not prompt or cached is None else f"{cached / prompt:.0%}"


def _title(fleets: Sequence[Fleet]) -> str:
    """``fleet: sglang, MODEL``; several fleet files: how many, or each file's when they differ."""
    kinds = {(f.engine, f.model) for f in fleets}
    if len(kinds) == 1:
        engine, model = kinds.pop()
        return f"fleet: {engine}, {model}" + (f" ({len(fleets)} fleet files)" if len(fleets) > 1 else "")
    return "fleets: " + "; ".join(f"{f.path.name if f.path else '?'}: {f.engine}, {f.model}" for f in fleets)


def status_table(fleets: Fleet | Sequence[Fleet], statuses: Sequence[EndpointStatus], totals: dict[str, Any]) -> tuple[Table, list[str]]:
    """The `fleet status` table of one fleet or several (one per node): one row per endpoint,
    then the sums in row "all"; and the distinct notes of the endpoints (e.g. why figures are
    missing), sorted."""
    from rich.table import Table

    t = Table(title=_title([fleets] if not isinstance(fleets, (list, tuple)) else fleets), title_justify="left")
    for col in STATUS_COLUMNS:
        left = col in ("GPU", "endpoint", "up", "source")
        t.add_column(col, justify="left" if left else "right", no_wrap=col == "endpoint")
    for s in statuses:
        t.add_row(
            s.gpu or "-",
            s.url,
            "[green]up[/]" if s.up else "[red]down[/]",
            _fmt(s.gen_tok_per_s),
            _fmt(s.running),
            _fmt(s.queued),
            _fmt(s.kv_usage, ".0%"),
            _fmt(s.accept_len, ".2f"),
            _fmt(s.requests_total),
            _fmt(s.generation_tokens_total),
            _hit(s.prompt_tokens_total, s.cached_tokens_total),
            s.source,
        )
    t.add_section()
    t.add_row(
        "all",
        f"{totals['endpoints']} endpoints",
        f"{totals['up']}/{totals['endpoints']}",
        _fmt(totals["gen_tok_per_s"]),
        _fmt(totals["running"]),
        _fmt(totals["queued"]),
        _fmt(totals["kv_usage"], ".0%"),
        _fmt(totals["accept_len"], ".2f"),
        _fmt(totals["requests_total"]),
        _fmt(totals["generation_tokens_total"]),
        _hit(totals["prompt_tokens_total"], totals["cached_tokens_total"]),
        "",
    )
    notes = sorted({s.note for s in statuses if s.note})
    return t, notes


def up_lines(result: LaunchResult) -> list[str]:
    """What `fleet up` prints when the fleet is healthy: a summary line, then one line per GPU."""
    rec = result.record
    lines = [
        f"fleet up: {len(rec.endpoints)} {rec.engine} server(s) healthy in {result.elapsed_s:.1f} s; fleet file {result.fleet_path}"
    ]
    lines += [f"  GPU {e.gpu}: {e.url} pid {e.pid} log {e.log}" for e in rec.endpoints]
    if rec.router is not None:
        r = rec.router
        what = f"{r.gateway['name']} {r.gateway['version']}, " if r.gateway else ""
        lines.append(f"  router: {r.url} ({what}metrics {r.metrics_url}) pid {r.pid} log {r.log}; `dqa regen --fleet` sends to it")
    return lines


def router_lines(st: Any) -> list[str]:
    """What `fleet status` prints for the fleet's router (a ``servers.sglang_router.RouterStatus``): up and
    ready, then one line per worker it sees (health, circuit, in flight), retries and upstream
    replies by status code."""
    state = "up" if st.up else "DOWN"
    ready = "ready" if st.ready else "not ready (no healthy worker)"
    proc = f", process {st.process}" if st.process else ""
    what = f" ({st.gateway['name']} {st.gateway['version']})" if getattr(st, "gateway", None) else ""
    lines = [f"router {st.url}{what}: {state}, {ready}{proc}"]
    if st.source != "metrics":
        return lines + [f"  {st.note}"] if st.note else lines
    for w in st.workers:
        health = {True: "healthy", False: "UNHEALTHY", None: "health ?"}[w.healthy]
        active = "?" if w.active is None else f"{w.active:g}"
        lines.append(f"  worker {w.url}: {health}, circuit {w.circuit or '?'}, {active} in flight")
    codes = ", ".join(f"{c}: {v:g}" for c, v in sorted(st.responses.items())) or "none yet"
    lines.append(f"  retries {st.retries_total:g} (exhausted {st.retries_exhausted_total:g}); upstream replies {codes}")
    return lines
