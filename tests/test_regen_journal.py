"""The regen journal: records survive any cut, a torn tail is dropped, compaction never duplicates a row."""

from __future__ import annotations

import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from dqa.regen.store.journal import Journal, Result, decode_segment, encode, list_shards, recover, results_table, shard_schema
from regen_helpers import read_shards


def _result(row: int, status: str = "ok", n_out: int = 3) -> Result:
    return Result(
        row=row, sample_id=f"s{row}", prompt=np.array([151644, 77091, 198], np.int32) + 0,
        output=np.arange(n_out, dtype=np.int32) + 1000 + row, status=status, finish_reason="stop" if status == "ok" else "",
        error=None if status != "failed" else "HTTP 400: bad", endpoint="http://a:1", attempts=1, latency_s=0.5,
        model="m", sampling='{"temperature": 0.6}', seed=row * 7, completed_at=time.time(),
    )


def test_records_round_trip():
    data = b"".join(encode(_result(r, n_out=r)) for r in range(5))
    out, torn = decode_segment(data)
    assert torn == 0 and [r.row for r in out] == list(range(5))
    assert out[3].output.tolist() == [1003, 1004, 1005] and out[3].sample_id == "s3" and out[3].seed == 21


def test_a_torn_tail_is_discarded_at_every_cut_point():
    whole = [encode(_result(r)) for r in range(3)]
    data = b"".join(whole)
    keep = len(whole[0]) + len(whole[1])
    for cut in range(keep, len(data)):
        out, torn = decode_segment(data[:cut])
        assert [r.row for r in out] == [0, 1] and torn == cut - keep


def test_a_corrupt_record_ends_the_valid_prefix():
    a, b = encode(_result(0)), bytearray(encode(_result(1)))
    b[-1] ^= 0xFF
    out, torn = decode_segment(a + bytes(b))
    assert [r.row for r in out] == [0] and torn == len(b)


def test_shard_rows_are_prompt_plus_output_with_a_zero_one_mask():
    t = results_table([_result(4, n_out=2), _result(9, status="failed", n_out=0)])
    assert t.schema == shard_schema()
    rows = t.to_pylist()
    assert rows[0]["input_ids"] == [151644, 77091, 198, 1004, 1005]
    assert rows[0]["loss_mask"] == [0, 0, 0, 1, 1]
    assert rows[0]["prompt_len"] == 3 and rows[0]["output_tokens"] == 2
    assert rows[1]["loss_mask"] == [0, 0, 0] and rows[1]["status"] == "failed" and rows[1]["error"] == "HTTP 400: bad"


def test_writer_closes_shards_by_size_and_on_close(tmp_path):
    rec = recover(tmp_path)
    closed = []
    j = Journal(tmp_path, "s0of1", rec.next_seq, shard_rows=4, commit_interval=0.01, on_shard=closed.append)
    for r in range(5):  # queued before the writer starts: its first group commit holds all 5
        j.append(encode(_result(r)))
    j.start()
    deadline = time.monotonic() + 60  # bounds a hang only
    while not closed:  # a group commit of >= 4 records closes a shard
        assert time.monotonic() < deadline, "no shard closed"
        time.sleep(0.01)
    for r in range(5, 8):
        j.append(encode(_result(r)))
    j.close()
    shards = list_shards(tmp_path)
    assert closed == shards and len(shards) == 2
    assert [pq.read_table(p).num_rows for p in shards] == [5, 3]
    assert sorted(read_shards(tmp_path).column("row").to_pylist()) == list(range(8))
    assert not list((tmp_path / "journal").glob("*.log"))


