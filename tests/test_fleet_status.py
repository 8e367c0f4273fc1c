"""`dqa fleet status` reads SGLang's Prometheus /metrics with a real Prometheus parser and falls
back to the decode log lines, tolerating the format drift between SGLang versions."""

from __future__ import annotations

import pytest

from dqa.regen.fleet import status as fs
from dqa.regen.servers.sglang import last_decode_stats, parse_decode_line, parse_metrics

# In the documented exposition format (SGLang production-metrics docs; names from docs/sglang.md, "Metrics");
# two TP ranks, cache sources as labels, a histogram, and a non-SGLang series to ignore.
METRICS_TEXT = """\
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="Qwen/Qwen3.6-27B",tp_rank="0",dp_rank="0"} 1200.5
sglang:gen_throughput{model_name="Qwen/Qwen3.6-27B",tp_rank="1",dp_rank="1"} 1097.31
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3.6-27B",tp_rank="0",dp_rank="0"} 24.0
sglang:num_running_reqs{model_name="Qwen/Qwen3.6-27B",tp_rank="1",dp_rank="1"} 24.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen3.6-27B",tp_rank="0",dp_rank="0"} 3.0
sglang:num_queue_reqs{model_name="Qwen/Qwen3.6-27B",tp_rank="1",dp_rank="1"} 0.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen3.6-27B",tp_rank="0",dp_rank="0"} 0.40
sglang:token_usage{model_name="Qwen/Qwen3.6-27B",tp_rank="1",dp_rank="1"} 0.44
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="Qwen/Qwen3.6-27B",tp_rank="0",dp_rank="0"} 3.61
sglang:spec_accept_length{model_name="Qwen/Qwen3.6-27B",tp_rank="1",dp_rank="1"} 3.41
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="Qwen/Qwen3.6-27B"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="Qwen/Qwen3.6-27B"} 7.557572e+06
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="Qwen/Qwen3.6-27B",cache_source="device"} 1.0e+06
sglang:cached_tokens_total{model_name="Qwen/Qwen3.6-27B",cache_source="host"} 2.5e+05
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="Qwen/Qwen3.6-27B"} 3277.0
# HELP sglang:num_aborted_requests_total Number of requests aborted.
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{model_name="Qwen/Qwen3.6-27B"} 2.0
# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="60.0",model_name="Qwen/Qwen3.6-27B"} 3000.0
sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="Qwen/Qwen3.6-27B"} 3277.0
sglang:e2e_request_latency_seconds_sum{model_name="Qwen/Qwen3.6-27B"} 163850.0
sglang:e2e_request_latency_seconds_count{model_name="Qwen/Qwen3.6-27B"} 3277.0
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 93.4
"""


def test_metrics_are_summed_over_ranks_and_ratios_averaged():
    m = parse_metrics(METRICS_TEXT)
    assert m["gen_tok_per_s"] == pytest.approx(2297.81)
    assert (m["running"], m["queued"]) == (48, 3)
    assert m["kv_usage"] == pytest.approx(0.42)
    assert m["accept_len"] == pytest.approx(3.51)
    assert m["requests_total"] == 3277 and m["aborted_total"] == 2
    assert m["prompt_tokens_total"] == 8_128_902 and m["generation_tokens_total"] == 7_557_572
    assert m["cached_tokens_total"] == 1_250_000
    assert m["mean_e2e_s"] == pytest.approx(50.0)
    assert "accept_rate" not in m  # not exposed by this server: absent, not zero


def test_counters_without_the_total_suffix_and_underscore_prefixed_names_are_read():
    text = (
        "# TYPE sglang_num_requests counter\nsglang_num_requests_total 5\n"
        "# TYPE sglang_gen_throughput gauge\nsglang_gen_throughput 12.5\n"
    )
    assert parse_metrics(text) == {"requests_total": 5, "gen_tok_per_s": 12.5}


def test_text_that_is_not_prometheus_format_raises_value_error():
    with pytest.raises(ValueError):
        parse_metrics("<html>this is not metrics</html>\n")


def test_the_documented_decode_log_line_is_parsed_field_by_field():
    line = (
        "[2026-11-30 08:01:02 TP0] Decode batch, #running-req: 48, #token: 98304, token usage: 0.42, "
        "accept len: 3.61, accept rate: 0.87, cuda graph: True, gen throughput (token/s): 2297.81, #queue-req: 0"
    )
    assert parse_decode_line(line) == {
        "running": 48, "tokens": 98304, "kv_usage": 0.42, "accept_len": 3.61, "accept_rate": 0.87,
        "gen_tok_per_s": 2297.81, "queued": 0,
    }  # fmt: skip


