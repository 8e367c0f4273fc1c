"""What the kernel pass of a scan becomes: the set-level checks applied to its tables, the summary, and the
scan folder's files written (``write_results``, called by ``dqa.audit.scan.run_scan``).

This is the part of a scan that needs polars. ``run_scan`` imports it while the workers scan
(``executors.scan_parts``'s ``meanwhile``), so that polars' import overlaps their pass.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from dqa import atomic
from dqa.audit import checks as checks_mod
from dqa.audit import identity, metrics_schema
from dqa.audit.conventions import detect_conventions
from dqa.audit.cuts import truncation_cuts
from dqa.audit.readers import Dataset
from dqa.audit.scan_folder import FINDINGS_FILE, METRICS_FILE, SUMMARY_FILE, SUMMARY_MD_FILE, TURNS_FILE
from dqa.audit.scan_options import ScanOptions
from dqa.audit.template import TemplateSpec

TOP_TEMPLATES = 10
TEMPLATE_DECODE_MAX_TOKENS = 256
TURNS_FILE_ROWS = 65536  # turns per row group of turns.parquet


def write_results(ds: Dataset, spec: TemplateSpec, options: ScanOptions, selected: list[str],
                  params: dict[str, dict[str, Any]], metrics: pl.DataFrame, turns: pl.DataFrame, rows: int, tokens: int,
                  work: Path, t0: float, fingerprint: dict[str, Any]) -> tuple[dict[str, Any], pl.DataFrame, pl.DataFrame]:
    """Apply the checks to the kernel pass's tables (``executors.scan_parts``' ``metrics`` and ``turns``) and
    write the scan files into ``work``; return ``(summary, metrics, findings)``. ``t0``: when the scan started
    (``summary["elapsed_s"]``); ``fingerprint``: ``scan.scan_fingerprint``'s, recorded in the summary."""
    conventions = detect_conventions(metrics, spec)
    metrics = checks_mod.prepare(set_aside_trained_headers(metrics, conventions))
    turns = checks_mod.prepare_turns(turns)
    if options.thinking == "auto":
        expected, share = checks_mod.infer_thinking(metrics, float(params["scan"]["thinking_min_share"]))
    else:
        expected, share = options.thinking == "expected", checks_mod.infer_thinking(metrics, 0.0)[1]
    ctx = checks_mod.Context(rows=rows, thinking_expected=expected, params=params)
    turns = checks_mod.evaluate_turns(turns, ctx, selected)
    metrics = checks_mod.evaluate(metrics, ctx, selected, turns)
    id_cols = ["id"] if "id" in metrics.columns else []
    findings = checks_mod.with_reasons(metrics.filter(pl.col("failed")), checks_mod.CHECK_NAMES).select(
        "row", *id_cols, "reasons", "turns"
    )
    metrics = metrics.drop("turns")  # the flagged turns' indices live in findings.parquet
    summary = _summary(ds, metrics, findings, spec, ctx, share, options, selected, tokens, time.perf_counter() - t0, turns,
                       conventions)
    summary["fingerprint"] = fingerprint
    summary["truncation_cuts"] = truncation_cuts(metrics, turns, ctx.params) if "truncated" in selected else []
    # The tables are written (native code that releases the GIL, a fraction of a second) while this thread reads
    # the degenerate templates' rows back from the dataset and decodes them: that read can be long (JSONL is read
    # from the start), and here Ctrl-C still stops it.
    with ThreadPoolExecutor(1, thread_name_prefix="dqa-write") as pool:
        written = pool.submit(_write_tables, metrics, turns, findings, id_cols, work)
        summary["degenerate_templates"] = _templates(metrics, turns, ds, spec, options.batch_rows, rows)
        written.result()
    from dqa.audit.scan_markdown import render_scan_markdown

    atomic.write_json(work / SUMMARY_FILE, summary)
    atomic.write_text(work / SUMMARY_MD_FILE, render_scan_markdown(summary))
    return summary, metrics, findings


def _write_tables(metrics: pl.DataFrame, turns: pl.DataFrame, findings: pl.DataFrame, id_cols: list[str],
                  work: Path) -> None:
    """Write ``metrics.parquet``, ``turns.parquet`` and ``findings.parquet`` into ``work``."""
    metrics.write_parquet(work / METRICS_FILE, compression="zstd")
    write_turns(turns, metrics["id"] if id_cols else None, work / TURNS_FILE)
    findings.write_parquet(work / FINDINGS_FILE, compression="zstd")