def test_resume_compacts_a_killed_segment_and_drops_its_torn_tail(tmp_path):
    rec = recover(tmp_path)
    seg = tmp_path / "journal" / f"s0of1-{rec.next_seq:06d}.log"
    frames = [encode(_result(r)) for r in range(3)]
    seg.write_bytes(frames[0] + frames[1] + frames[2][:-5])
    (tmp_path / "shards" / ".tmp-part-x.parquet").write_bytes(b"half")
    rec = recover(tmp_path)
    assert rec.rows.tolist() == [0, 1] and rec.recovered_records == 2 and rec.torn_bytes == len(frames[2]) - 5
    assert not seg.exists() and not list((tmp_path / "shards").glob(".tmp-*"))
    assert rec.next_seq == 1


def test_a_crash_between_shard_rename_and_segment_delete_writes_nothing_twice(tmp_path):
    rec = recover(tmp_path)
    j = Journal(tmp_path, "s0of1", rec.next_seq, commit_interval=0.01)
    j.start()
    for r in range(5):
        j.append(encode(_result(r)))
    j.close()
    (shard,) = list_shards(tmp_path)
    # Put the compacted segment back, as if the process died right after the rename.
    (tmp_path / "journal" / "s0of1-000000.log").write_bytes(b"".join(encode(_result(r)) for r in range(5)))
    rec = recover(tmp_path)
    assert rec.rows.tolist() == [0, 1, 2, 3, 4]
    assert read_shards(tmp_path).num_rows == 5


def test_records_of_rows_already_in_a_shard_are_dropped_on_resume(tmp_path):
    recover(tmp_path)
    from dqa.regen.store.journal import shard_path, write_table

    write_table(shard_path(tmp_path, "s0of1", 0), results_table([_result(1)]))
    (tmp_path / "journal" / "s0of1-000001.log").write_bytes(encode(_result(1)) + encode(_result(2)))
    rec = recover(tmp_path)
    assert rec.rows.tolist() == [1, 2] and rec.dropped_duplicates == 1


def test_retry_failed_removes_failed_records_only(tmp_path):
    recover(tmp_path)
    from dqa.regen.store.journal import shard_path, write_table

    write_table(shard_path(tmp_path, "s0of1", 0), results_table([_result(1), _result(2, "failed"), _result(3, "length")]))
    rec = recover(tmp_path, retry_failed=True)
    assert rec.rewritten == list_shards(tmp_path) and rec.rows.tolist() == [1, 3]
    assert sorted(pq.read_table(list_shards(tmp_path)[0]).column("row").to_pylist()) == [1, 3]
    assert recover(tmp_path, retry_failed=True).rewritten == []


def test_recovery_tallies_statuses_and_tokens_of_the_rows_asked_for(tmp_path):
    recover(tmp_path)
    from dqa.regen.store.journal import shard_path, write_table

    write_table(shard_path(tmp_path, "s0of1", 0), results_table([_result(1, n_out=5), _result(2, "failed", n_out=0)]))
    (tmp_path / "journal" / "s0of1-000001.log").write_bytes(encode(_result(3, "length", n_out=7)) + encode(_result(8, n_out=11)))
    rec = recover(tmp_path)
    assert rec.rows.tolist() == [1, 2, 3, 8] and rec.output_tokens == 23
    assert rec.tally(np.array([1, 2, 3, 8])) == (2, 1, 1, 23)
    # a smaller selection (a later run with a smaller --limit) counts only its own rows' tokens
    assert rec.tally(np.array([1, 2, 3])) == (1, 1, 1, 12)


def test_duplicate_records_inside_one_segment_keep_the_first(tmp_path):
    recover(tmp_path)
    (tmp_path / "journal" / "s0of1-000000.log").write_bytes(encode(_result(4, n_out=2)) + encode(_result(4, n_out=9)))
    rec = recover(tmp_path)
    assert rec.rows.tolist() == [4] and rec.dropped_duplicates == 1 and rec.output_tokens == 2


