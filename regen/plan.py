"""Budget a regeneration before renting GPUs: total tokens, wall time, GPU-hours and cost.

The arithmetic is deliberately plain (the seed's own numbers must come out)::

    total_tokens = samples * avg_output_tokens
    tok_per_s    = gpus * tok_per_gpu            (or given as a fleet total,
                 = req_per_s * avg_output_tokens   or from a measured request rate)
    wall_s       = total_tokens / tok_per_s
    gpu_hours    = gpus * wall_s / 3600
    cost         = gpu_hours * gpu_hour_cost     (price per GPU-hour; a node price / GPUs)

Seeds: 914,000 x 2,500 tokens at 1,600 tok/s -> 16.5 days; 5.6 req/s x 2,306 tokens ->
~12,900 tok/s and ~45 h for 913,786 prompts; at ~$27/h for 7 GPUs (3.857 per GPU-hour)
-> ~$1,215.

From Python, ``make_plan(PlanInputs(...))`` does what ``dqa plan`` does (checks, sample count
from a scan, GPU count from a fleet file, optional calibration run, scenarios) and returns a
``PlanResult``; ``compute(Scenario(...))`` works out one scenario. The table is
``dqa.reports.plan_table``.

    >>> round(make_plan(PlanInputs(samples=914_000, avg_output_tokens=2_500, tok_per_s=1_600)).plans[0].wall_days, 1)
    16.5

Turns: from a scan (``--findings``), the selection is counted in assistant turns too, for each
way ``dqa regen --turns`` regenerates (``count_turns``): ``flagged`` (the default: from a sample's
first flagged turn to its last turn, since every later turn follows from a regenerated history;
its final turn when only whole-sample checks flag it),
``all`` (every assistant turn) and ``last`` (one per sample).

Offline hidden states (``hidden_state_storage``), what a drafter (EAGLE-3, DFlash) trains on when
they are extracted ahead of training rather than online::

    bytes = tokens x hidden_size x (aux_layers + 1) x bytes_per_value

``hidden_size`` and the dtype come from the model's ``config.json`` (``text_config`` for a
multimodal model such as Qwen3.5/3.6); ``aux_layers`` is 3 by default (EAGLE-3 as SpecForge and
speculators capture it: three auxiliary layers plus the final hidden state). The tokens are those of
the whole training set, because training stores a hidden state for every token of every sample.
The seed: 914,000 x 2,500 tokens x 5,120 (Qwen3.6-27B) x 4 x 2 bytes (bf16) = 93.6 TB (85.1 TiB),
the "~90 TB" that forced online training.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

from dqa.audit.scan_folder import METRICS_FILE, SUMMARY_FILE, findings_file
from dqa.errors import InputError, RuntimeFailure, UsageError
from .http_probe import answers_ok

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
TURN_MODES = ("flagged", "all", "last")
DEFAULT_AUX_LAYERS = 3  # EAGLE-3 (SpecForge, speculators): three auxiliary layers, plus the final one
# Bytes per value of a hidden state by config dtype; FP8/INT checkpoints still compute (and so
# store) activations in their compute dtype, named by torch_dtype/dtype (bfloat16 for them all).
DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2}


@dataclass(frozen=True)
class Scenario:
    """One way to run the job. Throughput comes from exactly one of ``tok_per_s``,
    ``tok_per_gpu`` (times ``gpus``) or ``req_per_s`` (times ``avg_output_tokens``)."""

    name: str
    samples: int
    avg_output_tokens: float
    gpus: int = 1
    tok_per_s: float | None = None
    tok_per_gpu: float | None = None
    req_per_s: float | None = None
    gpu_hour_cost: float | None = None


@dataclass(frozen=True)
class Plan:
    """The figures for one scenario (all derived, see the module docstring)."""

    name: str
    samples: int
    avg_output_tokens: float
    gpus: int
    tok_per_s: float
    tok_per_gpu: float
    req_per_s: float
    total_tokens: float
    tok_per_hour: float
    tok_per_day: float
    wall_s: float
    wall_hours: float
    wall_days: float
    gpu_hours: float
    gpu_hour_cost: float | None
    fleet_hour_cost: float | None
    cost: float | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every figure."""
        return asdict(self)