def write_turns(turns: pl.DataFrame, ids: pl.Series | None, path: Path) -> None:
    """Write ``turns.parquet`` (FORMATS.md): one row per trained assistant turn, the per-turn metrics
    (``metrics_schema.TURN_METRICS``), ``id`` after ``row`` when the dataset has ids (``ids``: the
    metrics table's id column, indexed by row), and ``reasons``: the checks that flag the turn.

    ``turns`` is ``checks.evaluate_turns``'s output; it is written in row groups of ``TURNS_FILE_ROWS`` turns,
    by one polars write that compresses the columns on every core (a row group at a time through pyarrow took
    2-3x as long). Its memory: the reasons lists (an offset per turn, a few strings per flagged turn) and the
    ids gathered per turn (their length times the turns), beside a turns table of ~20 8-byte columns.
    """
    cols = [m.name for m in metrics_schema.TURN_METRICS]
    frame = checks_mod.with_reasons(turns, checks_mod.TURN_CHECKS).select(
        *[pl.col(c).cast(metrics_schema.TURN[c].dtype) for c in cols], "reasons"
    )
    if ids is not None:  # the metrics table holds row r at position r
        frame.insert_column(1, ids.gather(frame["row"]).alias("id"))
    frame.write_parquet(path, compression="zstd", row_group_size=TURNS_FILE_ROWS)


def _supervised_tokens_of(ds: Dataset, wanted: dict[int, tuple[int, int] | None], batch_rows: int) -> dict[int, np.ndarray]:
    """Supervised token ids of a few rows (reading only the parts of the dataset that hold them):
    ``wanted[row]`` is a span ``(start, end)`` of offsets in the row (a turn's region), or None for the whole row."""
    found: dict[int, np.ndarray] = {}
    want = np.array(sorted(wanted), dtype=np.int64)
    for batch in ds.batches_with_rows(want, batch_rows):
        lo, hi = batch.start_row, batch.start_row + batch.num_rows
        for row in want[(want >= lo) & (want < hi)]:  # at most TOP_TEMPLATES rows
            r = int(row) - lo
            a, b = int(batch.offsets[r]), int(batch.offsets[r + 1])
            span = wanted[int(row)]
            if span is not None:
                a, b = a + span[0], min(a + span[1], b)
            found[int(row)] = batch.ids[a:b][batch.mask[a:b].view(bool)]
    return found


def _distribution(values: pl.Series) -> dict[str, Any]:
    if values.len() == 0:
        return {"mean": 0.0, "histogram": {"edges": [], "counts": []}}
    qs = {f"p{int(q * 100):02d}": float(values.quantile(q, "nearest")) for q in (0.01, 0.10, 0.50, 0.90, 0.99)}
    top = int(values.max())  # type: ignore[arg-type]
    edges = [0, 1] + [2**k for k in range(1, max(1, math.ceil(math.log2(top + 1))) + 1)]
    counts = np.histogram(values.to_numpy(), bins=edges + [edges[-1] * 2])[0].tolist()
    return {
        "mean": float(values.mean()),  # type: ignore[arg-type]
        "min": int(values.min()),  # type: ignore[arg-type]
        **qs,
        "max": top,
        "histogram": {"edges": edges + [edges[-1] * 2], "counts": counts},
    }


def _templates(metrics: pl.DataFrame, turns: pl.DataFrame, ds: Dataset, spec: TemplateSpec, batch_rows: int, rows: int) -> list[dict[str, Any]]:
    """The most common degenerate templates, decoded as trained: the flagged turns grouped by their
    supervised hash (``count`` turns in ``samples`` samples), and the samples flagged as a whole with
    no flagged turn (samples without assistant turns) grouped by theirs."""
    by_turn = (
        turns.filter(pl.col("degenerate_template"))
        .sort("row", "turn")
        .group_by("supervised_hash")
        .agg(
            pl.len().alias("count"),
            pl.col("row").n_unique().alias("samples"),
            pl.col("row").first().alias("example_row"),
            pl.col("turn").first().cast(pl.Int64).alias("example_turn"),
            pl.col("span_start").first().alias("span_start"),
            pl.col("span_end").first().alias("span_end"),
            pl.col("supervised_tokens").first().alias("tokens"),
        )
    )
    whole = (
        metrics.filter(pl.col("degenerate_template") & ~pl.col("row").is_in(turns.filter(pl.col("degenerate_template"))["row"].implode()))
        .group_by("supervised_hash")
        .agg(
            pl.len().alias("count"),
            pl.len().alias("samples"),
            pl.col("row").min().alias("example_row"),
            pl.lit(None, dtype=pl.Int64).alias("example_turn"),
            pl.lit(None, dtype=pl.Int64).alias("span_start"),
            pl.lit(None, dtype=pl.Int64).alias("span_end"),
            pl.col("supervised_tokens").first().alias("tokens"),
        )
    )
    groups = (
        pl.concat([by_turn.cast(whole.schema), whole], how="vertical")
        .sort(["count", "example_row"], descending=[True, False])
        .head(TOP_TEMPLATES)
    )
    if groups.height == 0:
        return []
    wanted: dict[int, tuple[int, int] | None] = {}
    for g in groups.iter_rows(named=True):  # at most TOP_TEMPLATES groups
        span = None if g["span_start"] is None else (int(g["span_start"]), int(g["span_end"]))
        wanted.setdefault(int(g["example_row"]), span)
    found = _supervised_tokens_of(ds, wanted, batch_rows)
    out = []
    for g in groups.iter_rows(named=True):
        ids = found.get(g["example_row"], np.zeros(0, dtype=np.int32))
        if g["span_start"] is not None and wanted[int(g["example_row"])] != (g["span_start"], g["span_end"]):
            ids = _supervised_tokens_of(ds, {int(g["example_row"]): (int(g["span_start"]), int(g["span_end"]))}, batch_rows)[int(g["example_row"])]
        text = spec.decode(ids[:TEMPLATE_DECODE_MAX_TOKENS].tolist())
        if len(ids) > TEMPLATE_DECODE_MAX_TOKENS:
            text += "…"
        out.append(
            {
                "text": text,
                "tokens": int(g["tokens"]),
                "count": int(g["count"]),
                "samples": int(g["samples"]),
                "share": g["samples"] / rows if rows else 0.0,
                "supervised_hash": int(g["supervised_hash"]),
                "example_row": int(g["example_row"]),
                "example_turn": None if g["example_turn"] is None else int(g["example_turn"]),
            }
        )
    return out


