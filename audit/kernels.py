"""Per-sample metrics of a token batch, computed with whole-array numpy operations.

The kernel never loops over rows or tokens in Python. Two ideas keep it fast:

- Template tokens are rare. Their positions are found once per batch (one
  lookup-table pass), and everything about turns, think blocks and headers is
  answered with ``searchsorted`` on those short position arrays.
- Ranges are counted with prefix sums: the supervised tokens in ``[a, b)`` are
  ``cs[b] - cs[a]`` for the cumulative sum ``cs`` of the mask, answered from the mask's runs
  (``_TrainedCounts``); the hash sums of rows, turns and what precedes each turn come from one
  ``reduceat`` pass (``_RangeSums``).

Per token the kernel makes a handful of passes (table lookups with Arrow's ``take``, the mask's
runs, the hash terms); everything else works on positions of template tokens, rows, turns and the
sampled 8-grams.

Everything about the chat template comes from the ``ChatFormat`` (``dqa.audit.chat_format``):
its role tokens delimit turns, its assistant header is matched as a token sequence that
starts with one of them, and a trained span may end in end of turn followed by the
template's own tokens after it (ChatML's newline).

Per trained assistant turn (``batch_metrics_and_turns``) the same questions are answered on
the turn's region (from its header to its end of turn and what the template puts after it,
cut at the next role token): one row per trained turn, so the per-turn arrays are as long as
the batch's turns, never its tokens. A turn's span hash and its repeated 8-grams come from the
same supervised sequence as the sample's (its 8-grams counted in the same sort, keyed by row,
hash and turn); its prompt hash covers the row's tokens before the turn.

Hashes (supervised sequence, prompt, n-grams) use a per-token 64-bit mix table
and polynomial sums in wrapping uint64 arithmetic, so equal token sequences hash
equally whatever batch or row they sit in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dqa.arrays import ranks
from dqa.audit.token_batch import TokenBatch
from dqa.audit.chat_format import ChatFormat
from dqa.audit.metrics_schema import SAMPLE_METRICS, TURN, TURN_METRICS, names
from dqa.errors import InputError

NGRAM = 8  # n-gram length for repetition
ANCHOR_SHIFT = np.uint64(61)  # sampled n-grams start at anchor tokens: mix hash with top 3 bits clear
SAMPLE_RATE = 1 / 8
KEY_INDEX_BITS = 24  # n-gram sort keys: 40 hash bits, and the row (and turn in the row) in the 24 others
EXACT_MIN_POSITIONS = 64  # under-sampled rows at least this long are measured exactly
_NGRAM_BLOCK = 16384  # 8-gram positions hashed per block (``_hash_ngrams``)
GAP_EXACT = 128  # a stretch of at least this many tokens without an anchor has its 8-grams measured exactly (loop stretches)

# Lookup-table codes: template kind in the low bits, boilerplate flag in the high bit.
TURN_START, EOT, THINK_OPEN, THINK_CLOSE = 1, 2, 3, 4
KIND_MASK = 0x0F
BOILER = 0x80

_K = 0x9E3779B97F4A7C15  # odd multiplier of the polynomial sequence hash
_K_INV = pow(_K, -1, 1 << 64)
_A, _B, _C = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0xD6E8FEB86659FD93)

# Column names and dtypes live in one typed schema (``dqa.audit.metrics_schema``).
METRIC_COLUMNS = names(SAMPLE_METRICS, "kernel")

# Per-sample facts about the dataset's masking convention (FORMATS.md; summed up in summary.json's
# ``conventions``). Written to metrics.parquet, but not required of a metrics table.
CONVENTION_COLUMNS = names(SAMPLE_METRICS, "convention")

# Per trained assistant turn (an assistant turn with a supervised token): one row each, in row
# then turn order. ``turn`` counts the row's assistant turns from 0 (trained or not).
TURN_COLUMNS = names(TURN_METRICS, "kernel")
TURN_DTYPES = {c: TURN[c].numpy_dtype for c in TURN_COLUMNS}


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on a uint64 array (a stable, well-mixed hash of each value)."""
    x = x.astype(np.uint64, copy=True)
    x += np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= _A
    x ^= x >> np.uint64(27)
    x *= _B
    x ^= x >> np.uint64(31)
    return x


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


