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
    """A regen output folder in the real shard format (dqa.regen.journal), three shards, plus progress.json."""
    from dqa import atomic
    from dqa.regen.journal import Result, results_table, shard_path, write_table

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
    assert "regenerated rows (output tokens)" in page and "before (scan)" in page
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
