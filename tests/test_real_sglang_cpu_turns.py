"""Opt-in: `dqa regen` regenerates a multi-turn set against REAL SGLang 0.5.23 servers on the CPU,
and the prefix-cache hit rate of turns 2+ is read from the shards (issue 24, item 3).

Skipped unless ``DQA_REAL_SGLANG_PYTHON`` names a python with sglang 0.5.23
(tests/sglang_cpu/README.md). Data: conversations of 2-4 assistant turns rendered by SpecForge's
rule with the real Qwen3 tokenizer and chat template; ``dqa regen --all --turns all`` (thinking on)
regenerates every assistant turn, each on the regenerated history. Servers: the tiny random Qwen3
made to end its replies after a few tokens (``real_sglang.turn_ending_model``), so conversations
get past turn 1.

Why the floor holds. Qwen3's generation prompt with thinking on is the bare assistant header, so
turn k's prompt is a prefix of turn k + 1's. SGLang's radix cache keeps every finished request's
tokens (prompt and output, all but the last output token, whose KV was never computed) until the
KV pool needs the room; the whole set here is smaller than the pool, so nothing is evicted. A turn
sent to the server of the previous turn therefore finds at least that turn's whole prompt cached:
``cached_tokens >= previous prompt_len``. (With a real thinking model that is about all it finds,
since the template drops the previous reasoning; the random model writes no ``</think>``, so its
whole reply stays in the history and more of it is found.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from real_sglang import MAX_TOTAL_TOKENS, flush_cache, running_servers, sglang_python, turn_ending_model

REPO = Path(__file__).resolve().parents[1]
CONVERSATIONS = 12
TURNS = [2 + i % 3 for i in range(CONVERSATIONS)]  # 2-4 assistant turns each, 36 in all
MAX_NEW_TOKENS = 256  # replies end in <|im_end|> long before: a turn cut at the limit would end its conversation
SERVER_RSS_GIB = 3.0  # launch_server + scheduler + detokenizer, seen: ~2.8 GB

pytestmark = pytest.mark.slow

SGLANG_PYTHON = sglang_python()
pytest.importorskip("torch", reason="building the tiny model needs torch (pip install -e '.[serve]')")
pytest.importorskip("transformers", reason="building the tiny model needs transformers")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two real SGLang servers of the turn-ending tiny model when the memory allows (else one)."""
    import psutil

    sys.path.insert(0, str(REPO / "examples"))
    from tiny_model import build_tiny_qwen3

    models = tmp_path_factory.mktemp("models")
    try:
        base = build_tiny_qwen3(models / "tiny-qwen3")
    except RuntimeError as exc:
        pytest.skip(f"cannot build the tiny model: {exc}")
    model = turn_ending_model(base, models / "tiny-qwen3-short-turns")
    n = 2 if psutil.virtual_memory().available / 2**30 >= 2 * SERVER_RSS_GIB + 2 else 1
    logs = [tmp_path_factory.mktemp("sglang") / f"server-{i}.log" for i in range(n)]
    with running_servers(SGLANG_PYTHON, model, logs) as started:
        yield started


@pytest.fixture(scope="module")
def dataset(qwen3, tmp_path_factory) -> Path:
    """``CONVERSATIONS`` rows of ``TURNS[i]`` user/assistant turns (with reasoning), SpecForge's rule."""
    from chatdata import write_specforge_conversations

    return write_specforge_conversations(tmp_path_factory.mktemp("data") / "turns.parquet", qwen3, TURNS, seed=11,
                                         question_words=10)