def arrow_view(values: np.ndarray) -> pa.Array:
    """An Arrow array over the buffer of the contiguous numeric ``values`` (no copy, no type
    inference: what ``pa.array`` would do for them, minus its per-call checks)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def lookup(table: pa.Array, ids: np.ndarray) -> np.ndarray:
    """``table[ids]`` as a read-only numpy array (``ids`` in range: the reader has checked them).

    Arrow's take gathers from a small table 2-3x faster than numpy's fancy indexing or
    ``np.take``, which first convert int32 ids to intp; per token this is one of the kernel's
    largest costs (the template codes of every token, the hash terms of every token).
    """
    return pc.take(table, arrow_view(ids)).to_numpy(zero_copy_only=True)


def _powers(base: int, size: int) -> np.ndarray:
    """``base**i mod 2**64`` for ``i < size`` (wrapping uint64 products), by block doubling:
    ``p[m:2m] = p[:m] * base**m``, a few vector multiplies instead of a serial cumprod."""
    p = np.empty(max(size, 1), dtype=np.uint64)
    p[0] = 1
    m = 1
    while m < size:
        step = min(m, size - m)
        np.multiply(p[:step], np.uint64(pow(base, m, 1 << 64)), out=p[m : m + step])
        m += step
    return p


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


def _weighted(tokens_mix: np.ndarray, tables: KernelTables) -> np.ndarray:
    """``mix_i * K**i`` over the sequence: the terms every range hash of it sums."""
    p, _ = tables.powers(tokens_mix.size + 1)
    return np.multiply(tokens_mix, p[: tokens_mix.size])


def _finish_hash(sums: np.ndarray, lo: np.ndarray, hi: np.ndarray, tables: KernelTables) -> np.ndarray:
    """The 64-bit hash of each range ``[lo, hi)`` from the sum of its weighted terms (``_weighted``):
    the global power is divided out with the inverse power, so that ``i`` counts from the range
    start, and the length is mixed in; 0 for an empty range. Equal sequences hash equally
    wherever they sit."""
    if len(lo) == 0:
        return np.zeros(0, dtype=np.uint64)
    _, p_inv = tables.powers(int(np.max(lo)) + 1)
    lengths = (hi - lo).astype(np.uint64)
    h = splitmix64((sums * p_inv[lo]) ^ (lengths * _C))
    h[lengths == 0] = 0
    return h


class _RangeSums:
    """Wrapping uint64 sums of ``values`` over any ranges whose ends are among ``points``.

    One ``reduceat`` pass over the data gives the sums between consecutive points, a running sum
    over those the prefix ``W(x) = values[:x].sum()`` at every point, and each range is
    ``W(hi) - W(lo)`` (exact in wrapping arithmetic). However many range sets a batch asks for
    (rows, turns, what precedes each turn), the data is read once.
    """

    def __init__(self, values: np.ndarray, points: np.ndarray):
        self.points = np.unique(np.concatenate(([0], points)))  # sorted; 0 <= point <= values.size
        self.prefix = np.zeros(self.points.size, dtype=np.uint64)
        inner = self.points[self.points < values.size]
        if inner.size:
            between = np.add.reduceat(values, inner)  # values[p_i:p_i+1], the last to the end
            np.cumsum(between[: self.points.size - 1], out=self.prefix[1:])

    def __call__(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Sum of ``values[lo[r]:hi[r]]`` per range (0 for an empty one); every end must be a point."""
        at = self.prefix
        return at[np.searchsorted(self.points, hi)] - at[np.searchsorted(self.points, lo)]


def _range_hash(sums: _RangeSums, lo: np.ndarray, hi: np.ndarray, tables: KernelTables) -> np.ndarray:
    """Order-sensitive 64-bit hash of each range ``[lo[r], hi[r])`` of a sequence whose ``_weighted``
    terms ``sums`` adds up: ``sum_i mix_i * K**i`` with ``i`` counted from the range start, mixed
    with the length; 0 for an empty range. Ranges may overlap."""
    return _finish_hash(sums(lo, hi), lo, hi, tables)


