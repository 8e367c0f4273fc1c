"""`dqa regen` through the real SGLang router, side by side with a plain load generator (issue 24).

Two SGLang-contract stand-ins (tests/servers/sglang_contract.py, ``--zero-latency``, a 1,024-token
context) behind one sglang-router 0.3.2 (``cache_aware``) on the loopback. In ONE run, each round
measures requests/s of

- ``plain``: a minimal asyncio + aiohttp loop posting ready-made ``/generate`` bodies (the same
  prompts, sampling and ``max_new_tokens`` dqa sends) to the router at the same concurrency: the
  router's own throughput on this machine, with a client that does nothing else,
- ``dqa``: ``regenerate(config)`` in this process against the router URL (dataset read, the router
  and worker discovery, dispatch, durable journal and parquet shards: what a real run does),

and prints dqa / plain per round and the median over rounds. Goal: dqa >= 0.8x plain.

    python bench/bench_regen_router.py --rows 3000 --rounds 3 --concurrency 32

Needs the sglang-router package (the ``test`` extra). Figures go into bench/README.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests")]


async def _plain(url: str, bodies: list[bytes], concurrency: int) -> float:
    """Requests/s of posting every body once, ``concurrency`` at a time."""
    import aiohttp

    queue = list(reversed(bodies))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        async def worker():
            while queue:
                body = queue.pop()
                async with s.post(url + "/generate", data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    assert r.status == 200, r.status

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        return len(bodies) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight (dqa: --max-in-flight on the one router URL)")
    a = ap.parse_args()

    import pyarrow.parquet as pq

    from dqa.regen.config import RegenConfig
    from dqa.regen.run import regenerate
    from regen_helpers import degenerate_dataset, write_findings
    from router_helpers import ROUTER_MISSING, Router
    from servers.sglang_contract import StubServer

    if ROUTER_MISSING:
        sys.exit(ROUTER_MISSING)
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-"))
    data = degenerate_dataset(tmp / "d.parquet", a.rows)
    findings = write_findings(tmp / "scan", list(range(a.rows)))
    workers = [StubServer(tmp / f"w{i}", "--zero-latency", "--context-length", "1024", "--request-log-size", "0", name=f"w{i}").start()
               for i in range(2)]
    router = Router(tmp / "router", [w.url for w in workers]).start()
    try:
        # The plain loop's bodies: dqa's prompts (through the assistant header) and sampling.
        ids = pq.read_table(data, columns=["input_ids"]).column("input_ids").to_pylist()
        bodies = []
        for i, row in enumerate(ids):
            p = row[: row.index(151667)] if 151667 in row else row  # up to the think block, as dqa sends
            mx = 1024 - len(p)
            bodies.append(('{"input_ids":[%s],"sampling_params":{"temperature":0.6,"top_p":0.95,"top_k":20,'
                           '"max_new_tokens":%d,"sampling_seed":%d},"rid":"plain-%d"}' % (",".join(map(str, p)), mx, i, i)).encode())
        ratios = []
        for k in range(a.rounds):
            for j, b in enumerate(bodies):
                bodies[j] = b.replace(b'"rid":"plain-', b'"rid":"p%d-' % k, 1)
            def run_plain():
                c0 = time.process_time()
                rate = asyncio.run(_plain(router.url, bodies, a.concurrency))
                return rate, (time.process_time() - c0) / len(bodies) * 1e6

            def run_dqa():
                c0, t0 = time.process_time(), time.perf_counter()
                res = regenerate(RegenConfig(dataset=str(data), out=str(tmp / f"out{k}"), endpoints=[router.url], findings=str(findings),
                                             max_in_flight=a.concurrency, live=False, install_signal_handlers=False))
                assert res.exit_code == 0 and res.progress["ok"] == a.rows, res.message
                return a.rows / (time.perf_counter() - t0), (time.process_time() - c0) / a.rows * 1e6, res

            # Alternate who goes first: the shared machine's speed drifts within a round.
            if k % 2:
                (dqa, dqa_cpu, res), (plain, plain_cpu) = run_dqa(), run_plain()
            else:
                (plain, plain_cpu), (dqa, dqa_cpu, res) = run_plain(), run_dqa()
            ratios.append(dqa / plain)
            print(f"round {k + 1}: plain {plain:6.0f} req/s ({plain_cpu:4.0f} us CPU/req)   dqa regen {dqa:6.0f} req/s "
                  f"({dqa_cpu:4.0f} us CPU/req; wall, start-up included; progress.json {res.progress['req_per_s']:.0f})   "
                  f"dqa/plain {dqa / plain:.2f}", flush=True)
        print(f"median dqa/plain over {a.rounds} rounds: {statistics.median(ratios):.2f} (goal >= 0.8); "
              f"rows {a.rows}, concurrency {a.concurrency}, router 400s "
              f"{router.metric_sum('smg_router_upstream_responses_total', status_code='400'):.0f}")
    finally:
        router.stop()
        for w in workers:
            w.stop()


if __name__ == "__main__":
    main()