def compute(s: Scenario) -> Plan:
    """Work out ``s``. Raises ``UsageError`` when the throughput is not given exactly once or a figure is not positive."""
    given = [x for x in (s.tok_per_s, s.tok_per_gpu, s.req_per_s) if x is not None]
    if len(given) != 1:
        raise UsageError(
            f"scenario {s.name!r}: give the throughput exactly once (--tok-per-s, --tok-per-gpu or --req-per-s)"
        )
    if s.samples < 0:
        raise UsageError(f"scenario {s.name!r}: samples must be >= 0, got {s.samples}")
    if s.avg_output_tokens <= 0:
        raise UsageError(f"scenario {s.name!r}: average output tokens must be > 0, got {s.avg_output_tokens}")
    if s.gpus < 1:
        raise UsageError(f"scenario {s.name!r}: GPUs must be >= 1, got {s.gpus}")
    if given[0] <= 0:
        raise UsageError(f"scenario {s.name!r}: throughput must be > 0, got {given[0]}")
    if s.gpu_hour_cost is not None and s.gpu_hour_cost < 0:
        raise UsageError(f"scenario {s.name!r}: cost must be >= 0, got {s.gpu_hour_cost}")

    if s.tok_per_s is not None:
        tok_per_s = float(s.tok_per_s)
    elif s.tok_per_gpu is not None:
        tok_per_s = float(s.tok_per_gpu) * s.gpus
    else:
        tok_per_s = float(s.req_per_s) * s.avg_output_tokens  # type: ignore[arg-type]
    total_tokens = s.samples * float(s.avg_output_tokens)
    wall_s = total_tokens / tok_per_s
    gpu_hours = s.gpus * wall_s / SECONDS_PER_HOUR
    fleet_hour_cost = None if s.gpu_hour_cost is None else s.gpu_hour_cost * s.gpus
    cost = None if s.gpu_hour_cost is None else gpu_hours * s.gpu_hour_cost
    return Plan(
        name=s.name,
        samples=s.samples,
        avg_output_tokens=float(s.avg_output_tokens),
        gpus=s.gpus,
        tok_per_s=tok_per_s,
        tok_per_gpu=tok_per_s / s.gpus,
        req_per_s=tok_per_s / s.avg_output_tokens,
        total_tokens=total_tokens,
        tok_per_hour=tok_per_s * SECONDS_PER_HOUR,
        tok_per_day=tok_per_s * SECONDS_PER_DAY,
        wall_s=wall_s,
        wall_hours=wall_s / SECONDS_PER_HOUR,
        wall_days=wall_s / SECONDS_PER_DAY,
        gpu_hours=gpu_hours,
        gpu_hour_cost=s.gpu_hour_cost,
        fleet_hour_cost=fleet_hour_cost,
        cost=cost,
    )


def parse_scenario(
    text: str,
    samples: int,
    avg_output_tokens: float,
    default_cost: float | None,
    default_fleet_cost: float | None = None,
) -> Scenario:
    """Parse ``name:gpus:tok_per_gpu[:cost_per_gpu_hour]`` (e.g. ``b200:7:2300:3.86``).

    The cost is a price per GPU-hour. When omitted, ``default_fleet_cost`` (a price per hour
    for the whole fleet) divided by this scenario's GPUs applies, else ``default_cost`` (per
    GPU-hour). Raises ``UsageError`` naming the malformed field.
    """
    parts = text.split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise UsageError(f"--scenario {text!r}: expected name:gpus:tok_per_gpu[:cost_per_gpu_hour], e.g. b200:7:2300:3.86")
    name = parts[0]
    try:
        gpus = int(parts[1])
    except ValueError:
        raise UsageError(f"--scenario {text!r}: gpus {parts[1]!r} is not an integer") from None
    try:
        tok_per_gpu = float(parts[2].replace(",", "").replace("_", ""))
    except ValueError:
        raise UsageError(f"--scenario {text!r}: tok_per_gpu {parts[2]!r} is not a number") from None
    if gpus < 1:
        raise UsageError(f"--scenario {text!r}: gpus must be >= 1, got {gpus}")
    cost = default_cost if default_fleet_cost is None else default_fleet_cost / gpus
    if len(parts) == 4 and parts[3] != "":
        try:
            cost = float(parts[3].lstrip("$"))
        except ValueError:
            raise UsageError(f"--scenario {text!r}: cost {parts[3]!r} is not a number (price per GPU-hour)") from None
    return Scenario(
        name=name,
        samples=samples,
        avg_output_tokens=avg_output_tokens,
        gpus=gpus,
        tok_per_gpu=tok_per_gpu,
        gpu_hour_cost=cost,
    )


