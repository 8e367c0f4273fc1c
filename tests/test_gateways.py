"""SGLang's real gateway, in both packages the ``test`` extra installs side by side: smg 1.13.0
(the Shepherd Model Gateway, ``smg launch``) and sglang-router 0.3.2 (its predecessor), each in
front of two SGLang stand-ins (tests/servers/sglang_contract.py, which record the sampling keys
that reach them) with different context lengths (1,024 and 2,048 tokens).

- The table of the sampling fields each gateway passes on (``PASSED_SAMPLING_PARAMS``) holds the
  installed release, and every SGLang 0.5.23 sampling key goes through or is dropped as it says.
- dqa recognises either as a gateway over HTTP (sglang-router by its own ``/get_server_info``,
  smg, which passes ``/get_server_info`` on to one worker, by its 404 on ``/server_info``), asks
  its workers, and caps by the smaller context; its release, which neither says over HTTP, is
  recorded as not known and so is every sampling field.
- `fleet status`'s reading of the metrics port: each worker healthy with its circuit closed, and
  the upstream replies counted.

One gateway per parameter, started once for the module.
"""

from __future__ import annotations

import asyncio
import json
from importlib.metadata import version

import httpx
import pytest

from regen_helpers import degenerate_dataset, read_shards, write_findings
from router_helpers import Router, gateway_params
from servers.sglang_contract import SAMPLING_FIELDS, StubServer

# A value SGLang 0.5.23 accepts for each of its sampling keys.
VALUES = {"max_new_tokens": 4, "stop": ["zz"], "stop_token_ids": [151645], "stop_regex": "zz$", "temperature": 0.6,
          "top_p": 0.95, "top_k": 20, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
          "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1, "json_schema": '{"type": "string"}', "regex": "a+",
          "ebnf": 'root ::= "a"', "structural_tag": '{"type": "x"}', "ignore_eos": False, "skip_special_tokens": True,
          "spaces_between_special_tokens": True, "no_stop_trim": False, "stream_interval": 1, "logit_bias": {"1": 0.5},
          "sampling_seed": 3, "custom_params": {"a": 1}, "beam_width": 1, "watermark": False, "choice": ["a"]}  # fmt: skip
NOT_SGLANG = {"seed": 3, "not_a_key": 1}  # keys SGLang's /generate does not know
CONTEXTS = (1024, 2048)


@pytest.fixture(scope="module", params=gateway_params())
def gateway(request, tmp_path_factory):
    """(gateway name, its Router, its two workers), started once per gateway."""
    tmp = tmp_path_factory.mktemp(request.param)
    # 0.5.21: /generate does not refuse unknown sampling keys, so every key that reaches it is recorded.
    workers = [StubServer(tmp / f"w{i}", "--context-length", str(n), "--sglang-version", "0.5.21", name=f"w{i}").start()
               for i, n in enumerate(CONTEXTS)]
    router = Router(tmp / "router", [w.url for w in workers], gateway=request.param).start()
    yield request.param, router, workers
    router.stop()
    for w in workers:
        w.stop()


def test_the_sampling_table_holds_the_installed_release_and_says_what_reaches_the_worker(gateway):
    from dqa.regen.servers.sglang_router import PASSED_SAMPLING_PARAMS

    name, router, workers = gateway
    release = version(name)
    assert (name, release) in PASSED_SAMPLING_PARAMS, f"{name} {release} is installed; the table holds {sorted(PASSED_SAMPLING_PARAMS)}"
    passed = PASSED_SAMPLING_PARAMS[(name, release)]
    assert set(SAMPLING_FIELDS) == set(VALUES)  # every key of SGLang 0.5.23's schema is tried
    reached = set()
    for key, value in {**VALUES, **NOT_SGLANG}.items():
        rid = f"key-{key}"
        sp = {"max_new_tokens": 4, key: value}
        r = httpx.post(router.url + "/generate", json={"input_ids": [151644, 872, 198], "rid": rid, "sampling_params": sp}, timeout=10)
        assert r.status_code == 200, (key, r.text)
        seen = [x for w in workers for x in w.requests() if x["rid"] == rid]
        assert len(seen) == 1
        if key in seen[0]["sampling_keys"]:
            reached.add(key)
    assert reached == passed


def test_dqa_recognises_the_gateway_asks_its_workers_and_records_its_release_as_not_known(gateway):
    from dqa.regen.servers.facts import discover, settle
    from dqa.regen.wire.transport import AiohttpTransport

    name, router, workers = gateway

    async def ask():
        transport = AiohttpTransport({}, connect_timeout=5.0, request_timeout=10.0)
        try:
            return await discover(transport, router.url, 5.0)
        finally:
            await transport.close()

    f = asyncio.run(ask())
    r = f.router
    assert r is not None and r["gateway"] == name and f.retries_itself
    assert sorted(r["workers"]) == sorted(w.url for w in workers) and r["workers_answered"] == 2
    assert (f.context_length, r["context_from"], f.version) == (min(CONTEXTS), "workers", "0.5.21")
    note = settle(router.url, f, None, ("max_new_tokens", "temperature"))
    assert r["release"] is None and r["sampling_fields"] == {"max_new_tokens": "unknown", "temperature": "unknown"}
    assert note and f"the SGLang gateway is {name} (release not known)" in note


def test_regen_through_the_gateway_caps_at_the_smaller_context_and_no_request_is_a_400(gateway, tmp_path):
    from dqa.regen.config import RegenConfig
    from dqa.regen.run import regenerate

    name, router, workers = gateway
    before = router.metric_sum("smg_router_upstream_responses_total", status_code="200")
    path = degenerate_dataset(tmp_path / "d.parquet", 12)
    findings = write_findings(tmp_path / "scan", list(range(12)))
    cfg = RegenConfig(dataset=str(path), out=str(tmp_path / "out"), endpoints=[router.url], findings=str(findings),
                      max_new_tokens=8192, log=lambda _: None, live=False, install_signal_handlers=False)  # fmt: skip
    res = regenerate(cfg)
    assert res.exit_code == 0, res.message
    rows = read_shards(tmp_path / "out").to_pylist()
    assert sorted(r["row"] for r in rows) == list(range(12)) and {r["status"] for r in rows} == {"ok"}
    assert all(json.loads(r["sampling"])["max_new_tokens"] == min(CONTEXTS) - r["prompt_len"] for r in rows)
    assert router.metric_sum("smg_router_upstream_responses_total", status_code="400") == 0
    assert router.metric_sum("smg_router_upstream_responses_total", status_code="200") - before == 12


def test_fleet_status_reads_each_workers_health_and_circuit_and_the_replies_off_the_metrics_port(gateway):
    from dqa.regen.fleet.file import Endpoint
    from dqa.regen.fleet.router import router_status

    name, router, workers = gateway
    httpx.post(router.url + "/generate", json={"input_ids": [151644, 872, 198], "sampling_params": {"max_new_tokens": 4}}, timeout=10)
    st = router_status(Endpoint(url=router.url, metrics_url=f"http://127.0.0.1:{router.metrics_port}"), 5.0)
    assert (st.up, st.ready, st.source) == (True, True, "metrics")
    assert [(w.url, w.healthy, w.circuit) for w in st.workers] == [(u, True, "closed") for u in sorted(w.url for w in workers)]
    assert st.responses.get("200", 0) >= 1 and set(st.responses) == {"200"}
