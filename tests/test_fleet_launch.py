"""`dqa fleet up` builds the SGLang command lines of docs/sglang.md exactly, as argument lists an
operator can also run unchanged from `--dry-run`; staging copies a model once; `fleet down`
signals only the processes dqa started."""

from __future__ import annotations

import collections
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dqa.errors import InputError, UsageError
from dqa.regen.fleet import file as ff
from dqa.regen.fleet import launch as fl
from dqa.regen.fleet import stage as fst
from dqa.regen.fleet.spec import FleetSpec, parse_gpus
from dqa.regen.servers.sglang import SglangOptions, is_hybrid_mamba

MODEL = "/dev/shm/Qwen3.6-27B"


SEED_SGLANG = "0.5.11"  # the release the seed's fleet ran: --mamba-scheduler-strategy still exists there


def golden_sglang_mtp(gpu: int) -> list[str]:
    """The command the seed's operator typed for GPU ``gpu`` on SGLang 0.5.11 (docs/sglang.md, "Launch")."""
    return [
        "python3", "-m", "sglang.launch_server",
        "--model-path", MODEL,
        "--host", "127.0.0.1",
        "--port", str(30000 + gpu),
        "--context-length", "8192",
        "--max-running-requests", "48",
        "--reasoning-parser", "qwen3",
        "--enable-metrics",
        "--speculative-algorithm", "NEXTN",
        "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
        "--mamba-scheduler-strategy", "extra_buffer",
        "--kv-cache-dtype", "fp8_e4m3",
    ]  # fmt: skip


def seven_gpu_spec(**kw) -> FleetSpec:
    base = dict(
        model=MODEL, gpus=parse_gpus("0-6"), engine_options=SglangOptions(mtp=True, hybrid=True, sglang_version=SEED_SGLANG),
        python="python3", extra=["--kv-cache-dtype", "fp8_e4m3"], log_dir=Path("logs"),
    )  # fmt: skip
    base.update(kw)
    return FleetSpec(**base)


def test_seven_gpu_sglang_mtp_fleet_matches_the_golden_argument_lists():
    cmds = fl.build_commands(seven_gpu_spec())
    assert [c.gpu for c in cmds] == [str(i) for i in range(7)]
    for i, c in enumerate(cmds):
        assert c.argv == golden_sglang_mtp(i)
        assert c.env == {"CUDA_VISIBLE_DEVICES": str(i)}
        assert c.url == f"http://127.0.0.1:{30000 + i}"
        assert c.log == Path("logs") / f"gpu{i}.log"


def test_dry_run_prints_lines_that_split_back_into_the_golden_lists(cli, tmp_path):
    r = cli(
        "fleet", "up", "--model", MODEL, "--gpus", "0-6", "--mtp", "--mamba-extra-buffer", "on", "--sglang-version", SEED_SGLANG,
        "--python", "python3", "--log-dir", "logs", "--fleet", str(tmp_path / "fleet.json"), "--dry-run",
        "--", "--kv-cache-dtype", "fp8_e4m3",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    server_lines = [ln for ln in r.stdout.splitlines() if "sglang.launch_server" in ln]
    assert len(server_lines) == 7
    for i, line in enumerate(server_lines):
        words = shlex.split(line)
        assert words[0] == f"CUDA_VISIBLE_DEVICES={i}"
        assert words[1:-4] == golden_sglang_mtp(i)
        assert words[-4:] == [">", f"logs/gpu{i}.log", "2>&1", "&"]
    assert "mkdir -p logs" in r.stdout
    assert not (tmp_path / "fleet.json").exists(), "--dry-run must start nothing and write nothing"


def test_mtp_adds_extra_buffer_only_for_hybrid_mamba_models(tmp_path):
    hybrid = tmp_path / "hybrid"
    hybrid.mkdir()
    (hybrid / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"]}))
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}))
    assert is_hybrid_mamba(str(hybrid)) and not is_hybrid_mamba(str(dense))

    def argv(model, **kw):
        spec = FleetSpec(model=str(model), gpus=["0"], python="python3", engine_options=SglangOptions(**{"sglang_version": SEED_SGLANG, **kw}))
        return fl.build_commands(spec)[0].argv

    assert argv(hybrid, mtp=True)[-2:] == ["--mamba-scheduler-strategy", "extra_buffer"]
    assert "--mamba-scheduler-strategy" not in argv(dense, mtp=True)
    assert "--mamba-scheduler-strategy" not in argv(hybrid, mtp=True, mamba_extra_buffer="off")
    assert "--speculative-algorithm" not in argv(hybrid)
    assert argv(dense, mtp=True, mamba_extra_buffer="on")[-1] == "extra_buffer"
    # The flag follows the SGLang release (docs/sglang.md, "Launch"): renamed in 0.5.14, gone from 0.5.20 (its
    # default `auto` picks extra_buffer); without a version, the newest known release.
    assert argv(hybrid, mtp=True, sglang_version="0.5.13")[-2:] == ["--mamba-scheduler-strategy", "extra_buffer"]
    assert argv(hybrid, mtp=True, sglang_version="0.5.14")[-2:] == ["--mamba-radix-cache-strategy", "extra_buffer"]
    assert argv(hybrid, mtp=True, sglang_version="0.5.17")[-2:] == ["--mamba-radix-cache-strategy", "extra_buffer"]
    for newer in ("0.5.20", "0.5.23", None):
        got = argv(hybrid, mtp=True, sglang_version=newer)
        assert got[-2:] == ["--speculative-num-draft-tokens", "4"] and not any("mamba" in a for a in got)


