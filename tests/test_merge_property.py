"""Property: for any small dataset, any set of regenerated/failed rows spread over any shards, any
batch size and either failed-row policy, the merged dataset equals the one computed row by row."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merge_helpers import SHARD_SCHEMA, WHEN, write_dataset

from dqa.regen.merge import MergeOptions, merge

token_list = st.lists(st.integers(0, 151_000), min_size=1, max_size=10)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 25))
    rows = [draw(token_list) for _ in range(n)]
    masks = [[draw(st.integers(0, 1)) for _ in r] for r in rows]
    chosen = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    regen = {}
    for r in chosen:
        status = draw(st.sampled_from(["ok", "ok", "length", "failed"]))
        p = draw(st.integers(0, len(rows[r])))
        out = [] if status == "failed" else draw(st.lists(st.integers(0, 151_000), min_size=0, max_size=8))
        regen[r] = (status, p, out)
    return {
        "rows": rows,
        "masks": masks,
        "regen": regen,
        "shards": draw(st.integers(1, 3)),
        "shard_of": {r: draw(st.integers(0, 2)) for r in chosen},
        "order_seed": draw(st.integers(0, 1000)),
        "batch_rows": draw(st.integers(1, 7)),
        "failed": draw(st.sampled_from(["keep", "drop"])),
        "convention": draw(st.sampled_from(["loss_mask", "labels"])),
        "fmt": draw(st.sampled_from(["parquet", "jsonl", "arrow-stream", "parquet-dir"])),
    }


def reference(case) -> list[dict]:
    """The merged rows, computed naively one row at a time."""
    out = []
    for r, (ids, mask) in enumerate(zip(case["rows"], case["masks"])):
        got = case["regen"].get(r)
        if got and got[0] == "failed":
            if case["failed"] == "drop":
                continue
            got = None
        if got:
            status, p, new = got
            ids, mask = ids[:p] + new, [0] * p + [1] * len(new)
        sup = mask if case["convention"] == "loss_mask" else [t if m else -100 for t, m in zip(ids, mask)]
        out.append({"id": f"r{r}", "input_ids": ids, case["convention"]: sup, "status": got[0] if got else None})
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_merge_equals_the_row_by_row_reference(case):
    import random

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        n = len(case["rows"])
        conv = case["convention"]
        sup = case["masks"] if conv == "loss_mask" else [
            [t if m else -100 for t, m in zip(ids, mask)] for ids, mask in zip(case["rows"], case["masks"])
        ]
        table = pa.table({
            "id": pa.array([f"r{i}" for i in range(n)]),
            "input_ids": pa.array(case["rows"], pa.list_(pa.int32())),
            conv: pa.array(sup, pa.list_(pa.int64())),
        })
        name = {"parquet": "d.parquet", "jsonl": "d.jsonl", "arrow-stream": "d.arrow", "parquet-dir": "d"}[case["fmt"]]
        src = write_dataset(table, d / name, case["fmt"], shards=min(2, n))
        regen = d / "regen"
        (regen / "shards").mkdir(parents=True)
        per_shard: dict[int, list[dict]] = {}
        for r, (status, p, new) in case["regen"].items():
            ids = case["rows"][r]
            per_shard.setdefault(case["shard_of"][r] % case["shards"], []).append({
                "row": r, "id": f"r{r}", "input_ids": ids[:p] + new, "loss_mask": [0] * p + [1] * len(new),
                "prompt_len": p, "output_tokens": len(new), "status": status,
                "finish_reason": "length" if status == "length" else "stop", "error": None, "endpoint": "http://e:1",
                "attempts": 1, "latency_s": 0.1, "model": "m", "sampling": "{}", "seed": r, "completed_at": WHEN,
            })
        rng = random.Random(case["order_seed"])
        for k, recs in per_shard.items():
            rng.shuffle(recs)
            cols = {f.name: pa.array([x[f.name] for x in recs], type=f.type) for f in SHARD_SCHEMA}
            pq.write_table(pa.table(cols, schema=SHARD_SCHEMA), regen / "shards" / f"part-p-{k:06d}.parquet",
                           row_group_size=2)
        out = d / ("new" + name[1:])

        merge(src, [regen], out, MergeOptions(failed=case["failed"], batch_rows=case["batch_rows"], cache_bytes=64,
                                              accept=("ok", "length")))

        from merge_helpers import read_back

        if not reference(case):  # every row dropped: an empty dataset of the input's format
            files = [out] if out.is_file() else sorted(f for f in out.rglob("*") if f.is_file())
            if case["fmt"] == "jsonl":
                assert [f.stat().st_size for f in files] == [0]
            else:
                from dqa.audit.readers import open_dataset

                assert files and open_dataset(out).num_rows in (0, None)
            return
        back = read_back(out)
        prov = back.column("dqa_regen").to_pylist()
        if case["fmt"] == "jsonl":
            prov = [json.loads(p) for p in prov]
        got = [
            {"id": i, "input_ids": x, conv: [int(v) for v in m], "status": (p or {}).get("status")}
            for i, x, m, p in zip(back.column("id").to_pylist(), back.column("input_ids").to_pylist(),
                                  back.column(conv).to_pylist(), prov)
        ]
        assert got == reference(case)
