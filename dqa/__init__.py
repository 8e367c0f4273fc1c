"""dqa: audit, regenerate and gate tokenized LLM training sets.

The package is split the way the data flows (see DESIGN.md):
``dqa.audit`` reads datasets and runs the named checks, ``dqa.regen`` drives a
generation fleet, ``dqa.expectations`` validates and gates releases and
``dqa.reports`` renders what a person reads. ``dqa.cli`` wires them together.
"""

__version__ = "0.1.0"
