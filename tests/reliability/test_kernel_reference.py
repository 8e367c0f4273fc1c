"""The vectorized metric kernel (``dqa.audit.kernels.batch_metrics``) equals a slow, obvious,
one-row-at-a-time Python reference written here from FORMATS.md, for random ChatML-ish rows
(and DeepSeek-style rows: two role tokens as turn openers, a one-token header, nothing after
the end of turn), whatever the batch split.

Rows are drawn from Qwen3 template pieces (system/user/assistant turns, think blocks open or
closed, end-of-turn present or not, whitespace boilerplate, repeated phrases), then cut short,
spliced with noise, and given masks that follow the assistant turns, cover everything, nothing,
or random positions, in either convention (``loss_mask`` or ``labels``, with some labels that
differ from their input id) and sometimes of the wrong length. The dataset is written to
parquet and read back through ``dqa.audit.readers`` with a random ``batch_rows`` and
``max_tokens``, so the comparison covers the reader's flattening and the kernel's batch
independence together.

Per trained assistant turn (``batch_metrics_and_turns``' second table) the reference computes the
same on the turn's region: its tokens, think block, closing, its own repeated 8-grams, and which
turns share a span (supervised tokens) or a prompt (the conversation before the turn).

Soak (DQA_SOAK=1): 2,000 examples instead of 150.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqa.audit.chat_format import ChatFormat
from dqa.audit.kernels import TURN_COLUMNS, KernelTables, batch_metrics_and_turns
from dqa.audit.repeats import EXACT_MIN_POSITIONS, GAP_EXACT, NGRAM, SAMPLE_RATE
from dqa.audit.readers import open_dataset
from dqa.audit.template import qwen3_preset

IM_START, IM_END, NL, NL2, THINK, END_THINK = 151644, 151645, 198, 271, 151667, 151668
ASSISTANT, USER, SYSTEM, EOS, SPACE = 77091, 872, 8948, 151643, 220
TOOL_RESPONSE, END_TOOL_RESPONSE = 151665, 151666
WORDS = [1000, 1001, 1002, 1003, 3925, 13, 40, 2167]  # a small pool, so duplicates and loops happen

EXAMPLES = 2000 if os.environ.get("DQA_SOAK") == "1" else 150

SPEC = qwen3_preset(decode=False)
TABLES = KernelTables.build(SPEC)

# A DeepSeek-V3-shaped format inside Qwen3's vocabulary: <｜User｜> and <｜Assistant｜> open turns,
# the header is <｜Assistant｜> alone, end of turn <｜end▁of▁sentence｜> with nothing after it; history reasoning
# dropped before the last <｜User｜> (tool results would be a role of their own).
DS_USER, DS_ASSISTANT, DS_EOS = 151646, 151647, 151643
DS_SPEC = ChatFormat(name="deepseek-like", turn_start=DS_ASSISTANT, eot=DS_EOS, assistant_header=(DS_ASSISTANT,),
                     think_open=THINK, think_close=END_THINK, boilerplate=frozenset({DS_EOS, THINK, END_THINK, NL, NL2, SPACE}),
                     vocab_size=151669, newline=NL, turn_openers=(DS_ASSISTANT, DS_USER), post_eot=(),
                     drops_history_reasoning=True, user_header=(DS_USER,), tool_response_opener=(),
                     keeps_reasoning_after_last_user=True)
DS_TABLES = KernelTables.build(DS_SPEC)

# A GLM-shaped format inside Qwen3's vocabulary: <|assistant|>, <|user|>, <|system|> and <|observation|> open turns,
# the header is <|assistant|> alone, and no token ends a turn: the next role token does, or the end of the row.
# History reasoning dropped, leaving an empty think block (GLM-5.2).
GLM_ASSISTANT, GLM_USER, GLM_SYSTEM, GLM_OBS = 151646, 151647, 151648, 151649
GLM_SPEC = ChatFormat(name="glm-like", turn_start=GLM_ASSISTANT, eot=GLM_USER, assistant_header=(GLM_ASSISTANT,),
                      think_open=THINK, think_close=END_THINK, boilerplate=frozenset({EOS, THINK, END_THINK, NL, NL2, SPACE}),
                      vocab_size=151669, newline=NL, turn_openers=(GLM_ASSISTANT, GLM_USER, GLM_SYSTEM, GLM_OBS), post_eot=(),
                      drops_history_reasoning=True, user_header=(GLM_USER,), tool_response_opener=(),
                      keeps_reasoning_after_last_user=True, ends_at_next_role=True, empty_think_in_history=True)
GLM_TABLES = KernelTables.build(GLM_SPEC)


# ------------------------------------------------------------------------- the reference


def reference_row(t: list[int], sup: list[int], convention: str, spec: ChatFormat = SPEC) -> dict:
    """Every per-sample metric of FORMATS.md for one row, computed the slow obvious way.

    ``sup`` is the stored supervision list (0/1 mask, or labels with -100).
    """
    L = len(t)
    boiler = spec.boilerplate
    hdr = list(spec.assistant_header)
    h = len(hdr)
    eot, post, openers = spec.eot, list(spec.post_eot), set(spec.turn_openers)
    next_role = spec.ends_at_next_role  # GLM: the next role token (not part of the turn) or the row's end ends a turn
    n_mask = len(sup)
    mismatch = 0
    if n_mask != L:
        m = [0] * L  # a mask of the wrong length supervises nothing
    elif convention == "loss_mask":
        m = [int(bool(x)) for x in sup]
    else:
        m = [int(lab != -100) for lab in sup]
        mismatch = sum(1 for lab, tok in zip(sup, t) if lab != -100 and lab != tok)
    supervised = sum(m)
    content = sum(1 for i in range(L) if m[i] and t[i] not in boiler)

    headers = [i for i in range(L - h + 1) if t[i:i + h] == hdr]
    has_assistant = bool(headers)
    think_present = think_closed = final_closed = False
    thinking = answer = 0
    post_eot_trained = think_open_trained = -1
    if has_assistant:
        cstart = headers[-1] + h
        prompt_tokens = cstart
        eots = [i for i in range(cstart, L) if t[i] == eot]
        final_closed = bool(eots)
        fend = eots[0] + 1 if eots else L
        if next_role:
            eots = []
            final_closed = True
            fend = next((i for i in range(cstart, L) if t[i] in openers), L)
        opens = [i for i in range(cstart, fend) if t[i] == spec.think_open]
        think_present = bool(opens)
        if think_present:
            closes = [i for i in range(opens[0] + 1, fend) if t[i] == spec.think_close]
            think_closed = bool(closes)
            stop = closes[0] if closes else fend
            thinking = sum(1 for i in range(opens[0] + 1, stop) if t[i] not in boiler)
            astart = closes[0] + 1 if closes else fend
        else:
            astart = cstart
        answer = sum(1 for i in range(astart, fend) if m[i] and t[i] not in boiler)
        if eots and post and eots[0] + 1 < L and t[eots[0] + 1] == post[0] and m[eots[0]]:
            post_eot_trained = m[eots[0] + 1]
        if cstart < L and t[cstart] == spec.think_open and sum(m[cstart:fend]) > 0:
            think_open_trained = m[cstart]
    else:
        prompt_tokens = L

    sup_pos = [i for i in range(L) if m[i]]
    last_eot = False
    if sup_pos:
        last_eot = ends_at_eot(t, sup_pos[-1], spec)

    # Supervised tokens inside assistant turns: header end .. end of turn (+ what follows it), cut at the next turn opener.
    inside = 0
    trained_turns = 0
    header_tokens = header_turns = closed_turns = eot_turns = 0
    turns = []
    user_hdr, tool_hdr = list(spec.user_header), list(spec.tool_response_opener or ())
    real_users = [i for i in range(L) if user_hdr and t[i:i + len(user_hdr)] == user_hdr
                  and not (tool_hdr and t[i:i + len(tool_hdr)] == tool_hdr)]
    for k, hp in enumerate(headers):
        a = hp + h
        e = None if next_role else next((i for i in range(a, L) if t[i] == eot), None)
        b = L if e is None else e + 1
        if e is not None:
            for tok in post:
                if b < L and t[b] == tok:
                    b += 1
                else:
                    break
        nxt = next((i for i in range(a, L) if t[i] in openers), None)
        if nxt is not None:
            b = min(b, nxt)
        inside += sum(m[a:b])
        trained_turns += sum(m[a:b]) > 0
        header_tokens += sum(m[hp:a])
        closed = next_role or (e is not None and (nxt is None or e < nxt))
        if sum(m[a:b]):
            header_turns += sum(m[hp:a]) > 0
            closed_turns += closed and not next_role  # GLM: no end-of-turn token to be trained
            eot_turns += closed and not next_role and m[e] == 1
            user_after = any(b <= u for u in real_users)
            turns.append(reference_turn(t, m, spec, k, len(headers), hp, a, b, closed=closed, user_after=user_after))

    seq = [t[i] for i in sup_pos]
    for tr in turns:  # the turn's stretch: its span of the row's supervised sequence
        tr["loop_tokens"] = reference_loop_tokens(seq, sum(m[:tr["span_start"]]), sum(m[:tr["span_end"]]))
    return {
        "n_tokens": L,
        "n_mask": n_mask,
        "supervised_tokens": supervised,
        "content_tokens": content,
        "prompt_tokens": prompt_tokens,
        "thinking_tokens": thinking,
        "answer_tokens": answer,
        "has_assistant": has_assistant,
        "think_present": think_present,
        "think_closed": think_closed,
        "final_turn_closed": final_closed,
        "last_supervised_eot": last_eot,
        "misaligned_tokens": supervised - inside + mismatch,
        "ngram_repeat_share": reference_repeat_share(seq),
        "loop_tokens": reference_loop_tokens(seq, 0, len(seq)),
        "assistant_turns": len(headers),
        "trained_turns": trained_turns,
        "post_eot_trained": post_eot_trained,
        "think_open_trained": think_open_trained,
        "header_trained": (1 if header_turns else 0) if trained_turns else -1,
        "header_trained_tokens": header_tokens,
        "eot_trained": (1 if eot_turns == closed_turns else 0) if closed_turns else -1,
        "_turns": turns,
        "_supervised_seq": tuple(seq),
        "_prompt_seq": tuple(t[i] for i in range(L) if not m[i]),
    }


def ends_at_eot(t: list[int], j: int, spec: ChatFormat) -> bool:
    """The supervised span whose last position is ``j`` ends at end of turn (FORMATS.md, ``truncated``)."""
    eot, post, L = spec.eot, list(spec.post_eot), len(t)
    if spec.ends_at_next_role:  # at the row's end, just before a role token, or on one
        return j + 1 >= L or t[j + 1] in spec.turn_openers or t[j] in spec.turn_openers
    if t[j] == eot or (j + 1 < L and t[j + 1] == eot):
        return True
    return any(j - k >= 0 and t[j - k] == eot and t[j - k + 1:j + 1] == post[:k] for k in range(1, len(post) + 1))


def reference_turn(t: list[int], m: list[int], spec: ChatFormat, k: int, n_headers: int, hp: int, a: int, b: int, closed: bool,
                   user_after: bool = True) -> dict:
    """The per-turn metrics of the trained assistant turn ``k`` (header at ``hp``, region ``[a, b)``); ``user_after``:
    a real user message (a user header that opens no tool result) follows the turn's region in the row."""
    boiler = spec.boilerplate
    opens = [i for i in range(a, b) if t[i] == spec.think_open]
    present = bool(opens)
    think_closed, thinking = False, 0
    if present:
        closes = [i for i in range(opens[0] + 1, b) if t[i] == spec.think_close]
        think_closed = bool(closes)
        stop = closes[0] if closes else b
        thinking = sum(1 for i in range(opens[0] + 1, stop) if t[i] not in boiler)
    last = max(i for i in range(a, b) if m[i])
    seq = [t[i] for i in range(a, b) if m[i]]
    keeps = (k == n_headers - 1 or spec.drops_history_reasoning is False
             or bool(spec.keeps_reasoning_after_last_user and spec.user_header and not user_after))
    if spec.empty_think_in_history and not keeps:  # the template's empty think block of a history turn
        present, think_closed, thinking = False, False, 0
    return {
        "turn": k,
        "supervised_tokens": sum(m[a:b]),
        "content_tokens": sum(1 for i in range(a, b) if m[i] and t[i] not in boiler),
        "thinking_tokens": thinking,
        "think_present": present,
        "think_closed": think_closed,
        "turn_closed": closed,
        "last_supervised_eot": ends_at_eot(t, last, spec),
        "final_turn": k == n_headers - 1,
        "keeps_reasoning": keeps,
        "span_start": a,
        "span_end": b,
        "ngram_repeat_share": reference_repeat_share(seq),  # the turn's own 8-grams
        "_seq": tuple(seq),
        # The turn's prompt: the conversation before it (header included), its untrained and its trained tokens.
        "_prompt": (tuple(t[i] for i in range(a) if not m[i]), tuple(t[i] for i in range(a) if m[i])),
    }


