"""Hostile and broken input for `dqa validate`, `dqa gate` and `dqa merge` (scan's own input
checks are in tests/test_scan_inputs.py): every case exits 2 with exactly one line on stderr that
names the file (and the row or column where one is to blame), and leaves nothing behind that
looks complete: no output folder or file, no scan folder, no merge report, no temp files.

Three layers of input: the dataset itself (all three commands read it), a scan folder's
``metrics.parquet`` / ``summary.json`` (validate and gate reuse them), and a regen output
folder's shards and ``run.json`` (merge reads them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

IM_START, IM_END, NL, ASSISTANT, USER, THINK, END_THINK = 151644, 151645, 198, 77091, 872, 151667, 151668


def good_rows(n: int = 30) -> tuple[list[list[int]], list[list[int]]]:
    ids, masks = [], []
    for i in range(n):
        prompt = [IM_START, USER, NL, 1000 + i, 2000 + i, IM_END, NL, IM_START, ASSISTANT, NL]
        answer = [THINK, 3000 + i, 3100 + i, 3200 + i, END_THINK, 271, 4000 + i, 4100 + i, 13, IM_END]
        ids.append(prompt + answer)
        masks.append([0] * len(prompt) + [1] * len(answer))
    return ids, masks


def table(ids, sup, name: str = "loss_mask", sup_type=pa.uint8(), ids_type=pa.int32()) -> pa.Table:
    return pa.table({"id": [f"s{i}" for i in range(len(ids))], "input_ids": pa.array(ids, pa.list_(ids_type)),
                     name: pa.array(sup, pa.list_(sup_type))})


# --------------------------------------------------------------------------- hostile datasets
# Each builder writes into folder ``d`` and returns (dataset path, [substrings the error line must hold]).


def truncated_parquet(d: Path):
    p = d / "train.parquet"
    pq.write_table(table(*good_rows()), p)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    return p, ["train.parquet"]


def empty_file(d: Path):
    p = d / "train.parquet"
    p.write_bytes(b"")
    return p, ["train.parquet"]


def zero_rows(d: Path):
    p = d / "train.parquet"
    pq.write_table(table([], []), p)
    return p, ["train.parquet", "no rows"]


def ids_as_strings(d: Path):
    ids, masks = good_rows()
    p = d / "train.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[str(t) for t in r] for r in ids]), "loss_mask": pa.array(masks)}), p)
    return p, ["train.parquet", "input_ids"]


def mask_as_floats(d: Path):
    ids, masks = good_rows()
    p = d / "train.parquet"
    pq.write_table(table(ids, [[float(m) for m in r] for r in masks], sup_type=pa.float32()), p)
    return p, ["train.parquet", "loss_mask"]


def null_inside_mask(d: Path):
    ids, masks = good_rows()
    masks[7][3] = None
    p = d / "train.parquet"
    pq.write_table(table(ids, masks), p)
    return p, ["train.parquet", "row 7", "loss_mask"]


def negative_id(d: Path):
    ids, masks = good_rows()
    ids[11][4] = -5
    p = d / "train.parquet"
    pq.write_table(table(ids, masks, ids_type=pa.int64()), p)
    return p, ["train.parquet", "row 11", "negative"]


def id_beyond_vocabulary(d: Path):
    ids, masks = good_rows()
    ids[23][2] = 151_669  # one past Qwen3's last id
    p = d / "train.parquet"
    pq.write_table(table(ids, masks), p)
    return p, ["train.parquet", "row 23", "151669"]


def mixed_conventions(d: Path):
    ids, masks = good_rows()
    root = d / "train"
    root.mkdir()
    pq.write_table(table(ids[:15], masks[:15]), root / "part-0.parquet")
    labels = [[t if m else -100 for t, m in zip(r, k)] for r, k in zip(ids[15:], masks[15:])]
    pq.write_table(table(ids[15:], labels, name="labels", sup_type=pa.int64()), root / "part-1.parquet")
    return root, ["part-1.parquet", "convention"]


def jsonl_bad_line(d: Path):
    ids, masks = good_rows(6)
    lines = [json.dumps({"input_ids": i, "loss_mask": m}) for i, m in zip(ids, masks)]
    lines[3] = lines[3][:40]  # a line cut short
    p = d / "train.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p, ["train.jsonl", "line 4"]


def specforge_cache_two_sequences_in_a_row(d: Path):
    """SpecForge's tokenized cache (``datasets`` ``.map(cache_file_name=KEY.pkl)`` of [1, L] rows,
    specforge/data/preprocessing.py), except that row 7 holds two sequences: shape [2, L]."""
    import datasets

    datasets.disable_progress_bars()
    ids, masks = good_rows()

    def preprocess(examples):
        out = {"input_ids": [], "loss_mask": [], "attention_mask": []}
        for i in examples["row"]:
            k = 2 if i == 7 else 1
            out["input_ids"].append([ids[i]] * k)
            out["loss_mask"].append([masks[i]] * k)
            out["attention_mask"].append([[1] * len(ids[i])] * k)
        return out

    p = d / "train.pkl"
    datasets.Dataset.from_dict({"row": list(range(len(ids)))}).map(
        preprocess, batched=True, batch_size=1000, remove_columns=["row"], cache_file_name=str(p))
    return p, ["train.pkl", "'input_ids'", "row 7", "shape [2, ", "[1, L]"]


def python_pickle_named_pkl(d: Path):
    import pickle

    p = d / "train.pkl"
    p.write_bytes(pickle.dumps({"input_ids": good_rows()[0]}))
    return p, ["train.pkl", "unknown format", "pickle"]


DATASETS = [truncated_parquet, empty_file, zero_rows, ids_as_strings, mask_as_floats, null_inside_mask, negative_id,
            id_beyond_vocabulary, mixed_conventions, jsonl_bad_line, specforge_cache_two_sequences_in_a_row,
            python_pickle_named_pkl]


def assert_one_line(r, must: list[str]) -> str:
    """Exit 2 and one error line, the last; only merge's notes about run.json may precede it."""
    assert r.exit_code == 2, f"exit {r.exit_code}: {r.stderr[-1500:]}"
    lines = r.stderr.splitlines()
    assert lines and lines[-1].startswith("dqa: error: "), r.stderr[-1500:]
    assert all(line.startswith("dqa merge: note: ") for line in lines[:-1]), r.stderr[-1500:]
    r = type("R", (), {"stderr": lines[-1] + "\n"})
    for s in must:
        assert s in r.stderr, f"{s!r} not in: {r.stderr}"
    return r.stderr.strip()


