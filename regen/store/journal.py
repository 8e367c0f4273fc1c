"""Durable regen output: an append-only journal compacted into parquet shards, exactly once.

Every finished row (ok, length or failed) is encoded as one record and
appended to the open journal segment ``journal/<tag>-<seq>.log``; a writer
thread group-commits (one ``write`` + ``fdatasync``) every ~100 ms. A record is
``u32 length, u32 crc32, payload``; a torn or corrupt tail (kill -9 mid-write)
is detected by length/CRC and discarded on resume.

When a segment holds ``shard_rows`` records (or is ``shard_seconds`` old) it
is compacted into ``shards/part-<tag>-<seq>.parquet`` through ``dqa.atomic``
(temp file + rename) and then deleted. A shard and its segment share ``seq``,
so a crash between the rename and the delete is repaired on resume by deleting
the segment: no record can land in two shards, and no row is written twice.

Records are per assistant turn: ``(row, turn)`` is what exactly-once is about (single-turn data:
one record per row, as before). A conversation's turn ``k + 1`` is only sent after turn ``k``'s
record was appended, and records reach the segment in append order, so a durable later turn
implies the earlier ones are durable too; ``recover`` reports the conversations left half done
(``Recovery.partial``), and a resume continues them at their next turn on the recorded outputs.

Shard columns follow FORMATS.md (``dqa regen`` output folder).
"""

from __future__ import annotations

import json
import os
import re
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _json_str  # json.dumps of one str
from operator import attrgetter
from pathlib import Path
from typing import Callable

import numpy as np

from dqa.atomic import atomic_path, fsync_dir, new_temp, remove_stale_temps
from dqa.regen.store.shards import SHARD_RE, SHARD_WRITE_OPTIONS, STATUSES, ShardStatus, list_shards, shard_path, shard_schema

FRAME = struct.Struct("<II")
FIXED = struct.Struct("<qqiiidd")  # row, seed, n_prompt, n_output, attempts, latency_s, completed_at
SEGMENT_RE = re.compile(r"^(?P<tag>.+)-(?P<seq>\d{6,})\.log$")


@dataclass
class Result:
    """One finished row, as it goes into a shard."""

    row: int
    sample_id: str | None
    prompt: np.ndarray
    output: np.ndarray
    status: str  # ok | length | failed
    finish_reason: str
    error: str | None
    endpoint: str
    attempts: int
    latency_s: float
    model: str
    sampling: str
    seed: int
    completed_at: float
    # Multi-turn: which assistant turn of the sample this is (0-based), how many the sample has, and how
    # many prompt tokens were copied from the dataset row unchanged (-1: all of them, the prompt_len).
    turn: int = 0
    turns: int = 1
    kept_len: int = -1
    # Prompt tokens the server said it had in its prefix cache (SGLang's meta_info.cached_tokens); None: not said.
    cached_tokens: int | None = None


def encode(r: Result) -> bytes:
    """One framed journal record for ``r``."""
    prompt = np.ascontiguousarray(r.prompt, dtype=np.int32)
    output = np.ascontiguousarray(r.output, dtype=np.int32)
    meta = _meta(r)
    payload = b"".join(
        (
            FIXED.pack(r.row, r.seed, prompt.size, output.size, r.attempts, r.latency_s, r.completed_at),
            prompt.tobytes(),
            output.tobytes(),
            meta,
        )
    )
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


_META_TAILS: dict[tuple, bytes] = {}  # everything of a record's meta after its sample id, per distinct value


