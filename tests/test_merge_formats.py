"""Specification of `dqa merge` output, format by format.

A regenerated row (shard status ok, or length with ``accept=("ok", "length")``, which these
tests pass) replaces its original with prompt + output,
in the input's convention and value types; every other row reads back exactly as before; the
order and the file layout stay; a provenance column says where each new row came from; rows
that could not be regenerated are listed in the report and kept or dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from merge_helpers import (
    FORMAT_NAMES,
    OUT_NAMES,
    SAMPLING,
    WHEN,
    base_table,
    prompt_len,
    read_back,
    regen_output,
    sample_rows,
    shard_record,
    write_dataset,
    write_shard,
)

from dqa.regen.merge import PROVENANCE_COLUMN, MergeOptions, report_path
from dqa.regen.merge import merge as _merge


# These shards have no run.json: the rows keep the shards' masks. Length rows are accepted here
# (the default, --accept ok, keeps their originals: tests/test_merge_multi_turn.py checks it).
def merge(dataset, regen, out, **options):
    return _merge(dataset, regen, out, MergeOptions(**{"accept": ("ok", "length"), **options}))

N = 10
REPLACED = {1: "ok", 4: "ok", 7: "length"}
FAILED = 8
FORMATS = ["parquet", "parquet-dir", "jsonl", "jsonl-dir", "arrow", "arrow-stream", "arrow-dir", "hf"]


@pytest.fixture(scope="module")
def rows():
    return sample_rows(N)


def ids_of(n: int) -> list[str]:
    return [f"conv-{i:03d}" for i in range(n)]


def make_regen(folder: Path, rows, ids) -> Path:
    """Two shards, rows out of order as a fleet completes them; one failed row."""
    write_shard(folder / "shards" / "part-host0-000000.parquet",
                [shard_record(7, rows[7][0], ids[7], status="length"), shard_record(1, rows[1][0], ids[1])])
    write_shard(folder / "shards" / "part-host0-000001.parquet",
                [shard_record(FAILED, rows[FAILED][0], ids[FAILED], status="failed"), shard_record(4, rows[4][0], ids[4])])
    return folder


def expected_new(rows, r: int) -> tuple[list[int], list[int]]:
    ids = rows[r][0]
    p = prompt_len(ids)
    out = regen_output(r)
    return list(ids[:p]) + out, [0] * p + [1] * len(out)


def provenance(back: pa.Table, r: int, fmt: str):
    v = back.column(PROVENANCE_COLUMN)[r].as_py()
    return json.loads(v) if fmt.startswith("jsonl") else v


def data_files(path: Path) -> list[str]:
    if path.is_file():
        return [path.name]
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("fmt", FORMATS)
def test_replaced_rows_are_prompt_plus_output_and_the_rest_reads_back_unchanged(tmp_path, rows, fmt):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / FORMAT_NAMES[fmt], fmt)
    regen = make_regen(tmp_path / "regen", rows, ids)
    out = tmp_path / OUT_NAMES[fmt]

    summary = merge(src, [regen], out, batch_rows=3)

    orig = read_back(src)
    back = read_back(out)
    assert back.num_rows == N
    assert back.column_names == orig.column_names + [PROVENANCE_COLUMN]
    for c in orig.column_names:
        assert back.column(c).type == orig.column(c).type, c
    assert back.column("id").to_pylist() == ids  # order preserved
    for r in range(N):
        if r in REPLACED:
            new_ids, new_mask = expected_new(rows, r)
            assert back.column("input_ids")[r].as_py() == new_ids
            assert back.column("loss_mask")[r].as_py() == new_mask
            assert back.column("source")[r] == orig.column("source")[r]
            prov = provenance(back, r, fmt)
            assert prov["status"] == REPLACED[r]
            assert prov["finish_reason"] == ("length" if REPLACED[r] == "length" else "stop")
            assert prov["endpoint"] == "http://10.0.0.5:30000" and prov["model"] == "Qwen3-27B"
            assert prov["sampling"] == SAMPLING
            when = prov["completed_at"]
            assert (when == WHEN) if not fmt.startswith("jsonl") else (when.startswith("2026-11-30T08:00:00.123456"))
        else:
            for c in orig.column_names:
                assert back.column(c)[r] == orig.column(c)[r], (r, c)
            assert provenance(back, r, fmt) is None
    assert (summary.rows_in, summary.rows_out, summary.replaced, summary.truncated) == (N, N, 3, 1)
    assert (summary.unregenerated, summary.kept, summary.dropped, summary.untouched) == (1, 1, 0, 6)

    report = json.loads(report_path(out).read_text())
    assert report["unregenerated_rows"] == [
        {"row": FAILED, "id": ids[FAILED], "reason": "regeneration failed: HTTP 400: prompt too long"}
    ]
    assert report["replaced"] == 3 and report["output"] == str(out)
    # same layout: same file names; no temporary leftovers beside the output
    if fmt == "hf":
        assert data_files(out) == data_files(src)
    elif out.is_dir():
        assert data_files(out) == data_files(src)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]


def test_folder_outputs_keep_rows_per_file(tmp_path, rows):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / "data", "parquet-dir", shards=3)
    out = tmp_path / "new"
    merge(src, [make_regen(tmp_path / "regen", rows, ids)], out, batch_rows=4)
    for f in (src / "data").glob("*.parquet"):
        assert pq.ParquetFile(out / "data" / f.name).metadata.num_rows == pq.ParquetFile(f).metadata.num_rows
        assert pq.ParquetFile(out / "data" / f.name).metadata.row_group(0).column(0).compression == \
            pq.ParquetFile(f).metadata.row_group(0).column(0).compression
    assert (out / "README.md").read_text() == "# a dataset card\n"


def test_hf_output_loads_with_datasets_load_from_disk(tmp_path, rows):
    import datasets

    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / "data", "hf")
    out = tmp_path / "new"
    merge(src, [make_regen(tmp_path / "regen", rows, ids)], out, batch_rows=3)

    ds = datasets.load_from_disk(str(out))
    assert ds.num_rows == N
    assert ds.features["input_ids"] == datasets.load_from_disk(str(src)).features["input_ids"]
    assert ds[1]["input_ids"] == expected_new(rows, 1)[0]
    assert ds[1][PROVENANCE_COLUMN]["status"] == "ok"
    assert ds[0][PROVENANCE_COLUMN] is None
    assert ds[0]["input_ids"] == rows[0][0]
    state = json.loads((out / "state.json").read_text())
    assert [f["filename"] for f in state["_data_files"]] == ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]


def test_labels_convention_attention_mask_and_value_types_follow_the_input(tmp_path, rows):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids, convention="labels", attention=True), tmp_path / "d.parquet", "parquet")
    out = tmp_path / "new.parquet"
    merge(src, [make_regen(tmp_path / "regen", rows, ids)], out)
    back = read_back(out)
    assert "loss_mask" not in back.column_names
    assert back.schema.field("labels").type == pa.list_(pa.int64())
    assert back.schema.field("attention_mask").type == pa.list_(pa.int8())
    new_ids, new_mask = expected_new(rows, 4)
    assert back.column("labels")[4].as_py() == [t if m else -100 for t, m in zip(new_ids, new_mask)]
    assert back.column("attention_mask")[4].as_py() == [1] * len(new_ids)
    assert back.column("attention_mask")[0].as_py() == [1] * len(rows[0][0])


@pytest.mark.parametrize("mask_type", [pa.bool_(), pa.int64(), pa.uint8()])
def test_loss_mask_keeps_the_input_value_type(tmp_path, rows, mask_type):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids, mask_type=mask_type), tmp_path / "d.parquet", "parquet")
    out = tmp_path / "new.parquet"
    merge(src, [make_regen(tmp_path / "regen", rows, ids)], out)
    back = read_back(out)
    assert back.schema.field("loss_mask").type == pa.list_(mask_type)
    assert [int(v) for v in back.column("loss_mask")[1].as_py()] == expected_new(rows, 1)[1]


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_failed_drop_leaves_failed_rows_out_and_lists_them(tmp_path, rows, fmt):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / FORMAT_NAMES[fmt], fmt)
    out = tmp_path / OUT_NAMES[fmt]
    summary = merge(src, [make_regen(tmp_path / "regen", rows, ids)], out, failed="drop", batch_rows=4)
    back = read_back(out)
    assert back.column("id").to_pylist() == [i for k, i in enumerate(ids) if k != FAILED]
    assert (summary.rows_out, summary.dropped, summary.kept) == (N - 1, 1, 0)
    assert json.loads(report_path(out).read_text())["unregenerated_rows"][0]["row"] == FAILED


def write_run_json(regen: Path, findings: Path, selected: list[int], dataset_rows: int, limit=None, shard="0/1"):
    """run.json as dqa regen writes it: the findings path, the selection identity (sha256 of the
    selected rows before --shard/--limit) and the dataset's row count."""
    import hashlib

    pq.write_table(pa.table({"row": pa.array(selected, pa.int64()), "reasons": [["degenerate_template"]] * len(selected)}), findings)
    digest = hashlib.sha256(np.asarray(sorted(selected), dtype="<i8").tobytes()).hexdigest()
    (regen / "run.json").write_text(json.dumps({
        "version": 1,
        "identity": {"dataset": {"name": "d", "format": "parquet", "rows": dataset_rows, "files": []},
                     "selection": {"failed_only": True, "reasons": None, "rows_sha256": digest, "shard": shard}},
        "findings": str(findings), "limit": limit,
    }))


