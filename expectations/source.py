"""Where a validation's metrics table comes from: an existing scan folder, or a fresh scan.

``dqa validate`` and ``dqa gate`` accept either a dataset (scanned here through
``dqa.audit.scan.run_scan``) or a scan folder (a folder holding ``metrics.parquet``, as
``dqa scan`` writes it), which is reused without rescanning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import polars as pl

from dqa.errors import InputError


@dataclass
class ScanFolder:
    """A scan's output: its folder, the metrics table and ``summary.json`` (empty when absent)."""

    path: Path
    metrics: pl.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def dataset(self) -> str:
        """The scanned dataset's path as the scan recorded it (else the folder)."""
        return str(self.summary.get("dataset") or self.path)

    def record(self) -> dict[str, Any]:
        """What a validation or gate made from this scan records about it (``identity.scan_record``)."""
        from dqa.audit.identity import scan_record

        return scan_record(self.path, self.summary)


def is_scan_folder(path: str | Path) -> bool:
    """True when ``path`` is a folder holding ``metrics.parquet``."""
    p = Path(path)
    return p.is_dir() and (p / "metrics.parquet").is_file()


def load_scan_folder(path: str | Path) -> ScanFolder:
    """Read ``metrics.parquet`` and ``summary.json`` of a scan folder.

    Raises ``InputError`` naming the file when it is missing or unreadable.
    """
    p = Path(path)
    mfile = p / "metrics.parquet"
    if not mfile.is_file():
        raise InputError(f"{mfile}: no such file (expected a scan folder written by `dqa scan`)")
    try:
        metrics = pl.read_parquet(mfile)
    except Exception as exc:  # polars raises ComputeError / OSError variants for bad parquet
        raise InputError(f"{mfile}: not a readable parquet file ({' '.join(str(exc).split())[:200]})") from None
    if "row" not in metrics.columns:
        raise InputError(f"{mfile}: no 'row' column (expected the metrics table of `dqa scan`)")
    check_metrics_table(metrics, mfile)
    summary: dict[str, Any] = {}
    sfile = p / "summary.json"
    if sfile.is_file():
        try:
            summary = json.loads(sfile.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{sfile}: not valid JSON ({exc})") from None
    return ScanFolder(path=p, metrics=metrics, summary=summary)


def check_metrics_table(metrics: pl.DataFrame, mfile: Path) -> None:
    """Refuse a metrics table that is not what `dqa scan` writes (FORMATS.md) before any suite runs.

    A damaged table would otherwise read as a quality failure (exit 1) with NaN statistics.
    Raises ``InputError`` naming the file and the column (and row) for: no rows, a missing
    per-sample metric column, a column of the wrong type, or a null value.
    """
    from dqa.audit.metrics_schema import metrics_table_schema

    if metrics.height == 0:
        raise InputError(f"{mfile}: no rows (an empty metrics table)")
    schema = metrics_table_schema()  # the kernel's metrics, set-level context, verdicts: names and types
    for m in schema.values():
        if m.kind == "kernel" and m.name not in metrics.columns:
            raise InputError(f"{mfile}: no column {m.name!r} (expected the metrics table of `dqa scan`, see FORMATS.md)")
    for name in ("row", *schema):
        if name not in metrics.columns:
            continue
        want_type = pl.Int64 if name == "row" else schema[name].dtype
        dtype = metrics.schema[name]
        if want_type == pl.Boolean:
            ok, want = dtype == pl.Boolean, "booleans"
        elif want_type.is_float():
            ok, want = dtype.is_numeric(), "numbers"
        elif want_type.is_integer():
            ok, want = dtype.is_integer(), "integers"
        else:
            ok, want = dtype == want_type, f"{want_type} values"
        if not ok:
            raise InputError(f"{mfile}: column {name!r} must hold {want}, found {dtype}")
        if name != "row" and schema[name].nullable:
            continue
        nulls = metrics.get_column(name).is_null()
        if nulls.any():
            raise InputError(f"{mfile}: column {name!r}, row {int(nulls.arg_max())}: null (expected {want})")


def obtain_scan(
    target: str | Path,
    metrics_dir: str | Path | None = None,
    scan_out: str | Path | None = None,
    tokenizer: str | None = None,
    thinking: str = "auto",
    progress: Callable[[int, int], None] | None = None,
) -> ScanFolder:
    """The metrics for ``target``: ``metrics_dir`` if given, ``target`` itself if it is a scan
    folder, otherwise the scan in ``scan_out`` (default ``dqa.audit.scan.default_out_dir``):
    reused when it was made from the same, unchanged files with the same options, else made
    afresh with ``run_scan(target)``.

    Raises ``InputError`` for a missing target or unreadable input (from the scan too), for a
    ``scan_out`` holding another dataset's scan, and for a ``metrics_dir`` whose scan records
    another dataset than ``target`` or files of ``target`` that changed since (``check_metrics_of``).
    """
    if metrics_dir is not None:
        scan = load_scan_folder(metrics_dir)
        if target is not None and Path(target).resolve() != Path(metrics_dir).resolve():
            check_metrics_of(scan, target)
        return scan
    t = Path(target)
    if is_scan_folder(t):
        return load_scan_folder(t)
    if not t.exists():
        raise InputError(f"{t}: no such dataset or scan folder")
    from dqa.audit import identity
    from dqa.audit.scan import ScanOptions, default_out_dir, reusable_scan, run_scan

    out = Path(scan_out) if scan_out is not None else default_out_dir(t)
    identity.check_scan_folder(out, t, identity.read_summary(out), "--scan-out")
    options = ScanOptions(tokenizer=tokenizer, thinking=thinking)
    if reusable_scan(t, out, options):
        return load_scan_folder(out)
    result = run_scan(t, out, options, progress=progress)
    return ScanFolder(path=result.out_dir, metrics=result.metrics, summary=result.summary)


def check_metrics_of(scan: ScanFolder, target: str | Path) -> None:
    """Refuse ``scan`` (given as ``--metrics``) as the metrics of ``target``.

    ``target`` a dataset: refused when the scan records another dataset, or files of this one
    that changed since the scan. ``target`` a scan folder: refused when the two scans record
    different datasets. Scans that record no dataset are accepted. Raises ``InputError`` naming
    both and the fix.
    """
    from dqa.audit import identity

    t = Path(target)
    if is_scan_folder(t):
        theirs, mine = identity.recorded_dataset(scan.summary), identity.recorded_dataset(identity.read_summary(t))
        if theirs and mine and theirs != mine:
            raise InputError(f"--metrics {scan.path}: the scan of {theirs}, but {t} is the scan of {mine}: pass one of them")
        return
    if not t.exists():
        raise InputError(f"{t}: no such dataset or scan folder")
    identity.check_scan_of(scan.path, scan.summary or None, t, "metrics", "--metrics DIR")