def set_aside_trained_headers(metrics: pl.DataFrame, conventions: dict[str, Any]) -> pl.DataFrame:
    """``metrics`` with the trained assistant-header tokens taken out of ``misaligned_tokens`` when the set trains
    its headers (``conventions["header_trained"]``: at least half the samples with a trained turn train its header,
    as TRL's DeepSeek V3 template trains ``<｜Assistant｜>``): then a trained header is the set's convention, not a
    masking bug. A header trained in a few samples only stays misaligned (``mask_misaligned``)."""
    if conventions.get("header_trained") and "header_trained_tokens" in metrics.columns:
        return metrics.with_columns(pl.col("misaligned_tokens") - pl.col("header_trained_tokens"))
    return metrics


def _summary(
    ds: Dataset,
    metrics: pl.DataFrame,
    findings: pl.DataFrame,
    spec: TemplateSpec,
    ctx: checks_mod.Context,
    thinking_share: float,
    options: ScanOptions,
    selected: list[str],
    tokens: int,
    elapsed: float,
    turns: pl.DataFrame | None = None,
    conventions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    rows = metrics.height
    counts = metrics.select([pl.col(n).sum().alias(n) for n in checks_mod.CHECK_NAMES]).row(0, named=True)
    turn_counts: dict[str, int] = {}
    if turns is not None and turns.height:
        turn_counts = turns.select([pl.col(n).sum().alias(n) for n in checks_mod.TURN_CHECKS]).row(0, named=True)
    primary = dict(metrics["primary_reason"].drop_nulls().value_counts().iter_rows())
    checks = {
        c.name: {
            "count": int(counts[c.name]),
            "share": counts[c.name] / rows,
            "primary": int(primary.get(c.name, 0)),
            # flagged trained turns; None for a check that judges whole samples
            "turns": None if c.turn_rule is None else int(turn_counts.get(c.name, 0)),
            "enabled": c.name in selected,
            "label": c.label,
            "flags_when": c.flags_when,
        }
        for c in checks_mod.CHECKS
    }
    return {
        "dataset": str(ds.path),
        "dataset_path": identity.dataset_path(ds.path),
        "format": ds.format,
        "convention": ds.columns.convention,
        "columns": {"ids": ds.columns.ids, "supervision": ds.columns.supervision, "id": ds.columns.id},
        "template": spec.name,
        "rows": rows,
        "tokens": tokens,
        "supervised_tokens": int(metrics["supervised_tokens"].sum()),
        "turns": 0 if turns is None else turns.height,  # trained assistant turns
        "multi_turn": bool((metrics["trained_turns"] >= 2).any()) if "trained_turns" in metrics.columns else False,
        "failing_rows": findings.height,
        "failing_share": findings.height / rows,
        "thinking_expected": ctx.thinking_expected,
        "thinking_inferred": options.thinking == "auto",
        "thinking_share": thinking_share,
        "checks": checks,
        "conventions": conventions if conventions is not None else detect_conventions(metrics, spec),
        "degenerate_templates": [],
        "supervised_tokens_distribution": _distribution(metrics["supervised_tokens"]),
        "params": ctx.params,
        "elapsed_s": round(elapsed, 3),
    }
