"""Benchmark: the same dqa commands on two source trees, side by side, in interleaved rounds.

Issue 21's check that a move-and-split step slowed nothing: `dqa scan`, `dqa merge` and a
zero-latency `dqa regen` run on each ``--tree`` in turn, round after round, and every ratio is
taken within a round (this VM's speed drifts by tens of percent from one minute to the next).
The figure is the median of the per-round ratios; the goal is <= 1.05x of the first tree.

Contestants: ``--tree NAME=PATH`` (two or more; the first is the reference), built as
``bench_regen_seed.py`` builds its trees (the tree's files installed with ``pip --target``, run
with ``PYTHONPATH``; each command's cwd is the work folder so that no checkout's ``dqa/`` shadows
it). Each command is a whole process, timed with ``os.wait4``: wall seconds and CPU seconds
(user + system, the process and its threads; the stand-in server's CPU is not counted).

    git worktree add --detach /tmp/dqa-before a9e4526     # the tree before issue 21's rooms
    python bench/bench_trees.py --tree before=/tmp/dqa-before --tree now=. --rounds 3

The sets:
- scan: ``bench_scan.py``'s single-turn set (``--scan-tokens``, cached under bench/data/);
- merge: ``bench_merge.py``'s set and regen shards (``--merge-rows``, 30% replaced);
- regen: ``bench_regen_seed.py``'s Qwen3 set (``--regen-rows``, 87% "OK." rows) and its scan,
  against the zero-latency SGLang stand-in, ``--max-new-tokens 64``, no kill.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_merge  # noqa: E402
import bench_regen_seed as seed  # noqa: E402
import bench_scan  # noqa: E402

GOAL = 1.05


def timed(cmd: list[str], env: dict, cwd: Path, log: Path) -> tuple[float, float, int]:
    """Run ``cmd``; return (wall s, CPU s, exit status)."""
    with open(log, "ab") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=f, stderr=f)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    return wall, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status)


def _clean(out: Path) -> None:
    """Remove a run's output: the folder ``out``, or the file ``out.parquet`` and what merge writes beside it."""
    shutil.rmtree(out, ignore_errors=True)
    for p in out.parent.glob(f"{out.name}.parquet*"):
        p.unlink()


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH", help="a dqa source tree (two or more)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--what", default="scan,merge,regen", help="comma-separated: scan, merge, regen")
    ap.add_argument("--scan-tokens", type=float, default=50e6)
    ap.add_argument("--merge-rows", type=int, default=100_000)
    ap.add_argument("--regen-rows", type=int, default=40_000)
    ap.add_argument("--work", type=Path, default=None, help="built trees and outputs (default: a temp dir, removed)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    trees = [seed.Tree(*t.split("=", 1)) for t in args.tree]
    if len(trees) < 2:
        raise SystemExit("give two or more --tree NAME=PATH")
    what = [w.strip() for w in args.what.split(",") if w.strip()]
    if unknown := set(what) - {"scan", "merge", "regen"}:
        raise SystemExit(f"--what: unknown {sorted(unknown)}; expected scan, merge, regen")
    work = args.work or Path(tempfile.mkdtemp(prefix="dqa-bench-trees-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    stub = None
    try:
        for t in trees:
            seed.prepare_tree(t, work)
        cmds: dict[str, list[str]] = {}
        py = [sys.executable, "-m", "dqa.cli"]
        if "scan" in what:
            data = bench_scan.make_dataset(HERE / "data" / f"scan-{args.scan_tokens:.0f}.parquet", args.scan_tokens)
            cmds["scan"] = py + ["scan", str(data), "--out", "{out}", "--quiet"]
        if "merge" in what:
            shutil.rmtree(work / "merge-set", ignore_errors=True)
            (work / "merge-set").mkdir()
            mdata, mregen = bench_merge.build(work / "merge-set", args.merge_rows, 0.3)
            cmds["merge"] = py + ["merge", str(mdata), "--regen", str(mregen), "--out", "{out}.parquet", "--quiet"]
        if "regen" in what:
            (work / "regen-set").mkdir(exist_ok=True)
            rdata, rscan, _ = seed.ensure_set(work / "regen-set", args.regen_rows, 0, (16, 96))
            stub, url = seed.start_stub(work)
            cmds["regen"] = py + ["regen", str(rdata), "--findings", str(rscan), "--endpoint", url, "--tokenizer", "qwen3",
                                  "--out", "{out}", "--max-new-tokens", "64", "--quiet"]
        figures: dict[str, list[dict]] = {k: [] for k in cmds}
        for rnd in range(1, args.rounds + 1):
            for what_k, cmd in cmds.items():
                row = {}
                for t in trees:
                    out = work / "out" / f"{what_k}-{t.name}-r{rnd}"
                    _clean(out)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    wall, cpu, rc = timed([c.replace("{out}", str(out)) for c in cmd], t.env(), work, work / f"{what_k}-{t.name}.log")
                    if rc not in (0, 1):  # scan exits 1 when it finds failing samples
                        raise SystemExit(f"{what_k} on tree {t.name} exited {rc}; see {work / f'{what_k}-{t.name}.log'}")
                    row[t.name] = {"wall_s": wall, "cpu_s": cpu, "rc": rc}
                    _clean(out)
                figures[what_k].append(row)
                ref = row[trees[0].name]
                print(f"[round {rnd}] {what_k:5s} " + "  ".join(
                    f"{n}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU ({r['wall_s'] / ref['wall_s']:.3f}x, {r['cpu_s'] / ref['cpu_s']:.3f}x CPU)"
                    for n, r in row.items()) + f"  load {os.getloadavg()[0]:.1f}", flush=True)
        print(f"\n== {', '.join(cmds)}: median of per-round ratios against {trees[0].name} (goal <= {GOAL}x) ==")
        summary = {}
        for what_k, rows in figures.items():
            for t in trees[1:]:
                wall = _median([r[t.name]["wall_s"] / r[trees[0].name]["wall_s"] for r in rows])
                cpu = _median([r[t.name]["cpu_s"] / r[trees[0].name]["cpu_s"] for r in rows])
                met = sum(r[t.name]["wall_s"] / r[trees[0].name]["wall_s"] <= GOAL for r in rows)
                summary[f"{what_k}:{t.name}"] = {"wall_ratio": wall, "cpu_ratio": cpu, "rounds_met": met, "rounds": len(rows)}
                print(f"{what_k:5s} {t.name}/{trees[0].name}: wall {wall:.3f}x, CPU {cpu:.3f}x; "
                      f"wall within {GOAL}x in {met} of {len(rows)} rounds")
        if args.json:
            args.json.write_text(json.dumps({"figures": figures, "summary": summary}, indent=1))
    finally:
        if stub is not None:
            stub.kill()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
