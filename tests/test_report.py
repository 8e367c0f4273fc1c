"""Specification of `dqa report`: one offline HTML file, untrusted text escaped, plots that render."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from gate_data import clean_rows, ok_mode_rows, write_set

PLANTED = "<script>alert('pwned')</script>"
BAR_RED = (209, 73, 91)  # reports.svg PALETTE[0]: the 'before' bars
LINE_BLUE = (46, 134, 171)  # PALETTE[1]: the 'after' bars and the throughput line


def write_regen_folder(folder, rows: int = 120, seconds: float = 600.0, seed: int = 0):
    """A regen output folder in the real shard format (dqa.regen.store.journal), three shards, plus progress.json."""
    from dqa import atomic
    from dqa.regen.store.journal import Result, results_table, shard_path, write_table

    rng = np.random.default_rng(seed)
    t0 = 1_790_000_000.0
    done_at = np.sort(t0 + rng.random(rows) * seconds)
    results = [
        Result(row=i, sample_id=f"s{i}", prompt=np.array([151644, 872, 198], np.int32),
               output=rng.integers(100, 5000, int(rng.integers(300, 900))).astype(np.int32),
               status="ok" if i % 10 else "length", finish_reason="stop" if i % 10 else "length", error=None,
               endpoint="http://127.0.0.1:30000", attempts=1, latency_s=3.0, model="tiny", sampling="{}", seed=i,
               completed_at=float(done_at[i]))
        for i in range(rows)
    ]
    for k, chunk in enumerate(np.array_split(np.arange(rows), 3)):
        write_table(shard_path(folder, "a", k), results_table([results[i] for i in chunk]))
    atomic.write_json(folder / "progress.json", {
        "state": "finished", "total": rows, "done": rows, "ok": rows - rows // 10, "failed": 0, "truncated": rows // 10,
        "in_flight": 0, "elapsed_s": seconds, "req_per_s": rows / seconds, "output_tok_per_s": 120.0,
        "mean_output_tokens": 600.0, "eta_s": 0, "gpus": 1, "gpu_hour_cost": 2.0, "cost_so_far": 0.33, "cost_projected": 0.33,
        "endpoints": {}, "updated_at": "2026-11-30T08:00:00Z"})
    return folder


@pytest.fixture(scope="module")
def planted_scan(tmp_path_factory):
    """40 clean samples and 20 whose only answer is a <script> tag (a degenerate template with hostile text)."""
    from dqa.audit.scan import run_scan

    d = tmp_path_factory.mktemp("planted")
    data = write_set(d / "planted.parquet", clean_rows(40, seed=21) + ok_mode_rows(20, seed=22, answer=PLANTED))
    return run_scan(data, d / "scan").out_dir


def test_decoded_template_text_is_escaped_and_nothing_external_is_loaded(cli, planted_scan, tmp_path):
    out = tmp_path / "r.html"
    r = cli("report", planted_scan, "--out", out)
    assert r.exit_code == 0, r.output
    page = out.read_text()
    summary = json.loads((planted_scan / "summary.json").read_text())
    assert PLANTED in summary["degenerate_templates"][0]["text"]  # the scan really decoded the hostile text
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page
    # Self-contained: no external scripts, styles, fonts or images.
    assert not re.search(r"<(script|link|iframe|img)\b|@import|url\(|src=|href=", page, re.I)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert page.count("<svg") == 1  # the histogram (no regen folder given)


def test_report_draws_before_after_and_throughput_from_regen_shards(cli, defect_scan, tmp_path):
    regen = write_regen_folder(tmp_path / "regen")
    out = tmp_path / "r.html"
    r = cli("report", defect_scan, "--regen", regen, "--out", out)
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert page.count("<svg") == 3  # histogram, tokens/s over time, completed samples over time
    assert "regenerated samples (output tokens)" in page and "before (scan)" in page
    assert "Output tokens per second" in page
    # The throughput line has one point per time bucket: 40 buckets over the 600 s run.
    line = re.search(r'<polyline points="([^"]+)"', page).group(1)
    assert len(line.split()) == 40
    assert "length 12" in page and "ok 108" in page  # shard rows by status
    # The degenerate 'OK.' template and the findings table are there.
    assert "OK.&lt;|im_end|&gt;" in page and "degenerate_template" in page
    # Each findings row shows the check's label from summary.json, its full sentence as a tooltip.
    check = json.loads((defect_scan / "summary.json").read_text())["checks"]["degenerate_template"]
    assert f'<td title="{html.escape(check["flags_when"], quote=True)}">{html.escape(check["label"], quote=True)}</td>' in page
    assert "buckets of 15 s" in page  # the 600 s run in 40 buckets, a duration as dqa writes them everywhere


def test_throughput_buckets_sum_to_the_output_tokens():
    import polars as pl

    from dqa.reports.html import throughput

    t = np.array([0, 10, 20, 30, 100], dtype="datetime64[s]").astype("datetime64[us]")
    shards = pl.DataFrame({"completed_at": t, "output_tokens": [100, 200, 300, 400, 500], "status": ["ok"] * 5})
    shards = shards.with_columns(pl.col("completed_at").dt.replace_time_zone("UTC"))
    xs, tps, done, width = throughput(shards, buckets=10)
    assert width == 10.0 and len(xs) == 10
    assert sum(tps) * width == pytest.approx(1500)
    assert done[-1] == 5 and done[0] == 1


def test_a_multi_turn_run_counts_samples_once_and_tokens_of_every_turn(tmp_path):
    """Shards of a multi-turn run hold one row per regenerated turn: the completed-samples line counts
    a conversation once, when its last turn (or a failed turn, which ends it) completes; output tok/s
    counts every turn. Shards from before multi-turn regeneration (no turn columns) count each row."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dqa.regen.store.shards import shard_rows as read_shards
    from dqa.reports.html import throughput

    t = np.array([0, 10, 20, 30, 40, 50], dtype="datetime64[s]").astype("datetime64[us]")
    table = pa.table({
        "row": pa.array([0, 0, 1, 1, 2, 3], pa.int64()),
        "completed_at": pa.array(t, pa.timestamp("us", tz="UTC")),
        "output_tokens": pa.array([10, 20, 30, 40, 50, 60], pa.int32()),
        "status": ["ok", "ok", "ok", "failed", "ok", "ok"],
        "latency_s": [0.1] * 6,
        "turn": pa.array([1, 2, 0, 1, 0, 0], pa.int32()),  # row A turns 1-2 of 3; row B fails at turn 1 of 3; C, D single
        "turns": pa.array([3, 3, 3, 3, 1, 1], pa.int32()),
    })
    (tmp_path / "new" / "shards").mkdir(parents=True)
    pq.write_table(table, tmp_path / "new" / "shards" / "part-s0of1-000000.parquet")
    shards = read_shards(tmp_path / "new")
    assert shards["ends_sample"].to_list() == [False, True, False, True, True, True]
    xs, tps, done, width = throughput(shards, buckets=5)
    assert done[-1] == 4 and sum(tps) * width == pytest.approx(210)
    (tmp_path / "old" / "shards").mkdir(parents=True)
    pq.write_table(table.drop(["turn", "turns"]), tmp_path / "old" / "shards" / "part-s0of1-000000.parquet")
    assert throughput(read_shards(tmp_path / "old"), buckets=5)[2][-1] == 6
    assert isinstance(shards, pl.DataFrame)


