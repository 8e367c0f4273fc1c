"""How much a scan selects: failing rows, assistant turns and tokens, read from its files.

Turns: from a scan (``--findings``), the selection is counted in assistant turns too, for each
way ``dqa regen --turns`` regenerates (``count_turns``): ``flagged`` (the default: from a sample's
first flagged turn to its last turn, since every later turn follows from a regenerated history;
its final turn when only whole-sample checks flag it),
``all`` (every assistant turn) and ``last`` (one per sample).

``count_findings`` counts the failing rows of ``findings.parquet``; ``scan_tokens`` the tokens
of the scanned set and of the outputs regeneration replaces (``summary.json``,
``metrics.parquet``), which ``storage.training_set_tokens`` turns into a training-set size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dqa.audit.scan_folder import METRICS_FILE, SUMMARY_FILE, findings_file
from dqa.errors import InputError, UsageError
from dqa.regen.config import DEFAULT_TURNS, TURN_MODES


def count_findings(path: str | Path) -> int:
    """The number of failing rows in a scan's ``findings.parquet`` (``path`` is the file or the
    scan folder). Raises ``InputError`` when it is missing or lacks the ``row`` column."""
    import pyarrow.parquet as pq

    file = findings_file(path)
    if not file.is_file():
        raise InputError(f"{file}: no findings.parquet (run `dqa scan` first, or pass --samples)")
    try:
        pf = pq.ParquetFile(file)
    except Exception as exc:  # pyarrow raises several types for a non-parquet file
        raise InputError(f"{file}: not a parquet file ({exc})") from None
    if "row" not in pf.schema_arrow.names:
        raise InputError(f"{file}: column 'row' missing; expected a dqa scan findings.parquet (row, id, reasons)")
    return int(pf.metadata.num_rows)


@dataclass(frozen=True)
class TurnCounts:
    """The selection in assistant turns, for each ``dqa regen --turns`` mode.

    ``flagged``: from each sample's first flagged turn to its last assistant turn (a sample flagged
    only by whole-sample checks, with no flagged turn, counts its final turn, as regen sends it); ``all``: every
    assistant turn of the selected samples; ``last``: one per sample that has an assistant turn;
    ``flagged_turns``: the turns the per-turn checks flagged. ``None`` where the scan's
    ``metrics.parquet`` (the samples' turn counts) is missing. ``mode`` is the one planned for.
    """

    mode: str
    samples: int
    flagged_turns: int
    flagged: int | None
    all: int | None
    last: int | None
    multi_turn: bool | None

    @property
    def selected(self) -> int | None:
        """The turns of ``mode``."""
        return {"flagged": self.flagged, "all": self.all, "last": self.last}[self.mode]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``selected``: the turns of ``mode``)."""
        return {**asdict(self), "selected": self.selected}


def count_turns(path: str | Path, mode: str = DEFAULT_TURNS) -> TurnCounts | None:
    """Count the failing samples of a scan (``path``: the folder or its findings.parquet) in turns.

    Reads ``findings.parquet`` (``row``, ``turns``) and, next to it, ``metrics.parquet``
    (``row``, ``assistant_turns``). Returns ``None`` for a scan made before findings had a
    ``turns`` column. Raises ``UsageError`` for an unknown ``mode`` and ``InputError`` for an
    unreadable file.
    """
    import polars as pl
    import pyarrow.parquet as pq

    if mode not in TURN_MODES:
        raise UsageError(f"--turns {mode!r}: expected one of {', '.join(TURN_MODES)}")
    file = findings_file(path)
    try:
        if "turns" not in pq.ParquetFile(file).schema_arrow.names:
            return None
        found = pl.read_parquet(file, columns=["row", "turns"])
    except Exception as exc:  # pyarrow/polars raise several types for a bad file
        raise InputError(f"{file}: cannot read its turns ({exc})") from None
    per = found.select(
        pl.col("row").cast(pl.Int64),
        pl.col("turns").list.min().cast(pl.Int64).alias("first"),
        pl.col("turns").list.len().cast(pl.Int64).alias("n"),
    )
    flagged_turns = int(per["n"].sum() or 0)
    metrics_file = file.parent / METRICS_FILE
    flagged = all_turns = last = multi = None
    if metrics_file.is_file():
        try:
            names = pq.ParquetFile(metrics_file).schema_arrow.names
            cols = ["row", "assistant_turns"]
            m = pl.read_parquet(metrics_file, columns=cols) if all(c in names for c in cols) else None
        except Exception as exc:
            raise InputError(f"{metrics_file}: cannot read its turn counts ({exc})") from None
        if m is not None:
            j = per.join(m.select(pl.col("row").cast(pl.Int64), pl.col("assistant_turns").cast(pl.Int64)), on="row", how="left")
            a = pl.col("assistant_turns").fill_null(0)
            # As regen's --turns flagged: from the first flagged turn to the last; no flagged turn (only
            # whole-sample checks flag it) or one past the sample's turns: the final turn alone.
            first = pl.col("first")
            span = pl.when(first.is_null() | (first >= a)).then((a > 0).cast(pl.Int64)).otherwise(a - first)
            out = j.select(
                span.sum().alias("flagged"),
                a.sum().alias("all"),
                (a > 0).sum().alias("last"),
                (a >= 2).any().alias("multi"),
            ).row(0, named=True)
            flagged, all_turns, last, multi = int(out["flagged"] or 0), int(out["all"] or 0), int(out["last"] or 0), bool(out["multi"])
    return TurnCounts(mode=mode, samples=per.height, flagged_turns=flagged_turns, flagged=flagged, all=all_turns, last=last, multi_turn=multi)


def scan_tokens(findings: str | Path) -> tuple[int, int] | None:
    """``(scanned, replaced)``: the tokens of the scanned dataset (``summary.json`` ``tokens``) and the
    supervised tokens of its failing samples (``metrics.parquet``: the outputs regeneration
    replaces). ``None`` when the scan files are not next to ``findings`` (a lone findings.parquet).
    Raises ``InputError`` for scan files that are there but unreadable."""
    import json

    import polars as pl

    file = findings_file(findings)
    summary_file, metrics_file = file.parent / SUMMARY_FILE, file.parent / METRICS_FILE
    if not (summary_file.is_file() and metrics_file.is_file()):
        return None
    try:
        scanned = int(json.loads(summary_file.read_text())["tokens"])
        rows = pl.read_parquet(file, columns=["row"])["row"].cast(pl.Int64)
        m = pl.read_parquet(metrics_file, columns=["row", "supervised_tokens"])
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError) as exc:
        raise InputError(
            f"{file.parent}: cannot count the training set's tokens from the scan ({type(exc).__name__}: {exc}); "
            "give --storage-tokens"
        ) from None
    replaced = int(m.filter(pl.col("row").cast(pl.Int64).is_in(rows.implode()))["supervised_tokens"].sum() or 0)
    return scanned, replaced

