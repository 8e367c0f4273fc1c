"""The SGLang-contract stub server honours docs/sglang.md, so the regen tests built on it
test dqa against SGLang's real contract and not against a drifting stand-in."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servers.sglang_contract import (
    CONTENT_FAULT_KINDS, END_THINK, IM_END, IM_START, NL2, THINK, WORDS, StubServer, content_fault, parse_args, plan_reply,
    unknown_field_message,
)

PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]  # <|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n

DECODE_LINE = re.compile(
    r"Decode batch, #running-req: (\d+), #token: (\d+), token usage: ([\d.]+), accept len: ([\d.]+), "
    r"accept rate: ([\d.]+), cuda graph: (True|False), gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+)"
)
SGLANG_METRICS = [
    "sglang:gen_throughput", "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
    "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:cached_tokens_total",
    "sglang:num_requests_total", "sglang:num_aborted_requests_total", "sglang:spec_accept_length",
    "sglang:spec_accept_rate", "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
]


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    # Deterministic inference on: these tests check replies against plan_reply(prompt, seed).
    server = StubServer(tmp_path_factory.mktemp("stub"), "--enable-metrics", "--log-interval-s", "0.2",
                        "--enable-deterministic-inference").start()
    yield server
    server.stop()


def generate(url: str, ids=PROMPT, timeout: float = 5.0, **body):
    return httpx.post(url + "/generate", json={"input_ids": ids, **body}, timeout=timeout)


def wait_for(cond, what: str, timeout: float = 60) -> None:
    """Poll ``cond`` until it holds; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)


