"""Specification: a dataset file is recognised by its content, not its name, and token columns
stored as one ``[1, L]`` list per row (SpecForge's tokenized cache) read as the flat rows they hold.

The SpecForge rule the fixtures follow (sgl-project/SpecForge, ``specforge/data/preprocessing.py``):
``build_eagle3_dataset`` tokenizes with ``dataset.map(preprocess_function, batched=True,
num_proc=num_proc, batch_size=1000, remove_columns=original_cols, load_from_cache_file=True,
cache_file_name=os.path.join(cache_dir, f"{cache_key}.pkl"))``, where ``preprocess_conversations``
appends ``input_ids[None, :]``, ``loss_mask[None, :]`` and ``torch.ones_like(loss_mask)[None, :]``
(tensors of shape [1, L]); it then filters (``minimum_valid_tokens``) and calls
``set_format(type="torch")``. ``datasets`` writes the map's result as an Arrow IPC stream under
that ``.pkl`` name (with ``num_proc`` N > 1: ``KEY_00000_of_0000N.pkl`` ..., one per process),
columns ``list<list<int>>``; the filter writes indices files ``cache-*.arrow`` beside it. The
fixtures build such caches with ``datasets`` itself, never with dqa's writer.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chatdata import conversation, render
from refusals import assert_scan_refused
from merge_helpers import prompt_len, regen_output, sample_rows, shard_record, write_shard
from test_scan_checks import good_rows

OK_ROWS = 12


@pytest.fixture(scope="module")
def rows():
    """30 good samples and 12 'OK.' samples (flagged degenerate_template)."""
    ok = [render(conversation(f"Ask {i}", None, "OK."), enable_thinking=False) for i in range(OK_ROWS)]
    return good_rows(30) + ok


def specforge_cache(cache_dir: Path, rows, key: str = "key", num_proc: int | None = None, min_loss_tokens: int | None = None,
                    row_value=None):
    """Tokenize ``rows`` into ``cache_dir`` the way SpecForge's ``build_eagle3_dataset`` does.

    The source dataset holds one ShareGPT conversation per row; the map function stands in for
    SpecForge's chat-template parser (it looks the tokens of each conversation up in ``rows``) and
    returns, like ``preprocess_conversations``, torch tensors of shape [1, L]. ``row_value(i, ids,
    mask)`` returns each row's ``(input_ids, loss_mask, attention_mask)`` lists instead (hostile shapes). Returns the datasets
    ``Dataset`` (its ``cache_files`` name the files written).
    """
    import datasets
    import torch

    datasets.disable_progress_bars()
    cache_dir.mkdir(parents=True, exist_ok=True)
    src = datasets.Dataset.from_dict({"conversations": [[{"from": "human", "value": str(i)}] for i in range(len(rows))]})

    def preprocess_function(examples):
        results = {"input_ids": [], "loss_mask": [], "attention_mask": []}
        for conv in examples["conversations"]:
            i = int(conv[0]["value"])
            ids, mask = rows[i]
            if row_value is not None:  # the hostile cases: lists of the shape they pick, for every row
                for k, v in zip(("input_ids", "loss_mask", "attention_mask"), row_value(i, ids, mask)):
                    results[k].append(v)
                continue
            input_ids, loss_mask = torch.tensor(ids), torch.tensor(mask)
            results["input_ids"].append(input_ids[None, :])
            results["loss_mask"].append(loss_mask[None, :])
            results["attention_mask"].append(torch.ones_like(loss_mask)[None, :])
        return results

    ds = src.map(preprocess_function, batched=True, num_proc=num_proc, batch_size=1000, remove_columns=["conversations"],
                 load_from_cache_file=True, cache_file_name=str(cache_dir / f"{key}.pkl"))
    if min_loss_tokens is not None:
        def has_minimum_valid_tokens(example):
            return sum(int(t) for row in example["loss_mask"] for t in row) >= min_loss_tokens

        ds = ds.filter(has_minimum_valid_tokens, num_proc=num_proc)
    return ds


def flat_parquet(path: Path, rows) -> Path:
    """The same rows, flat: ``input_ids`` / ``loss_mask`` / ``attention_mask`` as ``list<int>``."""
    pq.write_table(pa.table({
        "input_ids": pa.array([r[0] for r in rows], pa.list_(pa.int32())),
        "loss_mask": pa.array([r[1] for r in rows], pa.list_(pa.int64())),
        "attention_mask": pa.array([[1] * len(r[0]) for r in rows], pa.list_(pa.int8())),
    }), path)
    return path


def scan(cli, path: Path, out: Path) -> dict:
    result = cli("scan", path, "--out", out, "--json")
    assert result.exit_code == 1, result.stderr
    return json.loads(result.stdout)


def assert_same_scan(a: Path, b: Path, sa: dict, sb: dict) -> None:
    for key in ("rows", "tokens", "supervised_tokens", "failing_rows", "convention", "supervised_tokens_distribution"):
        assert sa[key] == sb[key], key
    assert {k: v["count"] for k, v in sa["checks"].items()} == {k: v["count"] for k, v in sb["checks"].items()}
    assert pl.read_parquet(a / "metrics.parquet").equals(pl.read_parquet(b / "metrics.parquet"))
    assert pl.read_parquet(a / "findings.parquet").equals(pl.read_parquet(b / "findings.parquet"))


# --- SpecForge's cache ------------------------------------------------------------------------


def test_specforge_cache_file_is_an_arrow_stream_of_one_by_l_lists(rows, tmp_path):
    """The facts the reader relies on, checked against datasets itself."""
    ds = specforge_cache(tmp_path / "cache", rows[:3])
    assert [Path(f["filename"]).name for f in ds.cache_files] == ["key.pkl"]
    data = (tmp_path / "cache" / "key.pkl").read_bytes()
    assert data[:4] == b"\xff\xff\xff\xff"  # an IPC stream message, not a pickle
    t = pa.ipc.open_stream(data).read_all()
    for name in ("input_ids", "loss_mask", "attention_mask"):
        assert pa.types.is_list(t.schema.field(name).type) and pa.types.is_list(t.schema.field(name).type.value_type)
    assert t.column("input_ids")[0].as_py() == [rows[0][0]]


def test_specforge_cache_file_scans_like_the_same_rows_in_flat_parquet(cli, rows, tmp_path):
    specforge_cache(tmp_path / "cache", rows)
    flat = flat_parquet(tmp_path / "flat.parquet", rows)
    s_cache = scan(cli, tmp_path / "cache" / "key.pkl", tmp_path / "scan-cache")
    s_flat = scan(cli, flat, tmp_path / "scan-flat")
    assert s_cache["format"] == "arrow-stream" and s_cache["convention"] == "loss_mask"
    assert s_cache["failing_rows"] == OK_ROWS and s_cache["checks"]["degenerate_template"]["count"] == OK_ROWS
    assert_same_scan(tmp_path / "scan-cache", tmp_path / "scan-flat", s_cache, s_flat)


def test_a_cache_folder_of_num_proc_shards_reads_in_dataset_order(cli, rows, tmp_path):
    """num_proc=3 writes three .pkl shards; the trainable-token filter writes indices files beside
    them (skipped: not data); a vocab mapping .pt file is left alone."""
    import torch

    cache = tmp_path / "cache"
    specforge_cache(cache, rows, num_proc=3, min_loss_tokens=1)
    (cache / "vocab_mapping").mkdir()
    torch.save({"d2t": torch.zeros(4)}, cache / "vocab_mapping" / "key.pt")
    names = sorted(p.name for p in cache.iterdir() if p.is_file())
    assert [n for n in names if n.endswith(".pkl")] == [f"key_{k:05d}_of_00003.pkl" for k in range(3)]
    assert any(n.startswith("cache-") and n.endswith(".arrow") for n in names)  # the filter's indices files

    s_cache = scan(cli, cache, tmp_path / "scan-cache")
    s_flat = scan(cli, flat_parquet(tmp_path / "flat.parquet", rows), tmp_path / "scan-flat")
    assert s_cache["format"] == "arrow-stream"
    assert_same_scan(tmp_path / "scan-cache", tmp_path / "scan-flat", s_cache, s_flat)




def test_a_folder_with_two_caches_is_refused_naming_them(cli, rows, tmp_path):
    specforge_cache(tmp_path / "cache", rows[:6], key="train")
    specforge_cache(tmp_path / "cache", rows[6:9], key="eval")
    assert_scan_refused(cli, tmp_path, tmp_path / "cache", "more than one datasets cache", "train.pkl", "eval.pkl")


def test_a_cache_folder_missing_a_shard_names_it(cli, rows, tmp_path):
    specforge_cache(tmp_path / "cache", rows[:9], num_proc=3)
    (tmp_path / "cache" / "key_00001_of_00003.pkl").unlink()
    assert_scan_refused(cli, tmp_path, tmp_path / "cache", "key_00001_of_00003.pkl", "missing")


# --- content, not names ---------------------------------------------------------------------------


def table_of(rows) -> pa.Table:
    return pa.table({"input_ids": pa.array([r[0] for r in rows], pa.list_(pa.int32())),
                     "loss_mask": pa.array([r[1] for r in rows], pa.list_(pa.int8()))})


def write_as(kind: str, t: pa.Table, path: Path) -> Path:
    if kind == "parquet":
        pq.write_table(t, path)
    elif kind in ("arrow-file", "arrow-stream"):
        opener = pa.ipc.new_file if kind == "arrow-file" else pa.ipc.new_stream
        with pa.OSFile(str(path), "wb") as sink, opener(sink, t.schema) as w:
            w.write_table(t, max_chunksize=10)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in t.to_pylist()))
    return path


@pytest.mark.parametrize("kind,name", [
    ("parquet", "train.bin"), ("arrow-file", "train.data"), ("arrow-stream", "train.pkl"), ("arrow-file", "train"),
    ("parquet", "train.arrow"), ("arrow-stream", "train.parquet"), ("jsonl", "train.txt"),
])
def test_files_are_recognised_by_content_whatever_their_name(cli, rows, tmp_path, kind, name):
    path = write_as(kind, table_of(rows), tmp_path / name)
    summary = scan(cli, path, tmp_path / "scan")
    assert summary["format"] == kind
    assert summary["failing_rows"] == OK_ROWS


def test_a_folder_of_shards_without_suffixes_reads_by_content_and_skips_other_files(cli, rows, tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    t = table_of(rows)
    write_as("parquet", t.slice(0, 20), folder / "part-0.bin")
    write_as("parquet", t.slice(20), folder / "part-1.bin")
    (folder / "README").write_text("a dataset card\n")
    (folder / "LICENSE").write_text("Apache-2.0\n")
    summary = scan(cli, folder, tmp_path / "scan")
    assert (summary["format"], summary["rows"], summary["failing_rows"]) == ("parquet", len(rows), OK_ROWS)
    findings = pl.read_parquet(tmp_path / "scan" / "findings.parquet")
    assert findings["row"].to_list() == list(range(30, 42))


def test_a_shard_named_like_a_format_but_of_unknown_content_is_an_error_not_skipped(cli, rows, tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    write_as("parquet", table_of(rows), folder / "part-0.parquet")
    (folder / "part-1.parquet").write_text("not parquet at all\n")
    assert_scan_refused(cli, tmp_path, folder, "part-1.parquet", "unknown format", "parquet")


# --- hostile [1, L] shapes and unknown content: exit 2, one line ---------------------------------


def two_rows_at_5(i, ids, mask):
    if i == 5:  # [2, L]: two sequences in one row
        return [ids, ids], [mask, mask], [[1] * len(ids)] * 2
    return [ids], [mask], [[1] * len(ids)]


def ragged_at_7(i, ids, mask):
    if i == 7:  # two inner lists of different lengths
        return [ids[:3], ids[3:]], [mask[:3], mask[3:]], [[1] * 3, [1] * (len(ids) - 3)]
    return [ids], [mask], [[1] * len(ids)]


def empty_outer_at_2(i, ids, mask):
    if i == 2:
        return [], [], []
    return [ids], [mask], [[1] * len(ids)]


def mask_two_rows_at_4(i, ids, mask):
    if i == 4:  # ids fine, loss_mask [2, L]
        return [ids], [mask, mask], [[1] * len(ids)]
    return [ids], [mask], [[1] * len(ids)]


@pytest.mark.parametrize("shape,needles", [
    (two_rows_at_5, ["'input_ids'", "row 5", "shape [2, "]),
    (ragged_at_7, ["'input_ids'", "row 7", "ragged: 3, "]),
    (empty_outer_at_2, ["'input_ids'", "row 2", "shape [0]"]),
    (mask_two_rows_at_4, ["'loss_mask'", "row 4", "shape [2, "]),
], ids=["two_rows", "ragged", "empty_outer", "mask_two_rows"])
def test_nested_token_lists_of_another_shape_name_file_column_row_and_shape(cli, rows, tmp_path, shape, needles):
    specforge_cache(tmp_path / "cache", rows, row_value=shape)
    line = assert_scan_refused(cli, tmp_path, tmp_path / "cache" / "key.pkl", "key.pkl", *needles)
    assert "expected [1, L]" in line


def test_a_real_pickle_named_pkl_is_an_unknown_format(cli, tmp_path):
    (tmp_path / "key.pkl").write_bytes(pickle.dumps({"input_ids": [[1, 2, 3]]}))
    assert_scan_refused(cli, tmp_path, tmp_path / "key.pkl", "key.pkl", "unknown format", "80 04", "a Python pickle", "Arrow IPC", "parquet", "JSONL")


def test_an_empty_file_is_named(cli, tmp_path):
    (tmp_path / "key.pkl").write_bytes(b"")
    assert_scan_refused(cli, tmp_path, tmp_path / "key.pkl", "key.pkl", "empty file")
    (tmp_path / "d.bin").write_bytes(b"\x00" * 3)
    assert_scan_refused(cli, tmp_path, tmp_path / "d.bin", "d.bin", "unknown format")


def test_a_truncated_cache_is_unreadable(cli, rows, tmp_path):
    specforge_cache(tmp_path / "cache", rows)
    data = (tmp_path / "cache" / "key.pkl").read_bytes()
    (tmp_path / "cut.pkl").write_bytes(data[: len(data) // 2])
    assert_scan_refused(cli, tmp_path, tmp_path / "cut.pkl", "cut.pkl", "unreadable arrow-stream")


# --- the reader's [1, L] flattening, every list type -------------------------------------------------


@pytest.mark.parametrize("outer", ["list", "large_list", "fixed_size_list"])
def test_one_by_l_columns_of_every_list_type_read_as_flat_rows(tmp_path, outer):
    from dqa.audit.readers import open_dataset
    from dqa.audit.token_columns import flatten_token_lists, nest_token_lists

    rows = [([5, 6, 7], [0, 1, 1]), ([8], [1]), ([], [])]
    wrap = {"list": pa.list_, "large_list": pa.large_list, "fixed_size_list": lambda t: pa.list_(t, 1)}[outer]
    t = pa.table({
        "input_ids": pa.array([[r[0]] for r in rows], wrap(pa.list_(pa.int64()))),
        "labels": pa.array([[[x if m else -100 for x, m in zip(*r)]] for r in rows], wrap(pa.list_(pa.int64()))),
    })
    pq.write_table(t, tmp_path / "d.parquet")
    ds = open_dataset(tmp_path / "d.parquet")
    assert ds.columns.convention == "labels"
    (b,) = list(ds.batches())
    assert b.ids.tolist() == [5, 6, 7, 8] and b.offsets.tolist() == [0, 3, 4, 4]
    assert b.mask.tolist() == [0, 1, 1, 1]
    rb = t.to_batches()[0]
    flat, nested = flatten_token_lists(rb, ["input_ids", "labels"], "d.parquet", 0)
    assert flat.column("input_ids").to_pylist() == [r[0] for r in rows]
    assert nest_token_lists(flat, nested).equals(rb)


def test_a_null_outer_list_names_the_row(tmp_path):
    from dqa.audit.readers import open_dataset
    from dqa.errors import InputError

    t = pa.table({"input_ids": pa.array([[[1, 2]], None], pa.list_(pa.list_(pa.int32()))),
                  "loss_mask": pa.array([[[0, 1]], [[1]]], pa.list_(pa.list_(pa.int8())))})
    pq.write_table(t, tmp_path / "d.parquet")
    with pytest.raises(InputError, match=r"d.parquet: column 'input_ids', row 1: null"):
        list(open_dataset(tmp_path / "d.parquet").batches())


def test_a_list_of_lists_of_text_is_refused_at_open(tmp_path):
    from dqa.audit.readers import open_dataset
    from dqa.errors import InputError

    t = pa.table({"input_ids": [[["a", "b"]]], "loss_mask": [[[0, 1]]]})
    pq.write_table(t, tmp_path / "d.parquet")
    with pytest.raises(InputError, match=r"'input_ids' must be a list of integer token ids \(or one \[1, L\] list"):
        open_dataset(tmp_path / "d.parquet")


# --- the registry: each format's sink writes what its reader reads -------------------------------


@pytest.mark.parametrize("name", ["parquet", "arrow-file", "arrow-stream", "jsonl"])
def test_each_formats_sink_writes_what_the_readers_read_back(tmp_path, name):
    from dqa.audit import formats
    from dqa.audit.readers import open_dataset

    t = table_of([([1, 2, 3], [0, 1, 1]), ([4, 5], [1, 1])]).append_column("id", pa.array(["a", "b"]))
    fmt = formats.get(name)
    path = tmp_path / "out.bin"  # the name says nothing: the content does
    sink = fmt.sink(path, t.schema)
    for b in t.to_batches(max_chunksize=1):
        sink.write(b)
    sink.close()
    assert formats.detect_file(path) is fmt
    ds = open_dataset(path)
    assert ds.format == name
    assert np.concatenate([bt.ids for bt in ds.batches()]).tolist() == [1, 2, 3, 4, 5]
    assert pa.Table.from_batches([b for _, b in ds.record_batches()]).column("id").to_pylist() == ["a", "b"]


# --- merge writes a SpecForge cache back as one ------------------------------------------------------

N = 10
REPLACED = (1, 4)


@pytest.fixture(scope="module")
def merge_rows():
    return sample_rows(N)


def regen_folder(folder: Path, rows) -> Path:
    write_shard(folder / "shards" / "part-a-000000.parquet",
                [shard_record(1, rows[1][0], None), shard_record(4, rows[4][0], None, status="length")])
    return folder


def expected_new(rows, r: int) -> tuple[list[int], list[int]]:
    ids = rows[r][0]
    p = prompt_len(ids)
    out = regen_output(r)
    return list(ids[:p]) + out, [0] * p + [1] * len(out)


def read_stream(path: Path) -> pa.Table:
    data = path.read_bytes()
    assert data[:4] == b"\xff\xff\xff\xff", "not an Arrow IPC stream"
    return pa.ipc.open_stream(data).read_all()


def test_merge_writes_a_specforge_cache_back_in_its_layout_and_specforge_loads_it(cli, merge_rows, tmp_path):
    import datasets

    rows = merge_rows
    specforge_cache(tmp_path / "cache", rows)
    src = tmp_path / "cache" / "key.pkl"
    out = tmp_path / "new" / "key.pkl"
    out.parent.mkdir()
    # row 4 came back cut at the token limit: taken only when asked for
    result = cli("merge", src, "--regen", regen_folder(tmp_path / "regen", rows), "--out", out, "--accept", "ok,length")
    assert result.exit_code == 0, result.stderr

    before, after = read_stream(src), read_stream(out)
    assert after.column_names == before.column_names + ["dqa_regen"]
    for c in before.column_names:
        assert after.schema.field(c).type == before.schema.field(c).type, c
    for r in range(N):
        if r in REPLACED:
            new_ids, new_mask = expected_new(rows, r)
            assert after.column("input_ids")[r].as_py() == [new_ids]
            assert after.column("loss_mask")[r].as_py() == [new_mask]
            assert after.column("attention_mask")[r].as_py() == [[1] * len(new_ids)]
            assert json.loads(after.column("dqa_regen")[r].as_py())["status"] == ("ok" if r == 1 else "length")
        else:
            for c in before.column_names:
                assert after.column(c)[r] == before.column(c)[r], (r, c)
            assert after.column("dqa_regen")[r].as_py() is None

    # SpecForge reads its cache back with map(load_from_cache_file=True, cache_file_name=...) and torch format.
    def must_not_run(examples):
        raise AssertionError("the cache file should have been loaded")

    source = datasets.Dataset.from_dict({"conversations": [[{"from": "human", "value": str(i)}] for i in range(N)]})
    loaded = source.map(must_not_run, batched=True, batch_size=1000, remove_columns=["conversations"],
                        load_from_cache_file=True, cache_file_name=str(out))
    loaded.set_format(type="torch")
    row = loaded[1]
    assert tuple(row["input_ids"].shape) == (1, len(expected_new(rows, 1)[0]))
    assert row["input_ids"][0].tolist() == expected_new(rows, 1)[0]
    assert tuple(loaded[0]["loss_mask"].shape) == (1, len(rows[0][1]))

    # and dqa reads the merged cache as the flat rows it holds
    summary = json.loads(cli("scan", out, "--out", tmp_path / "scan", "--json").stdout)
    assert summary["rows"] == N and summary["format"] == "arrow-stream"


def test_merge_of_a_sharded_cache_folder_keeps_its_file_names(merge_rows, tmp_path):
    from dqa.audit.readers import open_dataset
    from dqa.regen.merge import MergeOptions, merge

    rows = merge_rows
    specforge_cache(tmp_path / "cache", rows, num_proc=2, min_loss_tokens=1)  # SpecForge's filter, as by default
    out = tmp_path / "new"
    summary = merge(tmp_path / "cache", [regen_folder(tmp_path / "regen", rows)], out,
                    MergeOptions(batch_rows=3, accept=("ok", "length")))
    assert summary.replaced == 2 and summary.format == "arrow-stream"
    assert sorted(p.name for p in out.glob("*.pkl")) == ["key_00000_of_00002.pkl", "key_00001_of_00002.pkl"]
    back = [b for b in open_dataset(out).batches()]
    ids = np.concatenate([b.ids for b in back])
    offsets = np.concatenate([[0], np.cumsum(np.concatenate([b.lengths for b in back]))])
    assert ids[offsets[4]:offsets[5]].tolist() == expected_new(rows, 4)[0]
    assert ids[offsets[0]:offsets[1]].tolist() == rows[0][0]
    assert read_stream(out / "key_00001_of_00002.pkl").schema.field("input_ids").type == pa.list_(pa.list_(pa.int32()))
    # datasets' filter indices beside the input list rows of the OLD data: not carried over
    assert any(p.name.startswith("cache-") for p in (tmp_path / "cache").glob("*.arrow"))
    assert not list(out.glob("cache-*.arrow"))
