"""`dqa scan` on an object store: a real S3 API server (moto, its own process), reached only through
the standard AWS environment (``AWS_ENDPOINT_URL``, test credentials).

- Every format reads from the store as from a local disk: the same findings, metrics and turns,
  row for row, also with worker processes that open their own units from the store.
- A scan folder written to the store is complete (summary.json last, no marker) and reads back.
- Only the columns the scan needs are fetched: range reads, never the whole object.
- Throttling (503 SlowDown) is retried with backoff; a store that stays down, a missing bucket,
  key or prefix, and refused credentials each end in one line naming the URL, exit 3 or 2, with
  no credential in it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chatdata import conversation, render
from s3_store import FaultProxy, S3Server, keys, new_bucket, store_env, upload
from test_scan_checks import good_rows

OK_ROWS = 12


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture()
def bucket(s3, monkeypatch):
    """A new bucket, with this process's AWS environment pointing at the server."""
    for k, v in store_env(s3.url).items():
        monkeypatch.setenv(k, v)
    return new_bucket(s3.url)


@pytest.fixture(scope="module")
def table():
    ok = [render(conversation(f"Ask {i}", None, "OK."), enable_thinking=False) for i in range(OK_ROWS)]
    rows = good_rows(60) + ok
    return pa.table({
        "id": [f"r{i}" for i in range(len(rows))],
        "input_ids": pa.array([r[0] for r in rows], type=pa.list_(pa.int32())),
        "loss_mask": pa.array([r[1] for r in rows], type=pa.list_(pa.int8())),
    })


def dqa(*args, env=None, ok=(0, 1)):
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {}), "COLUMNS": "120"}, timeout=300)
    assert proc.returncode in ok, f"dqa {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def same_scan(local_dir, remote_dir):
    """The scan folders hold the same findings, metrics and turns, row for row, and the same counts."""
    for name in ("findings.parquet", "metrics.parquet", "turns.parquet"):
        a, b = pl.read_parquet(local_dir / name), pl.read_parquet(remote_dir / name)
        assert a.equals(b), name
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (local_dir, remote_dir))
    for k in ("rows", "failing_rows", "checks", "format", "tokens"):
        assert sa.get(k) == sb.get(k), k


def write_formats(table, root):
    """The same rows as each format dqa reads; returns {name: local path}."""
    from datasets import Dataset

    out = {}
    pq.write_table(table, root / "d.parquet", row_group_size=16)
    out["parquet"] = root / "d.parquet"
    (root / "shards").mkdir()
    pq.write_table(table.slice(0, 40), root / "shards" / "part-00000.parquet", row_group_size=8)
    pq.write_table(table.slice(40), root / "shards" / "part-00001.parquet", row_group_size=8)
    out["shards"] = root / "shards"
    with pa.OSFile(str(root / "d.arrow"), "wb") as fh, pa.ipc.new_file(fh, table.schema) as w:
        w.write_table(table, max_chunksize=20)
    out["arrow"] = root / "d.arrow"
    Dataset(table).save_to_disk(str(root / "hf"))
    out["hf"] = root / "hf"
    pl.from_arrow(table).write_ndjson(root / "d.jsonl")
    out["jsonl"] = root / "d.jsonl"
    return out


def test_every_format_scans_from_the_store_as_from_disk(table, bucket, s3, tmp_path):
    from dqa import scan

    for name, local in write_formats(table, tmp_path).items():
        url = f"s3://{bucket}/{name}/{local.name}"
        upload(s3.url, local, url)
        scan(local, "qwen3", out=tmp_path / f"scan-local-{name}")
        there = scan(url, "qwen3", out=tmp_path / f"scan-s3-{name}")
        assert there.summary["failing_rows"] == OK_ROWS, name
        assert there.summary["dataset_path"] == url
        same_scan(tmp_path / f"scan-local-{name}", tmp_path / f"scan-s3-{name}")


def test_workers_open_their_units_from_the_store(table, bucket, s3, tmp_path):
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=8)
    url = f"s3://{bucket}/train/d.parquet"
    upload(s3.url, tmp_path / "d.parquet", url)
    dqa("scan", tmp_path / "d.parquet", "-t", "qwen3", "--out", tmp_path / "local", "--workers", "1", "-q", ok=(1,))
    dqa("scan", url, "-t", "qwen3", "--out", tmp_path / "pool", "--workers", "2", "-q", ok=(1,))
    same_scan(tmp_path / "local", tmp_path / "pool")