def reference_repeat_share(seq: list[int]) -> float:
    """The documented estimator, on token tuples instead of hashes.

    The 8-grams of the supervised sequence that start at an anchor token (a fixed 1/8 of the
    vocabulary) are the sample; share = (sampled n-grams - distinct ones) / sampled. A row with
    at least 64 n-gram positions but fewer than half the expected samples is measured on every
    position instead.
    """
    positions = max(len(seq) - NGRAM + 1, 0)
    grams = [tuple(seq[i:i + NGRAM]) for i in range(positions)]
    sampled = [g for g in grams if TABLES.anchor[g[0]]]
    if positions >= EXACT_MIN_POSITIONS and len(sampled) < positions * (SAMPLE_RATE / 2):
        sampled = grams
    if not sampled:
        return 0.0
    return (len(sampled) - len(set(sampled))) / len(sampled)


def reference_loop_tokens(seq: list[int], lo: int, hi: int) -> int:
    """The documented longest repeated stretch of ``seq[lo:hi]`` (a row's supervised sequence, or a turn's
    span of it), on token tuples instead of hashes (FORMATS.md, ``loop_tokens``).

    Two sets of 8-grams of the span are measured apart: those starting at an anchor token, and every one
    starting in a stretch of at least ``GAP_EXACT`` tokens of the row without an anchor token. In each set,
    an 8-gram repeats when it occurs more than once in the set; a run is a maximal sequence of consecutive
    members of the set (in position order) that all repeat, and it covers last start - first start + 8
    tokens. The longest run of either set; 0 without one.
    """
    fits = [i for i in range(lo, hi - NGRAM + 1)]
    anchored = [i for i in fits if TABLES.anchor[seq[i]]]
    free, run = set(), []
    for i in range(len(seq) + 1):  # anchor-free stretches of the whole row
        if i < len(seq) and not TABLES.anchor[seq[i]]:
            run.append(i)
            continue
        if len(run) >= GAP_EXACT:
            free.update(run)
        run = []
    best = 0
    for members in (anchored, [i for i in fits if i in free]):
        grams = [tuple(seq[i:i + NGRAM]) for i in members]
        repeats = [grams.count(g) > 1 for g in grams]
        start = None
        for k, rep in enumerate(repeats + [False]):
            if rep and start is None:
                start = k
            if not rep and start is not None:
                best = max(best, members[k - 1] - members[start] + NGRAM)
                start = None
    return best


