"""Run an expectation suite through Great Expectations' ephemeral context over a metrics table.

The fast path (measured in bench/bench_validate.py): GX's pandas datasource over only the
columns the suite reads, with the dataset row numbers as the frame's *unnamed* index and
``result_format`` COMPLETE + ``exclude_unexpected_values``. GX then returns the failing rows
of every row-level expectation as ``unexpected_index_list`` straight from the index (a
vectorized ``list(index)``). Naming index columns instead (``unexpected_index_column_names``)
makes GX build one dict per failing row with ``DataFrame.at`` lookups: 40+ s at 1M rows
when most rows fail, versus well under a second this way.

The full failing-row lists go to ``failing_samples.parquet``; the GX result JSON keeps only
the first ``max_ids`` (``partial_unexpected_index_list``) so it stays small.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from dqa import atomic
from dqa.errors import InputError, RuntimeFailure
from dqa.expectations.suites import Suite, SuiteExpectation, counts_as_failure, to_gx_suite

MAX_IDS_DEFAULT = 20
DOCS_DIR = "data_docs"
_DROP_FROM_RESULT = ("unexpected_index_list", "unexpected_list", "unexpected_index_query")


@dataclass
class ExpectationOutcome:
    """How one expectation did.

    ``failing_rows`` holds every failing dataset row (row-level expectations only);
    ``failing_ids`` the sample ids of the first ``max_ids`` of them (rows when there is no id
    column). ``status`` is ``pass``, ``fail`` (counts against the verdict), ``warn`` (failed,
    but below ``--fail-on``) or ``error`` (GX could not evaluate it).
    """

    expectation: SuiteExpectation
    success: bool
    status: str
    observed_value: Any = None
    element_count: int | None = None
    unexpected_count: int | None = None
    unexpected_percent: float | None = None
    failing_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    failing_ids: list[Any] = field(default_factory=list)
    exception: str | None = None

    def to_dict(self, max_ids: int) -> dict[str, Any]:
        e = self.expectation
        return {
            "index": e.index,
            "id": e.id,
            "type": e.type,
            "title": e.title,
            "columns": e.columns,
            "kwargs": e.kwargs,
            "severity": e.severity,
            "why": e.why,
            "success": self.success,
            "status": self.status,
            "observed_value": _jsonable(self.observed_value),
            "element_count": self.element_count,
            "unexpected_count": self.unexpected_count,
            "unexpected_percent": self.unexpected_percent,
            "failing_rows": [int(r) for r in self.failing_rows[:max_ids]],
            "failing_ids": [_jsonable(i) for i in self.failing_ids[:max_ids]],
            "exception": self.exception,
        }


@dataclass
class Validation:
    """A suite run over one metrics table: dqa's verdict, each outcome, GX's own result JSON."""

    suite: Suite
    source: str
    rows: int
    fail_on: str
    success: bool
    gx_success: bool
    outcomes: list[ExpectationOutcome]
    gx_result: dict[str, Any]
    id_column: str | None
    max_ids: int
    timings: dict[str, float]
    gx_version: str
    scan: dict[str, Any] | None = None  # the scan the metrics came from (dqa.audit.identity.scan_record)

    @property
    def status(self) -> str:
        return "pass" if self.success else "fail"

    def summary(self) -> dict[str, Any]:
        """The compact JSON view (``summary.json``) that the reports and the gate read."""
        by = {s: sum(1 for o in self.outcomes if o.status == s) for s in ("pass", "fail", "warn", "error")}
        return {
            "suite": self.suite.name,
            "suite_file": str(self.suite.path),
            "source": self.source,
            "scan": self.scan,
            "rows": self.rows,
            "id_column": self.id_column,
            "fail_on": self.fail_on,
            "success": self.success,
            "status": self.status,
            "gx_success": self.gx_success,
            "gx_version": self.gx_version,
            "statistics": {"evaluated": len(self.outcomes), "passed": by["pass"], "failed": by["fail"],
                           "warnings": by["warn"], "errors": by["error"]},
            "max_ids": self.max_ids,
            "expectations": [o.to_dict(self.max_ids) for o in self.outcomes],
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
        }

    def failing_samples(self, metrics: pl.DataFrame) -> pl.DataFrame:
        """Every (expectation, unexpected row, id) pair, for ``failing_samples.parquet``.

        Rows of expectations that passed within their ``mostly`` are listed too (``status`` says
        whether the expectation as a whole passed).
        """
        parts = [
            pl.DataFrame({"expectation": np.full(len(o.failing_rows), o.expectation.index, dtype=np.int32),
                          "row": o.failing_rows.astype(np.int64)})
            for o in self.outcomes if len(o.failing_rows)
        ]
        base = pl.concat(parts) if parts else pl.DataFrame(schema={"expectation": pl.Int32, "row": pl.Int64})
        titles = pl.DataFrame({"expectation": [o.expectation.index for o in self.outcomes],
                               "type": [o.expectation.type for o in self.outcomes],
                               "column": [", ".join(o.expectation.columns) for o in self.outcomes],
                               "severity": [o.expectation.severity for o in self.outcomes],
                               "status": [o.status for o in self.outcomes]},
                              schema={"expectation": pl.Int32, "type": pl.String, "column": pl.String, "severity": pl.String,
                                      "status": pl.String})
        out = base.join(titles, on="expectation", how="left")
        if self.id_column and "row" in metrics.columns:
            out = out.join(metrics.select("row", pl.col(self.id_column).alias("id")), on="row", how="left")
        return out.select("expectation", "type", "column", "severity", "status", "row", *(["id"] if self.id_column else []))


def import_gx() -> tuple[Any, float]:
    """Import Great Expectations quietly (no analytics, no progress bars); returns ``(module, seconds)``."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    t0 = time.perf_counter()
    import great_expectations as gx

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    return gx, time.perf_counter() - t0


