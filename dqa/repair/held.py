"""Rows a repair holds back: those a round's regen run cut at the servers' context ("cannot fit in
C tokens of context"). A larger ``max_new_tokens`` cannot help them and new seeds cost budget
without a chance, so later rounds do not send them again; they stay failing, listed with that
note in ``repair.json``'s final record.

A round that holds rows back regenerates from ``round-K/select/``: the last rescan's
``summary.json`` (so the findings stay tied to that set) and its ``findings.parquet`` without the
held rows.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dqa.audit.scan_folder import FINDINGS_FILE, SUMMARY_FILE, findings_file

SELECT_DIR = "select"


def held_back(rounds: list[dict[str, Any]], failing: set[int]) -> dict[int, int | None]:
    """``{row: context}`` of the ``failing`` rows that a round of ``rounds`` (repair.json records,
    in order) cut at the servers' context; a row's context is the latest such round's. Never raises."""
    held: dict[int, int | None] = {}
    for r in rounds:
        for row in r.get("cannot_fit_rows") or ():
            held[int(row)] = r.get("context")
    return {row: c for row, c in sorted(held.items()) if row in failing}


def failing_rows(scan_dir: Path) -> set[int]:
    """The rows a scan folder's findings flag. Raises ``OSError``/Arrow errors for an unreadable file."""
    import pyarrow.parquet as pq

    return {int(r) for r in pq.read_table(findings_file(scan_dir), columns=["row"]).column("row").to_pylist()}


def cannot_fit_note(context: int | None) -> str:
    """``"cannot fit in C tokens of context"`` (``"cannot fit in the servers' context"`` when unknown)."""
    return f"cannot fit in {int(context):,} tokens of context" if context else "cannot fit in the servers' context"


def write_selection(scan_dir: Path, held: list[int], dest: Path) -> Path:
    """Write ``dest`` (``round-K/select/``): ``scan_dir``'s summary.json and its findings without the
    ``held`` rows, each file atomically; returns ``dest``, a findings folder for ``dqa.regenerate``.
    Rewriting it gives the same files (a resumed round reads the same selection). Raises ``OSError``."""
    import polars as pl

    from dqa import atomic

    dest.mkdir(parents=True, exist_ok=True)
    kept = pl.read_parquet(findings_file(scan_dir)).filter(~pl.col("row").is_in(held))
    with atomic.atomic_path(dest / FINDINGS_FILE) as tmp:
        kept.write_parquet(tmp)
    with atomic.atomic_path(dest / SUMMARY_FILE) as tmp:
        shutil.copyfile(scan_dir / SUMMARY_FILE, tmp)
    return dest
