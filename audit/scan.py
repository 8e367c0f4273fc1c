"""``run_scan``: stream a dataset through the kernels, apply the checks, write the scan folder.

Output (FORMATS.md; the names are ``dqa.audit.scan_folder``'s): ``metrics.parquet`` (one row
per sample), ``turns.parquet`` (one row per trained assistant turn), ``findings.parquet``,
``summary.json``, ``summary.md``. Everything is built in a temporary sibling folder and moved
into place only when the scan succeeded, so a failed or interrupted scan never leaves output
that looks complete.

The kernel pass (``scan_workers``) needs numpy and Arrow only; what follows it (``scan_results``: the
set-level checks, the summary, the files) needs polars. This module imports neither polars nor
``scan_results`` at the top: ``run_scan`` imports them while the pass runs, so that with a pool of
workers their import (~0.25 s) overlaps the pass instead of preceding it.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from dqa import atomic
from dqa.audit import checks as checks_mod
from dqa.audit import identity
from dqa.audit.kernels import KernelTables
from dqa.audit.readers import Dataset, open_dataset
from dqa.audit.scan_folder import SCAN_FILES, SUMMARY_FILE, is_scan_folder, is_store_failure, read_summary, shown, writing
from dqa.audit.scan_options import DEFAULT_BATCH_ROWS, ScanOptions  # noqa: F401 (re-exported: dqa.audit.scan.ScanOptions)
from dqa.audit.executors import scan_parts, unit_runner
from dqa.audit.template import load_template
from dqa.errors import InputError
from dqa.memory import reuse_freed_memory

if TYPE_CHECKING:
    import polars as pl


@dataclass
class ScanResult:
    """What a scan produced: the output folder, the summary dict, the two tables, and the names of the
    previous scan's validation/gate/report outputs it removed from the folder (``dropped``)."""

    out_dir: Path  # a StorePath when the scan folder is in a store
    summary: dict[str, Any]
    metrics: "pl.DataFrame"
    findings: "pl.DataFrame"
    dropped: list[str] = field(default_factory=list)  # outputs of the previous scan this rescan removed


ProgressFn = Callable[[int, int], None]  # (rows done so far, tokens done so far)


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
    # batch_rows, workers and ray change how and where the work is cut, never what it finds.
    opts = {k: v for k, v in asdict(options).items() if k not in ("batch_rows", "workers", "ray") and not (k == "last_turn_only" and not v)}
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
    input, a folder holding another dataset's scan, or a Ray cluster that cannot be reached (nothing is written
    then), ``OSError`` for output failures, and ``RuntimeFailure`` when a unit cannot be scanned (a worker
    process died; a Ray task failed its retries).
    """
    options = options or ScanOptions()
    t0 = time.perf_counter()
    reuse_freed_memory()
    selected = checks_mod.selected_checks(options.only, options.skip)
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
    target = out_dir if out_dir is not None else default_out_dir(dataset)
    # The runner is closed once the outputs are written (a URL: staged here, published with summary.json last):
    # a Ray connection of the scan's own ends while they are (dqa.audit.executors.ray_tasks).
    with unit_runner(options.ray, workers) as runner, writing(target) as out:
        result = _scan_into(out, ds, dataset, spec, tables, options, selected, params, progress, runner, t0)
    result.out_dir = shown(target, result.out_dir)
    return result


def _scan_into(out: Path, ds: Dataset, dataset: "str | Path", spec: Any, tables: KernelTables, options: ScanOptions,
               selected: Any, params: Any, progress: ProgressFn | None, runner: Any, t0: float) -> ScanResult:
    """Scan ``ds`` into the local folder ``out`` (built beside it, then moved in: see ``run_scan``)."""
    atomic.check_output_dir(out, [dataset], is_scan_folder, "dqa scan folder")
    previous = read_summary(out) if is_scan_folder(out) else None
    identity.check_scan_folder(out, dataset, previous)
    fingerprint = scan_fingerprint(ds, options)
    # Outputs made from the previous scan stay only when this scan is the same one (same files, options).
    dropped = [] if previous is None or previous.get("fingerprint") == fingerprint else identity.derived_outputs(out)
    work = atomic.make_work_dir(out)
    try:
        metrics, turns, rows, tokens = scan_parts(ds, tables, work, options.batch_rows, progress, runner,
                                                  meanwhile=_import_results)
        if rows == 0:
            raise InputError(f"{dataset}: no rows (an empty dataset)")
        from dqa.audit.scan_results import write_results

        summary, metrics, findings = write_results(ds, spec, options, selected, params, metrics, turns, rows, tokens,
                                                   work, t0, fingerprint)
        # validate/gate/report outputs that live in the scan folder survive a rescan that gives the same scan.
        atomic.replace_dir(work, out, keep=lambda name: name not in SCAN_FILES and name not in dropped
                           and not name.startswith(atomic.TMP_PREFIX))
    except OSError as exc:
        shutil.rmtree(work, ignore_errors=True)
        if is_store_failure(exc):
            raise  # reported, naming the store's URL, by writing()
        raise atomic.named_os_error(exc, out) from exc
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return ScanResult(out_dir=out, summary=summary, metrics=metrics, findings=findings, dropped=dropped)


def _import_results() -> None:
    """What the scan's process does while its workers scan: import the modules that follow the pass (polars)."""
    import dqa.audit.scan_results  # noqa: F401
