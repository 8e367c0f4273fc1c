"""How fast is dqa's regen client, side by side with the way public regeneration scripts work?

Part 1, ``loopback``: against the SGLang-contract stub server (tests/servers/sglang_contract.py)
in ``--zero-latency`` mode on this machine, so the server answers at once. It still spends about
250 us of CPU per request on the same cores (aiohttp, JSON, the contract's checks), which caps
the fastest clients; its CPU per request is printed next to each client's. In ONE run it
measures requests/s and client CPU time per request for

- ``dqa regen`` (the programmatic ``regenerate(config)``, in this process: dataset read,
  dispatch, durable journal + parquet shards, progress.json; everything a real run does),
- baseline ``openai-threads``: a ThreadPoolExecutor, one request per thread, the ``openai``
  client calling ``/v1/chat/completions`` (how SpecForge-style scripts regenerate),
- baseline ``requests-threads``: the same pool calling ``/generate`` with ``requests``
  (one Session per thread, the generous variant),

and prints the ratios: every contestant runs once per round (``--loopback-rounds``, 3), ratios are
taken within a round, and the median over rounds is the figure (the VM's speed drifts between
minutes). Goal (issue 20, over aiohttp): dqa >= 3x the openai baseline. ``--dqa-python PY`` adds
a contestant to every round: the same ``regenerate`` run by another installed tree (PY is that
tree's interpreter, e.g. a venv with the commit before a change), in a subprocess that measures
itself the same way; the goal there is dqa's client CPU per request <= 1.5x the other tree's.

Part 2, ``serve``: against ``transformers serve`` with the tiny random Qwen3 model
(examples/tiny_model.py), dqa's output tok/s versus a plain load generator (a minimal asyncio
loop posting the same chat requests) at equal concurrency. Goal: dqa >= 95% of the plain loop.

    pip install -e '.[bench]'                          # the baselines' clients (openai, requests)
    python bench/bench_regen_client.py                 # both parts
    python bench/bench_regen_client.py --part loopback --rows 20000
    python bench/bench_regen_client.py --part serve --serve-rows 96 --serve-concurrency 8

CPU time is the process CPU time of the client (all its threads) per completed request; the
stub server's CPU is measured separately with psutil and printed so the reader can see when
the server, not the client, was the limit. Figures go into bench/README.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

from servers.sglang_contract import StubServer  # noqa: E402

IM_START, IM_END, NL, NL2, THINK, END_THINK, ASSISTANT, USER, SYSTEM = 151644, 151645, 198, 271, 151667, 151668, 77091, 872, 8948


@dataclass
class Figure:
    name: str
    requests: int
    wall_s: float
    cpu_s: float
    server_cpu_s: float | None = None
    output_tokens: int | None = None
    steady_rps: float | None = None  # between the first and the last completed request (no startup)

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s

    @property
    def cpu_us(self) -> float:
        return 1e6 * self.cpu_s / self.requests

    def line(self) -> str:
        srv = f"  server {1e6 * self.server_cpu_s / self.requests:6.0f} us/req" if self.server_cpu_s is not None else ""
        tok = f"  {self.output_tokens / self.wall_s:9.1f} out tok/s" if self.output_tokens is not None else ""
        steady = f"  steady {self.steady_rps:7.2f} req/s" if self.steady_rps is not None else ""
        return (f"{self.name:<32} {self.requests:6d} req {self.wall_s:7.2f} s {self.rps:8.1f} req/s  "
                f"client {self.cpu_us:6.0f} us/req{srv}{tok}{steady}")


# ---------------------------------------------------------------------------- data


def build_dataset(path: Path, rows: int, prompt_tokens: int = 200, seed: int = 0) -> Path:
    """A parquet file of Qwen3 ChatML samples with the degenerate thinking-off "OK." answer.

    Each prompt is ``<|im_start|>system ... <|im_start|>user ... <|im_start|>assistant\\n`` with
    ``prompt_tokens`` ids in all; the answer is the empty think block + "OK." + ``<|im_end|>``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    body = prompt_tokens - 12
    words = rng.integers(1000, 100000, size=(rows, body), dtype=np.int32)
    head = np.array([IM_START, SYSTEM, NL, 2610, 525, 264, 10950, 17847, 13, IM_END, NL, IM_START, USER, NL], np.int32)[:14]
    tail = np.array([IM_END, NL, IM_START, ASSISTANT, NL, THINK, NL2, END_THINK, NL2, 3925, 13, IM_END, NL], np.int32)
    ids = np.concatenate([np.broadcast_to(head, (rows, head.size)), words, np.broadcast_to(tail, (rows, tail.size))], axis=1)
    width = ids.shape[1]
    mask = np.zeros((rows, width), np.uint8)
    mask[:, width - 8 : width - 1] = 1  # the 7 supervised tokens of the "OK." answer
    offsets = np.arange(0, rows * width + 1, width, dtype=np.int32)
    table = pa.table({
        "id": pa.array([f"s{i:07d}" for i in range(rows)]),
        "input_ids": pa.ListArray.from_arrays(offsets, pa.array(ids.ravel())),
        "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(mask.ravel())),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def build_chat_dataset(path: Path, rows: int, tok) -> tuple[Path, list[list[dict]]]:
    """Rows rendered with the real Qwen3 chat template, thinking off, answer "OK." (they round-trip as text).

    Returns the parquet path and each row's prompt messages (what a plain client would send).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    topics = ["prime numbers", "the water cycle", "binary search", "photosynthesis", "compound interest",
              "the French revolution", "hash tables", "plate tectonics"]
    ids_col, mask_col, messages = [], [], []
    for i in range(rows):
        msgs = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"Question {i}: explain {topics[i % len(topics)]} in {2 + i % 5} short steps."}]
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        ids = tok(prompt + "OK.<|im_end|>\n", add_special_tokens=False)["input_ids"]
        ids_col.append(ids)
        mask_col.append([0] * (len(ids) - 4) + [1, 1, 1, 0])
        messages.append(msgs)
    pq.write_table(pa.table({"id": pa.array([f"c{i:06d}" for i in range(rows)]),
                             "input_ids": pa.array(ids_col, pa.list_(pa.int32())),
                             "loss_mask": pa.array(mask_col, pa.list_(pa.uint8()))}), path)
    return path, messages


def prompts_of(path: Path, n: int) -> list[list[int]]:
    """The first ``n`` prompts (everything up to and including the assistant header)."""
    import pyarrow.parquet as pq

    col = pq.read_table(path, columns=["input_ids"]).column("input_ids").to_pylist()[:n]
    return [ids[: len(ids) - 8] for ids in col]


# ---------------------------------------------------------------------------- clients


class CpuMeter:
    """Wall and process CPU time (all threads) of a block; server CPU with psutil when given a pid."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.server_pid = server_pid

    def _server_cpu(self) -> float | None:
        if self.server_pid is None:
            return None
        import psutil

        t = psutil.Process(self.server_pid).cpu_times()
        return t.user + t.system

    def __enter__(self) -> "CpuMeter":
        self.s0 = self._server_cpu()
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.c0
        s1 = self._server_cpu()
        self.server_cpu = None if s1 is None else s1 - self.s0


def run_openai_threads(url: str, prompts: list[list[int]], concurrency: int, max_new_tokens: int, server_pid: int | None) -> Figure:
    """Baseline: a ThreadPoolExecutor with one openai chat call per thread (public-script style)."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=600)
    texts = [" ".join(map(str, p[14:-5])) for p in prompts]

    def one(text: str) -> int:
        r = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": text}], max_tokens=max_new_tokens,
            temperature=0.6, top_p=0.95, extra_body={"top_k": 20, "chat_template_kwargs": {"enable_thinking": True}})
        assert r.choices[0].message.content is not None
        return r.usage.completion_tokens

    with CpuMeter(server_pid) as m, ThreadPoolExecutor(max_workers=concurrency) as pool:
        tokens = sum(pool.map(one, texts))
    return Figure("openai-threads (baseline)", len(prompts), m.wall, m.cpu, m.server_cpu, tokens)


def run_requests_threads(url: str, prompts: list[list[int]], concurrency: int, max_new_tokens: int, server_pid: int | None) -> Figure:
    """Baseline: the same pool posting to SGLang's /generate with ``requests`` (a Session per thread)."""
    import requests

    local = threading.local()

    def one(args: tuple[int, list[int]]) -> int:
        i, p = args
        s = getattr(local, "s", None) or requests.Session()
        local.s = s
        r = s.post(url + "/generate", json={"input_ids": p, "rid": f"b{i}", "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "sampling_seed": i}}, timeout=600)
        r.raise_for_status()
        return len(r.json()["output_ids"])

    with CpuMeter(server_pid) as m, ThreadPoolExecutor(max_workers=concurrency) as pool:
        tokens = sum(pool.map(one, enumerate(prompts)))
    return Figure("requests-threads (baseline)", len(prompts), m.wall, m.cpu, m.server_cpu, tokens)


def run_plain_asyncio(url: str, payloads: list[bytes], path: str, concurrency: int, server_pid: int | None, name: str) -> Figure:
    """The floor: a minimal asyncio loop (aiohttp, ``concurrency`` workers) posting prepared bodies."""
    import aiohttp

    done_at: list[float] = []

    async def main() -> int:
        tokens = 0
        it = iter(payloads)
        conn = aiohttp.TCPConnector(limit=concurrency)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=3600)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
            async def worker() -> None:
                nonlocal tokens
                for body in it:
                    async with s.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
                        obj = json.loads(await r.read())
                        if r.status != 200:
                            raise RuntimeError(f"HTTP {r.status}: {obj}")
                    tokens += obj["usage"]["completion_tokens"] if "usage" in obj else len(obj["output_ids"])
                    done_at.append(time.perf_counter())

            await asyncio.gather(*[worker() for _ in range(concurrency)])
        return tokens

    with CpuMeter(server_pid) as m:
        tokens = asyncio.run(main())
    return Figure(name, len(payloads), m.wall, m.cpu, m.server_cpu, tokens, _steady(done_at))


def _steady(times) -> float | None:
    """Requests per second between the first and the last completion."""
    t = sorted(times)
    return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else None


def run_dqa(dataset: Path, out: Path, endpoints: list[str], protocol: str, concurrency: int, max_new_tokens: int,
            server_pid: int | None, name: str = "dqa regen", tokenizer: str | None = None, model: str | None = None) -> Figure:
    """dqa's ``regenerate(config)`` in this process, every row of ``dataset``; counts rows in the shards."""
    import pyarrow.parquet as pq

    from dqa.regen.config import RegenConfig
    from dqa.regen.run import regenerate

    shutil.rmtree(out, ignore_errors=True)
    config = RegenConfig(
        dataset=str(dataset), out=str(out), endpoints=endpoints, protocol=protocol, failed_only=False,
        max_new_tokens=max_new_tokens, max_in_flight=concurrency, tokenizer=tokenizer or "qwen3", model=model,
        live=False, log=lambda msg: None,
    )
    with CpuMeter(server_pid) as m:
        result = regenerate(config)
    if result.exit_code != 0:
        raise RuntimeError(f"{name}: regenerate ended with exit {result.exit_code}: {result.message}")
    shards = sorted((out / "shards").glob("*.parquet"))
    t = pq.read_table(shards, columns=["row", "output_tokens", "status", "finish_reason", "error", "completed_at"])
    failed = [e for e, st in zip(t.column("error").to_pylist(), t.column("status").to_pylist()) if st == "failed"]
    if failed:
        raise RuntimeError(f"{name}: {len(failed)} rows failed, e.g. {failed[0]}")
    rows = t.num_rows
    if protocol == "openai":
        # Count output tokens as the server generated them: a reply cut at max_tokens is max_tokens
        # long (the text round trip drops the special tokens a random model emits); others as rendered.
        finish = np.asarray(t.column("finish_reason").to_pylist())
        out_tok = np.asarray(t.column("output_tokens"))
        tokens = int(np.where(finish == "length", max_new_tokens, out_tok).sum())
    else:
        tokens = int(np.asarray(t.column("output_tokens")).sum())
    done_at = t.column("completed_at").cast("int64").to_numpy() / 1e6
    return Figure(name, rows, m.wall, m.cpu, m.server_cpu, tokens, _steady(done_at))


def run_dqa_elsewhere(python: str, dataset: Path, out: Path, url: str, concurrency: int, max_new_tokens: int,
                     server_pid: int, name: str) -> Figure:
    """``run_dqa`` in a subprocess of ``python`` (another installed dqa tree); its own Figure."""
    fig_path = out.with_suffix(".figure.json")
    cmd = [python, str(Path(__file__).resolve()), "--_dqa-once", json.dumps([str(dataset), str(out), url, concurrency,
                                                                              max_new_tokens, server_pid, str(fig_path)])]
    subprocess.run(cmd, check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    f = json.loads(fig_path.read_text())
    return Figure(name, f["requests"], f["wall_s"], f["cpu_s"], f["server_cpu_s"], f["output_tokens"], f["steady_rps"])


def _dqa_once(spec: str) -> None:
    """The subprocess side of ``run_dqa_elsewhere``."""
    dataset, out, url, concurrency, max_new_tokens, pid, fig_path = json.loads(spec)
    f = run_dqa(Path(dataset), Path(out), [url], "sglang", concurrency, max_new_tokens, pid)
    import dqa.regen.run as t  # a module every tree has at this path

    print(f"(the other tree: {t.__file__})", flush=True)
    Path(fig_path).write_text(json.dumps(f.__dict__))


# ---------------------------------------------------------------------------- parts


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def part_loopback(args: argparse.Namespace, work: Path) -> dict:
    """``--loopback-rounds`` rounds, each running every contestant once, back to back, against one
    stub; ratios are taken within a round (the VM's speed drifts by tens of percent between
    minutes) and their median is the figure."""
    dataset = build_dataset(work / "loopback.parquet", args.rows)
    prompts = prompts_of(dataset, args.baseline_rows)
    # no prefix cache: its per-token bookkeeping would be the stub's largest CPU cost per request
    stub_args = ["--zero-latency", "--request-log-size", "0", "--think-min", "24", "--think-max", "40",
                 "--max-running-requests", "100000", "--disable-radix-cache"]
    floor_bodies = [json.dumps({"input_ids": p, "rid": f"f{i}", "sampling_params": {"max_new_tokens": args.max_new_tokens,
                    "sampling_seed": i}}).encode() for i, p in enumerate(prompts_of(dataset, args.rows))]
    rounds: list[list[Figure]] = []
    with StubServer(work / "logs", *stub_args, name="loopback") as stub:
        pid = stub.proc.pid
        # warm the server (first-call import costs) before any timing
        run_requests_threads(stub.url, prompts[:64], 8, args.max_new_tokens, None)
        for r in range(args.loopback_rounds):
            figures = [
                run_dqa(dataset, work / "regen-out", [stub.url], "sglang", args.concurrency, args.max_new_tokens, pid),
                run_openai_threads(stub.url, prompts, args.concurrency, args.max_new_tokens, pid),
                run_requests_threads(stub.url, prompts, args.concurrency, args.max_new_tokens, pid),
                run_plain_asyncio(stub.url, floor_bodies, "/generate", args.concurrency, pid, "plain asyncio /generate (floor)"),
            ]
            if args.dqa_python:
                figures.append(run_dqa_elsewhere(args.dqa_python, dataset, work / "regen-out-other", stub.url, args.concurrency,
                                                 args.max_new_tokens, pid, "dqa regen (--dqa-python tree)"))
            rounds.append(figures)
            print(f"\n== loopback round {r + 1}/{args.loopback_rounds}: zero-latency SGLang-contract stub, concurrency "
                  f"{args.concurrency}, max_new_tokens {args.max_new_tokens}, {os.cpu_count()} CPUs ==", flush=True)
            for f in figures:
                print(f.line(), flush=True)
            dqa, base, req, floor = figures[:4]
            print(f"round {r + 1}: dqa / openai baseline {dqa.rps / base.rps:.1f}x req/s, {base.cpu_us / dqa.cpu_us:.1f}x less "
                  f"client CPU per request; dqa / requests baseline {dqa.rps / req.rps:.1f}x; dqa / floor {dqa.rps / floor.rps:.2f}x",
                  flush=True)
            if args.dqa_python:
                other = figures[4]
                print(f"round {r + 1}: dqa / the other tree: {dqa.rps / other.rps:.2f}x req/s, {dqa.cpu_us / other.cpu_us:.2f}x its "
                      f"client CPU per request; the other tree / openai {other.rps / base.rps:.1f}x", flush=True)
    ratio = [f[0].rps / f[1].rps for f in rounds]
    cpu_ratio = [f[1].cpu_us / f[0].cpu_us for f in rounds]
    req_ratio = [f[0].rps / f[2].rps for f in rounds]
    floor_ratio = [f[0].rps / f[3].rps for f in rounds]
    dqa_rps = [f[0].rps for f in rounds]
    print(f"\n== loopback, median of {len(rounds)} rounds ==")
    print(f"dqa / openai thread-pool baseline: {_median(ratio):.1f}x req/s (rounds: {', '.join(f'{x:.1f}x' for x in ratio)}), "
          f"{_median(cpu_ratio):.1f}x less client CPU per request")
    print(f"dqa / requests thread-pool on /generate: {_median(req_ratio):.1f}x req/s")
    print(f"dqa / plain asyncio floor: {_median(floor_ratio):.2f}x req/s (rounds: {', '.join(f'{x:.2f}x' for x in floor_ratio)})")
    print(f"dqa req/s: {_median(dqa_rps):.0f} (rounds: {', '.join(f'{x:.0f}' for x in dqa_rps)})")
    print(f"goal: >= 3x the openai baseline -> met in {sum(x >= 3 for x in ratio)} of {len(ratio)} rounds")
    if args.dqa_python:
        other_cpu = [f[0].cpu_us / f[4].cpu_us for f in rounds]
        print(f"dqa client CPU per request / the other tree's: rounds {', '.join(f'{x:.2f}x' for x in other_cpu)}; goal <= 1.5x -> "
              f"met in {sum(x <= 1.5 for x in other_cpu)} of {len(other_cpu)} rounds (median {_median(other_cpu):.2f}x)")
    return {
        "rounds": [{f.name: {"requests": f.requests, "wall_s": f.wall_s, "req_per_s": f.rps, "steady_req_per_s": f.steady_rps,
                             "client_cpu_us_per_req": f.cpu_us,
                             "server_cpu_us_per_req": None if f.server_cpu_s is None else 1e6 * f.server_cpu_s / f.requests}
                    for f in figures} for figures in rounds],
        "median_ratio_openai": _median(ratio), "median_ratio_requests": _median(req_ratio), "median_ratio_floor": _median(floor_ratio),
        "median_client_cpu_ratio_openai": _median(cpu_ratio), "median_dqa_req_per_s": _median(dqa_rps),
    }


def _wait_http(url: str, timeout: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up in {timeout:.0f} s")


def part_serve(args: argparse.Namespace, work: Path) -> dict:
    from fleet_helpers import UVICORN_PORT, listening_port

    sys.path.insert(0, str(ROOT / "examples"))
    from tiny_model import build_tiny_qwen3

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    from transformers import AutoTokenizer

    model_dir = build_tiny_qwen3(HERE / "data" / "tiny-qwen3")
    tok = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())
    dataset, messages = build_chat_dataset(work / "serve.parquet", args.serve_rows, tok)
    log = open(work / "serve.log", "wb")
    sibling = Path(sys.executable).parent / "transformers"  # this environment's CLI, activated or not
    exe = str(sibling) if sibling.exists() else shutil.which("transformers") or "transformers"
    # Port 0: the server binds a free port itself and logs it (uvicorn's "running on" line); a port
    # picked here and passed on could be taken by another process during its start.
    proc = subprocess.Popen([exe, "serve", str(model_dir), "--host", "127.0.0.1", "--port", "0", "--device", "cpu",
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{listening_port(work / 'serve.log', proc, UVICORN_PORT, 180)}"
        _wait_http(url + "/health", 180)
        bodies = [json.dumps({"model": str(model_dir), "messages": m, "max_tokens": args.serve_max_tokens,
                              "temperature": 0.6, "top_p": 0.95, "seed": i,
                              "chat_template_kwargs": {"enable_thinking": True}}).encode() for i, m in enumerate(messages)]
        # warm-up (model load, first-call costs)
        run_plain_asyncio(url, bodies[: args.serve_concurrency], "/v1/chat/completions", args.serve_concurrency, None, "warm-up")
        figs = []
        for rep in range(args.serve_repeats):
            def plain_run() -> Figure:
                return run_plain_asyncio(url, bodies, "/v1/chat/completions", args.serve_concurrency, proc.pid,
                                         f"plain asyncio loop #{rep + 1}")

            def dqa_run() -> Figure:
                return run_dqa(dataset, work / "serve-out", [url], "openai", args.serve_concurrency, args.serve_max_tokens,
                               proc.pid, name=f"dqa regen #{rep + 1}", tokenizer=str(qwen3_tokenizer_dir()), model=str(model_dir))

            # alternate which goes first, so a drift in machine load does not favour one side
            if rep % 2 == 0:
                plain = plain_run()
                dqa = dqa_run()
            else:
                dqa = dqa_run()
                plain = plain_run()
            figs += [plain, dqa]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(f"\n== serve: transformers serve, tiny random Qwen3 on CPU, concurrency {args.serve_concurrency}, "
          f"max_tokens {args.serve_max_tokens}, {args.serve_rows} requests per run ==")
    for f in figs:
        print(f.line())
    pairs = list(zip(figs[0::2], figs[1::2]))
    whole = sorted((d.output_tokens / d.wall_s) / (p.output_tokens / p.wall_s) for p, d in pairs)
    steady = sorted((d.steady_rps * d.output_tokens / d.requests) / (p.steady_rps * p.output_tokens / p.requests)
                    for p, d in pairs if p.steady_rps and d.steady_rps)
    med = _median
    print(f"dqa / plain loop, output tok/s, median of {len(pairs)} back-to-back pairs: "
          f"{med(whole):.1%} over the whole run (dqa's startup and tokenizer load included), "
          f"{med(steady):.1%} first-to-last completion (pairs: {', '.join(f'{r:.0%}' for r in steady)})")
    print(f"goal >= 95% (steady state): {'met' if med(steady) >= 0.95 else 'MISSED'}")
    return {"pairs": [{"plain": p.__dict__, "dqa": d.__dict__} for p, d in pairs],
            "median_ratio_whole": med(whole), "median_ratio_steady": med(steady)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["loopback", "serve", "all"], default="all")
    p.add_argument("--rows", type=int, default=20000, help="rows dqa regenerates against the loopback stub")
    p.add_argument("--baseline-rows", type=int, default=4000, help="requests each thread-pool baseline sends")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight (loopback), the same for every client")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--loopback-rounds", type=int, default=3, help="rounds of every loopback contestant; the median of the per-round ratios is reported")
    p.add_argument("--serve-rows", type=int, default=48)
    p.add_argument("--serve-concurrency", type=int, default=8)
    p.add_argument("--serve-max-tokens", type=int, default=32)
    p.add_argument("--serve-repeats", type=int, default=5, help="back-to-back plain/dqa pairs; the median ratio is reported")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--keep", action="store_true", help="keep the work folder (printed)")
    p.add_argument("--dqa-python", default=None, help="loopback: also run dqa regen with this interpreter's dqa (another tree), every round")
    p.add_argument("--_dqa-once", dest="dqa_once", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.dqa_once:
        _dqa_once(args.dqa_once)
        return
    work = Path(tempfile.mkdtemp(prefix="dqa-bench-regen-"))
    results: dict = {}
    try:
        if args.part in ("loopback", "all"):
            results["loopback"] = part_loopback(args, work)
        if args.part in ("serve", "all"):
            results["serve"] = part_serve(args, work)
    finally:
        if args.keep:
            print(f"work folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
