"""Mask conventions: how the input masks an assistant turn, so a regenerated sample is masked the same way.

``run_convention`` finds the chat format the runs used and the input's ``Convention`` (the scan's
``conventions``, else detected from the input's first rows); ``rebuild_in_convention`` rebuilds a
batch of regenerated samples' ids and mask in it, vectorized over the batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dqa.errors import InputError
from dqa.regen.merge.index import read_manifest


@dataclass(frozen=True)
class Convention:
    """How the input masks an assistant turn, so that a regenerated sample is masked the same way.

    ``turns``: ``all`` (every assistant turn trained: SpecForge, TRL, LLaMA-Factory) or ``last``
    (only the final one: SpecForge's ``train_only_last_turn``, speculators' last boundary);
    ``post_eot``: the tokens the template puts after end of turn (ChatML's ``\n``) are trained, and
    appended after a final turn that ends in end of turn; ``think_prefix``: tokens right after the
    header that stay untrained (SpecForge's ``qwen3.5`` header ``<|im_start|>assistant\n<think>\n``);
    ``header_trained``: the assistant header is trained too (TRL's DeepSeek V3 template trains
    ``<｜Assistant｜>``); ``eot_trained``: the end-of-turn token is trained (False: axolotl's
    ``train_on_eos: none``, where the span stops before it and nothing after it is trained).
    """

    turns: str = "all"
    post_eot: bool = False
    think_prefix: tuple[int, ...] = ()
    source: str = ""
    header_trained: bool = False
    eot_trained: bool = True

    @classmethod
    def from_detected(cls, conv: dict[str, Any], fmt: Any, source: str) -> "Convention":
        """From ``detect_conventions``' dict (a scan's ``summary.json`` ``conventions``)."""
        turns = conv.get("trained_turns")
        if turns not in ("all", "last"):
            a, b = conv.get("trained_turns_share_all"), conv.get("trained_turns_share_last")
            turns = "last" if turns == "mixed" and (b or 0) > (a or 0) else "all"
        prefix: tuple[int, ...] = ()
        if conv.get("header_includes_think"):
            prefix = tuple(fmt.think_prefix) or tuple(t for t in (fmt.think_open, fmt.newline) if t is not None)
        return cls(turns, bool(conv.get("post_eot_trained")), prefix, source,
                   header_trained=conv.get("header_trained") is True, eot_trained=conv.get("eot_trained") is not False)

    def describe(self) -> dict[str, Any]:
        return {"trained_turns": self.turns, "post_eot_trained": self.post_eot, "header_includes_think": bool(self.think_prefix),
                "header_trained": self.header_trained, "eot_trained": self.eot_trained, "source": self.source}


def rebuild_in_convention(values: np.ndarray, offsets: np.ndarray, fmt: Any, conv: Convention) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Regenerated samples (flat ``values``, ``offsets``) as the input would have stored them:
    ``(values, offsets, mask)`` with the post-end-of-turn tokens appended after a final end of turn
    when the convention trains them, and the mask over each trained assistant turn from after its
    header (and an untrained think prefix; from the header itself when ``header_trained``) through
    its end of turn (and the tokens after it when trained; up to it when not ``eot_trained``); a
    final turn without end of turn (a length cut) is trained to the sample's end.
    Vectorized over all samples (loops only over the few tokens of a header or think prefix)."""
    from dqa.regen.jobs.prompts import header_starts

    values = np.asarray(values)
    offsets = np.asarray(offsets, dtype=np.int64)
    if fmt.ends_at_next_role:
        values, offsets = _drop_final_role_token(values, offsets, fmt)
    n = offsets.size - 1
    lens = offsets[1:] - offsets[:-1]
    post = np.asarray(fmt.post_eot or (), dtype=values.dtype if values.size else np.int64)
    if conv.post_eot and conv.eot_trained and post.size and n:
        last_tok = values[np.maximum(offsets[1:] - 1, 0)] if values.size else np.zeros(n, values.dtype)
        add = ((lens > 0) & (last_tok == fmt.eot)).astype(np.int64) * post.size
        if add.any():
            new_lens = lens + add
            new_off = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(new_lens, out=new_off[1:])
            out = np.empty(int(new_off[-1]), dtype=values.dtype)
            row_of = np.repeat(np.arange(n), new_lens)
            rank = np.arange(out.size) - new_off[row_of]
            old = rank < lens[row_of]
            out[old] = values[offsets[row_of[old]] + rank[old]]
            out[~old] = post[rank[~old] - lens[row_of[~old]]]
            values, offsets, lens = out, new_off, new_lens
    total = values.size
    mask = np.zeros(total, dtype=np.uint8)
    hpos, hrow = header_starts(values, offsets, tuple(fmt.assistant_header))
    if hpos.size == 0:
        return values, offsets, mask
    hlen = len(fmt.assistant_header)
    row_end = offsets[hrow + 1]
    nxt = np.r_[hpos[1:], total]
    nxt = np.where(np.r_[hrow[1:] == hrow[:-1], False], nxt, row_end)
    if conv.turns == "last":
        keep = np.r_[hrow[1:] != hrow[:-1], True]
        hpos, hrow, row_end, nxt = hpos[keep], hrow[keep], row_end[keep], nxt[keep]
    start = hpos + hlen
    if conv.think_prefix:
        k = len(conv.think_prefix)
        match = start + k <= nxt
        for j, t in enumerate(conv.think_prefix):
            match &= values[np.minimum(start + j, max(total - 1, 0))] == t
        start = np.where(match, start + k, start)
        if fmt.empty_think_in_history and fmt.think_close is not None:
            # SpecForge's GLM rule: "<|assistant|><think>" then an optional "</think>" stay untrained
            # (a history turn's empty think block, the template's own).
            start = np.where(match & (start < nxt) & (values[np.minimum(start, max(total - 1, 0))] == fmt.think_close), start + 1, start)
    if fmt.ends_at_next_role:  # GLM: a turn ends at the next role token (untrained) or the row's end
        eots = np.flatnonzero(np.isin(values, np.asarray(fmt.turn_openers, dtype=values.dtype)))
    else:
        eots = np.flatnonzero(values == fmt.eot)
    e = np.searchsorted(eots, start)
    found = e < eots.size
    e_at = eots[np.minimum(e, max(eots.size - 1, 0))] if eots.size else start
    found &= e_at < nxt
    if conv.header_trained:
        start = hpos
    end = np.where(found, e_at + (1 if conv.eot_trained and not fmt.ends_at_next_role else 0), nxt)
    if conv.post_eot and conv.eot_trained and post.size:
        follows = found.copy()
        for t in post:
            follows &= (end < nxt) & (values[np.minimum(end, max(total - 1, 0))] == t)
            end = end + follows
    end = np.maximum(end, start)
    edges = np.zeros(total + 1, dtype=np.int64)
    np.add.at(edges, start, 1)
    np.add.at(edges, end, -1)
    mask[np.cumsum(edges[:-1]) > 0] = 1
    return values, offsets, mask



def _drop_final_role_token(values: np.ndarray, offsets: np.ndarray, fmt: Any) -> tuple[np.ndarray, np.ndarray]:
    """GLM: the role token a regenerated final turn stopped on (``<|user|>``) is no part of the turn, and
    the input's rows end with the turn's text: drop it from each row that ends in one (vectorized)."""
    n = offsets.size - 1
    if n == 0 or values.size == 0:
        return values, offsets
    lens = offsets[1:] - offsets[:-1]
    last = values[np.maximum(offsets[1:] - 1, 0)]
    drop = (lens > 0) & np.isin(last, np.asarray(fmt.turn_openers, dtype=values.dtype))
    if not drop.any():
        return values, offsets
    keep = np.ones(values.size, dtype=bool)
    keep[offsets[1:][drop] - 1] = False
    new_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens - drop, out=new_off[1:])
    return values[keep], new_off


