"""`--report-to NAME`: each tracker's run written offline and read back with the tracker's own reader.

TensorBoard event files with ``EventAccumulator``, the wandb offline run folder (its ``.wandb``
transaction log, records decoded with wandb's own protobufs), trackio's local SQLite store with
``SQLiteStorage``, and MLflow's local file store with ``MlflowClient``. Each command runs as a real
``dqa`` process in a temporary folder with the trackers pointed there (nothing is sent anywhere:
WANDB_MODE=offline, no MLFLOW_TRACKING_URI, no trackio Space). A tracker whose library is not
installed skips its part, saying so.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gate_data import clean_rows, ok_mode_rows, write_set

REPO = Path(__file__).resolve().parents[1]
ALL = ("tensorboard", "wandb", "trackio", "mlflow")


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def need(name: str) -> None:
    if not installed(name):
        pytest.skip(f"{name} is not installed (pip install 'dqa[{name}]')")


def tracker_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TRACKIO_"))}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(tmp), WANDB_SILENT="true", TRACKIO_DIR=str(tmp / "trackio"),
               DQA_TENSORBOARD_DIR=str(tmp / "runs"), COLUMNS="120")
    return env


def dqa(tmp: Path, *args, ok=(0,)) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True, cwd=tmp,
                          env=tracker_env(tmp), timeout=300)
    assert proc.returncode in ok, f"dqa {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_name(command: str, dataset: Path, folder: Path) -> str:
    from dqa.reports.trackers import RunName

    return RunName.of(command, dataset, folder).name


# ---------------------------------------------------------------------------------- readers


def tensorboard_events(logdir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def wandb_records(root: Path, run_id: str) -> list:
    """Every record of the offline runs of ``run_id`` under ``root/wandb``, in session order: the
    ``.wandb`` log's 32 KiB blocks of framed chunks (wandb's datastore format), each record a
    ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted(glob.glob(str(root / "wandb" / "offline-run-*" / f"run-{run_id}.wandb"))):
        data = Path(path).read_bytes()
        assert data[:4] == b":W&B", path
        pos, block, pending = 7, 32768, b""
        while pos + 7 <= len(data):
            left = block - pos % block
            if left < 7:
                pos += left
                continue
            _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if length == 0 and kind == 0:
                pos += left
                continue
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # full, or the last piece
                rec = pb.Record()
                rec.ParseFromString(pending + chunk)
                out.append(rec)
                pending = b""
            else:
                pending += chunk
    return out


def wandb_history(root: Path, run_id: str) -> list[dict]:
    rows = []
    for rec in wandb_records(root, run_id):
        if rec.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item})
    return rows


def wandb_summary(root: Path, run_id: str) -> dict:
    summary = {}
    for rec in wandb_records(root, run_id):
        if rec.WhichOneof("record_type") == "summary":
            for item in rec.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def trackio_logs(tmp: Path, run: str) -> list[dict]:
    # TRACKIO_DIR is read when trackio is imported: read in a process of its own.
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
            "print(json.dumps(SQLiteStorage.get_logs('dqa', sys.argv[1]), default=str))")
    proc = subprocess.run([sys.executable, "-c", code, run], capture_output=True, text=True, env=tracker_env(tmp), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mlflow_client(tmp: Path):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(tmp / "mlruns").resolve().as_uri())


def mlflow_run(tmp: Path, name: str):
    client = mlflow_client(tmp)
    exp = client.get_experiment_by_name("dqa")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`dqa.run` = '{name}'")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


# ------------------------------------------------------------------------------------ tests


@pytest.fixture()
def small_set(tmp_path):
    """30 samples, 10 of them the degenerate 'OK.' answer (the root-cause template)."""
    return write_set(tmp_path / "data.parquet", clean_rows(20, seed=4) + ok_mode_rows(10))