def _meta(r: Result) -> bytes:
    """The record's meta, ``json.dumps([sample_id, status, finish_reason, error, endpoint, model,
    sampling, turn, turns, kept_len, cached_tokens])``. All but the sample id and the cached tokens
    repeat from record to record, so that part is encoded once per distinct value (the records of
    failures, with their own error texts, are encoded whole)."""
    if r.error is not None:
        return json.dumps([r.sample_id, r.status, r.finish_reason, r.error, r.endpoint, r.model, r.sampling,
                           r.turn, r.turns, r.kept_len, r.cached_tokens]).encode()
    key = (r.status, r.finish_reason, r.endpoint, r.model, r.sampling, r.turn, r.turns, r.kept_len)
    tail = _META_TAILS.get(key)
    if tail is None:
        if len(_META_TAILS) > 4096:  # bounded: kept_len varies on multi-turn data
            _META_TAILS.clear()
        tail = _META_TAILS[key] = json.dumps([None, *key[:2], None, *key[2:]])[5:-1].encode()  # ', "ok", ..., 12'
    sid = b"null" if r.sample_id is None else _json_str(r.sample_id).encode()
    cached = b"null" if r.cached_tokens is None else b"%d" % r.cached_tokens
    return b"[" + sid + tail + b", " + cached + b"]"


def decode_segment(data: bytes) -> tuple[list[Result], int]:
    """Records of a segment, and how many trailing bytes were torn or corrupt (discarded)."""
    out: list[Result] = []
    pos, n = 0, len(data)
    while pos + FRAME.size <= n:
        length, crc = FRAME.unpack_from(data, pos)
        start, end = pos + FRAME.size, pos + FRAME.size + length
        if end > n or length < FIXED.size:
            break
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            break
        row, seed, n_prompt, n_out, attempts, latency, done_at = FIXED.unpack_from(payload, 0)
        off = FIXED.size
        prompt = np.frombuffer(payload, dtype=np.int32, count=n_prompt, offset=off)
        off += 4 * n_prompt
        output = np.frombuffer(payload, dtype=np.int32, count=n_out, offset=off)
        off += 4 * n_out
        meta = json.loads(payload[off:])
        sid, status, finish, error, endpoint, model, sampling = meta[:7]
        turn, turns, kept = meta[7:10] if len(meta) >= 10 else (0, 1, -1)  # records of runs before multi-turn
        cached = meta[10] if len(meta) >= 11 else None  # records of runs before cached_tokens
        out.append(Result(row, sid, prompt, output, status, finish, error, endpoint, attempts, latency, model, sampling, seed, done_at,
                          turn, turns, kept, cached))
        pos = end
    return out, n - pos


# Every field of a Result, in declaration order, as one tuple (results_table transposes them in one pass).
_RESULT_FIELDS = attrgetter("row", "sample_id", "prompt", "output", "status", "finish_reason", "error", "endpoint", "attempts",
                            "latency_s", "model", "sampling", "seed", "completed_at", "turn", "turns", "kept_len",
                            "cached_tokens")


def results_table(results: list[Result]):
    """A pyarrow Table in the shard schema: ``input_ids`` = prompt + output, ``loss_mask`` 0 then 1."""
    import pyarrow as pa

    n = len(results)
    (rows, ids, prompts, outputs, statuses, finishes, errors, endpoints, attempts, latencies, models, samplings, seeds,
     done_at, turns, n_turns, kept, cached) = zip(*map(_RESULT_FIELDS, results)) if n else ((),) * 18
    p_len = np.fromiter(map(len, prompts), dtype=np.int64, count=n)
    o_len = np.fromiter(map(len, outputs), dtype=np.int64, count=n)
    spans = np.empty(2 * n, dtype=np.int64)  # prompt, output, prompt, output, ...
    spans[0::2], spans[1::2] = p_len, o_len
    parts = [None] * (2 * n)
    parts[0::2], parts[1::2] = prompts, outputs
    values = np.concatenate(parts).astype(np.int32, copy=False) if n else np.zeros(0, np.int32)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(p_len + o_len, out=offsets[1:])
    mask = np.repeat(np.tile(np.array([0, 1], np.uint8), n), spans)
    kept_len = np.asarray(kept, dtype=np.int64) if n else p_len
    kept_len = np.where(kept_len >= 0, kept_len, p_len)  # -1: the whole prompt was kept
    cols = {
        "row": pa.array(rows, pa.int64()),
        "id": pa.array(ids, pa.string()),
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32())),
        "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask, pa.uint8())),
        "prompt_len": pa.array(p_len.astype(np.int32)),
        "output_tokens": pa.array(o_len.astype(np.int32)),
        "status": pa.array(statuses, pa.string()),
        "finish_reason": pa.array(finishes, pa.string()),
        "error": pa.array(errors, pa.string()),
        "endpoint": pa.array(endpoints, pa.string()),
        "attempts": pa.array(attempts, pa.int32()),
        "latency_s": pa.array(latencies, pa.float64()),
        "model": pa.array(models, pa.string()),
        "sampling": pa.array(samplings, pa.string()),
        "seed": pa.array(seeds, pa.int64()),
        "completed_at": pa.array((np.asarray(done_at, dtype=np.float64) * 1e6).astype(np.int64).astype("datetime64[us]"),
                                 pa.timestamp("us", tz="UTC")),
        "turn": pa.array(turns, pa.int32()),
        "turns": pa.array(n_turns, pa.int32()),
        "kept_len": pa.array(kept_len.astype(np.int32)),
        "cached_tokens": pa.array(cached, pa.int32()),
    }
    return pa.table(cols, schema=shard_schema())


