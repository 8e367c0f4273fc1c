"""dqa: audit, regenerate and gate tokenized LLM training sets.

The package is split the way the data flows (see docs/design.md):
``dqa.audit`` reads datasets and runs the named checks, ``dqa.regen`` drives a
generation fleet, ``dqa.expectations`` validates and gates releases and
``dqa.reports`` renders what a person reads. ``dqa.cli`` wires them together.

From Python, one function per step (``dqa.api``; the CLI commands call the same ones):
``dqa.scan`` (a path, or a table in memory: pyarrow, polars, HF ``datasets``), ``dqa.regenerate``,
``dqa.merge`` and ``dqa.gate``. Importing ``dqa`` loads none of the heavy libraries.
"""

__version__ = "0.1.0"

from dqa.api import GateResult, ScanResult, gate, merge, regenerate, scan  # noqa: E402

__all__ = ["scan", "regenerate", "merge", "gate", "ScanResult", "GateResult", "__version__"]