def test_report_picks_up_the_validation_and_gate(cli, defect_scan, clean_scan, tmp_path):
    gate_out = defect_scan / "gate"
    try:
        assert cli("gate", defect_scan, "--baseline", clean_scan, "--no-docs", "-q").exit_code == 1
        r = cli("report", defect_scan, "--out", tmp_path / "r.html")
        assert r.exit_code == 0, r.output
        page = (tmp_path / "r.html").read_text()
        assert "Gate: FAIL" in page and "Suite release: FAIL" in page
        assert "expect_column_pair_values_to_be_equal(n_mask, n_tokens)" in page
        assert "Drift against the baseline" in page and "failing_share" in page
    finally:
        shutil.rmtree(gate_out, ignore_errors=True)


def test_report_input_errors_exit_2(cli, tmp_path, clean_scan):
    assert cli("report").exit_code == 2
    r = cli("report", tmp_path)
    assert r.exit_code == 2 and "summary.json" in r.stderr
    r = cli("report", clean_scan, "--regen", tmp_path / "no-regen", "--out", tmp_path / "x.html")
    assert r.exit_code == 2 and "no-regen" in r.stderr
    assert not (tmp_path / "x.html").exists()


def colour_pixels(img: np.ndarray, rgb: tuple[int, int, int], tol: int = 10) -> int:
    diff = np.abs(img[..., :3].astype(np.int16) - np.array(rgb, dtype=np.int16))
    return int(np.all(diff <= tol, axis=-1).sum())


