"""Small datasets for the validate / gate / report tests, rendered with the real Qwen3 chat template.

``clean_rows`` are distinct thinking conversations; ``ok_mode_rows`` reproduce the incident
(thinking off, every answer "OK."); ``length_mismatch_row`` and ``misaligned_row`` break one
rule each. ``synthetic_metrics`` builds a metrics table with FORMATS.md's columns without a
tokenizer, for the fast unit tests.
"""

from __future__ import annotations

import random

import numpy as np
import polars as pl

from chatdata import conversation, render, write_parquet

WORDS = (
    "river mountain quantum garden lattice vector proof sequence harbor signal matrix ledger orbit prime theorem "
    "canvas engine cipher bridge forest glacier carbon neuron spectrum kernel tensor compiler socket packet vertex"
).split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def clean_rows(n: int, seed: int = 0, answer_words: int = 20) -> list[tuple[list[int], list[int]]]:
    """``n`` distinct, well-formed thinking samples."""
    rng = random.Random(seed)
    return [render(conversation(f"Question {seed}-{i}: {sentence(rng, 8)}", sentence(rng, 30), sentence(rng, answer_words)))
            for i in range(n)]


def ok_mode_rows(n: int, seed: int = 1, answer: str = "OK.") -> list[tuple[list[int], list[int]]]:
    """``n`` thinking-off samples that all answer ``answer`` (the degenerate 'OK.' incident)."""
    rng = random.Random(seed)
    return [render(conversation(f"Ask {seed}-{i}: {sentence(rng, 6)}", None, answer), enable_thinking=False) for i in range(n)]


def length_mismatch_row(seed: int = 2) -> tuple[list[int], list[int]]:
    ids, mask = render(conversation(f"Mismatch {seed}", sentence(random.Random(seed), 20), sentence(random.Random(seed + 1), 15)))
    return ids, mask[:-3]


def misaligned_row(seed: int = 3) -> tuple[list[int], list[int]]:
    """The mask also covers the user's text."""
    ids, mask = render(conversation(f"Misaligned {seed}", sentence(random.Random(seed), 20), sentence(random.Random(seed + 1), 15)))
    return ids, [1] * len(mask)


def write_set(path, rows, prefix: str = "s"):
    """Write rows as parquet with ids ``{prefix}{i}``; returns the path."""
    return write_parquet(path, rows, ids=[f"{prefix}{i}" for i in range(len(rows))])


def synthetic_metrics(n: int, seed: int = 0, **overrides) -> pl.DataFrame:
    """A clean metrics table with FORMATS.md's columns; ``overrides`` replace whole columns."""
    rng = np.random.default_rng(seed)
    sup = rng.integers(200, 3000, n)
    think = sup // 2
    cols = {
        "row": np.arange(n, dtype=np.int64),
        "id": [f"m{i}" for i in range(n)],
        "n_tokens": sup + 100,
        "n_mask": sup + 100,
        "supervised_tokens": sup,
        "content_tokens": sup - 6,
        "prompt_tokens": np.full(n, 100, dtype=np.int64),
        "thinking_tokens": think,
        "answer_tokens": sup - think - 6,
        "has_assistant": np.ones(n, bool),
        "think_present": np.ones(n, bool),
        "think_closed": np.ones(n, bool),
        "final_turn_closed": np.ones(n, bool),
        "last_supervised_eot": np.ones(n, bool),
        "misaligned_tokens": np.zeros(n, dtype=np.int64),
        "ngram_repeat_share": rng.random(n) * 0.05,
        "supervised_hash": rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64),
        "prompt_hash": rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64),
        "template_rows": np.ones(n, dtype=np.int64),
        "template_prompts": np.ones(n, dtype=np.int64),
    }
    for check in ("no_loss", "length_mismatch", "degenerate_template", "duplicate_response", "short_response",
                  "empty_thinking", "missing_thinking", "truncated", "repetition_loop", "mask_misaligned", "failed"):
        cols[check] = np.zeros(n, bool)
    cols.update(overrides)
    return pl.DataFrame(cols)
