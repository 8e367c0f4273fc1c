"""`dqa fleet up --router`, end to end with real processes: two SGLang stand-ins
(tests/servers/sglang_contract.py through the exact `python -m sglang.launch_server ...` argument
list dqa builds) and the real SGLang gateway in front of them, once as smg 1.13.0 (`smg launch`,
what `--router` starts when smg is installed) and once as sglang-router 0.3.2 (its module; `--router-gateway
sglang-router`), both Rust binaries from PyPI installed side by side (distinct modules; only their
`smg` scripts collide, which dqa does not use).
The fleet file records the router; `dqa regen --fleet` sends every row through it exactly once;
`dqa fleet status` shows the router and what its Prometheus port says about each worker;
`dqa fleet down` stops the router and the servers, leaving no process behind.

Each gateway's tests are skipped, with the reason, when its package is not installed.
"""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
from fleet_helpers import dqa, fake_sglang_python, fleet_up, process_gone, read_json, write_failing_set
from regen_helpers import read_shards
from router_helpers import GATEWAY_MISSING, gateway_params

LAUNCH = {"smg": ["-m", "smg", "launch"], "sglang-router": ["-m", "sglang_router.launch_router"]}
RELEASE = {"smg": "1.13.0", "sglang-router": "0.3.2"}  # the test extra's pins


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


@pytest.mark.parametrize("gateway", gateway_params())
def test_fleet_up_router_regen_goes_through_it_once_status_reads_its_metrics_down_stops_all(tmp_path, gateway):
    import psutil

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    model = str(qwen3_tokenizer_dir())  # a local model folder with the tokenizer the router is given
    py = fake_sglang_python(tmp_path)
    fleet = tmp_path / "fleet.json"
    r, base = fleet_up(
        "fleet", "up", "--model", model, "--gpus", "0-1", "--python", py, "--fleet", fleet, "--timeout", "60",
        "--router", "--router-gateway", gateway, "--", "--startup-delay-s", "0.5", ports=2, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "router: http://127.0.0.1:" in r.stdout and f"({gateway} {RELEASE[gateway]}, metrics http://127.0.0.1:" in r.stdout
    rec = read_json(fleet)
    eps, router = rec["endpoints"], rec["router"]
    workers = [e["url"] for e in eps]
    pids = [e["pid"] for e in eps] + [router["pid"]]
    try:
        cmd = router["cmd"]
        assert cmd[1 : 1 + len(LAUNCH[gateway])] == LAUNCH[gateway]
        assert router["gateway"] == {"name": gateway, "version": RELEASE[gateway]}
        assert cmd[cmd.index("--worker-urls") + 1 : cmd.index("--worker-urls") + 3] == workers
        assert _flag(cmd, "--policy") == "cache_aware" and _flag(cmd, "--tokenizer-path") == model
        assert _flag(cmd, "--request-timeout-secs") == "7200" and _flag(cmd, "--cb-timeout-duration-secs") == "10"
        assert router["url"] == f"http://127.0.0.1:{_flag(cmd, '--port')}" and router["url"] not in workers
        assert router["metrics_url"] == f"http://127.0.0.1:{_flag(cmd, '--prometheus-port')}"
        assert router["log"] == str(tmp_path / "fleet-logs" / "router.log")
        assert psutil.Process(router["pid"]).is_running()

        data, scan = write_failing_set(tmp_path, n=6)
        out = tmp_path / "regen"
        g = dqa("regen", data, "--fleet", fleet, "--findings", scan, "--out", out, "--max-new-tokens", "16", "--json",
                cwd=tmp_path, timeout=240)  # fmt: skip
        assert g.returncode == 0, g.stderr
        progress = json.loads(g.stdout)
        assert progress["done"] == 6 and list(progress["endpoints"]) == [router["url"]]  # the router, not the workers
        shards = read_shards(out)
        assert Counter(shards.column("id").to_pylist()) == {f"s{i}": 1 for i in range(6)}
        assert set(shards.column("endpoint").to_pylist()) == {router["url"]} and set(shards.column("attempts").to_pylist()) == {1}
        # The gateway is recognised over HTTP, its release taken from the fleet file, its table applied.
        seen = json.loads((out / "run.json").read_text())["servers"][router["url"]]["router"]
        assert (seen["gateway"], seen["release"], seen["release_from"]) == (gateway, RELEASE[gateway], "fleet file")
        assert set(seen["sampling_fields"].values()) == {"applied"} and seen["workers_answered"] == 2

        s = dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path)
        assert s.returncode == 0, s.stderr
        st = json.loads(s.stdout)
        rs = st["router"]
        assert (rs["url"], rs["up"], rs["ready"], rs["process"], rs["source"]) == (router["url"], True, True, "running", "metrics")
        assert rs["gateway"] == {"name": gateway, "version": RELEASE[gateway]}
        assert [(w["url"], w["healthy"], w["circuit"]) for w in rs["workers"]] == [(u, True, "closed") for u in sorted(workers)]
        assert rs["retries_total"] == 0 and rs["responses"].get("200") == 6 and set(rs["responses"]) == {"200"}
        # Each row reached one worker exactly once: the workers' own request counters sum to 6.
        assert st["total"]["requests_total"] == 6 and st["total"]["up"] == 2
        table = dqa("fleet", "status", "--fleet", fleet, cwd=tmp_path, env={"COLUMNS": "200"})
        assert table.returncode == 0 and f"router {router['url']} ({gateway} {RELEASE[gateway]}): up, ready" in table.stdout
        assert f"worker {workers[0]}: healthy, circuit closed" in table.stdout

        # `dqa plan --calibrate --fleet` sends where regen does: 3 more requests through the router.
        c = dqa("plan", "--calibrate", "--fleet", fleet, "--dataset", data, "--findings", scan, "--sample", "3",
                "--max-new-tokens", "16", "--calibrate-out", tmp_path / "calibrate", "--json", cwd=tmp_path, timeout=240)  # fmt: skip
        assert c.returncode == 0, c.stderr
        assert json.loads(c.stdout)["calibration"]["done"] == 3
        assert set(read_shards(tmp_path / "calibrate").column("endpoint").to_pylist()) == {router["url"]}
        rs = json.loads(dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path).stdout)["router"]
        assert rs["responses"] == {"200": 9}

        # Both workers answer 500 now: the router retries each request across them and gives up;
        # status reads the retries, the exhausted requests and the 500s off its metrics port.
        for u in workers:
            assert httpx.post(u + "/_control", json={"error_share": 1.0, "error_statuses": [500]}, timeout=5).status_code == 200
        for i in range(3):
            reply = httpx.post(router["url"] + "/generate", json={"input_ids": [151644, 872, 198, 500 + i],
                               "sampling_params": {"max_new_tokens": 4}}, timeout=30)  # fmt: skip
            assert reply.status_code == 500
        rs = json.loads(dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path).stdout)["router"]
        assert rs["retries_total"] > 0 and rs["responses"]["500"] > 3
        # sglang-router counts each request that ran out of retries; smg 1.13.0 leaves that counter at 0 (as observed).
        assert rs["retries_exhausted_total"] == {"sglang-router": 3, "smg": 0}[gateway]
    finally:
        d = dqa("fleet", "down", "--fleet", fleet, "--json", "--grace", "20", cwd=tmp_path, timeout=120)
    assert d.returncode == 0, d.stderr
    down = json.loads(d.stdout)
    assert down["router"]["outcome"] in ("stopped", "killed")
    assert {e["outcome"] for e in down["endpoints"]} <= {"stopped", "killed"}
    assert all(process_gone(pid) for pid in pids)
    s = dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path)
    assert s.returncode == 3 and json.loads(s.stdout)["router"]["up"] is False