def assert_nothing_left(root: Path, *absent: Path) -> None:
    """No file under each of ``absent`` (an empty parent folder made on the way is not output) and no temp file."""
    for p in absent:
        assert not p.is_file() and not (p.is_dir() and any(q.is_file() for q in p.rglob("*"))), f"{p} left behind"
    temps = [str(p) for p in root.rglob(".tmp-*")]
    assert not temps, f"temp files left behind: {temps}"


@pytest.fixture()
def here(tmp_path, monkeypatch):
    """Run in an empty folder, so default output folders (dqa-out/...) land where the test looks."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


@pytest.mark.parametrize("build", DATASETS, ids=[b.__name__ for b in DATASETS])
def test_validate_rejects_a_broken_dataset_in_one_line_and_writes_nothing(cli, here, tmp_path, build):
    path, must = build(tmp_path)
    out, scan_out = tmp_path / "validation", tmp_path / "scan"
    r = cli("validate", path, "--out", out, "--scan-out", scan_out, "--no-docs")
    assert_one_line(r, must)
    assert_nothing_left(tmp_path, out, scan_out, here / "dqa-out")


@pytest.mark.parametrize("build", DATASETS, ids=[b.__name__ for b in DATASETS])
def test_gate_rejects_a_broken_release_or_baseline_in_one_line_and_writes_nothing(cli, here, tmp_path, build):
    (tmp_path / "bad").mkdir()
    path, must = build(tmp_path / "bad")
    good = tmp_path / "good.parquet"
    pq.write_table(table(*good_rows()), good)
    out = tmp_path / "gate"
    assert_one_line(cli("gate", path, "--out", out, "--no-docs"), must)
    assert_nothing_left(tmp_path, out, here / "dqa-out")
    # The same file as the baseline of a good release: the good release may be scanned, but no gate verdict appears.
    r = cli("gate", good, "--baseline", path, "--out", out, "--no-docs")
    assert_one_line(r, must)
    assert_nothing_left(tmp_path, out)
    assert not list(here.rglob("gate.json"))


def regen_folder(folder: Path, rows: list[int], ids: list[list[int]]) -> Path:
    """A regen output folder whose one shard replaces ``rows`` (prompt = the first 10 tokens)."""
    import numpy as np

    from dqa.regen.store.journal import Result, results_table, write_table

    results = [Result(r, f"s{r}", np.array(ids[r][:10], np.int32), np.array([THINK, 5, 6, END_THINK, 271, 7, IM_END], np.int32),
                      "ok", "stop", None, "http://127.0.0.1:1", 1, 0.1, "m", "{}", r, 1.7e9) for r in rows]
    (folder / "shards").mkdir(parents=True)
    write_table(folder / "shards" / "part-s0of1-000000.parquet", results_table(results))
    return folder


MERGE_DATASETS = [b for b in DATASETS if b is not id_beyond_vocabulary]


@pytest.mark.parametrize("build", MERGE_DATASETS, ids=[b.__name__ for b in MERGE_DATASETS])
def test_merge_rejects_a_broken_dataset_in_one_line_and_writes_nothing(cli, here, tmp_path, build):
    (tmp_path / "bad").mkdir()
    path, must = build(tmp_path / "bad")
    if build is zero_rows:
        must = ["train.parquet", "0 rows"]
    regen = regen_folder(tmp_path / "regen", [0, 2], good_rows()[0])
    new = tmp_path / ("new" + ("" if path.is_dir() else "".join(path.suffixes)))
    r = cli("merge", path, "--regen", regen, "--out", new)
    assert_one_line(r, must)
    assert_nothing_left(tmp_path, new, tmp_path / (new.name + ".merge-report.json"))


# --------------------------------------------------------------------------- hostile scan folders


@pytest.fixture()
def scan_folder(cli, tmp_path):
    p = tmp_path / "data.parquet"
    pq.write_table(table(*good_rows(40)), p)
    folder = tmp_path / "scan"
    r = cli("scan", p, "--out", folder, "--quiet")
    assert r.exit_code in (0, 1), r.stderr
    return folder


def _rewrite_metrics(folder: Path, fn) -> None:
    t = pq.read_table(folder / "metrics.parquet")
    pq.write_table(fn(t), folder / "metrics.parquet")


def metrics_truncated(f: Path):
    p = f / "metrics.parquet"
    p.write_bytes(p.read_bytes()[:-100])
    return ["metrics.parquet"]


def metrics_empty_file(f: Path):
    (f / "metrics.parquet").write_bytes(b"")
    return ["metrics.parquet"]


def metrics_zero_rows(f: Path):
    _rewrite_metrics(f, lambda t: t.slice(0, 0))
    return ["metrics.parquet", "no rows"]


def metrics_wrong_type(f: Path):
    def fn(t):
        i = t.schema.get_field_index("supervised_tokens")
        return t.set_column(i, "supervised_tokens", t.column(i).cast(pa.string()))
    _rewrite_metrics(f, fn)
    return ["metrics.parquet", "supervised_tokens"]


def metrics_nulls(f: Path):
    def fn(t):
        i = t.schema.get_field_index("supervised_tokens")
        vals = t.column(i).to_pylist()
        vals[5] = None
        return t.set_column(i, "supervised_tokens", pa.array(vals, pa.int64()))
    _rewrite_metrics(f, fn)
    return ["metrics.parquet", "supervised_tokens", "row 5"]


def metrics_missing_column(f: Path):
    _rewrite_metrics(f, lambda t: t.drop_columns(["supervised_tokens"]))
    return ["metrics.parquet", "supervised_tokens"]


def summary_corrupt(f: Path):
    (f / "summary.json").write_text('{"rows": 40, "checks": {')
    return ["summary.json"]


SCANS = [metrics_truncated, metrics_empty_file, metrics_zero_rows, metrics_wrong_type, metrics_nulls,
         metrics_missing_column, summary_corrupt]


@pytest.mark.parametrize("damage", SCANS, ids=[d.__name__ for d in SCANS])
def test_validate_and_gate_reject_a_damaged_scan_folder(cli, here, tmp_path, scan_folder, damage):
    must = damage(scan_folder)
    before = sorted(p.name for p in scan_folder.iterdir())
    out = tmp_path / "out"
    assert_one_line(cli("validate", scan_folder, "--out", out, "--no-docs"), must)
    assert_nothing_left(tmp_path, out)
    assert_one_line(cli("gate", scan_folder, "--out", out, "--no-docs"), must)
    assert_nothing_left(tmp_path, out)
    assert sorted(p.name for p in scan_folder.iterdir()) == before  # nothing added to the scan folder either


# --------------------------------------------------------------------------- hostile regen folders


def shard_path(regen: Path) -> Path:
    return regen / "shards" / "part-s0of1-000000.parquet"


def shard_empty_file(regen: Path):
    shard_path(regen).write_bytes(b"")
    return ["part-s0of1-000000.parquet"]


def shard_ids_as_strings(regen: Path):
    t = pq.read_table(shard_path(regen))
    i = t.schema.get_field_index("input_ids")
    t = t.set_column(i, "input_ids", pa.array([[str(x) for x in r] for r in t.column(i).to_pylist()]))
    pq.write_table(t, shard_path(regen))
    return ["part-s0of1-000000.parquet", "input_ids"]


def shard_null_row(regen: Path):
    t = pq.read_table(shard_path(regen))
    t = t.set_column(0, "row", pa.array([None] + t.column(0).to_pylist()[1:], pa.int64()))
    pq.write_table(t, shard_path(regen))
    return ["part-s0of1-000000.parquet", "row"]


def shard_null_input_ids(regen: Path):
    t = pq.read_table(shard_path(regen))
    i = t.schema.get_field_index("input_ids")
    vals = t.column(i).to_pylist()
    vals[1] = None
    t = t.set_column(i, "input_ids", pa.array(vals, pa.list_(pa.int32())))
    pq.write_table(t, shard_path(regen))
    return ["part-s0of1-000000.parquet", "input_ids", "row 2"]


def shard_negative_row(regen: Path):
    t = pq.read_table(shard_path(regen))
    t = t.set_column(0, "row", pa.array([-3] + t.column(0).to_pylist()[1:], pa.int64()))
    pq.write_table(t, shard_path(regen))
    return ["part-s0of1-000000.parquet", "-3"]


def shard_negative_token(regen: Path):
    t = pq.read_table(shard_path(regen))
    i = t.schema.get_field_index("input_ids")
    vals = t.column(i).to_pylist()
    vals[0][-2] = -7
    t = t.set_column(i, "input_ids", pa.array(vals, pa.list_(pa.int32())))
    pq.write_table(t, shard_path(regen))
    return ["part-s0of1-000000.parquet", "-7"]


def shard_zero_rows(regen: Path):
    """A valid shard with no rows is not an error: it contributes nothing (checked separately)."""
    return None


def run_json_corrupt(regen: Path):
    (regen / "run.json").write_text('{"version": 1, "identity": ')
    return ["run.json"]


SHARDS = [shard_empty_file, shard_ids_as_strings, shard_null_row, shard_null_input_ids, shard_negative_row,
          shard_negative_token, run_json_corrupt]


@pytest.mark.parametrize("damage", SHARDS, ids=[d.__name__ for d in SHARDS])
def test_merge_rejects_a_damaged_regen_folder(cli, tmp_path, damage):
    ids, masks = good_rows()
    data = tmp_path / "train.parquet"
    pq.write_table(table(ids, masks), data)
    regen = regen_folder(tmp_path / "regen", [0, 2, 5], ids)
    must = damage(regen)
    new = tmp_path / "new.parquet"
    assert_one_line(cli("merge", data, "--regen", regen, "--out", new), must)
    assert_nothing_left(tmp_path, new, tmp_path / "new.parquet.merge-report.json")


def test_merge_of_a_regen_shard_with_zero_rows_changes_nothing(cli, tmp_path):
    ids, masks = good_rows()
    data = tmp_path / "train.parquet"
    pq.write_table(table(ids, masks), data)
    regen = regen_folder(tmp_path / "regen", [], ids)
    new = tmp_path / "new.parquet"
    r = cli("merge", data, "--regen", regen, "--out", new)
    assert r.exit_code == 0, r.stderr
    got = pq.read_table(new)
    assert got.column("input_ids").to_pylist() == ids and got.column("dqa_regen").null_count == len(ids)


def test_ids_beyond_the_vocabulary_pass_merge_and_are_refused_by_the_next_scan(cli, here, tmp_path):
    """merge has no tokenizer (it copies rows it does not replace); the rescan that every release
    goes through refuses the id, naming the row, so it cannot reach a gate verdict."""
    path, _ = id_beyond_vocabulary(tmp_path)
    regen = regen_folder(tmp_path / "regen", [0, 2], good_rows()[0])
    new = tmp_path / "new.parquet"
    assert cli("merge", path, "--regen", regen, "--out", new).exit_code == 0
    assert_one_line(cli("gate", new, "--out", tmp_path / "gate", "--no-docs"), ["new.parquet", "row 23", "151669"])
    assert_nothing_left(tmp_path, tmp_path / "gate", here / "dqa-out")
