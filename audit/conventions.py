"""What a dataset's samples show about its chat format: a wrong tokenizer, and the masking conventions.

``check_format_fits`` refuses a tokenizer whose assistant header most supervised samples of the
first batches lack (the data was made with another chat format). ``detect_conventions`` sums
the kernel's per-sample convention columns (``kernels.CONVENTION_COLUMNS``) into the scan
summary's ``conventions``; ``conventions_line`` says them in one terminal line.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dqa.audit.chat_format import ChatFormat
from dqa.errors import InputError

WRONG_TOKENIZER_SHARE = 0.5
WRONG_TOKENIZER_MIN_ROWS = 8


def check_format_fits(has_assistant: np.ndarray, supervised: np.ndarray, fmt: ChatFormat, dataset: str) -> None:
    """Refuse a tokenizer whose assistant header is absent from most samples that have supervised tokens.

    Called on the first batch(es) of a scan: more than ``WRONG_TOKENIZER_SHARE`` of at least
    ``WRONG_TOKENIZER_MIN_ROWS`` supervised rows without the header means the data was made
    with another chat format. Raises ``InputError`` (one line: the tokenizer, the share, the fix).
    """
    sup = supervised > 0
    rows = int(sup.sum())
    if rows < WRONG_TOKENIZER_MIN_ROWS:
        return
    missing = int((sup & ~has_assistant).sum())
    share = missing / rows
    if share > WRONG_TOKENIZER_SHARE:
        header = fmt.decode(fmt.assistant_header)
        raise InputError(
            f"{dataset}: {share:.0%} of the first {rows:,} samples with supervised tokens have no assistant header of "
            f"tokenizer {fmt.name} ({header!r}): the data was made with another chat format; "
            f"give --tokenizer the tokenizer folder of the model that made the data"
        )


# ----------------------------------------------------------------------------- conventions


def _share(values, applies) -> float | None:
    n = int(applies.sum())
    return None if n == 0 else float((values & applies).sum()) / n


def detect_conventions(metrics, fmt: ChatFormat) -> dict[str, Any]:
    """The dataset's masking conventions, from the per-sample convention columns (``kernels.CONVENTION_COLUMNS``).

    Returns ``format`` (``ChatFormat.describe()``) and, each None when no sample shows it:
    ``post_eot_trained`` (the token the template puts after end of turn, ChatML's newline, is
    trained after a trained end of turn: SpecForge, TRL, LLaMA-Factory) with its share;
    ``header_includes_think`` (a ``<think>`` opening the final turn is left untrained, as by
    SpecForge's ``qwen3.5``/``qwen3-next-thinking`` headers ``<|im_start|>assistant\\n<think>\\n``)
    with the share; ``trained_turns``: ``"all"`` or ``"last"`` (90% of the multi-turn samples
    train every assistant turn / exactly one), else ``"mixed"``, with ``multi_turn_samples``;
    ``header_trained`` (at least half the samples with a trained turn train its assistant header, as
    TRL's DeepSeek V3 template trains ``<｜Assistant｜>``: the scan then sets trained header tokens aside
    from ``misaligned_tokens``) with its share; ``eot_trained`` (at least half the samples with a
    closed trained turn train every such turn's end-of-turn token; False: the model is not taught to
    stop, as with axolotl's ``train_on_eos: none``) with its share.
    """
    import polars as pl

    out: dict[str, Any] = {"format": fmt.describe()}
    cols = set(metrics.columns)
    if "post_eot_trained" in cols:
        v = metrics["post_eot_trained"].to_numpy()
        share = _share(v == 1, v >= 0)
        out["post_eot_trained"] = None if share is None else share >= 0.5
        out["post_eot_trained_share"] = share
    if "think_open_trained" in cols:
        v = metrics["think_open_trained"].to_numpy()
        share = _share(v == 0, v >= 0)
        out["header_includes_think"] = None if share is None else share >= 0.5
        out["header_includes_think_share"] = share
    for col in ("header_trained", "eot_trained"):
        if col in cols:
            v = metrics[col].to_numpy()
            share = _share(v == 1, v >= 0)
            out[col] = None if share is None else share >= 0.5
            out[f"{col}_share"] = share
    if {"assistant_turns", "trained_turns"} <= cols:
        multi = metrics.filter((pl.col("assistant_turns") >= 2) & (pl.col("supervised_tokens") > 0))
        out["multi_turn_samples"] = multi.height
        if multi.height == 0:
            out["trained_turns"] = None
        else:
            all_share = float((multi["trained_turns"] == multi["assistant_turns"]).mean())  # type: ignore[arg-type]
            last_share = float((multi["trained_turns"] == 1).mean())  # type: ignore[arg-type]
            out["trained_turns"] = "all" if all_share >= 0.9 else "last" if last_share >= 0.9 else "mixed"
            out["trained_turns_share_all"] = all_share
            out["trained_turns_share_last"] = last_share
    return out


def conventions_line(conventions: dict[str, Any]) -> str | None:
    """One line for the terminal: the assistant header and the masking conventions found (None: nothing to say)."""
    if not conventions:
        return None
    fmt = conventions.get("format") or {}
    parts = []
    if fmt.get("assistant_header"):
        parts.append(f"header {fmt['assistant_header']!r}")
    if conventions.get("header_trained"):
        parts.append("header trained")
    if conventions.get("eot_trained") is False:  # not a per-row finding: one setting of the tool (axolotl's train_on_eos: none)
        parts.append(f"end of turn {fmt.get('end_of_turn') or ''} untrained: the model will not learn to stop".replace("  ", " "))
    post, after, eot = conventions.get("post_eot_trained"), fmt.get("after_end_of_turn") or "", fmt.get("end_of_turn") or ""
    if post is not None and after:
        parts.append(f"trains {after!r} after {eot}" if post else f"{after!r} after {eot} untrained")
    if fmt.get("turn_end", "").startswith("the next role token"):  # GLM: no end-of-turn token of its own
        parts.append("a turn ends at the next role token or the end of the text")
    think = conventions.get("header_includes_think")
    if think is not None:
        tag = (fmt.get("think_tags") or ["<think>"])[0]  # the template's own (MiniMax-M3: <mm:think>)
        parts.append(f"{tag} in the untrained header" if think else f"{tag} trained")
    turns = conventions.get("trained_turns")
    if turns is not None:
        what = {"all": "all assistant turns trained", "last": "last assistant turn only"}.get(turns, "some assistant turns trained")
        parts.append(f"{what} ({conventions.get('multi_turn_samples', 0):,} multi-turn)")
    return "conventions: " + " · ".join(parts) if parts else None
