"""The one interface every tracker module implements, and the name of a run.

A ``Tracker`` gets figures in three shapes: ``scalars`` (named numbers at a step), ``histogram``
(the raw values of one tag at a step; the tracker bins them its own way) and ``text`` (a tag's
text at a step). ``close`` ends the run. Each tracker module (``tensorboard``, ``wandb``,
``trackio``, ``mlflow``) subclasses it and imports its library in ``__init__`` only: importing
the module itself is free, so the registry can name every tracker without installing any.

A run's name comes from what it is about (``RunName.of``): the command, the dataset's identity
(its resolved path) and the run folder the command writes (the scan folder, the regen ``--out``,
the repair work folder, the gate's output folder). The same command on the same dataset and folder
gets the same name and id, so a rerun (a resumed regen, a rescan) continues its run in the
tracker instead of starting another.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class RunName:
    """What a tracker run is called: ``project`` (``dqa``), ``name`` (``COMMAND-DATASET-HASH``),
    ``run_id`` (the same string; a tracker with its own id rules derives its id from it),
    ``command``, ``dataset`` (the resolved path) and ``folder`` (the run folder, resolved or a URL)."""

    project: str
    name: str
    command: str
    dataset: str
    folder: str

    @property
    def run_id(self) -> str:
        return self.name

    @property
    def config(self) -> dict[str, str]:
        """The run's identity as a flat dict, recorded as the run's config/params/tags."""
        return {"dqa_command": self.command, "dataset": self.dataset, "run_folder": self.folder}

    @classmethod
    def of(cls, command: str, dataset: str | Path, folder: str | Path, project: str = "dqa") -> "RunName":
        """The run of ``command`` over ``dataset`` writing ``folder``. A local path is resolved (as
        the dataset's identity is, ``dqa.audit.identity``), a URL kept as given. Returns the
        ``RunName``; never raises."""
        ds, fo = _identity(dataset), _identity(folder)
        digest = hashlib.sha256(f"{command}\n{ds}\n{fo}".encode()).hexdigest()[:10]
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(ds.rstrip("/")).name or "dataset").strip("-.")[:40] or "dataset"
        return cls(project, f"{command}-{stem}-{digest}", command, ds, fo)


def _identity(path: str | Path) -> str:
    text = str(path)
    if "://" in text:
        return text
    return str(Path(text).resolve())


class Tracker:
    """One open run in one tracker. Subclasses implement the four methods; each raises only what
    its library raises (a tracker that cannot write is an error the command reports)."""

    #: the ``--report-to`` name
    name = ""

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Record named numbers at ``step`` (steps never go back within a run). Returns nothing."""
        raise NotImplementedError

    def histogram(self, tag: str, values: Sequence[float] | Any, step: int) -> None:
        """Record the distribution of ``values`` (a sequence or numpy array, not empty) under ``tag``
        at ``step``. Returns nothing."""
        raise NotImplementedError

    def text(self, tag: str, text: str, step: int) -> None:
        """Record ``text`` (Markdown) under ``tag`` at ``step``. Returns nothing."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush and end the run (a later run of the same name continues it). Returns nothing."""
        raise NotImplementedError


def histogram_bins(values: Any, max_bins: int = 64) -> tuple[Any, Any]:
    """``(counts, edges)`` of ``values`` for trackers that take binned data: integer-wide bins when
    the values are integers spanning fewer than ``max_bins``, else ``max_bins`` equal bins
    (``numpy.histogram``). Raises ``ValueError`` for no values."""
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("a histogram of no values")
    lo, hi = float(arr.min()), float(arr.max())
    if np.all(arr == np.round(arr)) and hi - lo + 1 <= max_bins:
        edges = np.arange(lo, hi + 2) - 0.5
        return np.histogram(arr, bins=edges)
    return np.histogram(arr, bins=max_bins)
