"""Benchmark: `dqa scan s3://...` against the floor read from the same S3 API server, side by side.

The set (``bench_scan.make_dataset``, the single-turn 200M-token set by default) is uploaded to a
real S3 API server on this machine (moto in server mode, its own process: ``tests/s3_store.py``).
Each contestant runs in its own process, reaching the server only through the standard AWS
environment, in ``--rounds`` interleaved rounds:

- floor: pyarrow's S3 filesystem reads ``input_ids`` and ``loss_mask`` batch by batch (the
  parquet reader's ranged reads) and numpy sums each mask: nothing can scan the set from this
  server faster than reading its two token columns.
- dqa: ``run_scan("s3://...")`` with every check, writing the full scan folder, one process.
- dqa-workers: the same with ``--workers`` = the CPUs this process may run on; each worker
  opens its own units from the store.
- floor-fsspec (when s3fs is installed, the ``bench`` extra): the floor through fsspec's s3fs
  wrapped as a pyarrow filesystem, the road the other schemes take: why ``s3://`` goes through
  pyarrow's own S3 filesystem.

Then one more pass of the floor and of dqa through a counting proxy (``FaultProxy``): the bytes
each fetched, against the compressed size of the two column chunks the checks need (from the
footer). Peak RSS is each contestant's own (``ru_maxrss``; dqa-workers: its largest process).

Usage:
    python bench/bench_store_scan.py [--tokens 200e6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_scan import make_dataset  # noqa: E402
from s3_store import FaultProxy, S3Server, new_bucket, store_env, upload  # noqa: E402

COLUMNS = ["input_ids", "loss_mask"]


def run_floor(url: str, through_fsspec: bool = False) -> dict:
    import numpy as np
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    if through_fsspec:  # the road dqa takes for schemes pyarrow has no filesystem of its own for
        import s3fs

        fs = pafs.PyFileSystem(pafs.FSSpecHandler(s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"])))
        key = url[len("s3://"):]
    else:
        fs, key = pafs.FileSystem.from_uri(url)
    tokens = supervised = 0
    for rb in pq.ParquetFile(fs.open_input_file(key)).iter_batches(batch_size=2048, columns=COLUMNS):
        tokens += len(rb.column(0).values)
        supervised += int(np.asarray(rb.column(1).values).sum(dtype=np.int64))
    return {"tokens": tokens, "supervised": supervised}


def run_dqa(url: str, workers: int) -> dict:
    import tempfile

    from dqa.audit.scan import ScanOptions, run_scan

    with tempfile.TemporaryDirectory() as out:
        r = run_scan(url, Path(out) / "scan", ScanOptions(workers=workers))
        return {"tokens": r.summary["tokens"], "failing_rows": r.summary["failing_rows"], "rows": r.summary["rows"]}


def _child(kind: str, url: str, workers: int) -> None:
    t0 = time.perf_counter()
    out = run_floor(url, kind == "floor-fsspec") if kind.startswith("floor") else run_dqa(url, workers)
    out["wall_s"] = time.perf_counter() - t0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out["rss_mib"] = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, kids) / 1024
    print(json.dumps(out))


def measure(kind: str, url: str, env: dict, workers: int = 1) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", kind, "--url", url, "--workers", str(workers)],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def needed_bytes(local: Path) -> int:
    import pyarrow.parquet as pq

    md = pq.ParquetFile(local).metadata
    return sum(md.row_group(g).column(c).total_compressed_size for g in range(md.num_row_groups)
               for c in range(md.num_columns) if md.row_group(g).column(c).path_in_schema.split(".")[0] in COLUMNS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=float, default=200e6)
    ap.add_argument("--data", type=Path, default=None, help="the set's cache file (default bench/data/scan.parquet)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=["floor", "floor-fsspec", "dqa"])
    ap.add_argument("--url")
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    if a.child:
        _child(a.child, a.url, a.workers)
        return
    from dqa.audit.scan_workers import default_workers

    data = a.data or HERE / "data" / ("scan.parquet" if a.tokens == 200e6 else f"scan-{a.tokens:.0e}.parquet")
    if not data.exists():
        make_dataset(data, a.tokens)
    server = S3Server()
    try:
        env = store_env(server.url)
        bucket = new_bucket(server.url)
        url = f"s3://{bucket}/bench/{data.name}"
        t0 = time.perf_counter()
        upload(server.url, data, url)
        print(f"set: {data} ({data.stat().st_size / 2**20:,.0f} MiB), uploaded in {time.perf_counter() - t0:.1f} s to {server.url}")
        workers = default_workers()
        import importlib.util

        fsspec_s3 = importlib.util.find_spec("s3fs") is not None
        rounds = []
        for r in range(a.rounds):
            row = {"floor": measure("floor", url, env), "dqa": measure("dqa", url, env),
                   "dqa-workers": measure("dqa", url, env, workers)}
            if fsspec_s3:
                row["floor-fsspec"] = measure("floor-fsspec", url, env)
            rounds.append(row)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v['wall_s']:.2f} s ({v['rss_mib']:,.0f} MiB)" for k, v in row.items()))
        for k in ("dqa", "dqa-workers", *(["floor-fsspec"] if fsspec_s3 else [])):
            ratios = [x[k]["wall_s"] / x["floor"]["wall_s"] for x in rounds]
            print(f"{k} vs the floor: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x)")
        tokens = rounds[0]["floor"]["tokens"]
        print(f"tokens {tokens:,}; floor {tokens / statistics.median(x['floor']['wall_s'] for x in rounds) / 1e6:.0f} M tok/s")
        print(f"peak RSS: dqa {max(x['dqa']['rss_mib'] for x in rounds):,.0f} MiB, "
              f"dqa-workers (largest process) {max(x['dqa-workers']['rss_mib'] for x in rounds):,.0f} MiB")
        proxy = FaultProxy(server.url)
        need = needed_bytes(data)
        for kind, w in (("floor", 1), ("dqa", 1), ("dqa", workers)):
            proxy.reset_counts()
            measure(kind, url, {**env, "AWS_ENDPOINT_URL": proxy.url}, w)
            print(f"bytes fetched, {kind} (workers {w}): {proxy.bytes_out / 2**20:,.1f} MiB = "
                  f"{proxy.bytes_out / need:.3f}x the two columns' {need / 2**20:,.1f} MiB ({len(proxy.requests)} requests)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