def test_without_mtp_the_command_is_the_plain_data_parallel_server():
    spec = FleetSpec(model="Qwen/Qwen3-8B", gpus=["3"], python="python3", port_base=31000)
    assert fl.build_commands(spec)[0].argv == [
        "python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--host", "127.0.0.1",
        "--port", "31000", "--context-length", "8192", "--max-running-requests", "48",
        "--reasoning-parser", "qwen3", "--enable-metrics",
    ]  # fmt: skip


def test_transformers_engine_runs_transformers_serve_next_to_the_python(tmp_path):
    spec = FleetSpec(model="/m", gpus=["0", "1"], engine="transformers", port_base=18000, extra=["--device", "cpu"])
    cmds = fl.build_commands(spec)
    assert [c.argv[1:] for c in cmds] == [
        ["serve", "/m", "--host", "127.0.0.1", "--port", str(p), "--device", "cpu"] for p in (18000, 18001)
    ]
    assert Path(cmds[0].argv[0]).name == "transformers"
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in cmds] == ["0", "1"]


@pytest.mark.parametrize(
    "text, gpus",
    [("0-6", [str(i) for i in range(7)]), ("0,2,5", ["0", "2", "5"]), ("0-1,6", ["0", "1", "6"]), ("4", ["4"])],
)
def test_gpu_lists(text, gpus):
    assert parse_gpus(text) == gpus


@pytest.mark.parametrize("text", ["", "a", "3-1", "0-1,1", "-1"])
def test_bad_gpu_lists_are_usage_errors(text):
    with pytest.raises(UsageError, match="--gpus"):
        parse_gpus(text)


def test_model_path_with_spaces_and_shell_metacharacters_reaches_the_server_intact(tmp_path):
    """Run the --dry-run script with bash: each fake server records the argv and GPU it got."""
    model = tmp_path / "my model; touch PWNED $(touch PWNED2) 'q' \"dq\" `x` &"
    model.mkdir()
    (model / "config.json").write_text("{}")
    fake = tmp_path / "fake python"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print(json.dumps({'gpu': os.environ['CUDA_VISIBLE_DEVICES'], 'argv': sys.argv[1:]}))\n"
    )
    fake.chmod(0o755)
    logs = tmp_path / "logs dir"
    r = subprocess.run(
        [sys.executable, "-m", "dqa.cli", "fleet", "up", "--model", str(model), "--gpus", "0-1", "--python", str(fake),
         "--log-dir", str(logs), "--fleet", str(tmp_path / "f.json"), "--dry-run", "--", "--served-model-name", "a b"],
        capture_output=True, text=True, cwd=tmp_path, check=True,
    )  # fmt: skip
    script = tmp_path / "up.sh"
    script.write_text(r.stdout + "wait\n")
    subprocess.run(["bash", str(script)], cwd=tmp_path, check=True, timeout=60)
    spec = FleetSpec(model=str(model), gpus=["0", "1"], python=str(fake), extra=["--served-model-name", "a b"], log_dir=logs)
    for c in fl.build_commands(spec):
        got = json.loads((logs / f"gpu{c.gpu}.log").read_text())
        assert got == {"gpu": c.gpu, "argv": c.argv[1:]}
        assert got["argv"][got["argv"].index("--model-path") + 1] == str(model)
    assert not list(tmp_path.glob("PWNED*")), "a shell metacharacter in the model path was executed"


