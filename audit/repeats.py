"""Repeated 8-grams of supervised sequences: the loop detector's shares and stretches.

Per row (and per trained turn) of a batch's supervised sequence: the share of its 8-grams that
repeat an earlier 8-gram of the same row (``ngram_repeat_share``) and the longest stretch of tokens
covered by repeated 8-grams (``loop_tokens``).

Estimated on a consistent sample: the 8-grams that start at an anchor token (a fixed 1/8 of the
vocabulary: ``mix >> ANCHOR_SHIFT == 0``). Equal 8-grams start with equal tokens, so repeats
survive sampling; rows the sample covers too thinly are measured exactly (``_shares``), and
stretches of ``GAP_EXACT`` tokens without an anchor (a loop whose few tokens hold none) have every
8-gram measured (``_gap_ngrams``). Rows and turns are counted from one sort of keyed hashes
(``_row_and_turn_repeat_shares``); nothing loops over rows or tokens in Python.
"""

from __future__ import annotations

import numpy as np

from dqa.arrays import dedupe_sorted, ranks, sorted_unique
from dqa.audit.sequence_hash import PrefixSums

NGRAM = 8  # n-gram length for repetition
ANCHOR_SHIFT = np.uint64(61)  # sampled n-grams start at anchor tokens: mix hash with top 3 bits clear
SAMPLE_RATE = 1 / 8
KEY_INDEX_BITS = 24  # n-gram sort keys: 40 hash bits, and the row (and turn in the row) in the 24 others
EXACT_MIN_POSITIONS = 64  # under-sampled rows at least this long are measured exactly
SORT_BLOCK = 1024  # keys sorted at a time (``_sort_by_row_blocks``): a block this size sorts in cache, ~3x faster per key
GAP_EXACT = 128  # a stretch of at least this many tokens without an anchor has its 8-grams measured exactly (loop stretches)


def _hash_ngrams(seq: PrefixSums, pos: np.ndarray) -> np.ndarray:
    """64-bit hashes of the 8-grams of the supervised sequence ``seq`` starting at ``pos`` (all in range):
    ``sum_k mix[pos + k] * K**k`` (``PrefixSums.windows``)."""
    return seq.windows(pos, NGRAM)