def _hash_ngrams(sup_mix: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """64-bit hashes of the 8-grams of ``sup_mix`` starting at ``pos`` (sorted, all in range):
    ``sum_k sup_mix[pos + k] * A**(7 - k)``.

    Eight gathers per block of positions, not a loop over data. A block gathers from its own
    stretch of ``sup_mix``, which stays in cache across its eight gathers (gathering a whole
    batch's positions would stream the array from memory eight times: 1.7x slower)."""
    out = np.empty(pos.size, dtype=np.uint64)
    term = np.empty(min(_NGRAM_BLOCK, pos.size), dtype=np.uint64)
    for s in range(0, pos.size, _NGRAM_BLOCK):
        p = pos[s : s + _NGRAM_BLOCK]
        stretch = sup_mix[p[0] : p[-1] + NGRAM]
        at = p - p[0]
        h, t = out[s : s + p.size], term[: p.size]
        np.take(stretch, at, out=h)
        for _ in range(1, NGRAM):
            at += 1
            h *= _A
            np.take(stretch, at, out=t)
            h += t
    return out


def _repeat_counts(row: np.ndarray, h: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: how many (row, hash) keys there are, and how many repeat an earlier equal key."""
    key = (row.astype(np.uint64) << np.uint64(40)) | (h >> np.uint64(24))
    key.sort()
    total = np.bincount(row, minlength=n)
    dup_rows = (key[1:][key[1:] == key[:-1]] >> np.uint64(40)).astype(np.int64)
    return total, np.bincount(dup_rows, minlength=n)


def _dedupe_sorted(values: np.ndarray) -> np.ndarray:
    """The distinct values of the sorted ``values``."""
    if values.size == 0:
        return values
    keep = np.ones(values.size, dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _member(sorted_set: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is in ``sorted_set`` (sorted, distinct): one binary search each."""
    if sorted_set.size == 0 or values.size == 0:
        return np.zeros(values.size, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, values), sorted_set.size - 1)
    return sorted_set[at] == values


def _longest_runs(pos: np.ndarray, seg: np.ndarray, rep: np.ndarray, n: int) -> np.ndarray:
    """Per segment (``0 <= seg < n``), the longest stretch of tokens covered by a run of repeated 8-grams:
    ``pos``/``seg``/``rep`` list a segment's measured 8-grams in position order (segments disjoint and
    in order), ``rep`` whether each occurs more than once in its segment; a run is a maximal sequence of
    consecutive listed 8-grams that all repeat, and it covers ``pos[last] - pos[first] + NGRAM`` tokens.
    0 for a segment without a repeated 8-gram."""
    out = np.zeros(n, dtype=np.int64)
    idx = np.flatnonzero(rep)
    if idx.size == 0:
        return out
    s = seg[idx]
    new = np.ones(idx.size, dtype=bool)
    new[1:] = (idx[1:] != idx[:-1] + 1) | (s[1:] != s[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, idx.size - 1)
    np.maximum.at(out, s[first], (pos[idx[last]] - pos[idx[first]] + NGRAM).astype(np.int64))
    return out


def _stretches(pos: np.ndarray, h: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The longest repeated stretch (``_longest_runs``) of each segment ``[lo, hi)`` (sorted, disjoint), over
    the 8-grams starting at ``pos`` (sorted) with hashes ``h``: an 8-gram repeats when another of the listed
    8-grams of its segment is equal."""
    n = len(lo)
    if n == 0 or pos.size == 0:
        return np.zeros(n, dtype=np.int64)
    seg, inside = _segment_of(pos, lo, hi)
    pos, h, seg = pos[inside], h[inside], seg[inside]
    key = (seg.astype(np.uint64) << np.uint64(40)) | (h >> np.uint64(24))
    ordered = np.sort(key)
    repeated = _dedupe_sorted(ordered[1:][ordered[1:] == ordered[:-1]])
    return _longest_runs(pos, seg, _member(repeated, key), n)


def _gap_ngrams(sup_mix: np.ndarray, anchors: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8-grams a sample of anchors cannot see: those starting in a stretch of at least ``GAP_EXACT``
    tokens of one row (``bounds``: the rows' offsets in ``sup_mix``) without an anchor token (a loop whose
    few distinct tokens include no anchor). Returns their start positions (sorted) and hashes; stretches are
    found from the anchors' positions and the rows' bounds, not by a pass over the tokens."""
    none = np.zeros(0, dtype=np.int64)
    if sup_mix.size < GAP_EXACT:
        return none, np.zeros(0, dtype=np.uint64)
    edges = np.concatenate(([-1], anchors, [sup_mix.size]))
    g_lo, g_hi = edges[:-1] + 1, edges[1:]  # the anchor-free stretches, possibly across rows
    wide = g_hi - g_lo >= GAP_EXACT
    g_lo, g_hi = g_lo[wide], g_hi[wide]
    if g_lo.size == 0:
        return none, np.zeros(0, dtype=np.uint64)
    # Cut each stretch at the row bounds inside it: one piece per row it overlaps.
    r0 = np.searchsorted(bounds, g_lo, side="right") - 1
    r1 = np.searchsorted(bounds, g_hi - 1, side="right") - 1
    k = np.repeat(np.arange(g_lo.size), r1 - r0 + 1)
    row = np.repeat(r0, r1 - r0 + 1) + ranks(r1 - r0 + 1)
    p_lo = np.maximum(g_lo[k], bounds[row])
    p_hi = np.minimum(g_hi[k], bounds[row + 1])
    # 8-gram starts in each piece that leave room for 8 tokens in its row.
    last = np.minimum(p_hi, bounds[row + 1] - NGRAM + 1)
    keep = (p_hi - p_lo >= GAP_EXACT) & (last > p_lo)
    p_lo, last = p_lo[keep], last[keep]
    if p_lo.size == 0:
        return none, np.zeros(0, dtype=np.uint64)
    pos = np.repeat(p_lo, last - p_lo) + ranks(last - p_lo)
    return pos, _hash_ngrams(sup_mix, pos)


def _anchor_ngrams(sup_mix: np.ndarray, anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sampled 8-grams of ``sup_mix``: their start positions (``anchors`` that leave room for
    an 8-gram) and their hashes."""
    pos = anchors[anchors + NGRAM <= sup_mix.size]
    return pos, _hash_ngrams(sup_mix, pos)


def _segment_of(pos: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each 8-gram starting at ``pos`` (sorted): the index of the sorted, disjoint segment
    ``[lo, hi)`` (gaps allowed) that holds it whole, and whether one does.

    The index is how many segments start at or before the position, less one: counted by binary
    searches of the few segment starts among the many positions and a running sum, not by one
    binary search per position (3-5x faster for a batch's anchors)."""
    starts_before = np.bincount(np.searchsorted(pos, lo, side="left"), minlength=pos.size + 1)[: pos.size]
    seg = np.cumsum(starts_before) - 1
    inside = (seg >= 0) & (pos + NGRAM <= hi[np.maximum(seg, 0)]) if len(lo) else np.zeros(len(pos), dtype=bool)
    return seg, inside


def _shares(sup_mix: np.ndarray, total: np.ndarray, dups: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``dups / total`` per segment, where the sample is too thin measured exactly instead: a loop
    whose few distinct tokens include no anchor shows up as a segment with far fewer sampled
    n-grams than its length predicts; such segments are measured on every position."""
    n = len(lo)
    share = np.zeros(n, dtype=np.float64)
    np.divide(dups, total, out=share, where=total > 0)
    positions = np.maximum(hi - lo - NGRAM + 1, 0)
    suspicious = np.flatnonzero((positions >= EXACT_MIN_POSITIONS) & (total < positions * (SAMPLE_RATE / 2)))
    if suspicious.size:
        lengths = positions[suspicious]
        all_pos = np.repeat(lo[suspicious], lengths) + ranks(lengths)
        all_seg = np.repeat(suspicious, lengths)
        t2, d2 = _repeat_counts(all_seg, _hash_ngrams(sup_mix, all_pos), n)
        share[suspicious] = d2[suspicious] / t2[suspicious]
    return share


def _row_and_turn_repeat_shares(sup_mix: np.ndarray, pos: np.ndarray, h: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                                t_lo: np.ndarray, t_hi: np.ndarray, t_row: np.ndarray
                                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Share of the 8-grams of each row ``sup_mix[lo[r]:hi[r]]`` (sorted, disjoint, gaps allowed)
    that repeat an earlier 8-gram of the same row, and the same for each turn ``[t_lo, t_hi)``
    (sorted, disjoint, each inside its row ``t_row``; none is fine), from one sort of the sampled
    8-grams (``pos`` sorted, ``h``: ``_anchor_ngrams``).

    Estimated on a consistent sample: the n-grams that start at an anchor token (a fixed 1/8 of
    the vocabulary). Equal n-grams start with equal tokens, so repeats survive sampling; thin
    samples are measured exactly (``_shares``).

    The sort key is (row, hash, turn within the row): an 8-gram repeats one of its row when the
    (row, hash) part equals its predecessor's, and one of its turn when the whole key does.

    Which row and turn hold an 8-gram whole is a step function of its start, changing only at the
    rows' and turns' starts and at the last start that leaves room for 8 tokens. It is evaluated
    at those few points, and each sampled 8-gram takes the value of the step it falls in (one
    ``np.repeat``); the counts per row and turn come from the steps, not from the 8-grams. Where
    the rows' and turns' indices do not fit beside the 40 hash bits, two sorts are made instead.

    Returns ``(row shares, turn shares, row stretches, turn stretches)``: a stretch is the longest run of
    consecutive sampled 8-grams that each occur more than once among the sampled 8-grams of the row (turn),
    in tokens (``_longest_runs``). It is read from the same sort: the repeated keys are the sorted array's
    equal neighbours, and only the rows that have one list their 8-grams again, in position order.
    """
    n, m = len(lo), len(t_lo)
    if sup_mix.size < NGRAM or n == 0:
        return (np.zeros(n, dtype=np.float64), np.zeros(m, dtype=np.float64), np.zeros(n, dtype=np.int64),
                np.zeros(m, dtype=np.int64))
    row_first_turn = np.searchsorted(t_row, np.arange(n), side="left")  # index of each row's first turn
    tbits = int(np.bincount(t_row, minlength=1).max()).bit_length() if m else 0  # 1-based turn within its row
    rbits = n.bit_length()  # row n: starts no row holds whole
    if rbits + tbits > KEY_INDEX_BITS:
        return _row_and_turn_repeat_shares_by_two_sorts(sup_mix, pos, h, lo, hi, t_lo, t_hi, t_row)
    T, H = np.uint64(tbits), np.uint64(40 + tbits)
    steps = np.unique(np.maximum(np.concatenate(([0], lo, hi - (NGRAM - 1), t_lo, t_hi - (NGRAM - 1))), 0))
    r = np.searchsorted(lo, steps, side="right") - 1
    in_row = (r >= 0) & (steps + NGRAM <= hi[np.maximum(r, 0)])
    j = np.searchsorted(t_lo, steps, side="right") - 1
    in_turn = in_row & (j >= 0) & (steps + NGRAM <= t_hi[np.maximum(j, 0)]) if m else np.zeros(steps.size, dtype=bool)
    local = np.where(in_turn, j - row_first_turn[np.maximum(r, 0)] + 1, 0).astype(np.uint64)
    label = np.where(in_row, (np.maximum(r, 0).astype(np.uint64) << H) | local, np.uint64(n) << H)
    per_step = np.diff(np.searchsorted(pos, steps, side="left"), append=pos.size)  # sampled 8-grams per step
    key = np.repeat(label, per_step)
    key |= (h >> np.uint64(24)) << T
    key.sort()
    key = key[: int(per_step[in_row].sum())]  # those no row holds (row n) sort last
    total = np.bincount(r[in_row], weights=per_step[in_row], minlength=n).astype(np.int64)
    t_total = np.bincount(j[in_turn], weights=per_step[in_turn], minlength=m).astype(np.int64)
    same_row_hash = (key[1:] >> T) == (key[:-1] >> T)
    dups = np.bincount((key[1:][same_row_hash] >> H).astype(np.int64), minlength=n)
    later = key[1:][same_row_hash & (key[1:] == key[:-1])]
    turn_bits = np.uint64((1 << tbits) - 1)
    later = later[(later & turn_bits) != 0]  # a repeat inside a turn
    turn = row_first_turn[(later >> H).astype(np.int64)] + (later & turn_bits).astype(np.int64) - 1
    t_dups = np.bincount(turn, minlength=m)
    # Stretches: the steps of the rows with a repeat list their 8-grams again, in position order.
    stretch, t_stretch = np.zeros(n, dtype=np.int64), np.zeros(m, dtype=np.int64)
    cs = np.flatnonzero(in_row & (dups[np.maximum(r, 0)] > 0))
    if cs.size:
        first_gram = np.searchsorted(pos, steps, side="left")
        count = per_step[cs]
        g = np.repeat(first_gram[cs], count) + ranks(count)
        g_key = np.repeat(label[cs], count) | ((h[g] >> np.uint64(24)) << T)
        g_pos = pos[g]
        row_rep = _member(_dedupe_sorted(key[1:][same_row_hash] >> T), g_key >> T)
        stretch = _longest_runs(g_pos, np.repeat(r[cs], count), row_rep, n)
        if m:
            in_t = np.repeat(in_turn[cs], count)
            t_rep = _member(_dedupe_sorted(later), g_key[in_t])
            t_stretch = _longest_runs(g_pos[in_t], np.repeat(j[cs], count)[in_t], t_rep, m)
    return (_shares(sup_mix, total, dups, lo, hi), _shares(sup_mix, t_total, t_dups, t_lo, t_hi), stretch, t_stretch)


def _row_and_turn_repeat_shares_by_two_sorts(sup_mix: np.ndarray, pos: np.ndarray, h: np.ndarray, lo: np.ndarray,
                                             hi: np.ndarray, t_lo: np.ndarray, t_hi: np.ndarray,
                                             t_row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_row_and_turn_repeat_shares`` with a sort for the rows and one for the turns (and one each for
    their stretches): for batches whose row and turn indices do not fit in a sort key beside the hash bits."""
    n, m = len(lo), len(t_lo)
    stretch, t_stretch = _stretches(pos, h, lo, hi), _stretches(pos, h, t_lo, t_hi)
    seg, inside = _segment_of(pos, lo, hi)
    pos, h, seg = pos[inside], h[inside], seg[inside]
    total, dups = _repeat_counts(seg, h, n)
    if m == 0:
        return _shares(sup_mix, total, dups, lo, hi), np.zeros(0, dtype=np.float64), stretch, t_stretch
    tseg, t_inside = _segment_of(pos, t_lo, t_hi)
    t_total, t_dups = _repeat_counts(tseg[t_inside], h[t_inside], m)
    return _shares(sup_mix, total, dups, lo, hi), _shares(sup_mix, t_total, t_dups, t_lo, t_hi), stretch, t_stretch


def _ngram_repeat_share(sup_mix: np.ndarray, anchors: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Share of each row's supervised 8-grams that repeat an earlier 8-gram of the same row
    (rows ``sup_mix[bounds[r]:bounds[r+1]]``; ``anchors``: positions in ``sup_mix`` of anchor
    tokens). See ``_row_and_turn_repeat_shares``."""
    pos, h = _anchor_ngrams(sup_mix, anchors)
    none = np.zeros(0, dtype=np.int64)
    return _row_and_turn_repeat_shares(sup_mix, pos, h, bounds[:-1], bounds[1:], none, none, none)[0]


def loop_stretches(sup_mix: np.ndarray, anchors: np.ndarray, bounds: np.ndarray, t_lo: np.ndarray | None = None,
                   t_hi: np.ndarray | None = None, t_row: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The longest repeated stretch in tokens of each row ``sup_mix[bounds[r]:bounds[r+1]]`` and of each
    turn ``[t_lo, t_hi)`` (``loop_tokens``): the 8-grams starting at anchor tokens and, in stretches of at
    least ``GAP_EXACT`` tokens without one, every 8-gram (``_gap_ngrams``), each measured apart; the longer
    run wins. For tests and tools; the kernel computes the same beside the shares."""
    none = np.zeros(0, dtype=np.int64)
    t_lo, t_hi, t_row = (none if v is None else v for v in (t_lo, t_hi, t_row))
    pos, h = _anchor_ngrams(sup_mix, anchors)
    _, _, rows, turns = _row_and_turn_repeat_shares(sup_mix, pos, h, bounds[:-1], bounds[1:], t_lo, t_hi, t_row)
    g_pos, g_h = _gap_ngrams(sup_mix, anchors, bounds)
    return np.maximum(rows, _stretches(g_pos, g_h, bounds[:-1], bounds[1:])), np.maximum(turns, _stretches(g_pos, g_h, t_lo, t_hi))


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
    False where ``has`` is False."""
    if ids.size == 0:
        return np.zeros(len(last), dtype=bool)
    top = ids.size - 1
    safe_last = np.clip(last, 0, top)
    nxt = np.minimum(safe_last + 1, top)
    out = has & ((ids[safe_last] == spec.eot) | ((safe_last + 1 < hi) & (ids[nxt] == spec.eot)))
    post = spec.post_eot or ()
    for m in range(1, len(post) + 1):  # the span ends m tokens after end of turn (a loop over 1-2 template tokens)
        at = safe_last - m
        ends_here = has & (at >= lo) & (ids[np.maximum(at, 0)] == spec.eot)
        for k in range(1, m + 1):
            ends_here &= ids[np.clip(at + k, 0, top)] == post[k - 1]
        out |= ends_here
    return out


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
    """
    spec = tables.spec
    ids, offs, mask = batch.ids, batch.offsets, batch.mask
    n = batch.num_rows
    starts, ends = offs[:-1], offs[1:]
    n_tokens = ends - starts

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
    supervised = cs_mask[ends] - cs_mask[starts]

    # Sparse positions: template tokens and boilerplate, from one lookup-table pass.
    codes = lookup(tables.code_table, ids)
    special = np.flatnonzero(codes != 0)  # a bool scan: ~9x faster than flatnonzero on the uint8 codes
    special_codes = codes[special]
    kinds = special_codes & KIND_MASK
    pos_ts = special[kinds == TURN_START]
    pos_eot = special[kinds == EOT]
    pos_open = special[kinds == THINK_OPEN]
    pos_close = special[kinds == THINK_CLOSE]
    boiler_pos = special[(special_codes & BOILER) != 0]
    sup_boiler_pos = boiler_pos[mask[boiler_pos] != 0]
    del codes, special, special_codes, kinds

    def count_in(positions: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """How many of the sorted ``positions`` lie in ``[a, b)``, per row."""
        return np.searchsorted(positions, b, side="left") - np.searchsorted(positions, a, side="left")

    content_tokens = supervised - count_in(sup_boiler_pos, starts, ends)

    # Assistant headers: the header's turn opener followed by the rest of the header, inside the same row.
    hlen = len(spec.assistant_header)
    ts_row = np.searchsorted(offs, pos_ts, side="right") - 1
    is_header = _matches(ids, pos_ts, ends[ts_row], spec.assistant_header)
    hpos = pos_ts[is_header]
    hrow = ts_row[is_header]

    # The final assistant turn of each row.
    rows = np.arange(n)
    last = np.searchsorted(hrow, rows, side="right") - 1
    has_assistant = (last >= 0) & (hrow[np.maximum(last, 0)] == rows) if hrow.size else np.zeros(n, dtype=bool)
    content_start = np.where(has_assistant, hpos[np.maximum(last, 0)] + hlen if hpos.size else 0, ends)
    prompt_tokens = np.where(has_assistant, content_start - starts, n_tokens)

    def first_at_or_after(positions: np.ndarray, at: np.ndarray, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Position of the first element of ``positions`` in ``[at, limit)`` per row, and whether it exists."""
        if positions.size == 0:
            return limit.copy(), np.zeros(len(at), dtype=bool)
        k = np.searchsorted(positions, at, side="left")
        found = k < positions.size
        p = positions[np.minimum(k, positions.size - 1)]
        found &= p < limit
        return np.where(found, p, limit), found

    eot_at, final_turn_closed = first_at_or_after(pos_eot, content_start, ends)
    final_turn_closed &= has_assistant
    final_end = np.where(final_turn_closed, eot_at + 1, ends)
    open_at, think_present = first_at_or_after(pos_open, content_start, final_end)
    think_present &= has_assistant
    close_at, think_closed = first_at_or_after(pos_close, open_at + 1, final_end)
    think_closed &= think_present
    think_stop = np.where(think_closed, close_at, final_end)
    think_from = np.minimum(open_at + 1, think_stop)
    thinking_tokens = np.where(think_present, (think_stop - think_from) - count_in(boiler_pos, think_from, think_stop), 0)
    answer_start = np.where(think_closed, close_at + 1, np.where(think_present, final_end, content_start))
    answer_sup = (cs_mask[final_end] - cs_mask[answer_start]) - count_in(sup_boiler_pos, answer_start, final_end)
    answer_tokens = np.where(has_assistant, answer_sup, 0)

    # Last supervised position before the row's end (-1 or an earlier row's when the row has none).
    # The trained span ends at end of turn: on the end-of-turn token, just before it, or inside
    # what the template renders after it (ChatML's "\n": SpecForge, TRL, LLaMA-Factory train it).
    last_sup = cs_mask.last_before(ends)
    has_sup = supervised > 0
    top = max(ids.size - 1, 0)
    last_supervised_eot = _ends_at_eot(ids, last_sup, starts, ends, has_sup, spec)

    # Supervised tokens inside assistant turns: from after each header to its end of turn (plus
    # what the template renders after it, ChatML's newline, which common masking code includes),
    # cut at the next turn opener. Per turn also whether it is trained at all.
    turns: dict[str, np.ndarray] = {c: np.zeros(0, dtype=TURN_DTYPES.get(c, np.int64)) for c in TURN_COLUMNS}
    none = np.zeros(0, dtype=np.int64)
    t_row, rs, re_ = none, none, none  # the trained turns' rows (in the batch) and regions
    if hpos.size:
        region_start = hpos + hlen
        row_end = ends[hrow]
        e_at, e_found = first_at_or_after(pos_eot, region_start, row_end)
        region_end = np.where(e_found, e_at + 1, row_end)
        if ids.size:
            follows = e_found.copy()
            for tok in spec.post_eot or ():
                follows &= (region_end < row_end) & (ids[np.minimum(region_end, top)] == tok)
                region_end = region_end + follows
        nts, nts_found = first_at_or_after(pos_ts, region_start, row_end)
        turn_closed = e_found & ~(nts_found & (nts < e_at))
        region_end = np.where(nts_found, np.minimum(region_end, nts), region_end)
        inside = cs_mask[region_end] - cs_mask[region_start]
        sup_inside = np.bincount(hrow, weights=inside, minlength=n).astype(np.int64)
        assistant_turns = np.bincount(hrow, minlength=n).astype(np.int64)
        trained_turns = np.bincount(hrow, weights=inside > 0, minlength=n).astype(np.int64)
        # Trained tokens of the assistant headers (TRL's DeepSeek V3 template trains <｜Assistant｜>): counted in
        # misaligned_tokens here; the scan sets them aside when most samples train their headers.
        header_sup = cs_mask[region_start] - cs_mask[hpos]
        header_trained_tokens = np.bincount(hrow, weights=header_sup, minlength=n).astype(np.int64)
        trained_header_turns = np.bincount(hrow, weights=(inside > 0) & (header_sup > 0), minlength=n)
        # End of turn trained: per closed trained turn, its end-of-turn token (axolotl's train_on_eos: none leaves it out).
        closed_trained = turn_closed & (inside > 0)
        closed_turns = np.bincount(hrow, weights=closed_trained, minlength=n)
        eot_sup = closed_trained & (mask[np.minimum(e_at, top)] != 0) if ids.size else closed_trained
        eot_trained_turns = np.bincount(hrow, weights=eot_sup, minlength=n)

        # Per trained turn: the same questions as for the final turn, on the turn's region.
        turn_index = np.arange(hrow.size) - np.searchsorted(hrow, hrow, side="left")
        tr = np.flatnonzero(inside > 0)
        t_row, rs, re_ = hrow[tr], region_start[tr], region_end[tr]
        t_sup = inside[tr]
        t_open, t_think = first_at_or_after(pos_open, rs, re_)
        t_close, t_closed = first_at_or_after(pos_close, t_open + 1, re_)
        t_closed &= t_think
        t_stop = np.where(t_closed, t_close, re_)
        t_from = np.minimum(t_open + 1, t_stop)
        t_last = cs_mask.last_before(re_)  # inside the region: it has supervised tokens
        final = turn_index[tr] == assistant_turns[t_row] - 1
        keeps = final | (spec.drops_history_reasoning is False)
        if spec.keeps_reasoning_after_last_user and spec.user_header:
            # Qwen3, Qwen3.6: a turn with no real user message after it (only tool results, rendered as user
            # turns that open with <tool_response>) keeps its reasoning: the tool-calling turns of an agent loop.
            is_user = _matches(ids, pos_ts, ends[ts_row], spec.user_header)
            if spec.tool_response_opener:
                is_user &= ~_matches(ids, pos_ts, ends[ts_row], spec.tool_response_opener)
            _, user_follows = first_at_or_after(pos_ts[is_user], re_, ends[t_row])
            keeps = keeps | ~user_follows
        turns = {
            "row": (t_row + batch.start_row).astype(np.int64),
            "turn": turn_index[tr].astype(np.int32),
            "supervised_tokens": t_sup.astype(np.int64),
            "content_tokens": (t_sup - count_in(sup_boiler_pos, rs, re_)).astype(np.int64),
            "thinking_tokens": np.where(t_think, (t_stop - t_from) - count_in(boiler_pos, t_from, t_stop), 0).astype(np.int64),
            "think_present": t_think,
            "think_closed": t_closed,
            "turn_closed": turn_closed[tr],
            "last_supervised_eot": _ends_at_eot(ids, t_last, starts[t_row], ends[t_row], np.ones(tr.size, dtype=bool), spec),
            "final_turn": final,
            "keeps_reasoning": keeps,
            "ngram_repeat_share": np.zeros(tr.size, dtype=np.float64),  # these four filled below, with the
            "loop_tokens": np.zeros(tr.size, dtype=np.int64),
            "supervised_hash": np.zeros(tr.size, dtype=np.uint64),  # samples' hashes and loops
            "prompt_hash": np.zeros(tr.size, dtype=np.uint64),
            "span_start": (rs - starts[t_row]).astype(np.int64),
            "span_end": (re_ - starts[t_row]).astype(np.int64),
        }
    else:
        sup_inside = np.zeros(n, dtype=np.int64)
        assistant_turns = np.zeros(n, dtype=np.int64)
        trained_turns = np.zeros(n, dtype=np.int64)
        header_trained_tokens = np.zeros(n, dtype=np.int64)
        trained_header_turns = closed_turns = eot_trained_turns = np.zeros(n, dtype=np.float64)

    # Masking conventions of the final turn (-1: does not apply): is the token the template puts
    # after a trained end of turn trained too; is a <think> that opens the turn trained (SpecForge's
    # qwen3.5 template puts "<think>\n" in the untrained header).
    post_eot_trained = np.full(n, -1, dtype=np.int8)
    think_open_trained = np.full(n, -1, dtype=np.int8)
    if ids.size:
        if spec.post_eot:
            p = np.minimum(eot_at + 1, top)
            applies = final_turn_closed & (eot_at + 1 < ends) & (ids[p] == spec.post_eot[0]) & (mask[np.minimum(eot_at, top)] != 0)
            post_eot_trained[applies] = mask[p[applies]] != 0
        if spec.think_open is not None:
            c = np.minimum(content_start, top)
            final_sup = cs_mask[final_end] - cs_mask[np.minimum(content_start, final_end)]
            applies = has_assistant & (content_start < ends) & (ids[c] == spec.think_open) & (final_sup > 0)
            think_open_trained[applies] = mask[c[applies]] != 0
    misaligned = supervised - sup_inside + batch.label_mismatch
    # -1 where no trained turn (no closed trained turn) shows it.
    header_trained = np.where(trained_turns > 0, (trained_header_turns > 0).astype(np.int8), -1).astype(np.int8)
    eot_trained = np.where(closed_turns > 0, (eot_trained_turns == closed_turns).astype(np.int8), -1).astype(np.int8)

    # Hashes of the supervised sequence and of the prompt (unsupervised tokens), and loops.
    mb = mask.view(bool)
    sup_ids = ids[mb]
    sup_mix = lookup(tables.mix_table, sup_ids)
    sup_bounds = cs_mask[offs]
    # A turn's supervised span in the supervised sequence, and what comes before the turn in the
    # row (its prompt: the conversation so far, header included) in both sequences.
    t_lo, t_hi, t_first = cs_mask[rs], cs_mask[re_], sup_bounds[t_row]
    tr_n = t_row.size
    sums = _RangeSums(_weighted(sup_mix, tables), np.concatenate((sup_bounds, t_lo, t_hi)))
    supervised_hash = _range_hash(sums, sup_bounds[:-1], sup_bounds[1:], tables)
    if tr_n:
        turns["supervised_hash"] = _range_hash(sums, t_lo, t_hi, tables)
        sup_before = _range_hash(sums, t_first, t_lo, tables)
    # anchor[t] is (mix[t] >> ANCHOR_SHIFT) == 0: one compare over the gathered hashes, no second gather
    anchors = np.flatnonzero(sup_mix < (np.uint64(1) << ANCHOR_SHIFT))
    pos, h = _anchor_ngrams(sup_mix, anchors)
    del sup_ids
    # A turn that holds all of its row's supervised tokens has the row's share and stretch; only the
    # others (multi-turn rows, stray supervised tokens) are measured on their own span.
    own = np.flatnonzero((t_lo != t_first) | (t_hi != sup_bounds[t_row + 1]))
    ngram_share, own_share, loop_tokens, own_loop = _row_and_turn_repeat_shares(
        sup_mix, pos, h, sup_bounds[:-1], sup_bounds[1:], t_lo[own], t_hi[own], t_row[own])
    # Loops whose few distinct tokens hold no anchor: the anchor-free stretches of 128+ tokens, measured exactly.
    g_pos, g_h = _gap_ngrams(sup_mix, anchors, sup_bounds)
    if g_pos.size:
        loop_tokens = np.maximum(loop_tokens, _stretches(g_pos, g_h, sup_bounds[:-1], sup_bounds[1:]))
        own_loop = np.maximum(own_loop, _stretches(g_pos, g_h, t_lo[own], t_hi[own]))
    if tr_n:
        turn_share = ngram_share[t_row]
        turn_share[own] = own_share
        turns["ngram_repeat_share"] = turn_share
        turn_loop = loop_tokens[t_row]
        turn_loop[own] = own_loop
        turns["loop_tokens"] = turn_loop
    del sup_mix, pos, h, anchors, g_pos, g_h
    uns_mix = lookup(tables.mix_table, ids[~mb])
    uns_bounds = offs - sup_bounds
    uns_lo = rs - t_lo  # each turn's start in the untrained sequence
    sums = _RangeSums(_weighted(uns_mix, tables), np.concatenate((uns_bounds, uns_lo)))
    del uns_mix
    prompt_hash = _range_hash(sums, uns_bounds[:-1], uns_bounds[1:], tables)
    if tr_n:
        uns_before = _range_hash(sums, uns_bounds[t_row], uns_lo, tables)
        turns["prompt_hash"] = splitmix64(uns_before ^ splitmix64(sup_before ^ _C))
    del sums

    metrics = {
        "n_tokens": n_tokens,
        "n_mask": batch.mask_lengths.astype(np.int64, copy=False),
        "supervised_tokens": supervised.astype(np.int64),
        "content_tokens": content_tokens.astype(np.int64),
        "prompt_tokens": prompt_tokens.astype(np.int64, copy=False),
        "thinking_tokens": thinking_tokens.astype(np.int64, copy=False),
        "answer_tokens": answer_tokens.astype(np.int64, copy=False),
        "has_assistant": has_assistant,
        "think_present": think_present,
        "think_closed": think_closed,
        "final_turn_closed": final_turn_closed,
        "last_supervised_eot": last_supervised_eot,
        "misaligned_tokens": misaligned.astype(np.int64, copy=False),
        "ngram_repeat_share": ngram_share,
        "loop_tokens": loop_tokens,
        "supervised_hash": supervised_hash,
        "prompt_hash": prompt_hash,
        "assistant_turns": assistant_turns,
        "trained_turns": trained_turns,
        "post_eot_trained": post_eot_trained,
        "think_open_trained": think_open_trained,
        "header_trained": header_trained,
        "header_trained_tokens": header_trained_tokens,
        "eot_trained": eot_trained,
    }
    return metrics, turns
