"""dqa's `/generate` requests and the stand-in server's replies against SGLang's own schema.

SGLang 0.5.23 ships its HTTP JSON contract as ``sglang/api/v1/api_types.py`` (msgspec Structs
generated from its .proto files; from 0.5.22 the server checks every `/generate` body with
``GenerateRequest.from_json_value`` and answers a violation with a 400). The file is loaded by
path (conftest's ``sglang_api_types``: ``pip install --no-deps`` once per machine, no torch), so:

- every body ``SglangProtocol`` builds decodes as a ``GenerateRequest`` (and the check does catch
  a body that breaks it: an unknown ``sampling_params`` key, a wrong type);
- every reply of ``tests/servers/sglang_contract.py`` decodes as a ``GenerateResponse``, its
  schema 400 carries the very text SGLang's decoder raises, and its info routes decode as
  ``ModelCard`` / ``GetServerInfoResponse`` / ``GetModelInfoResponse``;
- the launch flags `dqa fleet up` emits for 0.5.23 name fields of that release's ``ServerArgs``
  (``sglang/srt/arg_groups/field_order.py``; names only: SGLang's own parser,
  ``prepare_server_args``, imports torch, triton, pillow, orjson, pybase64 ... and is not run).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from dqa.regen.jobs.job import Job
from dqa.regen.servers.sglang import SglangProtocol
from dqa.regen.config import SamplingSpec
from servers.sglang_contract import StubServer

PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


def assert_valid_request(api, body: bytes):
    """``body`` decodes as SGLang's ``GenerateRequest``; AssertionError naming the violation if not."""
    try:
        return api.GenerateRequest.from_json_value(json.loads(body))
    except api.JsonContractError as exc:
        raise AssertionError(f"not a valid SGLang /generate body: {exc}") from None


def assert_valid_reply(api, obj):
    """``obj`` (a parsed /generate reply) decodes as SGLang's ``GenerateResponse``."""
    try:
        return api.GenerateResponse.from_json_value(obj)
    except api.JsonContractError as exc:
        raise AssertionError(f"not a valid SGLang /generate reply: {exc}") from None


def _jobs() -> list[Job]:
    jobs = [
        Job(0, "sample-0", np.asarray(PROMPT, np.int32), 0),
        Job(7, None, np.asarray([151644, 872, 198, 151935], np.int32), 2**62),  # no id: the row is the key
        Job(3, 'id with "quotes", \\ and ünïcode', np.asarray(PROMPT * 3, np.int32), 123456789),
    ]
    prebuilt = Job(4, "prebuilt", np.asarray(PROMPT, np.int32), 5)
    prebuilt.prompt_text = ",".join(map(str, PROMPT)).encode()  # how iter_turn_jobs hands prompts over
    return jobs + [prebuilt]


@pytest.mark.parametrize("sampling", [SamplingSpec(), SamplingSpec(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=1), SamplingSpec(temperature=0.0, top_k=1)])
def test_every_generate_body_dqa_builds_is_a_valid_sglang_request(sglang_api_types, sampling):
    api = sglang_api_types
    proto = SglangProtocol(sampling)
    for job in _jobs():
        for attempt, max_new in ((1, sampling.max_new_tokens), (2, 17), (6, 1)):
            req = assert_valid_request(api, proto.body(job, attempt, frozenset(), max_new))
            assert req.input_ids == job.prompt.tolist()
            assert req.rid == f"{job.key}:{attempt}"
            sp = req.sampling_params
            assert isinstance(sp, api.SamplingParams)  # one object, not a batch list
            assert (sp.max_new_tokens, sp.sampling_seed, sp.top_k) == (max_new, job.seed, sampling.top_k)
            assert (sp.temperature, sp.top_p) == (pytest.approx(sampling.temperature), pytest.approx(sampling.top_p))


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda b: b["sampling_params"].update(seed=1), "unknown field `seed`"),  # the OpenAI name, not SGLang's
        (lambda b: b["sampling_params"].update(max_new_tokens="64"), "invalid type"),
        (lambda b: b.update(input_ids=["151644"]), "invalid type"),
    ],
)
def test_the_schema_check_fails_on_a_body_that_breaks_it(sglang_api_types, breakage, message):
    """The check above is not vacuous: a body dqa would be wrong to send is caught."""
    body = json.loads(SglangProtocol(SamplingSpec()).body(_jobs()[0], 1, frozenset(), 64))
    assert_valid_request(sglang_api_types, json.dumps(body).encode())
    breakage(body)
    with pytest.raises(AssertionError, match=message):
        assert_valid_request(sglang_api_types, json.dumps(body).encode())


