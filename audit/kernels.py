"""Per-sample metrics of a token batch, computed with whole-array numpy operations.

The kernel never loops over rows or tokens in Python. Two ideas keep it fast:

- Template tokens are rare. Their positions are found once per batch (one
  lookup-table pass), and everything about turns, think blocks and headers is
  answered with ``searchsorted`` on those short position arrays.
- Ranges are counted with prefix sums: the supervised tokens in ``[a, b)`` are
  ``cs[b] - cs[a]`` for the cumulative sum ``cs`` of the mask, answered from the mask's runs
  (``_TrainedCounts``); the hash sums of rows, turns and what precedes each turn, and the loop
  detector's 8-gram hashes, come from the running sum of the hash terms (``PrefixSums``).

Per token the kernel makes a handful of passes (table lookups with Arrow's ``take``, the mask's
runs, the hash terms); everything else works on positions of template tokens, rows, turns and the
sampled 8-grams.

Everything about the chat template comes from the ``ChatFormat`` (``dqa.audit.chat_format``):
its role tokens delimit turns, its assistant header is matched as a token sequence that
starts with one of them, and a trained span may end in end of turn followed by the
template's own tokens after it (ChatML's newline). A format whose turns end at the next role
token (GLM, ``ChatFormat.ends_at_next_role``) has no end-of-turn token: a turn's region runs to
the next turn opener (not part of it) or the row's end, every turn counts as closed, and its
trained span ends at the row's end or just before a role token.

Per trained assistant turn (``batch_metrics_and_turns``) the same questions are answered on
the turn's region (from its header to its end of turn and what the template puts after it,
cut at the next role token): one row per trained turn, so the per-turn arrays are as long as
the batch's turns, never its tokens. A turn's span hash and its repeated 8-grams come from the
same supervised sequence as the sample's (its 8-grams counted in the same sort, keyed by row,
hash and turn); its prompt hash covers the row's tokens before the turn.

Hashes (supervised sequence, prompt, n-grams) use a per-token 64-bit mix table
and polynomial sums in wrapping uint64 arithmetic, so equal token sequences hash
equally whatever batch or row they sit in (``dqa.audit.sequence_hash``); the repeated 8-grams
behind ``ngram_repeat_share`` and ``loop_tokens`` are ``dqa.audit.repeats``.

``batch_metrics_and_turns`` runs as named steps over one ``_Batch`` (the batch's flat arrays and
template positions): the final turn, the assistant turns, the final turn's masking conventions,
then the hashes and loops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dqa.audit.chat_format import ChatFormat
from dqa.audit.metrics_schema import SAMPLE_METRICS, TURN, TURN_METRICS, names
from dqa.audit.repeats import ANCHOR_SHIFT, _anchor_ngrams, _gap_ngrams, _row_and_turn_repeat_shares, _stretches
from dqa.audit.sequence_hash import _C, _K, _K_INV, PrefixSums, _powers, _range_hash, splitmix64
from dqa.audit.token_batch import TokenBatch, arrow_view, numpy_view
from dqa.errors import InputError

# Lookup-table codes: template kind in the low bits, boilerplate flag in the high bit.
TURN_START, EOT, THINK_OPEN, THINK_CLOSE = 1, 2, 3, 4
KIND_MASK = 0x0F
BOILER = 0x80

# Column names and dtypes live in one typed schema (``dqa.audit.metrics_schema``).
METRIC_COLUMNS = names(SAMPLE_METRICS, "kernel")

# Per-sample facts about the dataset's masking convention (FORMATS.md; summed up in summary.json's
# ``conventions``). Written to metrics.parquet, but not required of a metrics table.
CONVENTION_COLUMNS = names(SAMPLE_METRICS, "convention")

# Per trained assistant turn (an assistant turn with a supervised token): one row each, in row
# then turn order. ``turn`` counts the row's assistant turns from 0 (trained or not).
TURN_COLUMNS = names(TURN_METRICS, "kernel")
TURN_DTYPES = {c: TURN[c].numpy_dtype for c in TURN_COLUMNS}


@dataclass
class KernelTables:
    """Lookup tables built once per scan from the chat format.

    ``code[token]``: low bits the template kind (0 ordinary, 1 turn opener (any of the format's
    role tokens), 2 end of turn, 3 ``<think>``, 4 ``</think>``), bit ``BOILER`` set for boilerplate.
    ``mix[token]``: 64-bit token hash. ``anchor[token]``: True for the 1/8 of the
    vocabulary where repetition n-grams are sampled.
    ``pow`` / ``pow_inv``: powers of the sequence-hash multiplier and its inverse (grown on demand).
    """

    spec: ChatFormat
    code: np.ndarray
    mix: np.ndarray
    anchor: np.ndarray
    pow: np.ndarray = field(default_factory=lambda: np.ones(1, dtype=np.uint64))
    pow_inv: np.ndarray = field(default_factory=lambda: np.ones(1, dtype=np.uint64))
    code_table: pa.Array = field(init=False, repr=False)
    mix_table: pa.Array = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.code_table = arrow_view(self.code)
        self.mix_table = arrow_view(self.mix)

    @classmethod
    def build(cls, spec: ChatFormat) -> "KernelTables":
        code = np.zeros(spec.vocab_size, dtype=np.uint8)
        code[spec.boilerplate_lut()] = BOILER
        for opener in spec.turn_openers:
            code[opener] |= TURN_START
        if not spec.ends_at_next_role:  # GLM: the next role token (a turn opener) ends the turn
            code[spec.eot] |= EOT
        if spec.think_open is not None:
            code[spec.think_open] |= THINK_OPEN
        if spec.think_close is not None:
            code[spec.think_close] |= THINK_CLOSE
        mix = splitmix64(np.arange(spec.vocab_size, dtype=np.uint64))
        mix |= np.uint64(1)  # never zero, so a token always contributes
        return cls(spec=spec, code=code, mix=mix, anchor=(mix >> ANCHOR_SHIFT) == 0)

    def powers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(K**i, K**-i) mod 2**64`` for ``i < n``."""
        if len(self.pow) < n:
            size = max(n, 2 * len(self.pow))
            self.pow = _powers(_K, size)
            self.pow_inv = _powers(_K_INV, size)
        return self.pow[:n], self.pow_inv[:n]


