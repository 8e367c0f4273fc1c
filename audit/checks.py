"""The named checks: each a small rule over the per-sample metrics table (and, for the checks that
judge turns, over the per-turn table).

A check is data and self-contained: a stable name, one sentence on what it flags, why that hurts
training, its priority (which check explains a sample best when several flag it), the metrics it
needs (names of the typed schema ``dqa.audit.metrics_schema``, which the expectation suites' source
reads too), its thresholds with defaults, and a vectorized polars expression. The CLI (``dqa scan
--list-checks``), the reports and the expectation suites all read ``CHECKS``; nothing else lists
the checks. Thresholds are overridden by a TOML config (``[checks.NAME] param = value``) or
``--set NAME.param=value``.

Set-level context comes first (``prepare``, ``prepare_turns``): how many samples (turns) share each
supervised-token hash, how many distinct prompts each shared response has, and whether thinking
is expected in this set.

The metrics come from the chat format read from the tokenizer's own template
(``dqa.audit.chat_format``): turns are delimited by its role tokens, the assistant
header is its token sequence, and a trained span may end in end-of-turn followed by
the template's own tokens after it (ChatML's ``\n``, which SpecForge, TRL and
LLaMA-Factory train). A ``<think>`` in an untrained header (SpecForge's ``qwen3.5``:
``<|im_start|>assistant\n<think>\n``) still opens the turn's think block.

Every trained assistant turn is checked (SpecForge, TRL, LLaMA-Factory and axolotl train every
assistant turn by default). A check with a ``turn_rule`` also judges each trained turn, on the
per-turn table of the kernel (``kernels.TURN_COLUMNS``, one row per trained turn, written as
``turns.parquet``), and flags a sample when its sample ``rule`` or the ``turn_rule`` of any of its
turns does:

- ``degenerate_template`` counts the turns that share a span hash (the turn's supervised tokens)
  across the set, so an "OK." in turn 1 of 3 is found, and a canned final turn after a real first one;
- ``duplicate_response`` flags a turn whose span hash other turns share under a different prompt,
  below the degenerate threshold. A turn's prompt is the conversation before it (the row's tokens
  before the turn's span, its header included, untrained and trained ones each hashed in order:
  the history it answers, not only the last question), so one reply to "Can you elaborate?" after
  two different conversations is a duplicate, while the same conversation stored twice is not;
- ``short_response`` counts each turn's content, and ``repetition_loop`` each turn's repeated 8-grams
  (a loop in one turn of three is not diluted by the others) and its longest repeated stretch (a 6K-token
  loop inside a 22K-token thought is a quarter of the turn, but 6K tokens of loop);
- the thinking checks look at each turn's think block (``missing_thinking`` only on turns whose
  think block the template keeps: Qwen3 drops the reasoning of history turns, those before the last
  real user message; the tool-calling turns after it, followed only by tool results, keep theirs);
- ``truncated`` asks each trained turn to close.

``no_loss``, ``length_mismatch`` and ``mask_misaligned`` judge the whole sample (they are about the
row's mask, not a turn). A trained assistant header is misaligned unless at least half the samples
with a trained turn train their header (TRL's DeepSeek V3 template trains ``<｜Assistant｜>``): then
the scan takes it for the set's convention and sets those tokens aside (``scan_results.set_aside_trained_headers``).
An end of turn left untrained in every turn (axolotl's ``train_on_eos: none``) is no finding: the trained
span still ends at end of turn; the conventions (``eot_trained``) report it, loudly. The flagged turns' indices go to ``findings.parquet`` (``turns``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from dqa.errors import InputError
from dqa.lazy_import import lazy_module

if TYPE_CHECKING:
    import polars as pl
else:  # imported on first use: the scan checks its options with this module before its workers start, and
    pl = lazy_module("polars")  # imports polars while they work (dqa.audit.scan)


@dataclass(frozen=True)
class Context:
    """Set-level facts a rule may use."""

    rows: int
    thinking_expected: bool
    params: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Check:
    """A named, documented, vectorized rule, self-contained: everything the scan, the reports and the
    suites need to know about it is here.

    ``label`` is a few words for tables; ``flags_when`` the full sentence; ``why`` the harm to training.
    ``priority``: which check explains a sample best when several flag it, lowest number first
    (``primary_reason`` is the flagging check with the lowest number; reports rank by it): a
    degenerate "OK." sample is also short and has empty thinking, but the template is the root cause.
    Every check has its own number.
    ``rule(ctx)`` returns a boolean polars expression over the per-sample metrics table and reads
    only the columns named in ``needs`` (``metrics_schema.SAMPLE_METRICS``); ``turn_rule(ctx)``, when
    set, one over the per-turn table reading only ``turn_needs`` (``metrics_schema.TURN_METRICS``):
    such a check also judges each trained turn.
    """

    name: str
    label: str
    flags_when: str
    why: str
    priority: int
    needs: tuple[str, ...]
    rule: Callable[[Context], pl.Expr]
    defaults: dict[str, Any] = field(default_factory=dict)
    turn_needs: tuple[str, ...] = ()
    turn_rule: Callable[[Context], pl.Expr] | None = None  # over the per-turn table; None: whole-sample check


def _p(ctx: Context, check: str, key: str) -> Any:
    return ctx.params[check][key]


def _degenerate_min_rows(ctx: Context) -> int:
    p = ctx.params["degenerate_template"]
    return max(int(p["min_rows"]), math.ceil(float(p["min_share"]) * ctx.rows))


def _sup() -> pl.Expr:
    """The sample (turn) has supervised tokens."""
    return pl.col("supervised_tokens") > 0


def _degenerate(ctx: Context) -> pl.Expr:
    return _sup() & (pl.col("template_rows") >= _degenerate_min_rows(ctx))


def _duplicate(ctx: Context) -> pl.Expr:
    """Shared supervised tokens (a sample's, or a turn's) under at least two distinct prompts, below the degenerate threshold."""
    return (
        _sup()
        & (pl.col("template_rows") >= 2)
        & (pl.col("template_prompts") >= 2)
        & (pl.col("template_rows") < _degenerate_min_rows(ctx))
    )


def _short(ctx: Context) -> pl.Expr:
    return _sup() & (pl.col("content_tokens") < _p(ctx, "short_response", "min_content_tokens"))


def _empty_thinking(ctx: Context) -> pl.Expr:
    return pl.lit(ctx.thinking_expected) & _sup() & pl.col("think_present") & pl.col("think_closed") & (pl.col("thinking_tokens") == 0)


def _loop(ctx: Context) -> pl.Expr:
    """A repeated 8-gram dominates the text (its share), or one repeated stretch is long whatever else the text holds."""
    dominated = (pl.col("content_tokens") >= _p(ctx, "repetition_loop", "min_tokens")) & (
        pl.col("ngram_repeat_share") >= _p(ctx, "repetition_loop", "min_repeat_share")
    )
    return dominated | (pl.col("loop_tokens") >= _p(ctx, "repetition_loop", "min_loop_tokens"))


_TEMPLATE = ("supervised_tokens", "template_rows")
_THINK = ("supervised_tokens", "think_present", "think_closed", "thinking_tokens")

CHECKS: tuple[Check, ...] = (
    Check(
        name="no_loss",
        label="all-zero loss mask",
        flags_when="nothing is supervised (an all-zero loss mask, or every label -100)",
        why="the sample costs a forward pass and teaches nothing; often a masking bug",
        priority=20,
        needs=("supervised_tokens", "n_mask", "n_tokens"),
        rule=lambda ctx: (pl.col("supervised_tokens") == 0) & (pl.col("n_mask") == pl.col("n_tokens")),
    ),
    Check(
        name="length_mismatch",
        label="mask length differs from input_ids",
        flags_when="the loss mask / labels list is not as long as input_ids",
        why="trainers either crash or silently shift the mask against the tokens",
        priority=10,
        needs=("n_mask", "n_tokens"),
        rule=lambda ctx: pl.col("n_mask") != pl.col("n_tokens"),
    ),
    Check(
        name="degenerate_template",
        label="one canned response across the set",
        flags_when="its supervised tokens, or a trained turn's, recur identical across a large share of the set",
        why="the model learns one canned answer (the 'OK.' mode of thinking-off generation)",
        priority=30,
        needs=_TEMPLATE,
        rule=_degenerate,
        defaults={"min_share": 0.01, "min_rows": 10},
        turn_needs=_TEMPLATE,
        turn_rule=_degenerate,  # counts the trained turns that share a span hash across the set
    ),
    Check(
        name="duplicate_response",
        label="same response as a different prompt",
        flags_when="its supervised tokens, or a trained turn's, equal another sample's or turn's that follows a different "
        "prompt (the conversation before it), below the degenerate threshold",
        why="the same answer for different questions teaches the model to ignore the prompt",
        priority=70,
        needs=(*_TEMPLATE, "template_prompts"),
        rule=_duplicate,
        turn_needs=(*_TEMPLATE, "template_prompts"),
        turn_rule=_duplicate,
    ),
    Check(
        name="short_response",
        label="almost no supervised content",
        flags_when="too few supervised content tokens (in a trained turn) once template boilerplate (think tags, "
        "blank lines, end of turn) is set aside",
        why="a handful of supervised tokens gives the drafter almost nothing to learn from",
        priority=100,
        needs=("supervised_tokens", "content_tokens"),
        rule=_short,
        defaults={"min_content_tokens": 10},
        turn_needs=("supervised_tokens", "content_tokens"),
        turn_rule=_short,
    ),
    Check(
        name="empty_thinking",
        label="empty <think></think> block",
        flags_when="a trained assistant turn's think block is present but empty, in a set where thinking is expected",
        why="teaches the model to skip reasoning: the signature of generation with thinking mode off",
        priority=80,
        needs=_THINK,
        rule=_empty_thinking,
        turn_needs=_THINK,
        turn_rule=_empty_thinking,
    ),
    Check(
        name="missing_thinking",
        label="no think block in a trained turn",
        flags_when="a trained assistant turn whose think block the template keeps (the final turn; every turn unless the "
        "template drops history reasoning, as Qwen3's does, and then still the turns after the last user message: "
        "tool-calling turns, followed only by tool results) has none, in a set where thinking is expected",
        why="a reasoning model trained on answers without reasoning loses its thinking mode",
        priority=90,
        needs=("supervised_tokens", "has_assistant", "think_present"),
        rule=lambda ctx: pl.lit(ctx.thinking_expected) & _sup() & pl.col("has_assistant") & ~pl.col("think_present"),
        turn_needs=("supervised_tokens", "keeps_reasoning", "think_present"),
        turn_rule=lambda ctx: pl.lit(ctx.thinking_expected) & _sup() & pl.col("keeps_reasoning") & ~pl.col("think_present"),
    ),
    Check(
        name="truncated",
        label="does not end with end-of-turn",
        flags_when="the supervised span of a trained turn (or of the sample) does not end in the end-of-turn token (or in what "
        "the template puts right after it, ChatML's newline), or the turn or its think block never closes",
        why="the model learns to stop mid-thought; length-capped generations counted as good",
        priority=60,
        needs=("supervised_tokens", "last_supervised_eot", "has_assistant", "final_turn_closed", "think_present", "think_closed"),
        rule=lambda ctx: _sup()
        & (
            ~pl.col("last_supervised_eot")
            | (pl.col("has_assistant") & ~pl.col("final_turn_closed"))
            | (pl.col("think_present") & ~pl.col("think_closed"))
        ),
        turn_needs=("supervised_tokens", "last_supervised_eot", "turn_closed", "think_present", "think_closed"),
        turn_rule=lambda ctx: _sup()
        & (~pl.col("last_supervised_eot") | ~pl.col("turn_closed") | (pl.col("think_present") & ~pl.col("think_closed"))),
        # Not thresholds of the rule: when this many truncated rows (turns), and this share of them, end at one
        # length, the scan names the cut (dqa.audit.cuts: a max_length cut at tokenization, max_new_tokens at generation).
        defaults={"cut_min_rows": 5, "cut_min_share": 0.25},
    ),
    Check(
        name="repetition_loop",
        label="a repeated n-gram dominates",
        flags_when="the supervised text (of the sample, or of a trained turn) is dominated by a repeated n-gram (a thinking loop), "
        "or holds a repeated stretch of at least min_loop_tokens tokens (a long loop inside a longer thought)",
        why="loops teach the model to loop; they also burn the token budget of the sample",
        priority=50,
        needs=("content_tokens", "ngram_repeat_share", "loop_tokens"),
        rule=_loop,
        defaults={"min_tokens": 128, "min_repeat_share": 0.5, "min_loop_tokens": 1024},
        turn_needs=("content_tokens", "ngram_repeat_share", "loop_tokens"),
        turn_rule=_loop,
    ),
    Check(
        name="mask_misaligned",
        label="loss on headers, user or system text",
        flags_when="supervised tokens fall outside assistant turns (chat headers, system or user text; a turn runs from its header "
        "through its end-of-turn token and what the template puts after it), or labels differ from input_ids; a trained "
        "assistant header counts unless most samples train theirs (TRL's DeepSeek V3 template: the set's convention)",
        why="the model is trained to write the user's side or the template itself",
        priority=40,
        needs=("misaligned_tokens",),
        rule=lambda ctx: pl.col("misaligned_tokens") > _p(ctx, "mask_misaligned", "max_tokens"),
        defaults={"max_tokens": 0},
    ),
)

CHECK_NAMES: tuple[str, ...] = tuple(c.name for c in CHECKS)
BY_NAME: dict[str, Check] = {c.name: c for c in CHECKS}

# Set-level switches that are not tied to one check.
GLOBAL_DEFAULTS: dict[str, Any] = {"thinking_min_share": 0.05}


def selected_checks(only: list[str] | None, skip: list[str]) -> list[str]:
    """The checks to run: ``only`` (default all) minus ``skip``, in ``only``'s order; may be empty. Raises
    ``InputError`` for an unknown check."""
    wanted = only or list(CHECK_NAMES)
    for name in [*wanted, *skip]:
        if name not in BY_NAME:
            raise InputError(f"unknown check {name!r} (known: {', '.join(CHECK_NAMES)})")
    return [n for n in wanted if n not in set(skip)]


def default_params() -> dict[str, dict[str, Any]]:
    """Every check's thresholds (a fresh copy), plus ``"scan"`` for set-level switches."""
    params = {c.name: dict(c.defaults) for c in CHECKS}
    params["scan"] = dict(GLOBAL_DEFAULTS)
    return params


