"""Property: any token/mask rows, written in any supported format with any value types and any
split into shards (empty shards included), flat or as one ``[1, L]`` list per row (SpecForge's
layout), under their format's file suffix or under a name that says nothing (the readers go by
content), read back through ``dqa.audit.readers`` identically: the same ids, the same mask, the
same sample ids, in the same row order, whatever the batch size.

Soak (DQA_SOAK=1): 1,000 examples instead of 80.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqa.audit.readers import open_dataset

EXAMPLES = 1000 if os.environ.get("DQA_SOAK") == "1" else 80
FORMATS = ["parquet", "parquet-dir", "arrow-file", "arrow-stream", "arrow-dir", "hf", "jsonl", "jsonl-dir"]

row = st.integers(0, 12).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 151_668), min_size=n, max_size=n),
    st.lists(st.integers(0, 1), min_size=n, max_size=n),
))


@st.composite
def cases(draw):
    rows = draw(st.lists(row, min_size=1, max_size=30))
    n = len(rows)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    fmt = draw(st.sampled_from(FORMATS))
    return {
        "rows": rows,
        "fmt": fmt,
        "cuts": cuts if fmt.endswith("-dir") else [],
        "convention": draw(st.sampled_from(["loss_mask", "labels"])),
        "ids_type": draw(st.sampled_from([pa.int32(), pa.int64(), pa.uint32(), pa.int64()])),
        "mask_type": draw(st.sampled_from([pa.int8(), pa.uint8(), pa.int32(), pa.bool_()])),
        "large_list": draw(st.booleans()),
        "with_id": draw(st.booleans()),
        "nested": draw(st.booleans()),  # token columns as list<list<int>> of shape [1, L]
        "odd_name": draw(st.booleans()) and fmt != "jsonl-dir",  # a JSONL shard in a folder needs its suffix
        "batch_rows": draw(st.integers(1, 40)),
        "max_tokens": draw(st.integers(1, 200)),
    }


def table(case, rows, first: int) -> pa.Table:
    lst = pa.large_list if case["large_list"] and not case["fmt"].startswith("jsonl") else pa.list_
    ids = pa.array([r[0] for r in rows], pa.list_(pa.int64())).cast(lst(case["ids_type"]))
    if case["convention"] == "loss_mask":
        sup = pa.array([r[1] for r in rows], pa.list_(pa.int64())).cast(lst(case["mask_type"]))
    else:
        sup = pa.array([[t if m else -100 for t, m in zip(*r)] for r in rows], lst(pa.int64()))
    if case["nested"]:
        ids, sup = (pa.ListArray.from_arrays(pa.array(np.arange(len(rows) + 1, dtype=np.int32)), a) for a in (ids, sup))
    cols = {"input_ids": ids, case["convention"]: sup}
    if case["with_id"]:
        cols = {"id": pa.array([f"row-{first + i}" for i in range(len(rows))]), **cols}
    return pa.table(cols)


def name(case, stem: str, suffix: str) -> str:
    """``stem + suffix``, or, for ``odd_name`` cases, a name that does not tell the format."""
    return stem + (".bin" if case["odd_name"] else suffix)


def write(case, folder: Path) -> Path:
    rows, fmt = case["rows"], case["fmt"]
    bounds = [0, *case["cuts"], len(rows)]
    pieces = [(rows[a:b], a) for a, b in zip(bounds, bounds[1:])]
    if fmt == "parquet":
        path = folder / name(case, "set", ".parquet")
        pq.write_table(table(case, rows, 0), path)
        return path
    if fmt == "arrow-file" or fmt == "arrow-stream":
        t = table(case, rows, 0)
        path = folder / name(case, "set", ".arrow")
        opener = pa.ipc.new_file if fmt == "arrow-file" else pa.ipc.new_stream
        with opener(str(path), t.schema) as w:
            for b in t.to_batches(max_chunksize=max(1, len(rows) // 3)):
                w.write_batch(b)
        return path
    if fmt == "hf":
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset(table(case, rows, 0)).save_to_disk(str(folder / "hf"), max_shard_size="1KB")
        return folder / "hf"
    if fmt == "jsonl":
        path = folder / name(case, "set", ".jsonl")
        write_jsonl(case, rows, 0, path)
        return path
    out = folder / "shards"
    out.mkdir()
    for k, (piece, first) in enumerate(pieces):
        stem = f"part-{k:03d}"
        if fmt == "parquet-dir":
            pq.write_table(table(case, piece, first), out / name(case, stem, ".parquet"))
        elif fmt == "arrow-dir":
            t = table(case, piece, first)
            with pa.ipc.new_file(str(out / name(case, stem, ".arrow")), t.schema) as w:
                w.write_table(t)
        elif piece:  # an empty JSONL shard has no schema to offer: skipped, as a writer would
            write_jsonl(case, piece, first, out / name(case, stem, ".jsonl"))
    return out


def write_jsonl(case, rows, first: int, path: Path) -> None:
    t = table(case, rows, first).to_pylist()  # a bool mask becomes JSON true/false
    path.write_text("".join(json.dumps(r) + "\n" for r in t))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_rows_read_back_identically_in_every_format(case):
    if case["fmt"].startswith("jsonl") and not any(len(r[0]) for r in case["rows"]):
        case["rows"][0] = ([5], [1])  # JSONL cannot type an all-empty list column: give it one value
    with tempfile.TemporaryDirectory() as d:
        path = write(case, Path(d))
        ds = open_dataset(path)
        assert ds.columns.convention == case["convention"]
        ids, masks, row_ids = [], [], []
        for b in ds.batches(batch_rows=case["batch_rows"], max_tokens=case["max_tokens"]):
            assert b.start_row == len(ids)
            assert b.ids.dtype == np.int32 and b.mask.dtype == np.uint8
            assert b.num_rows <= case["batch_rows"]
            assert b.num_rows == 1 or b.offsets[-1] <= case["max_tokens"]
            for r in range(b.num_rows):
                ids.append(b.ids[b.offsets[r]:b.offsets[r + 1]].tolist())
                masks.append(b.mask[b.offsets[r]:b.offsets[r + 1]].tolist())
            if b.row_ids is not None:
                row_ids += b.row_ids.to_pylist()
            assert b.label_mismatch.sum() == 0
    assert ids == [r[0] for r in case["rows"]]
    assert masks == [r[1] for r in case["rows"]]
    if case["with_id"]:
        assert row_ids == [f"row-{i}" for i in range(len(case["rows"]))]
