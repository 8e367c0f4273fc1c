"""Scan executors: where a scan's units run (``dqa.audit.scan_workers``' ``UnitTask``s).

An executor (``UnitRunner``) runs every unit with ``scan_workers.scan_unit``, leaves each unit's parts at its
task's ``pair`` paths in the scan's local work folder, and yields the units' ``UnitDone``s in unit order. The merge
of the parts (reading them back, the set-level counts, the format check) is ``scan_workers.scan_parts``', shared
by every executor: an executor decides only where the units run.

- ``processes.ProcessUnits``: a process pool on this machine (``dqa scan --workers N``).
- ``ray_tasks.RayUnits``: Ray tasks on a cluster, each reading its unit from the store on its own node
  (``dqa scan --ray``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Protocol

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
        units still running are stopped then, and when the caller stops iterating."""
        ...
