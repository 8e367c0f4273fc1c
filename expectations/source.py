"""Where a validation's metrics table comes from: an existing scan folder, or a fresh scan.

``dqa validate`` and ``dqa gate`` accept either a dataset (scanned here through
``dqa.audit.scan.run_scan``) or a scan folder (``dqa.audit.scan_folder``: ``summary.json`` and
``metrics.parquet``, as ``dqa scan`` writes them), which is reused without rescanning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from dqa.audit.scan_folder import SUMMARY_FILE, ScanFolder, is_scan_folder, load_scan_folder, read_summary
from dqa.errors import InputError


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
    from dqa.storage import local_if_written, location, url_of

    if metrics_dir is not None:
        scan = load_scan_folder(local_if_written(metrics_dir, (SUMMARY_FILE,)))  # type: ignore[arg-type]
        if target is not None and url_of(target) != url_of(metrics_dir):
            check_metrics_of(scan, target)
        return scan
    t = location(local_if_written(target, (SUMMARY_FILE,)))  # type: ignore[arg-type]  # a store's scan folder: a local copy
    if is_scan_folder(t):
        return load_scan_folder(t)
    if not t.exists():
        raise InputError(f"{t}: no such dataset or scan folder")
    from dqa.audit import identity
    from dqa.audit.scan import ScanOptions, default_out_dir, reusable_scan, run_scan

    if scan_out is not None and "://" in str(scan_out):  # a scan folder in a store: always scanned afresh there
        result = run_scan(t, scan_out, ScanOptions(tokenizer=tokenizer, thinking=thinking), progress=progress)
        return ScanFolder(path=local_if_written(scan_out, (SUMMARY_FILE,)), metrics=result.metrics, summary=result.summary)  # type: ignore[arg-type]
    out = Path(scan_out) if scan_out is not None else default_out_dir(t)
    identity.check_scan_folder(out, t, read_summary(out), "--scan-out")
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
        theirs, mine = identity.recorded_dataset(scan.summary), identity.recorded_dataset(read_summary(t))
        if theirs and mine and theirs != mine:
            raise InputError(f"--metrics {scan.path}: the scan of {theirs}, but {t} is the scan of {mine}: pass one of them")
        return
    if not t.exists():
        raise InputError(f"{t}: no such dataset or scan folder")
    identity.check_scan_of(scan.path, scan.summary or None, t, "metrics", "--metrics DIR")
