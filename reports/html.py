"""One self-contained HTML report from a scan folder, and optionally a regen run and a validation.

The file works offline and alone: inline CSS, inline SVG plots, no scripts, no fonts, no
links to fetch; a Content-Security-Policy meta tag forbids loading anything even if a
browser were asked to. Everything that came from the data (decoded template text, sample
ids, paths) is untrusted and goes through ``html.escape``.

Sections: headline figures; supervised tokens per sample before and after (the scan, and a
scan of the new release with ``after_dir`` or else the regenerated rows' output tokens);
the findings table; the top degenerate templates (decoded); regen throughput over time
(from the shards' ``completed_at`` and ``output_tokens``; stretches when no request was in
flight, such as the time between an interrupted run and its resume, are left as gaps, not
drawn as zero) and progress; expectation results and the gate verdict. For a repair work folder
(``repair``: its repair.json) a section of its rounds follows the headline
(``dqa.reports.repair_rounds``): failing samples per round, and what each round cost.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from dqa import atomic
from dqa.audit.scan_folder import METRICS_FILE, SUMMARY_FILE, findings_file
from dqa.errors import InputError
from dqa.formatting import human_count, human_duration
from dqa.regen.dispatch.progress import GAP_S, LIVE_STATES, work_spans
from dqa.reports.svg import Series, esc, grouped_bars, line_chart
from dqa.reports.repair_rounds import html_section as repair_section
from dqa.audit.scan_order import root_cause, root_cause_legend

TEMPLATE_TEXT_MAX = 600
IDS_PER_CHECK = 5
THROUGHPUT_BUCKETS = 40


@dataclass
class ReportInputs:
    """What the report is drawn from. Only ``scan_dir`` is required."""

    scan_dir: Path
    summary: dict[str, Any]
    before_tokens: np.ndarray
    findings: pl.DataFrame | None = None
    after_label: str | None = None
    after_tokens: np.ndarray | None = None
    regen_dir: Path | None = None
    shards: pl.DataFrame | None = None
    progress: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    validation_dir: Path | None = None
    gate: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    repair: dict[str, Any] | None = None  # a repair work folder's repair.json: the rounds section


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})") from None


def _read_tokens(scan_dir: Path) -> np.ndarray:
    f = scan_dir / METRICS_FILE
    if not f.is_file():
        raise InputError(f"{f}: no such file (expected a scan folder written by `dqa scan`)")
    try:
        return pl.read_parquet(f, columns=["supervised_tokens"])["supervised_tokens"].to_numpy()
    except Exception as exc:
        raise InputError(f"{f}: cannot read column supervised_tokens ({' '.join(str(exc).split())[:200]})") from None


def find_validation(scan_dir: Path) -> Path | None:
    """The newest validation folder inside a scan folder (``validation-*/`` or ``gate/validation/``), or None."""
    found = [p.parent for p in scan_dir.glob("validation*/summary.json")]
    found += [p.parent for p in scan_dir.glob("gate/validation/summary.json")]
    return max(found, key=lambda p: (p / "summary.json").stat().st_mtime) if found else None


def load_inputs(
    scan_dir: str | Path,
    regen_dir: str | Path | None = None,
    validation_dir: str | Path | None = None,
    after_dir: str | Path | None = None,
) -> ReportInputs:
    """Read everything the report shows. Raises ``InputError`` naming a missing or unreadable file."""
    scan = Path(scan_dir)
    sfile = scan / SUMMARY_FILE
    if not sfile.is_file():
        raise InputError(f"{sfile}: no such file (expected a scan folder written by `dqa scan`)")
    inputs = ReportInputs(scan_dir=scan, summary=_read_json(sfile), before_tokens=_read_tokens(scan))
    if findings_file(scan).is_file():
        inputs.findings = pl.read_parquet(findings_file(scan))
    if after_dir is not None:
        inputs.after_tokens = _read_tokens(Path(after_dir))
        inputs.after_label = f"after ({Path(after_dir).name})"
    if regen_dir is not None:
        rd = Path(regen_dir)
        if not rd.is_dir():
            raise InputError(f"{rd}: no such regen folder")
        from dqa.regen.store.folder import RunFolder
        from dqa.regen.store.shards import ShardStatus, shard_rows

        inputs.regen_dir = rd
        inputs.shards = shard_rows(rd)
        inputs.progress = RunFolder(rd).progress()
        if inputs.after_tokens is None and inputs.shards.height:
            # Per sample (a multi-turn conversation's regenerated turns summed), like the scan's per-sample counts.
            ok = inputs.shards.filter(pl.col("status") == ShardStatus.OK.value)
            inputs.after_tokens = ok.group_by("row").agg(pl.col("output_tokens").cast(pl.Int64).sum())["output_tokens"].to_numpy()
            inputs.after_label = "regenerated samples (output tokens)"
    vdir = Path(validation_dir) if validation_dir is not None else find_validation(scan)
    if vdir is not None:
        vfile = vdir / "summary.json"
        if not vfile.is_file():
            raise InputError(f"{vfile}: no such file (expected a folder written by `dqa validate`)")
        inputs.validation, inputs.validation_dir = _read_json(vfile), vdir
        gfile = vdir.parent / "gate.json"
        if gfile.is_file():
            inputs.gate = _read_json(gfile)
    return inputs


def log2_edges(nbins: int) -> list[str]:
    """Axis labels at the boundaries of ``log2_bins``' bins: 0, 1, 2, 4, 8, ... (``nbins + 1`` labels)."""
    return ["0"] + [human_count(2 ** (k - 1), trim=True) for k in range(1, nbins + 1)]