def test_a_scan_reports_to_every_tracker_and_a_rescan_continues_its_run(tmp_path, small_set):
    present = [t for t in ALL if installed(t)]
    if not present:
        pytest.skip("no tracker library is installed")
    flags = [a for t in present for a in ("--report-to", t)]
    dqa(tmp_path, "scan", small_set, "--out", "scan", *flags, "-q", ok=(1,))
    second = dqa(tmp_path, "scan", small_set, "--out", "scan", *flags, "--json", ok=(1,))
    assert json.loads(second.stdout)["failing_rows"] == 10  # tracker output never lands on stdout
    name = run_name("scan", small_set, tmp_path / "scan")
    share = 10 / 30

    if "tensorboard" in present:
        acc = tensorboard_events(tmp_path / "runs" / name)
        assert [(e.step, round(e.value, 6)) for e in acc.Scalars("scan/failing_share")] == [(0, round(share, 6)), (1, round(share, 6))]
        assert [e.value for e in acc.Scalars("scan/degenerate_template/samples")] == [10, 10]
        hist = acc.Histograms("scan/turn_0/supervised_tokens")[-1].histogram_value
        assert hist.num == 30 and sum(hist.bucket) == 30 and hist.min == 7  # the 'OK.' turns: 7 supervised tokens
        assert acc.Histograms("scan/turn_0/thinking_tokens")[-1].histogram_value.num == 30
        text = acc.Tensors("scan/root_cause_template")[-1].tensor_proto.string_val[0].decode()
        assert "OK." in text and "10 samples" in text

    if "wandb" in present:
        history = wandb_history(tmp_path, name)
        scalars = [h for h in history if "scan/failing_share" in h]
        assert [h["_step"] for h in scalars] == [0, 1] and scalars[0]["scan/failing_share"] == pytest.approx(share)
        hist = [h for h in history if "scan/turn_0/supervised_tokens/values" in h][0]
        assert sum(hist["scan/turn_0/supervised_tokens/values"]) == 30
        assert "OK." in wandb_summary(tmp_path, name)["scan/root_cause_template"]
        assert len(glob.glob(str(tmp_path / "wandb" / f"offline-run-*-{name}"))) == 2  # one folder per session, one run id

    if "trackio" in present:
        logs = trackio_logs(tmp_path, name)
        steps = sorted({row["step"] for row in logs if "scan/failing_share" in row})
        assert steps == [0, 1]
        assert any(row.get("scan/root_cause_template", {}).get("_type") == "trackio.markdown" for row in logs)
        assert any(row.get("scan/turn_0/supervised_tokens", {}).get("_type") == "trackio.histogram" for row in logs)

    if "mlflow" in present:
        client, run = mlflow_run(tmp_path, name)
        history = client.get_metric_history(run.info.run_id, "scan/failing_share")
        assert sorted(m.step for m in history) == [0, 1] and history[0].value == pytest.approx(share)
        assert run.data.tags["dqa.dataset"] == str(small_set.resolve())
        arts = {a.path for a in client.list_artifacts(run.info.run_id, "histograms/scan/turn_0/supervised_tokens")}
        assert "histograms/scan/turn_0/supervised_tokens/step-0.json" in arts


def test_the_gate_reports_its_verdict_and_reasons(tmp_path, small_set):
    need("tensorboard")
    flags = ["--report-to", "tensorboard"] + (["--report-to", "mlflow"] if installed("mlflow") else [])
    dqa(tmp_path, "scan", small_set, "--out", "scan", "-q", ok=(1,))
    dqa(tmp_path, "gate", "scan", "--out", "gate", "--no-docs", *flags, "-q", ok=(1,))
    gate = json.loads((tmp_path / "gate" / "gate.json").read_text())
    name = run_name("gate", tmp_path / "scan", tmp_path / "gate")
    acc = tensorboard_events(tmp_path / "runs" / name)
    assert [e.value for e in acc.Scalars("gate/passed")] == [0.0]
    assert [e.value for e in acc.Scalars("gate/reasons")] == [len(gate["reasons"])] and gate["reasons"]
    verdict = acc.Tensors("gate/verdict")[-1].tensor_proto.string_val[0].decode()
    assert verdict.startswith("dqa gate: **FAIL**") and gate["reasons"][0] in verdict
    if installed("mlflow"):
        client, run = mlflow_run(tmp_path, name)
        assert run.data.metrics["gate/passed"] == 0.0
        text_dir = "text/gate/verdict"
        [art] = client.list_artifacts(run.info.run_id, text_dir)
        local = client.download_artifacts(run.info.run_id, art.path, str(tmp_path))
        assert "FAIL" in Path(local).read_text()


