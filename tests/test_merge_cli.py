"""Specification of the `dqa merge` command line: summary, --json, and one-line exit-2/3 errors
for bad input that never leave an output behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from merge_helpers import base_table, read_back, sample_rows, shard_record, write_dataset, write_shard

N = 6


@pytest.fixture(scope="module")
def rows():
    return sample_rows(N)


@pytest.fixture()
def setup(tmp_path, rows):
    """A parquet dataset, a regen folder replacing row 2 and failing row 4, and an output path."""
    ids = [f"c{i}" for i in range(N)]
    src = write_dataset(base_table(rows, ids), tmp_path / "train.parquet", "parquet")
    regen = tmp_path / "regen"
    write_shard(regen / "shards" / "part-a-000000.parquet",
                [shard_record(2, rows[2][0], ids[2]), shard_record(4, rows[4][0], ids[4], status="failed")])
    return src, regen, tmp_path / "train.v2.parquet", ids


def one_line_error(result, *words: str) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dqa: error: ")
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def nothing_written(out: Path) -> bool:
    return not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-" + out.name)]


def test_merge_prints_its_summary_line_on_stdout_like_the_other_commands(cli, setup):
    src, regen, out, _ = setup
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 0, r.stderr
    (line,) = r.stdout.splitlines()
    assert "1 replaced" in line and "1 could not be regenerated" in line and str(out) in line
    assert "1 replaced" not in r.stderr  # stderr: progress and notes only
    assert read_back(out).num_rows == N


def test_merge_json_replaces_the_summary_line_on_stdout(cli, setup):
    src, regen, out, _ = setup
    r = cli("merge", src, "--regen", regen, "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["rows_in"] == N and summary["replaced"] == 1 and summary["kept"] == 1
    assert summary["dropped"] == 0 and summary["rows_out"] == N
    assert summary["output"] == str(out) and summary["report"] == str(out) + ".merge-report.json"
    assert "replaced" not in r.stderr
    assert read_back(out).num_rows == N


def test_failed_drop_via_the_command_line(cli, setup):
    src, regen, out, ids = setup
    r = cli("merge", src, "--regen", regen, "--out", out, "--failed", "drop", "--quiet")
    assert r.exit_code == 0 and r.stderr == "" and r.stdout == ""
    assert read_back(out).column("id").to_pylist() == [i for k, i in enumerate(ids) if k != 4]


def test_help_teaches_the_command(cli):
    r = cli("merge", "--help")
    assert r.exit_code == 0
    for words in ("--regen", "--failed", "merge-report.json", "Example", "dqa_regen", "labels"):
        assert words in r.stdout


def test_missing_regen_folder_is_exit_2(cli, setup, tmp_path):
    src, _, out, _ = setup
    r = cli("merge", src, "--regen", tmp_path / "nope", "--out", out)
    assert r.exit_code == 2
    one_line_error(r, "nope", "no such folder")
    assert nothing_written(out)


def test_regen_folder_without_shards_is_exit_2(cli, setup, tmp_path):
    src, _, out, _ = setup
    (tmp_path / "empty").mkdir()
    r = cli("merge", src, "--regen", tmp_path / "empty", "--out", out)
    assert r.exit_code == 2
    one_line_error(r, "no shards/ folder")


def test_shard_rows_beyond_the_dataset_are_exit_2(cli, setup, rows):
    src, regen, out, _ = setup
    write_shard(regen / "shards" / "part-a-000001.parquet", [shard_record(N + 3, rows[0][0], None)])
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 2
    one_line_error(r, f"row {N + 3}", "beyond the dataset", "part-a-000001.parquet")
    assert nothing_written(out)


def test_rows_beyond_a_jsonl_dataset_are_found_after_streaming_and_leave_nothing(cli, tmp_path, rows):
    ids = [f"c{i}" for i in range(N)]
    src = write_dataset(base_table(rows, ids), tmp_path / "train.jsonl", "jsonl")
    regen = tmp_path / "regen"
    write_shard(regen / "shards" / "part-a-000000.parquet", [shard_record(N, rows[0][0], None)])
    out = tmp_path / "new.jsonl"
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 2
    one_line_error(r, f"row {N}", "beyond the dataset")
    assert nothing_written(out)
    assert not (tmp_path / "new.jsonl.merge-report.json").exists()


def test_truncated_shard_is_exit_2(cli, setup):
    src, regen, out, _ = setup
    shard = regen / "shards" / "part-a-000000.parquet"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 2
    one_line_error(r, "part-a-000000.parquet", "unreadable or truncated")
    assert nothing_written(out)


def test_shard_without_required_columns_is_exit_2(cli, setup):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src, regen, out, _ = setup
    pq.write_table(pa.table({"row": [1], "status": ["ok"]}), regen / "shards" / "part-a-000009.parquet")
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 2
    one_line_error(r, "part-a-000009.parquet", "input_ids")


def test_existing_output_needs_force(cli, setup):
    src, regen, out, _ = setup
    out.write_bytes(b"old")
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 2
    one_line_error(r, "already exists", "--force")
    assert out.read_bytes() == b"old"
    r = cli("merge", src, "--regen", regen, "--out", out, "--force")
    assert r.exit_code == 0
    assert read_back(out).num_rows == N


def test_existing_folder_output_is_replaced_whole_with_force(cli, tmp_path, rows):
    ids = [f"c{i}" for i in range(N)]
    src = write_dataset(base_table(rows, ids), tmp_path / "data", "hf")
    regen = tmp_path / "regen"
    write_shard(regen / "shards" / "part-a-000000.parquet", [shard_record(2, rows[2][0], ids[2])])
    out = tmp_path / "new"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    assert cli("merge", src, "--regen", regen, "--out", out).exit_code == 2
    r = cli("merge", src, "--regen", regen, "--out", out, "--force")
    assert r.exit_code == 0, r.stderr
    assert not (out / "stale.txt").exists()
    assert read_back(out).num_rows == N


@pytest.mark.parametrize("target", ["input", "inside"])
def test_refuses_to_overwrite_the_input_even_with_force(cli, tmp_path, rows, target):
    ids = [f"c{i}" for i in range(N)]
    src = write_dataset(base_table(rows, ids), tmp_path / "data", "parquet-dir")
    regen = tmp_path / "regen"
    write_shard(regen / "shards" / "part-a-000000.parquet", [shard_record(2, rows[2][0], ids[2])])
    out = src if target == "input" else src / "sub"
    before = sorted(p.read_bytes() for p in src.rglob("*.parquet"))
    r = cli("merge", src, "--regen", regen, "--out", out, "--force")
    assert r.exit_code == 2
    one_line_error(r, "refusing to overwrite")
    assert sorted(p.read_bytes() for p in src.rglob("*.parquet")) == before


def test_output_suffix_must_match_the_input_format(cli, setup, tmp_path):
    src, regen, _, _ = setup
    r = cli("merge", src, "--regen", regen, "--out", tmp_path / "new.jsonl")
    assert r.exit_code == 2
    one_line_error(r, ".parquet")


def test_a_row_twice_in_the_shards_is_exit_3_naming_the_row(cli, setup, rows):
    src, regen, out, ids = setup
    write_shard(regen / "shards" / "part-a-000001.parquet", [shard_record(2, rows[2][0], ids[2])])
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 3
    one_line_error(r, "row 2 twice", "part-a-000000.parquet", "part-a-000001.parquet")
    assert nothing_written(out)


def test_shards_of_another_dataset_are_refused_by_id(cli, setup, rows):
    src, regen, out, _ = setup
    write_shard(regen / "shards" / "part-a-000001.parquet", [shard_record(3, rows[3][0], "someone-else")])
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 2
    one_line_error(r, "row 3", "someone-else", "c3")


def test_shards_of_another_dataset_are_refused_by_prompt_tokens(cli, setup, rows):
    src, regen, out, _ = setup
    # row 3's shard carries row 5's prompt (no id to compare): the prompt check catches it
    write_shard(regen / "shards" / "part-a-000001.parquet", [shard_record(3, rows[5][0], None)])
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 2
    one_line_error(r, "row 3", "prompt differs")
    assert nothing_written(out)
    r = cli("merge", src, "--regen", regen, "--out", out, "--no-check-prompts")
    assert r.exit_code == 0


def test_bad_failed_policy_is_a_usage_error(cli, setup):
    src, regen, out, _ = setup
    r = cli("merge", src, "--regen", regen, "--out", out, "--failed", "maybe")
    assert r.exit_code == 2
    one_line_error(r, "--failed maybe")


def test_unknown_shard_status_is_exit_2(cli, setup, rows):
    src, regen, out, ids = setup
    rec = shard_record(3, rows[3][0], ids[3])
    rec["status"] = "done"
    write_shard(regen / "shards" / "part-a-000001.parquet", [rec])
    r = cli("merge", src, "--regen", regen, "--out", out)
    assert r.exit_code == 2
    one_line_error(r, "row 3", "'done'")


def test_disk_full_while_writing_is_exit_3_and_leaves_nothing(cli, tmp_path, rows, monkeypatch):
    import errno

    from dqa.audit import writers

    ids = [f"c{i}" for i in range(N)]
    src = write_dataset(base_table(rows, ids), tmp_path / "data", "parquet-dir", shards=3)
    regen = tmp_path / "regen"
    write_shard(regen / "shards" / "part-a-000000.parquet", [shard_record(2, rows[2][0], ids[2])])
    out = tmp_path / "new"
    real_write = writers._FileSink.write
    calls = []

    def full_disk(self, batch):
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.tmp))
        return real_write(self, batch)

    monkeypatch.setattr(writers._FileSink, "write", full_disk)
    r = cli("merge", src, "--regen", regen, "--out", out, "--batch-rows", "1")
    assert r.exit_code == 3
    one_line_error(r, "No space left on device")
    assert nothing_written(out)
    assert not (tmp_path / "new.merge-report.json").exists()