@pytest.fixture(scope="module")
def mtp_stub(tmp_path_factory):
    s = StubServer(tmp_path_factory.mktemp("stub"), "--enable-deterministic-inference", "--speculative-algorithm", "NEXTN",
                   "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4").start()
    yield s
    s.stop()


def test_every_reply_of_the_test_server_is_a_valid_sglang_response(sglang_api_types, mtp_stub):
    api = sglang_api_types
    proto = SglangProtocol(SamplingSpec())
    job = _jobs()[0]
    url = mtp_stub.url + "/generate"
    replies = []
    for attempt, max_new in ((1, 512), (2, 5)):  # stop, then length
        r = httpx.post(url, content=proto.body(job, attempt, frozenset(), max_new), timeout=10)
        assert r.status_code == 200
        replies.append(r.json())
    mtp_stub.control(abort_share=1.0)  # a plain abort: 200, no status code, partial output
    try:
        r = httpx.post(url, content=proto.body(job, 3, frozenset(), 512), timeout=10)
    finally:
        mtp_stub.control(abort_share=0.0)
    replies.append(r.json())
    stream = httpx.post(url, json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 64}, "stream": True}, timeout=10)
    chunks = [json.loads(line[6:]) for line in stream.text.split("\n\n") if line.startswith("data: {")]
    assert len(chunks) > 1
    kinds = []
    for obj in replies + chunks:
        resp = assert_valid_reply(api, obj)
        assert resp.output_ids == obj["output_ids"] and resp.meta_info.id
        kinds.append(type(resp.meta_info.finish_reason).__name__)
    assert kinds[:3] == ["FinishStop", "FinishLength", "FinishAbort"]
    abort = assert_valid_reply(api, replies[2]).meta_info.finish_reason
    assert abort.status_code is None and abort.message == "Aborted"


def test_the_servers_schema_400_is_the_text_sglangs_decoder_raises(sglang_api_types, tmp_path):
    api = sglang_api_types
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "min_tokens": 2}}
    with pytest.raises(api.JsonContractError) as exc:
        api.GenerateRequest.from_json_value(body)
    with StubServer(tmp_path) as s:
        r = httpx.post(s.url + "/generate", json=body, timeout=10)
    assert r.status_code == 400 and r.json() == {"error": str(exc.value)}


def test_the_info_routes_decode_with_sglangs_types(sglang_api_types, mtp_stub):
    api = sglang_api_types
    card = api.ModelCard.from_json_value(httpx.get(mtp_stub.url + "/v1/models", timeout=10).json()["data"][0])
    assert (card.id, card.max_model_len) == ("Qwen/Qwen3-8B", 8192)
    info = api.GetServerInfoResponse.from_json_value(httpx.get(mtp_stub.url + "/server_info", timeout=10).json())
    assert info.version == "0.5.23"
    model = api.GetModelInfoResponse.from_json_value(httpx.get(mtp_stub.url + "/model_info", timeout=10).json())
    assert model.model_path == "Qwen/Qwen3-8B"


def test_fleet_up_flags_for_0_5_23_name_fields_of_its_server_args(sglang_api_types):
    from dqa.regen.fleet import launch as fl
    from dqa.regen.fleet.spec import FleetSpec
    from dqa.regen.servers.sglang import SglangOptions

    order = Path(sglang_api_types.__file__).parents[2] / "srt" / "arg_groups" / "field_order.py"
    tree = ast.parse(order.read_text())
    fields = next(
        ast.literal_eval(node.value) for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "POSITIONAL_FIELD_ORDER"
    )  # fmt: skip
    spec = FleetSpec(model="/m", gpus=["0"], python="python3", engine_options=SglangOptions(mtp=True, hybrid=True, deterministic=True,
                     sglang_version="0.5.23", mamba_extra_buffer="on"))
    flags = [a for a in fl.build_commands(spec)[0].argv[3:] if a.startswith("--")]
    assert flags and all(f[2:].replace("-", "_") in fields for f in flags), [f for f in flags if f[2:].replace("-", "_") not in fields]
    assert "mamba_scheduler_strategy" not in fields and "mamba_radix_cache_strategy" in fields  # gone in 0.5.20+
    older = FleetSpec(model="/m", gpus=["0"], python="python3", engine_options=SglangOptions(mtp=True, hybrid=True, sglang_version="0.5.17"))
    assert "--mamba-radix-cache-strategy" in fl.build_commands(older)[0].argv  # the name 0.5.23 still has