def lookup(table: pa.Array, ids: np.ndarray) -> np.ndarray:
    """``table[ids]`` as a read-only numpy array (``ids`` in range: the reader has checked them).

    Arrow's take gathers from a small table 2-3x faster than numpy's fancy indexing or
    ``np.take``, which first convert int32 ids to intp; per token this is one of the kernel's
    largest costs (the template codes of every token, the hash terms of every token). Bounds are not
    checked again (``boundscheck=False``: the check was ~3% of a scan's CPU).
    """
    return numpy_view(pc.take(table, arrow_view(ids), boundscheck=False))


class _TrainedCounts:
    """Trained tokens before any position of a batch, without a dense prefix sum of the mask.

    A dense int32 cumsum of the mask costs ~4 ns a token (numpy has no fast int8 -> int32 scan).
    The mask is instead cut into runs of equal values (one compare of neighbours; a batch has a
    few runs per turn), and any count is one ``searchsorted`` over the run starts plus the trained
    tokens before that run. ``counts[p]`` equals ``cumsum(mask)`` with a leading 0 at ``p``
    (``0 <= p <= len(mask)``).
    """

    def __init__(self, trained: np.ndarray):
        self.starts = np.flatnonzero(trained[1:] != trained[:-1]) + 1
        self.starts = np.concatenate((np.zeros(min(trained.size, 1), dtype=np.int64), self.starts))
        self.trained = trained[self.starts]  # runs alternate, so this is True, False, ... or False, True, ...
        lengths = np.diff(self.starts, append=trained.size)
        self.before = np.zeros(self.starts.size, dtype=np.int64)  # trained tokens before each run
        np.cumsum(np.where(self.trained, lengths, 0)[:-1], out=self.before[1:])

    def __getitem__(self, p: np.ndarray) -> np.ndarray:
        """Trained tokens in ``[0, p)`` per element of ``p`` (int64)."""
        p = np.asarray(p, dtype=np.int64)
        if self.starts.size == 0:
            return np.zeros(p.shape, dtype=np.int64)
        run = np.maximum(np.searchsorted(self.starts, p, side="right") - 1, 0)
        return self.before[run] + np.where(self.trained[run], p - self.starts[run], 0)

    def last_before(self, e: np.ndarray) -> np.ndarray:
        """Position of the last trained token before ``e`` per element (-1 when there is none)."""
        e = np.asarray(e, dtype=np.int64)
        if self.starts.size == 0:
            return np.full(e.shape, -1, dtype=np.int64)
        run = np.searchsorted(self.starts, e - 1, side="right") - 1  # the run of e - 1 (-1: e is 0)
        safe = np.maximum(run, 0)
        # e - 1 when trained; otherwise the last token of the (trained) run before its run, if any.
        out = np.where(self.trained[safe], e - 1, np.where(run >= 1, self.starts[safe] - 1, -1))
        return np.where(run >= 0, out, -1)


