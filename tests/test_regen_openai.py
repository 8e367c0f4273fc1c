"""The openai protocol end to end against a real `transformers serve` with the tiny random Qwen3 model
(the session fixture ``transformers_server`` in conftest.py).

What that server does (checked here): it has no /health_generate (dqa falls back to /health),
rejects SGLang's extra fields `top_k` and `rid` with a 422 (dqa drops them for that endpoint),
and with random weights stops by length. It is not SGLang (no /server_info), so it gets the text
route, never `input_ids` (it would refuse them with a 422 as well; run.json says "text"): the
reply text is rendered back into tokens with the real Qwen3 chat template; the rendered prompt
must equal the sample's prompt tokens. The token-exact route is test_regen_openai_token_exact.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from chatdata import render, tokenizer, write_parquet
from dqa.regen.config import RegenConfig
from dqa.regen.run import regenerate
from regen_helpers import read_shards, write_findings

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three ordinary samples and one whose history keeps an earlier turn's thinking (the template drops it)."""
    d = tmp_path_factory.mktemp("openai-data")
    rows = [
        render([{"role": "user", "content": f"Say something about {w}."}, {"role": "assistant", "content": "OK."}], enable_thinking=False)
        for w in ("cats", "rivers", "primes")
    ]
    text = (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\nold thoughts\n</think>\n\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\nA2<|im_end|>\n"
    )
    ids = tokenizer()(text, add_special_tokens=False)["input_ids"]
    rows.append((ids, [0] * len(ids)))
    path = write_parquet(d / "chat.parquet", rows, [f"sample-{i}" for i in range(4)])
    findings = write_findings(d / "scan", [0, 1, 2, 3])
    return path, findings


def test_openai_protocol_regenerates_through_transformers_serve(transformers_server, data, tmp_path):
    url, model = transformers_server
    path, findings = data
    logs: list[str] = []
    cfg = RegenConfig(
        dataset=str(path), out=str(tmp_path / "out"), endpoints=[url], findings=str(findings), protocol="openai",
        max_new_tokens=6, max_in_flight=2, live=False, log=logs.append, install_signal_handlers=False,
        health_interval=1.0, backoff_base=0.05,
    )
    res = regenerate(cfg)
    assert res.exit_code == 0, res.message
    rows = {r["row"]: r for r in read_shards(tmp_path / "out").to_pylist()}
    assert sorted(rows) == [0, 1, 2, 3]
    originals = pq.read_table(path).column("input_ids").to_pylist()
    tok = tokenizer()
    for i in (0, 1, 2):
        r = rows[i]
        p = r["prompt_len"]
        orig = originals[i]
        assert r["input_ids"][:p] == orig[: orig.index(151667)]  # token-exact prompt
        assert r["status"] == "length" and r["finish_reason"] == "length"  # random weights: cut by max_tokens
        assert r["loss_mask"] == [0] * p + [1] * r["output_tokens"] and r["output_tokens"] >= 1
        assert r["endpoint"] == url and r["model"] == model
        assert "top_k" not in json.loads(r["sampling"])  # the server refused it, and the record says so
        assert tok.decode(r["input_ids"][p:]).startswith("<think>\n")  # rendered with thinking on
    bad = rows[3]
    assert bad["status"] == "failed" and "row 3" in bad["error"] and "renders the prompt differently" in bad["error"]
    assert any("rejects" in m and "top_k" in m for m in logs)
    assert not any("input_ids" in m for m in logs)  # never sent: the text route from the start
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["servers"][url]["openai_route"] == "text" and run["servers"][url]["server"] == "openai"
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["endpoints"][url]["healthy"] is True  # via /health: this server has no /health_generate
    # Every figure counts the tokens the shards record (the rendered reply), not the server's usage.
    assert progress["endpoints"][url]["output_tokens"] == sum(rows[i]["output_tokens"] for i in (0, 1, 2))
