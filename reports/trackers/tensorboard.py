"""``--report-to tensorboard``: event files that TensorBoard reads, written with the tensorboard
package's own event writer and protobufs (no TensorFlow, no torch).

The run's folder is ``$DQA_TENSORBOARD_DIR/RUN_NAME/`` (default ``runs/RUN_NAME/``, as the
trainers' TensorBoard callbacks do); a rerun adds an event file beside the earlier ones, after
their last step. Point TensorBoard at it: ``tensorboard --logdir runs``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

from dqa.reports.trackers.base import RunName, Tracker

DIR_ENV = "DQA_TENSORBOARD_DIR"
DEFAULT_DIR = "runs"


class TensorBoardTracker(Tracker):
    """One run's folder of event files. Raises ``ImportError`` without the tensorboard package."""

    name = "tensorboard"

    def __init__(self, run: RunName) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = event_pb2, summary_pb2
        self.logdir = Path(os.environ.get(DIR_ENV) or DEFAULT_DIR) / run.name
        self.next_step = _next_step(self.logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.logdir))
        self.text("run", f"dqa {run.command}: dataset `{run.dataset}`, run folder `{run.folder}`", self.next_step)

    def _write(self, value: Any, step: int) -> None:
        summary = self._summary.Summary(value=[value])
        self._writer.add_event(self._event.Event(wall_time=time.time(), step=int(step), summary=summary))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for tag, v in values.items():
            self._write(self._summary.Summary.Value(tag=tag, simple_value=float(v)), step)

    def histogram(self, tag: str, values: Any, step: int) -> None:
        import numpy as np

        from dqa.reports.trackers.base import histogram_bins

        arr = np.asarray(values, dtype=np.float64)
        counts, edges = histogram_bins(arr)
        proto = self._summary.HistogramProto(min=float(arr.min()), max=float(arr.max()), num=float(arr.size),
                                             sum=float(arr.sum()), sum_squares=float(np.dot(arr, arr)),
                                             bucket_limit=[float(e) for e in edges[1:]], bucket=[float(c) for c in counts])
        self._write(self._summary.Summary.Value(tag=tag, histo=proto), step)

    def text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2
        from tensorboard.plugins.text import plugin_data_pb2

        meta = self._summary.SummaryMetadata(plugin_data=self._summary.SummaryMetadata.PluginData(
            plugin_name="text", content=plugin_data_pb2.TextPluginData(version=0).SerializeToString()))
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode("utf-8")],
                                        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
        self._write(self._summary.Summary.Value(tag=tag, metadata=meta, tensor=tensor), step)

    def close(self) -> None:
        self._writer.close()


def _next_step(logdir: Path) -> int:
    """One past the highest step of the event files already in ``logdir`` (0 when none), read with
    TensorBoard's ``EventAccumulator``."""
    if not logdir.is_dir() or not any(logdir.glob("events.out.tfevents.*")):
        return 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 1, "tensors": 1})
    acc.Reload()
    tags = acc.Tags()
    steps = [e.step for t in tags.get("scalars", []) for e in acc.Scalars(t)]
    steps += [e.step for t in tags.get("histograms", []) for e in acc.Histograms(t)]
    steps += [e.step for t in tags.get("tensors", []) for e in acc.Tensors(t)]
    return max(steps) + 1 if steps else 0


TRACKER = TensorBoardTracker
