"""The shard store of a ``dqa regen`` output folder (FORMATS.md, "Shard columns"): ``shard_schema``
(the shard columns), ``ShardStatus`` (the ``status`` values), ``SHARD_WRITE_OPTIONS`` (how shards
are written), ``shard_path``/``list_shards`` (where shards live: ``shards/part-<tag>-<seq>.parquet``)
``completion_times`` (when earlier sessions' records completed, for a resumed run's working time)
and ``shard_rows`` (the figures of every shard row, for the HTML report).
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

SHARDS_DIR = "shards"
SHARD_RE = re.compile(r"^part-(?P<tag>.+)-(?P<seq>\d{6,})\.parquet$")


class ShardStatus(str, enum.Enum):
    """A shard record's ``status``: ``ok`` (a complete reply), ``length`` (cut by
    ``--max-new-tokens``), ``failed`` (no reply; ``error`` says why). Members compare equal to
    their strings; ``code`` is the int8 index used by in-memory status arrays."""

    OK = "ok"
    LENGTH = "length"
    FAILED = "failed"

    @property
    def code(self) -> int:
        return STATUSES.index(self.value)

    def __str__(self) -> str:
        return self.value


STATUSES: tuple[str, ...] = tuple(s.value for s in ShardStatus)  # index = status code (ok 0, length 1, failed 2)


def shard_schema():
    """The arrow schema of a shard (FORMATS.md, "Shard columns")."""
    import pyarrow as pa

    return pa.schema(
        [
            ("row", pa.int64()),
            ("id", pa.string()),
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.uint8())),
            ("prompt_len", pa.int32()),
            ("output_tokens", pa.int32()),
            ("status", pa.string()),
            ("finish_reason", pa.string()),
            ("error", pa.string()),
            ("endpoint", pa.string()),
            ("attempts", pa.int32()),
            ("latency_s", pa.float64()),
            ("model", pa.string()),
            ("sampling", pa.string()),
            ("seed", pa.int64()),
            ("completed_at", pa.timestamp("us", tz="UTC")),
            ("turn", pa.int32()),
            ("turns", pa.int32()),
            ("kept_len", pa.int32()),
            ("cached_tokens", pa.int32()),
        ]
    )


# Shards are zstd-compressed, with dictionary encoding only for columns whose values repeat. On
# token ids it would hash every value and then fall back to plain encoding: that was 40% of the
# time a shard took to write, for files 5% larger (bench/README.md, regen client).
SHARD_WRITE_OPTIONS = {
    "compression": "zstd",
    # leaf paths: a list column's values are "<name>.list.element"
    "use_dictionary": ["loss_mask.list.element", "status", "finish_reason", "error", "endpoint", "model", "sampling",
                       "attempts", "turn", "turns"],
}


def shard_path(out: Path, tag: str, seq: int) -> Path:
    """Where shard ``seq`` of driver ``tag`` (``s<i>of<N>``) lives in folder ``out``."""
    return out / SHARDS_DIR / f"part-{tag}-{seq:06d}.parquet"


def list_shards(out: Path) -> list[Path]:
    """The completed shards of folder ``out`` (named as ``shard_path`` names them), sorted."""
    d = out / SHARDS_DIR
    return sorted(p for p in d.glob("part-*.parquet") if SHARD_RE.match(p.name)) if d.is_dir() else []


def completion_times(out: Path):
    """``(completed_at, latency_s)`` of every record in the shards of the run folder ``out``, as
    float numpy arrays (seconds since the epoch, seconds): what a rerun estimates earlier sessions'
    working time from when their progress.json is gone. A shard that cannot be read, or lacks
    either column, is skipped; empty arrays when none can be read. Never raises for a bad shard."""
    import contextlib

    import numpy as np
    import pyarrow.parquet as pq

    done_at, latency = [], []
    for p in list_shards(out):
        with contextlib.suppress(OSError, ValueError, KeyError):
            t = pq.read_table(p, columns=["completed_at", "latency_s"])
            done_at.append(t.column("completed_at").cast("int64").to_numpy(zero_copy_only=False) / 1e6)
            latency.append(t.column("latency_s").to_numpy(zero_copy_only=False))
    if not done_at:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(done_at), np.concatenate(latency)


def shard_rows(regen_dir: Path):
    """``row``, ``completed_at``, ``output_tokens``, ``status``, ``latency_s`` and ``ends_sample`` of
    every completed shard row of a regen run. A shard row is one regenerated turn; ``ends_sample`` is
    true where it finishes its sample (the conversation's last turn, or a turn that failed or was
    cut, which ends it; always for shards written before multi-turn regeneration). Raises
    ``InputError`` naming the folder when a shard lacks a column. Returns a polars DataFrame (what
    the HTML report draws the run from)."""
    import polars as pl

    from dqa.errors import InputError

    folder = regen_dir / "shards"
    files = list_shards(regen_dir)  # the shards merge and resume read: not temp files or strays
    cols = ["row", "completed_at", "output_tokens", "status", "latency_s"]
    if not files:
        return pl.DataFrame(schema={"row": pl.Int64, "completed_at": pl.Datetime("us", "UTC"), "output_tokens": pl.Int64,
                                    "status": pl.String, "latency_s": pl.Float64, "ends_sample": pl.Boolean})
    parts = []
    try:
        for f in files:
            names = set(pl.read_parquet_schema(f))
            df = pl.read_parquet(f, columns=cols + [c for c in ("turn", "turns") if c in names])
            if "turn" in df.columns and "turns" in df.columns:
                ends = pl.col("turn").is_null() | (pl.col("turn") >= pl.col("turns") - 1) | (pl.col("status") != "ok")
            else:
                ends = pl.lit(True)
            parts.append(df.select(*cols, ends.alias("ends_sample")))
        return pl.concat(parts, how="vertical_relaxed")
    except Exception as exc:
        raise InputError(f"{folder}: shards without {', '.join(cols)} ({' '.join(str(exc).split())[:200]})") from None