def log2_bins(*arrays: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """Shared power-of-two bins (0, 1, 2-3, 4-7, ...) and each array's share of rows (%) per bin."""
    top = max((int(a.max()) if len(a) else 0) for a in arrays)
    nbins = 1 + max(1, math.floor(math.log2(top)) + 1 if top > 0 else 1)
    labels = ["0"]
    for k in range(1, nbins):
        lo, hi = 2 ** (k - 1), 2**k - 1
        labels.append(human_count(lo, trim=True) if lo == hi else f"{human_count(lo, trim=True)}-{human_count(hi, trim=True)}")
    shares = []
    for a in arrays:
        a = np.asarray(a, dtype=np.int64)
        idx = np.zeros(len(a), dtype=np.int64)
        pos = a > 0
        idx[pos] = np.floor(np.log2(a[pos])).astype(np.int64) + 1
        counts = np.bincount(idx, minlength=nbins)[:nbins]
        shares.append(100.0 * counts / max(1, len(a)))
    return labels, shares


def _work(shards: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, float]]]:
    """Completion times (epoch s, sorted), output tokens in that order, and the stretches of work
    (``dqa.regen.dispatch.progress.work_spans``: split where no request was in flight for ``GAP_S``)."""
    t = shards["completed_at"].dt.epoch("us").to_numpy().astype(np.float64) / 1e6
    order = np.argsort(t, kind="stable")
    tok = shards["output_tokens"].fill_null(0).to_numpy().astype(np.float64)[order]
    lat = None
    if "latency_s" in shards.columns:
        lat = shards["latency_s"].fill_null(0.0).to_numpy().astype(np.float64)[order]
    t = t[order]
    return t, tok, work_spans(t, lat)


def _sample_ends(shards: pl.DataFrame) -> np.ndarray:
    """1.0 for each shard row (in completion order) that finishes its sample, else 0.0."""
    t = shards["completed_at"].dt.epoch("us").to_numpy()
    order = np.argsort(t, kind="stable")
    if "ends_sample" not in shards.columns:
        return np.ones(len(order), dtype=np.float64)
    return shards["ends_sample"].fill_null(True).to_numpy().astype(np.float64)[order]


def throughput(shards: pl.DataFrame, buckets: int = THROUGHPUT_BUCKETS) -> tuple[list, list, list, float]:
    """Bucket shard rows by ``completed_at``: ``(seconds since the first completion, output tok/s
    (every turn's tokens), completed samples cumulative (rows that finish a sample: a multi-turn
    conversation counts once, at its last turn), bucket width s)``.

    Each stretch of work is bucketed on its own, all with one width (the working time over
    ``buckets``); between two stretches (an idle gap: no request in flight for ``GAP_S`` or more,
    e.g. between an interrupted run and its resume) all three lists hold one ``None``, so the
    chart breaks its line there instead of drawing zero throughput.
    """
    if shards.height == 0:
        return [], [], [], 0.0
    t, tok, spans = _work(shards)
    ends = _sample_ends(shards)
    t0 = float(t[0])
    width = max(0.01, sum(float(t[b - 1] - t[a]) for a, b, _ in spans) / buckets)
    xs: list = []
    tps: list = []
    done: list = []
    total = 0
    for k, (a, b, _) in enumerate(spans):
        if k:
            xs.append(None)
            tps.append(None)
            done.append(None)
        ts, start = t[a:b], float(t[a])
        # The last completion closes the span's last bucket instead of opening a near-empty one.
        n = max(1, int(math.ceil(float(ts[-1] - start) / width)))
        idx = np.minimum(((ts - start) / width).astype(np.int64), n - 1)
        tps += (np.bincount(idx, weights=tok[a:b], minlength=n) / width).tolist()
        cum = total + np.cumsum(np.bincount(idx, weights=ends[a:b], minlength=n)).astype(np.int64)
        total = int(cum[-1])
        done += cum.astype(float).tolist()
        xs += [start - t0 + (i + 0.5) * width for i in range(n)]
    return xs, tps, done, width