def test_regen_reports_live_while_it_runs_and_a_rerun_continues_the_run(tmp_path):
    need("tensorboard")
    from regen_helpers import degenerate_dataset
    from servers.sglang_contract import StubServer

    data = degenerate_dataset(tmp_path / "data.parquet", 24)
    server = StubServer(tmp_path / "stub", "--latency-s", "0.5").start()
    try:
        args = ("regen", data, "--all", "-e", server.url, "--out", "out", "--max-in-flight", "2", "--max-new-tokens", "64",
                "--gpu-hour-cost", "3.6", "--report-to", "tensorboard", "-q")
        dqa(tmp_path, *args)  # 24 rows, 2 at a time, 0.5 s each: ~6 s, so progress updates come every ~2 s
        acc = tensorboard_events(tmp_path / "runs" / run_name("regen", data, tmp_path / "out"))
        done = acc.Scalars("regen/done")
        assert len(done) >= 3, [(e.step, e.value) for e in done]  # live updates, then the final figures
        assert [e.value for e in done] == sorted(e.value for e in done) and done[0].value < 24 and done[-1].value == 24
        assert [e.step for e in done] == sorted(e.step for e in done)
        final = {k: acc.Scalars(f"regen/{k}")[-1].value for k in ("ok", "cut", "failed")}
        assert final["ok"] + final["cut"] == 24 and final["ok"] > 0 and final["failed"] == 0, final
        assert acc.Scalars("regen/output_tokens")[-1].value > 0 and acc.Scalars("regen/cost_so_far")[-1].value > 0
        assert acc.Scalars("regen/output_tok_per_s")[-1].value > 0
        last = done[-1].step
        dqa(tmp_path, *args)  # nothing left to do: the same run gets its final figures after the first session's
        acc = tensorboard_events(tmp_path / "runs" / run_name("regen", data, tmp_path / "out"))
        assert acc.Scalars("regen/done")[-1].step > last and acc.Scalars("regen/done")[-1].value == 24
    finally:
        server.stop()


def test_repair_reports_each_finished_round_also_when_a_session_stopped_in_the_next(tmp_path, monkeypatch, cli):
    """A repair stopped in round 2's regen (exit 3) has recorded round 1 whole and round 2's scan and plan: it reports
    round 1 as it stops, and nothing of round 2 nor final figures; the rerun reports round 2 whole and the final
    figures, and round 1 not again."""
    need("tensorboard")
    import dqa.repair
    from dqa.audit import identity
    from dqa.errors import RuntimeFailure
    from dqa.reports.trackers import RunName, open_trackers
    from dqa.reports.trackers.feed import report_repair

    monkeypatch.setenv("DQA_TENSORBOARD_DIR", str(tmp_path / "runs"))
    whole = ["scan", "plan", "regen", "merge", "rescan"]
    rounds = [{"round": 1, "done": whole, "selected": 40, "regenerated_ok": 38, "regen_failed": 0, "cut": 2,
               "output_tokens": 9000, "elapsed_s": 12.5, "cost_usd": 0.4, "still_failing": 5, "cannot_fit": 0,
               "plan": {"cost_usd": 0.5}},
              {"round": 2, "done": whole, "selected": 5, "regenerated_ok": 5, "regen_failed": 0, "cut": 0,
               "output_tokens": 1100, "elapsed_s": 3.0, "cost_usd": 0.1, "still_failing": 0, "cannot_fit": 0,
               "plan": {"cost_usd": 0.12}}]
    data = tmp_path / "data.parquet"
    data.write_bytes(b"")
    stopped = {"dataset": identity.dataset_path(data), "status": "running", "final": {},
               "rounds": [rounds[0], {"round": 2, "done": ["scan", "plan"], "selected": 5, "plan": {"cost_usd": 0.12}}]}
    finished = {**stopped, "status": "finished", "rounds": rounds,
                "final": {"spent_usd": 0.5, "still_failing": 0, "gate_passed": True}}
    run = RunName.of("repair", data, tmp_path / "work")

    def stops_in_round_2(dataset, out, options, *, work, **kw):
        (Path(work) / "repair.json").write_text(json.dumps(stopped))
        raise RuntimeFailure("round 2: the regen run stopped; rerun the same command to resume")

    monkeypatch.setattr(dqa.repair, "repair", stops_in_round_2)
    (tmp_path / "work").mkdir()
    r = cli("repair", data, "-e", "http://127.0.0.1:9", "--out", tmp_path / "v2.parquet", "--work", tmp_path / "work",
            "--report-to", "tensorboard", "-q")
    assert r.exit_code == 3 and "round 2: the regen run stopped" in r.stderr, r.stderr
    acc = tensorboard_events(tmp_path / "runs" / run.name)
    assert [(e.step, e.value) for e in acc.Scalars("repair/still_failing")] == [(1, 5)]
    assert "repair/planned_cost_usd" in acc.Tags()["scalars"] and "repair/rounds" not in acc.Tags()["scalars"]
    assert [e.step for e in acc.Scalars("repair/planned_cost_usd")] == [1]  # round 2's plan waits for round 2
    with open_trackers(["tensorboard"], run) as t:
        report_repair(t, finished)  # the rerun
    acc = tensorboard_events(tmp_path / "runs" / run.name)
    assert [(e.step, e.value) for e in acc.Scalars("repair/still_failing")] == [(1, 5), (2, 0)]
    assert [(e.step, e.value) for e in acc.Scalars("repair/regenerated_ok")] == [(1, 38), (2, 5)]
    assert [(e.step, e.value) for e in acc.Scalars("repair/planned_cost_usd")] == [(1, 0.5), (2, pytest.approx(0.12))]
    assert acc.Scalars("repair/gate_passed")[-1].value == 1.0 and acc.Scalars("repair/spent_usd")[-1].value == 0.5


