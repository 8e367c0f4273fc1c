"""The jobs of the selected rows: one ``TurnJob`` per assistant turn to regenerate, streamed in
dataset order.

``iter_turn_jobs`` yields lists of jobs, one per dataset batch (the first list short, so the first
requests go out at once); ``TurnJob.next_job`` builds a conversation's next turn from the output
of the one before (``prompts.Conversation``). Which rows: ``rows`` (findings -> rows); the prompts
themselves: ``prompts``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dqa.arrays import ranks as _ranks
from dqa.errors import UsageError
from dqa.regen.jobs.job import Job
from dqa.regen.config import DEFAULT_TURNS, TURN_MODES
from dqa.regen.jobs.prompts import Conversation, header_starts, sample_seed, turn_ends

# The first list of jobs is short, so the first requests go out within milliseconds of the start.
FIRST_CHUNK = 256


class TurnJob(Job):
    """A ``Job`` for one assistant turn of a conversation: ``turn`` (0-based among the sample's
    assistant turns), ``turns`` (how many it has), ``kept_len`` (prompt tokens copied from the row
    unchanged) and, for a conversation with later turns to regenerate, ``conv`` (the
    ``Conversation``) to build the next turn's job from this one's output."""

    __slots__ = ("conv", "turn", "turns", "kept_len")

    def __init__(self, row, sample_id, prompt, seed, turn: int, turns: int, kept_len: int, conv=None, error=None):
        super().__init__(row, sample_id, prompt, seed, error)
        self.turn = turn
        self.turns = turns
        self.kept_len = kept_len
        self.conv = conv
        if conv is not None and turn != turns - 1:
            self.key = f"{self.key}:turn{turn}"  # the rid of an earlier turn differs from the final turn's

    def next_job(self, output: np.ndarray) -> "TurnJob | None":
        """After this turn finished ``ok`` with ``output``: the job of the conversation's next turn, or None."""
        conv = self.conv
        if conv is None or self.turn + 1 >= self.turns:
            return None
        conv.outputs[self.turn] = np.asarray(output, dtype=np.int32)
        return turn_job(conv, self.turn + 1)


def turn_job(conv: Conversation, k: int) -> TurnJob:
    """The job of turn ``k`` of ``conv`` (its earlier regenerated turns' outputs in ``conv.outputs``)."""
    return TurnJob(conv.row, conv.sample_id, conv.prompt(k), conv.seed(k), k, conv.n_turns, conv.kept_len, conv)