def test_every_shard_row_is_its_result_whatever_the_lengths():
    """Each row, column by column, is its own Result: empty prompts and outputs, ids or none,
    kept_len -1 (all of the prompt), and completion times cut to the microsecond."""
    rng = np.random.default_rng(3)
    results = []
    for i in range(200):
        p = rng.integers(0, 150_000, int(rng.integers(0, 40)), dtype=np.int32)
        o = rng.integers(0, 150_000, int(rng.integers(0, 40)), dtype=np.int32)
        results.append(Result(i * 3, None if i % 7 == 0 else f"s{i}", p, o, ("ok", "length", "failed")[i % 3], "stop",
                              None if i % 2 else "boom", f"http://e{i % 4}", 1 + i % 5, float(rng.random()), "m", "{}",
                              int(rng.integers(1 << 31)), 1.7e9 + float(rng.random()), i % 3, 3, int(rng.integers(-1, 9))))
    rows = results_table(results).to_pylist()
    for r, row in zip(results, rows):
        assert row["input_ids"] == r.prompt.tolist() + r.output.tolist()
        assert row["loss_mask"] == [0] * r.prompt.size + [1] * r.output.size
        assert (row["row"], row["id"], row["status"], row["error"], row["endpoint"], row["attempts"], row["seed"]) == (
            r.row, r.sample_id, r.status, r.error, r.endpoint, r.attempts, r.seed)
        assert (row["prompt_len"], row["output_tokens"], row["turn"], row["turns"]) == (r.prompt.size, r.output.size, r.turn, r.turns)
        assert row["kept_len"] == (r.kept_len if r.kept_len >= 0 else r.prompt.size)
        assert row["latency_s"] == r.latency_s
        assert int(row["completed_at"].timestamp() * 1e6 + 0.5) == int(r.completed_at * 1e6)


@pytest.mark.parametrize("n", [0, 1])
def test_empty_or_single_results_make_valid_tables(n):
    t = results_table([_result(0)] * n)
    assert t.num_rows == n and t.schema == shard_schema()


@pytest.mark.parametrize("with_results", ["all", "some"])
def test_a_shard_written_row_group_by_row_group_equals_the_shard_built_from_its_log(tmp_path, with_results):
    """Records appended with their Result are written into the shard a row group at a time while the
    run goes on; the closed shard holds exactly what building it from the segment log gives, in row
    groups of SHARD_ROW_GROUP. A segment with a record that came without its Result is built from the log."""
    from dqa.regen.store.journal import SHARD_ROW_GROUP

    rec = recover(tmp_path)
    j = Journal(tmp_path, "s0of1", rec.next_seq, shard_rows=100_000, commit_interval=0.005)
    j.start()
    results = [_result(r, status="failed" if r % 97 == 0 else "ok", n_out=r % 11) for r in range(2 * SHARD_ROW_GROUP + 300)]
    frames = [encode(r) for r in results]
    for i, (frame, r) in enumerate(zip(frames, results)):
        j.append(frame, None if (with_results == "some" and i == 1000) else r)
        if i % 500 == 0:
            time.sleep(0.01)  # several commits, so row groups are written before the close
    j.close()
    (shard,) = list_shards(tmp_path)
    got = pq.read_table(shard)
    want = results_table(decode_segment(b"".join(frames))[0])
    assert got.equals(want)
    md = pq.ParquetFile(shard).metadata
    assert [md.row_group(g).num_rows for g in range(md.num_row_groups)] == [SHARD_ROW_GROUP, SHARD_ROW_GROUP, 300]
    assert not [p for p in (tmp_path / "shards").iterdir() if p.name.startswith(".tmp-")]
    assert not list((tmp_path / "journal").glob("*.log"))