def idle_gaps(shards: pl.DataFrame) -> list[tuple[float, float]]:
    """The idle gaps between stretches of work, as ``(from, to)`` seconds since the first
    completion: from a stretch's last completion to the next one's first request."""
    if shards.height == 0:
        return []
    t, _, spans = _work(shards)
    t0 = float(t[0])
    return [(float(t[b - 1]) - t0, first - t0) for (_, b, _), (_, _, first) in zip(spans, spans[1:])]


def run_rates(p: dict[str, Any]) -> tuple[Any, Any]:
    """``(requests/s, output tok/s)`` to show for a progress.json. A stopped run's are its mean rates
    over its working time; a progress.json written by an older dqa may hold 0 there (the rate of
    its last minute, or of a rerun with nothing to do), so they are worked out again from
    ``done``, ``mean_output_tokens`` and ``elapsed_s``."""
    req, tok = p.get("req_per_s"), p.get("output_tok_per_s")
    if p.get("state") in LIVE_STATES or req:
        return req, tok
    try:
        elapsed = float(p.get("elapsed_s") or 0.0)
        done = int(p.get("done") or 0)
        generated = int(p.get("ok") or 0) + int(p.get("truncated") or 0)
        mean_out = float(p.get("mean_output_tokens") or 0.0)
    except (TypeError, ValueError):
        return req, tok
    if elapsed <= 0 or done <= 0:
        return req, tok
    return round(done / elapsed, 3), round(mean_out * generated / elapsed, 1)


def _num(v: Any) -> str:
    from dqa.reports.markdown_validation import fmt_number

    return esc(fmt_number(v))


def _pct(v: float) -> str:
    return f"{100 * v:.2f}%"


def _id(value: Any) -> str:
    """A sample id that never wraps inside itself (``sample-00012`` stays on one line)."""
    return f'<span class="id">{esc(value)}</span>'