def test_rows_selected_by_the_run_but_missing_from_the_shards_are_listed(tmp_path, rows):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / "d.parquet", "parquet")
    regen = make_regen(tmp_path / "regen", rows, ids)
    write_run_json(regen, tmp_path / "findings.parquet", [1, 2, 4, 7, 8, 9], N)
    out = tmp_path / "new.parquet"
    summary = merge(src, [regen], out, failed="drop")
    listed = json.loads(report_path(out).read_text())["unregenerated_rows"]
    assert [(x["row"], x["id"]) for x in listed] == [(2, ids[2]), (8, ids[8]), (9, ids[9])]
    assert listed[0]["reason"].startswith("selected for regeneration but absent")
    assert read_back(out).column("id").to_pylist() == [i for k, i in enumerate(ids) if k not in (2, 8, 9)]
    assert summary.dropped == 3
    assert summary.selection == [f"{regen / 'run.json'}: 6 rows selected"]


def test_the_runs_limit_and_shard_narrow_the_selection(tmp_path, rows):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / "d.parquet", "parquet")
    regen = make_regen(tmp_path / "regen", rows, ids)
    # --shard 1/2 keeps the odd rows (1, 7, 9) and --limit 2 the first two (1, 7): both are in the shards,
    # so only the failed shard row is listed (row 9, absent, was never selected by this driver)
    write_run_json(regen, tmp_path / "findings.parquet", [1, 2, 4, 7, 8, 9], N, limit=2, shard="1/2")
    summary = merge(src, [regen], tmp_path / "new.parquet")
    listed = json.loads(report_path(tmp_path / "new.parquet").read_text())["unregenerated_rows"]
    assert [x["row"] for x in listed] == [FAILED]  # the failed shard row; no selected row is absent
    assert summary.selection == [f"{regen / 'run.json'}: 2 rows selected"]