# ------------------------------------------------------------------------------ staging


def _model_dir(root: Path) -> Path:
    m = root / "src" / "Qwen3-Tiny"
    (m / "sub").mkdir(parents=True)
    (m / "config.json").write_text('{"model_type": "qwen3"}')
    (m / "model.safetensors").write_bytes(os.urandom(300_000))
    (m / "sub" / "tokenizer.json").write_text("{}")
    return m


def test_staging_copies_the_model_once_and_reports_progress(tmp_path):
    src = _model_dir(tmp_path)
    seen = []
    dest, copied = fst.stage_model(src, tmp_path / "shm", lambda d, t: seen.append((d, t)))
    assert copied and dest == (tmp_path / "shm" / "Qwen3-Tiny").resolve()
    for rel in ("config.json", "model.safetensors", "sub/tokenizer.json"):
        assert (dest / rel).read_bytes() == (src / rel).read_bytes()
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    assert seen[-1] == (total, total)
    assert fst.stage_model(src, tmp_path / "shm") == (dest, False)  # identical copy: skipped
    (src / "config.json").write_text('{"model_type": "qwen3", "changed": true}')
    assert fst.stage_model(src, tmp_path / "shm") == (dest, True)  # source changed: copied again
    assert "changed" in (dest / "config.json").read_text()