def test_a_scan_folder_in_the_store_is_written_summary_last_and_reads_back(table, bucket, s3, tmp_path):
    from dqa.storage import input_folder

    pq.write_table(table, tmp_path / "d.parquet")
    data, out = f"s3://{bucket}/train/d.parquet", f"s3://{bucket}/scans/train"
    upload(s3.url, tmp_path / "d.parquet", data)
    proxy = FaultProxy(s3.url)
    env = {"AWS_ENDPOINT_URL": proxy.url}
    res = dqa("scan", data, "-t", "qwen3", "--out", out, "--json", env=env, ok=(1,))
    assert json.loads(res.stdout)["failing_rows"] == OK_ROWS
    assert keys(s3.url, out) == ["findings.parquet", "metrics.parquet", "summary.json", "summary.md", "turns.parquet"]
    writes = [path.split("?")[0].rsplit("/", 1)[-1] for method, path in proxy.requests
              if method in ("PUT", "POST") and "/scans/" in path]
    assert writes[0] == ".dqa-incomplete"  # the marker first ...
    last_write = {name: i for i, name in enumerate(writes) if name not in ("", ".dqa-incomplete")}  # "": a folder marker
    assert max(last_write, key=last_write.get) == "summary.json"  # ... and the summary completes last of all files
    # A rescan of the same data over the same folder: still one complete folder.
    dqa("scan", data, "-t", "qwen3", "--out", out, "-q", env=env, ok=(1,))
    assert ".dqa-incomplete" not in keys(s3.url, out)
    dqa("scan", tmp_path / "d.parquet", "-t", "qwen3", "--out", tmp_path / "local", "-q", ok=(1,))
    same_scan(tmp_path / "local", input_folder(out, "summary.json"))


def test_only_the_needed_columns_are_fetched(bucket, s3, tmp_path, table):
    # A wide column the checks never read: its bytes must not cross the wire.
    big = pa.concat_tables([table] * 20)
    wide = big.append_column("text", pa.array([os.urandom(8_000).hex() for _ in range(big.num_rows)]))
    pq.write_table(wide, tmp_path / "d.parquet", row_group_size=128, compression="none")
    url = f"s3://{bucket}/wide/d.parquet"
    upload(s3.url, tmp_path / "d.parquet", url)
    proxy = FaultProxy(s3.url)
    dqa("scan", url, "-t", "qwen3", "--out", tmp_path / "scan", "-q", "--workers", "1", env={"AWS_ENDPOINT_URL": proxy.url}, ok=(1,))
    md = pq.ParquetFile(tmp_path / "d.parquet").metadata
    size = os.path.getsize(tmp_path / "d.parquet")
    needed = sum(md.row_group(g).column(c).total_compressed_size for g in range(md.num_row_groups)
                 for c in range(md.num_columns) if md.row_group(g).column(c).path_in_schema.split(".")[0] != "text")
    assert proxy.bytes_out < size / 4, (proxy.bytes_out, size)
    gets = sum(1 for method, _ in proxy.requests if method == "GET")
    # Besides the needed column chunks: the footer (pyarrow reads the last 64 KiB at each open) and the magic bytes.
    assert proxy.bytes_out <= 1.1 * needed + 6 * 64 * 1024, (proxy.bytes_out, needed, gets)


def test_throttling_is_retried_and_gives_the_same_findings(bucket, s3, tmp_path, table):
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=8)
    url = f"s3://{bucket}/t/d.parquet"
    upload(s3.url, tmp_path / "d.parquet", url)
    proxy = FaultProxy(s3.url)
    proxy.slow_down_every = 3  # a third of all requests answered 503 SlowDown
    dqa("scan", url, "-t", "qwen3", "--out", tmp_path / "s3", "-q", env={"AWS_ENDPOINT_URL": proxy.url}, ok=(1,))
    assert proxy.throttled > 0
    dqa("scan", tmp_path / "d.parquet", "-t", "qwen3", "--out", tmp_path / "local", "-q", ok=(1,))
    same_scan(tmp_path / "local", tmp_path / "s3")


