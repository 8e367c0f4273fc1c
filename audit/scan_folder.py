"""The scan folder: the names of the files ``dqa scan`` writes, and the readers of them.

A scan folder (FORMATS.md) holds ``metrics.parquet`` (one row per sample), ``turns.parquet``
(one row per trained assistant turn), ``findings.parquet`` (the failing rows), ``summary.json``
and ``summary.md``; other commands add their outputs beside them (``validation-*/``, ``gate/``,
``report.html``). Every room that reads a scan (validate, gate, report, plan, regen, merge)
names its files and finds its findings through this module; the writer is
``dqa.audit.scan.run_scan``. Importing it is cheap: polars loads only when a table is read.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from dqa.errors import InputError

if TYPE_CHECKING:
    import polars as pl

METRICS_FILE = "metrics.parquet"
TURNS_FILE = "turns.parquet"
FINDINGS_FILE = "findings.parquet"
SUMMARY_FILE = "summary.json"
SUMMARY_MD_FILE = "summary.md"
SCAN_FILES = (METRICS_FILE, TURNS_FILE, FINDINGS_FILE, SUMMARY_FILE, SUMMARY_MD_FILE)


@contextlib.contextmanager
def writing(target: "str | Path") -> Iterator[Path]:
    """The local folder to write the scan folder ``target`` in: ``target`` itself, or for a URL a staging
    folder published when the block ends, ``summary.json`` last (``dqa.storage.output_folder``). A store's
    ``OSError`` inside the block is raised as its one-line error (``dqa.storage.faults``)."""
    from dqa.storage import output_folder
    from dqa.storage.faults import is_store_error, store_error

    try:
        with output_folder(target, SUMMARY_FILE) as local:
            yield local
    except OSError as exc:
        if is_store_error(exc):
            raise store_error(exc, str(target)) from None
        raise


def shown(target: "str | Path", local: Path) -> Any:
    """What a scan written through ``writing(target)`` is called: ``local``, or the ``StorePath`` of a URL."""
    from dqa.storage import is_url, location

    return location(target) if is_url(target) else local


def is_store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` came from a store (to be left for ``writing`` to report), not from the local disk."""
    from dqa.storage.faults import is_store_error

    return is_store_error(exc)


def is_scan_folder(path: str | Path) -> bool:
    """True when ``path`` holds a scan's ``summary.json`` and ``metrics.parquet`` (both are always
    written by ``dqa scan``, and moved into place together)."""
    from dqa.storage import location

    p = location(path)  # a dataset in a store is never a scan folder of this machine's, but may be asked about
    return (p / SUMMARY_FILE).is_file() and (p / METRICS_FILE).is_file()


def findings_file(path: str | Path) -> Path:
    """The findings file ``path`` names: ``findings.parquet`` inside it when it is a folder, else
    ``path`` itself (a findings file given directly). Never raises; the file may not exist."""
    p = Path(path)
    return p / FINDINGS_FILE if p.is_dir() else p


def scan_folder_of(findings: str | Path) -> Path:
    """The folder a findings path belongs to: ``findings`` itself when it is a folder, else the
    folder holding the findings file. Never raises."""
    p = Path(findings)
    return p if p.is_dir() else p.parent


def read_summary(folder: str | Path) -> dict[str, Any] | None:
    """``folder/summary.json`` as a dict; None when it is absent or not a readable JSON object."""
    from dqa.storage import location

    f = location(folder) / SUMMARY_FILE  # a folder in a store: summary.json read from it
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError, InputError):  # InputError: a store's "no such object"
        return None
    return data if isinstance(data, dict) else None


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


def load_scan_folder(path: str | Path) -> ScanFolder:
    """Read ``metrics.parquet`` and ``summary.json`` of a scan folder.

    Returns a ``ScanFolder`` (``summary`` empty when the folder has no ``summary.json``). Raises
    ``InputError`` naming the file when ``metrics.parquet`` is missing, unreadable or not the
    metrics table of ``dqa scan`` (``check_metrics_table``), or ``summary.json`` is not JSON.
    """
    import polars as pl

    p = Path(path)
    mfile = p / METRICS_FILE
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
    sfile = p / SUMMARY_FILE
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
    import polars as pl

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
