"""Benchmark: `dqa scan` (all checks) against the floor and against a per-row Python loop.

One run, each contestant in its own process so that peak RSS is its own:

- floor: pyarrow reads the two token columns batch by batch and numpy sums the mask;
  nothing can scan faster than reading the data. The goal is stated against this floor, which
  opens the file with pyarrow's defaults.
- floor-mmap: the same read with the file memory-mapped, as dqa reads it (~20% less CPU on a
  cached file): the stricter floor, printed beside the other.
- dqa: ``run_scan`` with every check, writing the full scan folder, one process (``--workers 1``).
- dqa-1core: the same pinned to one core (``taskset -c 0``): issue 22's "its own one-core time".
- dqa-workers: ``--workers`` = the CPUs this process may run on; its peak RSS is the sum over its process
  tree (the pool's workers included), read every 50 ms (the tree itself found once a second: the sampler must not
  take the CPU it measures; the other contestants' peak is their own ``ru_maxrss``).
- side by side: dqa-1core on every core at once, each pinned to its own core and scanning the whole set: how
  much slower one scan runs while the others run, which bounds what a split across the cores can reach (printed
  as the machine's ceiling, an estimate, with dqa-workers' share of it).
- loop: what a typical preprocessing script does: iterate rows as Python lists, sum the
  mask, decode the supervised tokens with the tokenizer and count identical texts. It runs on
  a prefix of the set (``--loop-rows``) because it is slow; it is compared by tokens/s.

dqa's modules are compiled to bytecode first (``compileall``), as ``pip install`` compiles them: a checkout whose
environment sets PYTHONDONTWRITEBYTECODE=1 would otherwise compile them in every contestant.

Usage:
    python bench/bench_scan.py [--tokens 200e6] [--turns 1|3] [--data bench/data/scan.parquet] [--rounds 3]

Prints tokens/s, wall time and peak RSS of each and the ratios. The floors, dqa-1core, dqa-workers and the
side-by-side run are measured in ``--rounds`` interleaved rounds: the ratios are taken within each round and
printed as the median with the range. Two generated sets, cached under
bench/data/ (gitignored), both of realistic Qwen3 structure:

- ``--turns 1`` (the default, ``scan.parquet``): one user/assistant exchange per sample, think
  blocks, 10% "OK." rows, 2% loops; the assistant content through ``<|im_end|>`` is trained.
- ``--turns 3`` (``scan-turns3.parquet``): multi-turn conversations, about 3 assistant turns per
  sample (2-4), all trained the SpecForge way (each assistant span through ``<|im_end|>`` and the
  newline after it), history turns without reasoning as Qwen3's template renders them, the final
  turn thinking; 10% of the samples have an "OK." in one random turn, 2% a loop in one turn.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

IM_START, IM_END, THINK, END_THINK, NL, NLNL = 151644, 151645, 151667, 151668, 198, 271
USER, ASSISTANT, SYSTEM = 872, 77091, 8948
VOCAB_TEXT = 150000  # ordinary text ids are drawn below this


def _rows_batch(rng: np.random.Generator, n: int, mean_len: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``n`` synthetic chat samples; per-row numpy construction (generation is not what is measured)."""
    ids_rows, mask_rows = [], []
    for i in range(n):
        prompt = rng.integers(0, VOCAB_TEXT, rng.integers(30, 300), dtype=np.int32)
        head = np.concatenate(([IM_START, USER, NL], prompt, [IM_END, NL, IM_START, ASSISTANT, NL])).astype(np.int32)
        kind = rng.random()
        if kind < 0.10:  # the OK. mode
            body = np.array([THINK, NLNL, END_THINK, NLNL, 3925, 13, IM_END], dtype=np.int32)
        else:
            think_len = max(10, int(rng.normal(mean_len * 0.75, mean_len * 0.25)))
            thinking = rng.integers(0, VOCAB_TEXT, think_len, dtype=np.int32)
            if kind < 0.12:  # a loop
                thinking = np.tile(rng.integers(0, VOCAB_TEXT, 20, dtype=np.int32), think_len // 20 + 1)[:think_len]
            answer = rng.integers(0, VOCAB_TEXT, max(10, int(rng.normal(mean_len * 0.2, 50))), dtype=np.int32)
            body = np.concatenate(([THINK, NL], thinking, [NL, END_THINK, NLNL], answer, [IM_END])).astype(np.int32)
        ids = np.concatenate((head, body, [NL])).astype(np.int32)
        mask = np.zeros(len(ids), dtype=np.int8)
        mask[len(head) : len(head) + len(body)] = 1
        ids_rows.append(ids)
        mask_rows.append(mask)
    return ids_rows, mask_rows


def _multi_turn_batch(rng: np.random.Generator, n: int, mean_len: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``n`` synthetic multi-turn conversations (2-4 assistant turns, mean 3), every assistant turn
    trained SpecForge's way: from after ``<|im_start|>assistant\\n`` through ``<|im_end|>\\n``. History
    replies carry no think block (Qwen3's template drops history reasoning); the final reply thinks.
    About ``mean_len`` tokens per sample, like the single-turn set."""
    ids_rows, mask_rows = [], []
    parts: list[np.ndarray] = []
    masks: list[np.ndarray] = []

    def add(trained: bool, *pieces) -> None:
        a = np.concatenate([np.asarray(p, dtype=np.int32) for p in pieces])
        parts.append(a)
        masks.append(np.full(len(a), 1 if trained else 0, dtype=np.int8))

    def text(lo: int, hi: int) -> np.ndarray:
        return rng.integers(0, VOCAB_TEXT, rng.integers(lo, hi), dtype=np.int32)

    for _ in range(n):
        parts.clear()
        masks.clear()
        if rng.random() < 0.5:
            add(False, [IM_START, SYSTEM, NL], text(10, 80), [IM_END, NL])
        turns = int(rng.choice([2, 3, 3, 4]))
        kind = rng.random()
        odd_turn = int(rng.integers(0, turns))  # where this sample's defect (if any) sits
        for k in range(turns):
            add(False, [IM_START, USER, NL], text(20, 200), [IM_END, NL, IM_START, ASSISTANT, NL])
            final = k == turns - 1
            if kind < 0.10 and k == odd_turn:  # the OK. mode, in one turn
                add(True, [THINK, NLNL, END_THINK, NLNL, 3925, 13, IM_END, NL] if final else [3925, 13, IM_END, NL])
                continue
            answer = rng.integers(0, VOCAB_TEXT, max(10, int(rng.normal(mean_len * (0.2 if final else 0.12), 40))), dtype=np.int32)
            thinking = rng.integers(0, VOCAB_TEXT, max(10, int(rng.normal(mean_len * 0.45, mean_len * 0.15))), dtype=np.int32)
            if kind >= 0.98 and k == odd_turn:  # a loop, in one turn: the final turn's thinking, a history reply
                size = max(len(thinking if final else answer), 200)
                loop = np.tile(rng.integers(0, VOCAB_TEXT, 20, dtype=np.int32), size // 20 + 1)[:size]
                thinking, answer = (loop, answer) if final else (thinking, loop)
            if final:
                add(True, [THINK, NL], thinking, [NL, END_THINK, NLNL], answer, [IM_END, NL])
            else:
                add(True, answer, [IM_END, NL])
        ids_rows.append(np.concatenate(parts))
        mask_rows.append(np.concatenate(masks))
    return ids_rows, mask_rows


def make_dataset(path: Path, tokens: float, mean_len: int = 2500, seed: int = 0, turns: int = 1) -> Path:
    """Write the synthetic set (cached: reused when it exists)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".partial")
    written = 0
    row = 0
    with pq.ParquetWriter(tmp, pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))])) as w:
        while written < tokens:
            ids, mask = (_rows_batch if turns == 1 else _multi_turn_batch)(rng, 2048, mean_len)
            lengths = np.array([len(x) for x in ids])
            offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
            table = pa.table(
                {
                    "id": pa.array([f"b-{row + i}" for i in range(len(ids))]),
                    "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(ids))),
                    "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(mask))),
                }
            )
            w.write_table(table)
            written += int(lengths.sum())
            row += len(ids)
            print(f"\rgenerating: {written / 1e6:,.0f}M tokens", end="", file=sys.stderr)
    print(file=sys.stderr)
    os.replace(tmp, path)
    return path