def test_fleet_up_router_refuses_a_model_that_is_not_a_local_folder_before_starting_anything(tmp_path):
    py = fake_sglang_python(tmp_path)
    r = dqa("fleet", "up", "--model", "Qwen/Qwen3-8B", "--gpus", "0", "--python", py, "--fleet", tmp_path / "f.json",
            "--router", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and "--router needs the model as a local folder" in r.stderr
    assert not (tmp_path / "f.json").exists() and not (tmp_path / "fleet-logs").exists()


def test_fleet_up_router_with_engine_transformers_is_refused_in_one_line_naming_why_before_anything_starts(tmp_path):
    """sglang-router cannot front `transformers serve` (tests/test_fleet_transformers.py shows it
    with both real programs): `fleet up --router --engine transformers`, and its --dry-run, stop
    at once with exit 2 and one line that names the reason and what to do instead."""
    model = tmp_path / "tiny"
    model.mkdir()
    for dry in ([], ["--dry-run"]):
        r = dqa("fleet", "up", "--engine", "transformers", "--model", model, "--gpus", "0-1", "--fleet", tmp_path / "f.json",
                "--router", *dry, "--", "--device", "cpu", cwd=tmp_path)  # fmt: skip
        assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "--router with --engine transformers: sglang-router (0.3.2) adds SGLang-only fields (ignore_eos," in lines[0]
        assert "transformers serve answers each with 422 'Unexpected fields in the request'" in lines[0]
        assert lines[0].endswith("start the fleet without --router (dqa regen --fleet spreads the rows over its servers itself)")
    assert not (tmp_path / "f.json").exists() and not (tmp_path / "f-logs").exists()


def test_bad_router_options_are_usage_errors_before_anything_starts(tmp_path):
    from dqa.tokenizer_files import qwen3_tokenizer_dir

    py = fake_sglang_python(tmp_path)
    for flags, message in ((["--router-policy", "fastest"], "--router-policy 'fastest': expected one of cache_aware"),
                           (["--router-port", "70000"], "--router-port 70000: expected 0")):  # fmt: skip
        r = dqa("fleet", "up", "--model", qwen3_tokenizer_dir(), "--gpus", "0", "--python", py, "--fleet", tmp_path / "f.json",
                "--router", *flags, cwd=tmp_path)  # fmt: skip
        assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "f.json").exists()