def _matches(ids: np.ndarray, pos: np.ndarray, limit: np.ndarray, seq) -> np.ndarray:
    """Whether the token sequence ``seq`` starts at each position ``pos`` and ends by ``limit`` (its row's end)."""
    out = pos + len(seq) <= limit
    top = max(ids.size - 1, 0)
    for k, tok in enumerate(seq):  # a loop over the sequence's few tokens, not over data
        out &= ids[np.minimum(pos + k, top)] == tok
    return out


def _ends_at_eot(ids: np.ndarray, last: np.ndarray, lo: np.ndarray, hi: np.ndarray, has: np.ndarray, spec: ChatFormat) -> np.ndarray:
    """Whether each supervised span, whose last supervised position is ``last`` (inside a row
    ``[lo, hi)``), ends at end of turn: on the end-of-turn token, just before it, or inside what
    the template renders after it (ChatML's "\n": SpecForge, TRL, LLaMA-Factory train it).
    False where ``has`` is False. A format whose turns end at the next role token (GLM) ends a span
    at the row's end, just before a turn opener, or on one (a trained role token)."""
    if ids.size == 0:
        return np.zeros(len(last), dtype=bool)
    top = ids.size - 1
    safe_last = np.clip(last, 0, top)
    nxt = np.minimum(safe_last + 1, top)
    if spec.ends_at_next_role:
        openers = np.asarray(spec.turn_openers, dtype=ids.dtype)
        return has & ((safe_last + 1 >= hi) | np.isin(ids[nxt], openers) | np.isin(ids[safe_last], openers))
    out = has & ((ids[safe_last] == spec.eot) | ((safe_last + 1 < hi) & (ids[nxt] == spec.eot)))
    post = spec.post_eot or ()
    for m in range(1, len(post) + 1):  # the span ends m tokens after end of turn (a loop over 1-2 template tokens)
        at = safe_last - m
        ends_here = has & (at >= lo) & (ids[np.maximum(at, 0)] == spec.eot)
        for k in range(1, m + 1):
            ends_here &= ids[np.clip(at + k, 0, top)] == post[k - 1]
        out |= ends_here
    return out