def apply_overrides(params: dict[str, dict[str, Any]], overrides: dict[str, dict[str, Any]], origin: str) -> None:
    """Merge ``{check: {param: value}}`` into ``params`` in place, keeping each default's type.

    Raises ``InputError`` (naming ``origin``) for an unknown check or parameter or a value of the wrong type.
    """
    for check, values in overrides.items():
        if check not in params:
            raise InputError(f"{origin}: unknown check {check!r} (known: {', '.join(params)})")
        if not isinstance(values, dict):
            raise InputError(f"{origin}: [{'checks.' + check}] must be a table of parameters")
        for key, value in values.items():
            if key not in params[check]:
                known = ", ".join(params[check]) or "none"
                raise InputError(f"{origin}: check {check!r} has no parameter {key!r} (parameters: {known})")
            default = params[check][key]
            try:
                params[check][key] = type(default)(value) if not isinstance(value, bool) else value
            except (TypeError, ValueError):
                raise InputError(f"{origin}: {check}.{key} must be a {type(default).__name__}, got {value!r}") from None


def parse_set(items: list[str]) -> dict[str, dict[str, Any]]:
    """Parse ``--set check.param=value`` items into an overrides mapping (values as float or int).

    Raises ``InputError`` for items not shaped ``name.param=value``.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        check, dot, param = key.strip().partition(".")
        if not sep or not dot or not check or not param:
            raise InputError(f"--set {item!r}: expected CHECK.PARAM=VALUE, e.g. short_response.min_content_tokens=5")
        try:
            value: Any = int(raw) if raw.strip().lstrip("-").isdigit() else float(raw)
        except ValueError:
            raise InputError(f"--set {item!r}: value must be a number") from None
        out.setdefault(check, {})[param] = value
    return out


def load_config(path: str) -> dict[str, dict[str, Any]]:
    """Read a TOML config's ``[checks.NAME]`` tables (and ``[scan]``) as overrides.

    Raises ``InputError`` when the file is missing or not valid TOML.
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise InputError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: invalid TOML ({exc})") from None
    overrides = dict(data.get("checks", {}))
    if "scan" in data:
        overrides["scan"] = data["scan"]
    unknown = set(data) - {"checks", "scan"}
    if unknown:
        raise InputError(f"{path}: unknown section(s) {', '.join(sorted(unknown))} (expected [checks.NAME] and [scan])")
    return overrides