def test_a_fleet_file_with_a_router_round_trips_and_regen_sends_to_the_router(tmp_path):
    from dqa.regen.fleet import file as ff

    eps = [ff.Endpoint(url=f"http://10.0.0.5:3000{i}", gpu=str(i), pid=100 + i) for i in range(2)]
    router = ff.Endpoint(url="http://10.0.0.5:41234", pid=200, started=1796024101.5, host="10.0.0.5", port=41234,
                         cmd=["python", "-m", "sglang_router.launch_router", "--api-key", "s3cret"],
                         metrics_url="http://10.0.0.5:41235")  # fmt: skip
    path = ff.write_fleet(tmp_path / "fleet.json", ff.Fleet("sglang", "sglang", "/m", eps, router=router))
    raw = read_json(path)
    assert raw["router"]["metrics_url"] == "http://10.0.0.5:41235" and "s3cret" not in path.read_text()
    assert "metrics_url" not in raw["endpoints"][0]  # endpoints keep their old shape
    back = ff.read_fleet(path)
    assert back.router.url == router.url and back.router.metrics_url == router.metrics_url and back.router.pid == 200
    assert back.send_urls == ["http://10.0.0.5:41234"] and back.urls == [e.url for e in eps] and back.gpu_count == 2
    plain = ff.read_fleet(ff.write_fleet(tmp_path / "plain.json", ff.Fleet("sglang", "sglang", "/m", eps)))
    assert plain.router is None and plain.send_urls == plain.urls


@pytest.mark.parametrize(
    "router, message",
    [("http://x:1", "'router' must be an object"), ({"url": "x:1"}, "router.url must be an http(s) URL"),
     ({"url": "http://x:1", "metrics_url": 5}, "router.metrics_url must be an http(s) URL"),
     ({"url": "http://x:1", "pid": -1}, "router.pid must be a positive integer")],
)  # fmt: skip
def test_a_malformed_router_record_is_an_input_error_naming_the_field(tmp_path, router, message):
    from dqa.errors import InputError
    from dqa.regen.fleet import file as ff

    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"version": 1, "model": "/m", "endpoints": [{"url": "http://x:2"}], "router": router}))
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ff.read_fleet(path)


# Lines as sglang-router 0.3.2's Prometheus port printed them (both workers answering 500: the
# router retried, one circuit opened); one worker's health set to 0 and the 503 line added by hand.
METRICS = """\
smg_worker_health{worker="http://127.0.0.1:33639"} 1
smg_worker_health{worker="http://127.0.0.1:42427"} 0
smg_worker_cb_state{worker="http://127.0.0.1:33639"} 0
smg_worker_cb_state{worker="http://127.0.0.1:42427"} 1
smg_worker_requests_active{worker="http://127.0.0.1:33639"} 3
smg_worker_retries_total{worker_type="regular",endpoint="generate"} 12
smg_worker_retries_exhausted_total{worker_type="regular",endpoint="generate"} 3
smg_router_upstream_responses_total{router_type="http",status_code="200",error_code=""} 9
smg_router_upstream_responses_total{router_type="http",status_code="503",error_code="no_available_workers"} 2
"""


def test_router_metrics_give_each_workers_health_circuit_and_the_retries():
    from dqa.regen.servers.sglang_router import RouterStatus, parse_metrics
    from dqa.reports.fleet_table import router_lines

    st = RouterStatus(url="http://r:1", metrics_url="http://r:2", up=True, ready=True)
    parse_metrics(METRICS, st)
    assert [(w.url[-5:], w.healthy, w.circuit, w.active) for w in st.workers] == [("33639", True, "closed", 3), ("42427", False, "open", None)]
    assert (st.retries_total, st.retries_exhausted_total, st.responses) == (12, 3, {"200": 9, "503": 2})
    lines = router_lines(st)
    assert lines[0] == "router http://r:1: up, ready" and "UNHEALTHY, circuit open" in lines[2]
    assert lines[-1] == "  retries 12 (exhausted 3); upstream replies 200: 9, 503: 2"


