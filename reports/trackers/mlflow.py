"""``--report-to mlflow``: an MLflow run, through ``MlflowClient`` (mlflow-skinny is enough).

Where it goes: ``$MLFLOW_TRACKING_URI`` when you set it (a server, a database); otherwise a local
file store, ``./mlruns`` (MLflow 3 keeps that backend behind ``MLFLOW_ALLOW_FILE_STORE``, which
dqa sets for its own client only when you set neither). The experiment is
``$MLFLOW_EXPERIMENT_NAME`` (default ``dqa``); the run is found again by its ``dqa.run`` tag on a
rerun. Histograms and text go in as artifacts (``histograms/TAG/step-N.json``, ``text/TAG/step-N.md``): MLflow
has no histogram type.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

from dqa.reports.trackers.base import RunName, Tracker

RUN_TAG = "dqa.run"


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else ``file:`` + the absolute path of ``./mlruns``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or Path("mlruns").resolve().as_uri()


class MlflowTracker(Tracker):
    """One MLflow run. Raises ``ImportError`` without mlflow (or mlflow-skinny)."""

    name = "mlflow"

    def __init__(self, run: RunName) -> None:
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = client = MlflowClient(tracking_uri=tracking_uri())
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or run.project
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        found = client.search_runs([exp_id], filter_string=f"tags.`{RUN_TAG}` = '{run.name}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
            keys = found[0].data.metrics.keys()
            steps = [m.step for k in keys for m in client.get_metric_history(self.run_id, k)]
            self.next_step = max(steps) + 1 if steps else 0
        else:
            created = client.create_run(exp_id, run_name=run.name, tags={RUN_TAG: run.name, **{f"dqa.{k}": v for k, v in run.config.items()}})
            self.run_id = created.info.run_id
            self.next_step = 0

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(_key(k), float(v), now, int(step)) for k, v in values.items()]
        if metrics:
            self._client.log_batch(self.run_id, metrics=metrics)

    def histogram(self, tag: str, values: Any, step: int) -> None:
        from dqa.reports.trackers.base import histogram_bins

        counts, edges = histogram_bins(values)
        self._client.log_dict(self.run_id, {"step": int(step), "edges": [float(e) for e in edges], "counts": [int(c) for c in counts]},
                              f"histograms/{_key(tag)}/step-{int(step)}.json")

    def text(self, tag: str, text: str, step: int) -> None:
        self._client.log_text(self.run_id, text, f"text/{_key(tag)}/step-{int(step)}.md")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def _key(tag: str) -> str:
    """An MLflow metric key or artifact folder from a tag (MLflow allows letters, digits, _-./ and space)."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in tag)


TRACKER = MlflowTracker