def prepare(metrics: pl.DataFrame) -> pl.DataFrame:
    """Add set-level columns: ``template_rows`` (samples sharing the supervised hash) and
    ``template_prompts`` (distinct prompts among them); 0 for unsupervised samples."""
    return _templates_of(metrics)


def prepare_turns(turns: pl.DataFrame) -> pl.DataFrame:
    """The per-turn table (``kernels.TURN_COLUMNS``) with the set-level ``template_rows`` (trained turns
    sharing the turn's span hash, across the set) and ``template_prompts`` (distinct prompts, the
    turns' ``prompt_hash``: the conversation before each turn, among them)."""
    return _templates_of(turns)


def _templates_of(table: pl.DataFrame) -> pl.DataFrame:
    """``table`` with ``template_rows`` and ``template_prompts`` over its supervised units (window functions over
    the supervised hash: half the time of a group-by joined back); 0 for units with nothing supervised."""
    supervised = pl.col("supervised_tokens") > 0
    key = pl.when(supervised).then(pl.col("supervised_hash"))
    return table.with_columns(
        pl.when(supervised).then(pl.len().over(key)).otherwise(0).cast(pl.Int64).alias("template_rows"),
        pl.when(supervised).then(pl.col("prompt_hash").n_unique().over(key)).otherwise(0).cast(pl.Int64)
        .alias("template_prompts"),
    )


