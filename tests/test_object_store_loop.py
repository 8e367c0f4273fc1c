"""The README's whole loop with every dataset and output in a bucket of a real S3 API server (moto,
its own process), reached only through the standard AWS environment:

scan s3:// -> regen (killed with SIGKILL mid-run, then resumed) -> merge -> gate -> report, and
`dqa repair` from one bucket URL to another. Then what a reader of a half-written output sees:
a store that dies mid-upload leaves a folder marked incomplete that every reader refuses, and
the rerun gives what one clean run gives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from s3_store import FaultProxy, S3Server, keys, new_bucket, store_env, upload

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

from build_example import build_example  # noqa: E402
from servers.sglang_contract import StubServer  # noqa: E402
from test_object_store_scan import same_scan  # noqa: E402


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    root = tmp_path_factory.mktemp("example")
    data = build_example(root / "data", rows=300, seed=5)
    truth = pl.read_parquet(root / "data" / "truth.parquet")
    return data, truth.filter(pl.col("planted").list.len() > 0).height


@pytest.fixture()
def env(s3, tmp_path):
    """The AWS environment of the dqa processes, and a private cache (staging) folder per test."""
    return {**store_env(s3.url), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def dqa(*args, env, cwd, ok=(0,), timeout=300):
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **env, "COLUMNS": "120"}, timeout=timeout)
    assert proc.returncode in ok, f"dqa {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def read_s3_parquet(url: str, env: dict) -> pl.DataFrame:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs = pafs.S3FileSystem(endpoint_override=env["AWS_ENDPOINT_URL"], access_key="testing", secret_key="testing", region="us-east-1")
    return pl.from_arrow(pq.read_table(url[len("s3://"):], filesystem=fs))


def uploaded(s3, data):
    """A new bucket holding the example set; returns ``(bucket, the set's URL)``."""
    bucket = new_bucket(s3.url)
    src = f"s3://{bucket}/data/example.parquet"
    upload(s3.url, data, src)
    return bucket, src


def test_the_whole_loop_on_a_bucket(s3, example, env, tmp_path):
    data, planted = example
    bucket, src = uploaded(s3, data)
    scan_url, run_url = f"s3://{bucket}/scans/example", f"s3://{bucket}/runs/r1"

    scan = json.loads(dqa("scan", src, "-t", "qwen3.6", "--out", scan_url, "--json", env=env, cwd=tmp_path, ok=(1,)).stdout)
    assert scan["failing_rows"] == planted and scan["dataset_path"] == src

    with StubServer(tmp_path / "stub", "--latency-s", "0.05", "--vocab", "qwen3.6") as stub:
        cmd = [sys.executable, "-m", "dqa.cli", "regen", src, "--failed-only", "--findings", scan_url, "-e", stub.url,
               "--tokenizer", "qwen3.6", "--out", run_url, "--max-in-flight", "2", "--shard-rows", "8", "-q"]
        p = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while stub.status()["outcomes"].get("ok", 0) < 12 and p.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert p.poll() is None, p.communicate()[1]
        p.send_signal(signal.SIGKILL)
        p.wait()
        progress = json.loads(dqa("regen", src, "--failed-only", "--findings", scan_url, "-e", stub.url, "--tokenizer", "qwen3.6",
                                  "--out", run_url, "--shard-rows", "8", "--json", env=env, cwd=tmp_path).stdout)
    assert progress["state"] == "finished" and (progress["done"], progress["ok"]) == (planted, planted)
    shard_keys = [k for k in keys(s3.url, run_url) if k.startswith("shards/")]
    records = pl.concat([read_s3_parquet(f"{run_url}/{k}", env) for k in shard_keys])
    turns = list(zip(records["row"].to_list(), records["turn"].to_list()))
    assert len(turns) == len(set(turns))  # every (row, turn) exactly once, across the kill
    rows = set(records["row"].to_list())
    assert len(rows) == planted

    release = f"s3://{bucket}/release/example.parquet"
    merged = json.loads(dqa("merge", src, "--regen", run_url, "--out", release, "--json", env=env, cwd=tmp_path).stdout)
    assert merged["replaced"] == planted and merged["output"] == release
    assert keys(s3.url, f"s3://{bucket}/release") == ["example.parquet", "example.parquet.merge-report.json"]
    # Against the baseline in the bucket: drift is measured (the failing share fell), gate.json published last.
    gate = json.loads(dqa("gate", release, "-t", "qwen3.6", "--baseline", scan_url, "--out", f"s3://{bucket}/gates/v2",
                          "--json", "--no-docs", env=env, cwd=tmp_path, ok=(0, 1)).stdout)
    assert gate["drift"]["checks"] and "gate.json" in keys(s3.url, f"s3://{bucket}/gates/v2")
    verdict = json.loads(dqa("gate", release, "-t", "qwen3.6", "--out", f"s3://{bucket}/gates/alone", "--json", "--no-docs",
                             env=env, cwd=tmp_path).stdout)
    assert verdict["verdict"] == "pass"

    # Untouched rows are byte-identical; regenerated rows carry their provenance.
    before, new = pl.read_parquet(data), read_s3_parquet(release, env)
    failing = rows
    good = [i for i in range(before.height) if i not in failing]
    assert new[good].select("id", "input_ids", "loss_mask").equals(before[good].select("id", "input_ids", "loss_mask"))
    assert new[sorted(failing)]["dqa_regen"].null_count() == 0

    report = json.loads(dqa("report", scan_url, "--regen", run_url, "--json", env=env, cwd=tmp_path).stdout)
    assert report["report"] == f"{scan_url}/report.html" and "report.html" in keys(s3.url, scan_url)
    assert not list(tmp_path.glob("dqa-out/*/report.html"))


def test_repair_from_a_bucket_to_a_bucket(s3, example, env, tmp_path):
    data, planted = example
    bucket, src = uploaded(s3, data)
    out, work = f"s3://{bucket}/release/example.parquet", f"s3://{bucket}/repairs/example"
    with StubServer(tmp_path / "stub", "--latency-s", "0.002", "--vocab", "qwen3.6") as stub:
        res = dqa("repair", src, "-e", stub.url, "-t", "qwen3.6", "--out", out, "--work", work, "--json", env=env, cwd=tmp_path)
        record = json.loads(res.stdout)
        assert record["final"]["gate_passed"] is True and record["final"]["still_failing"] == 0
        assert "repair.json" in keys(s3.url, work) and ".dqa-incomplete" not in keys(s3.url, work)
        assert read_s3_parquet(out, env).height == pl.read_parquet(data).height
        # Rerun: the finished repair is read back from the store; nothing is regenerated again.
        sent = stub.status()["n_generate"]
        dqa("repair", src, "-e", stub.url, "-t", "qwen3.6", "--out", out, "--work", work, "-q", env=env, cwd=tmp_path)
        assert stub.status()["n_generate"] == sent


def test_a_store_dying_mid_upload_leaves_an_output_every_reader_refuses(s3, example, env, tmp_path):
    data, _ = example
    bucket, src = uploaded(s3, data)
    out = f"s3://{bucket}/scans/example"
    proxy = FaultProxy(s3.url)
    via = {**env, "AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "2"}
    proxy.die_after_writes = 4  # the marker and a part or two, then the store is gone
    res = dqa("scan", src, "-t", "qwen3.6", "--out", out, "-q", env=via, cwd=tmp_path, ok=(3,))
    assert res.stderr.startswith("dqa: error: s3://") and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert ".dqa-incomplete" in keys(s3.url, out)
    for cmd in (("report", out), ("gate", out, "--no-docs"), ("regen", src, "--findings", out, "-e", "http://127.0.0.1:9", "--out", tmp_path / "r")):
        refused = dqa(*cmd, env=env, cwd=tmp_path, ok=(2,))
        assert "incomplete" in refused.stderr and out in refused.stderr, refused.stderr
    # The store is back: the rerun equals one clean run.
    proxy.dead, proxy.die_after_writes = False, None
    dqa("scan", src, "-t", "qwen3.6", "--out", out, "-q", env=via, cwd=tmp_path, ok=(1,))
    assert ".dqa-incomplete" not in keys(s3.url, out)
    dqa("scan", data, "-t", "qwen3.6", "--out", tmp_path / "clean", "-q", env=env, cwd=tmp_path, ok=(1,))
    from dqa.storage import input_folder

    os.environ.update(env)
    try:
        same_scan(tmp_path / "clean", input_folder(out, "summary.json"))
    finally:
        for k in env:
            os.environ.pop(k, None)


def test_a_half_written_release_folder_is_refused_naming_what_is_missing(s3, example, env, tmp_path):
    data, _ = example
    bucket = new_bucket(s3.url)
    release = f"s3://{bucket}/release/v3"
    upload(s3.url, data, f"{release}/part-00000.parquet")
    marker = tmp_path / ".dqa-incomplete"
    marker.write_text(json.dumps({"complete": None}))
    upload(s3.url, marker, f"{release}/.dqa-incomplete")
    for cmd in (("scan", release, "-t", "qwen3.6", "--out", tmp_path / "s"), ("gate", release, "-t", "qwen3.6", "--no-docs")):
        res = dqa(*cmd, env=env, cwd=tmp_path, ok=(2,))
        assert res.stderr.strip() == f"dqa: error: {release}: incomplete (an upload was interrupted); rerun the command that writes it"
