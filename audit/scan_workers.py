"""The kernel pass of a scan: every batch of the dataset through ``kernels.batch_metrics_and_turns``, its
per-sample and per-turn metrics written to work parts, in one process or in ``workers`` processes.

With more than one worker the dataset is cut into ``WorkUnit``s (``Dataset.work_units``: runs of parquet
row groups, or whole files whose row count the format records), joined into units that shrink towards the end
of the set (``guided_units``), and a process pool (``concurrent.futures``) scans them, each unit into its own
pair of parts (Arrow IPC files, lz4-compressed: a hand-off between processes, with no parquet encoding on either
side), while this process prepares what follows the pass (``scan_parts``' ``meanwhile``) and loads the tokenizer
the report decodes with. The parts are read back in unit order, so
the metrics and turns tables are the ones a single process writes: every metric of a row depends only on
the row, and the set-level checks (template shares, duplicates) count their hashes over the whole tables
afterwards (``checks.prepare``), so their counts are exact for any cut. Findings are identical for every
``workers``. Datasets that cannot be cut without reading them (Arrow streams, JSONL, conversations) are
read as one stream in this process, with a reader thread, as with one worker. A worker reads and decodes
in its own thread when there are as many workers as cores, else with a reader thread and Arrow's threads.

A unit's error surfaces as it would in one process: the pool's results are taken in unit order, so the
first bad row in dataset order is the one named, and the other workers are stopped. Workers ignore Ctrl-C
and die on SIGTERM; the scan's process stops the pool. A worker that dies (the out-of-memory killer) fails
the scan at once (``RuntimeFailure``, exit 3) instead of leaving it waiting for that worker's units, and the
workers die with the scan's process (Linux's parent-death signal) instead of outliving it.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from dqa.audit.conventions import WRONG_TOKENIZER_MIN_ROWS, check_format_fits
from dqa.audit.formats.arrow import ARROW_FILE
from dqa.audit.kernels import TURN_COLUMNS, TURN_DTYPES, KernelTables, batch_metrics_and_turns
from dqa.audit.readers import Dataset, WorkUnit
from dqa.audit.token_batch import TokenBatch, arrow_view
from dqa.errors import RuntimeFailure
from dqa.memory import reuse_freed_memory

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


def scan_parts(ds: Dataset, tables: KernelTables, work: Path, batch_rows: int, progress: ProgressFn | None,
               workers: int, meanwhile: Callable[[], None] | None = None) -> tuple[Any, Any, int, int]:
    """Run the kernels over ``ds`` into parts under ``work``; return ``(metrics, turns, rows, tokens)``: the kernels'
    per-sample and per-turn tables (polars) in dataset order (None for an empty dataset), read back from the parts,
    which are then removed. ``workers`` > 1 scans the dataset's work units in that many processes (see the module
    docstring). ``meanwhile`` is called in this process once the workers are scanning (before the pass when it runs
    here): the caller's own preparations, which then overlap the pass. Raises ``InputError`` for bad input (the first
    in dataset order), ``RuntimeFailure`` when a worker dies (``KeyboardInterrupt`` when it was told to stop with the
    scan's process group), and whatever ``meanwhile`` raises (the workers are stopped then)."""
    units = None
    if workers > 1 and ds.num_rows:
        units = ds.work_units(batch_rows)
        units = guided_units(units, workers) if units else units
    if not units or len(units) < 2:
        if meanwhile is not None:
            meanwhile()
        pair = (work / "metrics.part.arrow", work / "turns.part.arrow")
        rows, tokens, _ = stream_metrics(ds.batches(batch_rows), tables, pair[0], progress, pair[1], str(ds.path))
        if not rows:  # no metrics part was written
            return None, None, 0, 0
        return *read_part_pair(pair), rows, tokens
    pairs = [(work / f"metrics.part-{k:05d}.arrow", work / f"turns.part-{k:05d}.arrow") for k in range(len(units))]
    procs = min(workers, len(units))
    threads = default_workers() > procs  # spare cores: each worker reads ahead and decodes with threads too
    tasks = [(k, u, batch_rows, pairs[k], str(ds.path), threads) for k, u in enumerate(units)]
    rows = tokens = 0
    checked = False
    executor = ProcessPoolExecutor(procs, mp_context=_context(), initializer=_init_worker,
                                   initargs=(ds, tables, os.getpid()))
    loader = threading.Thread(target=_load_quietly, args=(tables,), name="dqa-tokenizer", daemon=True)
    try:
        futures = [executor.submit(_scan_unit, task) for task in tasks]  # the workers start on the first units now
        if meanwhile is not None:
            meanwhile()
        # Then this process would only wait: it loads the tokenizer the report decodes the degenerate templates with
        # (0.3-0.5 s, otherwise spent after the pass). Its errors surface where it is used.
        loader.start()
        for future in futures:  # in unit order: the first error is the first bad row
            k, n_rows, n_tokens, fit = future.result()
            rows, tokens = rows + n_rows, tokens + n_tokens
            checked = checked or (k == 0 and fit)
            if progress:
                progress(rows, tokens)
    except BrokenProcessPool:
        procs = _workers(executor)
        _stop(executor)
        raise _death(procs, str(ds.path)) from None
    except BaseException:  # a bad row, Ctrl-C, meanwhile's error: the other units' work is moot
        _stop(executor)
        raise
    # The parts are read back once the workers have exited: read during the pass (0.07 s less serial tail on the
    # 200M-token sets), the set's tables would sit beside every worker's retained heap, raising the scan's peak.
    executor.shutdown()
    read = read_parts(pairs, procs)
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


def _stop(executor: ProcessPoolExecutor) -> None:
    """Stop ``executor`` now: pending units cancelled, running ones killed (``shutdown`` alone waits for them), and
    every worker joined, so that none writes into the work folder after this returns."""
    procs = _workers(executor)
    terminate = getattr(executor, "terminate_workers", None)  # Python 3.14+ (it does not join)
    if terminate is not None:
        terminate()
    else:
        executor.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
    for proc in procs:
        proc.join()


def _workers(executor: ProcessPoolExecutor) -> list:
    """The executor's worker processes (``shutdown`` forgets them; the standard library has no public list)."""
    return list((getattr(executor, "_processes", None) or {}).values())


def _death(procs: list, dataset: str) -> BaseException:
    """What a broken pool means, from how its workers ended (the pool terminates the others with SIGTERM when one
    dies): a SIGKILL is most often the out-of-memory killer; another failure names its exit code; SIGTERM or SIGINT
    alone means the whole process group was told to stop: an interrupt."""
    codes = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
    stopped = (-signal.SIGTERM, -signal.SIGINT)
    if -signal.SIGKILL in codes:
        return RuntimeFailure(f"{dataset}: a scan worker process was killed (SIGKILL: the out-of-memory killer?); rerun "
                              "with fewer --workers or a smaller --batch-rows")
    failed = [c for c in codes if c not in stopped]
    if failed or not codes:
        return RuntimeFailure(f"{dataset}: a scan worker process died (exit {', '.join(map(str, failed)) or 'unknown'}); "
                              "rerun with --workers 1 to see the error in this process")
    return KeyboardInterrupt()


def _load_quietly(tables: KernelTables) -> None:
    try:
        tables.spec.tokenizer  # noqa: B018 (a lazy property: reading it loads the tokenizer)
    except Exception:  # the scan reports it where the tokenizer is used
        pass


def _context():
    """fork where the platform has it (the workers inherit the loaded tables; no re-import), else spawn."""
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


_WORKER: dict[str, Any] = {}


def _init_worker(ds: Dataset, tables: KernelTables, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the scan process's to handle: it stops the pool
    # ... by SIGTERM, which must end a worker wherever it is. The CLI's handler, inherited through fork, raises
    # KeyboardInterrupt, which a worker blocked on the pool's queue lock could swallow and then wait forever.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent)
    reuse_freed_memory()
    _WORKER["ds"], _WORKER["tables"] = ds, tables


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this worker when the scan's process dies (``kill -9``, the out-of-memory killer): the
    pool's queues are pipes that the workers hold open too, so an orphaned worker would wait on them forever. A no-op
    elsewhere. ``parent``: the scan's pid, to catch a parent that died before the request was made."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def _scan_unit(task) -> tuple[int, int, int, bool]:
    """Scan one unit into its parts; a unit whose store read failed (``dqa.storage.faults.is_transient``) is
    scanned again from its start, up to ``UNIT_ATTEMPTS`` times, with a growing pause (its parts are rewritten)."""
    from dqa.storage.faults import is_transient

    for attempt in range(1, UNIT_ATTEMPTS + 1):
        try:
            return _scan_unit_once(task)
        except Exception as exc:
            if attempt == UNIT_ATTEMPTS or not is_transient(exc):
                raise
            time.sleep(0.5 * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


UNIT_ATTEMPTS = 3


def _scan_unit_once(task) -> tuple[int, int, int, bool]:
    k, unit, batch_rows, (part, turns_part), dataset, threads = task
    ds: Dataset = _WORKER["ds"]
    # With a worker per core, one thread each: a reader thread or Arrow's decoding threads would only contend
    # for the same cores, and each thread's allocations go to a glibc arena of its own, whose heaps are
    # unmapped as they empty and refaulted on the next batch (~10% of a worker's CPU).
    rows, tokens, fit = stream_metrics(ds.unit_batches(unit, batch_rows, threads=threads), _WORKER["tables"], part, None,
                                       turns_part, dataset, check_fit=unit.start_row == 0, prefetch=threads)
    return k, rows, tokens, fit


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
