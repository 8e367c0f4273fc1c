"""``dqa.scan``: audit a tokenized set from Python, on disk or in memory; what ``dqa scan`` runs.

Right after tokenizing (SpecForge's ``build_eagle3_dataset``, a TRL ``SFTTrainer`` dataset), before
hidden states are extracted or a GPU is rented::

    result = dqa.scan(ds, tokenizer="qwen3")          # ds: a datasets.Dataset in memory
    result.summary["failing_share"], result.findings  # the scan folder's summary and findings
    clean = ds.select(np.flatnonzero(result.mask))    # keep the passing rows (one indices mapping)

``ds.filter(lambda _, i: result.mask[i], with_indices=True)`` keeps the same rows, calling Python once
per row; ``select`` is the fast way.

A path is scanned as ``dqa scan`` scans it, into its scan folder (``out``, default
``dqa-out/<name>/``). A table in memory (``dqa.api.inputs``) is read through
``dqa.audit.table_reader`` (no copy of it is written); its scan folder is written to ``out`` when
given, else to a temporary folder that is removed before ``scan`` returns (the result holds the
tables). The findings are the ones ``dqa scan`` gives for the same rows in a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from dqa.audit import scan_folder
from dqa.errors import UsageError

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

    from dqa.audit.scan import ScanOptions



@dataclass
class ScanResult:
    """What ``scan`` found.

    ``summary``: the scan folder's ``summary.json`` as a dict; ``findings``: its failing rows
    (``row``, ``id`` when the set has one, ``reasons``, ``turns``); ``metrics``: one row of
    per-sample numbers per row; ``turns``: one row per trained assistant turn (read from the
    folder when first asked for, unless the scan ran in a temporary folder); ``mask``: one bool
    per row, True where the row passes. ``out_dir`` is the scan folder (None when it was
    temporary); ``dropped`` names the previous scan's validation/gate/report outputs a rescan removed.
    """

    summary: dict[str, Any]
    findings: "pl.DataFrame"
    metrics: "pl.DataFrame"
    out_dir: Path | None = None
    dropped: list[str] = field(default_factory=list)
    turns_table: "pl.DataFrame | None" = field(default=None, repr=False)

    @property
    def turns(self) -> "pl.DataFrame":
        """The scan folder's ``turns.parquet`` (row, turn, the per-turn metrics, reasons)."""
        if self.turns_table is None:
            import polars as pl

            from dqa.storage import input_folder

            folder = input_folder(self.out_dir, scan_folder.SUMMARY_FILE)  # type: ignore[arg-type]  # a store's: a local copy
            self.turns_table = pl.read_parquet(folder / scan_folder.TURNS_FILE)
        return self.turns_table

    @property
    def mask(self) -> "np.ndarray":
        """A boolean numpy array, one per row in dataset order: True where no check flags the row."""
        import numpy as np

        keep = np.ones(int(self.summary["rows"]), dtype=bool)
        keep[self.findings["row"].to_numpy()] = False
        return keep

    @property
    def failing_share(self) -> float:
        """The share of rows some check flags (``summary["failing_share"]``)."""
        return float(self.summary["failing_share"])


