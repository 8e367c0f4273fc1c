"""dqa: audit, regenerate and gate tokenized LLM training sets.

The package is split the way the data flows (see DESIGN.md):
``dqa.audit`` reads datasets and runs the named checks, ``dqa.regen`` drives a
generation fleet, ``dqa.expectations`` validates and gates releases and
``dqa.reports`` renders what a person reads. ``dqa.cli`` wires them together.

From Python, one function per step (``dqa.api``; the CLI commands call the same ones):
``dqa.scan`` (a path, or a table in memory: pyarrow, polars, HF ``datasets``), ``dqa.regenerate``,
``dqa.merge`` and ``dqa.gate``. Importing ``dqa`` loads none of the heavy libraries, and ``dqa.api`` only
when one of those names is first used: a module deep in the package (a scan's pool, before it forks) does not
pay for the API's imports (~35 ms).
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["scan", "regenerate", "merge", "gate", "ScanResult", "GateResult", "__version__"]

if TYPE_CHECKING:
    from dqa.api import GateResult, ScanResult, gate, merge, regenerate, scan  # noqa: F401


def __getattr__(name: str) -> Any:
    """``dqa.scan`` and the other API names of ``__all__``, imported from ``dqa.api`` on first use. Raises
    ``AttributeError`` for any other name."""
    if name in __all__:
        import dqa.api

        value = getattr(dqa.api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dqa' has no attribute {name!r}")
