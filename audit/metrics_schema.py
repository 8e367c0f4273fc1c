"""The metric columns, typed: one schema that the kernel, the checks, the scan's outputs and the
expectation suites' source (``dqa.expectations.source``) all read (FORMATS.md: ``metrics.parquet``,
``turns.parquet``).

Each column is a ``Metric``: its name, its polars dtype as written, one line on what it means,
and where it comes from (``kind``):

- ``kernel``: computed per batch by ``dqa.audit.kernels`` (a metrics table must hold these);
- ``convention``: per-sample facts about the masking convention, computed by the kernel too,
  written but not required of a metrics table;
- ``set``: set-level context added before the checks run (``dqa.audit.checks.prepare``);
- ``verdict``: the outcome of the checks (``failed``, ``primary_reason``, ``flagged_turns``), plus
  one boolean column per check (``metrics_table_schema``).

A check declares the metrics it needs by these names (``Check.needs`` over ``SAMPLE_METRICS``,
``Check.turn_needs`` over ``TURN_METRICS``); ``tests/test_check_declarations.py`` holds them to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The polars dtypes, by name: this module is the kernel's schema too, and the scan's workers run the kernel
# without importing polars (the scan's process imports it while they work: dqa.audit.scan).
_NUMPY = {"Int64": np.int64, "Int32": np.int32, "Int8": np.int8, "UInt64": np.uint64, "Float64": np.float64,
          "Boolean": np.bool_}


@dataclass(frozen=True)
class Metric:
    """One typed column of a metrics table; ``dtype_name`` names its polars dtype (``dtype``)."""

    name: str
    dtype_name: str
    meaning: str
    kind: str = "kernel"  # kernel | convention | set | verdict
    nullable: bool = False

    @property
    def dtype(self):
        """The polars dtype the column is written in (``pl.Int64``, ...)."""
        import polars as pl

        return getattr(pl, self.dtype_name)

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype the kernel computes this column in."""
        return np.dtype(_NUMPY[self.dtype_name])


I64, I32, I8, U64, F64, BOOL, STR = "Int64", "Int32", "Int8", "UInt64", "Float64", "Boolean", "String"

# One row per sample (metrics.parquet, after ``row`` and ``id``).
SAMPLE_METRICS: tuple[Metric, ...] = (
    Metric("n_tokens", I64, "length of input_ids"),
    Metric("n_mask", I64, "length of the loss_mask / labels list"),
    Metric("supervised_tokens", I64, "tokens with loss (mask 1 / label != -100)"),
    Metric("content_tokens", I64, "supervised tokens that are not template boilerplate"),
    Metric("prompt_tokens", I64, "tokens before the final assistant turn's content (its header included)"),
    Metric("thinking_tokens", I64, "non-boilerplate tokens inside the final assistant turn's think block"),
    Metric("answer_tokens", I64, "supervised content tokens of the final turn after </think>"),
    Metric("has_assistant", BOOL, "an assistant header of the chat format exists"),
    Metric("think_present", BOOL, "the final assistant turn opens <think>"),
    Metric("think_closed", BOOL, "... and closes it with </think>"),
    Metric("final_turn_closed", BOOL, "the final assistant turn ends with the end-of-turn token"),
    Metric("last_supervised_eot", BOOL, "the last supervised token is (or sits right after) the end of turn"),
    Metric("misaligned_tokens", I64, "supervised tokens outside assistant turns (assistant headers included unless most samples "
           "train their headers), plus labels that differ from the input id"),
    Metric("ngram_repeat_share", F64, "share of the supervised 8-grams that repeat an earlier one in the sample"),
    Metric("loop_tokens", I64, "the longest repeated stretch of the supervised tokens: a run of consecutive sampled 8-grams "
           "that each occur more than once in the sample, in tokens (0: none)"),
    Metric("supervised_hash", U64, "64-bit hash of the supervised token sequence (0 when nothing is supervised)"),
    Metric("prompt_hash", U64, "64-bit hash of the unsupervised tokens"),
    Metric("assistant_turns", I64, "assistant headers in the sample", "convention"),
    Metric("trained_turns", I64, "assistant turns with any supervised token", "convention"),
    Metric("post_eot_trained", I8, "the token after the final turn's trained end of turn is trained (1/0; -1 n/a)", "convention"),
    Metric("think_open_trained", I8, "the <think> opening the final turn is trained (1/0; -1 n/a)", "convention"),
    Metric("header_trained", I8, "a trained assistant turn's header holds a trained token (1/0; -1: no trained turn)", "convention"),
    Metric("header_trained_tokens", I64, "trained tokens of the assistant headers (in misaligned_tokens unless most samples "
           "train their headers)", "convention"),
    Metric("eot_trained", I8, "every closed trained assistant turn's end-of-turn token is trained (1/0; -1: no closed trained turn)",
           "convention"),
    Metric("template_rows", I64, "samples sharing this sample's supervised tokens", "set"),
    Metric("template_prompts", I64, "distinct prompts among the samples sharing its supervised tokens", "set"),
    Metric("flagged_turns", I64, "how many of the sample's trained turns some check flags", "verdict"),
    Metric("failed", BOOL, "any check flags the sample", "verdict"),
    Metric("primary_reason", STR, "the check that explains the sample best (null when it passes)", "verdict", nullable=True),
)

