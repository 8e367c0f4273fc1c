"""Specification of what `dqa scan` reads, and of how it refuses what it cannot read.

Every supported format gives the same findings. Every kind of bad input exits 2 with one
line on stderr naming the file, column or row, and leaves no output folder behind.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chatdata import conversation, render, to_labels
from refusals import assert_scan_refused
from test_scan_checks import good_rows

OK_ROWS = 12


@pytest.fixture(scope="module")
def rows():
    """30 good samples and 12 'OK.' samples (flagged degenerate_template)."""
    ok = [render(conversation(f"Ask {i}", None, "OK."), enable_thinking=False) for i in range(OK_ROWS)]
    return good_rows(30) + ok


def table_of(rows, mask_type=pa.int8(), ids_type=pa.int32()):
    return pa.table(
        {
            "id": [f"r{i}" for i in range(len(rows))],
            "input_ids": pa.array([r[0] for r in rows], type=pa.list_(ids_type)),
            "loss_mask": pa.array([r[1] for r in rows], type=pa.list_(pa.int8())).cast(pa.list_(mask_type)),
        }
    )


def expect_findings(cli, path, tmp_path, *extra):
    out = tmp_path / f"scan-{path.name}"  # a scan folder holds the scan of one dataset
    result = cli("scan", path, "--out", out, "--json", *extra)
    assert result.exit_code == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failing_rows"] == OK_ROWS
    assert summary["checks"]["degenerate_template"]["count"] == OK_ROWS
    return summary


def test_parquet_file(cli, rows, tmp_path):
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    assert expect_findings(cli, tmp_path / "d.parquet", tmp_path)["format"] == "parquet"


def test_folder_of_parquet_shards_keeps_dataset_order(cli, rows, tmp_path):
    t = table_of(rows)
    (tmp_path / "shards").mkdir()
    pq.write_table(t.slice(0, 20), tmp_path / "shards" / "part-00000.parquet")
    pq.write_table(t.slice(20), tmp_path / "shards" / "part-00001.parquet")
    expect_findings(cli, tmp_path / "shards", tmp_path)
    import polars as pl

    findings = pl.read_parquet(tmp_path / "scan-shards" / "findings.parquet")
    assert findings["row"].to_list() == list(range(30, 42))
    assert findings["id"].to_list() == [f"r{i}" for i in range(30, 42)]


def test_hf_save_to_disk_folder(cli, rows, tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": [r[0] for r in rows], "labels": [to_labels(*r) for r in rows]})
    ds.save_to_disk(str(tmp_path / "hf"))
    summary = expect_findings(cli, tmp_path / "hf", tmp_path)
    assert (summary["format"], summary["convention"]) == ("hf", "labels")


def test_arrow_ipc_file_and_stream(cli, rows, tmp_path):
    t = table_of(rows, mask_type=pa.bool_(), ids_type=pa.int64())
    with pa.OSFile(str(tmp_path / "d.arrow"), "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    expect_findings(cli, tmp_path / "d.arrow", tmp_path)
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t, max_chunksize=7)
    assert expect_findings(cli, tmp_path / "s.arrow", tmp_path)["format"] == "arrow-stream"


def test_jsonl(cli, rows, tmp_path):
    with open(tmp_path / "d.jsonl", "w") as fh:
        for i, (ids, mask) in enumerate(rows):
            fh.write(json.dumps({"id": i, "input_ids": ids, "loss_mask": mask}) + "\n")
    expect_findings(cli, tmp_path / "d.jsonl", tmp_path)


def test_custom_column_names(cli, rows, tmp_path):
    t = table_of(rows).rename_columns(["uid", "tokens", "weights"])
    pq.write_table(t, tmp_path / "c.parquet")
    expect_findings(cli, tmp_path / "c.parquet", tmp_path, "--ids-column", "tokens", "--mask-column", "weights", "--id-column", "uid")


def test_max_fail_share_decides_the_exit_code(cli, rows, tmp_path):
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    assert cli("scan", tmp_path / "d.parquet", "--out", tmp_path / "o", "--quiet", "--max-fail-share", "0.5").exit_code == 0
    assert cli("scan", tmp_path / "d.parquet", "--out", tmp_path / "o", "--quiet", "--max-fail-share", "0.1").exit_code == 1


def test_outputs_are_written(cli, rows, tmp_path):
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    out = tmp_path / "o"
    result = cli("scan", tmp_path / "d.parquet", "--out", out)
    assert "degenerate_template" in result.stdout and '"<think>\\n\\n</think>\\n\\nOK.<|im_end|>"' in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["findings.parquet", "metrics.parquet", "summary.json", "summary.md", "turns.parquet"]
    assert "| `degenerate_template` ◀ root cause | 12 |" in (out / "summary.md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


# --- bad input: exit 2, one line naming the problem, no output ---------------------------


def test_missing_path(cli, tmp_path):
    assert_scan_refused(cli, tmp_path, tmp_path / "nope.parquet", "nope.parquet", "no such file")


def test_unknown_format(cli, tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.csv", "d.csv", "unknown format")


def test_no_supervision_column(cli, rows, tmp_path):
    pq.write_table(table_of(rows).drop(["loss_mask"]), tmp_path / "d.parquet")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "d.parquet", "loss_mask", "labels")


def test_wrong_column_type(cli, tmp_path):
    pq.write_table(pa.table({"input_ids": ["a b c"], "loss_mask": [[0, 1]]}), tmp_path / "d.parquet")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "'input_ids'", "list of integer")


def test_null_inside_a_list_names_the_row(cli, rows, tmp_path):
    ids = [r[0] for r in rows]
    ids[5] = ids[5][:3] + [None] + ids[5][4:]
    t = table_of(rows).set_column(1, "input_ids", pa.array(ids, type=pa.list_(pa.int32())))
    pq.write_table(t, tmp_path / "d.parquet")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "'input_ids'", "row 5", "null")


def test_null_list_names_the_row(cli, rows, tmp_path):
    masks = [r[1] for r in rows]
    masks[7] = None
    t = table_of(rows).set_column(2, "loss_mask", pa.array(masks, type=pa.list_(pa.int8())))
    pq.write_table(t, tmp_path / "d.parquet")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "'loss_mask'", "row 7")


def test_mask_values_must_be_zero_or_one(cli, rows, tmp_path):
    masks = [list(r[1]) for r in rows]
    masks[3][2] = 2
    t = table_of(rows).set_column(2, "loss_mask", pa.array(masks, type=pa.list_(pa.int8())))
    pq.write_table(t, tmp_path / "d.parquet")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "row 3", "expected 0 or 1")


def test_negative_and_out_of_vocabulary_ids(cli, rows, tmp_path):
    ids = [list(r[0]) for r in rows]
    ids[4][1] = -7
    pq.write_table(table_of(rows).set_column(1, "input_ids", pa.array(ids, type=pa.list_(pa.int32()))), tmp_path / "n.parquet")
    assert_scan_refused(cli, tmp_path, tmp_path / "n.parquet", "row 4", "negative")
    ids[4][1] = 10
    ids[9][0] = 200_000
    pq.write_table(table_of(rows).set_column(1, "input_ids", pa.array(ids, type=pa.list_(pa.int32()))), tmp_path / "v.parquet")
    assert_scan_refused(cli, tmp_path, tmp_path / "v.parquet", "row 9", "vocabulary")


def test_empty_dataset(cli, rows, tmp_path):
    pq.write_table(table_of(rows).slice(0, 0), tmp_path / "d.parquet")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "no rows")
    (tmp_path / "e.jsonl").write_text("")
    assert_scan_refused(cli, tmp_path, tmp_path / "e.jsonl", "e.jsonl")


def test_truncated_parquet(cli, rows, tmp_path):
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    data = (tmp_path / "d.parquet").read_bytes()
    (tmp_path / "t.parquet").write_bytes(data[: len(data) // 2])
    assert_scan_refused(cli, tmp_path, tmp_path / "t.parquet", "t.parquet", "unreadable")


def test_jsonl_bad_line_is_named(cli, rows, tmp_path):
    lines = [json.dumps({"input_ids": ids, "loss_mask": m}) for ids, m in rows[:5]]
    lines.insert(3, '{"input_ids": [1, 2, 3], "loss_mask": [0, 1')
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.jsonl", "d.jsonl", "line 4")


def test_mixed_conventions_across_shards(cli, rows, tmp_path):
    (tmp_path / "mix").mkdir()
    pq.write_table(table_of(rows[:10]), tmp_path / "mix" / "a.parquet")
    pq.write_table(
        pa.table({"input_ids": [r[0] for r in rows[10:]], "labels": [to_labels(*r) for r in rows[10:]]}), tmp_path / "mix" / "b.parquet"
    )
    assert_scan_refused(cli, tmp_path, tmp_path / "mix", "b.parquet", "mix conventions")


def test_bad_options(cli, rows, tmp_path):
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "unknown check", extra=("--checks", "no_such_check"))
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "--set", extra=("--set", "short_response=3"))
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "no parameter", extra=("--set", "short_response.nope=3"))
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "tokenizer", extra=("--tokenizer", str(tmp_path)))
    (tmp_path / "c.toml").write_text("[checks.short_response\n")
    assert_scan_refused(cli, tmp_path, tmp_path / "d.parquet", "c.toml", "TOML", extra=("--config", str(tmp_path / "c.toml")))


def test_config_file_overrides_thresholds(cli, rows, tmp_path):
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    (tmp_path / "c.toml").write_text("[checks.degenerate_template]\nmin_rows = 100\nmin_share = 0.5\n")
    result = cli("scan", tmp_path / "d.parquet", "--out", tmp_path / "o", "--json", "--config", tmp_path / "c.toml")
    summary = json.loads(result.stdout)
    assert summary["checks"]["degenerate_template"]["count"] == 0
    # Below the raised degenerate threshold, the 12 identical answers to different prompts are duplicates.
    assert summary["checks"]["duplicate_response"]["count"] == OK_ROWS


def test_batches_are_bounded_by_tokens_and_keep_dataset_order(rows, tmp_path):
    import numpy as np

    from dqa.audit.readers import open_dataset

    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    ds = open_dataset(tmp_path / "d.parquet")
    whole = list(ds.batches(4096))
    small = list(ds.batches(4096, max_tokens=500))
    assert len(whole) == 1 and len(small) > 5
    assert all(b.ids.size <= 500 or b.num_rows == 1 for b in small)
    assert [b.start_row for b in small] == list(np.cumsum([0] + [b.num_rows for b in small[:-1]]))
    assert np.array_equal(np.concatenate([b.ids for b in small]), whole[0].ids)


def test_a_row_of_a_million_tokens(cli, rows, tmp_path):
    import numpy as np

    from chatdata import ASSISTANT, END_THINK, IM_END, IM_START, NL, THINK

    rng = np.random.default_rng(0)
    head = [IM_START, 872, NL, 9707, IM_END, NL, IM_START, ASSISTANT, NL]
    body = [THINK, NL, *rng.integers(0, 150_000, 1_000_000).tolist(), NL, END_THINK, 271, 9707, 1052, IM_END]
    huge = (head + body + [NL], [0] * len(head) + [1] * len(body) + [0])
    pq.write_table(table_of(rows[:30] + [huge]), tmp_path / "d.parquet")
    result = cli("scan", tmp_path / "d.parquet", "--out", tmp_path / "o", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["supervised_tokens_distribution"]["max"] == len(body)


# --- output folders: never destroy what is not dqa's own -----------------------------------


def test_out_refuses_the_input_and_foreign_folders(cli, rows, tmp_path):
    (tmp_path / "ds").mkdir()
    pq.write_table(table_of(rows), tmp_path / "ds" / "d.parquet")
    (tmp_path / "ds" / "README.md").write_text("keep me")
    for out in (tmp_path / "ds", tmp_path, tmp_path / "ds" / "scan"):
        result = cli("scan", tmp_path / "ds", "--out", out)
        assert result.exit_code == 2 and "input" in result.stderr, result.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a scan")
    result = cli("scan", tmp_path / "ds", "--out", tmp_path / "mine")
    assert result.exit_code == 2 and "not an earlier dqa scan folder" in result.stderr
    assert (tmp_path / "ds" / "README.md").read_text() == "keep me"
    assert (tmp_path / "mine" / "notes.txt").is_file()


def test_a_rescan_keeps_what_other_commands_put_in_the_scan_folder(cli, rows, tmp_path):
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    out = tmp_path / "scan"
    cli("scan", tmp_path / "d.parquet", "--out", out, "--quiet")
    (out / "validation-release").mkdir()
    (out / "validation-release" / "validation.json").write_text("{}")
    (out / "report.html").write_text("<html></html>")
    cli("scan", tmp_path / "d.parquet", "--out", out, "--quiet")
    assert (out / "validation-release" / "validation.json").is_file() and (out / "report.html").is_file()
    assert (out / "metrics.parquet").is_file()


def test_validate_and_gate_reuse_an_up_to_date_scan(rows, tmp_path, monkeypatch):
    from dqa.audit.scan import ScanOptions, reusable_scan, run_scan

    monkeypatch.chdir(tmp_path)
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    run_scan(tmp_path / "d.parquet")
    assert reusable_scan(tmp_path / "d.parquet", "dqa-out/d")
    assert not reusable_scan(tmp_path / "d.parquet", "dqa-out/d", ScanOptions(thinking="off"))
    pq.write_table(table_of(rows[:-1]), tmp_path / "d.parquet")  # the data changed
    assert not reusable_scan(tmp_path / "d.parquet", "dqa-out/d")


def test_default_out_dir_keeps_dotted_names_apart():
    from dqa.audit.scan import default_out_dir

    assert default_out_dir("data/train.parquet").name == "train"
    assert default_out_dir("data/train.v2.parquet").name == "train.v2"
    assert default_out_dir("data/train.jsonl.gz").name == "train"


def test_skipping_every_selected_check_flags_nothing(cli, rows, tmp_path):
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    result = cli("scan", tmp_path / "d.parquet", "--out", tmp_path / "o", "--json", "--checks", "degenerate_template",
                 "--skip", "degenerate_template")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["failing_rows"] == 0


def test_template_text_that_looks_like_rich_markup_is_printed_verbatim(cli, tmp_path):
    answer = "[/INST] [bold]done[/bold]"
    rows = good_rows(30) + [
        render([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": answer}], enable_thinking=False)
        for i in range(12)
    ]
    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    result = cli("scan", tmp_path / "d.parquet", "--out", tmp_path / "o")
    assert result.exit_code == 1, result.stderr
    assert "[/INST]" in result.stdout


def test_malformed_dataset_dict_is_an_input_error(cli, tmp_path):
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text("{not json")
    assert_scan_refused(cli, tmp_path, tmp_path / "dd", "dataset_dict.json")


def test_a_tokenizer_folder_gives_the_same_findings_as_the_preset(cli, rows, tmp_path):
    from dqa.tokenizer_files import qwen3_tokenizer_dir

    pq.write_table(table_of(rows), tmp_path / "d.parquet")
    by_folder = expect_findings(cli, tmp_path / "d.parquet", tmp_path, "--tokenizer", str(qwen3_tokenizer_dir()))
    assert by_folder["template"] == "tokenizer_files"
    assert by_folder["degenerate_templates"][0]["text"] == "<think>\n\n</think>\n\nOK.<|im_end|>"


def test_templates_are_decoded_from_the_rows_that_hold_them_read_from_their_row_groups(rows, tmp_path):
    """The 'OK.' rows sit in the last row groups: only those are read back, and only the wanted rows
    of them are flattened into (single-row) batches."""
    from dqa.audit.readers import open_dataset
    from dqa.audit.scan import run_scan

    pq.write_table(table_of(rows), tmp_path / "d.parquet", row_group_size=8)
    ds = open_dataset(tmp_path / "d.parquet")
    read = [(b.start_row, b.num_rows) for b in ds.batches_with_rows([33, 35, 41])]
    assert read == [(33, 1), (35, 1), (41, 1)]
    whole = {b.start_row + r: b.ids[b.offsets[r]:b.offsets[r + 1]].tolist() for b in ds.batches() for r in range(b.num_rows)}
    assert [b.ids.tolist() for b in ds.batches_with_rows([33, 35, 41])] == [whole[33], whole[35], whole[41]]
    summary = run_scan(tmp_path / "d.parquet", tmp_path / "o").summary
    assert summary["degenerate_templates"][0]["text"] == "<think>\n\n</think>\n\nOK.<|im_end|>"
    assert summary["degenerate_templates"][0]["example_row"] == 30


def test_rows_read_back_from_inside_large_row_groups_are_the_rows_asked_for(rows, tmp_path, monkeypatch):
    """A row group is read in batches of SEEK_ROWS up to its last wanted row: rows on either side of a batch
    boundary, in several groups of a file, come back whole and in order."""
    from dqa.audit import readers

    monkeypatch.setattr(readers, "SEEK_ROWS", 3)  # batch boundaries at 3, 6, ... inside each 8-row group
    pq.write_table(table_of(rows), tmp_path / "d.parquet", row_group_size=8)
    ds = readers.open_dataset(tmp_path / "d.parquet")
    whole = {b.start_row + r: b.ids[b.offsets[r]:b.offsets[r + 1]].tolist() for b in ds.batches() for r in range(b.num_rows)}
    wanted = [0, 2, 3, 7, 8, 14, 15, 41]
    got = list(ds.batches_with_rows(reversed(wanted)))
    assert [(b.start_row, b.num_rows) for b in got] == [(r, 1) for r in wanted]
    assert [b.ids.tolist() for b in got] == [whole[r] for r in wanted]