def regen_all_turns(dataset: Path, urls: list[str], model: str, out: Path) -> subprocess.CompletedProcess:
    """``dqa regen --all --turns all`` over ``urls`` (protocol sglang, /generate), as a user runs it."""
    endpoints = [a for url in urls for a in ("-e", url)]
    return subprocess.run([sys.executable, "-m", "dqa.cli", "regen", str(dataset), "--all", "--turns", "all", *endpoints,
                           "--out", str(out), "--max-new-tokens", str(MAX_NEW_TOKENS), "--tokenizer", model],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def turns_by_row(out: Path) -> dict[int, list[dict]]:
    """Every row's records in turn order; asserts each (row, turn) is there exactly once, ``ok``,
    with an integer ``cached_tokens``."""
    from regen_helpers import read_shards

    recs = read_shards(out).to_pylist()
    assert sorted((r["row"], r["turn"]) for r in recs) == [(row, t) for row in range(CONVERSATIONS) for t in range(TURNS[row])]
    assert {r["status"] for r in recs} == {"ok"}, [(r["row"], r["turn"], r["status"], r["error"]) for r in recs if r["status"] != "ok"]
    assert all(isinstance(r["cached_tokens"], int) for r in recs)
    rows: dict[int, list[dict]] = defaultdict(list)
    for r in sorted(recs, key=lambda r: (r["row"], r["turn"])):
        rows[r["row"]].append(r)
    return rows


def next_turns(rows: dict[int, list[dict]]) -> list[tuple[dict, dict]]:
    """(turn k, turn k + 1) record pairs of every conversation."""
    return [(a, b) for recs in rows.values() for a, b in zip(recs, recs[1:])]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def hit_rate(pairs: list[tuple[dict, dict]]) -> tuple[float, int, int]:
    """(cached / prompt tokens, cached, prompt tokens) over the later turn of each pair: turns 2+."""
    cached = sum(b["cached_tokens"] for _, b in pairs)
    prompts = sum(b["prompt_len"] for _, b in pairs)
    return cached / prompts, cached, prompts


def assert_the_set_fits_the_kv_pool(rows: dict[int, list[dict]]) -> None:
    # The radix tree holds at most every request's tokens: below the pool, nothing was evicted.
    assert sum(len(r["input_ids"]) for recs in rows.values() for r in recs) < MAX_TOTAL_TOKENS


def test_dqa_regen_of_every_turn_on_one_real_server_finds_each_previous_prompt_in_the_radix_cache(servers, dataset, tmp_path):
    """One server, every turn of every conversation (36 turns): turns 2+ find at least the previous
    turn's whole prompt cached, and in fact everything of the previous turn the history repeats
    (its prompt and reply, up to the reply's last token); a first turn finds little (the cache was
    flushed). The hit rate of turns 2+ is at least the floor (previous prompts / prompts)."""
    server = servers[0]
    flush_cache(server["url"])
    r = regen_all_turns(dataset, [server["url"]], server["model"], tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = turns_by_row(tmp_path / "out")
    assert_the_set_fits_the_kv_pool(rows)
    pairs = next_turns(rows)
    assert len(pairs) == sum(TURNS) - CONVERSATIONS
    for recs in rows.values():
        assert recs[0]["cached_tokens"] < recs[0]["prompt_len"] // 2
    reused = 0
    for a, b in pairs:
        prompt = b["input_ids"][: b["prompt_len"]]
        assert prompt[: a["prompt_len"]] == a["input_ids"][: a["prompt_len"]]  # the bare header: turn k's prompt starts turn k + 1's
        assert b["cached_tokens"] >= a["prompt_len"], (a["row"], b["turn"], b["cached_tokens"], a["prompt_len"])
        # What the tree can hold of this conversation: turn k's tokens but the last, as far as turn k + 1 repeats them.
        in_tree = min(common_prefix(a["input_ids"][:-1], prompt), b["prompt_len"] - 1)
        assert b["cached_tokens"] >= in_tree, (a["row"], b["turn"], b["cached_tokens"], in_tree)
        reused += in_tree
    rate, cached, prompts = hit_rate(pairs)
    floor = sum(a["prompt_len"] for a, _ in pairs) / prompts
    print(f"\nreal SGLang CPU, dqa regen --turns all, one server: prefix-cache hit rate of turns 2+ = {rate:.3f} "
          f"({cached} of {prompts} prompt tokens over {len(pairs)} turns); floor (previous prompts) {floor:.3f}, "
          f"previous turn's tokens repeated {reused / prompts:.3f}")
    assert rate >= floor


def test_sticky_dispatch_over_two_real_servers_keeps_next_turns_where_their_prefix_is_cached(servers, dataset, tmp_path):
    """Two servers: the first turns are shared out between both (dispatch waits for both servers'
    first /health_generate, ~1 s each), >= 90% of consecutive turns of a conversation are answered
    by the same server (progress.json says the share the shards show), a turn answered where its
    previous turn was finds that turn's prompt cached, and a moved turn does not. The hit rate of
    turns 2+ is at least the floor of the turns that stayed (their previous prompts / all prompts of
    turns 2+)."""
    if len(servers) < 2:
        pytest.skip("not enough free memory for a second real SGLang server (~3 GB each)")
    urls = [s["url"] for s in servers]
    for url in urls:
        flush_cache(url)
    r = regen_all_turns(dataset, urls, servers[0]["model"], tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = turns_by_row(tmp_path / "out")
    assert_the_set_fits_the_kv_pool(rows)
    pairs = next_turns(rows)
    stayed = [(a, b) for a, b in pairs if a["endpoint"] == b["endpoint"]]
    share = len(stayed) / len(pairs)
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["consecutive_turns"] == len(pairs)
    assert progress["same_endpoint_share"] == round(share, 4)
    firsts = [recs[0]["endpoint"] for recs in rows.values()]
    assert min(firsts.count(u) for u in urls) >= CONVERSATIONS // 3, firsts
    for a, b in pairs:
        if a["endpoint"] == b["endpoint"]:
            assert b["cached_tokens"] >= a["prompt_len"]
        else:
            assert b["cached_tokens"] < a["prompt_len"], "the other server never saw this conversation"
    rate, cached, prompts = hit_rate(pairs)
    floor = sum(a["prompt_len"] for a, _ in stayed) / prompts
    print(f"\nreal SGLang CPU, dqa regen --turns all, two servers: same-endpoint share {share:.3f} "
          f"({len(stayed)} of {len(pairs)} next turns, {progress['turns_moved']} moved), conversations per server "
          f"{[firsts.count(u) for u in urls]}; prefix-cache hit rate of "
          f"turns 2+ = {rate:.3f} ({cached} of {prompts} prompt tokens); floor (previous prompts of the turns that stayed) {floor:.3f}")
    assert share >= 0.9
    assert rate >= floor
