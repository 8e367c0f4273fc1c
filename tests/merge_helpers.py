"""Builders for the merge tests: small Qwen3 datasets in every format and regen shards per FORMATS.md.

``sample_rows(n)`` renders ``n`` one-turn conversations with the real Qwen3 chat template,
thinking off (the incident's shape: an empty think block and a short answer).
``regen_output(ids)`` is what a thinking-on regeneration of that row returns: the prompt (the
row up to its last ``<|im_start|>assistant\\n``) plus new output tokens.
``write_shard`` writes a shard exactly as FORMATS.md lists its columns.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from chatdata import ASSISTANT, IM_END, IM_START, NL, conversation, render, tokenizer

SAMPLING = json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 512})
WHEN = dt.datetime(2026, 11, 30, 8, 0, 0, 123456, tzinfo=dt.timezone.utc)

SHARD_SCHEMA = pa.schema(
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
    ]
)


def sample_rows(n: int) -> list[tuple[list[int], list[int]]]:
    """``n`` (input_ids, loss_mask) rows: thinking-off renders of distinct questions."""
    rows = []
    for i in range(n):
        msgs = conversation(f"What is {i} plus {i}?", None, f"{2 * i}.")
        rows.append(render(msgs, enable_thinking=False))
    return rows


def prompt_len(ids: Sequence[int]) -> int:
    """Length of the prompt: up to and including the last assistant header."""
    last = -1
    for j in range(len(ids) - 2):
        if ids[j] == IM_START and ids[j + 1] == ASSISTANT and ids[j + 2] == NL:
            last = j + 3
    assert last > 0
    return last


def regen_output(i: int) -> list[int]:
    """New output tokens for row ``i``: a closed think block, an answer, ``<|im_end|>``."""
    text = f"<think>\nThe question is about {i}. Adding gives {2 * i}.\n</think>\n\nThe answer is {2 * i}."
    return tokenizer()(text, add_special_tokens=False)["input_ids"] + [IM_END]


def shard_record(row: int, ids: Sequence[int], sample_id: str | None, status: str = "ok", output: Sequence[int] | None = None,
                 endpoint: str = "http://10.0.0.5:30000") -> dict[str, Any]:
    """One shard row for dataset row ``row`` whose tokens are ``ids``."""
    p = prompt_len(ids)
    prompt = list(ids[:p])
    out = [] if status == "failed" else list(output if output is not None else regen_output(row))
    return {
        "row": row,
        "id": sample_id,
        "input_ids": prompt + out,
        "loss_mask": [0] * p + [1] * len(out),
        "prompt_len": p,
        "output_tokens": len(out),
        "status": status,
        "finish_reason": {"ok": "stop", "length": "length", "failed": "abort"}[status],
        "error": "HTTP 400: prompt too long" if status == "failed" else None,
        "endpoint": endpoint,
        "attempts": 1,
        "latency_s": 1.5,
        "model": "Qwen3-27B",
        "sampling": SAMPLING,
        "seed": 1000 + row,
        "completed_at": WHEN,
    }


def write_shard(path: Path, records: list[dict[str, Any]]) -> Path:
    """Write ``records`` as a regen shard (FORMATS.md columns); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = {f.name: pa.array([r[f.name] for r in records], type=f.type) for f in SHARD_SCHEMA}
    pq.write_table(pa.table(cols, schema=SHARD_SCHEMA), path, compression="zstd")
    return path


def base_table(rows: list[tuple[list[int], list[int]]], ids: list[str] | None = None, convention: str = "loss_mask",
               mask_type: pa.DataType = pa.int8(), attention: bool = False, extra: bool = True) -> pa.Table:
    """A dataset table: ``id``, ``input_ids`` (int32), the supervision column, optional
    ``attention_mask``, and an unrelated ``source`` column that merge must keep."""
    cols: dict[str, pa.Array] = {}
    if ids is not None:
        cols["id"] = pa.array(ids, pa.string())
    cols["input_ids"] = pa.array([r[0] for r in rows], pa.list_(pa.int32()))
    if convention == "loss_mask":
        cols["loss_mask"] = pa.array([r[1] for r in rows], pa.list_(pa.int8())).cast(pa.list_(mask_type))
    else:
        cols["labels"] = pa.array(
            [list(np.where(np.asarray(m) == 1, np.asarray(i), -100)) for i, m in rows], pa.list_(pa.int64())
        )
    if attention:
        cols["attention_mask"] = pa.array([[1] * len(r[0]) for r in rows], pa.list_(pa.int8()))
    if extra:
        cols["source"] = pa.array([f"src-{k % 3}" for k in range(len(rows))], pa.string())
    return pa.table(cols)


def write_dataset(table: pa.Table, path: Path, fmt: str, shards: int = 2) -> Path:
    """Write ``table`` as ``fmt`` at ``path``: parquet, parquet-dir, jsonl, jsonl-dir, arrow (IPC
    file), arrow-dir, arrow-stream, hf (``datasets`` save_to_disk). Returns the dataset path."""
    import pyarrow.ipc as ipc

    if fmt == "parquet":
        pq.write_table(table, path, compression="zstd", row_group_size=3)
    elif fmt == "parquet-dir":
        path.mkdir(parents=True)
        for k, part in enumerate(_split(table, shards)):
            sub = path / "data"
            sub.mkdir(exist_ok=True)
            pq.write_table(part, sub / f"train-{k:05d}-of-{shards:05d}.parquet")
        (path / "README.md").write_text("# a dataset card\n")
    elif fmt == "jsonl":
        with open(path, "w") as fh:
            for rec in table.to_pylist():
                fh.write(json.dumps(rec) + "\n")
    elif fmt in ("jsonl-dir", "arrow-dir"):
        path.mkdir(parents=True)
        for k, part in enumerate(_split(table, shards)):
            name = f"part-{k:03d}" + (".jsonl" if fmt == "jsonl-dir" else ".arrow")
            write_dataset(part, path / name, fmt[:-4])
    elif fmt == "arrow":
        with ipc.new_file(str(path), table.schema) as w:
            w.write_table(table, max_chunksize=4)
    elif fmt == "arrow-stream":
        with ipc.new_stream(str(path), table.schema) as w:
            w.write_table(table, max_chunksize=4)
    elif fmt == "hf":
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset(table).save_to_disk(str(path), num_shards=shards)
    else:
        raise ValueError(fmt)
    return path


def _split(table: pa.Table, parts: int) -> list[pa.Table]:
    bounds = np.linspace(0, table.num_rows, parts + 1).astype(int)
    return [table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]


FORMAT_NAMES = {"parquet": "data.parquet", "parquet-dir": "data", "jsonl": "data.jsonl", "arrow": "data.arrow",
                "arrow-stream": "data.arrow", "hf": "data", "jsonl-dir": "data", "arrow-dir": "data"}
OUT_NAMES = {"parquet": "new.parquet", "parquet-dir": "new", "jsonl": "new.jsonl", "arrow": "new.arrow",
             "arrow-stream": "new.arrow", "hf": "new", "jsonl-dir": "new", "arrow-dir": "new"}


def read_back(path: Path) -> pa.Table:
    """The whole dataset at ``path`` as one table, through dqa's reader (dataset order)."""
    from dqa.audit.readers import open_dataset

    ds = open_dataset(path)
    return pa.Table.from_batches([b for _, b in ds.record_batches()])
