"""``transformers serve``: the CPU stand-in of a fleet (`dqa fleet up --engine transformers`).

It speaks the OpenAI chat API (``servers.openai``: the text round trip, it has no token-exact
route), is healthy when ``/health`` answers 200 (it has no ``/health_generate``), and reports no
metrics: no ``/metrics`` and no decode log line, so `dqa fleet status` shows up/down only.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .base import EngineOptions, ServerKind


@dataclass(frozen=True)
class TransformersOptions(EngineOptions):
    """`dqa fleet up --engine transformers` has no options of its own."""


def transformers_executable(python: str) -> str:
    """The ``transformers`` console script next to ``python`` (same environment), else on PATH."""
    sibling = Path(python).parent / "transformers"
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("transformers") or "transformers"


class Transformers(ServerKind):
    name = "transformers"
    protocol = "openai"
    health_paths = ("/health",)
    launchable = True
    options = TransformersOptions
    no_metrics = "transformers serve has no /metrics or decode log"

    def launch_argv(self, spec, port: int) -> list[str]:
        """``transformers serve MODEL --host H --port P`` and the extra arguments; the generic
        server options of ``spec`` (context length, reasoning parser, metrics) do not apply."""
        return [transformers_executable(spec.python), "serve", spec.model, "--host", spec.host, "--port", str(port)] + list(spec.extra)


KIND = Transformers()
