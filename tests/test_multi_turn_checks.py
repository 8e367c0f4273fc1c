"""Every trained assistant turn is checked, not only the final one.

SpecForge, TRL, LLaMA-Factory and axolotl train every assistant turn by default, and multi-turn
data is the norm. Sets here are built by SpecForge's rule (tests/peer_conventions.py: every
assistant span trained, ``<|im_end|>\\n`` included) with Qwen3's real tokenizer and template
(which drops the reasoning of history turns), and with the same tokenizer under a plain ChatML
template that keeps every turn's think block. A defect in one turn flags the sample, and
``findings.parquet`` names the turn (``turns``: 0-based among the sample's assistant turns).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest

from chatdata import sentence, write_parquet
from peer_conventions import Model, specforge
from dqa.audit.chat_render import CHATML_TEMPLATE
from dqa.audit.scan import ScanOptions, run_scan



def thought(rng: random.Random, reasoning: str | None = None) -> str:
    return f"<think>\n{sentence(rng, 20) if reasoning is None else reasoning}\n</think>\n\n{sentence(rng, 30)}"



@pytest.fixture(scope="module")
def chatml_keeps(qwen3, tmp_path_factory):
    """The same tokenizer under plain ChatML: every turn keeps its think block as written."""
    folder = tmp_path_factory.mktemp("chatml")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (folder / f).write_bytes((Path(qwen3.folder) / f).read_bytes())
    (folder / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(qwen3.folder))
    hf.chat_template = CHATML_TEMPLATE
    return Model("qwen3", folder, hf)


def conversation(rng: random.Random, i: int, replies: list[str]) -> list[dict]:
    msgs = []
    for k, r in enumerate(replies):
        msgs += [{"role": "user", "content": f"Question {i}.{k}: {sentence(rng, 8)}"}, {"role": "assistant", "content": r}]
    return msgs


def clean(model: Model, n: int, turns: int = 3, seed: int = 0, **kw) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    return [specforge(model, conversation(rng, i, [thought(rng) for _ in range(turns)]), **kw) for i in range(n)]


def scan(model: Model, rows, tmp_path, name="set"):
    path = write_parquet(tmp_path / f"{name}.parquet", rows, ids=[f"s{i}" for i in range(len(rows))])
    return run_scan(path, tmp_path / f"out-{name}", ScanOptions(tokenizer=str(model.folder)))


def turns_of(result, row: int) -> list[int]:
    return result.findings.filter(pl.col("row") == row)["turns"].to_list()[0]


def reasons_of(result, row: int) -> list[str]:
    return result.findings.filter(pl.col("row") == row)["reasons"].to_list()[0]


def test_clean_multi_turn_sets_have_no_findings(qwen3, chatml_keeps, tmp_path):
    for name, model in (("drops", qwen3), ("keeps", chatml_keeps)):
        result = scan(model, clean(model, 30), tmp_path, name)
        assert result.findings.height == 0, (name, result.findings)
        assert result.summary["turns"] == 90 and result.summary["multi_turn"] is True
        assert result.summary["conventions"]["trained_turns"] == "all"
        assert result.metrics["flagged_turns"].to_list() == [0] * 30


def test_ok_in_the_first_of_three_turns_is_a_degenerate_template_of_that_turn(qwen3, tmp_path):
    rng = random.Random(1)
    rows = clean(qwen3, 40)
    ok = [specforge(qwen3, conversation(rng, 100 + i, ["OK.", thought(rng), thought(rng)])) for i in range(15)]
    result = scan(qwen3, rows + ok, tmp_path)
    bad = list(range(40, 55))
    assert sorted(result.findings["row"].to_list()) == bad
    for row in bad:
        assert turns_of(result, row) == [0]
        assert result.metrics.row(row, named=True)["primary_reason"] == "degenerate_template"
        assert set(reasons_of(result, row)) == {"degenerate_template", "short_response"}  # "OK." is also short
    c = result.summary["checks"]
    assert (c["degenerate_template"]["count"], c["degenerate_template"]["turns"]) == (15, 15)
    assert c["repetition_loop"]["turns"] == 0 and c["mask_misaligned"]["turns"] is None  # judged on whole samples
    assert result.summary["turns"] == 55 * 3
    top = result.summary["degenerate_templates"][0]
    # Qwen3 renders the history turn without a think block: the turn as trained.
    assert (top["text"], top["count"], top["samples"], top["example_turn"]) == ("OK.<|im_end|>\n", 15, 15, 0)
    # On disk: findings.parquet's turns is list<int32>; metrics.parquet stays one row per sample.
    findings = pl.read_parquet(result.out_dir / "findings.parquet")
    assert findings.schema["turns"] == pl.List(pl.Int32) and findings.columns[:3] == ["row", "id", "reasons"]
    metrics = pl.read_parquet(result.out_dir / "metrics.parquet")
    assert metrics.height == 55 and metrics.filter(pl.col("flagged_turns") > 0)["row"].to_list() == bad
    summary = json.loads((result.out_dir / "summary.json").read_text())
    assert summary["checks"]["short_response"]["turns"] == 15
    # turns.parquet: one row per trained turn, the turn's reasons beside its numbers.
    turns = pl.read_parquet(result.out_dir / "turns.parquet")
    assert turns.height == 55 * 3 and turns.columns[:3] == ["row", "id", "turn"] and turns.columns[-1] == "reasons"
    assert turns.schema["reasons"] == pl.List(pl.String) and turns.schema["turn"] == pl.Int32
    flagged = turns.filter(pl.col("reasons").list.len() > 0)
    assert flagged.select("row", "turn").rows() == [(r, 0) for r in bad]
    assert flagged["reasons"].to_list() == [["degenerate_template", "short_response"]] * 15
    assert flagged["id"].to_list() == [f"s{r}" for r in bad]
    assert flagged["supervised_hash"].n_unique() == 1 and flagged["template_rows"].to_list() == [15] * 15
    ok_turn = flagged.row(0, named=True)  # "OK.<|im_end|>\n": 4 trained tokens ("OK", ".", end of turn, newline)
    assert (ok_turn["supervised_tokens"], ok_turn["content_tokens"], ok_turn["turn_closed"], ok_turn["think_present"]) == (4, 2, True, False)
    assert ok_turn["span_end"] - ok_turn["span_start"] == 4
    assert turns.filter(pl.col("row") < 40)["reasons"].list.len().sum() == 0


def test_a_degenerate_final_turn_after_a_real_first_turn_is_found(qwen3, tmp_path):
    """The whole samples differ (their first turns do); their final turns are one canned answer."""
    rng = random.Random(2)
    ok = [specforge(qwen3, conversation(rng, 100 + i, [thought(rng), "OK."])) for i in range(12)]
    result = scan(qwen3, clean(qwen3, 40, turns=2) + ok, tmp_path)
    assert result.metrics.filter(pl.col("degenerate_template"))["row"].to_list() == list(range(40, 52))
    assert result.metrics["template_rows"].max() == 1  # no two whole samples are equal
    assert all(turns_of(result, r) == [1] for r in range(40, 52))
    top = result.summary["degenerate_templates"][0]
    assert (top["text"], top["count"]) == ("<think>\n\n</think>\n\nOK.<|im_end|>\n", 12)


def test_an_empty_think_block_in_a_middle_turn(qwen3, chatml_keeps, tmp_path):
    """A template that keeps history reasoning trains the empty block: a finding of that turn. Qwen3's
    drops it: the data, following the template, has no think block there, and that is no finding."""
    for name, model in (("keeps", chatml_keeps), ("drops", qwen3)):
        rng = random.Random(3)
        empty = [specforge(model, conversation(rng, 100 + i, [thought(rng), thought(rng, ""), thought(rng)])) for i in range(3)]
        result = scan(model, clean(model, 30) + empty, tmp_path, name)
        if name == "keeps":
            assert sorted(result.findings["row"].to_list()) == [30, 31, 32]
            assert all(reasons_of(result, r) == ["empty_thinking"] and turns_of(result, r) == [1] for r in (30, 31, 32))
            assert result.summary["checks"]["empty_thinking"]["turns"] == 3
        else:
            assert result.findings.height == 0


def test_a_history_turn_without_thinking_is_a_finding_only_where_the_template_keeps_reasoning(qwen3, chatml_keeps, tmp_path):
    for name, model in (("keeps", chatml_keeps), ("drops", qwen3)):
        rng = random.Random(4)
        bare = [specforge(model, conversation(rng, 100 + i, [sentence(rng, 30), thought(rng)])) for i in range(3)]
        result = scan(model, clean(model, 30, turns=2) + bare, tmp_path, name)
        if name == "keeps":
            assert all(reasons_of(result, r) == ["missing_thinking"] and turns_of(result, r) == [0] for r in (30, 31, 32))
        else:
            assert result.findings.height == 0


def test_a_truncated_middle_turn(qwen3, tmp_path):
    rng = random.Random(5)
    # A reply cut by the length limit mid-thought: its think block never closes (Qwen3 keeps a
    # history turn's content as written when it has no </think>).
    cut = specforge(qwen3, conversation(rng, 100, [thought(rng), f"<think>\n{sentence(rng, 25)}", thought(rng)]))
    # A turn whose end of turn is missing: it runs into the next user turn.
    ids, mask = specforge(qwen3, conversation(rng, 101, [thought(rng), thought(rng), thought(rng)]))
    im_end = qwen3.encode("<|im_end|>")[0]
    at = [i for i, t in enumerate(ids) if t == im_end]
    second = at[3]  # user, assistant, user, ASSISTANT (turn 1)
    runs_on = (ids[:second] + ids[second + 2:], mask[:second] + mask[second + 2:])
    result = scan(qwen3, clean(qwen3, 30) + [cut, runs_on], tmp_path)
    assert sorted(result.findings["row"].to_list()) == [30, 31]
    for row in (30, 31):
        assert reasons_of(result, row) == ["truncated"] and turns_of(result, row) == [1], row
    assert result.summary["checks"]["truncated"]["turns"] == 2


def test_sets_that_train_only_the_last_turn_are_unaffected(qwen3, tmp_path):
    """SpecForge's train_only_last_turn: an "OK." in an untrained history turn is not trained, so no finding;
    a defect in the trained final turn is reported as before, with its turn index."""
    rng = random.Random(6)
    rows = clean(qwen3, 30, train_only_last_turn=True)
    ok_first = [specforge(qwen3, conversation(rng, 100 + i, ["OK.", thought(rng), thought(rng)]), train_only_last_turn=True)
                for i in range(15)]
    empty_last = specforge(qwen3, conversation(rng, 200, [thought(rng), thought(rng, "")]), train_only_last_turn=True)
    result = scan(qwen3, rows + ok_first + [empty_last], tmp_path)
    assert result.findings["row"].to_list() == [45]
    assert reasons_of(result, 45) == ["empty_thinking"] and turns_of(result, 45) == [1]
    assert result.summary["turns"] == 46 and result.summary["multi_turn"] is False
    assert result.summary["conventions"]["trained_turns"] == "last"


def test_the_reports_show_turns_beside_samples_only_for_a_multi_turn_set(qwen3, tmp_path):
    from rich.console import Console

    from dqa.audit.scan_markdown import render_scan_markdown
    from dqa.reports.scan_terminal import print_scan_table

    rng = random.Random(7)
    ok = [specforge(qwen3, conversation(rng, 100 + i, ["OK.", thought(rng)])) for i in range(12)]
    multi = scan(qwen3, clean(qwen3, 30, turns=2) + ok, tmp_path, "multi")
    single = scan(qwen3, clean(qwen3, 30, turns=1) + [specforge(qwen3, conversation(rng, 300 + i, ["OK."])) for i in range(12)],
                  tmp_path, "single")
    for result, shown in ((multi, True), (single, False)):
        console = Console(width=160, record=True, force_terminal=False)
        print_scan_table(result.summary, "out", console)
        header = next(ln for ln in console.export_text().splitlines() if "samples" in ln and "check" in ln)
        assert ("turns" in header) is shown, header
        md = render_scan_markdown(result.summary)
        assert ("| check | samples | turns | share |" in md) is shown
    row = next(ln for ln in render_scan_markdown(multi.summary).splitlines() if ln.startswith("| `degenerate_template`"))
    assert row.split("|")[2:4] == [" 12 ", " 12 "]
    row = next(ln for ln in render_scan_markdown(multi.summary).splitlines() if ln.startswith("| `short_response`"))
    assert row.split("|")[3] == " 12 "
    # The degenerate template is shown as trained: the turn's text, not the whole sample's.
    md = render_scan_markdown(multi.summary)
    assert "| samples | turns | share | tokens | trained text of the turn | example |" in md
    row = next(ln for ln in md.splitlines() if "OK." in ln and ln.startswith("| 12 |"))
    assert '<code>"OK.&lt;&#124;im_end&#124;&gt;\\n"</code>' in row and row.endswith("| row 30, turn 0 |"), row
    console = Console(width=160, record=True, force_terminal=False)
    print_scan_table(multi.summary, "out", console)
    text = console.export_text()
    assert "degenerate templates (samples, share, tokens, trained text of the turn):" in text
    assert '"OK.<|im_end|>\\n"  (12 turns; e.g. row 30, turn 0)' in text, text


def test_the_same_reply_after_different_conversations_is_a_duplicate_of_that_turn(qwen3, tmp_path):
    """A turn's prompt is the conversation before it: one reply to "Can you elaborate?" after three
    different conversations ignores what it answers. The same conversation stored twice, or a shared
    opening exchange, is the same prompt and so no duplicate."""
    rng = random.Random(8)
    shared = thought(random.Random(99))
    elaborate = []
    for i in range(3):
        msgs = conversation(rng, 100 + i, [thought(rng), shared, thought(rng)])
        msgs[2]["content"] = "Can you elaborate?"  # the same last question, after different histories
        elaborate.append(specforge(qwen3, msgs))
    opening = conversation(rng, 200, [thought(rng)])  # the same first exchange, different continuations
    forks = [specforge(qwen3, opening + conversation(rng, 300 + i, [thought(rng)])) for i in range(2)]
    twice = specforge(qwen3, conversation(rng, 400, [thought(rng), thought(rng)]))
    result = scan(qwen3, clean(qwen3, 30) + elaborate + forks + [twice, twice], tmp_path)
    assert sorted(result.findings["row"].to_list()) == [30, 31, 32]
    for row in (30, 31, 32):
        assert reasons_of(result, row) == ["duplicate_response"] and turns_of(result, row) == [1]
    assert result.metrics.filter(pl.col("row") >= 30)["template_rows"].to_list() == [1, 1, 1, 1, 1, 2, 2]  # whole samples differ
    c = result.summary["checks"]["duplicate_response"]
    assert (c["count"], c["turns"]) == (3, 3)
    turns = pl.read_parquet(result.out_dir / "turns.parquet").filter(pl.col("row").is_in([33, 34]) & (pl.col("turn") == 0))
    assert turns["supervised_hash"].n_unique() == 1 and turns["template_prompts"].to_list() == [1, 1]


def test_a_loop_in_one_turn_is_not_diluted_by_the_others(qwen3, tmp_path):
    """A looping middle reply between two long, clean turns: under half the sample's 8-grams repeat,
    nearly all of the turn's do. (History replies without reasoning: Qwen3 drops it.)"""
    rng = random.Random(9)
    replies = [sentence(rng, 500), "Let me check the ledger once more. " * 60, thought(rng, sentence(rng, 500))]
    looping = specforge(qwen3, conversation(rng, 100, replies))
    result = scan(qwen3, clean(qwen3, 30) + [looping], tmp_path)
    assert result.findings["row"].to_list() == [30]
    assert reasons_of(result, 30) == ["repetition_loop"] and turns_of(result, 30) == [1]
    assert result.metrics.row(30, named=True)["ngram_repeat_share"] < 0.5
    turns = pl.read_parquet(result.out_dir / "turns.parquet").filter(pl.col("row") == 30)
    assert turns["ngram_repeat_share"][1] > 0.9 and turns["reasons"].to_list() == [[], ["repetition_loop"], []]
    assert result.summary["checks"]["repetition_loop"]["turns"] == 1
