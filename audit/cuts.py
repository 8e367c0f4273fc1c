"""Cuts with their cause: when the ``truncated`` rows (or turns) share one exact length, name the limit.

A tokenizer's ``max_length`` (SpecForge, TRL, LLaMA-Factory all have one) cuts every longer row at
the same token count, so the rows it cut end at exactly that length; a generation's ``max_new_tokens``
cuts every reply it stops at the same length, so the turns it cut are exactly that long. Either way
the truncated rows pile up on one value, which arbitrary early stops never do. That value is what a
user must change, so the scan says it in the terminal, ``summary.json`` (``truncation_cuts``) and the
reports: "66 of the 70 truncated rows end at exactly 2,048 tokens: a max_length cut at tokenization".

A length is reported when at least ``cut_min_rows`` truncated rows (turns) have it and they are at
least ``cut_min_share`` of the truncated ones (``truncated`` check parameters). Row lengths are looked
at first; the turns of rows already explained by a row-length cut are left out of the turn lengths.
"""

from __future__ import annotations

from typing import Any

import polars as pl

MAX_CUTS = 5  # lengths reported per kind, most rows first


def _dominant(lengths: pl.Series, min_rows: int, min_share: float) -> list[tuple[int, int]]:
    """``(length, count)`` of the values of ``lengths`` held by at least ``min_rows`` and ``min_share`` of them."""
    total = lengths.len()
    if total == 0:
        return []
    counts = lengths.value_counts(name="n").filter(pl.col("n") >= max(min_rows, 1))
    counts = counts.filter(pl.col("n") / total >= min_share).sort(["n", lengths.name], descending=[True, False]).head(MAX_CUTS)
    return [(int(v), int(n)) for v, n in counts.iter_rows()]


def truncation_cuts(metrics: pl.DataFrame, turns: pl.DataFrame | None, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The lengths that dominate the truncated samples and turns (see the module docstring).

    ``metrics``: the evaluated metrics table (``n_tokens``, ``truncated``); ``turns``: the evaluated turns
    table (``row``, ``span_start``, ``span_end``, ``truncated``) or None; ``params``: the check parameters.
    Returns a list of ``{kind, unit, tokens, count, of, share, text}``, ``kind`` ``max_length`` (rows that
    end at exactly ``tokens`` tokens) or ``max_new_tokens`` (turns whose region after the assistant header is
    exactly ``tokens`` tokens long), most rows first; empty when no length dominates.
    """
    p = params.get("truncated", {})
    min_rows, min_share = int(p.get("cut_min_rows", 5)), float(p.get("cut_min_share", 0.25))
    out: list[dict[str, Any]] = []
    cut_rows = metrics.filter(pl.col("truncated"))
    total = cut_rows.height
    explained: list[int] = []
    for length, n in _dominant(cut_rows["n_tokens"], min_rows, min_share):
        out.append({"kind": "max_length", "unit": "rows", "tokens": length, "count": n, "of": total, "share": n / total,
                    "text": f"{n:,} of the {total:,} truncated rows end at exactly {length:,} tokens: "
                            "a max_length cut at tokenization"})
        explained.append(length)
    if turns is not None and turns.height and "truncated" in turns.columns:
        cut_turns = turns.filter(pl.col("truncated"))
        if explained:  # the turns a row-length cut ended are that cut's, not the generation's
            rows = cut_rows.filter(pl.col("n_tokens").is_in(explained))["row"]
            cut_turns = cut_turns.filter(~pl.col("row").is_in(rows.implode()))
        t_total = turns.filter(pl.col("truncated")).height
        lengths = (cut_turns["span_end"] - cut_turns["span_start"]).alias("turn_tokens")
        for length, n in _dominant(lengths, min_rows, 0.0):
            if n / t_total < min_share:  # a share of every truncated turn
                break
            out.append({"kind": "max_new_tokens", "unit": "turns", "tokens": length, "count": n, "of": t_total,
                        "share": n / t_total,
                        "text": f"{n:,} of the {t_total:,} truncated turns are exactly {length:,} tokens long after the "
                                "assistant header: a max_new_tokens cut at generation"})
    return out