# ------------------------------------------------------------------------- random rows


def turn(draw, role: int, style: str = "chatml") -> list[int]:
    body = draw(st.lists(st.sampled_from(WORDS + [SPACE, NL, NL2]), max_size=6))
    if style == "glm":  # <|system|>text, <|user|>text, sometimes a tool result: <|observation|>text
        if role == USER and draw(st.integers(0, 3)) == 0:
            return [GLM_OBS, *body]
        return [GLM_SYSTEM if role == SYSTEM else GLM_USER, *body]
    if style == "deepseek":  # <｜User｜>text (a system prompt is bare text: no opener)
        return [DS_USER, *body] if role == USER else body
    if role == USER and draw(st.integers(0, 3)) == 0:  # a tool result, which Qwen3 renders as a user turn
        body = [TOOL_RESPONSE, NL, *body, END_TOOL_RESPONSE]
    return [IM_START, role, NL, *body, IM_END, NL]


def assistant_turn(draw, style: str = "chatml") -> list[int]:
    out = {"chatml": [IM_START, ASSISTANT, NL], "deepseek": [DS_ASSISTANT], "glm": [GLM_ASSISTANT]}[style]
    eot = {"chatml": IM_END, "deepseek": DS_EOS, "glm": None}[style]
    if draw(st.booleans()):
        out.append(THINK)
        think = draw(st.lists(st.sampled_from(WORDS + [NL, NL2, SPACE]), max_size=8))
        if draw(st.booleans()):  # a thinking loop: one phrase many times
            phrase = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4))
            think += phrase * draw(st.integers(2, 40))
        out += think
        if draw(st.integers(0, 4)):
            out += [END_THINK, NL2]
    answer = draw(st.lists(st.sampled_from(WORDS + [NL, SPACE, EOS]), max_size=8))
    if draw(st.integers(0, 3)) == 0:
        answer = [3925, 13]  # the canned "OK."
    out += answer
    if eot is not None and draw(st.integers(0, 4)):
        out.append(eot)
        if draw(st.booleans()):
            out.append(NL)
    return out