def test_a_store_that_stays_down_exits_3_naming_the_url(bucket, s3, tmp_path, table):
    pq.write_table(table, tmp_path / "d.parquet")
    url = f"s3://{bucket}/t/d.parquet"
    upload(s3.url, tmp_path / "d.parquet", url)
    proxy = FaultProxy(s3.url)
    proxy.slow_down_every = 1
    res = dqa("scan", url, "-t", "qwen3", "--out", tmp_path / "s", env={"AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "2"}, ok=(3,))
    assert res.stderr.startswith(f"dqa: error: s3://{bucket}/t/d.parquet") and "503" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not (tmp_path / "s").exists()
    proxy.slow_down_every, proxy.dead = 0, True  # connections reset
    res = dqa("scan", url, "-t", "qwen3", "--out", tmp_path / "s", env={"AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "2"}, ok=(3,))
    assert res.stderr.startswith(f"dqa: error: s3://{bucket}/t/d.parquet"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("where, says", [
    ("s3://no-such-bucket-here/train/", "no such"),
    ("s3://{bucket}/missing.parquet", "no such file or folder"),
    ("s3://{bucket}/empty-prefix/", "no such file or folder"),
])
def test_missing_bucket_key_or_prefix_exit_2(bucket, tmp_path, where, says):
    url = where.format(bucket=bucket)
    res = dqa("scan", url, "-t", "qwen3", "--out", tmp_path / "s", ok=(2,))
    line = res.stderr.strip()
    assert line.startswith("dqa: error: s3://") and says in line and len(line.splitlines()) == 1, line
    assert not (tmp_path / "s").exists()


def test_refused_credentials_exit_2_and_are_never_printed(tmp_path, table, monkeypatch):
    server = S3Server(auth=True)  # knows no access key at all
    try:
        env = store_env(server.url, key="AKIAWRONGKEY")
        res = dqa("scan", "s3://sets/train/", "-t", "qwen3", "--out", tmp_path / "s", env=env, ok=(2,))
    finally:
        server.stop()
    line = res.stderr.strip()
    assert "INVALID_ACCESS_KEY_ID" in line or "access denied" in line, line
    assert "credentials" in line and len(line.splitlines()) == 1
    assert env["AWS_SECRET_ACCESS_KEY"] not in res.stderr + res.stdout


def test_credentials_in_the_url_are_used_and_never_printed(bucket, s3, tmp_path, table):
    pq.write_table(table, tmp_path / "d.parquet")
    upload(s3.url, tmp_path / "d.parquet", f"s3://{bucket}/train/d.parquet")
    res = dqa("scan", f"s3://AKIAUSER:s3cr3t%2Fpass@{bucket}/train/d.parquet", "-t", "qwen3", "--out", tmp_path / "s",
              "--json", ok=(1,))
    assert json.loads(res.stdout)["dataset_path"] == f"s3://{bucket}/train/d.parquet"
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "s").iterdir() if p.suffix in (".json", ".md"))
    assert "s3cr3t" not in res.stdout + res.stderr + written
    res = dqa("scan", f"s3://AKIAUSER:s3cr3t%2Fpass@{bucket}/missing/", "-t", "qwen3", "--out", tmp_path / "m", ok=(2,))
    assert "s3cr3t" not in res.stderr and "AKIAUSER" not in res.stderr and f"s3://{bucket}/missing" in res.stderr


def test_a_missing_backend_names_the_extra(tmp_path):
    # huggingface_hub hidden from the process, as on a machine without the hf extra.
    code = "import sys; sys.modules['huggingface_hub'] = None; from dqa.cli import main; sys.argv[0] = 'dqa'; main()"
    proc = subprocess.run([sys.executable, "-c", code, "scan", "hf://datasets/org/name", "-t", "qwen3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "pip install 'dqa[hf]'" in proc.stderr, proc.stderr
    res = dqa("scan", "nosuchscheme://bucket/x", "-t", "qwen3", ok=(2,))
    assert "nosuchscheme://" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_scan_unit_whose_store_read_failed_is_scanned_again(monkeypatch):
    """The SDK gives up at once on an error reply that a small ranged read cannot hold (503 SlowDown's XML:
    INTERNAL_FAILURE "Failed to flush response stream"); the pool scans that unit again, and gives up on
    anything else, or after UNIT_ATTEMPTS."""
    from dqa.audit import scan_workers
    from dqa.errors import InputError
    from dqa.storage.faults import store_error

    flush = OSError("When reading information for key 'k' in bucket 'b': AWS Error INTERNAL_FAILURE during GetObject "
                    "operation: Failed to flush response stream")
    calls = []

    def flaky(task, ds, tables):
        calls.append(task)
        if len(calls) < scan_workers.UNIT_ATTEMPTS:
            raise store_error(flush, "s3://b/k")
        return (task, 1, 2, False)

    monkeypatch.setattr(scan_workers, "scan_unit_once", flaky)
    monkeypatch.setattr(scan_workers.time, "sleep", lambda s: None)
    assert scan_workers.scan_unit("unit", None, None) == ("unit", 1, 2, False) and len(calls) == scan_workers.UNIT_ATTEMPTS
    calls.clear()
    monkeypatch.setattr(scan_workers, "scan_unit_once", lambda task, ds, tables: (calls.append(task), (_ for _ in ()).throw(store_error(flush, "s3://b/k")))[1])
    with pytest.raises(Exception, match="Failed to flush"):
        scan_workers.scan_unit("unit", None, None)
    assert len(calls) == scan_workers.UNIT_ATTEMPTS
    calls.clear()

    def bad_input(task, ds, tables):
        calls.append(task)
        raise InputError("s3://b/k: unreadable parquet file")

    monkeypatch.setattr(scan_workers, "scan_unit_once", bad_input)
    with pytest.raises(InputError):
        scan_workers.scan_unit("unit", None, None)
    assert len(calls) == 1