def test_a_repair_refused_for_its_work_folder_reports_nothing(tmp_path, monkeypatch, cli, small_set):
    """A --work folder holding another dataset's repair is refused (exit 2) before any work: its figures are not
    reported under this dataset's run."""
    need("tensorboard")
    monkeypatch.setenv("DQA_TENSORBOARD_DIR", str(tmp_path / "runs"))
    data = small_set
    (tmp_path / "work").mkdir()
    from dqa.repair.work import VERSION

    other = {"version": VERSION, "dataset": "/somewhere/else/b.parquet", "status": "finished", "final": {"spent_usd": 1.5},
             "rounds": [{"round": 1, "done": ["scan", "plan", "regen", "merge", "rescan"], "still_failing": 0}]}
    (tmp_path / "work" / "repair.json").write_text(json.dumps(other))
    r = cli("repair", data, "-e", "http://127.0.0.1:9", "--out", tmp_path / "v2.parquet", "--work", tmp_path / "work",
            "--report-to", "tensorboard", "-q")
    assert r.exit_code == 2 and "holds the repair of /somewhere/else/b.parquet" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


ROUND_FIGURES = ("selected", "regenerated_ok", "regen_failed", "cut", "output_tokens", "elapsed_s", "cost_usd", "still_failing",
                 "cannot_fit")