def test_staging_refuses_a_foreign_folder_and_a_full_disk(tmp_path, monkeypatch):
    src = _model_dir(tmp_path)
    foreign = tmp_path / "shm" / "Qwen3-Tiny"
    foreign.mkdir(parents=True)
    (foreign / "keep.txt").write_text("not ours")
    with pytest.raises(InputError, match="not a dqa copy"):
        fst.stage_model(src, tmp_path / "shm")
    assert (foreign / "keep.txt").exists()

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(fst.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(InputError, match=r"needs 0\.00 GiB .* only 0\.00 GiB free"):
        fst.stage_model(src, tmp_path / "ram")
    assert not (tmp_path / "ram" / "Qwen3-Tiny").exists()


def test_dry_run_with_stage_copies_nothing_and_points_servers_at_the_copy(cli, tmp_path):
    src = _model_dir(tmp_path)
    r = cli("fleet", "up", "--model", str(src), "--gpus", "0", "--stage", str(tmp_path / "shm"), "--python", "python3", "--dry-run")
    assert r.exit_code == 0, r.output
    assert f"cp -a {src}/. {tmp_path / 'shm' / 'Qwen3-Tiny'}/" in r.stdout
    assert f"--model-path {tmp_path / 'shm' / 'Qwen3-Tiny'}" in r.stdout
    assert not (tmp_path / "shm").exists()


# ------------------------------------------------------------------------------ fleet file


def test_fleet_file_round_trips_and_never_holds_an_api_key(tmp_path):
    ep = ff.Endpoint(
        url="http://10.0.0.5:30000", gpu="0", pid=4242, log="logs/gpu0.log", host="10.0.0.5", port=30000,
        cmd=["python", "-m", "sglang.launch_server", "--api-key", "sk-secret", "--admin-api-key=adm1n"], started=12.5,
    )  # fmt: skip
    path = ff.write_fleet(tmp_path / "fleet.json", ff.Fleet(engine="sglang", protocol="sglang", model="/m", endpoints=[ep]))
    text = path.read_text()
    assert "sk-secret" not in text and "adm1n" not in text
    back = ff.read_fleet(path)
    assert back.urls == ["http://10.0.0.5:30000"]
    assert back.endpoints[0].cmd[-2:] == ["***", "--admin-api-key=***"]
    assert (back.endpoints[0].pid, back.endpoints[0].started, back.endpoints[0].port) == (4242, 12.5, 30000)
    assert back.log_path(back.endpoints[0]) == tmp_path / "logs" / "gpu0.log"
    obj = json.loads(text)
    assert {"version", "engine", "protocol", "model", "created_at", "endpoints"} <= obj.keys()


@pytest.mark.parametrize(
    "obj, message",
    [
        ("[]", "expected a JSON object"),
        ('{"model": "m", "endpoints": []}', "'endpoints' must be a non-empty list"),
        ('{"model": "m", "endpoints": [{"url": "ftp://x"}]}', r"endpoints\[0\].url"),
        ('{"model": "m", "engine": "vllm", "endpoints": [{"url": "http://x"}]}', "engine 'vllm'"),
        ('{"endpoints": [{"url": "http://x"}]}', "'model'"),
        ("{not json", "invalid JSON"),
    ],
)
def test_malformed_fleet_files_are_input_errors_naming_the_field(tmp_path, obj, message):
    (tmp_path / "fleet.json").write_text(obj)
    with pytest.raises(InputError, match=message):
        ff.read_fleet(tmp_path / "fleet.json")


# ------------------------------------------------------------------------------ stopping


def _sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    import psutil

    return proc, psutil.Process(proc.pid).create_time()


def test_down_signals_a_recorded_pid_only_while_it_is_the_process_dqa_started():
    proc, started = _sleeper()
    try:
        impostor = ff.Endpoint(url="http://x:1", pid=proc.pid, started=started - 100.0, cmd=["python"])
        assert fl.stop_endpoint(impostor, grace=1).startswith("skipped: ")
        time.sleep(0.2)
        assert proc.poll() is None, "a pid that is not ours was signalled"
        ours = ff.Endpoint(url="http://x:1", pid=proc.pid, started=started)
        assert fl.stop_endpoint(ours, grace=5) == "stopped"
        assert proc.wait(timeout=5) == -15
        assert fl.stop_endpoint(ours, grace=1) == "not running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_down_kills_a_server_that_ignores_sigterm_after_the_grace_period():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        proc.stdout.readline()
        import psutil

        ep = ff.Endpoint(url="http://x:1", pid=proc.pid, started=psutil.Process(proc.pid).create_time())
        assert fl.stop_endpoint(ep, grace=0.5) == "killed"
        assert proc.wait(timeout=5) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_pid_recorded_for_another_machine_is_never_signalled_here():
    proc, started = _sleeper()
    try:
        remote = ff.Endpoint(url="http://10.99.0.5:30000", host="10.99.0.5", pid=proc.pid, started=started)
        assert fl.stop_endpoint(remote, grace=1) == "skipped: its host 10.99.0.5 is not this machine (run dqa fleet down there)"
        assert proc.poll() is None
        assert fl.is_local_host("127.0.0.1") and fl.is_local_host(fl.advertised_host("0.0.0.0", None))
    finally:
        proc.kill()
        proc.wait()


def _stubborn():
    """A process that ignores SIGTERM, and its Endpoint record."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    proc.stdout.readline()
    return proc, ff.Endpoint(url="http://127.0.0.1:1", gpu="0", pid=proc.pid, started=psutil.Process(proc.pid).create_time())


def test_a_server_that_survives_sigkill_is_reported_not_stopped_and_down_exits_3(cli, tmp_path, monkeypatch):
    """A process stuck in the kernel (a hung GPU driver) outlives SIGKILL; here the kill is
    swallowed so the process really stays alive. `fleet down` must not claim it was killed."""
    import psutil

    monkeypatch.setattr(psutil.Process, "kill", lambda self: None)
    monkeypatch.setattr(fl, "KILL_WAIT_S", 0.3)
    proc, ep = _stubborn()
    try:
        outcome = fl.stop_endpoint(ep, grace=0.3)
        assert outcome == f"not stopped: pid {proc.pid} still running after SIGKILL"
        assert proc.poll() is None and not fl.stopped(outcome)
        ff.write_fleet(tmp_path / "fleet.json", ff.Fleet(engine="sglang", protocol="sglang", model="/m", endpoints=[ep]))
        r = cli("fleet", "down", "--fleet", tmp_path / "fleet.json", "--grace", "0.3")
        assert r.exit_code == 3
        assert "not stopped" in r.stdout and "1 server(s) not stopped" in r.stderr
    finally:
        proc.send_signal(9)
        proc.wait()


def test_servers_of_a_failed_start_are_stopped_in_parallel(monkeypatch):
    """Two servers that ignore SIGTERM, 1 s grace each: their grace periods overlap (both stops
    are under way at once), so the fleet is stopped in ~1 s, not ~2 s. Checked by what happens,
    not by the clock: each stop waits at a barrier until the other has begun."""
    import threading

    real = fl.stop_endpoint
    both = threading.Barrier(2, timeout=60)  # bounds a hang only: one at a time never passes it

    def stop_endpoint(ep, grace=20.0):
        both.wait()
        return real(ep, grace=grace)

    monkeypatch.setattr(fl, "stop_endpoint", stop_endpoint)
    procs = [_stubborn() for _ in range(2)]
    try:
        servers = [
            fl.StartedServer(
                command=fl.ServerCommand(gpu=str(i), port=1, url=ep.url, host="127.0.0.1", argv=["python"], env={}, log=Path("x.log")),
                process=proc, started=ep.started,
            )  # fmt: skip
            for i, (proc, ep) in enumerate(procs)
        ]
        assert fl.stop_started(servers, grace=1.0) == ["killed", "killed"]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ------------------------------------------------------------------------------ CLI input


@pytest.mark.parametrize("item", ["$(touch p)X=1", "A B=1", "1X=1", "X-Y=1", "=1", "NOEQUALS"])
def test_env_keys_that_are_not_variable_names_are_usage_errors(cli, tmp_path, item):
    r = cli("fleet", "up", "--model", MODEL, "--python", "python3", "--fleet", tmp_path / "fleet.json", "--env", item, "--dry-run")
    assert r.exit_code == 2, r.output
    assert r.stdout == "" and "--env" in r.stderr
    key, eq, _ = item.partition("=")
    if eq:  # the library refuses such a key too, whoever builds the spec
        with pytest.raises(UsageError):
            fl.build_commands(FleetSpec(model=MODEL, gpus=["0"], env={key: "1"}))


def test_dry_run_quotes_env_values_and_the_health_url(cli, tmp_path):
    r = cli(
        "fleet", "up", "--model", MODEL, "--python", "python3", "--fleet", tmp_path / "fleet.json", "--dry-run",
        "--env", "NCCL_DEBUG=$(touch x)", "--env", "_A1=a=b", "--advertise-host", "h;touch y",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    server = next(ln for ln in r.stdout.splitlines() if "sglang.launch_server" in ln)
    assert shlex.split(server)[:3] == ["CUDA_VISIBLE_DEVICES=0", "NCCL_DEBUG=$(touch x)", "_A1=a=b"]
    assert "NCCL_DEBUG='$(touch x)'" in server
    curl = next(ln for ln in r.stdout.splitlines() if "curl" in ln)
    assert curl.endswith("curl -sf 'http://h;touch y:30000/health_generate'")


def test_up_refuses_to_overwrite_an_unreadable_fleet_file_unless_forced(cli, tmp_path):
    import socket

    fleet = tmp_path / "fleet.json"
    fleet.write_text('{"endpoints": [{"url": "http://10.0.0.5:30000", "pid": 4242')  # cut short
    before = fleet.read_text()
    with socket.socket() as busy:  # so the forced run stops at the port check, before starting anything
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ("fleet", "up", "--model", MODEL, "--python", "python3", "--fleet", fleet, "--port-base", port)
        r = cli(*args)
        assert r.exit_code == 2
        assert "invalid JSON" in r.stderr and "--force" in r.stderr
        assert fleet.read_text() == before
        r = cli(*args, "--force")
        assert r.exit_code == 2 and f"port {port}" in r.stderr  # got past the fleet-file check