@pytest.mark.parametrize(
    "line, expected",
    [
        # older builds: no speculative fields, "gen throughput (token/s)" at the end
        (
            "[2025-01-10 10:00:00 TP0] Decode batch. #running-req: 12, #token: 4000, token usage: 0.05, gen throughput (token/s): 410.20, #queue-req: 1",
            {"running": 12, "tokens": 4000, "kv_usage": 0.05, "gen_tok_per_s": 410.2, "queued": 1},
        ),
        # hybrid (Mamba) models report the full-attention pool as "full token usage"
        (
            "[2026-05-01 09:00:00 DP0 TP0] Decode batch, #running-req: 80, #full token: 120000, full token usage: 0.61, mamba usage: 0.33, accept len: 3.7, gen throughput (token/s): 2448.20, #queue-req: 5",
            {"running": 80, "tokens": 120000, "kv_usage": 0.61, "accept_len": 3.7, "gen_tok_per_s": 2448.2, "queued": 5},
        ),
        # plural/underscore drift
        (
            "Decode batch, #running-reqs: 3, token usage: 0.10, accept_length: 2.5, gen throughput (tok/s): 99.0, #queue-reqs: 2",
            {"running": 3, "kv_usage": 0.10, "accept_len": 2.5, "gen_tok_per_s": 99.0, "queued": 2},
        ),
    ],
)
def test_decode_lines_of_other_versions_still_parse(line, expected):
    assert parse_decode_line(line) == expected


def test_the_latest_decode_line_of_a_long_log_wins(tmp_path):
    log = tmp_path / "gpu0.log"
    lines = [f"[2026-11-30 08:00:{i % 60:02d} TP0] Decode batch, #running-req: {i}, gen throughput (token/s): {i}.5, #queue-req: 0" for i in range(5000)]
    lines.insert(10, "[2026-11-30 07:59:00 TP0] Prefill batch, #new-seq: 4, #new-token: 8192")
    lines.append("[2026-11-30 08:05:00 TP0] INFO: 127.0.0.1 - POST /generate HTTP/1.1 200")
    log.write_text("\n".join(lines) + "\n")
    stats, when = last_decode_stats(log)
    assert stats == {"running": 4999, "gen_tok_per_s": 4999.5, "queued": 0}
    assert when == "2026-11-30 08:00:19"
    assert last_decode_stats(tmp_path / "missing.log") is None
    (tmp_path / "quiet.log").write_text("loading weights\n")
    assert last_decode_stats(tmp_path / "quiet.log") is None


def test_fleet_totals_sum_rates_and_average_ratios_over_reporting_endpoints():
    a = fs.EndpointStatus(url="a", gpu="0", up=True, source="metrics", gen_tok_per_s=2297.81, running=48, kv_usage=0.4, accept_len=3.6, requests_total=10)
    b = fs.EndpointStatus(url="b", gpu="1", up=True, source="log", gen_tok_per_s=2345.81, running=40, kv_usage=0.6)
    c = fs.EndpointStatus(url="c", gpu="2", up=False, source="none")
    t = fs.totals([a, b, c])
    assert (t["endpoints"], t["up"]) == (3, 2)
    assert t["gen_tok_per_s"] == pytest.approx(4643.62)
    assert t["running"] == 88 and t["kv_usage"] == pytest.approx(0.5)
    assert t["accept_len"] == pytest.approx(3.6) and t["requests_total"] == 10
    assert t["queued"] is None


def test_seed_per_gpu_log_rates_sum_to_about_15_900_tok_s():
    rates = [2297.81, 2345.81, 2408.41, 2359.78, 1914.37, 2200.19, 2448.20]
    statuses = [
        fs.EndpointStatus(url=str(i), gpu=str(i), up=True, source="log",
                          **{k: v for k, v in parse_decode_line(f"Decode batch, gen throughput (token/s): {r}").items()})
        for i, r in enumerate(rates)
    ]  # fmt: skip
    assert fs.totals(statuses)["gen_tok_per_s"] == pytest.approx(15_974.57)
    assert fs.totals(statuses)["gen_tok_per_s"] == pytest.approx(15_900, rel=0.01)  # the seed's "~15,900"


# ------------------------------------------------------------------------------ exit codes


def _dead_fleet(tmp_path):
    import json

    from fleet_helpers import free_port_base

    path = tmp_path / "fleet.json"
    url = f"http://127.0.0.1:{free_port_base(1)}"
    path.write_text(json.dumps({"version": 1, "engine": "sglang", "model": "m", "endpoints": [{"url": url, "gpu": "0"}]}))
    return path


def test_watch_stopped_with_ctrl_c_exits_3_while_an_endpoint_is_down(tmp_path):
    """The exit code of --watch is the state of the last refresh, as without --watch."""
    import json
    import signal
    import subprocess
    import sys

    from fleet_helpers import REPO

    fleet = _dead_fleet(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dqa.cli", "fleet", "status", "--fleet", str(fleet), "--watch", "--json", "--interval", "0.2", "--timeout", "0.5"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        first = json.loads(proc.stdout.readline())
        assert first["total"]["up"] == 0
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 3  # bounds a hang only
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_quiet_status_prints_nothing_and_exits_3_for_a_down_endpoint(cli, tmp_path):
    fleet = _dead_fleet(tmp_path)
    r = cli("fleet", "status", "--fleet", fleet, "--timeout", "0.5", "--quiet")
    assert r.exit_code == 3 and r.stdout == ""
    r = cli("fleet", "status", "--fleet", fleet, "--quiet", "--watch")
    assert r.exit_code == 2
    r = cli("fleet", "down", "--fleet", fleet, "--quiet")  # no pid recorded: nothing verifiably ours to stop
    assert r.exit_code == 3 and r.stdout == "" and "not stopped" in r.stderr
