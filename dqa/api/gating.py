"""``dqa.gate``: the release gate from Python; what ``dqa gate`` runs.

::

    verdict = dqa.gate("releases/v7/", "releases/v6/", tokenizer="qwen3")
    verdict.passed, verdict.reasons, verdict.out_dir   # gate.json, gate.md, junit.xml, validation/ there

The release (and baseline) is a dataset, scanned into its default scan folder, or a scan folder,
reused. Drift thresholds default to ``DriftThresholds``'s; give any of its fields as a keyword
(``max_ks=0.2``) or a whole ``thresholds``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from dqa.errors import UsageError

if TYPE_CHECKING:
    from dqa.expectations.gate import DriftThresholds


@dataclass
class GateResult:
    """One gate's verdict: ``report`` is ``gate.json``'s dict (verdict, reasons, drift, validation,
    outputs); ``out_dir`` the folder holding it."""

    report: dict[str, Any]
    out_dir: Path

    @property
    def verdict(self) -> str:
        """``pass`` or ``fail``."""
        return self.report["verdict"]

    @property
    def passed(self) -> bool:
        """True when the gate passed."""
        return self.report["verdict"] == "pass"

    @property
    def reasons(self) -> list[str]:
        """Why the gate failed, one line each (empty when it passed)."""
        return list(self.report["reasons"])


def gate(release: str | Path, baseline: str | Path | None = None, *, suite: str | Path = "release",
         out: str | Path | None = None, fail_on: str = "critical", thresholds: "DriftThresholds | None" = None,
         max_ids: int | None = None, docs: bool = True, tokenizer: str | None = None, thinking: str = "auto",
         progress: Callable[[int, int], None] | None = None, **drift: float | None) -> GateResult:
    """Validate ``release`` with ``suite`` and, with ``baseline``, check its drift; returns a ``GateResult``.

    ``out``: the gate folder (default ``RELEASE_SCAN_FOLDER/gate/``); ``fail_on``: ``critical`` or
    ``warning``; ``max_ids``: failing sample ids listed per expectation (default 20); ``docs``: build
    GX Data Docs; ``tokenizer``/``thinking``: for fresh scans, whose ``progress(rows, tokens)`` is
    reported. ``drift``: ``DriftThresholds`` fields (``max_row_drop``, ``max_row_growth``,
    ``max_failing_share_increase``, ``max_ks``, ``ks_alpha``) over ``thresholds``.

    A failed gate is a result (``passed`` False), not an error. Raises ``UsageError`` for a
    threshold out of range, a baseline that is the release itself or an unknown keyword,
    ``InputError``/``RuntimeFailure`` for unreadable inputs or suites.
    """
    from dataclasses import fields, replace

    from dqa.expectations.gate import DriftThresholds, gate_release

    known = {f.name for f in fields(DriftThresholds)}
    unknown = sorted(set(drift) - known)
    if unknown:
        raise UsageError(f"gate: unknown option {unknown[0]!r} (drift thresholds: {', '.join(sorted(known))})")
    thr = replace(thresholds or DriftThresholds(), **drift)
    for name, value in (("--max-row-drop", thr.max_row_drop), ("--max-failing-share-increase", thr.max_failing_share_increase),
                        ("--max-ks", thr.max_ks)):
        if not 0.0 <= value <= 1.0:
            raise UsageError(f"{name} {value}: expected a share between 0 and 1")
    if thr.max_row_growth is not None and thr.max_row_growth < 0:
        raise UsageError(f"--max-row-growth {thr.max_row_growth}: expected 0 or more")
    if not 0.0 < thr.ks_alpha < 1.0:
        raise UsageError(f"--ks-alpha {thr.ks_alpha}: expected a probability between 0 and 1")
    if max_ids is not None and max_ids < 0:
        raise UsageError("--max-ids must be 0 or more")
    extra = {} if max_ids is None else {"max_ids": max_ids}
    report = gate_release(release, baseline, suite, out, fail_on, thr, tokenizer, thinking, docs=docs, progress=progress, **extra)
    from dqa.storage import location

    return GateResult(report, location(report["outputs"]["junit"]).parent)  # type: ignore[arg-type]  # a StorePath in a store