def test_a_rescanned_findings_file_falls_back_to_the_failed_rows_with_a_note(tmp_path, rows):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / "d.parquet", "parquet")
    regen = make_regen(tmp_path / "regen", rows, ids)
    findings = tmp_path / "findings.parquet"
    write_run_json(regen, findings, [1, 2, 4, 7, 8, 9], N)
    pq.write_table(pa.table({"row": pa.array([0, 3], pa.int64()), "reasons": [["no_loss"]] * 2}), findings)
    summary = merge(src, [regen], tmp_path / "new.parquet")
    assert summary.unregenerated == 1
    assert "changed since the run" in summary.selection[0]


def test_a_run_made_for_a_dataset_of_another_size_is_refused(tmp_path, rows):
    from dqa.errors import InputError

    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / "d.parquet", "parquet")
    regen = make_regen(tmp_path / "regen", rows, ids)
    write_run_json(regen, tmp_path / "findings.parquet", [1, 2], N + 5)
    with pytest.raises(InputError, match=f"dataset of {N + 5} rows"):
        merge(src, [regen], tmp_path / "new.parquet")
    assert not (tmp_path / "new.parquet").exists()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_merging_a_merged_dataset_keeps_earlier_provenance(tmp_path, rows, fmt):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / FORMAT_NAMES[fmt], fmt)
    first = tmp_path / ("v1" + OUT_NAMES[fmt][3:])
    merge(src, [make_regen(tmp_path / "regen", rows, ids)], first)
    second_regen = tmp_path / "regen2"
    v1 = read_back(first)
    write_shard(second_regen / "shards" / "part-b-000000.parquet",
                [shard_record(FAILED, v1.column("input_ids")[FAILED].as_py(), ids[FAILED], endpoint="http://other:1")])
    second = tmp_path / ("v2" + OUT_NAMES[fmt][3:])
    merge(first, [second_regen], second)
    back = read_back(second)
    assert provenance(back, FAILED, fmt)["endpoint"] == "http://other:1"
    assert provenance(back, 1, fmt)["endpoint"] == "http://10.0.0.5:30000"
    assert provenance(back, 0, fmt) is None
    assert back.column("input_ids")[1] == v1.column("input_ids")[1]


