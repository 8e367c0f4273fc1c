"""``--report-to trackio``: a trackio run in its local store (``$TRACKIO_DIR``, default
``~/.cache/huggingface/trackio``; nothing is sent: dqa never passes a Space). The project is
``$TRACKIO_PROJECT`` (default ``dqa``); the run is resumed by name on a rerun. See it with
``trackio show --project dqa``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from dqa.reports.trackers.base import RunName, Tracker


class TrackioTracker(Tracker):
    """One trackio run. Raises ``ImportError`` without the trackio package."""

    name = "trackio"

    def __init__(self, run: RunName) -> None:
        import trackio
        from trackio.sqlite_storage import SQLiteStorage

        self._trackio = trackio
        project = os.environ.get("TRACKIO_PROJECT") or run.project
        last = SQLiteStorage.get_last_step(project, run.name)
        self.next_step = 0 if last is None else int(last) + 1
        self._run = trackio.init(project=project, name=run.name, config=run.config, resume="allow", embed=False,
                                 auto_log_cpu=False, auto_log_gpu=False)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self._run.log(dict(values), step=step)

    def histogram(self, tag: str, values: Any, step: int) -> None:
        import numpy as np

        self._run.log({tag: self._trackio.Histogram(np.asarray(values, dtype=np.float64))}, step=step)

    def text(self, tag: str, text: str, step: int) -> None:
        self._run.log({tag: self._trackio.Markdown(text)}, step=step)

    def close(self) -> None:
        from trackio import context_vars

        if context_vars.current_run.get() is self._run:
            self._trackio.finish()  # also forgets it as the current run: trackio's exit hook would finish it again, printing
        else:
            self._run.finish()


TRACKER = TrackioTracker
