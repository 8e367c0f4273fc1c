"""The run folder's owner (``dqa.regen.store.folder``) and ``RegenConfig``'s checked groups (issue 11, "Shape").

run.json is read by one parser: files written before ``version`` existed read as version 1, a
newer version or a malformed file is one ``InputError`` line naming the file; ``RegenConfig`` is
built from small frozen groups, each refusing its own bad options, and the flat keyword form
builds the same groups."""

from __future__ import annotations

import json

import pytest

from dqa.errors import InputError, UsageError
from dqa.regen.config import DatasetSpec, DispatchSpec, OutputSpec, RegenConfig, Retries, SamplingSpec, Selection, Timeouts
from dqa.regen.store.folder import RUN_VERSION, RunFolder, RunManifest
from dqa.regen.store.shards import STATUSES, ShardStatus


def test_a_manifest_round_trips_with_every_key_in_file_order(tmp_path):
    m = RunManifest(identity={"dataset": {"rows": 7}, "selection": {"shard": "0/1"}}, dataset_path="/d", findings="/f",
                    limit=3, protocol="sglang", endpoints=("http://a",), max_in_flight=8, gpus=2, gpu_hour_cost=1.5,
                    tokenizer="qwen3", servers={"http://a": None}, updated_at="2026-01-01T00:00:00Z")
    m.write(tmp_path / "run.json")
    obj = json.loads((tmp_path / "run.json").read_text())
    assert list(obj) == ["version", "identity", "dataset_path", "findings", "columns", "limit", "protocol", "model", "endpoints",
                         "max_in_flight", "gpus", "gpu_hour_cost", "tokenizer", "mirror", "servers", "seed_applied", "updated_at"]
    assert obj["version"] == RUN_VERSION == 1
    back = RunFolder(tmp_path).manifest()
    assert back == m and back.dataset_rows == 7 and back.selection == {"shard": "0/1"}


def test_a_run_json_without_version_or_keys_reads_as_version_1(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"dataset_path": "/data/x.parquet"}))
    m = RunManifest.read(tmp_path / "run.json")
    assert m.version == 1 and m.dataset_path == "/data/x.parquet" and m.identity == {} and m.column("ids") is None
    assert m.selection is None and m.dataset_rows is None
    assert RunFolder(tmp_path / "none").manifest() is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"version": 2}', "version 2 was written by a newer dqa"),
        ('{"version": "1"}', "expected a whole number"),
        ("[1, 2]", "not a JSON object"),
        ('{"version": 1, "identity": ', "not valid JSON"),
        ('{"limit": "ten"}', "'limit' is \"ten\"; expected a whole number"),
        ('{"endpoints": "http://a"}', "'endpoints' is \"http://a\"; expected a list of URLs"),
    ],
)
def test_a_malformed_or_newer_run_json_is_one_input_error_naming_the_file(tmp_path, text, expected):
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(InputError) as err:
        RunManifest.read(tmp_path / "run.json")
    msg = str(err.value)
    assert msg.startswith(str(tmp_path / "run.json")) and expected in msg and "\n" not in msg


def test_shard_statuses_are_the_strings_and_codes_shards_use():
    assert STATUSES == ("ok", "length", "failed")
    assert [s.code for s in ShardStatus] == [0, 1, 2] and ShardStatus.LENGTH == "length" and str(ShardStatus.FAILED) == "failed"


