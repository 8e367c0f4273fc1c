"""``run_scan``: stream a dataset through the kernels, apply the checks, write the scan folder.

Output (FORMATS.md; the names are ``dqa.audit.scan_folder``'s): ``metrics.parquet`` (one row
per sample), ``turns.parquet`` (one row per trained assistant turn), ``findings.parquet``,
``summary.json``, ``summary.md``. Everything is built in a temporary sibling folder and moved
into place only when the scan succeeded, so a failed or interrupted scan never leaves output
that looks complete.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from dqa import atomic
from dqa.memory import reuse_freed_memory
from dqa.audit import checks as checks_mod
from dqa.audit import identity, metrics_schema
from dqa.audit.cuts import truncation_cuts
from dqa.audit.conventions import detect_conventions
from dqa.audit.kernels import KernelTables
from dqa.audit.readers import Dataset, open_dataset
from dqa.audit.scan_options import DEFAULT_BATCH_ROWS, ScanOptions  # noqa: F401 (re-exported: dqa.audit.scan.ScanOptions)
from dqa.audit.scan_folder import (
    FINDINGS_FILE, METRICS_FILE, SCAN_FILES, SUMMARY_FILE, SUMMARY_MD_FILE, TURNS_FILE, is_scan_folder, read_summary,
)
from dqa.audit.scan_workers import read_parts, scan_parts
from dqa.audit.template import TemplateSpec, load_template
from dqa.errors import InputError

TOP_TEMPLATES = 10
TEMPLATE_DECODE_MAX_TOKENS = 256


@dataclass
class ScanResult:
    """What a scan produced: the output folder, the summary dict, the two tables, and the names of the
    previous scan's validation/gate/report outputs it removed from the folder (``dropped``)."""

    out_dir: Path
    summary: dict[str, Any]
    metrics: pl.DataFrame
    findings: pl.DataFrame
    dropped: list[str] = field(default_factory=list)  # outputs of the previous scan this rescan removed


ProgressFn = Callable[[int, int], None]  # (rows done so far, tokens done so far)


TURNS_FILE_ROWS = 65536  # turns per row group of turns.parquet


def default_out_dir(dataset: str | Path) -> Path:
    """The scan folder of ``dataset`` by default, keyed by its identity (``dqa.audit.identity``).

    ``dqa-out/<dataset name>/`` (``train.v2.parquet`` -> ``dqa-out/train.v2/``) unless that folder
    holds the scan of another dataset of the same name; then ``dqa-out/<parent>-<name>/``
    (``release/example.parquet`` -> ``dqa-out/release-example/``), then ``dqa-out/<name>-<hash>/``.
    A folder already holding this dataset's scan is preferred. Never raises.
    """
    return identity.default_scan_dir(dataset)


def scan_fingerprint(ds: Dataset, options: ScanOptions) -> dict[str, Any]:
    """What a scan's result depends on: every input file (name, size, mtime) and the options.

    Two scans with equal fingerprints give equal results, so a stored scan can be reused.
    """
    files = identity.files_fingerprint(ds.files)
    # An option at its default is left out, so scans made before the option existed stay reusable.
    # batch_rows and workers change how the work is cut, never what it finds.
    opts = {k: v for k, v in asdict(options).items() if k not in ("batch_rows", "workers") and not (k == "last_turn_only" and not v)}
    return {"files": files, "options": json.loads(json.dumps(opts, sort_keys=True, default=str))}


def reusable_scan(dataset: str | Path, out_dir: str | Path, options: ScanOptions | None = None) -> bool:
    """True when ``out_dir`` holds a scan of ``dataset`` with these options and unchanged input files."""
    out = Path(out_dir)
    if not is_scan_folder(out):
        return False
    try:
        stored = json.loads((out / SUMMARY_FILE).read_text()).get("fingerprint")
        options = options or ScanOptions()
        ds = open_dataset(dataset, options.ids_column, options.mask_column, options.labels_column, options.id_column)
        return stored == scan_fingerprint(ds, options)
    except (OSError, ValueError, InputError):
        return False


def _selected_checks(options: ScanOptions) -> list[str]:
    """The checks to run: ``only`` (default all) minus ``skip``; may be empty."""
    only = options.only or list(checks_mod.CHECK_NAMES)
    for name in [*only, *options.skip]:
        if name not in checks_mod.BY_NAME:
            raise InputError(f"unknown check {name!r} (known: {', '.join(checks_mod.CHECK_NAMES)})")
    return [n for n in only if n not in set(options.skip)]