@st.composite
def chat_row(draw, style: str = "chatml"):
    """(input_ids, 0/1 mask, labels) for one row."""
    t: list[int] = []
    spans: list[tuple[int, int]] = []  # assistant content spans, for the "follow the turns" mask
    hlen = 3 if style == "chatml" else 1
    if draw(st.booleans()):
        t += turn(draw, SYSTEM, style)
    for _ in range(draw(st.integers(0, 3))):
        t += turn(draw, USER, style)
        a = assistant_turn(draw, style)
        # SpecForge's qwen3.5 header leaves "<think>\n" untrained: sometimes the span starts after it.
        skip = 2 if len(a) > hlen + 1 and a[hlen] == THINK and draw(st.booleans()) else 0
        spans.append((len(t) + hlen + skip, len(t) + len(a)))
        t += a
    if draw(st.integers(0, 5)) == 0:  # noise: stray template tokens anywhere
        stray = {"chatml": [IM_START, IM_END, ASSISTANT, USER, TOOL_RESPONSE], "deepseek": [DS_USER, DS_ASSISTANT, DS_EOS],
                 "glm": [GLM_USER, GLM_ASSISTANT, GLM_OBS, GLM_SYSTEM]}[style]
        noise = draw(st.lists(st.sampled_from([*stray, THINK, END_THINK, NL, EOS, 1000]), max_size=6))
        at = draw(st.integers(0, len(t)))
        t = t[:at] + noise + t[at:]
    if t and draw(st.integers(0, 4)) == 0:  # truncated
        t = t[: draw(st.integers(0, len(t)))]
    L = len(t)
    style = draw(st.sampled_from(["turns", "turns", "all", "none", "random"]))
    if style == "turns":
        m = [0] * L
        for a, b in spans:
            for i in range(a, min(b, L)):
                m[i] = 1
    elif style == "all":
        m = [1] * L
    elif style == "none":
        m = [0] * L
    else:
        m = draw(st.lists(st.integers(0, 1), min_size=L, max_size=L))
    if L and draw(st.integers(0, 5)) == 0:  # a few flipped positions (header or user text supervised)
        for i in draw(st.lists(st.integers(0, L - 1), max_size=3)):
            m[i] ^= 1
    labels = [tok if mk else -100 for tok, mk in zip(t, m)]
    if L and draw(st.integers(0, 6)) == 0:  # a supervised label that is not its input id
        i = draw(st.integers(0, L - 1))
        labels[i] = 1003 if t[i] != 1003 else 1002
    if draw(st.integers(0, 12)) == 0:  # stored supervision of the wrong length
        extra = draw(st.integers(1, 2))
        m, labels = (m + [0] * extra, labels + [-100] * extra) if draw(st.booleans()) or not L else (m[:-1], labels[:-1])
    return t, m, labels


