"""The kernel pass of a scan: every batch of the dataset through ``kernels.batch_metrics_and_turns``, its
per-sample and per-turn metrics written to work parts, in this process or unit by unit on an executor.

With an executor (``dqa.audit.executors``: a process pool for ``workers`` > 1, or Ray tasks) the dataset is cut
into ``WorkUnit``s (``Dataset.work_units``: runs of parquet row groups, or whole files whose row count the format
records), joined into units that shrink towards the end of the set (``guided_units``), and the executor scans
each unit (``scan_unit``) into its own pair of parts (Arrow IPC files, lz4-compressed: a hand-off with no parquet
encoding on either side) in the work folder, while this process prepares what follows the pass (``scan_parts``'
``meanwhile``) and loads the tokenizer the report decodes with. The parts are read back in unit order, here, by
the same code for every executor, so the metrics and turns tables are the ones a single process writes: every
metric of a row depends only on the row, and the set-level checks (template shares, duplicates) count their
hashes over the whole tables afterwards (``checks.prepare``), so their counts are exact for any cut. Findings are
identical for every executor and ``workers``. Datasets that cannot be cut without reading them (Arrow streams,
JSONL, conversations) are read as one stream in this process, with a reader thread, as with one worker.

An executor hands back the units' results in unit order, so the first bad row in dataset order is the one named
(``InputError``); a unit that cannot be scanned otherwise fails the scan (``RuntimeFailure``, exit 3).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from dqa.audit.conventions import WRONG_TOKENIZER_MIN_ROWS, check_format_fits
from dqa.audit.formats.arrow import ARROW_FILE
from dqa.audit.kernels import TURN_COLUMNS, TURN_DTYPES, KernelTables, batch_metrics_and_turns
from dqa.audit.readers import Dataset, WorkUnit
from dqa.audit.token_batch import TokenBatch, arrow_view

ProgressFn = Callable[[int, int], None]  # (rows done so far, tokens done so far)
PART_CODEC = "lz4"  # the work parts' Arrow IPC buffer compression
GUIDED_SHARE = 4  # a unit takes about 1 / (GUIDED_SHARE x workers) of the rows still to scan (``guided_units``)


def default_workers() -> int:
    """The CPUs this process may run on (its affinity, so ``taskset -c 0`` means one), else ``os.cpu_count()``."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def _prefetch(batches: Iterator[TokenBatch], depth: int = 2) -> Iterator[TokenBatch]:
    """Read the next batches in a background thread while the kernel works on this one.

    Parquet decoding and numpy both release the GIL, so reading and computing
    overlap on two cores. Exceptions from the reader re-raise here, in order.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for b in batches:
                while not stop.is_set():
                    try:
                        q.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as exc:  # handed to the consumer
            q.put(exc)

    thread = threading.Thread(target=produce, name="dqa-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def stream_metrics(batches: Iterator[TokenBatch], tables: KernelTables, part: Path, progress: ProgressFn | None,
                   turns_part: Path | None = None, dataset: str = "", check_fit: bool = True,
                   prefetch: bool = True) -> tuple[int, int, bool]:
    """Write one metrics record batch per batch of ``batches`` to the Arrow IPC file ``part`` (and the batch's
    trained turns to ``turns_part``, see ``kernels.TURN_COLUMNS``); return ``(rows, tokens, fit_checked)``. ``prefetch`` reads
    the next batches in a thread (``_prefetch``) while the kernels work.

    With ``check_fit`` the first batches' assistant headers are checked against the chat format
    (``check_format_fits``, naming ``dataset``) as soon as they hold ``WRONG_TOKENIZER_MIN_ROWS`` supervised
    rows; ``fit_checked`` says whether that happened. Raises ``InputError`` for bad input."""
    writer = None
    # The parts are work files, read back once after the pass: Arrow IPC with lz4 buffers, a third of the parquet
    # parts' write time and smaller on disk (they sit beside the output, which may be short of space).
    turn_schema = _turn_schema()
    turn_writer = ARROW_FILE.sink(turns_part, turn_schema, PART_CODEC) if turns_part is not None else None
    rows = tokens = 0
    id_type: pa.DataType | None = None
    fit: list[np.ndarray] | None = [np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)] if check_fit else None
    checked = False
    try:
        for batch in _prefetch(batches) if prefetch else batches:
            m, turns = batch_metrics_and_turns(batch, tables)
            if turn_writer is not None and turns["row"].size:
                _write(turn_writer, _table({c: turns[c] for c in TURN_COLUMNS}, turn_schema))
            if fit is not None:  # a wrong tokenizer fails in seconds: its assistant header is missing from most rows
                fit = [np.concatenate((fit[0], m["has_assistant"])), np.concatenate((fit[1], m["supervised_tokens"]))]
                if int((fit[1] > 0).sum()) >= WRONG_TOKENIZER_MIN_ROWS:
                    check_format_fits(fit[0], fit[1], tables.spec, dataset)
                    fit, checked = None, True
            cols: dict[str, Any] = {"row": np.arange(batch.start_row, batch.start_row + batch.num_rows, dtype=np.int64)}
            if batch.row_ids is not None:
                ids_arr = batch.row_ids
                if id_type is None:
                    id_type = ids_arr.type
                elif ids_arr.type != id_type:
                    ids_arr = ids_arr.cast(id_type)
                cols["id"] = ids_arr
            cols.update(m)
            table = _table(cols)
            if writer is None:
                writer = ARROW_FILE.sink(part, table.schema, PART_CODEC)
            _write(writer, table)
            rows += batch.num_rows
            tokens += int(batch.ids.size)
            if progress:
                progress(rows, tokens)
    finally:
        if writer is not None:
            writer.close()
        if turn_writer is not None:
            turn_writer.close()
    return rows, tokens, checked


def _write(sink, table: pa.Table) -> None:
    for batch in table.to_batches():
        sink.write(batch)


def _table(cols: dict[str, Any], schema: pa.Schema | None = None) -> pa.Table:
    """A table of numpy or Arrow columns, cast to ``schema`` when given (``arrow_view``, not ``pa.table``: that
    imports pandas on first use, to check for a DataFrame)."""
    arrays = [v if isinstance(v, (pa.Array, pa.ChunkedArray)) else arrow_view(v) for v in cols.values()]
    table = pa.Table.from_arrays(arrays, names=list(cols))
    return table if schema is None else table.cast(schema)


def _turn_schema() -> pa.Schema:
    return pa.schema([(c, pa.from_numpy_dtype(np.dtype(TURN_DTYPES.get(c, np.int64)))) for c in TURN_COLUMNS])




def read_part_pair(pair: tuple[Path, Path]) -> tuple[Any, Any]:
    """A unit's ``(metrics part, turns part)`` read into two polars tables, the files removed once read."""
    import polars as pl

    tables = pl.read_ipc(pair[0]), pl.read_ipc(pair[1])
    for f in pair:
        f.unlink()
    return tables