def test_report_renders_its_plots_in_headless_chromium(cli, defect_scan, tmp_path):
    from pngdecode import read_png

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian package `chromium`); .ci/run installs it")
    regen = write_regen_folder(tmp_path / "regen")
    html = tmp_path / "report.html"
    assert cli("report", defect_scan, "--regen", regen, "--out", html).exit_code == 0
    png = tmp_path / "shot.png"
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--window-size=1280,2000", html.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    assert png.is_file() and png.stat().st_size > 10_000
    img = read_png(png)
    assert img.shape[:2] == (2000, 1280)
    assert img[..., :3].std() > 10  # not a blank page
    assert colour_pixels(img, BAR_RED) > 5_000  # the 'before' histogram bars are drawn
    assert colour_pixels(img, LINE_BLUE) > 1_000  # the 'after' bars (and the throughput line below them)


# --------------------------------------------------------------------------- figures that were wrong (issue 9)

TEXT_RE = re.compile(r"<text ([^>]*)>(.*?)</text>", re.S)
FONT_PX = {"tick": 11, "axl": 12, "lg": 12, "ct": 14, "gapl": 11, "val": 12}  # reports.html CSS


def text_boxes(svg: str) -> list[tuple[str, float, float, float, float]]:
    """``(text, x0, x1, y0, y1)`` of every unrotated ``<text>`` of an SVG, estimated independently of
    reports.svg: 0.6 em per character (0.66 for the bold title), from the baseline up 0.8 em, down 0.25 em."""
    boxes = []
    for attrs, body in TEXT_RE.findall(svg):
        a = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs))
        if "transform" in a:
            continue
        text = html.unescape(body)
        fs = FONT_PX[a.get("class", "tick")]
        w = (0.66 if a.get("class") == "ct" else 0.6) * fs * len(text)
        x, y = float(a["x"]), float(a["y"])
        x0 = {"middle": x - w / 2, "end": x - w}.get(a.get("text-anchor", "start"), x)
        boxes.append((text, x0, x0 + w, y - 0.8 * fs, y + 0.25 * fs))
    return boxes


def assert_labels_apart(svg: str) -> None:
    """No two labels of a chart overlap, and each lies inside the chart's viewBox."""
    width, height = map(float, re.search(r'viewBox="0 0 (\S+) (\S+)"', svg).groups())
    boxes = text_boxes(svg)
    assert boxes
    for t, x0, x1, y0, y1 in boxes:
        assert 0 <= x0 and x1 <= width and 0 <= y0 and y1 <= height, f"{t!r} leaves the chart: {x0:.0f}..{x1:.0f}"
    for i, (t1, a0, a1, b0, b1) in enumerate(boxes):
        for t2, c0, c1, d0, d1 in boxes[i + 1:]:
            assert a1 <= c0 or c1 <= a0 or b1 <= d0 or d1 <= b0, f"labels overlap: {t1!r} and {t2!r}"


