"""`dqa merge` consumes what `dqa regen` really writes: shards and run.json from a real regen run
against the SGLang-contract server, including rows the server refused (HTTP 400 -> failed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from merge_helpers import base_table, read_back, sample_rows, write_dataset
from servers.sglang_contract import StubServer

N = 12
SELECTED = [1, 3, 5, 7, 9, 11]


def dqa(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True, timeout=180)


def test_merge_of_a_real_regen_run(tmp_path):
    rows = sample_rows(N)
    ids = [f"conv-{i}" for i in range(N)]
    src = write_dataset(base_table(rows, ids), tmp_path / "train.parquet", "parquet")
    findings = tmp_path / "findings.parquet"
    pq.write_table(pa.table({"row": pa.array(SELECTED, pa.int64()), "id": [ids[r] for r in SELECTED],
                             "reasons": [["degenerate_template"]] * len(SELECTED)}), findings)
    regen = tmp_path / "regen"
    with StubServer(tmp_path / "stub", "--zero-latency", "--error-share", "0.3", "--error-statuses", "400",
                    "--fault-seed", "3") as server:
        r = dqa("regen", src, "--findings", findings, "-e", server.url, "--out", regen, "--max-new-tokens", "40")
    assert r.returncode == 0, r.stderr
    shards = pa.concat_tables([pq.read_table(p) for p in sorted((regen / "shards").glob("*.parquet"))])
    by_row = {rec["row"]: rec for rec in shards.to_pylist()}
    assert sorted(by_row) == SELECTED
    failed = sorted(r for r, rec in by_row.items() if rec["status"] == "failed")
    assert failed and len(failed) < len(SELECTED), "the fault seed gives a mix of refused and regenerated rows"

    out = tmp_path / "train.v2.parquet"
    m = dqa("merge", src, "--regen", regen, "--out", out, "--json", "--accept", "ok,length")  # --max-new-tokens 40 cuts most replies
    assert m.returncode == 0, m.stderr
    summary = json.loads(m.stdout)
    assert summary["selection"] == [f"{regen / 'run.json'}: {len(SELECTED)} rows selected"]
    assert summary["replaced"] == len(SELECTED) - len(failed)
    assert summary["kept"] == len(failed)

    back = read_back(out)
    orig = read_back(src)
    for i in range(N):
        rec = by_row.get(i)
        if rec is not None and rec["status"] != "failed":
            assert back.column("input_ids")[i].as_py() == rec["input_ids"]
            assert back.column("loss_mask")[i].as_py() == rec["loss_mask"]
            assert back.column("input_ids")[i].as_py()[: rec["prompt_len"]] == rows[i][0][: rec["prompt_len"]]
            assert back.column("dqa_regen")[i].as_py()["endpoint"] == rec["endpoint"]
        else:
            assert back.column("input_ids")[i] == orig.column("input_ids")[i]
            assert back.column("dqa_regen")[i].as_py() is None
    report = json.loads((tmp_path / "train.v2.parquet.merge-report.json").read_text())
    assert [x["row"] for x in report["unregenerated_rows"]] == failed


def test_regen_and_merge_read_renamed_columns_and_merge_rebuilds_the_selection_from_another_directory(tmp_path):
    """--ids-column/--mask-column/--id-column go to regen (as to scan); merge reads the same columns from
    run.json when given none, and finds the run's findings from any working directory."""
    rows = sample_rows(N)
    src = tmp_path / "train.parquet"
    pq.write_table(pa.table({"uid": [f"conv-{i}" for i in range(N)],
                             "tokens": pa.array([r[0] for r in rows], pa.list_(pa.int32())),
                             "weights": pa.array([r[1] for r in rows], pa.list_(pa.uint8()))}), src)
    (tmp_path / "scan").mkdir()
    pq.write_table(pa.table({"row": pa.array(SELECTED, pa.int64()), "id": [f"conv-{r}" for r in SELECTED],
                             "reasons": [["degenerate_template"]] * len(SELECTED)}), tmp_path / "scan" / "findings.parquet")
    regen = tmp_path / "regen"
    with StubServer(tmp_path / "stub", "--zero-latency") as server:
        r = subprocess.run([sys.executable, "-m", "dqa.cli", "regen", "train.parquet", "--findings", "scan", "-e", server.url,
                            "--out", "regen", "--max-new-tokens", "40", "--ids-column", "tokens", "--mask-column", "weights",
                            "--id-column", "uid"], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run = json.loads((regen / "run.json").read_text())
    assert run["findings"] == str((tmp_path / "scan").resolve())  # resolved, not "scan"
    assert run["columns"] == {"ids": "tokens", "mask": "weights", "labels": None, "id": "uid"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    m = subprocess.run([sys.executable, "-m", "dqa.cli", "merge", src, "--regen", regen, "--out", tmp_path / "v2.parquet",
                        "--json", "--accept", "ok,length"], capture_output=True, text=True, timeout=180, cwd=elsewhere)
    assert m.returncode == 0, m.stderr
    summary = json.loads(m.stdout)
    assert summary["selection"] == [f"{regen / 'run.json'}: {len(SELECTED)} rows selected"]
    assert summary["replaced"] == len(SELECTED)
    back = pq.read_table(tmp_path / "v2.parquet")
    shards = {rec["row"]: rec for rec in pa.concat_tables([pq.read_table(p) for p in (regen / "shards").glob("*.parquet")]).to_pylist()}
    for i in SELECTED:
        assert back.column("tokens")[i].as_py() == shards[i]["input_ids"]
        assert back.column("weights")[i].as_py() == shards[i]["loss_mask"]
