"""Scan executors: where a scan's units run (``dqa.audit.scan_workers``' ``UnitTask``s).

``unit_runner`` picks the executor from the scan's options; ``scan_parts`` runs the pass on it. An executor
(``UnitRunner``) runs every unit with ``scan_workers.scan_unit``, leaves each unit's parts at its task's ``pair``
paths in the scan's local work folder, and yields the units' ``UnitDone``s in unit order. The merge of the parts
(reading them back, the set-level counts, the format check) is ``scan_workers.scan_parts``', shared by every
executor: an executor decides only where the units run.

- ``processes.ProcessUnits``: a process pool on this machine (``dqa scan --workers N``).
- ``ray_tasks.RayUnits``: Ray tasks on a cluster, each reading its unit from the store on its own node
  (``dqa scan --ray``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from dqa.audit import scan_workers

if TYPE_CHECKING:
    from dqa.audit.kernels import KernelTables
    from dqa.audit.readers import Dataset
    from dqa.audit.scan_workers import UnitDone, UnitTask


class UnitRunner(Protocol):
    """Runs a scan's units (see the module docstring)."""

    slots: int  # how many units run at once: the units are cut for this many (``scan_workers.guided_units``)

    def results(self, ds: "Dataset", tables: "KernelTables", tasks: "list[UnitTask]",
                started: Callable[[], None]) -> "Iterator[UnitDone]":
        """Run ``tasks`` and yield their ``UnitDone``s in unit order, each once its parts are in place; call
        ``started`` once, in this process, when the units are running. Raises ``InputError`` for the first bad
        unit in order, ``RuntimeFailure`` for a unit that could not be scanned, and what ``started`` raises; the
        units still running are stopped then, and when the caller stops iterating (Ray tasks on a caller's own
        connection run out instead: ``ray_tasks.RayUnits.results``)."""
        ...


def scan_parts(ds: "Dataset", tables: "KernelTables", work: Path, batch_rows: int,
               progress: "scan_workers.ProgressFn | None", runner: "UnitRunner | None",
               meanwhile: Callable[[], None] | None = None) -> tuple[Any, Any, int, int]:
    """The scan's kernel pass on ``runner`` (``unit_runner``'s; None: in this process): ``scan_workers.scan_parts``,
    which returns ``(metrics, turns, rows, tokens)`` and says what it raises."""
    return scan_workers.scan_parts(ds, tables, work, batch_rows, progress, meanwhile, runner)


def unit_runner(ray: str | None, workers: int) -> Any:
    """A context holding the scan's ``UnitRunner`` (None: the units run in this process), for
    ``scan_workers.scan_parts``: Ray tasks when ``ray`` names a cluster (``ray_tasks.connect``: auto, local, an
    address; with ``local``, ``workers`` is the local cluster's CPUs), else a pool of ``workers`` processes when
    that is more than one. The scan closes it after its outputs are written, so that a Ray connection of the
    scan's own ends while they are (``ray_tasks.RayUnits``). Raises ``InputError`` when the Ray cluster cannot be
    reached."""
    if ray is not None:
        from dqa.audit.executors.ray_tasks import connect

        return connect(ray, workers)
    if workers > 1:
        from dqa.audit.executors.processes import ProcessUnits

        return contextlib.nullcontext(ProcessUnits(workers))
    return contextlib.nullcontext(None)