SHARD_ROW_GROUP = 2048


def write_table(path: Path, table) -> None:
    """Write a shard atomically (temp file + fsync + rename), in row groups of SHARD_ROW_GROUP rows
    so readers (merge, report) can stream a shard without decoding all of it at once."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=SHARD_ROW_GROUP, **SHARD_WRITE_OPTIONS)


@dataclass
class Recovery:
    """What an output folder already holds, per conversation (dataset row).

    A row has *ended* when its final assistant turn is recorded, or a turn is recorded with a status
    other than ``ok`` (the conversation stops there); ``rows`` lists those, with the status of the
    record that ended it and the output tokens of all its records. ``partial`` lists the rows with
    ok records of earlier turns only: a resume continues them at their next turn.
    """

    rows: np.ndarray  # sorted rows whose conversation ended (int64)
    statuses: np.ndarray  # int8 index into STATUSES per row (aligned with rows)
    tokens: np.ndarray  # output tokens per row (int64, aligned with rows)
    next_seq: int
    recovered_records: int  # journal records compacted on this resume
    torn_bytes: int  # discarded torn tail bytes
    dropped_duplicates: int
    rewritten: list[Path] = field(default_factory=list)  # shards rewritten without their failed rows (retry_failed)
    partial: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # rows half done (sorted)

    @property
    def output_tokens(self) -> int:
        return int(self.tokens.sum())

    def tally(self, rows: np.ndarray) -> tuple[int, int, int, int]:
        """``(ok, failed, length, output tokens)`` over the recorded rows that are in ``rows``."""
        mask = np.isin(self.rows, rows)
        counts = np.bincount(self.statuses[mask], minlength=len(STATUSES))
        return int(counts[0]), int(counts[2]), int(counts[1]), int(self.tokens[mask].sum())


@dataclass
class _Done:
    """The row, status, output_tokens, turn and turns columns of one shard."""

    path: Path
    rows: np.ndarray
    statuses: np.ndarray
    tokens: np.ndarray
    turn: np.ndarray
    turns: np.ndarray

    def keys(self) -> np.ndarray:
        return record_keys(self.rows, self.turn)


def record_keys(rows: np.ndarray, turn: np.ndarray) -> np.ndarray:
    """One int64 per (row, turn): what exactly-once is about."""
    return rows.astype(np.int64) * 65536 + (turn.astype(np.int64) + 1)


def _status_codes(col) -> np.ndarray:
    """int8 indexes into STATUSES of a status column (-1 for anything else)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    idx = pc.index_in(col, value_set=pa.array(STATUSES, pa.string()))
    return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int8)