def count_findings(path: str | Path) -> int:
    """The number of failing rows in a scan's ``findings.parquet`` (``path`` is the file or the
    scan folder). Raises ``InputError`` when it is missing or lacks the ``row`` column."""
    import pyarrow.parquet as pq

    file = findings_file(path)
    if not file.is_file():
        raise InputError(f"{file}: no findings.parquet (run `dqa scan` first, or pass --samples)")
    try:
        pf = pq.ParquetFile(file)
    except Exception as exc:  # pyarrow raises several types for a non-parquet file
        raise InputError(f"{file}: not a parquet file ({exc})") from None
    if "row" not in pf.schema_arrow.names:
        raise InputError(f"{file}: column 'row' missing; expected a dqa scan findings.parquet (row, id, reasons)")
    return int(pf.metadata.num_rows)


@dataclass(frozen=True)
class TurnCounts:
    """The selection in assistant turns, for each ``dqa regen --turns`` mode.

    ``flagged``: from each sample's first flagged turn to its last assistant turn (a sample flagged
    only by whole-sample checks, with no flagged turn, counts its final turn, as regen sends it); ``all``: every
    assistant turn of the selected samples; ``last``: one per sample that has an assistant turn;
    ``flagged_turns``: the turns the per-turn checks flagged. ``None`` where the scan's
    ``metrics.parquet`` (the samples' turn counts) is missing. ``mode`` is the one planned for.
    """

    mode: str
    samples: int
    flagged_turns: int
    flagged: int | None
    all: int | None
    last: int | None
    multi_turn: bool | None

    @property
    def selected(self) -> int | None:
        """The turns of ``mode``."""
        return {"flagged": self.flagged, "all": self.all, "last": self.last}[self.mode]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``selected``: the turns of ``mode``)."""
        return {**asdict(self), "selected": self.selected}


def count_turns(path: str | Path, mode: str = "flagged") -> TurnCounts | None:
    """Count the failing samples of a scan (``path``: the folder or its findings.parquet) in turns.

    Reads ``findings.parquet`` (``row``, ``turns``) and, next to it, ``metrics.parquet``
    (``row``, ``assistant_turns``). Returns ``None`` for a scan made before findings had a
    ``turns`` column. Raises ``UsageError`` for an unknown ``mode`` and ``InputError`` for an
    unreadable file.
    """
    import polars as pl
    import pyarrow.parquet as pq

    if mode not in TURN_MODES:
        raise UsageError(f"--turns {mode!r}: expected one of {', '.join(TURN_MODES)}")
    file = findings_file(path)
    try:
        if "turns" not in pq.ParquetFile(file).schema_arrow.names:
            return None
        found = pl.read_parquet(file, columns=["row", "turns"])
    except Exception as exc:  # pyarrow/polars raise several types for a bad file
        raise InputError(f"{file}: cannot read its turns ({exc})") from None
    per = found.select(
        pl.col("row").cast(pl.Int64),
        pl.col("turns").list.min().cast(pl.Int64).alias("first"),
        pl.col("turns").list.len().cast(pl.Int64).alias("n"),
    )
    flagged_turns = int(per["n"].sum() or 0)
    metrics_file = file.parent / METRICS_FILE
    flagged = all_turns = last = multi = None
    if metrics_file.is_file():
        try:
            names = pq.ParquetFile(metrics_file).schema_arrow.names
            cols = ["row", "assistant_turns"]
            m = pl.read_parquet(metrics_file, columns=cols) if all(c in names for c in cols) else None
        except Exception as exc:
            raise InputError(f"{metrics_file}: cannot read its turn counts ({exc})") from None
        if m is not None:
            j = per.join(m.select(pl.col("row").cast(pl.Int64), pl.col("assistant_turns").cast(pl.Int64)), on="row", how="left")
            a = pl.col("assistant_turns").fill_null(0)
            # As regen's --turns flagged: from the first flagged turn to the last; no flagged turn (only
            # whole-sample checks flag it) or one past the sample's turns: the final turn alone.
            first = pl.col("first")
            span = pl.when(first.is_null() | (first >= a)).then((a > 0).cast(pl.Int64)).otherwise(a - first)
            out = j.select(
                span.sum().alias("flagged"),
                a.sum().alias("all"),
                (a > 0).sum().alias("last"),
                (a >= 2).any().alias("multi"),
            ).row(0, named=True)
            flagged, all_turns, last, multi = int(out["flagged"] or 0), int(out["all"] or 0), int(out["last"] or 0), bool(out["multi"])
    return TurnCounts(mode=mode, samples=per.height, flagged_turns=flagged_turns, flagged=flagged, all=all_turns, last=last, multi_turn=multi)


@dataclass(frozen=True)
class ModelShape:
    """What ``config.json`` says about the hidden states: width, depth and dtype."""

    config: str
    hidden_size: int
    num_hidden_layers: int | None
    dtype: str
    dtype_from_config: bool
    bytes_per_value: int


def read_model_config(path: str | Path) -> ModelShape:
    """Read ``hidden_size``, ``num_hidden_layers`` and ``torch_dtype``/``dtype`` from a model's
    ``config.json`` (``path``: the model folder or the file). A multimodal config (Qwen3.5/3.6,
    ``*ForConditionalGeneration``) keeps them in ``text_config``, which wins over the top level.
    A config without a dtype is taken as bfloat16 (said in ``dtype_from_config``).

    Raises ``InputError`` naming the file and the missing or bad field.
    """
    import json

    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"{file}: no config.json (--model takes the model folder or its config.json)")
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{file}: not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{file}: expected a JSON object (a transformers config.json)")
    scopes = [cfg[k] for k in ("text_config", "llm_config", "language_config") if isinstance(cfg.get(k), dict)] + [cfg]

    def first(*keys: str) -> tuple[Any, str | None]:
        for scope in scopes:
            for k in keys:
                if scope.get(k) is not None:
                    return scope[k], k
        return None, None

    hidden, _ = first("hidden_size", "n_embd", "d_model")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
        raise InputError(f"{file}: no positive integer hidden_size (top level or text_config); got {hidden!r}")
    layers, _ = first("num_hidden_layers", "n_layer", "num_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        layers = None
    dtype, _ = first("torch_dtype", "dtype")
    from_config = isinstance(dtype, str) and bool(dtype)
    name = str(dtype).removeprefix("torch.").lower() if from_config else "bfloat16"
    if name not in DTYPE_BYTES:
        raise InputError(f"{file}: dtype {dtype!r} is not a float type dqa knows ({', '.join(sorted(set(DTYPE_BYTES)))})")
    return ModelShape(str(file), hidden, layers, name, from_config, DTYPE_BYTES[name])


@dataclass(frozen=True)
class HiddenStateStorage:
    """The disk an offline hidden-state extraction needs: ``tokens x hidden_size x layers x
    bytes_per_value`` bytes, ``layers = aux_layers + 1`` (the final hidden state too).
    ``tokens_basis`` says which tokens were counted."""

    tokens: float
    tokens_basis: str
    hidden_size: int
    num_hidden_layers: int | None
    aux_layers: int
    layers: int
    dtype: str
    dtype_from_config: bool
    bytes_per_value: int
    bytes: float
    terabytes: float
    tebibytes: float
    config: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def summary(self) -> str:
        """One line for people."""
        dtype = self.dtype if self.dtype_from_config else f"{self.dtype}, assumed: config.json names no dtype"
        return (
            f"offline hidden states for drafter training: {human_bytes(self.bytes)} = {self.tokens:,.0f} tokens x "
            f"hidden {self.hidden_size:,} x ({self.aux_layers} aux layers + 1) x {self.bytes_per_value} bytes ({dtype}); "
            f"tokens: {self.tokens_basis}"
        )


def human_bytes(n: float) -> str:
    """Decimal and binary units side by side: ``93.6 TB (85.1 TiB)``."""
    dec = next(((n / 10**e, u) for e, u in ((15, "PB"), (12, "TB"), (9, "GB"), (6, "MB"), (3, "kB")) if n >= 10**e), (n, "B"))
    binary = next(((n / 2**e, u) for e, u in ((50, "PiB"), (40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")) if n >= 2**e), (n, "B"))
    return f"{dec[0]:,.1f} {dec[1]} ({binary[0]:,.1f} {binary[1]})"


def hidden_state_storage(shape: ModelShape, tokens: float, tokens_basis: str, aux_layers: int = DEFAULT_AUX_LAYERS) -> HiddenStateStorage:
    """``tokens x hidden_size x (aux_layers + 1) x bytes_per_value`` for ``shape``'s model.

    Raises ``UsageError`` for negative tokens or aux layers, or more aux layers than the model has.
    """
    if aux_layers < 0:
        raise UsageError(f"--aux-layers {aux_layers}: must be >= 0 (0: the final hidden state only)")
    if shape.num_hidden_layers is not None and aux_layers > shape.num_hidden_layers:
        raise UsageError(f"--aux-layers {aux_layers}: the model has only {shape.num_hidden_layers} layers ({shape.config})")
    if tokens < 0:
        raise UsageError(f"--storage-tokens {tokens:,.0f}: must be >= 0")
    layers = aux_layers + 1
    total = float(tokens) * shape.hidden_size * layers * shape.bytes_per_value
    return HiddenStateStorage(
        tokens=float(tokens), tokens_basis=tokens_basis, hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers, aux_layers=aux_layers, layers=layers, dtype=shape.dtype,
        dtype_from_config=shape.dtype_from_config, bytes_per_value=shape.bytes_per_value, bytes=total,
        terabytes=total / 1e12, tebibytes=total / 2**40, config=shape.config,
    )  # fmt: skip


def scan_tokens(findings: str | Path) -> tuple[int, int] | None:
    """``(scanned, replaced)``: the tokens of the scanned dataset (``summary.json`` ``tokens``) and the
    supervised tokens of its failing samples (``metrics.parquet``: the outputs regeneration
    replaces). ``None`` when the scan files are not next to ``findings`` (a lone findings.parquet).
    Raises ``InputError`` for scan files that are there but unreadable."""
    import json

    import polars as pl

    file = findings_file(findings)
    summary_file, metrics_file = file.parent / SUMMARY_FILE, file.parent / METRICS_FILE
    if not (summary_file.is_file() and metrics_file.is_file()):
        return None
    try:
        scanned = int(json.loads(summary_file.read_text())["tokens"])
        rows = pl.read_parquet(file, columns=["row"])["row"].cast(pl.Int64)
        m = pl.read_parquet(metrics_file, columns=["row", "supervised_tokens"])
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError) as exc:
        raise InputError(
            f"{file.parent}: cannot count the training set's tokens from the scan ({type(exc).__name__}: {exc}); "
            "give --storage-tokens"
        ) from None
    replaced = int(m.filter(pl.col("row").cast(pl.Int64).is_in(rows.implode()))["supervised_tokens"].sum() or 0)
    return scanned, replaced


def training_set_tokens(scan: tuple[int, int] | None, samples: int, avg_output_tokens: float) -> tuple[float, str]:
    """The tokens of the training set after regeneration, and how they were counted.

    With a scan (``scan_tokens``): scanned - replaced outputs + samples x avg output tokens (the new
    outputs). Without one: samples x avg output tokens only (the regenerated outputs; prompts and
    the samples kept as they are not counted), the seed's own arithmetic.
    """
    new = samples * float(avg_output_tokens)
    if scan is None:
        return new, (
            f"regenerated outputs only, {samples:,} samples x {avg_output_tokens:,.0f} avg output tokens (no scan: prompts "
            "and kept samples not counted; give --findings DIR or --storage-tokens for the whole training set)"
        )
    scanned, replaced = scan
    return max(0.0, scanned - replaced + new), (
        f"the training set after regeneration (estimate): {scanned:,} scanned - {replaced:,} replaced outputs "
        f"+ {samples:,} x {avg_output_tokens:,.0f} regenerated"
    )


@dataclass(frozen=True)
class Calibration:
    """What a short real regeneration measured (from its progress.json)."""

    sample: int
    done: int
    ok: int
    failed: int
    truncated: int
    elapsed_s: float
    req_per_s: float
    output_tok_per_s: float
    mean_output_tokens: float
    endpoints: int
    out: str | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def summary(self) -> str:
        """One line for people."""
        return (
            f"calibration: {self.done} of {self.sample} prompts on {self.endpoints} endpoint(s) in {self.elapsed_s:.1f} s: "
            f"{self.req_per_s:.2f} req/s x {self.mean_output_tokens:,.0f} mean output tokens = "
            f"{self.output_tok_per_s:,.0f} tok/s ({self.failed} failed, {self.truncated} truncated). "
            "A short run includes warm-up and a batch smaller than the servers' concurrency: treat it as a floor."
        )


def calibration_from_progress(progress: dict[str, Any], sample: int, out: str | None) -> Calibration:
    """Read the measured figures out of a regen ``progress.json`` object (FORMATS.md).

    Raises ``RuntimeFailure`` when nothing completed, so no rate could be measured.
    """
    done = int(progress.get("done") or 0)
    ok = int(progress.get("ok") or 0)
    elapsed = float(progress.get("elapsed_s") or 0.0)
    mean_out = float(progress.get("mean_output_tokens") or 0.0)
    completed = done - int(progress.get("failed") or 0)  # ok and truncated rows both produced tokens
    if completed <= 0 or elapsed <= 0 or mean_out <= 0:
        raise RuntimeFailure(
            f"calibration measured nothing: {completed} of {sample} prompts completed (state {progress.get('state')!r}); "
            "check the endpoints with `dqa fleet status`"
        )
    tok_s = float(progress.get("output_tok_per_s") or 0.0)
    req_s = float(progress.get("req_per_s") or 0.0)
    if req_s <= 0:
        req_s = done / elapsed
    if tok_s <= 0:
        tok_s = req_s * mean_out
    return Calibration(
        sample=sample,
        done=done,
        ok=ok,
        failed=int(progress.get("failed") or 0),
        truncated=int(progress.get("truncated") or 0),
        elapsed_s=elapsed,
        req_per_s=req_s,
        output_tok_per_s=tok_s,
        mean_output_tokens=mean_out,
        endpoints=len(progress.get("endpoints") or {}) or 1,
        out=out,
    )


def calibrate(
    dataset: str | Path,
    findings: str | Path | None,
    sample: int,
    fleet: str | Path | None,
    endpoints: list[str],
    out: str | Path | None = None,
    protocol: str | None = None,
    max_new_tokens: int = 8192,
    max_in_flight: int = 48,
    tokenizer: str = "qwen3",
    down_deadline: float = 120.0,
    ca_bundle: str | None = None,
) -> Calibration:
    """Regenerate the first ``sample`` failing prompts of ``dataset`` on the fleet (a real,
    in-process ``dqa regen`` run: ``dqa.regen.run.regenerate``) and return what it measured.

    The run's folder is ``out`` (kept, resumable), or a temporary one that is removed. Raises
    ``UsageError`` for a non-positive sample, ``InputError`` for bad inputs (from regen), and
    ``RuntimeFailure`` when the run stops early or completes nothing.
    """
    import tempfile

    from dqa.regen.run import DatasetSpec, DispatchSpec, OutputSpec, RegenConfig, SamplingSpec, Selection, Timeouts, regenerate

    if sample < 1:
        raise UsageError(f"--sample {sample}: must be >= 1")
    urls = list(endpoints)
    if fleet is not None:
        from .fleet_file import read_fleet

        urls = read_fleet(fleet).urls
    from .http_policy import HttpPolicy

    policy = HttpPolicy(ca_bundle)  # the same TLS trust and proxies as the regen run below
    if not any(answers_ok(u.rstrip("/") + "/health", 5.0, policy) for u in urls):
        raise RuntimeFailure(f"calibration: no endpoint answers /health ({', '.join(urls)}); is the fleet up? (`dqa fleet status`)")
    tmp = None
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="dqa-calibrate-")
        run_dir = Path(tmp.name) / "regen"
    else:
        run_dir = Path(out)
    try:
        result = regenerate(
            RegenConfig(
                data=DatasetSpec(str(dataset), tokenizer=tokenizer),
                selection=Selection(findings=None if findings is None else str(findings), limit=sample),
                sampling=SamplingSpec(max_new_tokens=max_new_tokens),
                dispatch=DispatchSpec(endpoints=tuple(endpoints), fleet=None if fleet is None else str(fleet), protocol=protocol,
                                      max_in_flight=max_in_flight, ca_bundle=ca_bundle, timeouts=Timeouts(down_deadline=down_deadline)),
                output=OutputSpec(str(run_dir)),
                live=False,
                log=lambda msg: None,
            )
        )
        if result.exit_code != 0:
            raise RuntimeFailure(
                f"calibration run stopped early ({result.state}): {result.message or 'see dqa fleet status'}"
            )
        return calibration_from_progress(result.progress, sample, None if tmp else str(run_dir))
    finally:
        if tmp is not None:
            tmp.cleanup()


@dataclass(frozen=True)
class PlanInputs:
    """What ``dqa plan`` is told (one field per option, ``None`` where not given).

    The sample count is ``samples`` or the failing rows of the scan ``findings``; the throughput
    one of ``tok_per_s``, ``tok_per_gpu``, ``req_per_s``, or measured (``calibrate``: a short
    real regeneration of ``sample`` prompts of ``dataset`` on ``fleet`` or ``endpoints``); more
    scenarios as ``name:gpus:tok_per_gpu[:cost_per_gpu_hour]`` texts. ``gpus`` defaults to the
    fleet file's GPU count, else the endpoints' count when calibrating, else 1.
    """

    samples: int | None = None
    findings: str | Path | None = None
    avg_output_tokens: float | None = None
    tok_per_s: float | None = None
    tok_per_gpu: float | None = None
    req_per_s: float | None = None
    gpus: int | None = None
    fleet: str | Path | None = None
    gpu_hour_cost: float | None = None
    fleet_hour_cost: float | None = None
    scenarios: tuple[str, ...] = ()
    calibrate: bool = False
    endpoints: tuple[str, ...] = ()
    sample: int = 32
    dataset: str | Path | None = None
    calibrate_out: str | Path | None = None
    protocol: str | None = None
    max_new_tokens: int = 8192
    turns: str = "flagged"
    model: str | Path | None = None
    aux_layers: int = DEFAULT_AUX_LAYERS
    storage_tokens: float | None = None
    ca_bundle: str | None = None


@dataclass(frozen=True)
class PlanResult:
    """The plans, one per scenario in the order given (the ``given``/``measured`` one first), the
    calibration they came from (``None`` without ``--calibrate``), the selection in turns (``None``
    without a scan that has them) and the offline hidden-state storage (``None`` without
    ``--model``)."""

    plans: list[Plan]
    calibration: Calibration | None = None
    turns: TurnCounts | None = None
    hidden_states: HiddenStateStorage | None = None

    @property
    def unpriced(self) -> bool:
        """True when some scenario has no price (no cost per GPU-hour or fleet-hour given)."""
        return any(p.cost is None for p in self.plans)

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``dqa plan --json``: ``{"scenarios": [...], "calibration": {...} | None,
        "turns": {...} | None, "hidden_states": {...} | None}``."""
        return {
            "scenarios": [p.to_dict() for p in self.plans],
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "turns": self.turns.to_dict() if self.turns else None,
            "hidden_states": self.hidden_states.to_dict() if self.hidden_states else None,
        }