@st.composite
def datasets(draw, style: str = "chatml"):
    rows = draw(st.lists(chat_row(style), min_size=1, max_size=14))
    if len(rows) > 1 and draw(st.booleans()):  # exact duplicates and shared responses
        rows.append(rows[draw(st.integers(0, len(rows) - 1))])
    return {
        "rows": rows,
        "convention": draw(st.sampled_from(["loss_mask", "labels"])),
        "mask_type": draw(st.sampled_from([pa.uint8(), pa.int64(), pa.bool_(), pa.int8()])),
        "ids_type": draw(st.sampled_from([pa.int32(), pa.int64(), pa.uint32()])),
        "batch_rows": draw(st.integers(1, 16)),
        "max_tokens": draw(st.integers(1, 400)),
    }


def write(case, path: Path) -> None:
    ids = pa.array([r[0] for r in case["rows"]], pa.list_(case["ids_type"]))
    if case["convention"] == "loss_mask":
        sup = pa.array([r[1] for r in case["rows"]], pa.list_(pa.int64())).cast(pa.list_(case["mask_type"]))
    else:
        sup = pa.array([r[2] for r in case["rows"]], pa.list_(pa.int64()))
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(len(case["rows"]))], "input_ids": ids, case["convention"]: sup}), path)


def kernel_metrics(path: Path, batch_rows: int, max_tokens: int, tables: KernelTables = TABLES) -> tuple[dict[str, np.ndarray], list[int]]:
    """All batches' metrics concatenated (the per-turn ones under ``turn.NAME``), and the start rows of the batches."""
    ds = open_dataset(path)
    parts, turn_parts, starts = [], [], []
    for b in ds.batches(batch_rows=batch_rows, max_tokens=max_tokens):
        starts.append(b.start_row)
        m, turns = batch_metrics_and_turns(b, tables)
        parts.append(m)
        turn_parts.append(turns)
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    out.update({f"turn.{k}": np.concatenate([p[k] for p in turn_parts]) for k in TURN_COLUMNS})
    return out, starts


