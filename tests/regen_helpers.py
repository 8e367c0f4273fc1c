"""Small regen inputs for tests: a Qwen3 chat dataset rendered with the real template, a findings file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chatdata import render, write_parquet


def degenerate_dataset(path: Path, n: int, with_ids: bool = True) -> Path:
    """``n`` one-turn samples stored the thinking-off way (prefilled empty think block + "OK.")."""
    rows = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"Question number {i}: what is {i} + {i}?"}, {"role": "assistant", "content": "OK."}]
        rows.append(render(msgs, enable_thinking=False))
    return write_parquet(path, rows, [f"sample-{i}" for i in range(n)] if with_ids else None)


def write_findings(folder: Path, rows: list[int], reasons: list[list[str]] | None = None) -> Path:
    """A findings.parquet as ``dqa scan`` writes it (FORMATS.md): row int64, id, reasons list<string>."""
    folder.mkdir(parents=True, exist_ok=True)
    reasons = reasons or [["degenerate_template"]] * len(rows)
    t = pa.table(
        {
            "row": pa.array(rows, pa.int64()),
            "id": pa.array([f"sample-{r}" for r in rows], pa.string()),
            "reasons": pa.array(reasons, pa.list_(pa.string())),
        }
    )
    pq.write_table(t, folder / "findings.parquet")
    return folder / "findings.parquet"


def read_shards(out: Path):
    """All shard rows of a regen output folder as one pyarrow Table (empty table when none)."""
    from dqa.regen.store.journal import list_shards, shard_schema

    tables = [pq.read_table(p) for p in list_shards(Path(out))]
    return pa.concat_tables(tables) if tables else shard_schema().empty_table()