def write_turns(turns: pl.DataFrame, ids: pl.Series | None, path: Path) -> None:
    """Write ``turns.parquet`` (FORMATS.md): one row per trained assistant turn, the per-turn metrics
    (``metrics_schema.TURN_METRICS``), ``id`` after ``row`` when the dataset has ids (``ids``: the
    metrics table's id column, indexed by row), and ``reasons``: the checks that flag the turn.

    ``turns`` is ``checks.evaluate_turns``'s output; it is written in row groups of ``TURNS_FILE_ROWS`` turns.
    The reasons lists cost little beside the table they join (one list per distinct combination of checks,
    see ``checks.with_reasons``), and one polars write compresses the columns on every core: writing the
    table a row group at a time through pyarrow took 2-3x as long.
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


def run_scan(
    dataset: str | Path | Dataset,
    out_dir: str | Path | None = None,
    options: ScanOptions | None = None,
    progress: ProgressFn | None = None,
) -> ScanResult:
    """Scan ``dataset`` and write the scan folder to ``out_dir`` (default ``default_out_dir``).

    ``dataset`` is a path (a file or folder ``open_dataset`` reads) or an opened ``Dataset``
    (``dqa.audit.table_reader.open_table``: a table in memory; its column options are the ones
    it was opened with, and ``out_dir`` should be given).

    A folder holding another dataset's scan is refused; a rescan of the same dataset replaces
    the scan files, keeps what other commands put in the folder, and drops the validation,
    gate and report outputs of the previous scan when this one differs from it (other files
    or options): see ``dqa.audit.identity``.

    Returns a ``ScanResult``. Raises ``InputError`` for unreadable or malformed
    input or a folder holding another dataset's scan (nothing is written then) and
    ``OSError`` for output failures.
    """
    options = options or ScanOptions()
    t0 = time.perf_counter()
    reuse_freed_memory()
    selected = _selected_checks(options)
    params = checks_mod.default_params()
    checks_mod.apply_overrides(params, options.overrides, "config")
    if options.thinking not in ("auto", "expected", "off"):
        raise InputError(f"--thinking {options.thinking!r}: expected auto, expected or off")

    workers = 1 if options.workers is None else options.workers
    if workers < 1:
        raise InputError(f"--workers {workers}: expected at least 1")
    if isinstance(dataset, Dataset):  # opened already: an in-memory table (dqa.audit.table_reader), named by its label
        ds, dataset = dataset, dataset.path
    else:
        ds = open_dataset(dataset, options.ids_column, options.mask_column, options.labels_column, options.id_column)
    spec = load_template(options.tokenizer)
    ds.set_chat_format(spec, options.last_turn_only)  # conversation JSONL is rendered and masked with it
    tables = KernelTables.build(spec)
    out = Path(out_dir) if out_dir is not None else default_out_dir(dataset)
    atomic.check_output_dir(out, [Path(dataset)], is_scan_folder, "dqa scan folder")
    previous = read_summary(out) if is_scan_folder(out) else None
    identity.check_scan_folder(out, dataset, previous)
    fingerprint = scan_fingerprint(ds, options)
    # Outputs made from the previous scan stay only when this scan is the same one (same files, options).
    dropped = [] if previous is None or previous.get("fingerprint") == fingerprint else identity.derived_outputs(out)
    work = atomic.make_work_dir(out)
    try:
        parts, rows, tokens = scan_parts(ds, tables, work, options.batch_rows, progress, workers)
        if rows == 0:
            raise InputError(f"{dataset}: no rows (an empty dataset)")
        metrics = read_parts([m for m, _ in parts])
        conventions = detect_conventions(metrics, spec)
        metrics = checks_mod.prepare(set_aside_trained_headers(metrics, conventions))
        turns = checks_mod.prepare_turns(read_parts([t for _, t in parts]))
        for pair in parts:
            for f in pair:
                f.unlink()
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
        summary["degenerate_templates"] = _templates(metrics, turns, ds, spec, options.batch_rows, rows)
        metrics.write_parquet(work / METRICS_FILE, compression="zstd")
        write_turns(turns, metrics["id"] if id_cols else None, work / TURNS_FILE)
        findings.write_parquet(work / FINDINGS_FILE, compression="zstd")
        from dqa.reports.scan_markdown import render_scan_markdown

        atomic.write_json(work / SUMMARY_FILE, summary)
        atomic.write_text(work / SUMMARY_MD_FILE, render_scan_markdown(summary))
        # validate/gate/report outputs that live in the scan folder survive a rescan that gives the same scan.
        atomic.replace_dir(work, out, keep=lambda name: name not in SCAN_FILES and name not in dropped
                           and not name.startswith(atomic.TMP_PREFIX))
    except OSError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise atomic.named_os_error(exc, out) from exc
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return ScanResult(out_dir=out, summary=summary, metrics=metrics, findings=findings, dropped=dropped)


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
