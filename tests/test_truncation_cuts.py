"""A cut is reported with its cause: truncated rows that pile up on one length name the limit.

SpecForge's ``max_length`` cuts every longer row at exactly that many tokens; a generation's
``max_new_tokens`` stops every reply it cuts at exactly that many. When a length holds most (by
default a quarter and at least 5) of the ``truncated`` rows, the scan says so in the terminal,
``summary.json`` (``truncation_cuts``), ``summary.md`` and the HTML report. Rows cut at random
lengths (early stops) name no cause. Sets are built with Qwen3's real tokenizer and SpecForge's rule.
"""

from __future__ import annotations

import json
import random

from rich.console import Console

from chatdata import sentence, write_parquet
from peer_conventions import Model, specforge
from dqa.audit.scan import ScanOptions, run_scan
from dqa.reports.scan_terminal import print_scan_table



def conversation(rng: random.Random, words: int) -> list[dict]:
    reasoning = " ".join(sentence(rng, 12) for _ in range(max(words // 12, 1)))
    return [{"role": "user", "content": sentence(rng, rng.randint(5, 40))},
            {"role": "assistant", "content": f"<think>\n{reasoning}\n</think>\n\n{sentence(rng, 30)}"}]


def scan(rows, tmp_path, model: Model, **overrides):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_parquet(tmp_path / "set.parquet", rows, ids=[f"s{i}" for i in range(len(rows))])
    return run_scan(path, tmp_path / "out", ScanOptions(tokenizer=str(model.folder), overrides=overrides))


def terminal(result) -> str:
    console = Console(record=True, width=200, force_terminal=False, color_system=None)
    print_scan_table(result.summary, str(result.out_dir), console)
    return console.export_text()


def test_specforge_max_length_cut_is_named_in_the_terminal_summary_and_reports(qwen3, tmp_path, cli):
    """30 conversations of 300-3,000 tokens through SpecForge's rule with max_length=2,048: every longer
    row ends at exactly 2,048 tokens, flagged truncated, and the scan names the cut."""
    rng = random.Random(0)
    rows = [specforge(qwen3, conversation(rng, rng.randint(200, 2400)), max_length=2048) for _ in range(30)]
    cut = sum(len(ids) == 2048 for ids, _ in rows)
    assert 8 <= cut < 30
    result = scan(rows, tmp_path, qwen3)
    assert result.summary["checks"]["truncated"]["count"] == cut
    text = f"{cut} of the {cut} truncated rows end at exactly 2,048 tokens: a max_length cut at tokenization"
    assert result.summary["truncation_cuts"] == [
        {"kind": "max_length", "unit": "rows", "tokens": 2048, "count": cut, "of": cut, "share": 1.0, "text": text}]
    assert json.loads((result.out_dir / "summary.json").read_text())["truncation_cuts"][0]["text"] == text
    assert f"cut: {text}" in terminal(result)
    assert text in (result.out_dir / "summary.md").read_text()
    report = tmp_path / "report.html"
    assert cli("report", result.out_dir, "--out", report).exit_code == 0
    assert f"<strong>cut:</strong> {text}." in report.read_text()


def test_rows_cut_at_random_lengths_name_no_cause(qwen3, tmp_path):
    """Early stops at 30 different lengths: truncated, but no length dominates, so nothing is claimed."""
    rng = random.Random(1)
    rows = []
    for _ in range(30):
        ids, mask = specforge(qwen3, conversation(rng, rng.randint(400, 900)))
        keep = len(ids) - rng.randint(20, 300)  # a reply stopped early, its end of turn lost
        rows.append((ids[:keep], mask[:keep]))
    result = scan(rows, tmp_path, qwen3)
    assert result.summary["checks"]["truncated"]["count"] == 30
    assert result.summary["truncation_cuts"] == []
    assert "cut:" not in terminal(result) and "## Cuts" not in (result.out_dir / "summary.md").read_text()


def test_two_max_lengths_are_both_named_and_the_limits_are_parameters(qwen3, tmp_path):
    """A set merged from two tokenizations, at 1,024 and at 2,048 tokens: each length holds a good share of the
    truncated rows, so both are named, most rows first. Raising truncated.cut_min_share past both names none."""
    rng = random.Random(2)
    rows = [specforge(qwen3, conversation(rng, rng.randint(900, 2400)), max_length=2048 if k % 3 else 1024) for k in range(36)]
    result = scan(rows, tmp_path / "a", qwen3)
    cuts = [(c["kind"], c["tokens"]) for c in result.summary["truncation_cuts"]]
    n1024, n2048 = sum(len(i) == 1024 for i, _ in rows), sum(len(i) == 2048 for i, _ in rows)
    assert n1024 >= 5 and n2048 >= 5
    assert cuts == sorted([("max_length", 1024), ("max_length", 2048)], key=lambda c: -(n1024 if c[1] == 1024 else n2048))
    result = scan(rows, tmp_path / "b", qwen3, truncated={"cut_min_share": 0.9})
    assert result.summary["truncation_cuts"] == []


def test_replies_cut_by_max_new_tokens_name_the_generation_limit(qwen3, tmp_path):
    """Regenerated replies stopped by max_new_tokens: every cut reply is exactly 700 tokens after the assistant
    header, behind prompts of different lengths, so the rows' lengths differ and the turns' do not."""
    rng = random.Random(3)
    header = qwen3.hf("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    rows = []
    for k in range(24):
        ids, mask = specforge(qwen3, conversation(rng, rng.randint(700, 1200)))
        at = max(i for i in range(len(ids) - len(header)) if ids[i:i + len(header)] == header) + len(header)
        if k % 4:  # three in four replies hit the limit
            ids, mask = ids[:at + 700], mask[:at + 700]
        rows.append((ids, mask))
    result = scan(rows, tmp_path, qwen3)
    assert result.summary["checks"]["truncated"]["count"] == 18
    assert [(c["kind"], c["unit"], c["tokens"], c["count"], c["of"]) for c in result.summary["truncation_cuts"]] == [
        ("max_new_tokens", "turns", 700, 18, 18)]
    assert "18 of the 18 truncated turns are exactly 700 tokens long after the assistant header: a max_new_tokens cut" in terminal(result)