def test_a_crash_while_a_shard_is_half_written_leaves_only_the_log(tmp_path):
    """The half-written shard is a temp file: recovery removes it and compacts the segment log."""
    from dqa.regen.store.journal import SHARD_ROW_GROUP

    rec = recover(tmp_path)
    j = Journal(tmp_path, "s0of1", rec.next_seq, shard_rows=100_000, commit_interval=0.005)
    j.start()
    for r in range(SHARD_ROW_GROUP + 10):
        j.append(encode(_result(r)), _result(r))
    deadline = time.monotonic() + 10
    while j.durable < SHARD_ROW_GROUP + 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    temps = [p for p in (tmp_path / "shards").iterdir() if p.name.startswith(".tmp-")]
    assert temps  # a row group is on disk in the shard being written
    j._rotate = lambda reopen: None  # a crash: the thread stops with the shard half written, no rotation
    j._stop = True
    j._wake.set()
    j._thread.join()
    again = recover(tmp_path)
    assert not [p for p in (tmp_path / "shards").iterdir() if p.name.startswith(".tmp-")]
    assert again.recovered_records == SHARD_ROW_GROUP + 10
    assert sorted(read_shards(tmp_path).column("row").to_pylist()) == list(range(SHARD_ROW_GROUP + 10))


def test_record_meta_is_the_json_of_its_fields_byte_for_byte():
    """Records keep their on-disk format (older runs resume from it): the meta after the numbers is
    json.dumps of the eleven fields, whatever the ids, errors, multi-turn fields and cached tokens hold."""
    import itertools
    import json

    from dqa.regen.store.journal import _meta

    for sid, err, kept, turn, cached in itertools.product([None, "s1", 'we"ird\u00e9\n', ""], [None, 'boom "x"'], [-1, 0, 17],
                                                          [0, 2], [None, 0, 4096]):
        r = Result(3, sid, np.zeros(2, np.int32), np.zeros(1, np.int32), "ok", "stop", err, "http://e", 1, 0.5, "m\u00fc",
                   '{"a": 1}', 7, 1.0, turn, 3, kept, cached)
        fields = [r.sample_id, r.status, r.finish_reason, r.error, r.endpoint, r.model, r.sampling, r.turn, r.turns, r.kept_len,
                  r.cached_tokens]
        assert _meta(r) == json.dumps(fields).encode()
        assert _meta(r) == json.dumps(fields).encode()  # the second time from the cached tail


def test_records_written_before_cached_tokens_decode_with_none_and_new_ones_keep_the_count(tmp_path):
    """A journal of an earlier run (ten meta fields) still decodes: its records say nothing about
    cached tokens (None, a null in the shard); a record with a count keeps it into the shard."""
    import json
    import zlib

    from dqa.regen.store.journal import FIXED, FRAME, decode_segment, encode, results_table

    prompt, output = np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32)
    meta = json.dumps(["s0", "ok", "stop", None, "http://e", "m", "{}", 1, 2, 5]).encode()
    payload = FIXED.pack(4, 9, 3, 2, 1, 0.5, 1.0) + prompt.tobytes() + output.tobytes() + meta
    old = FRAME.pack(len(payload), zlib.crc32(payload)) + payload
    new = encode(Result(5, "s1", prompt, output, "ok", "stop", None, "http://e", 1, 0.5, "m", "{}", 9, 1.0, 1, 2, 5, 2))
    records, torn = decode_segment(old + new)
    assert torn == 0 and [r.cached_tokens for r in records] == [None, 2]
    assert results_table(records).column("cached_tokens").to_pylist() == [None, 2]


def test_shards_dictionary_encode_the_repeating_columns_and_not_the_token_ids(tmp_path):
    """Dictionary encoding where values repeat (the 0/1 mask, statuses), plain for token ids, where
    building a dictionary costs the most of a shard's write time and saves nothing."""
    from dqa.regen.store.journal import write_table

    path = tmp_path / "shard.parquet"
    write_table(path, results_table([_result(r, n_out=50) for r in range(100)]))
    md = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {md.column(i).path_in_schema: md.column(i).encodings for i in range(md.num_columns)}
    assert "RLE_DICTIONARY" in encodings["loss_mask.list.element"]
    assert "RLE_DICTIONARY" in encodings["status"] and "RLE_DICTIONARY" in encodings["endpoint"]
    assert "RLE_DICTIONARY" not in encodings["input_ids.list.element"]
