"""dqa regen against a server that follows SGLang's contract: every selected row exactly once, retries, health.

The server is ``tests/servers/sglang_contract.py`` (a real aiohttp process standing in for
``sglang.launch_server``). The full fault campaign is in ``test_regen_faults*.py``; these tests
pin the engine's own rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from chatdata import IM_END, THINK
from dqa.regen.config import RegenConfig
from dqa.regen.run import regenerate
from regen_helpers import degenerate_dataset, read_shards, write_findings
from servers.sglang_contract import StubServer

PROGRESS_FIELDS = {
    "state", "total", "done", "ok", "failed", "truncated", "in_flight", "elapsed_s", "req_per_s", "output_tok_per_s",
    "mean_output_tokens", "eta_s", "gpus", "gpu_hour_cost", "cost_so_far", "cost_projected", "endpoints", "updated_at",
    "consecutive_turns", "same_endpoint_share", "turns_moved", "turns_parked",  # sticky dispatch (FORMATS.md)
}
FAST = dict(health_interval=0.5, health_timeout=2.0, backoff_base=0.05, backoff_max=0.3, live=False, install_signal_handlers=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("regen-data")
    path = degenerate_dataset(d / "chat.parquet", 40)
    findings = write_findings(d / "scan", list(range(0, 40, 2)))
    return path, findings


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    s = StubServer(tmp_path_factory.mktemp("stub")).start()
    yield s
    s.stop()


def _run(data, out, urls, **kw) -> tuple:
    path, findings = data
    logs: list[str] = []
    cfg = RegenConfig(dataset=str(path), out=str(out), endpoints=urls, findings=str(findings), log=logs.append, **{**FAST, **kw})
    return regenerate(cfg), logs


def _original_rows(path: Path):
    t = pq.read_table(path)
    return t.column("input_ids").to_pylist()


def test_every_selected_row_is_written_once_with_prompt_output_and_provenance(data, stub, tmp_path):
    res, _ = _run(data, tmp_path / "out", [stub.url], gpu_hour_cost=4.0, gpus=2)
    assert res.exit_code == 0 and res.state == "finished"
    t = read_shards(tmp_path / "out")
    rows = t.to_pylist()
    assert sorted(r["row"] for r in rows) == list(range(0, 40, 2))
    originals = _original_rows(data[0])
    for r in rows:
        p = r["prompt_len"]
        orig = originals[r["row"]]
        assert r["input_ids"][:p] == orig[: orig.index(THINK)]  # the prompt: up to the header, empty think dropped
        assert r["input_ids"][p] == THINK and r["input_ids"][-1] == IM_END  # the model thought, and finished
        assert r["loss_mask"] == [0] * p + [1] * r["output_tokens"]
        assert (r["status"], r["finish_reason"], r["attempts"], r["endpoint"]) == ("ok", "stop", 1, stub.url)
        assert r["id"] == f"sample-{r['row']}" and r["model"] == "Qwen/Qwen3-8B"
        assert json.loads(r["sampling"])["temperature"] == 0.6
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert set(progress) == PROGRESS_FIELDS
    assert (progress["state"], progress["done"], progress["ok"], progress["total"]) == ("finished", 20, 20, 20)
    # Cost is measured time x GPUs x price (rounded to 4 decimals: a fast run may cost ~$0.0000).
    assert progress["gpus"] == 2
    assert progress["cost_so_far"] == pytest.approx(progress["elapsed_s"] / 3600 * 2 * 4.0, abs=1e-4)
    assert progress["endpoints"][stub.url]["done"] == 20
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["endpoints"] == [stub.url] and run["identity"]["selection"]["shard"] == "0/1"


def test_a_finished_run_resumes_to_nothing_and_sends_no_request(data, stub, tmp_path):
    _run(data, tmp_path / "out", [stub.url])
    before = stub.status()["num_requests"]
    res, _ = _run(data, tmp_path / "out", [stub.url])
    assert res.exit_code == 0 and res.progress["done"] == 20
    assert stub.status()["num_requests"] == before
    assert read_shards(tmp_path / "out").num_rows == 20


def test_a_folder_made_for_another_selection_or_sampling_is_refused(data, stub, tmp_path):
    from dqa.errors import InputError

    _run(data, tmp_path / "out", [stub.url], limit=3)
    _run(data, tmp_path / "out", [stub.url], limit=5)  # a larger limit resumes the trial run
    assert read_shards(tmp_path / "out").num_rows == 5
    with pytest.raises(InputError, match="different selection"):
        _run(data, tmp_path / "out", [stub.url], reasons=["truncated"])
    with pytest.raises(InputError, match="different sampling"):
        _run(data, tmp_path / "out", [stub.url], temperature=1.0)


def test_retryable_errors_are_retried_with_a_fresh_rid_per_attempt(data, tmp_path):
    with StubServer(tmp_path, "--error-share", "0.4", "--fault-seed", "3") as s:
        res, _ = _run(data, tmp_path / "out", [s.url], max_attempts=20)
        rids = [r["rid"] for r in s.requests()]
    assert res.exit_code == 0 and res.progress["ok"] == 20
    t = read_shards(tmp_path / "out").to_pylist()
    assert max(r["attempts"] for r in t) > 1
    assert len(rids) == len(set(rids))  # never the same rid twice
    retried = [r for r in t if r["attempts"] > 1][0]
    assert {f"sample-{retried['row']}:{k}" for k in range(1, retried["attempts"] + 1)} <= set(rids)


def test_a_400_is_recorded_as_failed_and_not_retried(data, tmp_path):
    with StubServer(tmp_path, "--error-share", "1.0", "--error-statuses", "400") as s:
        res, _ = _run(data, tmp_path / "out", [s.url], limit=4)
        n = s.status()["n_generate"]
    assert res.progress["failed"] == 4 and n == 4
    # Every request of the run failed: recorded, and the run says so with exit 3 (issue 11).
    assert res.exit_code == 3 and "every request of this run failed" in res.message and "--retry-failed" in res.message
    rows = read_shards(tmp_path / "out").to_pylist()
    assert all(r["status"] == "failed" and r["attempts"] == 1 and r["error"].startswith("HTTP 400") for r in rows)


def test_hitting_max_new_tokens_is_recorded_as_length_not_hidden(data, stub, tmp_path):
    res, _ = _run(data, tmp_path / "out", [stub.url], max_new_tokens=5, limit=3)
    assert res.progress["truncated"] == 3
    rows = read_shards(tmp_path / "out").to_pylist()
    assert all(r["status"] == "length" and r["finish_reason"] == "length" and r["output_tokens"] == 5 for r in rows)


def test_prompt_plus_max_new_tokens_is_capped_to_the_servers_context(data, tmp_path):
    with StubServer(tmp_path, "--context-length", "60") as s:
        res, _ = _run(data, tmp_path / "out", [s.url], limit=2)
    rows = read_shards(tmp_path / "out").to_pylist()
    assert res.exit_code == 0
    assert all(json.loads(r["sampling"])["max_new_tokens"] == 60 - r["prompt_len"] for r in rows)


def test_an_endpoint_that_dies_is_taken_out_and_its_work_goes_to_the_other(data, tmp_path):
    with StubServer(tmp_path, "--latency-s", "0.02", name="a") as a, StubServer(tmp_path, "--latency-s", "0.02", "--die-after", "4", name="b") as b:
        res, logs = _run(data, tmp_path / "out", [a.url, b.url], max_in_flight=2)
    assert res.exit_code == 0 and res.progress["ok"] == 20
    assert sorted(read_shards(tmp_path / "out").column("row").to_pylist()) == list(range(0, 40, 2))
    assert res.progress["endpoints"][b.url]["healthy"] is False
    assert any("taken out" in m and b.url in m for m in logs)


def test_all_endpoints_down_past_the_deadline_stops_with_exit_3_and_a_rerun_finishes(data, tmp_path):
    from fleet_helpers import free_port_base

    # An explicit port below the ephemeral range: nothing else takes it while the server is down.
    s = StubServer(tmp_path, "--die-after", "6", port=free_port_base(1)).start()
    try:
        res, _ = _run(data, tmp_path / "out", [s.url], max_in_flight=1, down_deadline=1.5)
        assert res.exit_code == 3 and res.state == "failed" and "endpoints down" in res.message
        assert 0 < res.progress["done"] < 20
        s.restart("--die-after", "1000")
        res, _ = _run(data, tmp_path / "out", [s.url], down_deadline=5)
    finally:
        s.stop()
    assert res.exit_code == 0
    rows = read_shards(tmp_path / "out").column("row").to_pylist()
    assert sorted(rows) == list(range(0, 40, 2))


def test_the_api_key_is_sent_as_bearer_and_written_nowhere(data, tmp_path, monkeypatch):
    monkeypatch.setenv("DQA_TEST_KEY", "sk-very-secret")
    with StubServer(tmp_path, "--api-key", "sk-very-secret") as s:
        res, logs = _run(data, tmp_path / "out", [s.url], api_key_env="DQA_TEST_KEY", limit=3)
    assert res.exit_code == 0 and res.progress["ok"] == 3
    for f in (tmp_path / "out").rglob("*"):
        if f.is_file():
            assert b"sk-very-secret" not in f.read_bytes(), f
    assert not any("sk-very-secret" in m for m in logs)


def test_a_missing_api_key_variable_is_a_usage_error(data, stub, tmp_path, monkeypatch):
    from dqa.errors import UsageError

    monkeypatch.delenv("DQA_TEST_NO_KEY", raising=False)
    with pytest.raises(UsageError, match="DQA_TEST_NO_KEY"):
        _run(data, tmp_path / "out", [stub.url], api_key_env="DQA_TEST_NO_KEY")


def test_retry_failed_sends_failed_rows_again_and_replaces_their_records(data, tmp_path):
    with StubServer(tmp_path, "--error-share", "1.0", "--error-statuses", "400") as s:
        _run(data, tmp_path / "out", [s.url], limit=4)
        s.control(error_share=0.0)
        res, _ = _run(data, tmp_path / "out", [s.url], limit=4)
        assert res.progress["failed"] == 4  # a plain rerun keeps recorded failures
        res, _ = _run(data, tmp_path / "out", [s.url], limit=4, retry_failed=True)
    assert res.progress["ok"] == 4 and res.progress["failed"] == 0
    rows = read_shards(tmp_path / "out").to_pylist()
    assert sorted(r["row"] for r in rows) == [0, 2, 4, 6] and all(r["status"] == "ok" for r in rows)


def test_shards_are_copied_to_a_mirror_and_out_may_be_a_url(data, stub, tmp_path):
    import fsspec

    res, _ = _run(data, "memory://dqa-test/run1", [stub.url], mirror=[f"file://{tmp_path / 'mirror'}"], shard_rows=7)
    assert res.exit_code == 0
    fs = fsspec.filesystem("memory")
    remote = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/dqa-test/run1/shards", detail=False))
    mirrored = sorted(p.name for p in (tmp_path / "mirror" / "shards").glob("*.parquet"))
    assert remote == mirrored and len(mirrored) >= 1
    assert fs.exists("/dqa-test/run1/run.json") and fs.exists("/dqa-test/run1/progress.json")
    rows = np.concatenate([pq.read_table(p).column("row").to_numpy() for p in (tmp_path / "mirror" / "shards").glob("*.parquet")])
    assert sorted(rows.tolist()) == list(range(0, 40, 2))


def test_cli_prints_the_final_progress_as_json(data, stub, tmp_path, cli):
    path, findings = data
    r = cli("regen", path, "--findings", findings, "-e", stub.url, "--out", tmp_path / "out", "--limit", "2", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["done"] == 2


def test_cli_rejects_both_endpoint_and_fleet(data, stub, tmp_path, cli):
    path, findings = data
    r = cli("regen", path, "--findings", findings, "-e", stub.url, "--fleet", tmp_path / "f.json", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "not both" in r.stderr


def test_a_fleet_file_names_the_endpoints_model_and_gpu_count(data, stub, tmp_path):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({
        "version": 1, "engine": "sglang", "protocol": "sglang", "model": "/dev/shm/Qwen3-27B", "created_at": "2026-11-30T08:00:00Z",
        "endpoints": [{"url": stub.url, "gpu": "0,1", "pid": 1, "log": "logs/gpu0.log", "host": "127.0.0.1", "cmd": []}],
    }))
    path, findings = data
    res = regenerate(RegenConfig(dataset=str(path), out=str(tmp_path / "out"), fleet=str(fleet), findings=str(findings), limit=2, **FAST))
    assert res.exit_code == 0 and res.progress["gpus"] == 2
    assert {r["model"] for r in read_shards(tmp_path / "out").to_pylist()} == {"/dev/shm/Qwen3-27B"}


def test_a_row_without_an_assistant_header_is_recorded_as_failed_and_never_sent(stub, tmp_path):
    from chatdata import render, write_parquet

    ok = render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "OK."}], enable_thinking=False)
    user_only = render([{"role": "user", "content": "Only a question"}])
    path = write_parquet(tmp_path / "d.parquet", [ok, user_only], ["sample-0", "sample-1"])
    findings = write_findings(tmp_path / "scan", [0, 1])
    before = stub.status()["num_requests"]
    res = regenerate(RegenConfig(dataset=str(path), out=str(tmp_path / "out"), endpoints=[stub.url], findings=str(findings), **FAST))
    rows = {r["row"]: r for r in read_shards(tmp_path / "out").to_pylist()}
    assert res.exit_code == 0 and rows[0]["status"] == "ok"
    assert rows[1]["status"] == "failed" and rows[1]["error"] == "row 1: no assistant header in input_ids; nothing to regenerate from"
    assert rows[1]["attempts"] == 0 and stub.status()["num_requests"] == before + 1


def test_a_non_empty_folder_not_made_by_regen_is_refused(data, stub, tmp_path):
    from dqa.errors import InputError

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train.parquet").write_bytes(b"precious")
    with pytest.raises(InputError, match="not a dqa regen output folder"):
        _run(data, tmp_path / "out", [stub.url])
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["train.parquet"]


def test_a_smaller_limit_after_a_larger_one_counts_only_its_own_rows_tokens(data, stub, tmp_path):
    _run(data, tmp_path / "out", [stub.url], limit=6)
    res, _ = _run(data, tmp_path / "out", [stub.url], limit=3)
    t = read_shards(tmp_path / "out").to_pylist()
    mine = sorted(t, key=lambda r: r["row"])[:3]
    assert (res.progress["total"], res.progress["done"], res.progress["ok"]) == (3, 3, 3)
    assert res.progress["mean_output_tokens"] == round(sum(r["output_tokens"] for r in mine) / 3, 1)


def test_url_credentials_stay_out_of_logs_run_json_and_the_shared_temp_folder(data, stub, tmp_path, monkeypatch):
    import fsspec

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    res, logs = _run(data, "memory://AKIAUSER:s3cr3t-pass@dqa-cred/run", [stub.url], limit=2,
                     mirror=["memory://mirroruser:m1rr0r-pass@dqa-cred/mirror"])
    assert res.exit_code == 0 and logs
    assert not any("s3cr3t" in m or "m1rr0r" in m for m in logs), logs
    assert "s3cr3t" not in res.out
    stage = next((tmp_path / "cache" / "dqa" / "regen-stage").iterdir())
    assert (tmp_path / "cache" / "dqa").stat().st_mode & 0o777 == 0o700
    for f in stage.rglob("*"):
        if f.is_file():
            assert b"s3cr3t" not in f.read_bytes() and b"m1rr0r" not in f.read_bytes(), f
    fs = fsspec.filesystem("memory")  # the URL itself still reaches the backend
    assert fs.exists("/AKIAUSER:s3cr3t-pass@dqa-cred/run/run.json")
    assert fs.exists("/mirroruser:m1rr0r-pass@dqa-cred/mirror/run.json")


def test_the_staging_root_is_private_and_must_be_ours(tmp_path, monkeypatch):
    import os

    from dqa.errors import RuntimeFailure
    from dqa.regen.store.upload import stage_dir

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    d = stage_dir("s3://key:secret@bucket/run")
    root = tmp_path / f"dqa-{os.getuid()}"
    assert d.parent.parent == root and root.stat().st_mode & 0o777 == 0o700
    assert d == stage_dir("s3://other:creds@bucket/run")  # named by the URL without its credentials
    root.chmod(0o777)
    stage_dir("s3://bucket/run")
    assert root.stat().st_mode & 0o777 == 0o700  # opened up meanwhile: closed again
    monkeypatch.setattr(os, "getuid", lambda: 4242)  # a folder at our name made by someone else (here: uid of the test)
    (tmp_path / "dqa-4242").mkdir(mode=0o700)
    with pytest.raises(RuntimeFailure, match="not a folder owned by this user"):
        stage_dir("s3://bucket/run")
    monkeypatch.setattr(os, "getuid", lambda: 4243)  # a link planted at our name
    os.symlink(tmp_path / "elsewhere", tmp_path / "dqa-4243")
    with pytest.raises(RuntimeFailure, match="not a folder owned by this user"):
        stage_dir("s3://bucket/run")


def test_row_count_of_a_jsonl_dataset_reads_no_tokens(tmp_path, monkeypatch):
    from dqa.audit.readers import Dataset, open_dataset
    from dqa.regen.run_inputs import count_rows

    path = degenerate_dataset(tmp_path / "d.parquet", 7)
    t = pq.read_table(path)
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in t.to_pylist()))

    def no_tokens(self, *a, **k):
        raise AssertionError("token batches decoded just to count rows")

    monkeypatch.setattr(Dataset, "batches", no_tokens)
    assert count_rows(open_dataset(jsonl)) == 7


def test_cli_prints_a_summary_line_on_stdout_and_nothing_with_quiet(data, stub, tmp_path, cli):
    path, findings = data
    r = cli("regen", path, "--findings", findings, "-e", stub.url, "--out", tmp_path / "out", "--limit", "2", "-t", "qwen3")
    assert r.exit_code == 0, r.stderr
    (line,) = r.stdout.splitlines()
    assert "2 of 2 rows recorded" in line and str(tmp_path / "out") in line
    r = cli("regen", path, "--findings", findings, "-e", stub.url, "--out", tmp_path / "out", "--limit", "3", "--quiet")
    assert r.exit_code == 0 and r.stdout == "" and r.stderr == ""
    assert read_shards(tmp_path / "out").num_rows == 3


def test_cli_help_lists_the_column_options_of_scan(cli):
    r = cli("regen", "--help")
    for opt in ("--ids-column", "--mask-column", "--labels-column", "--id-column", "-t", "--quiet"):
        assert opt in r.stdout, opt