def svgs(page: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", page, re.S)


@pytest.mark.parametrize("top", [60, 5_000, 40_000, 3_000_000])
def test_histogram_labels_do_not_overlap_at_any_range(top):
    """Issue 9: range labels such as 16.4K-32.8K ran into each other. Checked on the SVG's own geometry."""
    from dqa.reports.html import ReportInputs, _section_histogram

    rng = np.random.default_rng(1)
    before = (2 ** rng.uniform(0, np.log2(top), 500)).astype(np.int64)
    after = (2 ** rng.uniform(0, np.log2(top), 300)).astype(np.int64)
    inp = ReportInputs(scan_dir=None, summary={}, before_tokens=before, after_tokens=after, after_label="regenerated rows (output tokens)")
    (svg,) = svgs(_section_histogram(inp))
    assert_labels_apart(svg)
    ticks = [t for t, *_ in text_boxes(svg) if re.fullmatch(r"[\d.]+[KM]?", t) and "%" not in t]
    assert "0" in ticks and len(ticks) >= 4  # the axis is still labelled


def test_every_chart_of_a_report_keeps_its_labels_apart_and_ids_on_one_line(cli, defect_scan, tmp_path):
    regen = write_regen_folder(tmp_path / "regen")
    out = tmp_path / "r.html"
    assert cli("report", defect_scan, "--regen", regen, "--out", out).exit_code == 0
    page = out.read_text()
    charts = svgs(page)
    assert len(charts) == 3
    for svg in charts:
        assert_labels_apart(svg)
    # Sample ids never break at their hyphen: each sits in a nowrap span.
    assert ".id{white-space:nowrap}" in page
    assert '<span class="id">s60</span>, <span class="id">s61</span>' in page


def write_two_sessions(folder, gap_s: float = 3600.0, latency: float = 20.0, per_session: int = 60):
    """Shards of a run interrupted after 10 minutes and resumed ``gap_s`` later, for another 10 minutes."""
    from dqa.regen.store.journal import Result, results_table, shard_path, write_table

    rng = np.random.default_rng(7)
    t0 = 1_790_000_000.0
    times = np.concatenate([t0 + latency + np.sort(rng.random(per_session)) * 600,
                            t0 + 600 + gap_s + latency + np.sort(rng.random(per_session)) * 600])
    results = [Result(row=i, sample_id=f"sample-{i:05d}", prompt=np.array([1, 2], np.int32), output=np.ones(500, np.int32),
                      status="ok", finish_reason="stop", error=None, endpoint="http://e", attempts=1, latency_s=latency,
                      model="m", sampling="{}", seed=i, completed_at=float(t)) for i, t in enumerate(times)]
    write_table(shard_path(folder, "s0of1", 0), results_table(results[:per_session]))
    write_table(shard_path(folder, "s0of1", 1), results_table(results[per_session:]))
    return folder, times


def test_an_idle_gap_between_two_runs_is_drawn_as_a_gap_not_as_zero_throughput(cli, defect_scan, tmp_path):
    from dqa.regen.store.shards import shard_rows as read_shards
    from dqa.reports.html import idle_gaps, throughput

    regen, times = write_two_sessions(tmp_path / "regen")
    shards = read_shards(regen)
    xs, tps, done, width = throughput(shards)
    assert xs.count(None) == tps.count(None) == done.count(None) == 1
    cut = xs.index(None)
    gap_from, gap_to = times[59] - times[0], times[60] - 20.0 - times[0]  # last completion -> first request of the resume
    assert idle_gaps(shards) == [pytest.approx((gap_from, gap_to))]
    assert all(x <= gap_from + width for x in xs[:cut]) and all(x >= gap_to for x in xs[cut + 1:])
    assert sum(v for v in tps if v is not None) * width == pytest.approx(120 * 500)
    assert width == pytest.approx((times[59] - times[0] + times[-1] - times[60]) / 40)  # 40 buckets over working time

    out = tmp_path / "r.html"
    assert cli("report", defect_scan, "--regen", regen, "--out", out).exit_code == 0
    page = out.read_text()
    tok_chart = [s for s in svgs(page) if "Output tokens per second" in s][0]
    lines = re.findall(r'<polyline points="([^"]+)"', tok_chart)
    assert len(lines) == 2  # the line breaks at the gap
    (gap_rect,) = re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)" height="[\d.]+" class="gap">', tok_chart)
    g0, g1 = float(gap_rect[0]), float(gap_rect[0]) + float(gap_rect[1])
    points = [tuple(map(float, p.split(","))) for line in lines for p in line.split()]
    assert not [x for x, _ in points if g0 + 1 < x < g1 - 1]  # no point drawn inside the gap
    assert "1 idle gap of 59" in page


def test_a_short_pause_with_requests_in_flight_is_not_a_gap(tmp_path):
    """Long requests keep a quiet stretch inside the run: it is drawn (low throughput), not cut out."""
    from dqa.regen.store.shards import shard_rows as read_shards
    from dqa.reports.html import idle_gaps, throughput

    regen, _ = write_two_sessions(tmp_path / "regen", gap_s=120.0, latency=400.0)
    shards = read_shards(regen)
    assert idle_gaps(shards) == []
    assert None not in throughput(shards)[0]


def test_a_finished_runs_rates_are_shown_even_from_an_older_progress_json(cli, defect_scan, tmp_path):
    """Issue 9 item 6 / issue 11: a finished run showed output tok/s 0 and requests/s (now samples/s) 0 next to a chart full of traffic."""
    regen = write_regen_folder(tmp_path / "regen", rows=120, seconds=600.0)
    p = json.loads((regen / "progress.json").read_text())
    p.update(req_per_s=0.0, output_tok_per_s=0.0)  # what older dqa wrote after a rerun of the finished run
    (regen / "progress.json").write_text(json.dumps(p))
    out = tmp_path / "r.html"
    assert cli("report", defect_scan, "--regen", regen, "--out", out).exit_code == 0
    page = out.read_text()
    row = lambda name: re.search(rf"<tr><th>{re.escape(name)}</th><td>([^<]*)", page).group(1).strip()  # noqa: E731
    assert row("samples/s") == "0.2"  # 120 rows / 600 s of working time
    assert row("output tok/s") == f"{600.0 * 120 / 600:,.4g}"  # mean output tokens x rows / working time
    assert "mean over working time" in page