def iter_turn_jobs(dataset, rows: np.ndarray, fmt, mode: str = DEFAULT_TURNS, first_flagged: np.ndarray | None = None,
                   partial: dict[int, dict[int, np.ndarray]] | None = None, seed_base: int = 0,
                   batch_rows: int = 4096, generation_prompt: tuple[int, ...] | None = None,
                   first_chunk: int = FIRST_CHUNK) -> Iterator[list[Job]]:
    """Stream the first pending turn's ``TurnJob`` of each selected row, in dataset order, one list
    per dataset batch (the first ``first_chunk`` rows come as a list of their own, so the first
    requests go out before the whole first batch is built).

    Which turns a conversation regenerates (``mode``): ``last`` its final assistant turn; ``all``
    every assistant turn; ``flagged`` from the first turn the findings flag (``first_flagged``,
    aligned with ``rows``; -1 or out of range: the final turn) to the last. A conversation in
    ``partial`` (turn -> output of the turns an earlier session recorded ok) continues at its next
    turn on that regenerated history. Every prompt ends in ``generation_prompt`` (default: the
    format's, thinking on; the openai protocol passes the bare header, its server's template adds
    the rest). A row without an assistant header becomes a job with ``error`` set (recorded as
    failed, never sent). Header positions, and the prompts of rows with one turn to regenerate
    (all single-turn data), come from vectorized passes per batch; a conversation with later turns
    to regenerate is built per conversation. Raises ``UsageError`` for an unknown ``mode``.
    """
    if mode not in TURN_MODES:
        raise UsageError(f"--turns {mode!r}: expected one of {', '.join(TURN_MODES)}")
    if rows.size == 0:
        return
    partial = partial or {}
    partial_rows = np.fromiter(partial, dtype=np.int64, count=len(partial))  # conversations to continue
    header = tuple(fmt.assistant_header)
    hlen = len(header)
    gen_ids = tuple(fmt.generation_prompt if generation_prompt is None else generation_prompt)
    gen = np.asarray(gen_ids, dtype=np.int32)
    last = int(rows[-1])
    chunk = max(1, first_chunk)
    for b in dataset.batches(batch_rows=batch_rows):
        lo, hi = b.start_row, b.start_row + b.num_rows
        i0, i1 = np.searchsorted(rows, [lo, hi])
        if i1 > i0:
            hpos, hrow = header_starts(b.ids, b.offsets, header)
            c0 = i0
            while c0 < i1:
                c1 = min(i1, c0 + chunk) if chunk else i1
                chunk = 0  # only the very first list is short
                ff = first_flagged[c0:c1] if mode == "flagged" and first_flagged is not None else None
                yield _batch_turn_jobs(b, rows[c0:c1] - lo, hpos, hrow, mode, ff, partial, partial_rows, seed_base, gen, gen_ids,
                                       hlen, fmt)
                c0 = c1
        if hi > last:
            return


def _batch_turn_jobs(b, local: np.ndarray, hpos: np.ndarray, hrow: np.ndarray, mode: str, first_flagged: np.ndarray | None,
                     partial: dict, partial_rows: np.ndarray, seed_base: int, gen: np.ndarray, gen_ids: tuple[int, ...], hlen: int,
                     fmt) -> list[Job]:
    """The jobs of the batch rows ``local`` (see ``iter_turn_jobs``)."""
    lo = b.start_row
    h_lo = np.searchsorted(hrow, local, side="left")
    h_hi = np.searchsorted(hrow, local, side="right")
    n_heads = h_hi - h_lo
    starts = b.offsets[local].astype(np.int64)
    if mode == "all":
        first = np.zeros(local.size, dtype=np.int64)
    elif first_flagged is not None:
        ff = np.asarray(first_flagged, dtype=np.int64)
        first = np.where((ff >= 0) & (ff < n_heads), ff, n_heads - 1)
    else:
        first = n_heads - 1
    resumed = np.isin(local + lo, partial_rows) if partial_rows.size else np.zeros(local.size, dtype=bool)
    # One turn to regenerate (all single-turn data): the row up to that header, then the
    # generation prompt; built for the whole list at once, with no conversation state to carry.
    single = (n_heads > 0) & (first == n_heads - 1) & ~resumed
    s_idx = np.flatnonzero(single)
    cuts = hpos[h_hi[s_idx] - 1] - starts[s_idx] if s_idx.size else np.zeros(0, dtype=np.int64)
    values, p_off = _prompts_then(b.ids, starts[s_idx], cuts, gen)
    texts = _id_texts(values, p_off)
    slot = np.full(local.size, -1, dtype=np.int64)
    slot[s_idx] = np.arange(s_idx.size)
    ids_col = b.row_ids.take(local).cast("string").to_pylist() if b.row_ids is not None else [None] * local.size
    jobs: list[Job] = []
    built: list[Job] = []  # conversation jobs, whose prompt texts are built at the end
    # Python ints and list indexing in the per-row loop (numpy scalars cost a conversion each)
    rows_l, slot_l, first_l, heads_l = (local + lo).tolist(), slot.tolist(), first.tolist(), n_heads.tolist()
    off_l, kept_l = p_off.tolist(), (cuts + hlen).tolist()
    for k in range(local.size):
        row = rows_l[k]
        sid = ids_col[k]
        seed = sample_seed(sid if sid is not None else str(row), seed_base)
        s = slot_l[k]
        if s >= 0:
            job = TurnJob(row, sid, values[off_l[s] : off_l[s + 1]], seed, first_l[k], heads_l[k], kept_l[s])
            job.prompt_text = texts[s]
            jobs.append(job)
            continue
        n = heads_l[k]
        if n == 0:
            err = f"row {row}: no assistant header in input_ids; nothing to regenerate from"
            jobs.append(TurnJob(row, sid, np.zeros(0, np.int32), seed, -1, 0, 0, error=err))
            continue
        start = int(starts[k])
        heads = hpos[h_lo[k] : h_hi[k]] - start
        done = partial.get(row)
        orig = np.array(b.ids[start : int(b.offsets[local[k] + 1])], dtype=np.int32)  # kept past the batch, for later turns' prompts
        conv = Conversation(row, sid, orig, heads.astype(np.int64), turn_ends(orig, heads, fmt), min(done) if done else first_l[k],
                            fmt, seed_base, gen_ids)
        for t, out in (done or {}).items():
            conv.outputs[t] = out
        nxt = conv.next_turn()
        if nxt >= n:
            continue  # every turn recorded (recovery counts it as ended; not expected here)
        job = turn_job(conv, nxt)
        jobs.append(job)
        built.append(job)
    _prebuild_texts(built)
    return jobs