def _refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=2)
    except httpx.TransportError:
        return True
    return False


@pytest.mark.skipif(GATEWAY_MISSING["sglang-router"] is not None, reason=GATEWAY_MISSING["sglang-router"] or "")
def test_a_router_that_is_not_ready_in_time_fails_the_start_and_everything_is_stopped(tmp_path):
    """sglang-router: it takes ~0.5 s to see a healthy worker, past the 0.01 s given. (smg 1.13.0
    registers its workers before it listens, so its first /readiness is already 200: it cannot be
    late here.)"""
    import re

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    py = fake_sglang_python(tmp_path)
    fleet = tmp_path / "fleet.json"
    r, base = fleet_up(
        "fleet", "up", "--model", qwen3_tokenizer_dir(), "--gpus", "0-1", "--python", py, "--fleet", fleet,
        "--timeout", "60", "--router", "--router-gateway", "sglang-router", "--router-timeout", "0.01", ports=2, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 3 and "not ready after" in r.stderr and "router.log" in r.stderr, r.stderr
    assert not fleet.exists()  # nothing left running for it to record
    log = (tmp_path / "fleet-logs" / "router.log").read_text()
    router_port = int(re.search(r"--port (\d+)", log).group(1))
    assert all(_refused(f"http://127.0.0.1:{p}") for p in (base, base + 1, router_port))


def _hide(monkeypatch, *modules: str) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in modules else real(name, *a))


@pytest.mark.skipif(GATEWAY_MISSING["smg"] or GATEWAY_MISSING["sglang-router"], reason="needs both smg and sglang-router installed")
def test_router_starts_smg_when_it_is_installed_else_sglang_routers_module(monkeypatch):
    from dqa.regen.fleet.router import find_gateway

    assert (find_gateway().name, find_gateway().launch) == ("smg", ("-m", "smg", "launch"))
    assert find_gateway("sglang-router").version == "0.3.2"
    _hide(monkeypatch, "smg")
    assert (find_gateway().name, find_gateway().launch) == ("sglang-router", ("-m", "sglang_router.launch_router"))


def test_without_either_gateway_package_router_is_refused_with_the_install_line(monkeypatch):
    from dqa.errors import UsageError
    from dqa.regen.fleet import router as fr
    from dqa.tokenizer_files import qwen3_tokenizer_dir

    _hide(monkeypatch, "smg", "sglang_router")
    with pytest.raises(UsageError, match=r"neither smg nor sglang-router is installed .*pip install smg==1.13.0 \(or sglang-router==0.3.2\)"):
        fr.check_router("cache_aware", str(qwen3_tokenizer_dir()))
    with pytest.raises(UsageError, match=r"the smg package is not installed .*pip install smg"):
        fr.check_router("cache_aware", str(qwen3_tokenizer_dir()), gateway="smg")
    with pytest.raises(UsageError, match=r"--router-gateway 'nginx': expected auto, smg or sglang-router"):
        fr.find_gateway("nginx")


def test_plan_calibrate_sends_to_the_router_a_fleet_file_records_not_to_its_servers(tmp_path):
    """The fleet file's servers are dead ports; its router answers (an SGLang stand-in standing in
    for it): calibration asks the router whether it is up and sends every prompt to it, as
    `dqa regen --fleet` does."""
    from fleet_helpers import free_port_base
    from servers.sglang_contract import StubServer

    from dqa.regen.fleet import file as ff
    from dqa.regen.plan.calibrate import calibrate

    base = free_port_base(2)
    eps = [ff.Endpoint(url=f"http://127.0.0.1:{base + i}", gpu=str(i)) for i in range(2)]  # nothing listens there
    front = StubServer(tmp_path / "router").start()
    try:
        fleet = ff.write_fleet(tmp_path / "fleet.json", ff.Fleet("sglang", "sglang", "/m", eps, router=ff.Endpoint(url=front.url)))
        data, scan = write_failing_set(tmp_path, n=4)
        cal = calibrate(data, scan / "findings.parquet", 4, fleet, [], out=tmp_path / "run", max_new_tokens=16, down_deadline=10.0)
    finally:
        front.stop()
    assert (cal.done, cal.failed, cal.endpoints) == (4, 0, 1)
    rows = read_shards(tmp_path / "run").to_pylist()
    assert sorted(r["row"] for r in rows) == [0, 1, 2, 3] and {r["endpoint"] for r in rows} == {front.url}