def samples(metrics_text: str) -> dict[str, float]:
    """Prometheus exposition -> {sample name: value} (label sets summed), parsed by prometheus_client."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if "le" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_stub_reply_ids_are_real_qwen3_tokens(qwen_tokenizer):
    for tid, text in WORDS:
        assert qwen_tokenizer.decode([tid]) == text
    assert qwen_tokenizer.convert_ids_to_tokens([THINK, END_THINK, IM_END, NL2]) == ["<think>", "</think>", "<|im_end|>", "ĊĊ"]


def test_generate_replies_a_closed_thinking_turn_with_sglang_fields(stub, qwen_tokenizer):
    r = generate(stub.url, rid="row-7:0", sampling_params={"max_new_tokens": 512, "sampling_seed": 11, "temperature": 0.6})
    assert r.status_code == 200
    body = r.json()
    out = body["output_ids"]
    assert out[:2] == [THINK, 198] and out[-1] == IM_END and END_THINK in out
    assert out[out.index(END_THINK) + 1] == NL2
    meta = body["meta_info"]
    assert meta["id"] == "row-7:0"
    assert meta["finish_reason"] == {"type": "stop", "matched": IM_END}
    assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == len(out)
    assert {"cached_tokens", "e2e_latency"} <= meta.keys()
    assert not {"spec_verify_ct", "spec_accept_length"} & meta.keys()  # only with speculative decoding, as a real 0.5.23
    # text is the real tokenizer's decoding, the stop token trimmed
    assert body["text"] == qwen_tokenizer.decode(out[:-1], skip_special_tokens=True)
    assert body["text"].startswith("<think>\n") and "</think>\n\n" in body["text"]


def test_output_is_deterministic_in_prompt_and_seed(stub):
    def ids(seed, prompt=PROMPT):
        return generate(stub.url, prompt, sampling_params={"max_new_tokens": 512, "sampling_seed": seed}).json()["output_ids"]

    assert ids(1) == ids(1) == plan_reply(PROMPT, 1)
    assert ids(1) != ids(2)
    assert ids(1) != ids(1, PROMPT[:-1] + [271, 198])


def test_content_faults_spoil_the_first_seed_of_a_share_of_prompts_and_a_new_seed_gets_a_good_answer(tmp_path, qwen_tokenizer):
    prompts = [PROMPT[:3] + [w] + PROMPT[4:] for w, _ in WORDS]  # 43 different user messages
    kinds = {i: content_fault(p, 0.5, list(CONTENT_FAULT_KINDS)) for i, p in enumerate(prompts)}
    bad = {i: k for i, k in kinds.items() if k}
    assert 0 < len(bad) < len(prompts) and set(bad.values()) == set(CONTENT_FAULT_KINDS)
    with StubServer(tmp_path, "--enable-deterministic-inference", "--content-fault-share", "0.5") as s:
        def reply(p, seed):
            return generate(s.url, p, sampling_params={"max_new_tokens": 300, "sampling_seed": seed}).json()

        first = [reply(p, 7) for p in prompts]
        for i, body in enumerate(first):
            out, text = body["output_ids"], qwen_tokenizer.decode(body["output_ids"], skip_special_tokens=False)
            if kinds[i] is None:
                assert out == plan_reply(prompts[i], 7)
            elif kinds[i] == "degenerate":  # the seed's answer, token for token
                assert text == "<think>\n\n</think>\n\nOK.<|im_end|>"
            elif kinds[i] == "loop":
                assert text.count(" let me think about this carefully First the.") == 24 and out[-1] == IM_END
            else:  # cut: a thought that never closes, ended by the length limit
                assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 300}
                assert END_THINK not in out and len(out) == 300
        assert [reply(p, 7)["output_ids"] for p in prompts] == [b["output_ids"] for b in first]  # a resend with the same seed: the same bad answer
        assert all(reply(p, 8)["output_ids"] == plan_reply(p, 8) for p in prompts)  # a new seed: a good one
        assert reply(prompts[min(bad)], 7)["output_ids"] == first[min(bad)]["output_ids"]  # the first seed stays the spoilt one


def test_planned_replies_span_their_length_ranges_and_impossible_ranges_are_refused():
    lengths = set()
    for i in range(3000):
        reply = plan_reply([i, 7, 9], None, (8, 30), (2, 6))
        assert reply == plan_reply([i, 7, 9], 0, (8, 30), (2, 6))  # no seed is seed 0
        end = reply.index(END_THINK)
        n_think, n_answer = end - 6, len(reply) - end - 7
        thinking = reply[4 : 4 + n_think]
        assert all((thinking[k] == 11) == (k % 7 == 5) for k in range(n_think))  # commas at 5, 12, ..., nowhere else
        assert reply[-1] == IM_END and reply[end + 1] == NL2
        lengths.add((n_think, n_answer))
    assert lengths == {(t, a) for t in range(8, 31) for a in range(2, 7)}
    for think, answer in [((10, 5), (4, 12)), ((16, 48), (-1, 3)), ((65530, 65536), (6, 6))]:
        with pytest.raises(ValueError):
            plan_reply([1, 2], 3, think, answer)
    with pytest.raises(SystemExit):
        parse_args(["--think-min", "50"])  # above the default --think-max 48


def test_different_prompts_do_not_share_an_answer_a_rescan_would_flag_as_duplicate():
    # 20,000 answers of 12-20 words: words drawn one by one would repeat none; a single stretch of
    # the word pool per answer repeated 267 of them (and 2 of a 72-turn set's answers in 0.4% of sets).
    answers = {tuple(plan_reply([i, 5], 7, (16, 48), (12, 20))[-23:]) for i in range(20_000)}
    assert len(answers) == 20_000


def test_short_max_new_tokens_is_finish_reason_length(stub):
    body = generate(stub.url, sampling_params={"max_new_tokens": 5, "sampling_seed": 3}).json()
    assert body["output_ids"] == plan_reply(PROMPT, 3)[:5]
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert body["meta_info"]["completion_tokens"] == 5


def test_stop_token_ids_end_the_reply_at_the_matched_token(stub):
    body = generate(stub.url, sampling_params={"max_new_tokens": 512, "stop_token_ids": [END_THINK]}).json()
    assert body["output_ids"][-1] == END_THINK
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": END_THINK}


def test_bad_requests_are_400_with_an_error_message(stub):
    for body in ({}, {"input_ids": [1, 2], "text": "x"}, {"input_ids": [-1]},
                 {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 9000}}):
        r = httpx.post(stub.url + "/generate", json=body, timeout=5)
        assert r.status_code == 400, body
        assert isinstance(r.json()["error"]["message"], str)


def test_duplicate_in_flight_rid_is_rejected_and_freed_after(tmp_path):
    # The first request is in flight (seen by the server) before the second is sent, and stays
    # so for 3 s: far longer than sending one more request takes, even on a loaded machine.
    with StubServer(tmp_path, "--latency-s", "3") as s, httpx.Client(timeout=60) as c:
        import threading

        first: list[httpx.Response] = []
        t = threading.Thread(target=lambda: first.append(c.post(s.url + "/generate", json={"input_ids": PROMPT, "rid": "dup"})))
        t.start()
        wait_for(lambda: s.status()["inflight"] == 1, "the first request in flight")
        r = c.post(s.url + "/generate", json={"input_ids": PROMPT, "rid": "dup"})
        t.join()
        assert r.status_code == 400 and "Duplicate request ID" in r.json()["error"]["message"]
        assert first[0].status_code == 200
        assert c.post(s.url + "/generate", json={"input_ids": PROMPT, "rid": "dup"}).status_code == 200


def test_health_and_health_generate_are_503_while_starting_then_200(tmp_path):
    # A start far longer than the test's first requests take; then a short one that ends by itself.
    with StubServer(tmp_path, "--startup-delay-s", "600") as s:
        assert httpx.get(s.url + "/health_generate").status_code == 503
        assert httpx.get(s.url + "/health").status_code == 503  # SGLang: 503 while starting
        s.control(starting_for_s=0.5)
        wait_for(lambda: httpx.get(s.url + "/health_generate").status_code == 200, "health_generate 200 after the start")
        assert httpx.get(s.url + "/health").status_code == 200
        s.control(healthy=False)  # generation stuck: /health stays a cheap 200
        assert httpx.get(s.url + "/health").status_code == 200 and httpx.get(s.url + "/health_generate").status_code == 503


def test_info_endpoints_report_version_and_model(stub):
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(stub.url + path).json()
        assert info["version"] == "0.5.23" and info["context_length"] is None  # null unless --context-length, as a real 0.5.23
        assert info["enable_deterministic_inference"] is True and info["speculative_algorithm"] is None
    for path in ("/model_info", "/get_model_info"):
        info = httpx.get(stub.url + path).json()
        assert info["model_path"] == "Qwen/Qwen3-8B" and "max_model_len" not in info  # not there in SGLang
    models = httpx.get(stub.url + "/v1/models").json()["data"]
    assert models[0]["id"] == "Qwen/Qwen3-8B" and models[0]["max_model_len"] == 8192


def test_metrics_use_sglang_names_and_counters_move_with_requests(stub):
    before = samples(httpx.get(stub.url + "/metrics").text)
    for name in SGLANG_METRICS:
        assert any(k == name or k.startswith(name + "_") for k in before), name
    out = generate(stub.url, sampling_params={"max_new_tokens": 7}).json()
    after = samples(httpx.get(stub.url + "/metrics").text)
    assert after["sglang:num_requests_total"] == before["sglang:num_requests_total"] + 1
    assert after["sglang:generation_tokens_total"] == before["sglang:generation_tokens_total"] + 7
    assert after["sglang:prompt_tokens_total"] == before["sglang:prompt_tokens_total"] + len(PROMPT)
    assert after["sglang:cached_tokens_total"] >= before["sglang:cached_tokens_total"] + out["meta_info"]["cached_tokens"]
    assert after["sglang:e2e_request_latency_seconds_count"] == before["sglang:e2e_request_latency_seconds_count"] + 1


def test_metrics_are_off_without_enable_metrics(tmp_path):
    with StubServer(tmp_path) as s:
        assert httpx.get(s.url + "/metrics").status_code == 404


def test_decode_log_lines_follow_the_documented_format(tmp_path):
    with StubServer(tmp_path, "--log-interval-s", "0.1", "--per-token-s", "0.01") as s:
        generate(s.url, sampling_params={"max_new_tokens": 20})

        def decode_lines() -> list[str]:
            return [ln for ln in s.log_path.read_text().splitlines() if "Decode batch" in ln]

        # the line after the request reports its tokens: wait for it rather than for a time
        wait_for(lambda: any((m := DECODE_LINE.search(ln)) and float(m.group(7)) > 0 for ln in decode_lines()),
                 "a decode line with a throughput")
        lines = decode_lines()
    assert lines and all(DECODE_LINE.search(ln) for ln in lines)
    assert any(float(DECODE_LINE.search(ln).group(7)) > 0 for ln in lines)


def test_chat_completions_keep_thinking_in_content_without_parser(stub):
    r = httpx.post(stub.url + "/v1/chat/completions", timeout=5, json={
        "model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 512,
        "chat_template_kwargs": {"enable_thinking": True}})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == IM_END
    assert choice["message"]["content"].startswith("<think>") and "</think>" in choice["message"]["content"]
    assert r.json()["usage"]["completion_tokens"] > 0


def test_chat_route_echoes_the_model_and_answers_errors_as_a_real_0_5_23(stub):
    """Seen on a real SGLang 0.5.23 (tests/test_real_sglang_cpu.py): the reply's model is whatever
    the request named, and a bad request is a BadRequestError object with a null param."""
    r = httpx.post(stub.url + "/v1/chat/completions", timeout=5, json={
        "model": "nope", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    assert r.status_code == 200 and r.json()["model"] == "nope"
    r = httpx.post(stub.url + "/v1/chat/completions", timeout=5, json={"model": "m", "messages": []})
    assert r.status_code == 400
    assert r.json() == {"object": "error", "message": "messages must be a non-empty list", "type": "BadRequestError",
                        "param": None, "code": 400}


def test_api_key_is_required_when_set(tmp_path):
    with StubServer(tmp_path, "--api-key", "sk-secret") as s:
        assert generate(s.url).status_code == 401
        ok = httpx.post(s.url + "/generate", json={"input_ids": PROMPT}, headers={"Authorization": "Bearer sk-secret"})
        assert ok.status_code == 200
    assert "sk-secret" not in s.log_path.read_text()


def test_faults_switch_at_run_time(stub):
    try:
        stub.control(error_share=1.0, error_statuses=[503])
        r = generate(stub.url)
        assert r.status_code == 503 and r.json()["code"] == 503
        stub.control(error_share=0.0, abort_share=1.0)
        fr = generate(stub.url).json()["meta_info"]["finish_reason"]
        assert fr == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        stub.control(abort_share=0.0, malformed_share=1.0)
        with pytest.raises(json.JSONDecodeError):
            json.loads(generate(stub.url).text)
        stub.control(malformed_share=0.0, error_chunk_share=1.0)
        r = generate(stub.url, stream=True)
        assert r.status_code == 200 and r.text.startswith('data: {"error"') and r.text.endswith("data: [DONE]\n\n")
        stub.control(error_chunk_share=0.0, drop_share=1.0)
        with pytest.raises(httpx.RemoteProtocolError):
            generate(stub.url)
        stub.control(drop_share=0.0, stall_share=1.0)
        with pytest.raises(httpx.ReadTimeout):
            generate(stub.url, timeout=0.3, rid="stalled")
        assert httpx.get(stub.url + "/health_generate", timeout=5).status_code == 503
        stub.control(stall_share=0.0, error_for_s=600)
        assert generate(stub.url).status_code in (500, 503, 429)
        stub.control(error_for_s=0.3)  # a window that ends by itself
        wait_for(lambda: generate(stub.url).status_code == 200, "the error window's end")
        wait_for(lambda: stub.status()["inflight"] == 0, "the stalled request aborted")
        # the stalled request was aborted when its client left: its rid is free again
        assert generate(stub.url, rid="stalled").status_code == 200
    finally:
        stub.control(error_share=0, abort_share=0, malformed_share=0, error_chunk_share=0, drop_share=0, stall_share=0)


def test_die_after_n_requests_ends_the_process_and_restart_reuses_the_port(tmp_path):
    from fleet_helpers import free_port_base

    # An explicit port below the ephemeral range: nothing else takes it while the server is down.
    s = StubServer(tmp_path, "--die-after", "2", port=free_port_base(1)).start()
    try:
        assert generate(s.url).status_code == 200 and generate(s.url).status_code == 200
        with pytest.raises(httpx.TransportError):
            generate(s.url)
        assert s.proc.wait(5) != 0
        port = s.port
        s.restart()
        assert s.port == port and generate(s.url).status_code == 200  # the flags come back too: die_after 2
    finally:
        s.stop()


# ------------------------------------------------------------------ behaviour that differs by release


def test_the_length_check_adds_the_speculative_reserve_and_0_5_4_compares_with_ge(tmp_path):
    """Context 64, a 9-token prompt: room for 55 output tokens; NEXTN 3/1/4 reserves 4 more
    (max(3 x 1, 4)); on 0.5.4 equal is already over."""
    def largest_accepted(s) -> int:
        ok = [n for n in range(45, 60) if generate(s.url, sampling_params={"max_new_tokens": n}).status_code == 200]
        assert ok == list(range(45, ok[-1] + 1))  # accepted up to a limit, refused above it
        refused = generate(s.url, sampling_params={"max_new_tokens": ok[-1] + 1})
        assert refused.status_code == 400 and "context length" in refused.json()["error"]["message"]
        return ok[-1]

    spec = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4")
    with StubServer(tmp_path, "--context-length", "64", name="plain") as s:
        assert largest_accepted(s) == 64 - len(PROMPT)
    with StubServer(tmp_path, "--context-length", "64", *spec, name="mtp") as s:
        assert largest_accepted(s) == 64 - len(PROMPT) - 4
        info = httpx.get(s.url + "/server_info").json()
        assert (info["speculative_algorithm"], info["speculative_num_steps"], info["speculative_eagle_topk"],
                info["speculative_num_draft_tokens"]) == ("EAGLE", 3, 1, 4)
    with StubServer(tmp_path, "--context-length", "64", "--sglang-version", "0.5.4", *spec, name="old") as s:
        assert largest_accepted(s) == 64 - len(PROMPT) - 4 - 1


def test_seeds_take_effect_only_with_deterministic_inference(stub, tmp_path):
    def ids(url):
        return generate(url, sampling_params={"max_new_tokens": 512, "sampling_seed": 5}).json()["output_ids"]

    assert ids(stub.url) == ids(stub.url) == plan_reply(PROMPT, 5)
    with StubServer(tmp_path) as s:
        assert httpx.get(s.url + "/server_info").json()["enable_deterministic_inference"] is False
        replies = [ids(s.url) for _ in range(3)]
    assert len({tuple(r) for r in replies}) == 3  # the same seed, another reply each time


def test_from_0_5_22_an_unknown_sampling_key_is_a_400_with_a_string_body(tmp_path):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "seed": 3}}
    with StubServer(tmp_path, name="new") as s:
        r = httpx.post(s.url + "/generate", json=body, timeout=5)
        assert r.status_code == 400 and r.json() == {"error": unknown_field_message("seed")}
        assert r.json()["error"].startswith("unknown field `seed`, expected one of `max_new_tokens`, ")
        # the OpenAI route ignores unknown fields
        chat = httpx.post(s.url + "/v1/chat/completions", timeout=5,
                          json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "no_such_field": 1})
        assert chat.status_code == 200
    with StubServer(tmp_path, "--sglang-version", "0.5.21", name="old") as s:
        assert httpx.post(s.url + "/generate", json=body, timeout=5).status_code == 200


def test_an_abort_with_a_status_code_is_a_real_http_error(tmp_path):
    with StubServer(tmp_path, "--abort-share", "1.0") as s:
        body = generate(s.url, sampling_params={"max_new_tokens": 64}).json()  # plain: 200, partial output
        assert body["meta_info"]["finish_reason"]["status_code"] is None
        assert body["meta_info"]["completion_tokens"] == len(body["output_ids"])
        s.control(abort_status=503)
        r = generate(s.url)
        assert r.status_code == 503 and r.json()["code"] == 503
        s.control(abort_status=400)
        r = generate(s.url)
        assert r.status_code == 400 and isinstance(r.json()["error"]["message"], str)
        assert s.status()["num_aborted"] == 3


@pytest.mark.parametrize(
    "version, flag, ok",
    [
        ("0.5.11", "--mamba-scheduler-strategy", True),
        ("0.5.11", "--mamba-radix-cache-strategy", False),
        ("0.5.14", "--mamba-scheduler-strategy", True),  # a deprecated alias
        ("0.5.17", "--mamba-radix-cache-strategy", True),
        ("0.5.20", "--mamba-scheduler-strategy", False),  # gone: exit 2
        ("0.5.23", "--mamba-radix-cache-strategy", True),
    ],
)
def test_launch_flags_exist_only_in_the_releases_that_have_them(version, flag, ok):
    argv = ["--sglang-version", version, flag, "extra_buffer"]
    if ok:
        assert parse_args(argv).mamba_radix_cache_strategy == "extra_buffer"
    else:
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2


def test_cached_tokens_is_the_longest_prefix_an_earlier_request_held_as_sglangs_radix_cache_reports_it(tmp_path):
    """``meta_info.cached_tokens``: 0 for a prompt no request began with; a multi-turn next prompt
    (the previous prompt + its output + a new user message) finds the previous prompt and output
    cached (all but the output's last token, which has no KV entry yet); a prompt sent again finds
    all but one token (one is always computed); a prompt sharing only a start finds that start. Per
    process: another server (or this one without its radix cache) has none of it."""
    user = [IM_START, 872, 198]
    first = user + list(range(1000, 1040)) + [IM_END, 198, IM_START, 77091, 198]
    with StubServer(tmp_path / "a", "--zero-latency") as a, StubServer(tmp_path / "b", "--zero-latency") as b, \
            StubServer(tmp_path / "c", "--zero-latency", "--disable-radix-cache") as c:
        r1 = generate(a.url, ids=first).json()
        out = r1["output_ids"]
        assert r1["meta_info"]["cached_tokens"] == 0 and len(out) > 2
        second = first + out + [198] + user + list(range(2000, 2010)) + [IM_END, 198, IM_START, 77091, 198]
        r2 = generate(a.url, ids=second).json()
        assert r2["meta_info"]["cached_tokens"] == len(first) + len(out) - 1
        assert generate(a.url, ids=second).json()["meta_info"]["cached_tokens"] == len(second) - 1
        fork = first[:21] + [5, 6, 7]
        assert generate(a.url, ids=fork).json()["meta_info"]["cached_tokens"] == 21
        assert generate(b.url, ids=second).json()["meta_info"]["cached_tokens"] == 0
        for _ in range(2):
            assert generate(c.url, ids=first).json()["meta_info"]["cached_tokens"] == 0


def test_the_openai_route_reports_cached_tokens_only_with_enable_cache_report(tmp_path):
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
    with StubServer(tmp_path / "a", "--zero-latency", "--enable-cache-report") as a, StubServer(tmp_path / "b", "--zero-latency") as b:
        for _ in range(2):
            usage = httpx.post(a.url + "/v1/chat/completions", json=body).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        assert httpx.post(b.url + "/v1/chat/completions", json=body).json()["usage"]["prompt_tokens_details"] is None