def _prompts_then(ids: np.ndarray, starts: np.ndarray, cuts: np.ndarray, tail: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ids[starts[k] : starts[k] + cuts[k]]`` followed by ``tail``, for every k, as one flat int32
    array and its offsets (prompt k is ``values[p_off[k] : p_off[k + 1]]``)."""
    lens = cuts + tail.size
    p_off = np.zeros(lens.size + 1, dtype=np.int64)
    np.cumsum(lens, out=p_off[1:])
    values = np.empty(int(p_off[-1]), dtype=np.int32)
    r = _ranks(cuts)
    values[np.repeat(p_off[:-1], cuts) + r] = ids[np.repeat(starts, cuts) + r]
    if tail.size:
        values[(p_off[:-1] + cuts)[:, None] + np.arange(tail.size)] = tail
    return values, p_off


def _id_texts(values: np.ndarray, p_off: np.ndarray) -> list[bytes]:
    """Each prompt of the flat ``values`` (prompt k is ``values[p_off[k] : p_off[k + 1]]``) as JSON
    list items, ``b"1,2,3"``: what a request body embeds. Built with Arrow kernels, which release
    the GIL (the refill thread runs beside the event loop)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = p_off.size - 1
    if n <= 0:
        return []
    strings = pc.cast(pa.array(values, pa.int32()), pa.large_string())  # 64-bit offsets: no size limit per batch
    text = pc.binary_join(pa.LargeListArray.from_arrays(pa.array(p_off, pa.int64()), strings), pa.scalar(",", pa.large_string()))
    t_off = np.frombuffer(text.buffers()[1], dtype=np.int64, count=len(text) + 1, offset=text.offset * 8)
    t_data = text.buffers()[2].to_pybytes() if text.buffers()[2] is not None else b""
    return [t_data[t_off[k] : t_off[k + 1]] for k in range(n)]


def _prebuild_texts(jobs: list[Job]) -> None:
    """Set each sendable job's ``prompt_text`` (``_id_texts``), built for the whole list at once."""
    todo = [j for j in jobs if j.error is None]
    if not todo:
        return
    lens = np.fromiter((j.prompt.size for j in todo), dtype=np.int64, count=len(todo))
    p_off = np.zeros(len(todo) + 1, dtype=np.int64)
    np.cumsum(lens, out=p_off[1:])
    values = np.concatenate([j.prompt for j in todo]).astype(np.int32, copy=False)
    for j, text in zip(todo, _id_texts(values, p_off)):
        j.prompt_text = text
