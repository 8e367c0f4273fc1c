"""``ProcessUnits``: a scan's units on a process pool of this machine (``dqa scan --workers N``).

The pool is ``concurrent.futures``' (fork on Linux: the workers inherit the dataset and the kernel tables, with
no re-import). A worker reads and decodes in its own thread when there are as many workers as cores, else with a
reader thread and Arrow's threads. Workers ignore Ctrl-C and die on SIGTERM; the scan's process stops the pool.
A worker that dies (the out-of-memory killer) fails the scan at once (``RuntimeFailure``, exit 3) instead of
leaving it waiting for that worker's units, and the workers die with the scan's process (Linux's parent-death
signal) instead of outliving it. A unit's error surfaces as it would in one process: the results are taken in
unit order, so the first bad row in dataset order is the one named, and the other workers are stopped.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator

from dqa.audit.kernels import KernelTables
from dqa.audit.readers import Dataset
from dqa.audit.scan_workers import UnitDone, UnitTask, default_workers, scan_unit
from dqa.errors import RuntimeFailure
from dqa.memory import reuse_freed_memory


class ProcessUnits:
    """A ``dqa.audit.executors.UnitRunner`` over ``workers`` processes of this machine."""

    def __init__(self, workers: int):
        self.slots = workers

    def results(self, ds: Dataset, tables: KernelTables, tasks: list[UnitTask],
                started: Callable[[], None]) -> Iterator[UnitDone]:
        """See ``UnitRunner.results``; raises ``KeyboardInterrupt`` when the workers were told to stop with the
        scan's process group."""
        procs = min(self.slots, len(tasks))
        threads = default_workers() > procs  # spare cores: each worker reads ahead and decodes with threads too
        executor = ProcessPoolExecutor(procs, mp_context=_context(), initializer=_init_worker,
                                       initargs=(ds, tables, os.getpid()))
        try:
            futures = [executor.submit(_scan_unit, t._replace(threads=threads)) for t in tasks]  # the workers start now
            started()
            for future in futures:  # in unit order: the first error is the first bad row
                yield future.result()
        except BrokenProcessPool:
            workers = _workers(executor)
            _stop(executor)
            raise _death(workers, str(ds.path)) from None
        except BaseException:  # a bad row, Ctrl-C, started's error, the caller stopping: the other units' work is moot
            _stop(executor)
            raise
        executor.shutdown()


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


def _scan_unit(task: UnitTask) -> UnitDone:
    """A worker's unit: ``scan_unit`` on the dataset and tables the worker was started with."""
    return scan_unit(task, _WORKER["ds"], _WORKER["tables"])