def test_flat_keywords_build_the_same_groups():
    flat = RegenConfig(dataset="d.parquet", out="o", endpoints=["http://a"], max_in_flight=4, max_attempts=2, health_timeout=1.0,
                       shard="1/2", turns="all", max_new_tokens=9, shard_rows=5, tokenizer=None, live=False)
    grouped = RegenConfig(
        data=DatasetSpec("d.parquet", tokenizer=None), selection=Selection(shard="1/2", turns="all"),
        sampling=SamplingSpec(max_new_tokens=9),
        dispatch=DispatchSpec(endpoints=("http://a",), max_in_flight=4, timeouts=Timeouts(health=1.0), retries=Retries(max_attempts=2)),
        output=OutputSpec("o", shard_rows=5), live=False,
    )
    assert flat == grouped and grouped.selection.shard_pair == (1, 2)
    with pytest.raises(TypeError, match="unknown option 'bogus'"):
        RegenConfig(dataset="d", out="o", endpoints=["http://a"], bogus=1)


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: DispatchSpec(), "not both and not neither"),
        (lambda: DispatchSpec(endpoints=("http://a",), fleet="f.json"), "not both and not neither"),
        (lambda: DispatchSpec(endpoints=("http://a",), protocol="grpc"), "expected sglang or openai"),
        (lambda: DispatchSpec(endpoints=("http://a",), max_in_flight=0), "--max-in-flight must be >= 1"),
        (lambda: Retries(max_attempts=0), "--max-attempts must be >= 1"),
        (lambda: SamplingSpec(max_new_tokens=0), "--max-new-tokens must be >= 1"),
        (lambda: Selection(turns="some"), "--turns 'some'"),
        (lambda: Selection(shard="2/2"), "expected 0 <= i < N"),
        (lambda: OutputSpec("o", shard_rows=0), "--shard-rows must be >= 1"),
    ],
)
def test_each_group_refuses_its_own_bad_options(build, expected):
    with pytest.raises(UsageError, match=expected):
        build()


def test_a_run_folder_from_before_multi_turn_resumes_with_turns_last(tmp_path):
    """A folder written by dqa before multi-turn regeneration (checked by hand with that release: a
    run killed with SIGKILL mid-way resumed this way, exactly once, and merged) has no ``turns`` in
    its selection and shards without ``turn``/``turns``/``kept_len``. It regenerated final turns only,
    so it resumes with ``--turns last``; the default (``flagged``) is refused naming that option,
    not as "a different selection" that no option could match."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from regen_helpers import degenerate_dataset, write_findings
    from servers.sglang_contract import StubServer

    def dqa(*args):
        return subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], capture_output=True, text=True, timeout=240)

    data = degenerate_dataset(tmp_path / "data.parquet", 40)
    findings = write_findings(tmp_path / "scan", list(range(40)))
    out = tmp_path / "run"
    with StubServer(tmp_path / "stub", "--zero-latency") as server:
        args = ("regen", data, "--findings", findings, "-e", server.url, "--out", out)
        r = dqa(*args, "--turns", "last")
        assert r.returncode == 0, r.stderr
        # Make it the old layout, as a run stopped after 15 rows left it.
        manifest = json.loads((out / "run.json").read_text())
        del manifest["identity"]["selection"]["turns"]
        (out / "run.json").write_text(json.dumps(manifest))
        shards = sorted((out / "shards").glob("*.parquet"))
        old = pq.read_table(shards).drop(["turn", "turns", "kept_len"]).sort_by("row").slice(0, 15)
        for s in shards:
            s.unlink()
        pq.write_table(old, out / "shards" / "part-s0of1-000000.parquet")

        r = dqa(*args)
        assert r.returncode == 2
        assert r.stderr.strip() == f"dqa: error: {out}: made with --turns last; rerun with --turns last to resume, or use another --out"
        r = dqa(*args, "--turns", "last")
        assert r.returncode == 0, r.stderr
    rows = [r for s in sorted((out / "shards").glob("*.parquet")) for r in pq.read_table(s, columns=["row"]).column("row").to_pylist()]
    assert sorted(rows) == list(range(40)), "the 15 old rows kept, the 25 others regenerated, each once"
    m = dqa("merge", data, "--regen", out, "--out", tmp_path / "merged.parquet", "--json")
    assert m.returncode == 0, m.stderr
    assert json.loads(m.stdout)["replaced"] == 40