def infer_thinking(metrics: pl.DataFrame, min_share: float) -> tuple[bool, float]:
    """Whether thinking is expected: the share of supervised assistant samples whose final turn
    has non-empty thinking reaches ``min_share``. Returns ``(expected, share)``."""
    base = metrics.filter(pl.col("has_assistant") & (pl.col("supervised_tokens") > 0))
    if base.height == 0:
        return False, 0.0
    share = float((base["thinking_tokens"] > 0).mean())  # type: ignore[arg-type]
    return share >= min_share, share


TURN_CHECKS: tuple[str, ...] = tuple(c.name for c in CHECKS if c.turn_rule is not None)


def evaluate_turns(turns: pl.DataFrame, ctx: Context, only: list[str] | None = None) -> pl.DataFrame:
    """Add one boolean column per check with a ``turn_rule`` (False for checks not in ``only``) and
    ``failed`` to the per-turn table (``prepare_turns``'s output)."""
    selected = set(CHECK_NAMES) if only is None else set(only)
    exprs = [
        (c.turn_rule(ctx) if c.name in selected and c.turn_rule is not None else pl.lit(False)).fill_null(False).alias(c.name)
        for c in CHECKS
        if c.turn_rule is not None
    ]
    out = turns.with_columns(exprs)
    return out.with_columns(pl.any_horizontal([pl.col(n) for n in TURN_CHECKS]).alias("failed"))