def _read_done(path: Path) -> _Done:
    import pyarrow.parquet as pq

    names = set(pq.read_schema(path).names)
    multi = {"turn", "turns"} <= names
    t = pq.read_table(path, columns=["row", "status", "output_tokens"] + (["turn", "turns"] if multi else []))
    n = t.num_rows
    return _Done(
        path,
        t.column("row").to_numpy().astype(np.int64, copy=False),
        _status_codes(t.column("status")),
        t.column("output_tokens").to_numpy().astype(np.int64, copy=False),
        t.column("turn").to_numpy().astype(np.int64) if multi else np.zeros(n, np.int64),
        t.column("turns").to_numpy().astype(np.int64) if multi else np.ones(n, np.int64),
    )


def _done_of(path: Path, records: list[Result]) -> _Done:
    """What ``_read_done`` would read back from the shard just written from ``records``."""
    n = len(records)
    return _Done(
        path,
        np.fromiter((r.row for r in records), dtype=np.int64, count=n),
        np.fromiter((STATUSES.index(r.status) if r.status in STATUSES else -1 for r in records), dtype=np.int8, count=n),
        np.fromiter((r.output.size for r in records), dtype=np.int64, count=n),
        np.fromiter((r.turn for r in records), dtype=np.int64, count=n),
        np.fromiter((r.turns for r in records), dtype=np.int64, count=n),
    )


def conversations(rows: np.ndarray, turn: np.ndarray, turns: np.ndarray, statuses: np.ndarray, tokens: np.ndarray):
    """Per-record columns -> per row: ``(ended rows, their status, their tokens, partial rows)``.

    A row has ended when a record of its final turn (``turn == turns - 1``) or a record whose
    status is not ``ok`` exists; its status is that of its last record (the conversation stops at
    the first turn that is not ``ok``), its tokens the sum over its records.
    """
    if rows.size == 0:
        z = np.zeros(0, np.int64)
        return z, np.zeros(0, np.int8), z, z
    order = np.lexsort((turn, rows))
    r, t, ts, st, tok = rows[order], turn[order], turns[order], statuses[order], tokens[order]
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    lasts = np.r_[starts[1:], r.size] - 1
    ends_here = (st != ShardStatus.OK.code) | (t >= ts - 1)
    ended = np.maximum.reduceat(ends_here.astype(np.int8), starts).astype(bool)
    sums = np.add.reduceat(tok, starts)
    uniq = r[starts]
    return uniq[ended], st[lasts][ended], sums[ended], uniq[~ended]


