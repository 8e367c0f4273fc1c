"""``--report-to NAME``: the experiment trackers dqa reports to, and the set of open runs.

``TRACKERS`` is the registry: ``--report-to`` name -> (module of this package, the pip extra that
installs its library). ``open_trackers`` imports only the modules asked for; each imports its
library when its run opens. Nothing is sent anywhere unless asked: wandb runs offline unless
``WANDB_MODE`` says otherwise, MLflow writes a local store unless ``MLFLOW_TRACKING_URI`` names
another, trackio and TensorBoard write local files (docs/trackers.md).

What each command reports lives in ``dqa.reports.trackers.feed``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from dqa.errors import UsageError
from dqa.reports.trackers.base import RunName, Tracker

# name -> (module in this package, pip extra, the library's top-level module)
TRACKERS: dict[str, tuple[str, str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb", "wandb"),
    "trackio": ("trackio", "trackio", "trackio"),
    "mlflow": ("mlflow", "mlflow", "mlflow"),
}

REPORT_TO_HELP = ("Report this run's figures to an experiment tracker: " + ", ".join(TRACKERS)
                  + " (repeatable; each needs its extra, e.g. pip install 'dqa\\[wandb]'; nothing leaves this machine unless the "
                  "tracker is configured to send it: see docs/trackers.md).")


def check_names(names: Iterable[str]) -> list[str]:
    """The ``--report-to`` names, deduplicated in order. Raises ``UsageError`` (exit 2) for a name
    not in ``TRACKERS``."""
    out: list[str] = []
    for n in names:
        if n not in TRACKERS:
            raise UsageError(f"--report-to {n}: expected one of {', '.join(TRACKERS)}")
        if n not in out:
            out.append(n)
    return out


def require(names: Iterable[str]) -> list[str]:
    """``check_names``, and each tracker's library can be imported (checked without importing
    it, before a command starts its work). Returns the names; raises ``UsageError`` (exit 2) for
    an unknown name or a missing library, naming the extra that installs it."""
    import importlib.util

    wanted = check_names(names)
    for n in wanted:
        if importlib.util.find_spec(TRACKERS[n][2]) is None:
            raise _missing(n, TRACKERS[n][2])
    return wanted


def _missing(name: str, what: str) -> UsageError:
    return UsageError(f"--report-to {name}: its library is not installed ({what}); "
                      f"install it with: pip install 'dqa[{TRACKERS[name][1]}]'")


def tracker_class(name: str) -> type[Tracker]:
    """The ``Tracker`` subclass of ``name``. Raises ``UsageError`` for an unknown name."""
    check_names([name])
    module = importlib.import_module(f"dqa.reports.trackers.{TRACKERS[name][0]}")
    return module.TRACKER


class Trackers:
    """The open runs of one command, one per ``--report-to`` name, called together.

    ``floor``: the first step no run holds yet (0 for new runs; after what a resumed run holds);
    a step handed to ``scalars``/``histogram``/``text`` below it, or below the last step used, is
    raised to it, so steps never go back. Library output (trackio prints to stdout) goes to stderr, so ``--json`` stays clean;
    with ``quiet`` it is dropped."""

    def __init__(self, runs: Sequence[Tracker], quiet: bool = False) -> None:
        self.runs = list(runs)
        self.quiet = quiet
        self.floor = max((getattr(r, "next_step", 0) for r in self.runs), default=0)
        self.last: int | None = None  # the highest step used so far
        self._broken: set[str] = set()

    @property
    def step(self) -> int:
        """The next fresh step: one past the last used, or the first no resumed run holds."""
        return self.floor if self.last is None else self.last + 1

    def __bool__(self) -> bool:
        return bool(self.runs)

    @contextlib.contextmanager
    def _out(self) -> Iterator[None]:
        target = open(os.devnull, "w") if self.quiet else sys.stderr
        try:
            with contextlib.redirect_stdout(target):
                yield
        finally:
            if self.quiet:
                target.close()

    def _at(self, step: int | None) -> int:
        """``step``, raised to the last step used (or the resumed runs' floor); None: the next one."""
        if step is None:
            return self.step
        return max(int(step), self.floor if self.last is None else self.last)

    def _used(self, at: int) -> None:
        self.last = at if self.last is None else max(self.last, at)

    def scalars(self, values: Mapping[str, float], step: int | None = None) -> int:
        """Record ``values`` in every run at ``step`` (None: the next step). Returns the step used."""
        at = self._at(step)
        clean = {k: float(v) for k, v in values.items() if v is not None}
        with self._out():
            for r in self.runs:
                r.scalars(clean, at)
        self._used(at)
        return at

    def histogram(self, tag: str, values: Any, step: int | None = None) -> None:
        """Record the distribution of ``values`` in every run (nothing for no values). Returns nothing."""
        if len(values) == 0:
            return
        at = self._at(step)
        with self._out():
            for r in self.runs:
                r.histogram(tag, values, at)
        self._used(at)

    def text(self, tag: str, text: str, step: int | None = None) -> None:
        """Record ``text`` in every run. Returns nothing."""
        at = self._at(step)
        with self._out():
            for r in self.runs:
                r.text(tag, text, at)
        self._used(at)

    def live(self, values: Mapping[str, float], step: int) -> None:
        """``scalars`` for live updates during a run: a tracker that fails is named once on stderr
        and left out of later live updates, so a tracker never stops the run. Returns nothing."""
        at = self._at(step)
        clean = {k: float(v) for k, v in values.items() if v is not None}
        with self._out():
            for r in self.runs:
                if r.name in self._broken:
                    continue
                try:
                    r.scalars(clean, at)
                except Exception as exc:  # noqa: BLE001 - reported, then that tracker sits out the live updates
                    self._broken.add(r.name)
                    print(f"dqa: warning: --report-to {r.name}: live update failed ({type(exc).__name__}: {exc}); "
                          "the final figures are still sent", file=sys.stderr)
        self._used(at)

    def close(self) -> None:
        """End every run. Returns nothing; raises the first tracker's error after closing the rest."""
        first: BaseException | None = None
        with self._out():
            for r in self.runs:
                try:
                    r.close()
                except Exception as exc:  # noqa: BLE001 - close the others first
                    first = first or exc
        self.runs = []
        if first is not None:
            raise first

    def __enter__(self) -> "Trackers":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_trackers(names: Iterable[str], run: RunName, quiet: bool = False) -> Trackers:
    """Open ``run`` in each tracker of ``names`` (``--report-to``), resuming a run of the same name.

    Returns ``Trackers`` (empty, and importing nothing, for no names). Raises ``UsageError``
    (exit 2) for an unknown name, or when a tracker's library is missing: one line naming the
    extra that installs it. A tracker that cannot open its run raises its library's error."""
    wanted = check_names(names)
    opened: list[Tracker] = []
    trackers = Trackers(opened, quiet=quiet)
    try:
        for n in wanted:
            cls = tracker_class(n)
            try:
                with trackers._out():
                    opened.append(cls(run))
            except ImportError as exc:
                raise _missing(n, getattr(exc, "name", None) or str(exc)) from exc
    except BaseException:
        trackers.close()
        raise
    return Trackers(opened, quiet=quiet)


def report(names: Iterable[str], command: str, dataset: str | Path, folder: str | Path, fn: Callable[..., Any], *args: Any,
           quiet: bool = False) -> None:
    """Open the run of ``command`` over ``dataset`` writing ``folder`` in each tracker of
    ``names``, call ``fn(trackers, *args)`` (one of ``feed``'s ``report_*``), and close it.
    Nothing happens for no names. Raises what ``open_trackers`` or ``fn`` raises."""
    names = list(names)
    if not names:
        return
    with open_trackers(names, RunName.of(command, dataset, folder), quiet=quiet) as trackers:
        fn(trackers, *args)


__all__ = ["TRACKERS", "REPORT_TO_HELP", "RunName", "Tracker", "Trackers", "check_names", "open_trackers", "report", "require",
           "tracker_class"]