def test_dqa_repair_reports_each_round_and_a_rerun_continues_its_run_without_reporting_a_round_twice(tmp_path):
    """The real `dqa repair --report-to` against the content-fault stand-in (test_repair's): each
    round's figures at the round's step, as the repair's own --json record has them, then the final
    figures; the run named from the resolved dataset and work folder (given relative here); the same
    command again reuses every round and only adds the final figures, after the first session's."""
    need("tensorboard")
    # the repair tests' stand-in server, its content faults and the example set
    from test_repair import FAULTS, StubServer, build_example

    build_example(tmp_path / "data", rows=100, seed=11)
    data, work = tmp_path / "data" / "example.parquet", tmp_path / "work"
    flags = ["--report-to", "tensorboard"] + (["--report-to", "mlflow"] if installed("mlflow") else [])
    with StubServer(tmp_path / "stub", *FAULTS) as server:
        args = ("repair", "data/example.parquet", "-e", server.url, "-t", "qwen3.6", "--out", "v2.parquet", "--work", "work",
                "--rounds", "3", "--max-new-tokens", "512", "--gpu-hour-cost", "3600", "--json", *flags)
        first = dqa(tmp_path, *args, ok=(0, 1))
        second = dqa(tmp_path, *args, ok=(0, 1))
    rec, again = json.loads(first.stdout), json.loads(second.stdout)  # tracker output never lands on stdout
    rounds, final = rec["rounds"], rec["final"]
    assert len(rounds) >= 2 and rounds[0]["still_failing"] > 0  # round 1 left bad samples: a round 2 ran
    assert first.returncode == final["exit_code"]
    assert again["rounds"] == rounds  # the rerun regenerated nothing: every round was reused
    n = len(rounds)
    name = run_name("repair", data, work)
    assert name.startswith("repair-example.parquet-")

    acc = tensorboard_events(tmp_path / "runs" / name)
    assert len(glob.glob(str(tmp_path / "runs" / name / "events.out.tfevents.*"))) == 2  # one event file per session
    for key in ROUND_FIGURES:  # each round once, at its own step, as the record has it
        assert [(e.step, e.value) for e in acc.Scalars(f"repair/{key}")] == \
            [(r["round"], pytest.approx(r[key])) for r in rounds], key
    planned = [(r["round"], pytest.approx(r["plan"]["cost_usd"])) for r in rounds if r["plan"]["cost_usd"] is not None]
    assert planned and [(e.step, e.value) for e in acc.Scalars("repair/planned_cost_usd")] == planned  # round 1's is unknown
    ends = {"spent_usd": final["spent_usd"], "still_failing_final": final["still_failing"], "rounds": n,
            "gate_passed": float(final["gate_passed"])}
    for key, value in ends.items():  # the first session's final figures at the last round's step, the rerun's after them
        assert [(e.step, e.value) for e in acc.Scalars(f"repair/{key}")] == \
            [(n, pytest.approx(value)), (n + 1, pytest.approx(value))], key
    opened = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("run")]
    assert [e.step for e in acc.Tensors("run")] == [0, n + 1]
    assert opened[0] == opened[1] == f"dqa repair: dataset `{data.resolve()}`, run folder `{work.resolve()}`"

    if installed("mlflow"):
        client, run = mlflow_run(tmp_path, name)  # one run, found again by the rerun
        assert run.info.run_name == name
        assert run.data.tags["dqa.dataset"] == str(data.resolve()) and run.data.tags["dqa.run_folder"] == str(work.resolve())
        for key in ROUND_FIGURES:
            history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, f"repair/{key}"))
            assert history == [(r["round"], pytest.approx(r[key])) for r in rounds], key
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "repair/spent_usd"))
        assert history == [(n, pytest.approx(final["spent_usd"])), (n + 1, pytest.approx(final["spent_usd"]))]


def test_an_unknown_tracker_or_a_missing_library_is_one_line_and_exit_2(cli, tmp_path, small_set, monkeypatch):
    r = cli("scan", small_set, "--out", tmp_path / "s", "--report-to", "neptune")
    assert r.exit_code == 2 and r.stderr.startswith("dqa: error: --report-to neptune: expected one of tensorboard")
    assert not (tmp_path / "s").exists()  # refused before the scan
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    for command in (("scan", small_set, "--out", tmp_path / "s"), ("gate", small_set, "--out", tmp_path / "g"),
                    ("regen", small_set, "--all", "-e", "http://127.0.0.1:9", "--out", tmp_path / "r"),
                    ("repair", small_set, "-e", "http://127.0.0.1:9", "--out", tmp_path / "v2.parquet", "--work", tmp_path / "w")):
        r = cli(*command, "--report-to", "wandb")
        assert r.exit_code == 2, (command[0], r.output)
        assert r.stderr == "dqa: error: --report-to wandb: its library is not installed (wandb); install it with: pip install 'dqa[wandb]'\n"
    assert not any((tmp_path / d).exists() for d in ("s", "g", "r", "w"))


def test_a_tracker_library_is_imported_only_when_asked_for():
    code = ("import sys; from dqa.cli import app; import dqa.commands.scan, dqa.commands.regen, dqa.reports.trackers.feed; "
            "print(sorted(m for m in ('tensorboard', 'wandb', 'trackio', 'mlflow') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