def partial_outputs(out: Path, rows: np.ndarray) -> dict[int, dict[int, np.ndarray]]:
    """The output tokens of the ok records of ``rows`` (half-done conversations): row -> turn -> output."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    result: dict[int, dict[int, np.ndarray]] = {}
    if rows.size == 0:
        return result
    want = set(int(r) for r in rows)
    for p in list_shards(out):
        if "turn" not in pq.read_schema(p).names:
            continue
        t = pq.read_table(p, columns=["row", "turn", "status", "input_ids", "prompt_len"])
        hit = pc.is_in(t.column("row"), value_set=pa.array(sorted(want), pa.int64()))
        t = t.filter(pc.and_(hit, pc.equal(t.column("status"), ShardStatus.OK.value)))
        for rec in t.to_pylist():
            ids = np.asarray(rec["input_ids"], dtype=np.int32)
            result.setdefault(int(rec["row"]), {})[int(rec["turn"])] = ids[int(rec["prompt_len"]):]
    return result


def recover(out: Path, retry_failed: bool = False) -> Recovery:
    """Make ``out`` consistent after any crash and report what it holds.

    Removes stray temp files, deletes segments already compacted, compacts the
    valid records of the others (dropping a torn tail and (row, turn) records already in a
    shard). With ``retry_failed`` it then rewrites the shards that hold
    ``failed`` records without them (``--retry-failed``; listed in ``rewritten``).
    Each shard's small columns are read once. Raises ``OSError`` on I/O failure.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    (out / "shards").mkdir(parents=True, exist_ok=True)
    (out / "journal").mkdir(parents=True, exist_ok=True)
    for d in (out, out / "shards", out / "journal"):
        remove_stale_temps(d)
    done = [_read_done(p) for p in list_shards(out)]
    seqs = [int(SHARD_RE.match(d.path.name)["seq"]) for d in done]
    known = np.concatenate([d.keys() for d in done]) if done else np.zeros(0, np.int64)
    recovered = torn = dropped = 0
    for seg in sorted((out / "journal").glob("*.log")):
        m = SEGMENT_RE.match(seg.name)
        if not m:
            continue
        tag, seq = m["tag"], int(m["seq"])
        seqs.append(seq)
        target = shard_path(out, tag, seq)
        if not target.exists():
            records, t = decode_segment(seg.read_bytes())
            torn += t
            rr = record_keys(np.fromiter((r.row for r in records), dtype=np.int64, count=len(records)),
                             np.fromiter((r.turn for r in records), dtype=np.int64, count=len(records)))
            first = np.zeros(rr.size, dtype=bool)
            first[np.unique(rr, return_index=True)[1]] = True
            keep_mask = first & ~np.isin(rr, known)
            dropped += int(rr.size - keep_mask.sum())
            keep = [records[i] for i in np.flatnonzero(keep_mask)]
            if keep:
                write_table(target, results_table(keep))
                done.append(_done_of(target, keep))
                known = np.concatenate([known, rr[keep_mask]])
                recovered += len(keep)
        seg.unlink()
        fsync_dir(out / "journal")
    rewritten: list[Path] = []
    if retry_failed:
        failed = ShardStatus.FAILED.code
        for i, d in enumerate(done):
            bad = d.statuses == failed
            if bad.any():
                t = pq.read_table(d.path)
                write_table(d.path, t.filter(pc.not_equal(t.column("status"), ShardStatus.FAILED.value)))
                done[i] = _Done(d.path, d.rows[~bad], d.statuses[~bad], d.tokens[~bad], d.turn[~bad], d.turns[~bad])
                rewritten.append(d.path)
    if done:
        rows, statuses, tokens, partial = conversations(
            np.concatenate([d.rows for d in done]), np.concatenate([d.turn for d in done]), np.concatenate([d.turns for d in done]),
            np.concatenate([d.statuses for d in done]), np.concatenate([d.tokens for d in done]),
        )
    else:
        rows, statuses, tokens, partial = np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return Recovery(rows, statuses, tokens, (max(seqs) + 1) if seqs else 0, recovered, torn, dropped, rewritten, partial)


