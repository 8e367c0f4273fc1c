"""The SGLang path of `dqa fleet up -> status -> down`, end to end with real processes: each
"server" is the SGLang-contract stub (tests/servers/sglang_contract.py) started through the
exact `python -m sglang.launch_server ...` argument list dqa builds (a stand-in Python runs
the stub with those flags), so health_generate waiting, /metrics, the decode log fallback,
failure reporting and stopping are all exercised without a GPU."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from fleet_helpers import dqa, fake_sglang_python, fleet_up, free_port_base, port_race, process_gone, read_json


def _generate(url: str, n: int, max_new_tokens: int = 24) -> None:
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            r = client.post(
                url + "/generate",
                json={"input_ids": [151644, 872, 198, 100 + i], "sampling_params": {"max_new_tokens": max_new_tokens}, "rid": f"t{i}"},
            )
            assert r.status_code == 200, r.text


def test_up_waits_for_health_generate_status_reads_metrics_and_down_stops_exactly_the_fleet(tmp_path):
    py = fake_sglang_python(tmp_path)
    fleet = tmp_path / "fleet.json"
    r, base = fleet_up(
        "fleet", "up", "--model", "Qwen/Qwen3-8B", "--gpus", "0-1", "--python", py,
        "--fleet", fleet, "--timeout", "60", "--", "--startup-delay-s", "1.5", "--log-interval-s", "0.2",
        ports=2, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rec = read_json(fleet)
    assert rec["engine"] == "sglang" and rec["protocol"] == "sglang" and rec["model"] == "Qwen/Qwen3-8B"
    eps = rec["endpoints"]
    assert [e["url"] for e in eps] == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
    assert [e["gpu"] for e in eps] == ["0", "1"]
    assert all(e["cmd"][:3] == [str(py), "-m", "sglang.launch_server"] and "--enable-metrics" in e["cmd"] for e in eps)
    try:
        # /health_generate was 503 for the first 1.5 s: up returned only once both generate.
        for e in eps:
            assert httpx.get(e["url"] + "/health_generate", timeout=5).status_code == 200
        _generate(eps[0]["url"], 3)
        _generate(eps[1]["url"], 2)
        time.sleep(0.5)
        s = dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path)
        assert s.returncode == 0, s.stderr
        st = json.loads(s.stdout)
        assert [e["source"] for e in st["endpoints"]] == ["metrics", "metrics"]
        assert [e["requests_total"] for e in st["endpoints"]] == [3, 2]
        assert st["total"]["requests_total"] == 5 and st["total"]["up"] == 2
        assert st["total"]["generation_tokens_total"] == sum(e["generation_tokens_total"] for e in st["endpoints"]) > 0
        assert all(e["process"] == "running" for e in st["endpoints"])
        table = dqa("fleet", "status", "--fleet", fleet, cwd=tmp_path, env={"COLUMNS": "200"})
        assert table.returncode == 0 and "2/2" in table.stdout and f"127.0.0.1:{base + 1}" in table.stdout

        again = dqa("fleet", "up", "--model", "m", "--gpus", "0", "--python", py, "--fleet", fleet, cwd=tmp_path)
        assert again.returncode == 2 and "still running" in again.stderr
    finally:
        d = dqa("fleet", "down", "--fleet", fleet, "--json", cwd=tmp_path)
    assert d.returncode == 0, d.stderr
    assert [e["outcome"] for e in json.loads(d.stdout)["endpoints"]] == ["stopped", "stopped"]
    assert all(process_gone(e["pid"]) for e in eps)
    assert fleet.exists() and (tmp_path / "fleet-logs" / "gpu0.log").exists()  # down deletes nothing
    s = dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path)
    assert s.returncode == 3
    assert json.loads(s.stdout)["total"]["up"] == 0


def test_without_metrics_status_falls_back_to_the_latest_decode_log_line(tmp_path):
    py = fake_sglang_python(tmp_path)
    fleet = tmp_path / "fleet.json"
    r, _ = fleet_up(
        "fleet", "up", "--model", "m", "--gpus", "3", "--python", py, "--fleet", fleet,
        "--no-metrics", "--timeout", "60", "--", "--log-interval-s", "0.1", "--per-token-s", "0.02",
        ports=1, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    try:
        url = read_json(fleet)["endpoints"][0]["url"]
        assert httpx.get(url + "/metrics", timeout=5).status_code == 404
        _generate(url, 2, max_new_tokens=20)  # ~0.4 s each: several decode log lines
        s = dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path)
        assert s.returncode == 0, s.stderr
        (ep,) = json.loads(s.stdout)["endpoints"]
        assert ep["source"] == "log" and ep["gpu"] == "3"
        assert ep["gen_tok_per_s"] is not None and ep["accept_len"] is not None and ep["log_time"]
        assert "--enable-metrics" in ep["note"]
    finally:
        dqa("fleet", "down", "--fleet", fleet, cwd=tmp_path)


def test_a_server_that_dies_at_start_is_named_with_its_log_tail_and_the_others_are_stopped(tmp_path):
    py = fake_sglang_python(tmp_path, fail_gpu="1", fail_once_ready=tmp_path / "fleet-logs" / "gpu0.log")
    fleet = tmp_path / "fleet.json"
    r, base = fleet_up("fleet", "up", "--model", "m", "--gpus", "0-1", "--python", py, "--fleet", fleet,
                       "--timeout", "60", ports=2, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 3
    err = r.stderr.splitlines()
    assert err[-1].startswith("dqa: error: server on GPU 1 ") and "exited with code 1" in err[-1]
    assert any("gpu1| torch.OutOfMemoryError: CUDA out of memory" in ln for ln in err)
    assert not fleet.exists()
    log0 = (tmp_path / "fleet-logs" / "gpu0.log").read_text()
    assert "SGLANG_CONTRACT_READY" in log0  # GPU 0's server had started ...
    with pytest.raises(httpx.HTTPError):  # ... and was stopped
        httpx.get(f"http://127.0.0.1:{base}/health", timeout=2)


def test_a_server_that_never_becomes_healthy_times_out_naming_its_gpu(tmp_path):
    py = fake_sglang_python(tmp_path)
    r, base = fleet_up("fleet", "up", "--model", "m", "--gpus", "5", "--python", py,
                       "--fleet", tmp_path / "fleet.json", "--timeout", "2", "--", "--startup-delay-s", "60",
                       ports=1, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 3
    assert f"server on GPU 5 (http://127.0.0.1:{base}/health_generate) not healthy after 2 s" in r.stderr
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{base}/health", timeout=2)


def test_a_busy_port_is_refused_before_anything_starts(tmp_path):
    import socket

    py = fake_sglang_python(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = dqa("fleet", "up", "--model", "m", "--gpus", "0", "--python", py, "--port-base", port - 0,
                "--fleet", tmp_path / "fleet.json", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and f"port {port} for GPU 0" in r.stderr
    assert not (tmp_path / "fleet-logs").exists()


def test_interrupting_up_while_it_waits_stops_the_servers_it_started(tmp_path):
    import signal
    import subprocess
    import sys

    py = fake_sglang_python(tmp_path)
    fleet = tmp_path / "fleet.json"
    for tries in range(3):
        base = free_port_base(2)
        up = subprocess.Popen(
            [sys.executable, "-m", "dqa.cli", "fleet", "up", "--model", "m", "--gpus", "0-1", "--python", str(py),
             "--port-base", str(base), "--fleet", str(fleet), "--", "--startup-delay-s", "60"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120  # bounds a hang only
            while not fleet.exists() and up.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if up.poll() is not None:  # ended before the signal: only a port taken by another process is retried
                _, err = up.communicate()
                assert port_race(err) and tries < 2, f"fleet up ended by itself (exit {up.returncode}): {err}"
                continue
            pids = [e["pid"] for e in read_json(fleet)["endpoints"]]  # recorded before the wait
            up.send_signal(signal.SIGTERM)
            _, err = up.communicate(timeout=60)
            break
        finally:
            if up.poll() is None:
                up.kill()
    assert up.returncode == 3 and "interrupted while waiting for the fleet; servers stopped" in err, err
    assert all(process_gone(p) for p in pids)
    assert not fleet.exists()