def read_parts(pairs: list[tuple[Path, Path]], threads: int) -> list[tuple[Any, Any]]:
    """``read_part_pair`` of every pair, in order, on up to ``threads`` threads: polars decodes without the GIL, and
    this is the serial tail of a pooled scan (0.26 s for 565K rows on one thread, 2 cores)."""
    if threads < 2 or len(pairs) < 2:
        return [read_part_pair(pair) for pair in pairs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(pairs)), thread_name_prefix="dqa-parts") as pool:
        return list(pool.map(read_part_pair, pairs))


def _concat(frames: list) -> Any:
    """The units' tables in order as one (a unit whose ids came as another Arrow type is cast)."""
    import polars as pl

    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed")


class UnitTask(NamedTuple):
    """One unit of a scan for an executor: unit ``k`` (dataset order) is ``unit``, scanned in batches of
    ``batch_rows`` into the parts ``pair`` (metrics, turns); ``dataset`` names the set in errors; ``threads``: read
    ahead and decode with threads (set by the executor: only where cores are spare)."""

    k: int
    unit: WorkUnit
    batch_rows: int
    pair: tuple[Path, Path]
    dataset: str
    threads: bool = False


class UnitDone(NamedTuple):
    """What scanning a unit gave, besides its parts: its rows and tokens, and whether the chat format's fit was
    checked on its first rows (``stream_metrics``' ``fit_checked``)."""

    k: int
    rows: int
    tokens: int
    fit: bool