class Journal:
    """The writer side: append records from the event loop; a thread makes them durable and closes shards.

    ``on_shard(path)`` runs in the writer thread after each shard appears.
    ``error`` holds the exception that stopped the writer (disk full ...), if any.
    """

    def __init__(
        self,
        out: Path,
        tag: str,
        seq: int,
        shard_rows: int = 20_000,
        shard_seconds: float = 300.0,
        commit_interval: float = 0.1,
        on_shard: Callable[[Path], None] | None = None,
    ):
        self.out = out
        self.tag = tag
        self.seq = seq
        self.shard_rows = shard_rows
        self.shard_seconds = shard_seconds
        self.commit_interval = commit_interval
        self.on_shard = on_shard
        self.error: BaseException | None = None
        self.durable = 0  # records made durable so far (this session)
        self._buf: list[tuple[bytes, Result | None]] = []
        # The open segment's shard, written a row group at a time as records become durable, so that
        # closing a segment only writes its last row group (before: decode the segment, build and
        # write the whole shard, ~1 s per 20,000 rows at the end of a run). The segment log stays
        # the record of truth: a crash leaves a temp file that recovery removes.
        self._pending: list[Result] = []
        self._shard_tmp: Path | None = None
        self._shard_writer = None
        self._incremental = True  # every record of the open segment came with its Result
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._fd: int | None = None
        self._seg_records = 0
        self._seg_opened = 0.0
        self._thread = threading.Thread(target=self._run, name="dqa-journal", daemon=True)

    # -- event-loop side --------------------------------------------------------------
    def start(self) -> None:
        self._open_segment()
        self._thread.start()

    def append(self, frame: bytes, result: Result | None = None) -> None:
        """Queue a framed record (``encode(result)``); with ``result`` the shard is built from it
        directly instead of from the decoded segment."""
        with self._lock:
            self._buf.append((frame, result))

    def close(self) -> None:
        """Commit everything, compact the open segment into a shard, stop the thread. Re-raises a writer error."""
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.error is not None:
            raise self.error

    # -- writer thread ----------------------------------------------------------------
    def _segment_path(self) -> Path:
        return self.out / "journal" / f"{self.tag}-{self.seq:06d}.log"

    def _open_segment(self) -> None:
        self._fd = os.open(self._segment_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        fsync_dir(self.out / "journal")
        self._seg_records = 0
        self._seg_opened = time.monotonic()
        self._incremental = True

    def _commit(self) -> None:
        with self._lock:
            queued, self._buf = self._buf, []
        if not queued:
            return
        frames = [f for f, _ in queued]
        data = b"".join(frames)
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)  # type: ignore[arg-type]
            view = view[n:]
        os.fdatasync(self._fd)  # type: ignore[arg-type]
        self._seg_records += len(frames)
        self.durable += len(frames)
        if self._incremental:
            if any(r is None for _, r in queued):
                self._drop_shard_writer()  # this segment's shard is built from its log at rotation
            else:
                self._pending.extend(r for _, r in queued)  # type: ignore[misc]
                while len(self._pending) >= SHARD_ROW_GROUP:
                    self._write_row_group(self._pending[:SHARD_ROW_GROUP])
                    del self._pending[:SHARD_ROW_GROUP]

    def _write_row_group(self, results: list[Result]) -> None:
        import pyarrow.parquet as pq

        if self._shard_writer is None:
            self._shard_tmp = new_temp(shard_path(self.out, self.tag, self.seq))
            self._shard_writer = pq.ParquetWriter(self._shard_tmp, shard_schema(), **SHARD_WRITE_OPTIONS)
        self._shard_writer.write_table(results_table(results))

    def _drop_shard_writer(self) -> None:
        self._incremental = False
        self._pending.clear()
        if self._shard_writer is not None:
            self._shard_writer.close()
            self._shard_writer = None
        if self._shard_tmp is not None:
            self._shard_tmp.unlink(missing_ok=True)
            self._shard_tmp = None

    def _finish_shard(self, closed: Path) -> None:
        """Write the open segment's shard to ``closed``: its last row group onto the one being
        written, or the whole shard from the segment log when some record came without its Result."""
        if not self._incremental:
            records, _ = decode_segment(self._segment_path().read_bytes())
            write_table(closed, results_table(records))
            return
        if self._pending:
            self._write_row_group(self._pending)
            self._pending.clear()
        assert self._shard_writer is not None and self._shard_tmp is not None
        self._shard_writer.close()
        self._shard_writer = None
        with open(self._shard_tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(self._shard_tmp, closed)
        self._shard_tmp = None
        fsync_dir(closed.parent)

    def _rotate(self, reopen: bool) -> None:
        seg = self._segment_path()
        os.close(self._fd)  # type: ignore[arg-type]
        self._fd = None
        closed: Path | None = None
        if self._seg_records:
            closed = shard_path(self.out, self.tag, self.seq)
            self._finish_shard(closed)
        else:
            self._drop_shard_writer()
        seg.unlink()
        fsync_dir(self.out / "journal")
        if closed is not None or reopen:
            self.seq += 1
        if reopen:
            self._open_segment()
        if closed is not None and self.on_shard is not None:
            self.on_shard(closed)

    def _run(self) -> None:
        try:
            while not self._stop:
                self._wake.wait(self.commit_interval)
                self._wake.clear()
                self._commit()
                full = self._seg_records >= self.shard_rows
                old = self._seg_records and time.monotonic() - self._seg_opened >= self.shard_seconds
                if full or old:
                    self._rotate(reopen=True)
            self._commit()
            self._rotate(reopen=False)
        except BaseException as exc:  # surfaced to the run through .error
            self.error = exc
