"""`dqa scan --ray` against `dqa scan --workers 2` on this machine, and Ray's per-task overhead.

With a 2-CPU Ray cluster already running on 127.0.0.1 (`ray start --head`, started here), each round runs, one
after the other and in alternating order, `dqa scan DATA --workers 2` and `dqa scan DATA --ray auto` as the CLI
(new processes: both pay the CLI's start; --ray also its connection), and checks that their findings are the
same. Printed: each contestant's median wall time, the ratio (the issue's goal: --ray at >= 0.8x the speed of
--workers 2), and the overhead of a Ray task measured apart: a round trip of empty tasks, and of tasks returning
a unit's parts' size in bytes. Also, apart: ``dqa.scan`` timed in a driver that has scanned once already, for each
contestant (one process each; with --ray the caller's own ``ray.init``), which leaves out what every new Ray job
pays once: starting its worker processes (Python, Ray and dqa's imports) where the pool forks. From those, a projection for 8 nodes of 32 cores on a 100B-token set (stated as
arithmetic on the measured figures, not a run).

    python bench/bench_scan_ray.py [--turns 1|3] [--data PATH] [--tokens 200e6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).parent))
from bench_scan import make_dataset  # noqa: E402

# Ray's switch for a cluster on one machine: 127.0.0.1 stays the loopback address when a driver connects.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # here too, before ray is imported (task_overhead)
ENV = dict(os.environ)
RAY = str(Path(sys.executable).parent / "ray")  # the CLI of the Ray this interpreter imports


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(cpus: int) -> str:
    port = free_port()
    subprocess.run([RAY, "start", "--head", f"--num-cpus={cpus}", "--node-ip-address=127.0.0.1", f"--port={port}",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True, env=ENV, capture_output=True)
    return f"127.0.0.1:{port}"


def scan(data: Path, out: Path, *args: str, env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", "scan", str(data), "--out", str(out), "--quiet", *args],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"dqa scan {' '.join(args)} -> {proc.returncode}: {proc.stderr}")
    return wall


STEADY = """
import sys, time, tempfile
import dqa
mode, data, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "ray":
    import ray
    ray.init(address="auto", logging_level="ERROR")  # the caller's connection: dqa.scan uses it as it is
kw = {"ray": "auto"} if mode == "ray" else {"workers": 2}
with tempfile.TemporaryDirectory() as tmp:
    dqa.scan(data, out=tmp + "/warm", **kw)  # this driver's Ray workers started, its modules imported
    for r in range(rounds):
        t0 = time.perf_counter()
        dqa.scan(data, out=f"{tmp}/{r}", **kw)
        print(time.perf_counter() - t0)
"""


def steady_state(data: Path, rounds: int, env: dict) -> dict[str, float]:
    """Median over ``rounds`` of the seconds of ``dqa.scan`` in a driver that has scanned once already (its Ray workers running, its imports
    done), for ``--ray auto`` and ``--workers 2``: the per-job start of Ray's worker processes left out."""
    walls: dict[str, list[float]] = {"ray": [], "pool": []}
    for r in range(rounds):  # one driver per round and contestant, the order alternated, as for the CLI
        for mode in (("ray", "pool") if r % 2 == 0 else ("pool", "ray")):
            proc = subprocess.run([sys.executable, "-c", STEADY, mode, str(data), "1"], env=env, check=True,
                                  capture_output=True, text=True)
            walls[mode].append(float(proc.stdout.split()[-1]))
    return {mode: statistics.median(v) for mode, v in walls.items()}


