"""The typed values a ``dqa regen`` run's steps hand each other (``dqa.regen.run.regenerate``
calls the steps in order; each step's module says what it takes and returns):

``View`` (``run_view``), ``Servers`` (``run_servers``), ``Inputs`` (``run_inputs``), ``Place`` and
``Resume`` (``run_output``), ``Books`` and ``Finished`` (``run_books``), ``Dispatched``
(``run_dispatch``). Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from dqa.regen.config import Selection
from dqa.regen.dispatch.progress import Progress
from dqa.regen.servers import ServerKind
from dqa.regen.store.folder import RunFolder, RunManifest
from dqa.regen.store.journal import Recovery
from dqa.regen.store.upload import Target, Uploader

if TYPE_CHECKING:
    from dqa.regen.dispatch.scheduler import Dispatcher


@dataclass(frozen=True)
class View:
    """How the run shows itself: ``log`` (one-line events, URL credentials removed), ``live`` (the
    live display), ``signals`` (drain on the first SIGINT/SIGTERM: the CLI, on the main thread) and
    ``on_progress`` (called with each progress.json snapshot as it is written; ``--report-to``)."""

    log: Callable[[str], None]
    live: bool
    signals: bool
    on_progress: Callable[[dict[str, Any]], None] | None = None


@dataclass(frozen=True)
class Servers:
    """The servers a run talks to, resolved from ``--endpoint``/``--fleet``: ``urls`` (deduplicated,
    no trailing slash), ``kind`` (the server kind of the request protocol), ``model`` ("" when not
    known), request ``headers`` (the bearer key), ``gpus`` for the cost figures and ``declared``:
    what the fleet files record of a URL's server that it cannot say itself (``{URL: {"name",
    "version"}}``, ``FleetSet.declared``; given to ``servers.facts.settle``)."""

    urls: list[str]
    kind: ServerKind
    model: str
    headers: dict[str, str]
    gpus: int
    declared: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def protocol(self) -> str:
        """The request protocol's name (run.json's ``protocol``)."""
        return self.kind.protocol


@dataclass
class Inputs:
    """The dataset opened and the rows selected: ``ds``, its ``num_rows``, the resolved ``findings``
    path, the rows selected before and after ``--shard``/``--limit`` (``rows_all``, ``rows``), the
    chat format read so far (``spec``: conversations are rendered at read time) and the run's
    ``identity`` (dataset, selection; ``load_template`` adds sampling); ``selection`` is the group
    they were selected by."""

    ds: Any
    num_rows: int
    findings: Path
    rows_all: np.ndarray
    rows: np.ndarray
    spec: Any
    identity: dict[str, Any]
    selection: Selection


@dataclass(frozen=True)
class Place:
    """Where this session writes: ``folder`` (``--out`` itself, or the local staging folder of an
    object-store ``--out``), ``url`` (``--out`` as given), ``remote`` (an object-store ``--out``),
    ``targets`` (that ``--out`` first, then the mirrors) and ``shard_tag`` (``s<i>of<N>``)."""

    url: str
    remote: bool
    folder: RunFolder
    targets: list[Target]
    shard_tag: str

    @property
    def out(self) -> Path:
        return self.folder.path


@dataclass
class Resume:
    """What the output folder already holds (``rec``), the selected rows still to do (``todo``), and
    the outputs of conversations an earlier session left half done (``partial``)."""

    rec: Recovery
    todo: np.ndarray
    partial: dict[int, dict[int, np.ndarray]]


@dataclass
class Books:
    """What the session records: ``manifest`` (run.json as written at start), ``progress`` (the
    counters), ``uploader`` (copies to the targets), ``sent`` (rows were left to send) and
    ``next_seq`` (the journal's next shard number)."""

    manifest: RunManifest
    progress: Progress
    uploader: Uploader
    sent: bool
    next_seq: int


@dataclass(frozen=True)
class Dispatched:
    """How dispatch ended: ``state`` (finished, interrupted or failed) and the ``dispatcher`` (its
    endpoints, failures and fatal message)."""

    state: str
    dispatcher: Dispatcher


@dataclass(frozen=True)
class Finished:
    """The final progress snapshot (``snap``) and the shards of the folder."""

    snap: dict[str, Any]
    shards: list[Path]