# ------------------------------------------------------------------------- properties


EXACT = ("n_tokens", "n_mask", "supervised_tokens", "content_tokens", "prompt_tokens", "thinking_tokens", "answer_tokens",
         "has_assistant", "think_present", "think_closed", "final_turn_closed", "last_supervised_eot", "misaligned_tokens",
         "assistant_turns", "trained_turns", "post_eot_trained", "think_open_trained", "header_trained", "header_trained_tokens",
         "eot_trained")


def check_against_reference(case, got: dict[str, np.ndarray], spec: ChatFormat = SPEC) -> None:
    ref = [reference_row(t, m if case["convention"] == "loss_mask" else lab, case["convention"], spec) for t, m, lab in case["rows"]]
    for col in EXACT:
        want = [r[col] for r in ref]
        have = got[col].tolist()
        bad = [i for i, (a, b) in enumerate(zip(want, have)) if a != b]
        assert not bad, f"{col}: row {bad[0]} kernel {have[bad[0]]} != reference {want[bad[0]]}; row {case['rows'][bad[0]]}"
    np.testing.assert_allclose(got["ngram_repeat_share"], [r["ngram_repeat_share"] for r in ref], rtol=0, atol=1e-12)
    assert got["loop_tokens"].tolist() == [r["loop_tokens"] for r in ref], "loop_tokens"
    # Per trained turn, in row then turn order.
    ref_turns = [dict(tr, row=i) for i, r in enumerate(ref) for tr in r["_turns"]]
    for col in [c for c in TURN_COLUMNS if c not in ("supervised_hash", "prompt_hash")]:
        want = [tr[col] for tr in ref_turns]
        have = got[f"turn.{col}"].tolist()
        assert have == want, f"turn {col}: kernel {have} != reference {want}"
    # Turn hashes: equal exactly when the sequences are, and in the same family as the samples' hashes.
    th, tp = got["turn.supervised_hash"].tolist(), got["turn.prompt_hash"].tolist()
    sample_hashes, sample_seqs = got["supervised_hash"].tolist(), [r["_supervised_seq"] for r in ref]
    for i, tr in enumerate(ref_turns):
        assert th[i] != 0
        for j in range(i):
            assert (th[i] == th[j]) == (tr["_seq"] == ref_turns[j]["_seq"]), f"turn hashes {j} and {i}"
            assert (tp[i] == tp[j]) == (tr["_prompt"] == ref_turns[j]["_prompt"]), f"turn prompt hashes {j} and {i}"
        for r, seq in enumerate(sample_seqs):
            assert (th[i] == sample_hashes[r]) == (tr["_seq"] == seq), f"turn {i} against row {r}"
    # Hashes: equal exactly when the sequences are equal; 0 exactly when the sequence is empty.
    for col, key in (("supervised_hash", "_supervised_seq"), ("prompt_hash", "_prompt_seq")):
        hashes = got[col].tolist()
        seqs = [r[key] for r in ref]
        for i in range(len(seqs)):
            assert (hashes[i] == 0) == (len(seqs[i]) == 0), f"{col}: row {i}"
            for j in range(i):
                assert (hashes[i] == hashes[j]) == (seqs[i] == seqs[j]), f"{col}: rows {j} and {i}"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(datasets())