def check_columns(metrics: pl.DataFrame, suite: Suite, source: str) -> None:
    """Raise ``InputError`` naming the source, the column and the expectation when the suite reads a missing column."""
    have = set(metrics.columns)
    for e in suite.expectations:
        for c in e.columns:
            if c not in have:
                raise InputError(
                    f"{source}: no column {c!r}, which {suite.path.name} expectation #{e.index} ({e.type}) reads "
                    f"(columns: {', '.join(metrics.columns)})"
                )


def _gx_frame(metrics: pl.DataFrame, suite: Suite):
    """A pandas frame of the suite's columns, indexed (unnamed) by the dataset row number."""
    import pandas as pd

    cols = suite.columns
    pdf = metrics.select(cols).to_pandas() if cols else pd.DataFrame(index=pd.RangeIndex(metrics.height))
    rows = metrics["row"].to_numpy() if "row" in metrics.columns else np.arange(metrics.height, dtype=np.int64)
    pdf.index = pd.Index(rows)
    pdf.index.name = None
    return pdf


def _context(gx: Any, docs_dir: Path | None):
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    for site in list(ctx.list_data_docs_sites()):
        ctx.delete_data_docs_site(site)
    if docs_dir is not None:
        ctx.add_data_docs_site(
            "dqa",
            {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(Path(docs_dir).resolve())},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
    return ctx


def run_validation(
    metrics: pl.DataFrame,
    suite: Suite,
    fail_on: str = "critical",
    max_ids: int = MAX_IDS_DEFAULT,
    docs_dir: Path | None = None,
    source: str = "metrics",
) -> Validation:
    """Validate ``metrics`` (a ``dqa scan`` metrics table) against ``suite`` with GX.

    ``fail_on`` is ``critical`` (warnings are reported only) or ``warning``. With
    ``docs_dir``, GX Data Docs are built there. Returns a ``Validation``. Raises
    ``InputError`` when the suite reads a column the table lacks or holds a bad
    expectation, ``RuntimeFailure`` when GX fails for another reason.
    """
    check_columns(metrics, suite, source)
    gx, import_s = import_gx()
    t0 = time.perf_counter()
    gx_suite = to_gx_suite(suite)
    pdf = _gx_frame(metrics, suite)
    try:
        ctx = _context(gx, docs_dir)
        gx_suite = ctx.suites.add(gx_suite)  # assigns each expectation an id: results map back by it
        by_id = {str(g.id): e for g, e in zip(gx_suite.expectations, suite.expectations)}
        asset = ctx.data_sources.add_pandas("dqa").add_dataframe_asset("metrics")
        batch_def = asset.add_batch_definition_whole_dataframe("all rows")
        prepare_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        batch = batch_def.get_batch(batch_parameters={"dataframe": pdf})
        result = batch.validate(
            gx_suite,
            result_format={
                "result_format": "COMPLETE",
                "exclude_unexpected_values": True,
                "return_unexpected_index_query": False,
                "partial_unexpected_count": max_ids,
            },
        )
    except InputError:
        raise
    except Exception as exc:  # GX internals: report one line, never a traceback
        raise RuntimeFailure(f"{source}: Great Expectations failed: {' '.join(str(exc).split())[:300]}") from None
    validate_s = time.perf_counter() - t1

    id_column = "id" if "id" in metrics.columns else None
    outcomes: list[ExpectationOutcome] = []
    for r in result.results:
        e = by_id.get(str(r.expectation_config.id))
        if e is None:
            raise RuntimeFailure(f"{source}: Great Expectations returned a result for an expectation not in {suite.path.name}")
        outcomes.append(_outcome(r, e, fail_on, max_ids))
        for key in _DROP_FROM_RESULT:
            r.result.pop(key, None)
        r.result = _jsonable(r.result)  # numpy scalars (bool, int64) trip GX's own JSON store
        r.success = bool(r.success)
    outcomes.sort(key=lambda o: o.expectation.index)
    _fill_ids(outcomes, metrics, id_column, max_ids)

    docs_s = 0.0
    if docs_dir is not None:
        t2 = time.perf_counter()
        try:
            _build_docs(ctx, gx_suite, result, suite.name)
        except Exception as exc:  # GX internals: one line, never a traceback
            raise RuntimeFailure(f"{docs_dir}: building GX Data Docs failed: {' '.join(str(exc).split())[:300]}") from None
        docs_s = time.perf_counter() - t2
    success = not any(o.status in ("fail", "error") for o in outcomes)
    return Validation(
        suite=suite,
        source=source,
        rows=metrics.height,
        fail_on=fail_on,
        success=success,
        gx_success=bool(result.success),
        outcomes=outcomes,
        gx_result=result.to_json_dict(),
        id_column=id_column,
        max_ids=max_ids,
        timings={"gx_import_s": import_s, "prepare_s": prepare_s, "validate_s": validate_s, "docs_s": docs_s},
        gx_version=gx.__version__,
    )


def _outcome(r: Any, e: SuiteExpectation, fail_on: str, max_ids: int) -> ExpectationOutcome:
    res = r.result or {}
    exc = r.exception_info or {}
    raised = exc.get("raised_exception") if isinstance(exc, dict) else False
    if raised:
        status = "error"
    elif r.success:
        status = "pass"
    else:
        status = "fail" if counts_as_failure(e.severity, fail_on) else "warn"
    rows = res.get("unexpected_index_list")
    if rows is None:
        rows = res.get("partial_unexpected_index_list") or []
    failing = _int_rows(rows)
    return ExpectationOutcome(
        expectation=e,
        success=bool(r.success),
        status=status,
        observed_value=res.get("observed_value"),
        element_count=res.get("element_count"),
        unexpected_count=res.get("unexpected_count"),
        unexpected_percent=res.get("unexpected_percent"),
        failing_rows=failing,
        exception=" ".join(str(exc.get("exception_message") or "").split())[:500] if raised else None,
    )


def _int_rows(rows: list[Any]) -> np.ndarray:
    """The integer row indexes of a GX index list (up to every row of the dataset) as int64.
    Entries that are not integers (dicts when GX reports index columns) are left out."""
    arr = np.asarray(rows) if len(rows) else np.zeros(0, np.int64)
    if arr.ndim == 1 and arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    return np.asarray([x for x in rows if isinstance(x, (int, np.integer))], dtype=np.int64)  # mixed: rare, small


def _fill_ids(outcomes: list[ExpectationOutcome], metrics: pl.DataFrame, id_column: str | None, max_ids: int) -> None:
    """Attach the sample ids of the first ``max_ids`` failing rows of each outcome (rows when no ids)."""
    for o in outcomes:
        head = o.failing_rows[:max_ids]
        if not len(head):
            continue
        if id_column is None or "row" not in metrics.columns:
            o.failing_ids = [int(x) for x in head]
            continue
        found = metrics.filter(pl.col("row").is_in(head.tolist())).select("row", id_column)
        lookup = dict(zip(found["row"].to_list(), found[id_column].to_list()))
        o.failing_ids = [lookup.get(int(x)) for x in head]


def _build_docs(ctx: Any, gx_suite: Any, result: Any, batch_name: str) -> None:
    """Store the (trimmed) result in the context and build the Data Docs site."""
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    run_id = RunIdentifier(run_name=f"dqa-{batch_name}")
    result.meta["run_id"] = run_id
    key = ValidationResultIdentifier(
        expectation_suite_identifier=ExpectationSuiteIdentifier(name=gx_suite.name),
        run_id=run_id,
        batch_identifier="metrics",
    )
    ctx.validation_results_store.set(key, result)
    ctx.build_data_docs(site_names=["dqa"])


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def validate_to_folder(
    metrics: pl.DataFrame,
    suite: Suite,
    out_dir: str | Path,
    fail_on: str = "critical",
    max_ids: int = MAX_IDS_DEFAULT,
    docs: bool = True,
    source: str = "metrics",
    scan: dict[str, Any] | None = None,
) -> Validation:
    """Validate and write the validation folder (built aside, then moved into place whole).

    Writes ``validation.json`` (GX's result), ``summary.json`` (dqa's view: verdict,
    severities, first failing ids, and ``scan``: the scan the metrics came from, as
    ``dqa.audit.identity.scan_record`` gives it, or null), ``failing_samples.parquet`` (every
    failing row of every expectation), ``junit.xml``, ``summary.md`` and ``data_docs/`` (GX
    Data Docs). Returns the ``Validation``. Raises like ``run_validation``, and ``OSError`` for
    output failures.
    """
    from dqa.reports.junit import validation_testsuite, write_junit
    from dqa.reports.markdown_validation import render_validation_markdown

    from dqa import storage

    if storage.is_url(out_dir):  # staged here, published with validation.json last
        with storage.output_folder(out_dir, "validation.json") as local:
            v = validate_to_folder(metrics, suite, local, fail_on, max_ids, docs, source, scan)
            storage.repoint_files(local, storage.location(out_dir), ("summary.json",))
        return v
    out = Path(out_dir)
    atomic.check_output_dir(out, [], lambda d: (d / "validation.json").is_file(), "dqa validation folder")
    work = atomic.make_work_dir(out)
    try:
        v = run_validation(metrics, suite, fail_on, max_ids, work / DOCS_DIR if docs else None, source)
        v.scan = scan
        summary = v.summary()
        atomic.write_json(work / "validation.json", v.gx_result)
        atomic.write_json(work / "summary.json", summary)
        with atomic.atomic_path(work / "failing_samples.parquet") as tmp:
            v.failing_samples(metrics).write_parquet(tmp, compression="zstd")
        write_junit(work / "junit.xml", [validation_testsuite(summary)])
        atomic.write_text(work / "summary.md", render_validation_markdown(summary))
        atomic.replace_dir(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return v