def scan(
    data: Any,
    tokenizer: str | None = None,
    *,
    out: str | Path | None = None,
    checks: Iterable[str] | str | None = None,
    skip: Iterable[str] | str | None = None,
    config: str | Path | None = None,
    thresholds: dict[str, dict[str, Any]] | Iterable[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_start: Callable[[int | None], None] | None = None,
    **options: Any,
) -> ScanResult:
    """Scan ``data`` with the named checks and return a ``ScanResult``.

    ``data``: a path (a parquet file or folder of shards, an HF ``save_to_disk`` folder, an Arrow IPC
    file or stream, JSONL or conversation JSONL), a ``pyarrow.Table``, a polars DataFrame or an HF
    ``datasets.Dataset``. ``tokenizer``: a tokenizer folder or a preset (``qwen3``, the default;
    ``qwen3.6``). ``out``: the scan folder (default for a path: ``dqa-out/<name>/``; for a table: a
    temporary one, removed). ``checks``/``skip``: check names (a list or a comma-separated string).
    ``config``: a TOML file of ``[checks.NAME]`` thresholds; ``thresholds``: overrides applied after it,
    ``{check: {param: value}}`` or ``CHECK.PARAM=VALUE`` strings (``dqa scan --set``).
    ``progress(rows, tokens)`` is called as batches finish; ``on_start(total rows or None)`` once,
    before the first. ``options``: ``ScanOptions`` fields: ``ids_column``, ``mask_column``,
    ``labels_column``, ``id_column``, ``thinking`` (auto, expected, off), ``batch_rows``,
    ``last_turn_only``, ``workers``, ``ray`` (run the units as Ray tasks: ``"auto"``, ``"local"`` or a
    cluster address, as ``dqa scan --ray``; a connection made with ``ray.init`` beforehand is used as it is).

    Raises ``InputError`` (``UsageError``) for a bad option, a missing or malformed dataset, an
    unknown check, a folder holding another dataset's scan, data that is no table, or a Ray cluster
    that cannot be reached; ``RuntimeFailure`` when a unit cannot be scanned;
    ``TypeError`` for an unknown option; ``OSError`` when the scan folder cannot be written.
    """
    from dqa.api.inputs import in_memory_table
    from dqa.audit.scan import run_scan

    opts = scan_options(tokenizer, checks, skip, config, thresholds, **options)
    table = in_memory_table(data)
    if table is not None:
        return _scan_table(*table, out, opts, progress, on_start)
    from dqa.audit.scan import default_out_dir

    out_dir = out if out is not None else default_out_dir(data)
    check_before_tokenizer(data, out_dir)
    if on_start is not None:
        from dqa.audit.readers import open_dataset

        on_start(open_dataset(data, opts.ids_column, opts.mask_column, opts.labels_column, opts.id_column).num_rows)
    result = run_scan(data, out_dir, opts, progress=progress)
    return ScanResult(result.summary, result.findings, result.metrics, result.out_dir, result.dropped)


def scan_options(tokenizer: str | None, checks: Iterable[str] | str | None, skip: Iterable[str] | str | None,
                 config: str | Path | None, thresholds: dict[str, dict[str, Any]] | Iterable[str] | None,
                 **options: Any) -> "ScanOptions":
    """The ``ScanOptions`` of ``scan``'s arguments: ``config``'s thresholds, then ``thresholds``.

    Raises ``UsageError`` for ``batch_rows`` below 1, ``InputError`` for an unreadable config or a
    malformed ``CHECK.PARAM=VALUE``, ``TypeError`` for an unknown option.
    """
    from dqa.audit import checks as checks_mod
    from dqa.audit.scan import ScanOptions

    if options.get("batch_rows", 1) < 1:
        raise UsageError("--batch-rows must be at least 1")
    overrides: dict[str, dict[str, Any]] = {}
    if config is not None:
        for k, v in checks_mod.load_config(str(config)).items():
            overrides.setdefault(k, {}).update(v)
    if thresholds is not None:
        given = thresholds if isinstance(thresholds, dict) else checks_mod.parse_set(list(thresholds))
        for k, v in given.items():
            overrides.setdefault(k, {}).update(v)
    only = _names(checks) if checks else None
    return ScanOptions(tokenizer=tokenizer, only=only, skip=_names(skip), overrides=overrides, **options)


def _names(value: Iterable[str] | str | None) -> list[str]:
    """Check names from a list or a comma-separated string (blanks dropped)."""
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else value
    return [c.strip() for c in items if c.strip()]


def check_before_tokenizer(dataset: str | Path, out_dir: Path) -> None:
    """Refuse a missing dataset or an unusable scan folder before anything loads a tokenizer.

    ``run_scan`` checks these too (the same calls), but the output folder only after the
    template (with a tokenizer folder, ``tokenizer.json``) is loaded; a usage error should not
    wait for that. Check names and ``thinking`` are checked by ``run_scan`` before the load.
    Raises ``InputError`` naming the dataset or the folder.
    """
    from dqa import atomic
    from dqa.audit import identity
    from dqa.audit.scan_folder import is_scan_folder, read_summary
    from dqa.errors import InputError

    from dqa.storage import INCOMPLETE, is_url, location

    if not location(dataset).exists():
        raise InputError(f"{dataset}: no such file or folder" + (" in the store" if is_url(dataset) else ""))
    if is_url(out_dir):  # checked in the store itself: a listing and summary.json, nothing downloaded
        there = location(out_dir)
        if not there.is_dir() or (there / INCOMPLETE).is_file():
            return  # a new folder in the store, or one an interrupted upload left: the scan writes it anew
        if not is_scan_folder(there):
            raise InputError(f"{there}: exists and is not an earlier dqa scan folder; choose another --out or remove it")
        identity.check_scan_folder(there, dataset, read_summary(there))  # type: ignore[arg-type]
        return
    out = Path(out_dir)
    atomic.check_output_dir(out, [location(dataset)], is_scan_folder, "dqa scan folder")
    identity.check_scan_folder(out, dataset, read_summary(out) if is_scan_folder(out) else None)


def _scan_table(table: Any, label: str, out: str | Path | None, opts: "ScanOptions",
                progress: Callable[[int, int], None] | None, on_start: Callable[[int | None], None] | None) -> ScanResult:
    """Scan a table in memory (``dqa.audit.table_reader``) into ``out``, or into a temporary folder
    that is removed before returning (then the result holds the turns table too)."""
    import shutil
    import tempfile

    import polars as pl

    from dqa.audit.scan import run_scan
    from dqa.audit.table_reader import open_table

    ds = open_table(table, label, opts.ids_column, opts.mask_column, opts.labels_column, opts.id_column)
    if on_start is not None:
        on_start(ds.num_rows)
    if out is not None:
        result = run_scan(ds, Path(out), opts, progress=progress)
        return ScanResult(result.summary, result.findings, result.metrics, result.out_dir, result.dropped)
    tmp = Path(tempfile.mkdtemp(prefix="dqa-scan-"))
    try:
        result = run_scan(ds, tmp / "scan", opts, progress=progress)
        turns = pl.read_parquet(tmp / "scan" / scan_folder.TURNS_FILE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ScanResult(result.summary, result.findings, result.metrics, None, result.dropped, turns)