def _repeat_counts(row: np.ndarray, h: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: how many (row, hash) keys there are, and how many repeat an earlier equal key."""
    key = (row.astype(np.uint64) << np.uint64(40)) | (h >> np.uint64(24))
    key.sort()
    total = np.bincount(row, minlength=n)
    dup_rows = (key[1:][key[1:] == key[:-1]] >> np.uint64(40)).astype(np.int64)
    return total, np.bincount(dup_rows, minlength=n)


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
    repeated = dedupe_sorted(ordered[1:][ordered[1:] == ordered[:-1]])
    return _longest_runs(pos, seg, _member(repeated, key), n)


def _gap_ngrams(seq: PrefixSums, anchors: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8-grams a sample of anchors cannot see: those starting in a stretch of at least ``GAP_EXACT``
    tokens of one row (``bounds``: the rows' offsets in ``seq``) without an anchor token (a loop whose
    few distinct tokens include no anchor). Returns their start positions (sorted) and hashes; stretches are
    found from the anchors' positions and the rows' bounds, not by a pass over the tokens."""
    none = np.zeros(0, dtype=np.int64)
    if seq.size < GAP_EXACT:
        return none, np.zeros(0, dtype=np.uint64)
    edges = np.concatenate(([-1], anchors, [seq.size]))
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
    return pos, _hash_ngrams(seq, pos)


def _anchor_ngrams(seq: PrefixSums, anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sampled 8-grams of the supervised sequence ``seq``: their start positions (``anchors`` that leave
    room for an 8-gram) and their hashes."""
    pos = anchors[anchors + NGRAM <= seq.size]
    return pos, _hash_ngrams(seq, pos)


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


def _shares(seq: PrefixSums, total: np.ndarray, dups: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
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
        t2, d2 = _repeat_counts(all_seg, _hash_ngrams(seq, all_pos), n)
        share[suspicious] = d2[suspicious] / t2[suspicious]
    return share


def _row_and_turn_repeat_shares(seq: PrefixSums, pos: np.ndarray, h: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                                t_lo: np.ndarray, t_hi: np.ndarray, t_row: np.ndarray
                                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Share of the 8-grams of each row ``[lo[r], hi[r])`` of ``seq`` (sorted, disjoint, gaps allowed)
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
    if seq.size < NGRAM or n == 0:
        return (np.zeros(n, dtype=np.float64), np.zeros(m, dtype=np.float64), np.zeros(n, dtype=np.int64),
                np.zeros(m, dtype=np.int64))
    row_first_turn = np.searchsorted(t_row, np.arange(n), side="left")  # index of each row's first turn
    tbits = int(np.bincount(t_row, minlength=1).max()).bit_length() if m else 0  # 1-based turn within its row
    rbits = n.bit_length()  # row n: starts no row holds whole
    if rbits + tbits > KEY_INDEX_BITS:
        return _row_and_turn_repeat_shares_by_two_sorts(seq, pos, h, lo, hi, t_lo, t_hi, t_row)
    T, H = np.uint64(tbits), np.uint64(40 + tbits)
    steps = sorted_unique(np.maximum(np.concatenate(([0], lo, hi - (NGRAM - 1), t_lo, t_hi - (NGRAM - 1))), 0))
    r = np.searchsorted(lo, steps, side="right") - 1
    in_row = (r >= 0) & (steps + NGRAM <= hi[np.maximum(r, 0)])
    j = np.searchsorted(t_lo, steps, side="right") - 1
    in_turn = in_row & (j >= 0) & (steps + NGRAM <= t_hi[np.maximum(j, 0)]) if m else np.zeros(steps.size, dtype=bool)
    local = np.where(in_turn, j - row_first_turn[np.maximum(r, 0)] + 1, 0).astype(np.uint64)
    label = np.where(in_row, (np.maximum(r, 0).astype(np.uint64) << H) | local, np.uint64(n) << H)
    first_gram = np.searchsorted(pos, steps, side="left")  # each step's first sampled 8-gram
    per_step = np.diff(first_gram, append=pos.size)  # sampled 8-grams per step
    key = np.repeat(label[in_row], per_step[in_row])  # those no row holds whole are left out
    key |= (h[np.repeat(in_row, per_step)] >> np.uint64(24)) << T
    total = np.bincount(r[in_row], weights=per_step[in_row], minlength=n).astype(np.int64)
    _sort_by_row_blocks(key, total)
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
        count = per_step[cs]
        g = np.repeat(first_gram[cs], count) + ranks(count)
        g_key = np.repeat(label[cs], count) | ((h[g] >> np.uint64(24)) << T)
        g_pos = pos[g]
        row_rep = _member(dedupe_sorted(key[1:][same_row_hash] >> T), g_key >> T)
        stretch = _longest_runs(g_pos, np.repeat(r[cs], count), row_rep, n)
        if m:
            in_t = np.repeat(in_turn[cs], count)
            t_rep = _member(dedupe_sorted(later), g_key[in_t])
            t_stretch = _longest_runs(g_pos[in_t], np.repeat(j[cs], count)[in_t], t_rep, m)
    return (_shares(seq, total, dups, lo, hi), _shares(seq, t_total, t_dups, t_lo, t_hi), stretch, t_stretch)


def _sort_by_row_blocks(key: np.ndarray, per_row: np.ndarray) -> None:
    """Sort ``key`` in place, given that its top bits are the row and it lists the rows in order, ``per_row[r]``
    keys each: blocks of at least ``SORT_BLOCK`` keys that end at a row's end are sorted one by one. Each block
    holds only rows after the previous block's, so the result is the whole array sorted, at the cost of many
    small sorts (a loop over blocks, not rows)."""
    ends = np.cumsum(per_row)
    total = int(ends[-1]) if ends.size else 0
    if total <= SORT_BLOCK:
        key.sort()
        return
    cuts = sorted_unique(ends[np.searchsorted(ends, np.arange(SORT_BLOCK, total, SORT_BLOCK), side="left")])
    start = 0
    for end in cuts.tolist():
        key[start:end].sort()
        start = end
    if start < total:
        key[start:].sort()


def _row_and_turn_repeat_shares_by_two_sorts(seq: PrefixSums, pos: np.ndarray, h: np.ndarray, lo: np.ndarray,
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
        return _shares(seq, total, dups, lo, hi), np.zeros(0, dtype=np.float64), stretch, t_stretch
    tseg, t_inside = _segment_of(pos, t_lo, t_hi)
    t_total, t_dups = _repeat_counts(tseg[t_inside], h[t_inside], m)
    return _shares(seq, total, dups, lo, hi), _shares(seq, t_total, t_dups, t_lo, t_hi), stretch, t_stretch


def _ngram_repeat_share(sup_mix: np.ndarray, anchors: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Share of each row's supervised 8-grams that repeat an earlier 8-gram of the same row
    (rows ``sup_mix[bounds[r]:bounds[r+1]]``; ``anchors``: positions in ``sup_mix`` of anchor
    tokens). See ``_row_and_turn_repeat_shares``."""
    seq = PrefixSums(sup_mix)
    pos, h = _anchor_ngrams(seq, anchors)
    none = np.zeros(0, dtype=np.int64)
    return _row_and_turn_repeat_shares(seq, pos, h, bounds[:-1], bounds[1:], none, none, none)[0]


def loop_stretches(sup_mix: np.ndarray, anchors: np.ndarray, bounds: np.ndarray, t_lo: np.ndarray | None = None,
                   t_hi: np.ndarray | None = None, t_row: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The longest repeated stretch in tokens of each row ``sup_mix[bounds[r]:bounds[r+1]]`` and of each
    turn ``[t_lo, t_hi)`` (``loop_tokens``): the 8-grams starting at anchor tokens and, in stretches of at
    least ``GAP_EXACT`` tokens without one, every 8-gram (``_gap_ngrams``), each measured apart; the longer
    run wins. For tests and tools; the kernel computes the same beside the shares."""
    none = np.zeros(0, dtype=np.int64)
    t_lo, t_hi, t_row = (none if v is None else v for v in (t_lo, t_hi, t_row))
    seq = PrefixSums(sup_mix)
    pos, h = _anchor_ngrams(seq, anchors)
    _, _, rows, turns = _row_and_turn_repeat_shares(seq, pos, h, bounds[:-1], bounds[1:], t_lo, t_hi, t_row)
    g_pos, g_h = _gap_ngrams(seq, anchors, bounds)
    return np.maximum(rows, _stretches(g_pos, g_h, bounds[:-1], bounds[1:])), np.maximum(turns, _stretches(g_pos, g_h, t_lo, t_hi))