def with_reasons(frame: pl.DataFrame, names: tuple[str, ...] | list[str], alias: str = "reasons") -> pl.DataFrame:
    """``frame`` plus a ``list<string>`` column ``alias``: the names, among ``names``, of its boolean
    check columns that are true (in ``names`` order).

    The true checks are packed into one integer per row, and each distinct combination (a few,
    never more than the rows) gets its list once, joined back on that integer: building the lists
    row by row in polars costs far more on a large table.
    """
    code = pl.sum_horizontal([pl.col(n).cast(pl.UInt32) * (1 << k) for k, n in enumerate(names)]).alias("_reasons_code")
    out = frame.with_columns(code)
    codes = out["_reasons_code"].unique().sort().to_list()
    lists = pl.DataFrame(
        {"_reasons_code": codes, alias: [[n for k, n in enumerate(names) if c >> k & 1] for c in codes]},  # per combination
        schema={"_reasons_code": pl.UInt32, alias: pl.List(pl.String)},
    )
    return out.join(lists, on="_reasons_code", how="left", maintain_order="left").drop("_reasons_code")


def priority_order() -> tuple[str, ...]:
    """The check names by ``Check.priority``, the one that explains a sample best first (ties by name)."""
    return tuple(c.name for c in sorted(CHECKS, key=lambda c: (c.priority, c.name)))