def make_plan(
    inputs: PlanInputs,
    progress: Callable[[str], ContextManager[Any]] | None = None,
) -> PlanResult:
    """Work out every scenario of ``inputs`` (what ``dqa plan`` prints).

    ``progress(message)`` is entered around the calibration run (e.g. a spinner). Every input
    check runs before the calibration, which spends minutes of real generation. Raises
    ``UsageError`` for missing or contradictory inputs, ``InputError`` for an unreadable fleet
    file or findings, and ``RuntimeFailure`` when the calibration measures nothing.
    """
    i = inputs
    if i.samples is not None and i.findings is not None:
        raise UsageError("give --samples or --findings, not both")
    if i.fleet_hour_cost is not None and i.gpu_hour_cost is not None:
        raise UsageError("give --gpu-hour-cost or --fleet-hour-cost, not both")
    gpus = i.gpus
    if gpus is not None and gpus < 1:
        raise UsageError(f"--gpus {gpus}: a fleet has at least 1 GPU")
    if i.fleet is not None:
        from .fleet_file import read_fleet

        fleet_rec = read_fleet(i.fleet)
        if gpus is None:
            gpus = fleet_rec.gpu_count
    samples = i.samples
    if i.turns not in TURN_MODES:
        raise UsageError(f"--turns {i.turns!r}: expected one of {', '.join(TURN_MODES)}")
    turns = None
    if i.findings is not None:
        samples = count_findings(i.findings)
        turns = count_turns(i.findings, i.turns)
    # Checked before the calibration, which spends minutes of real generation.
    if samples is None:
        raise UsageError("say how many samples: --samples N or --findings DIR")
    shape = read_model_config(i.model) if i.model is not None else None
    if shape is None and (i.storage_tokens is not None or i.aux_layers != DEFAULT_AUX_LAYERS):
        raise UsageError("--aux-layers and --storage-tokens size the offline hidden states: give --model (its config.json) too")
    scan = None
    if shape is not None:
        hidden_state_storage(shape, i.storage_tokens or 0, "", i.aux_layers)  # the checks only
        if i.storage_tokens is None and i.findings is not None:
            scan = scan_tokens(i.findings)
    for text in i.scenarios:
        parse_scenario(text, samples, 1.0, None)  # syntax only; the real parse follows

    tok_per_s, tok_per_gpu, req_per_s = i.tok_per_s, i.tok_per_gpu, i.req_per_s
    avg_output_tokens = i.avg_output_tokens
    calibration = None
    if i.calibrate:
        if tok_per_s is not None or tok_per_gpu is not None or req_per_s is not None:
            raise UsageError("--calibrate measures the throughput; drop --tok-per-s/--tok-per-gpu/--req-per-s")
        if i.dataset is None:
            raise UsageError("--calibrate needs --dataset (the prompts to send)")
        if not i.endpoints and i.fleet is None:
            raise UsageError("--calibrate needs --fleet FILE or --endpoint URL")
        if i.endpoints and i.fleet is not None:
            raise UsageError("give --fleet or --endpoint, not both")
        if gpus is None:
            gpus = len(i.endpoints) if i.endpoints else 1
        with progress(f"calibrating: regenerating {i.sample} prompts") if progress else contextlib.nullcontext():
            calibration = calibrate(
                dataset=i.dataset,
                findings=i.findings,
                sample=i.sample,
                fleet=i.fleet,
                endpoints=list(i.endpoints),
                out=i.calibrate_out,
                protocol=i.protocol,
                max_new_tokens=i.max_new_tokens,
                ca_bundle=i.ca_bundle,
            )
        req_per_s = calibration.req_per_s
        if avg_output_tokens is None:
            avg_output_tokens = calibration.mean_output_tokens

    if gpus is None:
        gpus = 1
    gpu_hour_cost = i.gpu_hour_cost
    if i.fleet_hour_cost is not None:
        gpu_hour_cost = i.fleet_hour_cost / gpus
    if avg_output_tokens is None:
        raise UsageError("say the mean output tokens per sample: --avg-output-tokens (or --calibrate)")

    scenarios: list[Scenario] = []
    given = [x for x in (tok_per_s, tok_per_gpu, req_per_s) if x is not None]
    if len(given) > 1:
        raise UsageError("give the throughput once: --tok-per-s, --tok-per-gpu or --req-per-s")
    if given:
        scenarios.append(
            Scenario(
                name="measured" if calibration else "given",
                samples=samples,
                avg_output_tokens=avg_output_tokens,
                gpus=gpus,
                tok_per_s=tok_per_s,
                tok_per_gpu=tok_per_gpu,
                req_per_s=req_per_s,
                gpu_hour_cost=gpu_hour_cost,
            )
        )
    # A scenario without its own price: the per-GPU price, or the fleet price over ITS GPUs.
    scenarios += [
        parse_scenario(
            s, samples, avg_output_tokens,
            default_cost=None if i.fleet_hour_cost is not None else gpu_hour_cost,
            default_fleet_cost=i.fleet_hour_cost,
        )
        for s in i.scenarios
    ]  # fmt: skip
    if not scenarios:
        raise UsageError("say the throughput: --tok-per-s, --tok-per-gpu, --req-per-s, --scenario or --calibrate")
    names = [s.name for s in scenarios]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise UsageError(f"--scenario name {dup!r} is used twice")
    storage = None
    if shape is not None:
        if i.storage_tokens is not None:
            tokens, basis = float(i.storage_tokens), "as given (--storage-tokens)"
        else:
            tokens, basis = training_set_tokens(scan, samples, avg_output_tokens)
        storage = hidden_state_storage(shape, tokens, basis, i.aux_layers)
    return PlanResult(plans=[compute(s) for s in scenarios], calibration=calibration, turns=turns, hidden_states=storage)
