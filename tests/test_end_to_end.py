"""The whole job, as a user runs it, with real processes: scan -> regen --failed-only -> merge
-> scan -> gate.

1. Against the SGLang-contract stub (what production runs on GPUs): the release gate fails on
   the example set, passes once the failing rows are regenerated and merged back.
2. Against a real `transformers serve` with the tiny random Qwen3 model (the CPU stand-in an
   engineer runs on a laptop): the same chain runs end to end over the openai protocol and the
   merged rows are exactly prompt + the server's tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

from build_example import build_example  # noqa: E402
from servers.sglang_contract import StubServer  # noqa: E402


def dqa(*args, ok=(0,)) -> subprocess.CompletedProcess:
    """Run the installed `dqa` CLI in a real process; assert its exit code is in ``ok``."""
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "120"}, timeout=600)
    assert proc.returncode in ok, f"dqa {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_gate_fails_before_regeneration_and_passes_after(tmp_path):
    data = build_example(tmp_path / "data", rows=400, seed=3)
    truth = pl.read_parquet(tmp_path / "data" / "truth.parquet")
    planted = truth.filter(pl.col("planted").list.len() > 0).height

    scan = json.loads(dqa("scan", data, "--tokenizer", "qwen3.6", "--out", tmp_path / "scan", "--json", ok=(1,)).stdout)
    assert scan["failing_rows"] == planted
    dqa("gate", tmp_path / "scan", "--out", tmp_path / "gate-before", ok=(1,))

    stub = StubServer(tmp_path / "stub", "--latency-s", "0.002", "--vocab", "qwen3.6").start()
    try:
        progress = json.loads(dqa("regen", data, "--failed-only", "--findings", tmp_path / "scan", "--endpoint", stub.url,
                                  "--tokenizer", "qwen3.6", "--out", tmp_path / "regen", "--json").stdout)
    finally:
        stub.stop()
    assert progress["state"] == "finished"
    assert (progress["done"], progress["ok"]) == (planted, planted)

    merged = tmp_path / "release" / "example.parquet"
    dqa("merge", data, "--regen", tmp_path / "regen", "--out", merged)
    after = json.loads(dqa("scan", merged, "--tokenizer", "qwen3.6", "--out", tmp_path / "scan-after", "--json").stdout)
    assert after["failing_rows"] == 0 and after["rows"] == scan["rows"]
    assert after["thinking_expected"] is True
    dqa("gate", tmp_path / "scan-after", "--out", tmp_path / "gate-after")
    assert json.loads((tmp_path / "gate-after" / "gate.json").read_text())["verdict"] == "pass"
    assert json.loads((tmp_path / "gate-before" / "gate.json").read_text())["verdict"] == "fail"

    # Untouched rows are byte-identical; regenerated rows carry their provenance.
    before = pl.read_parquet(data)
    new = pl.read_parquet(merged)
    good = truth.filter(pl.col("planted").list.len() == 0)["row"].to_list()
    assert new[good].select("id", "input_ids", "loss_mask").equals(before[good].select("id", "input_ids", "loss_mask"))
    failing = truth.filter(pl.col("planted").list.len() > 0)["row"].to_list()
    assert new[failing]["dqa_regen"].null_count() == 0


@pytest.mark.slow
def test_the_chain_runs_against_a_real_cpu_model_server(tmp_path, transformers_server):
    url, model = transformers_server
    data = build_example(tmp_path / "data", rows=120, seed=5, template="qwen3")  # the CPU model server is Qwen3
    dqa("scan", data, "--out", tmp_path / "scan", "--quiet", ok=(1,))
    progress = json.loads(dqa("regen", data, "--findings", tmp_path / "scan", "--endpoint", url, "--protocol", "openai",
                              "--model", model, "--limit", "4", "--max-new-tokens", "12", "--max-in-flight", "2",
                              "--out", tmp_path / "regen", "--json").stdout)
    assert progress["done"] == 4 and progress["failed"] == 0
    merged = tmp_path / "merged.parquet"
    dqa("merge", data, "--regen", tmp_path / "regen", "--out", merged, "--accept", "ok,length")  # --max-new-tokens 12: cut replies

    shards = pl.concat([pl.read_parquet(p) for p in sorted((tmp_path / "regen" / "shards").glob("*.parquet"))])
    new = pl.read_parquet(merged)
    original = pl.read_parquet(data)
    assert shards["row"].n_unique() == 4  # four conversations (a flagged earlier turn gives a record per turn)
    last = shards.sort("turn").group_by("row").last()  # each conversation's last record
    for rec in last.iter_rows(named=True):
        row = new.row(rec["row"], named=True)
        if rec["turn"] < rec["turns"] - 1:  # cut by the length limit before its final turn: the original stays
            assert row["input_ids"] == original.row(rec["row"], named=True)["input_ids"]
            continue
        assert row["input_ids"] == rec["input_ids"]
        # Masked in the input's convention: the output trained; the prompt as the input masks it (its earlier
        # assistant turns trained where every turn is, SpecForge's default).
        assert row["loss_mask"][rec["prompt_len"]:] == [1] * rec["output_tokens"]
        if rec["kept_len"] == rec["prompt_len"]:  # one regenerated turn: the prompt is the row's own tokens
            assert row["loss_mask"][: rec["kept_len"]] == original.row(rec["row"], named=True)["loss_mask"][: rec["kept_len"]]
    rescan = json.loads(dqa("scan", merged, "--out", tmp_path / "scan-after", "--json", ok=(0, 1)).stdout)
    assert rescan["rows"] == 120