def _kv_table(rows: list[tuple[str, str]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _section_headline(inp: ReportInputs) -> str:
    s = inp.summary
    rows = [
        ("dataset", esc(s.get("dataset", ""))),
        ("format", esc(f"{s.get('format', '')} · {s.get('convention', '')} · template {s.get('template', '')}")),
        ("rows", _num(s.get("rows"))),
        ("tokens", _num(s.get("tokens"))),
        ("supervised tokens", _num(s.get("supervised_tokens"))),
        ("failing rows", f"{_num(s.get('failing_rows'))} ({_pct(float(s.get('failing_share', 0.0)))})"),
        ("thinking expected", esc(s.get("thinking_expected"))),
    ]
    return "<section><h2>Scan</h2>" + _kv_table(rows) + "</section>"


def _section_histogram(inp: ReportInputs) -> str:
    arrays = [inp.before_tokens] + ([inp.after_tokens] if inp.after_tokens is not None else [])
    labels, shares = log2_bins(*arrays)
    series = [Series("before (scan)", shares[0].tolist())]
    if inp.after_tokens is not None:
        series.append(Series(inp.after_label or "after", shares[1].tolist()))
    svg = grouped_bars("Supervised tokens per sample", labels, series, "% of samples", "supervised tokens (power-of-two bins)", percent=True,
                       edge_labels=log2_edges(len(labels)))
    d = inp.summary.get("supervised_tokens_distribution", {})
    stats = ", ".join(f"{k} {_num(d[k])}" for k in ("mean", "p10", "p50", "p90", "max") if k in d)
    note = f'<p class="note">Before: {len(inp.before_tokens):,} samples; {stats}.'
    if inp.after_tokens is not None:
        a = inp.after_tokens
        if len(a):
            note += (f" {esc(inp.after_label)}: {len(a):,} samples; mean {np.mean(a):,.4g}, "
                     f"p50 {np.quantile(a, 0.5):,.4g}, p90 {np.quantile(a, 0.9):,.4g}.")
    note += "</p>"
    return f"<section><h2>Supervised tokens before and after</h2>{svg}{note}</section>"


def _section_findings(inp: ReportInputs) -> str:
    checks = inp.summary.get("checks", {})
    ids: dict[str, list[str]] = {}
    f = inp.findings
    if f is not None and f.height and "reasons" in f.columns:
        key = "id" if "id" in f.columns else "row"
        ex = f.select(pl.col(key).cast(pl.String).alias("key"), "reasons").explode("reasons")
        for name, grp in ex.group_by("reasons", maintain_order=True):
            ids[str(name[0] if isinstance(name, tuple) else name)] = grp["key"].head(IDS_PER_CHECK).to_list()
    rows = []
    # As in the terminal table: most samples first, the root cause marked and explained under the table.
    cause = root_cause(inp.summary) if checks else None
    for name, c in sorted(checks.items(), key=lambda kv: (-int(kv[1].get("count", 0)), kv[0])):
        cls = "bad" if c.get("count") else "ok"
        mark = ' <span class="cause">◀ root cause</span>' if cause and name == cause[0] else ""
        sample = ", ".join(_id(i) for i in ids.get(name, []))
        # summary.json checks carry a short label and the full "flags when" sentence (FORMATS.md).
        label, flags_when = str(c.get("label") or ""), str(c.get("flags_when") or "")
        rows.append(
            f'<tr class="{cls}"><td><code>{esc(name)}</code>{mark}</td><td title="{esc(flags_when)}">{esc(label or flags_when)}</td>'
            f'<td class="n">{_num(c.get("count", 0))}</td><td class="n">{_pct(float(c.get("share", 0.0)))}</td><td>{sample}</td></tr>'
        )
    head = "<tr><th>check</th><th>flags</th><th>rows</th><th>share</th><th>first samples</th></tr>"
    legend = f'<p class="note">◀ {esc(root_cause_legend(*cause))}.</p>' if cause else ""
    # The truncated rows pile up on one length: the limit that cut them (dqa.audit.cuts).
    cuts = "".join(f'<p class="note"><strong>cut:</strong> {esc(str(c.get("text", "")))}.</p>'
                   for c in inp.summary.get("truncation_cuts") or [])
    return f"<section><h2>Findings</h2><table>{head}{''.join(rows)}</table>{legend}{cuts}</section>"


def _section_templates(inp: ReportInputs) -> str:
    tpls = inp.summary.get("degenerate_templates") or []
    if not tpls:
        return '<section><h2>Top degenerate templates</h2><p class="note">None: no response recurs across a large share of the set.</p></section>'
    rows = []
    for t in tpls:
        text = str(t.get("text", ""))
        if len(text) > TEMPLATE_TEXT_MAX:
            text = text[:TEMPLATE_TEXT_MAX] + "…"
        rows.append(f'<tr><td><pre class="tpl">{esc(text)}</pre></td><td class="n">{_num(t.get("tokens"))}</td>'
                    f'<td class="n">{_num(t.get("count"))}</td><td class="n">{_pct(float(t.get("share", 0.0)))}</td></tr>')
    head = "<tr><th>decoded supervised text</th><th>tokens</th><th>rows</th><th>share</th></tr>"
    return f"<section><h2>Top degenerate templates</h2><table>{head}{''.join(rows)}</table></section>"


def _section_regen(inp: ReportInputs) -> str:
    if inp.regen_dir is None:
        return ""
    parts = ["<section><h2>Regeneration</h2>"]
    p = inp.progress
    if p:
        req, tok = run_rates(p)
        # A stopped run shows its mean rates over the time it worked; a running one its last minute's.
        over = ' <span class="note">(last minute)</span>' if p.get("state") in LIVE_STATES else ' <span class="note">(mean over working time)</span>'
        parts.append(_kv_table([
            ("state", esc(p.get("state", ""))),
            ("done", f"{_num(p.get('done'))} of {_num(p.get('total'))}"),
            ("ok / failed / truncated", f"{_num(p.get('ok'))} / {_num(p.get('failed'))} / {_num(p.get('truncated'))}"),
            ("output tok/s", _num(tok) + over),
            ("samples/s", _num(req) + over),
            ("mean output tokens", _num(p.get("mean_output_tokens"))),
            ("working time (all runs)", esc(human_duration(float(p.get("elapsed_s") or 0.0)))),
            ("cost so far / projected", f"{_num(p.get('cost_so_far'))} / {_num(p.get('cost_projected'))}"),
        ]))
    sh = inp.shards
    if sh is not None and sh.height:
        xs, tps, done, width = throughput(sh)
        gaps = idle_gaps(sh)
        parts.append(line_chart(f"Output tokens per second (buckets of {human_duration(width)})", xs, [Series("output tok/s", tps, "#2e86ab")],
                                "tokens / s", "time since the first completion", x_fmt=human_duration, x_min=0.0, gaps=gaps,
                                gap_label="idle"))
        parts.append(line_chart("Completed samples", xs, [Series("completed (cumulative)", done, "#66a182")],
                                "samples", "time since the first completion", x_fmt=human_duration, x_min=0.0, gaps=gaps,
                                gap_label="idle"))
        if gaps:
            parts.append(f'<p class="note">Shaded: {len(gaps)} idle gap{"s" if len(gaps) > 1 else ""} of '
                         f'{esc(human_duration(sum(b - a for a, b in gaps)))} in all, when no request was in flight for '
                         f'{esc(human_duration(GAP_S))} or more (between runs, or while the whole fleet was down); not drawn as zero.</p>')
        status = sh.group_by("status").len().sort("len", descending=True)
        samples = int(sh["ends_sample"].sum()) if "ends_sample" in sh.columns else sh.height
        turns_note = (f" ({sh.height:,} turns regenerated for {samples:,} finished samples: a multi-turn conversation is "
                      "one sample, each of its regenerated turns one shard row; tok/s counts every turn)") if samples != sh.height else ""
        parts.append('<p class="note">Shard rows: ' + ", ".join(f"{esc(s)} {n:,}" for s, n in status.iter_rows()) + esc(turns_note) + "</p>")
    else:
        parts.append('<p class="note">No completed shards yet.</p>')
    parts.append("</section>")
    return "".join(parts)


def _section_validation(inp: ReportInputs) -> str:
    from dqa.reports.markdown_validation import describe_kwargs, describe_observed, describe_unexpected

    v = inp.validation
    if not v:
        return ""
    parts = ["<section><h2>Expectations</h2>"]
    g = inp.gate
    if g:
        cls = "ok" if g["verdict"] == "pass" else "bad"
        parts.append(f'<p class="verdict {cls}">Gate: {esc(g["verdict"].upper())}</p>')
        if g.get("reasons"):
            parts.append("<ul>" + "".join(f"<li>{esc(r)}</li>" for r in g["reasons"]) + "</ul>")
    st = v.get("statistics", {})
    cls = "ok" if v.get("success") else "bad"
    parts.append(f'<p class="verdict {cls}">Suite {esc(v.get("suite"))}: {"PASS" if v.get("success") else "FAIL"} '
                 f'(fail on {esc(v.get("fail_on"))}; {st.get("passed", 0)} passed, {st.get("failed", 0)} failed, '
                 f'{st.get("warnings", 0)} warnings, {st.get("errors", 0)} errors)</p>')
    rows = []
    for e in v.get("expectations", []):
        ids = ", ".join(_id(i) for i in (e.get("failing_ids") or [])[:IDS_PER_CHECK]) if e["status"] != "pass" else ""
        rows.append(
            f'<tr class="{esc(e["status"])}"><td>{esc(e["status"])}</td><td>{esc(e["severity"])}</td><td><code>{esc(e["title"])}</code>'
            f'<div class="why">{esc(e.get("why", ""))}</div></td><td>{esc(describe_kwargs(e["kwargs"]))}</td>'
            f'<td>{esc(describe_observed(e))}</td><td class="n">{esc(describe_unexpected(e))}</td><td>{ids}</td></tr>'
        )
    head = "<tr><th></th><th>severity</th><th>expectation</th><th>bounds</th><th>observed</th><th>unexpected</th><th>first failing samples</th></tr>"
    parts.append(f"<table>{head}{''.join(rows)}</table>")
    if g and g.get("drift"):
        drows = "".join(
            f'<tr class="{"pass" if c["passed"] else "fail"}"><td>{"pass" if c["passed"] else "fail"}</td><td>{esc(c["name"])}</td>'
            f'<td class="n">{_num(c.get("baseline"))}</td><td class="n">{_num(c.get("release"))}</td><td class="n">{_num(c["value"])}</td>'
            f'<td>{esc(c["threshold_text"])}</td></tr>'
            for c in g["drift"]["checks"]
        )
        parts.append("<h3>Drift against the baseline</h3><table><tr><th></th><th>check</th><th>baseline</th><th>release</th>"
                     f"<th>change</th><th>allowed</th></tr>{drows}</table>")
    parts.append("</section>")
    return "".join(parts)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;color:#1d2330;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}.sub{color:#5b6475;margin:0 0 16px}
table{border-collapse:collapse;width:100%;margin:6px 0}th,td{border:1px solid #dde2ea;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f9;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.kv{width:auto}table.kv th{width:200px}tr.bad td:first-child,tr.fail td:first-child{border-left:4px solid #d1495b}
tr.ok td:first-child,tr.pass td:first-child{border-left:4px solid #66a182}tr.warn td:first-child{border-left:4px solid #edae49}
tr.error td:first-child{border-left:4px solid #8d6a9f}
pre.tpl{margin:0;white-space:pre-wrap;word-break:break-word;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;background:#f7f7f9;padding:4px}
code{font:12px ui-monospace,Menlo,Consolas,monospace}.why{color:#5b6475;font-size:12px}.note{color:#5b6475}
.id{white-space:nowrap}
.verdict{font-weight:700;font-size:16px}.verdict.ok{color:#2d7a4a}.verdict.bad{color:#b3261e}
svg.chart{width:100%;max-width:980px;height:auto;display:block;margin:8px 0}
svg .ct{font-size:14px;font-weight:600;fill:#1d2330}svg .tick{font-size:11px;fill:#5b6475}svg .axl{font-size:12px;fill:#1d2330}
svg .lg{font-size:12px;fill:#1d2330}svg .val{font-size:12px;font-weight:600;fill:#1d2330}svg .grid{stroke:#e6e9ef;stroke-width:1}svg .axis{stroke:#9aa3b2;stroke-width:1}
svg .gap{fill:#e9ecf2;opacity:.7}svg .gapl{font-size:11px;fill:#8a93a3}
"""


def render_report(inp: ReportInputs) -> str:
    """The whole report as one HTML document (text)."""
    from dqa import __version__

    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = f"dqa report: {Path(str(inp.summary.get('dataset', inp.scan_dir))).name}"
    sources = [f"scan {inp.scan_dir}"] if inp.repair is None else [f"repair {inp.repair.get('work', '')}", f"scan {inp.scan_dir}"]
    if inp.regen_dir is not None:
        sources.append(f"regen {inp.regen_dir}")
    if inp.validation_dir is not None:
        sources.append(f"validation {inp.validation_dir}")
    body = "".join([
        f"<h1>{esc(title)}</h1><p class=\"sub\">{esc(' · '.join(sources))} · generated {esc(now)} by dqa {esc(__version__)}</p>",
        _section_headline(inp),
        *(f'<p class="note">{esc(n)}</p>' for n in inp.notes),
        repair_section(inp.repair) if inp.repair is not None else "",
        _section_histogram(inp),
        _section_findings(inp),
        _section_templates(inp),
        _section_regen(inp),
        _section_validation(inp),
    ])
    return _document(title, body)


def render_repair_only(repair: dict[str, Any]) -> str:
    """The report of a repair work folder whose round-1 scan is not there (the repair stopped
    before it, or a reused scan was removed): the ``Repair rounds`` section alone, as one HTML document."""
    from dqa import __version__

    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = f"dqa report: {Path(str(repair.get('dataset', ''))).name}"
    body = (f"<h1>{esc(title)}</h1><p class=\"sub\">{esc('repair ' + str(repair.get('work', '')))} · generated {esc(now)} by dqa "
            f"{esc(__version__)}</p>{repair_section(repair)}")
    return _document(title, body)


def _document(title: str, body: str) -> str:
    """One self-contained HTML document: ``body`` under ``title``, the inline CSS, no scripts."""
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )


def write_report(
    scan_dir: str | Path,
    out_file: str | Path | None = None,
    regen_dir: str | Path | None = None,
    validation_dir: str | Path | None = None,
    after_dir: str | Path | None = None,
) -> Path:
    """Render the report for ``scan_dir`` and write it atomically (default ``SCAN_DIR/report.html``); returns the path."""
    inputs = load_inputs(scan_dir, regen_dir, validation_dir, after_dir)
    out = Path(out_file) if out_file is not None else Path(scan_dir) / "report.html"
    atomic.write_text(out, render_report(inputs))
    return out
