"""``lazy_module``: a module imported on first use, for modules that the scan's process needs only after its
workers have started (polars: ~0.2 s of import, which then overlaps the workers' pass; see ``dqa.audit.scan``)."""

from __future__ import annotations

import importlib
from typing import Any


class _LazyModule:
    """Stands for the module named ``name``: the first attribute read imports it (``importlib.import_module``,
    under the interpreter's import lock, so from any thread) and every read is forwarded to it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):  # copy, pickle and hasattr probes: not the module's
            raise AttributeError(attr)
        return getattr(importlib.import_module(object.__getattribute__(self, "_name")), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_module(name: str) -> Any:
    """The module ``name``, imported when an attribute of it is first read (an import error is raised then)."""
    return _LazyModule(name)