def task_overhead(address: str, n: int, payload: int) -> float:
    """Seconds per task, for ``n`` tasks of one CPU each returning ``payload`` bytes, taken as they finish."""
    import ray

    ray.init(address="auto", logging_level="ERROR")  # the cluster started here, with its auth token
    try:
        @ray.remote(num_cpus=1)
        def unit(size: int) -> bytes:
            return b"x" * size

        ray.get([unit.remote(0) for _ in range(4)])  # the workers started
        t0 = time.perf_counter()
        pending = [unit.remote(payload) for _ in range(n)]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ray.get(ready[0])
        return (time.perf_counter() - t0) / n
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=None,
                    help="default: bench_scan.py's cached set for --turns (bench/data/scan.parquet, scan-turns3.parquet)")
    ap.add_argument("--turns", type=int, default=1, choices=(1, 3))
    ap.add_argument("--tokens", type=float, default=200e6)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    default = Path(__file__).parent / "data" / ("scan.parquet" if args.turns == 1 else "scan-turns3.parquet")
    data = make_dataset(args.data or default, args.tokens, turns=args.turns)
    address = start_cluster(2)
    env = {k: v for k, v in ENV.items() if k != "RAY_ADDRESS"}  # --ray auto finds the cluster started here (and its auth token)
    try:
        walls: dict[str, list[float]] = {"workers 2": [], "ray": []}
        with tempfile.TemporaryDirectory() as tmp:
            outs = {"workers 2": Path(tmp) / "pool", "ray": Path(tmp) / "ray"}
            flags = {"workers 2": ("--workers", "2"), "ray": ("--ray", "auto")}
            scan(data, Path(tmp) / "warm", "--ray", "auto", env=env)  # the cluster's workers and the page cache warm
            for r in range(args.rounds):
                order = ["workers 2", "ray"] if r % 2 == 0 else ["ray", "workers 2"]
                for name in order:
                    walls[name].append(scan(data, outs[name], *flags[name], env=env))
            same = all(pl.read_parquet(outs["ray"] / f"{t}.parquet").equals(pl.read_parquet(outs["workers 2"] / f"{t}.parquet"))
                       for t in ("findings", "metrics", "turns"))
            summary = json.loads((outs["ray"] / "summary.json").read_text())
            part_bytes = sum(p.stat().st_size for p in outs["ray"].glob("*.parquet"))
        steady = steady_state(data, args.rounds, env)
        per_task_empty = task_overhead(address, 200, 0)
        per_task_unit = task_overhead(address, 100, 256 * 1024)
    finally:
        subprocess.run([RAY, "stop", "--force"], env=ENV, capture_output=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    tokens = summary["tokens"]
    print(f"set: {data} ({tokens / 1e6:,.0f}M tokens, {summary['rows']:,} rows); {args.rounds} alternated rounds; "
          f"findings, metrics and turns identical: {same}")
    for k, v in walls.items():
        print(f"  dqa scan --{'workers 2' if k == 'workers 2' else 'ray auto'}: median {med[k]:.2f} s "
              f"({', '.join(f'{x:.2f}' for x in v)})")
    print(f"  --ray speed / --workers 2 speed: {med['workers 2'] / med['ray']:.2f}x (goal >= 0.8x)")
    print(f"  in a driver's second scan (dqa.scan; Ray's workers already started): --ray auto median {steady['ray']:.2f} s, "
          f"--workers 2 {steady['pool']:.2f} s: {steady['pool'] / steady['ray']:.2f}x")
    print(f"  Ray task round trip: {per_task_empty * 1e3:.1f} ms empty, {per_task_unit * 1e3:.1f} ms returning 256 KiB "
          f"(2 CPUs, tasks taken as they finish)")
    # Projection: 100B tokens on 8 x 32 = 256 CPUs, from this machine's per-core rate (the pool's, 2 cores).
    rate_per_core = tokens / med["workers 2"] / 2
    cpus, big = 256, 100e9
    units = 4 * cpus * 8  # guided units: a few per CPU, more as they shrink (about 4 x CPUs x ln(rows/cut))
    compute = big / (rate_per_core * cpus)
    overhead = units * per_task_unit / cpus * 2  # the measured overhead was for 2 CPUs at once
    driver_bytes = part_bytes / tokens * big
    print(f"  projection (arithmetic, not a run): 100B tokens on 8 nodes x 32 cores at this machine's "
          f"{rate_per_core / 1e6:.0f}M tokens/s per core: {compute:.0f} s of scanning, plus ~{overhead:.1f} s of task "
          f"overhead for ~{units:,} units; the driver merges ~{driver_bytes / 2**30:.1f} GiB of scan tables "
          f"(this set's output, {part_bytes / 2**20:.0f} MiB, scaled)")


if __name__ == "__main__":
    main()