def run_convention(regen: list[Path], ds: Any) -> tuple[Any, Convention | None]:
    """The chat format the runs used (run.json ``tokenizer``) and the input's masking convention: the
    ``conventions`` of the scan whose findings the run read (``summary.json`` beside them), else
    detected from the input's first rows. ``(None, None)`` when no run.json names a tokenizer: the
    shards' masks are then used as they are (0 over the prompt, 1 over the output). Raises
    ``InputError`` when the named tokenizer cannot be loaded."""
    from dqa.audit.template import load_template
    from dqa.errors import DqaError

    tokenizer = findings = None
    for d in regen:
        manifest = read_manifest(Path(d))
        if manifest is not None and manifest.tokenizer:
            tokenizer, findings = manifest.tokenizer, manifest.findings
            break
    if tokenizer is None:
        return None, None
    try:
        fmt = load_template(str(tokenizer), decode=False)
    except DqaError as exc:
        raise InputError(f"--regen {regen[0]}: the run's tokenizer {tokenizer} cannot be loaded ({exc}); merge masks the "
                         "regenerated samples with its chat format") from None
    if findings:
        from dqa.audit.scan_folder import SUMMARY_FILE, scan_folder_of

        summary = scan_folder_of(findings) / SUMMARY_FILE
        try:
            conv = json.loads(summary.read_text()).get("conventions")
        except (OSError, ValueError, AttributeError):
            conv = None
        if isinstance(conv, dict) and conv:
            return fmt, Convention.from_detected(conv, fmt, str(summary))
    return fmt, Convention.from_detected(_detect_conventions(ds, fmt), fmt, f"{ds.path} (first rows)")


def _detect_conventions(ds: Any, fmt: Any, rows: int = 4096) -> dict[str, Any]:
    """``detect_conventions`` over the input's first ``rows`` rows."""
    import polars as pl

    from dqa.audit.conventions import detect_conventions
    from dqa.audit.kernels import KernelTables, batch_metrics

    try:
        batch = next(iter(ds.batches(batch_rows=rows)))
    except StopIteration:
        return {}
    metrics = batch_metrics(batch, KernelTables.build(fmt))
    return detect_conventions(pl.DataFrame(metrics), fmt)

