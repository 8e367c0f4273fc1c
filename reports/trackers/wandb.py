"""``--report-to wandb``: a Weights & Biases run, through the wandb library.

Offline unless asked: when ``WANDB_MODE`` is unset the run is written offline to
``$WANDB_DIR/wandb/offline-run-*`` (default: the current folder), and ``wandb sync`` sends it
later; ``WANDB_MODE=online`` (with your key) sends it live. The project is ``$WANDB_PROJECT``
(default ``dqa``); the run id is the dqa run name, resumed on a rerun (``resume="allow"``).
Text (the root-cause template, the gate's reasons) goes to the run's summary.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from dqa.reports.trackers.base import RunName, Tracker


class WandbTracker(Tracker):
    """One wandb run. Raises ``ImportError`` without the wandb package."""

    name = "wandb"

    def __init__(self, run: RunName) -> None:
        import wandb

        self._wandb = wandb
        mode = os.environ.get("WANDB_MODE") or "offline"
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT") or run.project, id=run.run_id, name=run.name,
                               resume="allow", mode=mode, config=run.config, dir=os.environ.get("WANDB_DIR") or None,
                               reinit="create_new")
        self.next_step = int(getattr(self._run, "step", 0) or 0)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self._run.log(dict(values), step=step)

    def histogram(self, tag: str, values: Any, step: int) -> None:
        from dqa.reports.trackers.base import histogram_bins

        self._run.log({tag: self._wandb.Histogram(np_histogram=histogram_bins(values))}, step=step)

    def text(self, tag: str, text: str, step: int) -> None:
        self._run.summary[tag] = text

    def close(self) -> None:
        self._run.finish()


TRACKER = WandbTracker
