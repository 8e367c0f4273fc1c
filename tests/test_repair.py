"""`dqa repair`: from a broken set to a gated release in one command, round after round.

Against the SGLang-contract stand-in with content faults: a share of prompts get a degenerate,
looping or cut answer to the first seed the server sees for them (the seed's incident), so round 1
leaves bad samples and later rounds (new seeds) fix them. Real processes, the real Qwen3.6
tokenizer and chat template (the example set), real parquet on disk.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

from build_example import build_example  # noqa: E402
from servers.sglang_contract import StubServer  # noqa: E402

FAULTS = ("--vocab", "qwen3.6", "--enable-deterministic-inference", "--content-fault-share", "0.3")


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    server = StubServer(tmp_path_factory.mktemp("stub"), *FAULTS).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    return build_example(tmp_path_factory.mktemp("data"), rows=300, seed=11)


def dqa(cwd: Path, *args, ok=(0,)) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "120"}, timeout=600)
    assert proc.returncode in ok, f"dqa {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def record(work: Path) -> dict:
    return json.loads((work / "repair.json").read_text())


def release_rows(path: Path) -> dict:
    """The release's columns, without merge's provenance column (it names run folders)."""
    t = pq.read_table(path)
    return {name: t.column(name).to_pylist() for name in t.column_names if name != "dqa_regen"}


def test_three_rounds_end_at_a_passing_gate_and_the_release_rescans_clean(tmp_path, stub):
    data = build_example(tmp_path / "data", seed=0)  # the example set: 3,000 conversations
    out = tmp_path / "release" / "example-v2.parquet"
    proc = dqa(tmp_path, "repair", data, "-e", stub.url, "--tokenizer", "qwen3.6", "--out", out, "--rounds", "3",
               "--max-new-tokens", "512")
    rec = record(tmp_path / "dqa-out" / "example-repair")
    rounds = rec["rounds"]
    assert rec["final"]["gate_passed"] is True and rec["final"]["exit_code"] == 0 and "gate passed" in proc.stdout
    assert len(rounds) >= 2  # the content faults left bad samples after round 1 ...
    assert rounds[0]["still_failing"] > 0 and rounds[-1]["still_failing"] == 0  # ... and a later round fixed them
    assert rounds[1]["selected"] == rounds[0]["still_failing"]  # round 2 sends only what still failed
    assert rounds[1]["seed_base"] == rounds[0]["seed_base"] + 1  # with new seeds
    assert all(r["regen_failed"] == 0 for r in rounds)
    # samples cut by 512 tokens got twice as many in the next round, and the change says why
    assert rounds[0]["cut"] > 0
    assert {"option": "max_new_tokens", "from": 512, "to": 1024, "why": f"{rounds[0]['cut']:,} samples were cut by the length limit"} \
        in rounds[1]["changes"]
    # a fresh scan of the release (its own folder) flags nothing: no degenerate, looping or cut turn
    scan = dqa(tmp_path, "scan", out, "--tokenizer", "qwen3.6", "--out", tmp_path / "rescan", "--json", ok=(0,))
    assert json.loads(scan.stdout)["failing_rows"] == 0
    assert pq.ParquetFile(out).metadata.num_rows == 3000


def test_one_round_exits_1_writes_the_release_and_lists_what_still_fails(tmp_path, stub, small_set):
    out = tmp_path / "v2.parquet"
    work = tmp_path / "work"
    proc = dqa(tmp_path, "repair", small_set, "-e", stub.url, "-t", "qwen3.6", "--out", out, "--rounds", "1",
               "--work", work, ok=(1,))
    final = record(work)["final"]
    assert out.exists() and pq.ParquetFile(out).metadata.num_rows == 300
    assert final["stop"] == "rounds" and final["still_failing"] > 0 and final["exit_code"] == 1
    assert len(final["still_failing_rows"]) == final["still_failing"]
    assert all(r["reasons"] for r in final["still_failing_rows"])
    assert f"{final['still_failing']:,} samples still failing" in proc.stdout
    # --failed drop leaves them out of the release
    dropped = tmp_path / "v2-dropped.parquet"
    dqa(tmp_path, "repair", small_set, "-e", stub.url, "-t", "qwen3.6", "--out", dropped, "--rounds", "1",
        "--work", tmp_path / "work-drop", "--failed", "drop", ok=(0, 1))
    assert pq.ParquetFile(dropped).metadata.num_rows == 300 - final["still_failing"]


def test_the_budget_stops_before_a_round_it_cannot_pay_for(tmp_path, stub, small_set):
    work = tmp_path / "work"
    proc = dqa(tmp_path, "repair", small_set, "-e", stub.url, "-t", "qwen3.6", "--out", tmp_path / "v2.parquet",
               "--work", work, "--gpu-hour-cost", "1000000", "--gpus", "8", "--budget-usd", "0.0001", ok=(1,))
    rec = record(work)
    assert len(rec["rounds"]) == 1 and rec["final"]["stop"] == "budget"  # round 1 spent it all; round 2 never started
    assert rec["rounds"][0]["cost_usd"] > 0.0001
    assert "round 2 not started" in proc.stderr and "spent $" in proc.stdout


def test_a_work_folder_refuses_another_dataset_or_other_options(tmp_path, stub, small_set):
    work = tmp_path / "work"
    args = ("repair", small_set, "-e", stub.url, "-t", "qwen3.6", "--work", work, "--rounds", "1")
    dqa(tmp_path, *args, "--out", tmp_path / "a.parquet", ok=(0, 1))
    other = dqa(tmp_path, *args, "--out", tmp_path / "b.parquet", "--max-new-tokens", "100", ok=(2,))
    assert "started with other options" in other.stderr and "max_new_tokens" in other.stderr
    elsewhere = build_example(tmp_path / "other", rows=120, seed=2)
    refused = dqa(tmp_path, "repair", elsewhere, "-e", stub.url, "-t", "qwen3.6", "--work", work, "--rounds", "1",
                  "--out", tmp_path / "c.parquet", ok=(2,))
    assert "holds the repair of" in refused.stderr


def test_kill_9_at_random_instants_then_rerunning_gives_the_same_release(tmp_path, small_set):
    # A server of its own: which seed a conversation saw first is the stand-in's memory.
    stub = StubServer(tmp_path / "stub", *FAULTS).start()
    try:
        _kill_and_compare(tmp_path, stub, small_set)
    finally:
        stub.stop()


def _kill_and_compare(tmp_path, stub, small_set):
    args = ("repair", small_set, "-e", stub.url, "-t", "qwen3.6", "--rounds", "3", "--max-new-tokens", "512")
    clean_out, clean_work = tmp_path / "clean.parquet", tmp_path / "clean-work"
    t0 = time.monotonic()
    dqa(tmp_path, *args, "--out", clean_out, "--work", clean_work)
    took = time.monotonic() - t0
    out, work = tmp_path / "killed.parquet", tmp_path / "killed-work"
    cmd = [sys.executable, "-m", "dqa.cli", *map(str, args), "--out", str(out), "--work", str(work)]
    draw = random.Random(int(os.environ.get("DQA_KILL_SEED", "0")) or None)
    kills = 0
    for _ in range(3):
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(draw.uniform(0.5, max(took, 1.0)))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
    dqa(tmp_path, *args, "--out", out, "--work", work)  # the same command, to the end
    assert release_rows(out) == release_rows(clean_out)
    keys = ("selected", "regenerated_ok", "cut", "still_failing", "max_new_tokens", "seed_base")
    assert [{k: r.get(k) for k in keys} for r in record(work)["rounds"]] == \
        [{k: r.get(k) for k in keys} for r in record(clean_work)["rounds"]]
    assert record(work)["final"]["still_failing"] == record(clean_work)["final"]["still_failing"]


def test_two_fleet_files_one_per_node_are_the_servers_of_every_round(tmp_path, small_set):
    """`--fleet` twice (one file per node, written by hand here, each naming a stand-in server):
    the round's regen run sends to the servers of both, repair.json records both files, and a
    round is priced at the GPUs of both (1 + 2)."""
    from dqa.regen.fleet.file import Endpoint, Fleet, write_fleet

    with StubServer(tmp_path / "a", *FAULTS, name="a") as a, StubServer(tmp_path / "b", *FAULTS, name="b") as b:
        node_a = write_fleet(tmp_path / "node-a.json", Fleet("sglang", "sglang", "stub", [Endpoint(url=a.url, gpu="0")]))
        node_b = write_fleet(tmp_path / "node-b.json", Fleet("sglang", "sglang", "stub", [Endpoint(url=b.url, gpu="0,1")]))
        work = tmp_path / "work"
        dqa(tmp_path, "repair", small_set, "--fleet", node_a, "--fleet", node_b, "-t", "qwen3.6", "--rounds", "1",
            "--gpu-hour-cost", "2", "--out", tmp_path / "v2.parquet", "--work", work, ok=(0, 1))
    rec = record(work)
    assert rec["options"]["regen.fleet"] == [str(node_a), str(node_b)]
    (progress,) = [json.loads(p.read_text()) for p in work.rglob("progress.json")]
    assert progress["gpus"] == 3 and progress["failed"] == 0
    assert set(progress["endpoints"]) == {a.url, b.url} and all(e["done"] > 0 for e in progress["endpoints"].values())
    assert rec["rounds"][0]["cost_usd"] > 0
