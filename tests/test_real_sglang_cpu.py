"""Opt-in: `dqa regen` against a REAL SGLang 0.5.23 server running on the CPU.

Everywhere else SGLang is stood in for by tests/servers/sglang_contract.py, because SGLang needs a
GPU. SGLang 0.5.23 also serves on a CPU (SGLANG_USE_CPU_ENGINE=1, --device cpu, a bounded KV cache),
with stub torchvision / sgl_kernel packages, but its venv is ~2.7 GB and it takes about a minute to
start, so this module runs only when asked:

    bash tests/sglang_cpu/setup_sglang_cpu.sh            # once: .venv-sglang-cpu (~5 min)
    DQA_REAL_SGLANG_PYTHON=.venv-sglang-cpu/bin/python \
        .venv-ci/bin/python -m pytest tests/test_real_sglang_cpu.py -v

The server loads the tiny random-weight Qwen3 model from examples/tiny_model.py (real Qwen3
tokenizer, gibberish text), so every reply runs to --max-new-tokens. What these tests pin down is
the wire contract dqa relies on, checked against the real server rather than the stub.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from real_sglang import SGLANG_VERSION, http, running_servers, sglang_python

REPO = Path(__file__).resolve().parents[1]
MAX_NEW_TOKENS = 32
ROWS = 4
PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]  # <|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n

pytestmark = pytest.mark.slow

SGLANG_PYTHON = sglang_python()
pytest.importorskip("torch", reason="building the tiny model needs torch (pip install -e '.[serve]')")
pytest.importorskip("transformers", reason="building the tiny model needs transformers")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real SGLang 0.5.23 server on the CPU serving the tiny Qwen3 model.

    Yields a dict: url, model, log, health (the /health codes seen while starting), startup_s.
    The server runs in its own process group, killed whole at the end.
    """
    sys.path.insert(0, str(REPO / "examples"))
    from tiny_model import build_tiny_qwen3

    try:
        model = build_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny-qwen3")
    except RuntimeError as exc:
        pytest.skip(f"cannot build the tiny model: {exc}")
    with running_servers(SGLANG_PYTHON, model, [tmp_path_factory.mktemp("sglang") / "server.log"]) as (started,):
        yield started


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A 4-row thinking-off dataset and a findings file flagging every row."""
    from regen_helpers import degenerate_dataset, write_findings

    d = tmp_path_factory.mktemp("regen-inputs")
    data = degenerate_dataset(d / "data.parquet", ROWS)
    write_findings(d / "scan", list(range(ROWS)))
    return data, d / "scan"


def _regen(server, inputs, out: Path, *extra: str) -> dict:
    data, scan = inputs
    proc = subprocess.run(
        [sys.executable, "-m", "dqa.cli", "regen", str(data), "--findings", str(scan), "-e", server["url"],
         "--out", str(out), "--max-new-tokens", str(MAX_NEW_TOKENS), "--tokenizer", server["model"], *extra],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    from regen_helpers import read_shards

    run = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else None
    rows = read_shards(out).to_pylist() if run is not None else []
    return {"proc": proc, "run": run, "rows": rows}


@pytest.fixture(scope="module")
def sglang_run(server, inputs, tmp_path_factory):
    return _regen(server, inputs, tmp_path_factory.mktemp("out") / "sglang")


@pytest.fixture(scope="module")
def openai_run(server, inputs, tmp_path_factory):
    return _regen(server, inputs, tmp_path_factory.mktemp("out") / "openai", "--protocol", "openai")


def _assert_rows_ok_or_length(result):
    assert result["proc"].returncode == 0, result["proc"].stdout + result["proc"].stderr
    rows = result["rows"]
    assert sorted(r["row"] for r in rows) == list(range(ROWS))
    for r in rows:
        assert r["status"] in ("ok", "length"), r
        assert r["error"] is None, r
        assert 0 < r["output_tokens"] <= MAX_NEW_TOKENS, r
        assert len(r["input_ids"]) == r["prompt_len"] + r["output_tokens"], r
        assert r["loss_mask"] == [0] * r["prompt_len"] + [1] * r["output_tokens"], r


def _server_facts(result, server) -> dict:
    return result["run"]["servers"][server["url"]]


# --- start-up --------------------------------------------------------------------------------


def test_health_is_503_while_the_server_warms_up_then_200(server):
    codes = server["health"]
    assert codes[-1] == 200
    assert set(codes[:-1]) <= {503}, codes
    assert 503 in codes, f"no 503 seen before 200 (codes {codes}): docs/sglang.md says /health is 503 while starting"


# --- dqa regen, protocol sglang (/generate) --------------------------------------------------


def test_sglang_protocol_regen_exits_0_with_every_row_ok_or_length_within_max_new_tokens(sglang_run):
    _assert_rows_ok_or_length(sglang_run)


def test_sglang_protocol_run_json_records_version_context_no_reserve_and_seed_not_applied(sglang_run, server):
    facts = _server_facts(sglang_run, server)
    assert facts["server"] == "sglang"
    assert facts["version"] == SGLANG_VERSION
    assert facts["context_length"] == 4096  # /v1/models max_model_len (server_info context_length is null)
    assert facts["speculative_reserve"] == 0
    assert facts["seed_applied"] is False  # no --enable-deterministic-inference
    assert facts["openai_route"] is None
    assert sglang_run["run"]["seed_applied"] is False


# --- dqa regen, protocol openai (/v1/chat/completions) ---------------------------------------


def test_openai_protocol_regen_exits_0_with_every_row_ok_or_length_within_max_new_tokens(openai_run):
    _assert_rows_ok_or_length(openai_run)


def test_openai_protocol_finds_the_0_5_23_chat_route_token_exact(openai_run, server):
    facts = _server_facts(openai_run, server)
    assert facts["openai_route"] == "token-exact"
    assert facts["version"] == SGLANG_VERSION
    assert facts["context_length"] == 4096
    assert facts["seed_applied"] is False


# --- the wire shapes dqa's error handling relies on ------------------------------------------


def test_unknown_sampling_params_key_is_a_400_whose_error_is_a_string_naming_the_field(server):
    status, body = http(server["url"] + "/generate",
                         {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "bogus_key": 1}})
    assert status == 400
    err = json.loads(body)["error"]
    assert isinstance(err, str)
    assert err.startswith("unknown field `bogus_key`, expected one of `max_new_tokens`, ")


def test_prompt_plus_max_new_tokens_over_the_context_is_a_400_with_an_error_message_object(server):
    status, body = http(server["url"] + "/generate",
                         {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4096 - len(PROMPT) + 1}})
    assert status == 400
    assert json.loads(body)["error"]["message"].startswith(
        "Requested token count exceeds the model's maximum context length of 4096 tokens.")


def test_generate_reply_carries_output_ids_and_a_stop_finish_reason_naming_the_matched_token(server):
    # Greedy, and stop on the first token greedy decoding produces: finish_reason stop, stop token kept.
    status, body = http(server["url"] + "/generate",
                         {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert status == 200
    first = json.loads(body)["output_ids"][0]
    status, body = http(server["url"] + "/generate",
                         {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                                   "stop_token_ids": [first]}})
    reply = json.loads(body)
    assert status == 200
    assert reply["output_ids"] == [first]
    assert reply["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}


def test_chat_route_with_return_token_ids_returns_prompt_and_response_token_ids(server):
    status, body = http(server["url"] + "/v1/chat/completions",
                         {"model": server["model"], "messages": [{"role": "user", "content": "Hello"}],
                          "input_ids": PROMPT, "return_token_ids": True, "max_tokens": 4})
    assert status == 200
    choice = json.loads(body)["choices"][0]
    assert choice["prompt_token_ids"] == PROMPT
    assert len(choice["response_token_ids"]) == 4
    assert choice["finish_reason"] == "length"


def test_chat_route_rejects_return_token_ids_with_stream_as_a_400(server):
    status, body = http(server["url"] + "/v1/chat/completions",
                         {"model": server["model"], "messages": [{"role": "user", "content": "Hello"}],
                          "input_ids": PROMPT, "return_token_ids": True, "max_tokens": 4, "stream": True})
    assert status == 400
    assert json.loads(body)["message"].startswith("return_token_ids is not supported with streaming")


# --- the radix cache: what a sticky next turn finds ----------------------------------------------


def test_shards_record_the_cached_tokens_the_real_server_reports(sglang_run):
    assert sglang_run["rows"] and all(isinstance(r["cached_tokens"], int) and 0 <= r["cached_tokens"] < r["prompt_len"]
                                      for r in sglang_run["rows"])


def test_prefix_cache_hit_rate_of_turns_2_plus_sent_to_the_server_of_the_previous_turn(server):
    """Multi-turn conversations as dqa builds them (turn k + 1's prompt = turn k's prompt + its
    output + the end of turn + the next user message + the assistant header), every turn sent to
    this one server, as sticky dispatch does: turns 2+ find at least the previous turn's prompt
    cached (``meta_info.cached_tokens``), and the hit rate (cached / prompt tokens) is printed."""
    user = lambda i, k: [151644, 872, 198, 9707 + i, 11 + k, 1879, 151645, 198, 151644, 77091, 198]  # noqa: E731
    cached = prompts = 0
    for i in range(4):
        prompt = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198] + user(i, 0)  # a system message first
        for k in range(3):
            status, body = http(server["url"] + "/generate",
                                 {"input_ids": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0}, "rid": f"c{i}-{k}"})
            assert status == 200, body
            reply = json.loads(body)
            meta = reply["meta_info"]
            assert isinstance(meta["cached_tokens"], int)
            if k:
                assert meta["cached_tokens"] >= previous, (k, meta)
                cached += meta["cached_tokens"]
                prompts += len(prompt)
            previous = len(prompt)
            out = reply["output_ids"]
            prompt = prompt + out + ([151645, 198] if out[-1:] != [151645] else [198]) + user(i, k + 1)
    rate = cached / prompts
    print(f"real SGLang CPU: prefix-cache hit rate of turns 2+ = {rate:.3f} ({cached} of {prompts} prompt tokens)")
    assert rate >= 0.5
