"""Benchmark: `dqa merge` against the floor (a plain copy) and against a per-row Python merge.

One run, three contestants, each in its own process so that peak RSS is its own:

- floor: pyarrow streams the dataset and writes it back (same compression), no merging;
  nothing that rewrites the set can be faster.
- dqa: ``dqa.regen.merge.merge`` with the regen shards (replacement by Arrow ``take``,
  provenance column, failed-row report), streaming in batches.
- loop: what a typical merge script does: load the dataset and the shards as Python lists,
  replace rows in a dict lookup loop, build the table again and write it. It runs on a prefix
  of the set (``--loop-rows``) because it holds everything in memory; compared by rows/s.

Usage:
    python bench/bench_merge.py [--rows 100000] [--regen-share 0.3] [--loop-rows 20000]

The synthetic set has Qwen3 structure (prompt ending in the assistant header, supervised
answer); the regen shards replace ``--regen-share`` of the rows with longer thinking outputs,
in fleet completion order (shuffled within windows), 2% failed and 3% truncated, written to
shards of 20,000 rows like ``dqa regen`` does. Data is generated under a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

IM_START, IM_END, NL, ASSISTANT = 151644, 151645, 198, 77091


def _ranks(lengths: np.ndarray) -> np.ndarray:
    starts = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)


def build(folder: Path, rows: int, share: float, seed: int = 0) -> tuple[Path, Path]:
    """Write ``data.parquet`` and ``regen/shards/*.parquet``; return their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    plen = rng.integers(40, 400, rows)
    blen = rng.integers(20, 600, rows)
    lengths = plen + blen
    offs = np.concatenate(([0], np.cumsum(lengths)))
    ids = rng.integers(0, 150000, int(offs[-1]), dtype=np.int32)
    for k, tok in enumerate((IM_START, ASSISTANT, NL)):
        ids[offs[:-1] + plen - 3 + k] = tok
    ids[offs[1:] - 1] = IM_END
    mask = (_ranks(lengths) >= np.repeat(plen, lengths)).astype(np.int8)
    o32 = pa.array(offs.astype(np.int32))
    table = pa.table({
        "id": pa.array([f"s{i}" for i in range(rows)]),
        "input_ids": pa.ListArray.from_arrays(o32, pa.array(ids)),
        "loss_mask": pa.ListArray.from_arrays(o32, pa.array(mask)),
    })
    data = folder / "data.parquet"
    pq.write_table(table, data, compression="zstd", row_group_size=8192)

    chosen = np.sort(rng.choice(rows, int(rows * share), replace=False))
    window = 5000  # a fleet finishes rows roughly in dispatch order
    order = np.argsort(np.arange(chosen.size) // window * window + rng.integers(0, window, chosen.size), kind="stable")
    chosen = chosen[order]
    olen = rng.integers(200, 1500, chosen.size)
    status = np.where(rng.random(chosen.size) < 0.02, "failed", np.where(rng.random(chosen.size) < 0.03, "length", "ok"))
    olen[status == "failed"] = 0
    p = plen[chosen]
    new_len = p + olen
    noffs = np.concatenate(([0], np.cumsum(new_len)))
    src_pos = np.repeat(offs[chosen], p) + _ranks(p)
    dst_pos = np.repeat(noffs[:-1], p) + _ranks(p)
    new_ids = rng.integers(0, 150000, int(noffs[-1]), dtype=np.int32)
    new_ids[dst_pos] = ids[src_pos]
    new_mask = (_ranks(new_len) >= np.repeat(p, new_len)).astype(np.uint8)
    shards = folder / "regen" / "shards"
    shards.mkdir(parents=True)
    when = pa.array(np.full(chosen.size, 1_780_000_000_000_000, dtype="datetime64[us]"), pa.timestamp("us", tz="UTC"))
    full = pa.table({
        "row": pa.array(chosen, pa.int64()),
        "id": pa.array([f"s{i}" for i in chosen]),
        "input_ids": pa.ListArray.from_arrays(pa.array(noffs.astype(np.int32)), pa.array(new_ids)),
        "loss_mask": pa.ListArray.from_arrays(pa.array(noffs.astype(np.int32)), pa.array(new_mask)),
        "prompt_len": pa.array(p.astype(np.int32)),
        "output_tokens": pa.array(olen.astype(np.int32)),
        "status": pa.array(status),
        "finish_reason": pa.array(np.where(status == "length", "length", "stop")),
        "error": pa.nulls(chosen.size, pa.string()),
        "endpoint": pa.array(["http://10.0.0.5:30000"] * chosen.size),
        "attempts": pa.array(np.ones(chosen.size, np.int32)),
        "latency_s": pa.array(np.full(chosen.size, 30.0)),
        "model": pa.array(["Qwen3-27B"] * chosen.size),
        "sampling": pa.array(['{"temperature": 0.6}'] * chosen.size),
        "seed": pa.array(chosen, pa.int64()),
        "completed_at": when,
    })
    for k, start in enumerate(range(0, chosen.size, 20000)):
        pq.write_table(full.slice(start, 20000), shards / f"part-s0of1-{k:06d}.parquet", compression="zstd")
    return data, folder / "regen"


# --- contestants (run in child processes) ---------------------------------------------------


def run_floor(data: str, out: str) -> dict:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(data)
    with pq.ParquetWriter(out, pf.schema_arrow, compression="zstd") as w:
        for b in pf.iter_batches(batch_size=2048):
            w.write_batch(b)
    return {"rows": pf.metadata.num_rows}


def run_dqa(data: str, regen: str, out: str) -> dict:
    from dqa.regen.merge import merge

    s = merge(data, [regen], out)
    return {"rows": s.rows_in, "replaced": s.replaced}


def run_loop(data: str, regen: str, out: str, limit: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(data).slice(0, limit)
    records = table.to_pylist()
    new = {}
    for p in sorted(Path(regen, "shards").glob("*.parquet")):
        for rec in pq.read_table(p).to_pylist():
            if rec["row"] < limit and rec["status"] != "failed":
                new[rec["row"]] = rec
    for i, rec in enumerate(records):
        got = new.get(i)
        if got is not None:
            rec["input_ids"] = got["input_ids"]
            rec["loss_mask"] = got["loss_mask"]
            rec["dqa_regen"] = {"endpoint": got["endpoint"], "status": got["status"]}
        else:
            rec["dqa_regen"] = None
    pq.write_table(pa.Table.from_pylist(records), out, compression="zstd")
    return {"rows": len(records), "replaced": len(new)}


def _peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM: reset at exec, unlike ru_maxrss which keeps the parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(argv: list[str]) -> None:
    kind, *args = argv
    t0 = time.perf_counter()
    c0 = time.process_time()
    if kind == "floor":
        res = run_floor(*args)
    elif kind == "dqa":
        res = run_dqa(*args)
    else:
        res = run_loop(args[0], args[1], args[2], int(args[3]))
    res.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0,
               peak_rss_mb=_peak_rss_mb())
    print(json.dumps(res))


def measure(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--regen-share", type=float, default=0.3)
    ap.add_argument("--loop-rows", type=int, default=20_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        t0 = time.perf_counter()
        data, regen = build(d, a.rows, a.regen_share)
        size = os.path.getsize(data) / 2**20
        import pyarrow.parquet as pq

        tokens = sum(pq.read_table(data, columns=["input_ids"]).column("input_ids").combine_chunks().value_lengths().to_numpy())
        print(f"set: {a.rows:,} rows, {tokens / 1e6:.1f}M tokens, {size:.0f} MiB parquet; "
              f"{int(a.rows * a.regen_share):,} regen rows (built in {time.perf_counter() - t0:.1f}s)")
        floor = measure("floor", str(data), str(d / "floor.parquet"))
        dqa = measure("dqa", str(data), str(regen), str(d / "dqa.parquet"))
        loop = measure("loop", str(data), str(regen), str(d / "loop.parquet"), str(a.loop_rows))
    for name, r in (("floor (copy)", floor), ("dqa merge", dqa), (f"loop ({a.loop_rows:,} rows)", loop)):
        print(f"{name:22s} {r['rows'] / r['wall_s']:>12,.0f} rows/s  wall {r['wall_s']:6.2f}s  cpu {r['cpu_s']:6.2f}s  "
              f"peak RSS {r['peak_rss_mb']:7.0f} MiB")
    print(f"dqa / floor: wall {dqa['wall_s'] / floor['wall_s']:.2f}x, cpu {dqa['cpu_s'] / floor['cpu_s']:.2f}x   "
          f"dqa vs loop per row: wall {dqa['rows'] / dqa['wall_s'] / (loop['rows'] / loop['wall_s']):.1f}x, "
          f"cpu {dqa['rows'] / dqa['cpu_s'] / (loop['rows'] / loop['cpu_s']):.1f}x faster")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times are shared-machine times)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
