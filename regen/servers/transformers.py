"""``transformers serve``: the CPU stand-in of a fleet (`dqa fleet up --engine transformers`).

It speaks the OpenAI chat API (``servers.openai``: the text round trip, it has no token-exact
route), is healthy when ``/health`` answers 200 (it has no ``/health_generate``), and reports no
metrics: no ``/metrics`` and no decode log line, so `dqa fleet status` shows up/down only.

sglang-router cannot front it (``no_router``): the router (0.3.2, ``--backend sglang`` and
``openai`` alike) re-serializes every generation request with SGLang's own fields added
(``/v1/chat/completions``: ignore_eos, no_stop_trim, skip_special_tokens, separate_reasoning,
stream_reasoning, continue_final_message, return_hidden_states; ``/v1/completions`` likewise), and
``transformers serve`` (5.25) answers any field it does not know with 422 "Unexpected fields in
the request". Registration and health checks pass (it answers ``/health``; ``/server_info`` and
``/model_info`` 404 are tolerated), so the router is ready and then every request fails, and the
422s open its circuits. tests/test_fleet_transformers.py checks this against both real programs.
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
    no_router = ("sglang-router (0.3.2) adds SGLang-only fields (ignore_eos, no_stop_trim, skip_special_tokens, ...) to every "
                 "request it passes on, and transformers serve answers each with 422 'Unexpected fields in the request'; "
                 "start the fleet without --router (dqa regen --fleet spreads the rows over its servers itself)")

    def launch_argv(self, spec, port: int) -> list[str]:
        """``transformers serve MODEL --host H --port P`` and the extra arguments; the generic
        server options of ``spec`` (context length, reasoning parser, metrics) do not apply."""
        return [transformers_executable(spec.python), "serve", spec.model, "--host", spec.host, "--port", str(port)] + list(spec.extra)


KIND = Transformers()
