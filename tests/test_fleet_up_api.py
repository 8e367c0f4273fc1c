"""A fleet can be planned and launched from Python (``dqa.regen.fleet.up``): ``prepare_launch``
gives the exact commands and dry-run script of `dqa fleet up --dry-run`, ``launch_fleet``
brings real servers up. A dry run also works where the model folder is not, and says which
choices it made without it."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from dqa.errors import InputError, UsageError
from dqa.regen.fleet import file as ff
from dqa.regen.fleet import launch as fl
from dqa.regen.fleet.logs import log_tail
from dqa.regen.fleet.spec import FleetSpec
from dqa.regen.fleet.up import LaunchEvents, launch_fleet, prepare_launch
from dqa.regen.servers.sglang import SglangOptions

MISSING = "/models/Qwen3.6-27B"  # the README's model folder: not on a CI machine
MTP_FLAGS = [
    "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
]  # fmt: skip


def sglang_argv(model: str, port: int, *tail: str) -> list[str]:
    return [
        "python3", "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1", "--port", str(port),
        "--context-length", "8192", "--max-running-requests", "48", "--reasoning-parser", "qwen3", "--enable-metrics", *tail,
    ]  # fmt: skip


def hybrid_model(root: Path) -> Path:
    m = root / "Qwen3.6-27B"
    m.mkdir(parents=True)
    (m / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"]}))
    return m


def test_the_seven_gpu_mtp_fleet_is_planned_from_python(tmp_path):
    model = hybrid_model(tmp_path / "models")
    spec = FleetSpec(
        model=str(model), gpus="0-6", stage=tmp_path / "shm", engine_options=SglangOptions(mtp=True, sglang_version="0.5.11"), python="python3",
        extra=("--kv-cache-dtype", "fp8_e4m3"), log_dir=Path("logs"), fleet=tmp_path / "fleet.json",
    )  # fmt: skip
    prepared = prepare_launch(spec, dry_run=True)
    copy = str(tmp_path / "shm" / "Qwen3.6-27B")
    assert prepared.stage == (model.resolve(), Path(copy))
    assert prepared.notes == []
    tail = [*MTP_FLAGS, "--mamba-scheduler-strategy", "extra_buffer", "--kv-cache-dtype", "fp8_e4m3"]
    assert [c.argv for c in prepared.commands] == [sglang_argv(copy, 30000 + i, *tail) for i in range(7)]
    assert [c.env for c in prepared.commands] == [{"CUDA_VISIBLE_DEVICES": str(i)} for i in range(7)]
    script = prepared.script()
    assert script.startswith("# dqa fleet up --dry-run: 7 sglang server(s), one per GPU\n")
    assert f"cp -a {model.resolve()}/. {copy}/" in script
    assert not (tmp_path / "shm").exists() and not (tmp_path / "fleet.json").exists()


def test_python_and_the_command_print_the_same_dry_run_script(cli, tmp_path):
    model = hybrid_model(tmp_path)
    spec = FleetSpec(model=str(model), gpus="0,2", engine_options=SglangOptions(mtp=True, sglang_version="0.5.11"), python="python3",
                     env=("OMP_NUM_THREADS=1",), fleet=tmp_path / "f.json")
    r = cli("fleet", "up", "--model", model, "--gpus", "0,2", "--mtp", "--sglang-version", "0.5.11", "--python", "python3", "--env", "OMP_NUM_THREADS=1",
            "--fleet", tmp_path / "f.json", "--dry-run")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.stdout == prepare_launch(spec, dry_run=True).script()
    assert r.stderr == ""


def test_a_dry_run_without_the_model_folder_prints_the_script_and_says_what_it_assumed(tmp_path):
    spec = FleetSpec(model=MISSING, gpus="0-6", stage=Path("/dev/shm"), engine_options=SglangOptions(mtp=True), python="python3",
                     extra=("--kv-cache-dtype", "fp8_e4m3"))
    prepared = prepare_launch(spec, dry_run=True)
    first, hybrid, stage = prepared.notes
    assert "not found" in first and MISSING in first
    assert "hybrid-Mamba detection" in hybrid and "--mamba-extra-buffer on" in hybrid
    assert "--stage" in stage and "free-space check" in stage
    # The defaults it stands by: not hybrid (no extra_buffer), the copy under --stage.
    assert prepared.commands[0].argv == sglang_argv("/dev/shm/Qwen3.6-27B", 30000, *MTP_FLAGS, "--kv-cache-dtype", "fp8_e4m3")
    assert prepared.stage == (Path(MISSING), Path("/dev/shm/Qwen3.6-27B"))
    lines = prepared.script().splitlines()
    assert lines[1:4] == [f"# note: {n}" for n in prepared.notes]
    subprocess.run(["bash", "-n"], input=prepared.script(), text=True, check=True)  # still a valid script


def test_only_the_choices_that_need_the_model_are_listed():
    notes = prepare_launch(FleetSpec(model=MISSING, engine_options=SglangOptions(mtp=True, mamba_extra_buffer="on", sglang_version="0.5.11")), dry_run=True).notes
    assert len(notes) == 1 and "not found" in notes[0]  # extra_buffer forced on: no detection needed
    argv = prepare_launch(FleetSpec(model=MISSING, engine_options=SglangOptions(mtp=True, mamba_extra_buffer="on", sglang_version="0.5.11")), dry_run=True).commands[0].argv
    assert argv[-2:] == ["--mamba-scheduler-strategy", "extra_buffer"]
    assert prepare_launch(FleetSpec(model="Qwen/Qwen3-8B", engine_options=SglangOptions(mtp=True)), dry_run=True).notes == []  # a hub id, not a folder


def test_the_readme_dry_run_works_without_the_model_and_notes_it_on_stderr(cli, tmp_path):
    r = cli("fleet", "up", "--model", MISSING, "--gpus", "0-6", "--stage", tmp_path / "shm", "--mtp",
            "--fleet", tmp_path / "fleet.json", "--dry-run", "--", "--kv-cache-dtype", "fp8_e4m3")  # fmt: skip
    assert r.exit_code == 0, r.output
    servers = [ln for ln in r.stdout.splitlines() if "sglang.launch_server" in ln]
    assert len(servers) == 7
    assert shlex.split(servers[0])[shlex.split(servers[0]).index("--model-path") + 1] == str(tmp_path / "shm" / "Qwen3.6-27B")
    assert "# note: model folder /models/Qwen3.6-27B not found" in r.stdout
    notes = r.stderr.splitlines()
    assert notes and all(n.startswith("note: ") for n in notes)
    assert any("hybrid-Mamba" in n for n in notes) and any("--stage" in n for n in notes)
    assert not (tmp_path / "shm").exists() and not (tmp_path / "fleet.json").exists()
    quiet = cli("fleet", "up", "--model", MISSING, "--mtp", "--fleet", tmp_path / "fleet.json", "--dry-run", "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr == "" and "# note:" in quiet.stdout


def test_without_dry_run_staging_a_missing_model_is_still_a_usage_error(cli, tmp_path):
    r = cli("fleet", "up", "--model", MISSING, "--stage", tmp_path / "shm", "--fleet", tmp_path / "fleet.json")
    assert r.exit_code == 2
    assert r.stderr == f"dqa: error: --stage needs a local model folder; {MISSING} does not exist\n"
    with pytest.raises(UsageError, match="--stage needs a local model folder"):
        prepare_launch(FleetSpec(model=MISSING, stage=tmp_path / "shm"))


@pytest.mark.parametrize(
    "spec, message",
    [
        (FleetSpec(model="m", engine="vllm"), "--engine 'vllm'"),
        (FleetSpec(model="m", gpus="3-1"), "--gpus"),
        (FleetSpec(model="m", env=("1X=1",)), "--env"),
        (FleetSpec(model="m", env={"A B": "1"}), "not a variable name"),
        (FleetSpec(model="m", engine="transformers", engine_options=SglangOptions(mtp=True)), "--mtp is an SGLang option"),
        (FleetSpec(model="m", engine_options=SglangOptions(mamba_extra_buffer="maybe")), "--mamba-extra-buffer"),
        (FleetSpec(model="m", gpus="0-1", port_base=65535), "--port-base"),
    ],
)
def test_bad_specs_are_usage_errors_before_anything_starts(spec, message):
    with pytest.raises(UsageError, match=message):
        prepare_launch(spec)


def test_the_command_shows_every_launch_event():
    from dqa.commands.fleet import _CliLaunchEvents

    hooks = {n for n in vars(LaunchEvents) if not n.startswith("_")}
    assert hooks == {"staging", "staged", "waiting", "server_failed", "not_stopped"}
    assert all(callable(getattr(_CliLaunchEvents, h, None)) for h in hooks)


class Recorder(LaunchEvents):
    def __init__(self):
        self.progress = []

    def waiting(self, servers, engine):
        import contextlib

        self.progress.append(("waiting", servers, engine))
        return contextlib.nullcontext(lambda healthy, total: self.progress.append((healthy, total)))


def test_launch_fleet_from_python_starts_healthy_servers_and_writes_the_fleet_file(tmp_path):
    from fleet_helpers import fake_sglang_python, free_port_base

    spec = FleetSpec(
        model="Qwen/Qwen3-8B", gpus=["0", "1"], python=str(fake_sglang_python(tmp_path)),
        fleet=tmp_path / "fleet.json", timeout=60, extra=("--startup-delay-s", "0.5"),
    )  # fmt: skip
    for attempt in range(3):  # again on fresh ports only when another process took one meanwhile
        base = free_port_base(2)
        events = Recorder()
        try:
            result = launch_fleet(dataclasses.replace(spec, port_base=base), events)
            break
        except (InputError, fl.ServerFailed) as exc:
            said = (str(exc) + " ".join(log_tail(getattr(exc, "log", None)))).lower()
            if attempt == 2 or not ("is not free" in said or "already in use" in said):
                raise
    try:
        assert result.fleet_path == tmp_path / "fleet.json"
        assert [e.url for e in result.record.endpoints] == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
        assert ff.read_fleet(result.fleet_path).urls == [e.url for e in result.record.endpoints]
        assert result.to_dict()["engine"] == "sglang" and result.elapsed_s > 0
        assert events.progress[0] == ("waiting", 2, "sglang") and events.progress[-1] == (2, 2)
        assert all(fl.endpoint_alive(e) for e in result.record.endpoints)
        assert (tmp_path / "fleet-logs" / "gpu1.log").exists()
    finally:
        outcomes = fl.stop_endpoints(result.record.endpoints, grace=10)
    assert outcomes == ["stopped", "stopped"]