def evaluate(metrics: pl.DataFrame, ctx: Context, only: list[str] | None = None, turns: pl.DataFrame | None = None) -> pl.DataFrame:
    """Add one boolean column per check (False for checks not in ``only``; None means all) and ``failed``.

    ``metrics`` must already carry the columns of ``prepare``. With ``turns`` (``evaluate_turns``'s
    output) a check with a turn rule also flags the samples with a flagged turn, and two columns
    are added: ``flagged_turns`` (how many of the sample's turns some check flags) and ``turns``
    (their indices, a sorted list).
    """
    selected = set(CHECK_NAMES) if only is None else set(only)
    exprs = [
        (c.rule(ctx) if c.name in selected else pl.lit(False)).fill_null(False).alias(c.name) for c in CHECKS
    ]
    out = metrics.with_columns(exprs)
    if turns is not None:
        per_row = turns.filter(pl.col("failed")).group_by("row").agg(
            *[pl.col(n).any().alias(f"_turn_{n}") for n in TURN_CHECKS],
            pl.col("turn").sort().alias("turns"),
        )
        out = out.join(per_row, on="row", how="left", maintain_order="left")
        out = out.with_columns(
            *[(pl.col(n) | pl.col(f"_turn_{n}").fill_null(False)).alias(n) for n in TURN_CHECKS],
            pl.col("turns").fill_null(pl.lit([], dtype=pl.List(pl.Int32))).cast(pl.List(pl.Int32)),
        ).drop([f"_turn_{n}" for n in TURN_CHECKS])
        out = out.with_columns(pl.col("turns").list.len().cast(pl.Int64).alias("flagged_turns"))
    primary = pl.lit(None, dtype=pl.String)
    for name in reversed(priority_order()):
        primary = pl.when(pl.col(name)).then(pl.lit(name)).otherwise(primary)
    return out.with_columns(
        pl.any_horizontal([pl.col(n) for n in CHECK_NAMES]).alias("failed"), primary.alias("primary_reason")
    )