def _count_in(positions: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many of the sorted ``positions`` lie in ``[a, b)``, per row."""
    return np.searchsorted(positions, b, side="left") - np.searchsorted(positions, a, side="left")


def _first_at_or_after(positions: np.ndarray, at: np.ndarray, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position of the first element of ``positions`` in ``[at, limit)`` per row, and whether it exists."""
    if positions.size == 0:
        return limit.copy(), np.zeros(len(at), dtype=bool)
    k = np.searchsorted(positions, at, side="left")
    found = k < positions.size
    p = positions[np.minimum(k, positions.size - 1)]
    found &= p < limit
    return np.where(found, p, limit), found


# --- the kernel's steps ---------------------------------------------------------------------


@dataclass
class _Batch:
    """What every step of the kernel reads about one batch (``_Batch.of``): the flat ids and mask,
    the rows' bounds, the trained-token counter, the sparse template positions (turn openers, ends of
    turn, think tags, boilerplate and its supervised part) and the assistant headers (``hpos``: their
    positions, ``hrow``: their rows; ``ts_row``: the row of every turn opener)."""

    batch: TokenBatch
    spec: ChatFormat
    ids: np.ndarray
    mask: np.ndarray
    offs: np.ndarray
    n: int
    starts: np.ndarray
    ends: np.ndarray
    top: int
    cs_mask: _TrainedCounts
    supervised: np.ndarray
    pos_ts: np.ndarray
    pos_eot: np.ndarray
    pos_open: np.ndarray
    pos_close: np.ndarray
    boiler_pos: np.ndarray
    sup_boiler_pos: np.ndarray
    ts_row: np.ndarray
    hpos: np.ndarray
    hrow: np.ndarray
    hlen: int

    @classmethod
    def of(cls, batch: TokenBatch, tables: KernelTables) -> "_Batch":
        """Check the ids against the vocabulary, count trained tokens, find the template tokens and
        the assistant headers. Raises ``InputError`` naming the file and row of an id beyond the vocabulary."""
        spec = tables.spec
        ids, offs, mask = batch.ids, batch.offsets, batch.mask
        starts, ends = offs[:-1], offs[1:]
        max_id = batch.max_id if batch.max_id is not None else (int(ids.max()) if ids.size else -1)
        if max_id >= spec.vocab_size:
            pos = int(np.argmax(ids >= spec.vocab_size))
            row = batch.start_row + int(np.searchsorted(offs, pos, side="right") - 1)
            raise InputError(
                f"{batch.source}: row {row}: token id {int(ids[pos])} is beyond the tokenizer's vocabulary "
                f"({spec.vocab_size} ids, {spec.name}); wrong --tokenizer?"
            )

        # Supervised tokens in any range [a, b) are cs_mask[b] - cs_mask[a] (sparse: _TrainedCounts).
        cs_mask = _TrainedCounts(mask.view(bool))

        # Sparse positions: template tokens and boilerplate, from one lookup-table pass.
        codes = lookup(tables.code_table, ids)
        special = np.flatnonzero(codes != 0)  # a bool scan: ~9x faster than flatnonzero on the uint8 codes
        special_codes = codes[special]
        kinds = special_codes & KIND_MASK
        pos_ts = special[kinds == TURN_START]
        boiler_pos = special[(special_codes & BOILER) != 0]

        # Assistant headers: the header's turn opener followed by the rest of the header, inside the same row.
        ts_row = np.searchsorted(offs, pos_ts, side="right") - 1
        is_header = _matches(ids, pos_ts, ends[ts_row], spec.assistant_header)
        return cls(
            batch=batch, spec=spec, ids=ids, mask=mask, offs=offs, n=batch.num_rows, starts=starts, ends=ends,
            top=max(ids.size - 1, 0), cs_mask=cs_mask, supervised=cs_mask[ends] - cs_mask[starts],
            pos_ts=pos_ts, pos_eot=pos_ts if spec.ends_at_next_role else special[kinds == EOT], pos_open=special[kinds == THINK_OPEN],
            pos_close=special[kinds == THINK_CLOSE], boiler_pos=boiler_pos, sup_boiler_pos=boiler_pos[mask[boiler_pos] != 0],
            ts_row=ts_row, hpos=pos_ts[is_header], hrow=ts_row[is_header], hlen=len(spec.assistant_header),
        )


@dataclass
class _FinalTurn:
    """Per row, the row's final assistant turn: whether there is one, where its content starts, its end
    of turn (``eot_at``; ``closed``), where it ends (``end``), its think block and its token counts."""

    has_assistant: np.ndarray
    content_start: np.ndarray
    prompt_tokens: np.ndarray
    eot_at: np.ndarray
    closed: np.ndarray
    end: np.ndarray
    think_present: np.ndarray
    think_closed: np.ndarray
    thinking_tokens: np.ndarray
    answer_tokens: np.ndarray


def _final_turn(b: _Batch) -> _FinalTurn:
    """The final assistant turn of each row of ``b`` (see ``_FinalTurn``)."""
    rows = np.arange(b.n)
    last = np.searchsorted(b.hrow, rows, side="right") - 1
    has_assistant = (last >= 0) & (b.hrow[np.maximum(last, 0)] == rows) if b.hrow.size else np.zeros(b.n, dtype=bool)
    content_start = np.where(has_assistant, b.hpos[np.maximum(last, 0)] + b.hlen if b.hpos.size else 0, b.ends)
    prompt_tokens = np.where(has_assistant, content_start - b.starts, b.ends - b.starts)

    eot_at, final_turn_closed = _first_at_or_after(b.pos_eot, content_start, b.ends)
    if b.spec.ends_at_next_role:  # GLM: the next role token (not part of the turn) or the end of the text ends it
        final_end = eot_at
        final_turn_closed = has_assistant.copy()
    else:
        final_turn_closed &= has_assistant
        final_end = np.where(final_turn_closed, eot_at + 1, b.ends)
    open_at, think_present = _first_at_or_after(b.pos_open, content_start, final_end)
    think_present &= has_assistant
    close_at, think_closed = _first_at_or_after(b.pos_close, open_at + 1, final_end)
    think_closed &= think_present
    think_stop = np.where(think_closed, close_at, final_end)
    think_from = np.minimum(open_at + 1, think_stop)
    thinking_tokens = np.where(think_present, (think_stop - think_from) - _count_in(b.boiler_pos, think_from, think_stop), 0)
    answer_start = np.where(think_closed, close_at + 1, np.where(think_present, final_end, content_start))
    answer_sup = (b.cs_mask[final_end] - b.cs_mask[answer_start]) - _count_in(b.sup_boiler_pos, answer_start, final_end)
    answer_tokens = np.where(has_assistant, answer_sup, 0)
    return _FinalTurn(has_assistant=has_assistant, content_start=content_start, prompt_tokens=prompt_tokens, eot_at=eot_at,
                      closed=final_turn_closed, end=final_end, think_present=think_present, think_closed=think_closed,
                      thinking_tokens=thinking_tokens, answer_tokens=answer_tokens)


@dataclass
class _Turns:
    """The assistant turns of a batch. Per row: supervised tokens inside assistant turns
    (``sup_inside``), assistant and trained turns, trained header tokens, trained turns with a trained
    header, closed trained turns and those whose end of turn is trained. Per trained turn: its row in
    the batch and its region ``[start, end)`` in the batch's ids, and ``table``, the per-turn metrics
    keyed by ``TURN_COLUMNS`` (the hashes, shares and loops filled in by ``_hashes_and_loops``)."""

    sup_inside: np.ndarray
    assistant_turns: np.ndarray
    trained_turns: np.ndarray
    header_trained_tokens: np.ndarray
    trained_header_turns: np.ndarray
    closed_turns: np.ndarray
    eot_trained_turns: np.ndarray
    row: np.ndarray
    start: np.ndarray
    end: np.ndarray
    table: dict[str, np.ndarray]


def _no_turns(n: int) -> _Turns:
    """The ``_Turns`` of a batch without an assistant header."""
    none = np.zeros(0, dtype=np.int64)
    no_closed = np.zeros(n, dtype=np.float64)
    return _Turns(
        sup_inside=np.zeros(n, dtype=np.int64), assistant_turns=np.zeros(n, dtype=np.int64),
        trained_turns=np.zeros(n, dtype=np.int64), header_trained_tokens=np.zeros(n, dtype=np.int64),
        trained_header_turns=no_closed, closed_turns=no_closed, eot_trained_turns=no_closed,
        row=none, start=none, end=none,
        table={c: np.zeros(0, dtype=TURN_DTYPES.get(c, np.int64)) for c in TURN_COLUMNS},
    )


def _assistant_turns(b: _Batch) -> _Turns:
    """Supervised tokens inside assistant turns: from after each header to its end of turn (plus what
    the template renders after it, ChatML's newline, which common masking code includes), cut at the
    next turn opener; per turn also whether it is trained at all, and for each trained turn the same
    questions as for the final turn, on the turn's region (see ``_Turns``)."""
    if not b.hpos.size:
        return _no_turns(b.n)
    ids, mask, cs_mask, hrow, n, top, spec = b.ids, b.mask, b.cs_mask, b.hrow, b.n, b.top, b.spec
    region_start = b.hpos + b.hlen
    row_end = b.ends[hrow]
    e_at, e_found = _first_at_or_after(b.pos_eot, region_start, row_end)
    next_role = spec.ends_at_next_role
    region_end = e_at if next_role else np.where(e_found, e_at + 1, row_end)
    if ids.size:
        follows = e_found.copy()
        for tok in spec.post_eot or ():
            follows &= (region_end < row_end) & (ids[np.minimum(region_end, top)] == tok)
            region_end = region_end + follows
    nts, nts_found = _first_at_or_after(b.pos_ts, region_start, row_end)
    # GLM: every turn ends, at the next role token or the row's end; none has an end-of-turn token of its own.
    turn_closed = np.ones(hrow.size, dtype=bool) if next_role else e_found & ~(nts_found & (nts < e_at))
    region_end = np.where(nts_found, np.minimum(region_end, nts), region_end)
    inside = cs_mask[region_end] - cs_mask[region_start]
    sup_inside = np.bincount(hrow, weights=inside, minlength=n).astype(np.int64)
    assistant_turns = np.bincount(hrow, minlength=n).astype(np.int64)
    trained_turns = np.bincount(hrow, weights=inside > 0, minlength=n).astype(np.int64)
    # Trained tokens of the assistant headers (TRL's DeepSeek V3 template trains <｜Assistant｜>): counted in
    # misaligned_tokens here; the scan sets them aside when most samples train their headers.
    header_sup = cs_mask[region_start] - cs_mask[b.hpos]
    header_trained_tokens = np.bincount(hrow, weights=header_sup, minlength=n).astype(np.int64)
    trained_header_turns = np.bincount(hrow, weights=(inside > 0) & (header_sup > 0), minlength=n)
    # End of turn trained: per closed trained turn, its end-of-turn token (axolotl's train_on_eos: none leaves it out).
    closed_trained = turn_closed & (inside > 0) & (not next_role)
    closed_turns = np.bincount(hrow, weights=closed_trained, minlength=n)
    eot_sup = closed_trained & (mask[np.minimum(e_at, top)] != 0) if ids.size else closed_trained
    eot_trained_turns = np.bincount(hrow, weights=eot_sup, minlength=n)

    # Per trained turn: the same questions as for the final turn, on the turn's region.
    turn_index = np.arange(hrow.size) - np.searchsorted(hrow, hrow, side="left")
    tr = np.flatnonzero(inside > 0)
    t_row, rs, re_ = hrow[tr], region_start[tr], region_end[tr]
    t_sup = inside[tr]
    t_open, t_think = _first_at_or_after(b.pos_open, rs, re_)
    t_close, t_closed = _first_at_or_after(b.pos_close, t_open + 1, re_)
    t_closed &= t_think
    t_stop = np.where(t_closed, t_close, re_)
    t_from = np.minimum(t_open + 1, t_stop)
    t_last = cs_mask.last_before(re_)  # inside the region: it has supervised tokens
    final = turn_index[tr] == assistant_turns[t_row] - 1
    keeps = final | (spec.drops_history_reasoning is False)
    if spec.keeps_reasoning_after_last_user and spec.user_header:
        # Qwen3, Qwen3.6: a turn with no real user message after it (only tool results, rendered as user
        # turns that open with <tool_response>) keeps its reasoning: the tool-calling turns of an agent loop.
        is_user = _matches(ids, b.pos_ts, b.ends[b.ts_row], spec.user_header)
        if spec.tool_response_opener:
            is_user &= ~_matches(ids, b.pos_ts, b.ends[b.ts_row], spec.tool_response_opener)
        _, user_follows = _first_at_or_after(b.pos_ts[is_user], re_, b.ends[t_row])
        keeps = keeps | ~user_follows
    if spec.empty_think_in_history:  # GLM-5.2: the empty think block of a history turn is the template's, not the data's
        t_think = t_think & keeps
        t_closed = t_closed & keeps
    starts = b.starts
    table = {
        "row": (t_row + b.batch.start_row).astype(np.int64),
        "turn": turn_index[tr].astype(np.int32),
        "supervised_tokens": t_sup.astype(np.int64),
        "content_tokens": (t_sup - _count_in(b.sup_boiler_pos, rs, re_)).astype(np.int64),
        "thinking_tokens": np.where(t_think, (t_stop - t_from) - _count_in(b.boiler_pos, t_from, t_stop), 0).astype(np.int64),
        "think_present": t_think,
        "think_closed": t_closed,
        "turn_closed": turn_closed[tr],
        "last_supervised_eot": _ends_at_eot(ids, t_last, starts[t_row], b.ends[t_row], np.ones(tr.size, dtype=bool), spec),
        "final_turn": final,
        "keeps_reasoning": keeps,
        "ngram_repeat_share": np.zeros(tr.size, dtype=np.float64),  # these four filled by _hashes_and_loops, with the
        "loop_tokens": np.zeros(tr.size, dtype=np.int64),
        "supervised_hash": np.zeros(tr.size, dtype=np.uint64),  # samples' hashes and loops
        "prompt_hash": np.zeros(tr.size, dtype=np.uint64),
        "span_start": (rs - starts[t_row]).astype(np.int64),
        "span_end": (re_ - starts[t_row]).astype(np.int64),
    }
    return _Turns(sup_inside=sup_inside, assistant_turns=assistant_turns, trained_turns=trained_turns,
                  header_trained_tokens=header_trained_tokens, trained_header_turns=trained_header_turns,
                  closed_turns=closed_turns, eot_trained_turns=eot_trained_turns, row=t_row, start=rs, end=re_, table=table)


def _final_turn_conventions(b: _Batch, final: _FinalTurn) -> tuple[np.ndarray, np.ndarray]:
    """Masking conventions of the final turn, per row (-1: does not apply): ``post_eot_trained`` (is the
    token the template puts after a trained end of turn trained too) and ``think_open_trained`` (is a
    ``<think>`` that opens the turn trained: SpecForge's qwen3.5 template puts "<think>\\n" in the
    untrained header)."""
    ids, mask, top, spec, ends = b.ids, b.mask, b.top, b.spec, b.ends
    post_eot_trained = np.full(b.n, -1, dtype=np.int8)
    think_open_trained = np.full(b.n, -1, dtype=np.int8)
    if ids.size:
        if spec.post_eot:
            eot_at = final.eot_at
            p = np.minimum(eot_at + 1, top)
            applies = final.closed & (eot_at + 1 < ends) & (ids[p] == spec.post_eot[0]) & (mask[np.minimum(eot_at, top)] != 0)
            post_eot_trained[applies] = mask[p[applies]] != 0
        if spec.think_open is not None:
            content_start = final.content_start
            c = np.minimum(content_start, top)
            final_sup = b.cs_mask[final.end] - b.cs_mask[np.minimum(content_start, final.end)]
            applies = final.has_assistant & (content_start < ends) & (ids[c] == spec.think_open) & (final_sup > 0)
            think_open_trained[applies] = mask[c[applies]] != 0
    return post_eot_trained, think_open_trained


def _hashes_and_loops(b: _Batch, turns: _Turns, tables: KernelTables) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the hash of the supervised sequence, the hash of the prompt (the unsupervised tokens),
    the repeated-8-gram share and the longest loop (``dqa.audit.repeats``); returns those four arrays
    and fills the same four in ``turns.table`` (a turn's prompt hash covers the row's untrained and
    trained tokens before its region, each sequence hashed in order)."""
    ids, offs, cs_mask = b.ids, b.offs, b.cs_mask
    t_row, rs, re_ = turns.row, turns.start, turns.end
    table = turns.table
    mb = b.mask.view(bool)
    sup_ids = ids[mb]
    sup_mix = lookup(tables.mix_table, sup_ids)
    sup_bounds = cs_mask[offs]
    # A turn's supervised span in the supervised sequence, and what comes before the turn in the
    # row (its prompt: the conversation so far, header included) in both sequences.
    t_lo, t_hi, t_first = cs_mask[rs], cs_mask[re_], sup_bounds[t_row]
    tr_n = t_row.size
    sums = PrefixSums(sup_mix, tables)  # the range hashes, and the 8-gram hashes of the loop detector
    supervised_hash = _range_hash(sums, sup_bounds[:-1], sup_bounds[1:], tables)
    if tr_n:
        table["supervised_hash"] = _range_hash(sums, t_lo, t_hi, tables)
        sup_before = _range_hash(sums, t_first, t_lo, tables)
    # anchor[t] is (mix[t] >> ANCHOR_SHIFT) == 0: one compare over the gathered hashes, no second gather
    anchors = np.flatnonzero(sup_mix < (np.uint64(1) << ANCHOR_SHIFT))
    pos, h = _anchor_ngrams(sums, anchors)
    del sup_ids, sup_mix  # the loop detector reads the running sum
    # A turn that holds all of its row's supervised tokens has the row's share and stretch; only the
    # others (multi-turn rows, stray supervised tokens) are measured on their own span.
    own = np.flatnonzero((t_lo != t_first) | (t_hi != sup_bounds[t_row + 1]))
    ngram_share, own_share, loop_tokens, own_loop = _row_and_turn_repeat_shares(
        sums, pos, h, sup_bounds[:-1], sup_bounds[1:], t_lo[own], t_hi[own], t_row[own])
    # Loops whose few distinct tokens hold no anchor: the anchor-free stretches of 128+ tokens, measured exactly.
    g_pos, g_h = _gap_ngrams(sums, anchors, sup_bounds)
    if g_pos.size:
        loop_tokens = np.maximum(loop_tokens, _stretches(g_pos, g_h, sup_bounds[:-1], sup_bounds[1:]))
        own_loop = np.maximum(own_loop, _stretches(g_pos, g_h, t_lo[own], t_hi[own]))
    if tr_n:
        turn_share = ngram_share[t_row]
        turn_share[own] = own_share
        table["ngram_repeat_share"] = turn_share
        turn_loop = loop_tokens[t_row]
        turn_loop[own] = own_loop
        table["loop_tokens"] = turn_loop
    del sums, pos, h, anchors, g_pos, g_h
    uns_mix = lookup(tables.mix_table, ids[~mb])
    uns_bounds = offs - sup_bounds
    uns_lo = rs - t_lo  # each turn's start in the untrained sequence
    sums = PrefixSums(uns_mix, tables)
    del uns_mix
    prompt_hash = _range_hash(sums, uns_bounds[:-1], uns_bounds[1:], tables)
    if tr_n:
        uns_before = _range_hash(sums, uns_bounds[t_row], uns_lo, tables)
        table["prompt_hash"] = splitmix64(uns_before ^ splitmix64(sup_before ^ _C))
    return supervised_hash, prompt_hash, ngram_share, loop_tokens


# --- the kernel ------------------------------------------------------------------------------


def batch_metrics(batch: TokenBatch, tables: KernelTables) -> dict[str, np.ndarray]:
    """Compute the per-row metrics of ``batch`` (see FORMATS.md, metrics.parquet).

    Returns a dict of equal-length numpy arrays keyed by ``METRIC_COLUMNS`` and ``CONVENTION_COLUMNS``
    (``misaligned_tokens`` counts trained assistant-header tokens; ``header_trained_tokens`` holds them,
    for the scan to set aside when the set trains its headers).
    Raises ``InputError`` naming the file and row of a token id outside the vocabulary.
    """
    return batch_metrics_and_turns(batch, tables)[0]


def batch_metrics_and_turns(batch: TokenBatch, tables: KernelTables) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``batch_metrics`` and the per-turn metrics of the batch's trained assistant turns.

    The second dict holds equal-length arrays keyed by ``TURN_COLUMNS``, one entry per trained
    assistant turn (a turn with a supervised token in its region), in row then turn order:
    ``row`` (dataset row), ``turn`` (0-based among the row's assistant turns), the turn's
    supervised, content and thinking tokens, its think block (present, closed), whether the turn
    closes (end of turn before the next role token), whether its supervised span ends at end of
    turn (``last_supervised_eot``), ``final_turn`` (the row's last assistant turn),
    ``keeps_reasoning`` (the template keeps this turn's think block: the row's last assistant
    turn, any turn unless ``ChatFormat.drops_history_reasoning`` is True or unknown, and, where
    ``ChatFormat.keeps_reasoning_after_last_user`` (Qwen3, Qwen3.6), a turn after which no real user
    message comes in the row: a user header that does not open a tool result, ``tool_response_opener``), the share
    of its supervised 8-grams that repeat (``ngram_repeat_share``), the hash of its supervised tokens
    (``supervised_hash``, the span hash), the hash of the conversation before it (``prompt_hash``:
    the row's untrained and trained tokens before its region, each sequence hashed in order), and
    its region as offsets in the row (``span_start``, ``span_end``). Names and dtypes:
    ``metrics_schema.TURN_METRICS``.

    The steps, in order: ``_Batch.of`` (vocabulary check, trained-token counter, template positions,
    assistant headers), ``_final_turn``, ``_assistant_turns``, ``_final_turn_conventions``,
    ``_hashes_and_loops``; the per-row metrics are put together from their results here.
    """
    b = _Batch.of(batch, tables)
    final = _final_turn(b)
    turns = _assistant_turns(b)
    post_eot_trained, think_open_trained = _final_turn_conventions(b, final)
    supervised_hash, prompt_hash, ngram_share, loop_tokens = _hashes_and_loops(b, turns, tables)

    supervised = b.supervised
    content_tokens = supervised - _count_in(b.sup_boiler_pos, b.starts, b.ends)
    # Last supervised position before the row's end (-1 or an earlier row's when the row has none).
    # The trained span ends at end of turn: on the end-of-turn token, just before it, or inside
    # what the template renders after it (ChatML's "\n": SpecForge, TRL, LLaMA-Factory train it).
    last_supervised_eot = _ends_at_eot(b.ids, b.cs_mask.last_before(b.ends), b.starts, b.ends, supervised > 0, b.spec)
    misaligned = supervised - turns.sup_inside + batch.label_mismatch
    # -1 where no trained turn (no closed trained turn) shows it.
    header_trained = np.where(turns.trained_turns > 0, (turns.trained_header_turns > 0).astype(np.int8), -1).astype(np.int8)
    eot_trained = np.where(turns.closed_turns > 0, (turns.eot_trained_turns == turns.closed_turns).astype(np.int8), -1).astype(np.int8)

    metrics = {
        "n_tokens": b.ends - b.starts,
        "n_mask": batch.mask_lengths.astype(np.int64, copy=False),
        "supervised_tokens": supervised.astype(np.int64),
        "content_tokens": content_tokens.astype(np.int64),
        "prompt_tokens": final.prompt_tokens.astype(np.int64, copy=False),
        "thinking_tokens": final.thinking_tokens.astype(np.int64, copy=False),
        "answer_tokens": final.answer_tokens.astype(np.int64, copy=False),
        "has_assistant": final.has_assistant,
        "think_present": final.think_present,
        "think_closed": final.think_closed,
        "final_turn_closed": final.closed,
        "last_supervised_eot": last_supervised_eot,
        "misaligned_tokens": misaligned.astype(np.int64, copy=False),
        "ngram_repeat_share": ngram_share,
        "loop_tokens": loop_tokens,
        "supervised_hash": supervised_hash,
        "prompt_hash": prompt_hash,
        "assistant_turns": turns.assistant_turns,
        "trained_turns": turns.trained_turns,
        "post_eot_trained": post_eot_trained,
        "think_open_trained": think_open_trained,
        "header_trained": header_trained,
        "header_trained_tokens": turns.header_trained_tokens,
        "eot_trained": eot_trained,
    }
    return metrics, turns.table