def test_shards_from_several_regen_folders_are_merged_together(tmp_path, rows):
    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / "d.parquet", "parquet")
    a, b = tmp_path / "regen-0of2", tmp_path / "regen-1of2"
    write_shard(a / "shards" / "part-x-000000.parquet", [shard_record(0, rows[0][0], ids[0])])
    write_shard(b / "shards" / "part-y-000000.parquet", [shard_record(9, rows[9][0], ids[9])])
    summary = merge(src, [a, b], tmp_path / "new.parquet")
    back = read_back(tmp_path / "new.parquet")
    assert summary.replaced == 2
    assert back.column("input_ids")[9].as_py() == expected_new(rows, 9)[0]


def test_shard_row_groups_are_read_once_when_shards_follow_dataset_order(tmp_path, rows):
    """The group cache keeps a shard row group until its last row has passed, so a shard that
    serves several input batches is decoded once."""
    from dqa.audit.readers import open_dataset
    from dqa.audit.writers import DatasetWriter
    from dqa.regen.merge.index import load_regen_index
    from dqa.regen.merge.tokens import Merger

    ids = ids_of(N)
    src = write_dataset(base_table(rows, ids), tmp_path / "d.parquet", "parquet")
    regen = tmp_path / "regen"
    write_shard(regen / "shards" / "part-a-000000.parquet", [shard_record(r, rows[r][0], ids[r]) for r in (0, 3, 6, 9)])
    ds = open_dataset(src)
    m = Merger(ds, load_regen_index([regen]))
    with DatasetWriter(ds, tmp_path / "new.parquet", m.output_schema) as w:
        m.run(2, w)
        w.commit()
    assert m.cache.reads == 1
    assert m.replaced == 4
    assert np.array_equal(read_back(tmp_path / "new.parquet").column("id").to_numpy(zero_copy_only=False), np.array(ids))
