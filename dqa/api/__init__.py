"""dqa's front door for Python: one function per step, each taking its inputs as arguments.
Each returns a typed result and raises dqa's own errors (``dqa.errors``); the CLI commands call these.

- ``scan(data, tokenizer=..., **options)`` -> ``ScanResult`` (``dqa.api.scanning``): a dataset path,
  a ``pyarrow.Table``, a polars DataFrame or an HF ``datasets.Dataset``; ``result.mask`` keeps the
  passing rows (``ds.select(np.flatnonzero(result.mask))``).
- ``regenerate(dataset, out, **options)`` -> ``RunResult`` (``dqa.api.regenerating``).
- ``merge(dataset, regen, out, **options)`` -> ``MergeSummary`` (``dqa.api.merging``).
- ``gate(release, baseline, **options)`` -> ``GateResult`` (``dqa.api.gating``).

Heavy libraries load when a function is called, not when ``dqa`` is imported.
"""

from dqa.api.gating import GateResult, gate
from dqa.api.merging import merge
from dqa.api.regenerating import regenerate
from dqa.api.scanning import ScanResult, scan

__all__ = ["scan", "regenerate", "merge", "gate", "ScanResult", "GateResult"]
