"""The openai protocol, token-exact where the server allows it (issue 11, item 2).

SGLang 0.5.23's ``/v1/chat/completions`` takes the prompt as ``input_ids`` and, with
``"return_token_ids": true``, answers ``choices[0].response_token_ids`` (its ``output_ids``, the stop
token included) and ``prompt_token_ids`` (read in 0.5.23's protocol.py and serving_chat.py). dqa
asks every SGLang endpoint once at start-up (a one-token probe), sends token ids where the probe
found them and keeps the reply's ids as they are; other servers and older SGLang releases get the
text round trip. run.json records the route per endpoint (``servers[url].openai_route``).

The stand-in (tests/servers/sglang_contract.py) answers the chat route like 0.5.23 (and ignores the
fields as --sglang-version 0.5.22); the request bodies and the stand-in's replies are checked against
0.5.23's own pydantic models (``sglang_openai_protocol`` below). The text fallback against a real
`transformers serve` is in test_regen_openai.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types

import httpx
import numpy as np
import pytest

from dqa.regen.jobs.job import Job
from dqa.regen.servers.openai import TEXT, TOKEN_EXACT, OpenAIProtocol
from dqa.regen.wire.call import call
from dqa.regen.config import RegenConfig, SamplingSpec
from dqa.regen.run import regenerate
from dqa.regen.servers.facts import ServerFacts
from dqa.regen.servers.openai import PROBE_IDS, token_ids_answer
from dqa.regen.wire.transport import Transport
from regen_helpers import degenerate_dataset, read_shards, write_findings
from servers.sglang_contract import StubServer

FAST = dict(health_interval=0.5, health_timeout=2.0, backoff_base=0.05, backoff_max=0.3, live=False, install_signal_handlers=False)
PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("token-exact-data")
    return degenerate_dataset(d / "chat.parquet", 6), write_findings(d / "scan", list(range(6)))


def _stub(tmp_path, *args):
    # Seeds applied (deterministic inference), so a reply can be compared with /generate's for the
    # same ids and seed; the reasoning parser strips whitespace from the text, so a text round trip
    # would not give the same tokens back.
    return StubServer(tmp_path / "stub", "--reasoning-parser", "qwen3", "--enable-deterministic-inference", *args)


def _regen(data, out, url, logs):
    path, findings = data
    return regenerate(RegenConfig(dataset=str(path), out=str(out), endpoints=[url], findings=str(findings), protocol="openai",
                                  max_new_tokens=48, log=logs.append, **FAST))  # fmt: skip


def test_token_ids_in_equal_token_ids_out_against_sglang_0_5_23(data, tmp_path, monkeypatch):
    def no_render(*a, **k):
        raise AssertionError("the text round trip was used on a token-exact server")

    monkeypatch.setattr(OpenAIProtocol, "render_output", no_render)
    logs: list[str] = []
    with _stub(tmp_path) as stub:
        res = _regen(data, tmp_path / "out", stub.url, logs)
        assert res.exit_code == 0, res.message
        rows = read_shards(tmp_path / "out").to_pylist()
        assert len(rows) == 6 and all(r["status"] in ("ok", "length") for r in rows)
        for r in rows:
            p = r["prompt_len"]
            # /generate with the same prompt ids and seed: the very output ids, no re-tokenization.
            ref = httpx.post(stub.url + "/generate", json={
                "input_ids": r["input_ids"][:p], "sampling_params": {"max_new_tokens": 48, "temperature": 0.6, "top_p": 0.95,
                                                                     "top_k": 20, "sampling_seed": r["seed"]}}).json()  # fmt: skip
            assert r["input_ids"][p:] == ref["output_ids"] and r["output_tokens"] == len(ref["output_ids"])
            if r["status"] == "ok":
                assert r["input_ids"][-1] == 151645  # the stop token is kept, as on /generate
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["servers"][stub.url]["openai_route"] == "token-exact"
    assert any("chat route token-exact" in m for m in logs)


def test_an_older_sglang_ignores_the_fields_and_gets_the_text_round_trip(data, tmp_path):
    logs: list[str] = []
    with _stub(tmp_path, "--sglang-version", "0.5.22") as stub:
        res = _regen(data, tmp_path / "out", stub.url, logs)
    assert res.exit_code == 0, res.message
    rows = read_shards(tmp_path / "out").to_pylist()
    assert len(rows) == 6 and all(r["status"] in ("ok", "length") for r in rows)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["servers"][stub.url]["openai_route"] == "text"
    assert any("chat route text" in m for m in logs)


# --------------------------------------------------------------------------- the route, per endpoint


class _Tok:
    """Just enough tokenizer for ``chatml_messages`` (the messages sent next to input_ids)."""

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(i) for i in ids)


def _proto(**kw) -> OpenAIProtocol:
    return OpenAIProtocol(SamplingSpec(), _Tok(), 151644, 151645, **kw)


def _job() -> Job:
    job = Job(0, "s0", np.asarray(PROMPT, np.int32), 7)
    job.messages = [{"role": "user", "content": "hi"}]
    return job


def test_the_body_carries_input_ids_unless_the_endpoint_takes_the_text_route():
    proto, job = _proto(), _job()
    body = json.loads(proto.body(job, 1, proto.extras_for("http://a/v1/chat/completions"), 64))
    assert body["input_ids"] == PROMPT and body["return_token_ids"] is True and body["messages"]
    proto.use_facts({"http://a": ServerFacts(kind="openai", token_ids=False), "http://b": ServerFacts(kind="sglang", token_ids=True),
                     "http://c": None})  # fmt: skip
    assert proto.routes == {"http://a/v1/chat/completions": TEXT, "http://b/v1/chat/completions": TOKEN_EXACT}
    assert "input_ids" not in json.loads(proto.body(job, 1, proto.extras_for("http://a/v1/chat/completions"), 64))
    assert "input_ids" in json.loads(proto.body(job, 1, proto.extras_for("http://b/v1/chat/completions"), 64))
    assert "input_ids" in json.loads(proto.body(job, 1, proto.extras_for("http://c/v1/chat/completions"), 64))  # not known: ask
    off = _proto(token_ids=False)
    assert "input_ids" not in json.loads(off.body(job, 1, off.extras_for("http://b/v1/chat/completions"), 64))


def test_a_reply_with_response_token_ids_is_kept_as_is_and_teaches_the_route():
    proto, job = _proto(), _job()
    facts = ServerFacts(kind="sglang")
    proto.use_facts({"http://x": facts})
    out = proto.parse({"choices": [{"message": {"content": " a  b "}, "finish_reason": "stop", "prompt_token_ids": PROMPT,
                                    "response_token_ids": [5, 6, 151645]}]}, job)  # fmt: skip
    assert out.kind == "ok" and out.output_ids.tolist() == [5, 6, 151645] and out.route == TOKEN_EXACT
    proto.learn("http://x/v1/chat/completions", out.route)
    assert facts.token_ids is True and facts.to_json()["openai_route"] == "token-exact"
    length = proto.parse({"choices": [{"message": {"content": ""}, "finish_reason": "length", "response_token_ids": [5, 6]}]}, job)
    assert length.kind == "length" and length.output_ids.tolist() == [5, 6]
    bad = proto.parse({"choices": [{"message": {}, "finish_reason": "stop", "response_token_ids": [[1]]}]}, job)
    assert bad.kind == "fail" and "flat list" in bad.error


def test_a_reply_for_another_prompt_or_without_ids_falls_back_to_the_text_round_trip(monkeypatch):
    proto, job = _proto(), _job()
    monkeypatch.setattr(OpenAIProtocol, "render_output", lambda self, job, content, reasoning, finish: np.asarray([9, 9], np.int32))
    for choice in (
        {"message": {"content": "x"}, "finish_reason": "stop"},  # fields ignored (an older SGLang, vLLM)
        {"message": {"content": "x"}, "finish_reason": "stop", "prompt_token_ids": [1, 2], "response_token_ids": [3]},  # ids ignored
    ):
        out = proto.parse({"choices": [choice]}, job)
        assert out.output_ids.tolist() == [9, 9] and out.route == TEXT


class _Scripted(Transport):
    """A transport (the seam ``call`` takes) answering each POST with the next ``(status, JSON)``."""

    def __init__(self, *replies):
        self.replies, self.bodies = list(replies), []

    async def post(self, url, body, limit=None):
        self.bodies.append(json.loads(body))
        status, obj = self.replies.pop(0)
        return status, json.dumps(obj).encode()


def test_an_endpoint_not_known_at_start_up_is_asked_token_exact_and_learns_from_its_reply(monkeypatch):
    monkeypatch.setattr(OpenAIProtocol, "render_output", lambda self, job, content, reasoning, finish: np.asarray([9], np.int32))
    url = "http://late/v1/chat/completions"
    proto = _proto()
    plain = (200, {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]})
    session = _Scripted(plain, plain)
    out, rejected = asyncio.run(call(session, url, proto, _job(), 1, None, frozenset(), 16))
    assert out.kind == "ok" and not rejected and "input_ids" in session.bodies[0]
    assert proto.routes[url] == TEXT  # the server ignored the fields: text from now on
    asyncio.run(call(session, url, proto, _job(), 2, None, frozenset(), 16))
    assert "input_ids" not in session.bodies[1] and "return_token_ids" not in session.bodies[1]
    # A server that refuses the fields by name (transformers serve: 422 "Unexpected fields"): dropped.
    proto = _proto()
    session = _Scripted((422, {"detail": "Unexpected fields in the request: {'input_ids', 'return_token_ids'}"}))
    out, rejected = asyncio.run(call(session, url, proto, _job(), 1, None, frozenset(), 16))
    assert out.kind == "retry" and rejected == {"input_ids", "return_token_ids"} and proto.routes[url] == TEXT


def test_the_probe_answer_needs_the_prompt_ids_back():
    ok = {"choices": [{"index": 0, "prompt_token_ids": PROBE_IDS, "response_token_ids": [7]}]}
    assert token_ids_answer(200, ok, PROBE_IDS) is True
    assert token_ids_answer(200, {"choices": [{"index": 0, "message": {"content": "x"}}]}, PROBE_IDS) is False
    assert token_ids_answer(200, {"choices": [{"prompt_token_ids": [5], "response_token_ids": [7]}]}, PROBE_IDS) is False
    assert token_ids_answer(422, {"detail": "Unexpected fields in the request: {'input_ids'}"}, PROBE_IDS) is False
    assert token_ids_answer(503, None, PROBE_IDS) is None and token_ids_answer(None, None, PROBE_IDS) is None
    assert token_ids_answer(400, {"error": {"message": "context too long"}}, PROBE_IDS) is None


# --------------------------------------------------------------------------- SGLang 0.5.23's own schema


@pytest.fixture(scope="module")
def sglang_openai_protocol(sglang_api_types):
    """SGLang 0.5.23's ``sglang/srt/entrypoints/openai/protocol.py`` (pydantic models of the OpenAI
    routes), loaded by path from the wheel conftest installs. It needs pydantic and the ``openai``
    types (both come with the test extra's transformers[serving]); its one sglang import,
    ``sglang.utils.convert_json_schema_to_str``, is stubbed (the real module pulls IPython and more)."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("pydantic")
    pytest.importorskip("openai")
    path = Path(sglang_api_types.__file__).parents[2] / "srt" / "entrypoints" / "openai" / "protocol.py"
    saved = {k: sys.modules.get(k) for k in ("sglang", "sglang.utils")}
    pkg = types.ModuleType("sglang")
    pkg.__path__ = []
    utils = types.ModuleType("sglang.utils")
    utils.convert_json_schema_to_str = lambda s: s if isinstance(s, str) else json.dumps(s)
    sys.modules.update({"sglang": pkg, "sglang.utils": utils})
    try:
        spec = importlib.util.spec_from_file_location("sglang_openai_protocol_v1", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module


def _valid_chat_request(proto_mod, body: dict):
    """``body`` validates as 0.5.23's ChatCompletionRequest and names only its fields (unknown chat
    fields are ignored by SGLang, so a misspelt one would silently lose the token-exact route)."""
    unknown = set(body) - set(proto_mod.ChatCompletionRequest.model_fields)
    assert not unknown, f"fields SGLang 0.5.23 does not know: {sorted(unknown)}"
    return proto_mod.ChatCompletionRequest.model_validate(body)


@pytest.mark.filterwarnings("ignore:max_tokens is deprecated:DeprecationWarning")
def test_every_chat_body_dqa_builds_is_a_valid_sglang_0_5_23_request(sglang_openai_protocol):
    proto, job = _proto(), _job()
    for off in (frozenset(), frozenset({"top_k", "rid"}), frozenset({"input_ids", "return_token_ids"})):
        req = _valid_chat_request(sglang_openai_protocol, json.loads(proto.body(job, 3, off, 17)))
        assert req.max_tokens == 17 and req.seed == job.seed and req.chat_template_kwargs == {"enable_thinking": True}
        if "input_ids" in off:
            assert req.input_ids is None and req.return_token_ids is False
        else:
            assert req.input_ids == PROMPT and req.return_token_ids is True
    probe = {"messages": [{"role": "user", "content": "hi"}], "input_ids": PROBE_IDS, "return_token_ids": True,
             "max_tokens": 1, "temperature": 0.0, "stream": False}  # fmt: skip
    req = _valid_chat_request(sglang_openai_protocol, probe)
    assert req.input_ids == PROBE_IDS and req.return_token_ids


def test_the_stand_ins_token_exact_chat_reply_is_a_valid_sglang_0_5_23_response(sglang_openai_protocol, tmp_path):
    body = json.loads(_proto().body(_job(), 1, frozenset(), 8))
    with _stub(tmp_path) as stub:
        reply = httpx.post(stub.url + "/v1/chat/completions", json=body).json()
        plain = httpx.post(stub.url + "/v1/chat/completions", json={**body, "return_token_ids": False, "rid": "s0:2"}).json()
        streamed = httpx.post(stub.url + "/v1/chat/completions", json={**body, "stream": True, "rid": "s0:3"})
    resp = sglang_openai_protocol.ChatCompletionResponse.model_validate(reply)
    choice = resp.choices[0]
    assert choice.prompt_token_ids == PROMPT and choice.response_token_ids and len(choice.response_token_ids) == reply["usage"]["completion_tokens"]
    assert "response_token_ids" not in plain["choices"][0]
    assert streamed.status_code == 400 and "return_token_ids is not supported with streaming" in streamed.text