def test_kernel_metrics_equal_the_row_by_row_reference_for_any_batch_split(case):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "set.parquet"
        write(case, path)
        got, starts = kernel_metrics(path, case["batch_rows"], case["max_tokens"])
        whole, _ = kernel_metrics(path, 4096, 10**9)
    assert starts == sorted(starts) and starts[0] == 0
    check_against_reference(case, got)
    for col in got:  # batch-independent to the bit, hashes and float shares included
        assert np.array_equal(got[col], whole[col]), col


@settings(max_examples=max(EXAMPLES // 3, 50), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(datasets("deepseek"))
def test_a_format_with_two_role_openers_and_nothing_after_end_of_turn_equals_the_reference(case):
    """DeepSeek-style turns: <｜User｜> also opens (and so ends) a turn, <｜Assistant｜> is the whole header,
    a newline after end of turn is not the template's and counts as outside the turn."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "set.parquet"
        write(case, path)
        got, _ = kernel_metrics(path, case["batch_rows"], case["max_tokens"], DS_TABLES)
        whole, _ = kernel_metrics(path, 4096, 10**9, DS_TABLES)
    check_against_reference(case, got, DS_SPEC)
    for col in got:
        assert np.array_equal(got[col], whole[col]), col


@settings(max_examples=max(EXAMPLES // 3, 50), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(datasets("glm"))
def test_a_format_whose_turns_end_at_the_next_role_token_equals_the_reference(case):
    """GLM-style turns: no end-of-turn token; four role tokens open (and so end) a turn, the last turn runs to the row's
    end; a history turn's empty think block is the template's."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "set.parquet"
        write(case, path)
        got, _ = kernel_metrics(path, case["batch_rows"], case["max_tokens"], GLM_TABLES)
        whole, _ = kernel_metrics(path, 4096, 10**9, GLM_TABLES)
    check_against_reference(case, got, GLM_SPEC)
    for col in got:
        assert np.array_equal(got[col], whole[col]), col


def test_a_long_loop_without_anchor_tokens_is_measured_exactly():
    """A 1-token loop whose token is no anchor has no sampled n-grams: the exact fallback must see it."""
    tok = next(i for i in WORDS if not TABLES.anchor[i])
    t = [IM_START, ASSISTANT, NL] + [tok] * 200 + [IM_END]
    m = [0, 0, 0] + [1] * 201
    case = {"rows": [(t, m, t)], "convention": "loss_mask", "mask_type": pa.uint8(), "ids_type": pa.int32()}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "loop.parquet"
        write(case, path)
        got, _ = kernel_metrics(path, 8, 10**6)
    check_against_reference(case, got)
    assert got["ngram_repeat_share"][0] > 0.9


def test_a_loop_in_one_turn_without_anchor_tokens_is_measured_exactly():
    """The same in a turn: a looping first reply of a two-turn row, whose row share the second dilutes."""
    tok = next(i for i in WORDS if not TABLES.anchor[i])
    t = [IM_START, USER, NL, 1000, IM_END, NL, IM_START, ASSISTANT, NL] + [tok] * 200 + [IM_END, NL]
    t += [IM_START, USER, NL, 1001, IM_END, NL, IM_START, ASSISTANT, NL] + [1000 + (i * 7) % 4 for i in range(3)] + [IM_END, NL]
    m = [int(i >= 9 and i < 211) for i in range(211)] + [0] * 9 + [1] * 5
    case = {"rows": [(t, m, t)], "convention": "loss_mask", "mask_type": pa.uint8(), "ids_type": pa.int32()}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "loop.parquet"
        write(case, path)
        got, _ = kernel_metrics(path, 8, 10**6)
    check_against_reference(case, got)
    assert got["turn.ngram_repeat_share"][0] > 0.9 and got["turn.turn"].tolist() == [0, 1]


@settings(max_examples=max(EXAMPLES // 3, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(datasets())
def test_the_row_and_turn_repeat_shares_from_one_sort_equal_those_of_two(case):
    """Rows' and turns' repeated 8-grams are counted in one sort where their indices fit beside the
    hash bits, else in two: both ways give the reference's shares."""
    from dqa.audit import repeats

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "set.parquet"
        write(case, path)
        one, _ = kernel_metrics(path, case["batch_rows"], case["max_tokens"])
        saved = repeats.KEY_INDEX_BITS
        repeats.KEY_INDEX_BITS = 0  # no index fits: two sorts
        try:
            two, _ = kernel_metrics(path, case["batch_rows"], case["max_tokens"])
        finally:
            repeats.KEY_INDEX_BITS = saved
    check_against_reference(case, two)
    for col in ("ngram_repeat_share", "turn.ngram_repeat_share", "loop_tokens", "turn.loop_tokens"):
        assert np.array_equal(one[col], two[col]), col


@pytest.mark.parametrize("cut", [0, 1, 3, 5, 7])
def test_the_ok_answer_and_its_truncations(cut):
    """The seed's degenerate answer, whole and cut at each point, through the same comparison."""
    prompt = [IM_START, USER, NL, 1000, IM_END, NL, IM_START, ASSISTANT, NL]
    ok = [THINK, NL2, END_THINK, NL2, 3925, 13, IM_END]
    t = prompt + ok[: len(ok) - cut]
    m = [0] * len(prompt) + [1] * (len(t) - len(prompt))
    case = {"rows": [(t, m, t)], "convention": "loss_mask", "mask_type": pa.uint8(), "ids_type": pa.int32()}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ok.parquet"
        write(case, path)
        got, _ = kernel_metrics(path, 1, 1)
    check_against_reference(case, got)


def test_a_header_split_across_two_rows_is_no_header():
    """Row 0 ends with <|im_start|>, row 1 starts with "assistant\\n": neither row has an assistant turn."""
    rows = [([IM_START, USER, NL, 1000, IM_END, NL, IM_START], [0] * 6 + [1]),
            ([ASSISTANT, NL, 3925, 13, IM_END], [0, 0, 1, 1, 1]),
            ([IM_START, ASSISTANT], [0, 1])]
    case = {"rows": [(t, m, [x if k else -100 for x, k in zip(t, m)]) for t, m in rows], "convention": "loss_mask",
            "mask_type": pa.uint8(), "ids_type": pa.int32()}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "split.parquet"
        write(case, path)
        for batch_rows in (1, 2, 3):
            got, _ = kernel_metrics(path, batch_rows, 10**6)
            check_against_reference(case, got)
            assert not got["has_assistant"].any()
