"""What a merge did: ``MergeSummary``, and where its report goes (``report_path``).

A leaf module: the tokenized and the conversation merge fill the summary in, and ``__init__``
(which imports them) hands it to the caller.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPORT_SUFFIX = ".merge-report.json"


@dataclass
class MergeSummary:
    """What a merge did. ``kept``/``dropped`` count rows that could not be regenerated."""

    dataset: str
    regen: list[str]
    output: str
    report: str
    format: str
    failed_policy: str
    accept: str = "ok"
    convention: dict[str, Any] | None = None  # how replaced rows were masked (None: as the shards hold them)
    rows_in: int = 0
    rows_out: int = 0
    replaced: int = 0
    truncated: int = 0
    unregenerated: int = 0
    kept: int = 0
    dropped: int = 0
    untouched: int = 0
    elapsed_s: float = 0.0
    selection: list[str] = field(default_factory=list)  # per regen folder: where the selected rows came from
    unregenerated_rows: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def as_dict(self, with_rows: bool = False) -> dict[str, Any]:
        """Returns the summary as a plain dict; the list of unregenerated rows only ``with_rows``."""
        d = asdict(self)
        rows = d.pop("unregenerated_rows")
        if with_rows:
            d["unregenerated_rows"] = rows
        return d


def report_path(out: Path) -> Path:
    """Where the merge report of output ``out`` goes: ``NEW.merge-report.json`` beside it."""
    return out.parent / (out.name + REPORT_SUFFIX)