def scan_unit(task: UnitTask, ds: Dataset, tables: KernelTables) -> UnitDone:
    """Scan ``task``'s unit of ``ds`` into its parts; a unit whose store read failed (``dqa.storage.faults.
    is_transient``) is scanned again from its start, up to ``UNIT_ATTEMPTS`` times, with a growing pause (its parts
    are rewritten). Returns a ``UnitDone``. Raises ``InputError`` for bad input and what the last attempt raised."""
    from dqa.storage.faults import is_transient

    for attempt in range(1, UNIT_ATTEMPTS + 1):
        try:
            return scan_unit_once(task, ds, tables)
        except Exception as exc:
            if attempt == UNIT_ATTEMPTS or not is_transient(exc):
                raise
            time.sleep(0.5 * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


UNIT_ATTEMPTS = 3


def scan_unit_once(task: UnitTask, ds: Dataset, tables: KernelTables) -> UnitDone:
    """One attempt of ``scan_unit``."""
    # With a worker per core, one thread each: a reader thread or Arrow's decoding threads would only contend
    # for the same cores, and each thread's allocations go to a glibc arena of its own, whose heaps are
    # unmapped as they empty and refaulted on the next batch (~10% of a worker's CPU).
    part, turns_part = task.pair
    rows, tokens, fit = stream_metrics(ds.unit_batches(task.unit, task.batch_rows, threads=task.threads), tables, part,
                                       None, turns_part, task.dataset, check_fit=task.unit.start_row == 0,
                                       prefetch=task.threads)
    return UnitDone(task.k, rows, tokens, fit)


def scan_parts(ds: Dataset, tables: KernelTables, work: Path, batch_rows: int, progress: ProgressFn | None,
               meanwhile: Callable[[], None] | None = None,
               runner: Any = None) -> tuple[Any, Any, int, int]:
    """Run the kernels over ``ds`` into parts under ``work``; return ``(metrics, turns, rows, tokens)``: the kernels'
    per-sample and per-turn tables (polars) in dataset order (None for an empty dataset), read back from the parts,
    which are then removed. The units run on ``runner`` (a ``dqa.audit.executors.UnitRunner``, which picks it) when
    given, else the whole set is read in this process (see the module docstring). ``meanwhile`` is called in this process once
    the units are running (before the pass when it runs here): the caller's own preparations, which then overlap
    the pass. Raises ``InputError`` for bad input (the first in dataset order), ``RuntimeFailure`` when a unit
    cannot be scanned (a pool worker died; a Ray task failed its retries), ``KeyboardInterrupt`` when the pool was
    told to stop with the scan's process group, and whatever ``meanwhile`` raises (the units are stopped then)."""
    units = None
    if runner is not None and ds.num_rows:
        units = ds.work_units(batch_rows)
        units = guided_units(units, runner.slots) if units else units
    if not units or len(units) < 2:
        if meanwhile is not None:
            meanwhile()
        pair = (work / "metrics.part.arrow", work / "turns.part.arrow")
        rows, tokens, _ = stream_metrics(ds.batches(batch_rows), tables, pair[0], progress, pair[1], str(ds.path))
        if not rows:  # no metrics part was written
            return None, None, 0, 0
        return *read_part_pair(pair), rows, tokens
    pairs = [(work / f"metrics.part-{k:05d}.arrow", work / f"turns.part-{k:05d}.arrow") for k in range(len(units))]
    tasks = [UnitTask(k, u, batch_rows, pairs[k], str(ds.path)) for k, u in enumerate(units)]
    loader = threading.Thread(target=_load_quietly, args=(tables,), name="dqa-tokenizer", daemon=True)

    def started() -> None:
        if meanwhile is not None:
            meanwhile()
        # Then this process would only wait: it loads the tokenizer the report decodes the degenerate templates with
        # (0.3-0.5 s, otherwise spent after the pass). Its errors surface where it is used.
        loader.start()

    rows = tokens = 0
    checked = False
    for done in runner.results(ds, tables, tasks, started):  # in unit order
        rows, tokens = rows + done.rows, tokens + done.tokens
        checked = checked or (done.k == 0 and done.fit)
        if progress:
            progress(rows, tokens)
    # The parts are read back once the units are done: read during the pass (0.07 s less serial tail on the
    # 200M-token sets), the set's tables would sit beside every pool worker's retained heap, raising the scan's peak.
    read = read_parts(pairs, default_workers())
    if loader.is_alive():
        loader.join()
    if not checked:  # the first unit held too few supervised rows: check on the first rows of the set, as one process does
        _check_fit_of_units([m for m, _ in read], tables, str(ds.path))
    return _concat([m for m, _ in read]), _concat([t for _, t in read]), rows, tokens


def guided_units(cuts: list[WorkUnit], workers: int) -> list[WorkUnit]:
    """``cuts`` (the dataset's finest units, in order: ``Dataset.work_units(batch_rows)``) joined into units that
    shrink towards the end of the set (guided self-scheduling): each unit is the shortest run of neighbouring cuts
    whose rows reach 1 / (``GUIDED_SHARE`` x ``workers``) of the rows not yet in a unit, or the rest of its file.
    The first units are large (few parts) and the last are single cuts, so the workers finish within about one cut
    of each other instead of one waiting out the other's last large unit (a third of a second of an idle core on
    the 200M-token sets, seen). Only row-group cuts of one file are joined. Returns the units in dataset order."""
    runs: list[list[WorkUnit]] = []
    remaining = sum(c.rows for c in cuts)
    rows = 0  # in runs[-1]
    target = 0.0
    for c in cuts:
        last = runs[-1][-1] if runs else None
        if (last is not None and rows < target and last.file == c.file and last.row_groups is not None
                and c.row_groups is not None):
            runs[-1].append(c)
            rows += c.rows
        else:
            remaining -= rows
            target = remaining / (GUIDED_SHARE * workers)
            runs.append([c])
            rows = c.rows
    return [_joined(run) for run in runs]


def _joined(run: list[WorkUnit]) -> WorkUnit:
    """One unit of neighbouring row-group cuts of one file (the cut itself when alone)."""
    if len(run) == 1:
        return run[0]
    groups = tuple(g for c in run for g in c.row_groups or ())
    return WorkUnit(run[0].file, run[0].start_row, sum(c.rows for c in run), groups)


def _load_quietly(tables: KernelTables) -> None:
    try:
        tables.spec.tokenizer  # noqa: B018 (a lazy property: reading it loads the tokenizer)
    except Exception:  # the scan reports it where the tokenizer is used
        pass


def _check_fit_of_units(metrics: list, tables: KernelTables, dataset: str) -> None:
    """``check_format_fits`` on the first units' rows (``metrics``: their tables, in order), as many as hold
    ``WRONG_TOKENIZER_MIN_ROWS`` supervised rows (or the whole set)."""
    has, sup = [], []
    for m in metrics:
        has.append(m["has_assistant"].to_numpy())
        sup.append(m["supervised_tokens"].to_numpy())
        if int((np.concatenate(sup) > 0).sum()) >= WRONG_TOKENIZER_MIN_ROWS:
            check_format_fits(np.concatenate(has), np.concatenate(sup), tables.spec, dataset)
            return