# --- contestants (each runs in a child process) --------------------------------------------


def run_floor(data: Path, memory_map: bool = False) -> dict:
    import pyarrow.parquet as pq

    tokens = supervised = 0
    for rb in pq.ParquetFile(data, memory_map=memory_map).iter_batches(batch_size=2048, columns=["input_ids", "loss_mask"]):
        tokens += len(rb.column(0).values)
        supervised += int(np.asarray(rb.column(1).values).sum(dtype=np.int64))
    return {"tokens": tokens, "supervised": supervised}


def run_dqa(data: Path, workers: int = 1) -> dict:
    import tempfile

    from dqa.audit.scan import ScanOptions, run_scan

    with tempfile.TemporaryDirectory() as out:
        result = run_scan(data, Path(out) / "scan", ScanOptions(workers=workers))
        return {"tokens": result.summary["tokens"], "failing_rows": result.summary["failing_rows"],
                "rows": result.summary["rows"], "turns": result.summary["turns"]}


def run_loop(data: Path, rows: int) -> dict:
    from collections import Counter

    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    tok = Tokenizer.from_file(str(qwen3_tokenizer_dir() / "tokenizer.json"))
    counts: Counter[str] = Counter()
    tokens = seen = 0
    for rb in pq.ParquetFile(data).iter_batches(batch_size=2048, columns=["input_ids", "loss_mask"]):
        for ids, mask in zip(rb.column(0).to_pylist(), rb.column(1).to_pylist()):
            tokens += len(ids)
            n_sup = sum(mask)
            text = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False) if n_sup else ""
            counts[text] += 1
            seen += 1
            if seen >= rows:
                return {"tokens": tokens, "rows": seen, "distinct": len(counts)}
    return {"tokens": tokens, "rows": seen, "distinct": len(counts)}