# One row per trained assistant turn (turns.parquet, before ``reasons``), in row then turn order.
TURN_METRICS: tuple[Metric, ...] = (
    Metric("row", I64, "0-based dataset row of the sample"),
    Metric("turn", I32, "0-based index among the sample's assistant turns (trained or not)"),
    Metric("span_start", I64, "the turn's region in the row: first token after its assistant header"),
    Metric("span_end", I64, "... and one past its end of turn and what the template puts after it (cut at the next role token)"),
    Metric("supervised_tokens", I64, "trained tokens in the turn's region"),
    Metric("content_tokens", I64, "trained tokens of the turn that are not template boilerplate"),
    Metric("thinking_tokens", I64, "non-boilerplate tokens inside the turn's think block"),
    Metric("think_present", BOOL, "the turn opens <think> (also in an untrained header)"),
    Metric("think_closed", BOOL, "... and closes it"),
    Metric("turn_closed", BOOL, "the turn ends with end of turn before the next role token"),
    Metric("last_supervised_eot", BOOL, "the turn's trained span ends at end of turn (or what the template puts after it)"),
    Metric("final_turn", BOOL, "the sample's last assistant turn"),
    Metric("keeps_reasoning", BOOL, "the template keeps this turn's think block (the final turn; every turn unless it drops history "
           "reasoning; then still the turns no real user message follows: tool-calling turns)"),
    Metric("ngram_repeat_share", F64, "share of the turn's supervised 8-grams that repeat an earlier one in the turn"),
    Metric("loop_tokens", I64, "the longest repeated stretch of the turn's supervised tokens, in tokens (0: none)"),
    Metric("supervised_hash", U64, "64-bit hash of the turn's supervised tokens (the span hash)"),
    Metric("prompt_hash", U64, "64-bit hash of the conversation before the turn (its prompt: untrained and trained tokens)"),
    Metric("template_rows", I64, "trained turns in the set sharing this turn's supervised tokens", "set"),
    Metric("template_prompts", I64, "distinct prompts (prompt_hash) among them", "set"),
)

SAMPLE: dict[str, Metric] = {m.name: m for m in SAMPLE_METRICS}
TURN: dict[str, Metric] = {m.name: m for m in TURN_METRICS}


def names(metrics: tuple[Metric, ...], *kinds: str) -> tuple[str, ...]:
    """The names of ``metrics`` of the given kinds, in schema order."""
    return tuple(m.name for m in metrics if m.kind in kinds)


def metrics_table_schema() -> dict[str, Metric]:
    """Every column of ``metrics.parquet`` but ``row`` and ``id``: ``SAMPLE_METRICS`` plus one boolean
    verdict column per check (``dqa.audit.checks.CHECK_NAMES``)."""
    from dqa.audit.checks import CHECK_NAMES

    out = dict(SAMPLE)
    for name in CHECK_NAMES:
        out[name] = Metric(name, BOOL, f"the {name} check flags the sample", "verdict")
    return out