def _child(kind: str, data: Path, loop_rows: int) -> None:
    t0 = time.perf_counter()
    out = {"floor": lambda: run_floor(data), "floor-mmap": lambda: run_floor(data, memory_map=True), "dqa": lambda: run_dqa(data),
           "dqa-1core": lambda: run_dqa(data), "dqa-workers": lambda: run_dqa(data, len(os.sched_getaffinity(0))),
           "loop": lambda: run_loop(data, loop_rows)}[kind]()
    out["wall_s"] = time.perf_counter() - t0
    print(json.dumps(out))


def _descendants(pid: int) -> list[int]:
    """``pid`` and its descendants (a scan of the process table: ~2.4 ms of CPU here, so done once a second)."""
    import psutil

    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


def _rss_mib(pids: list[int]) -> float:
    """The resident memory of ``pids``, MiB (a process that is gone counts 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return total * os.sysconf("SC_PAGE_SIZE") / 2**20


def _measure(kind: str, data: Path, loop_rows: int, cpu: int = 0) -> dict:
    import threading

    cmd = [sys.executable, __file__, "--child", kind, "--data", str(data), "--loop-rows", str(loop_rows)]
    if kind == "dqa-1core":
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    tree_peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        # Only the pool has a tree to sum (the others' peak is wait4's ru_maxrss). The sampler must not take CPU
        # from what it measures: the process table is scanned once a second, the known pids' RSS read every 50 ms.
        pids, scanned = [proc.pid], 0.0
        while not done.wait(0.05):
            if time.monotonic() - scanned > 1.0:
                pids, scanned = _descendants(proc.pid), time.monotonic()
            tree_peak[0] = max(tree_peak[0], _rss_mib(pids))

    sampler = threading.Thread(target=sample, daemon=True)
    if kind == "dqa-workers":
        sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    if sampler.is_alive():
        sampler.join()
    out = proc.stdout.read()  # type: ignore[union-attr]
    if status != 0:
        raise SystemExit(f"{kind} failed with status {status}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mib"] = usage.ru_maxrss / 1024
    result["tree_peak_rss_mib"] = tree_peak[0] if kind == "dqa-workers" else result["peak_rss_mib"]
    result["cpu_s"] = usage.ru_utime + usage.ru_stime
    result["tok_per_s"] = result["tokens"] / result["wall_s"]
    return result


def _compile_dqa() -> None:
    """Write the bytecode of dqa's modules, as ``pip install`` does: a checkout run with PYTHONDONTWRITEBYTECODE=1
    (this sandbox sets it) would otherwise compile them from source in every contestant (40-60 ms of serial import
    that an installed dqa never pays, in dqa-1core and dqa-workers alike)."""
    import compileall
    import importlib

    for name in ("dqa", "dqa.audit", "dqa.regen", "dqa.reports", "dqa.expectations"):
        for folder in importlib.import_module(name).__path__:
            compileall.compile_dir(folder, quiet=1)


ROUND_CONTESTANTS = ("floor", "floor-mmap", "dqa-1core", "dqa-workers")  # measured every round (``--rounds``)


def _side_by_side(data: Path, loop_rows: int) -> list[dict]:
    """The one-core scan run on every core at once (each pinned to its own, each scanning the whole set): how much
    slower a scan runs while the other cores scan too (shared caches, memory bandwidth, the kernel's page handling).
    That slowdown bounds any split of the work across the cores, before a single serial step. Empty on one core."""
    from concurrent.futures import ThreadPoolExecutor

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return []
    with ThreadPoolExecutor(len(cpus)) as pool:
        return list(pool.map(lambda c: _measure("dqa-1core", data, loop_rows, cpu=c), cpus))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=float, default=200e6)
    ap.add_argument("--turns", type=int, choices=[1, 3], default=1, help="1: today's single-turn set; 3: the multi-turn set")
    ap.add_argument("--data", type=Path, default=None, help="the set's cache file (default bench/data/scan.parquet, or scan-turns3.parquet)")
    ap.add_argument("--loop-rows", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the floors, dqa-1core, dqa-workers and "
                    "the side-by-side run; their medians are printed (default 3)")
    ap.add_argument("--child", choices=["floor", "floor-mmap", "dqa", "dqa-1core", "dqa-workers", "loop"])
    args = ap.parse_args()
    if args.data is None:
        args.data = Path(__file__).parent / "data" / ("scan.parquet" if args.turns == 1 else f"scan-turns{args.turns}.parquet")
    if args.child:
        _child(args.child, args.data, args.loop_rows)
        return
    data = make_dataset(args.data, args.tokens, turns=args.turns)
    _compile_dqa()
    # The scaling contestants run in interleaved rounds (this VM's neighbours move single timings by 10-20%):
    # each round's ratios compare runs made within seconds of each other, and the medians over rounds are printed.
    rounds = []
    for _ in range(max(args.rounds, 1)):
        rnd = {k: _measure(k, data, args.loop_rows) for k in ROUND_CONTESTANTS}
        rnd["side by side"] = _side_by_side(data, args.loop_rows)
        rounds.append(rnd)
    results = {k: _measure(k, data, args.loop_rows) for k in ("dqa", "loop")}
    for k in ROUND_CONTESTANTS:  # the round whose wall time is the median stands for the contestant in the table
        results[k] = sorted((r[k] for r in rounds), key=lambda r: r["wall_s"])[len(rounds) // 2]
    results = {k: results[k] for k in ("floor", "floor-mmap", "dqa", "dqa-1core", "dqa-workers", "loop")}
    d = results["dqa"]
    print(f"dataset: {data.name}, {results['floor']['tokens'] / 1e6:,.1f}M tokens, {d['rows']:,} samples, "
          f"{d['turns']:,} trained turns ({d['turns'] / d['rows']:.2f} per sample), {d['failing_rows']:,} failing samples")
    print(f"{'contestant':<12} {'tokens':>11} {'wall s':>9} {'CPU s':>8} {'Mtok/s':>9} {'peak RSS MiB':>13} {'tree RSS MiB':>13}")
    for k, r in results.items():
        print(f"{k:<12} {r['tokens']:>11,} {r['wall_s']:>9.2f} {r['cpu_s']:>8.2f} {r['tok_per_s'] / 1e6:>9.2f} {r['peak_rss_mib']:>13.0f}"
              f" {r['tree_peak_rss_mib']:>13.0f}")
    if len(rounds) > 1:
        print(f"(floor, floor-mmap, dqa-1core, dqa-workers: the middle of {len(rounds)} interleaved rounds, by wall time)")
    f, d, lo = results["floor"], results["dqa"], results["loop"]
    cpu_rate = {k: r["tokens"] / r["cpu_s"] for k, r in results.items()}
    print(f"dqa time / floor time: {d['wall_s'] / f['wall_s']:.2f}x wall, {d['cpu_s'] / f['cpu_s']:.2f}x CPU (goal <= 2.5x)")
    fm = results["floor-mmap"]
    print(f"dqa time / memory-mapped floor time: {d['wall_s'] / fm['wall_s']:.2f}x wall, {d['cpu_s'] / fm['cpu_s']:.2f}x CPU "
          "(dqa reads memory-mapped too; this floor is the stricter one)")
    print(
        f"dqa speed / loop speed: {d['tok_per_s'] / lo['tok_per_s']:.1f}x wall, {cpu_rate['dqa'] / cpu_rate['loop']:.1f}x per CPU second "
        f"(goal >= 10x; loop measured on {lo['rows']:,} rows)"
    )
    print(f"dqa peak RSS: {d['peak_rss_mib']:.0f} MiB (goal < 2048)")
    n = len(os.sched_getaffinity(0))
    speedup = [r["dqa-1core"]["wall_s"] / r["dqa-workers"]["wall_s"] for r in rounds]
    vs_floor = [r["dqa-workers"]["wall_s"] / r["floor"]["wall_s"] for r in rounds]
    vs_mmap = [r["dqa-workers"]["wall_s"] / r["floor-mmap"]["wall_s"] for r in rounds]
    tree = max(r["dqa-workers"]["tree_peak_rss_mib"] for r in rounds)
    print(f"dqa --workers {n}: {_spread(speedup)} its own one-core time (goal >= 1.8x); {_spread(vs_floor)} the floor's wall, "
          f"{_spread(vs_mmap)} the memory-mapped floor's (goal <= 1.25x); peak RSS of its processes {tree:.0f} MiB "
          f"(goal <= 2048); load {os.getloadavg()[0]:.1f}")
    if all(r["side by side"] for r in rounds):
        slow = [sum(x["wall_s"] for x in r["side by side"]) / n / r["dqa-1core"]["wall_s"] for r in rounds]
        ceiling = [n / x for x in slow]
        print(f"the machine's ceiling (an estimate): {n} one-core scans side by side, one per core, each ran {_spread(slow)} "
              f"the lone one-core run's time, so a perfect {n}-way split would reach about {_spread(ceiling)} its one-core "
              f"time here; dqa --workers {n} reached {_spread([a / c for a, c in zip(speedup, ceiling)], '.0%', '')} of that")


def _spread(values: list[float], fmt: str = ".2f", unit: str = "x") -> str:
    """``median`` alone for one value, else ``median (min-max over N rounds)``."""
    v = sorted(values)
    med = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
    if len(v) == 1:
        return f"{med:{fmt}}{unit}"
    return f"{med:{fmt}}{unit} ({v[0]:{fmt}}-{v[-1]:{fmt}}{unit} over {len(v)} rounds)"


if __name__ == "__main__":
    main()
