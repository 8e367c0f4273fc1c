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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dqa.errors import InputError, RuntimeFailure, UsageError
from dqa.formatting import human_count, human_duration

from .http_probe import answers_ok

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0


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


def table_rows(plans: list[Plan]) -> list[tuple[str, list[str]]]:
    """The rows of the side-by-side table: (label, one cell per scenario). Per-hour and
    per-day rates sit next to each other so a unit slip ("5.4M/day") shows at once."""

    def money(v: float | None) -> str:
        return "-" if v is None else f"${v:,.2f}" if v < 100 else f"${v:,.0f}"

    return [
        ("samples", [f"{p.samples:,}" for p in plans]),
        ("avg output tokens", [f"{p.avg_output_tokens:,.0f}" for p in plans]),
        ("total output tokens", [human_count(p.total_tokens) for p in plans]),
        ("GPUs", [str(p.gpus) for p in plans]),
        ("tok/s per GPU", [f"{p.tok_per_gpu:,.0f}" for p in plans]),
        ("tok/s (fleet)", [f"{p.tok_per_s:,.0f}" for p in plans]),
        ("req/s (fleet)", [f"{p.req_per_s:,.2f}" for p in plans]),
        ("tokens per hour", [human_count(p.tok_per_hour) for p in plans]),
        ("tokens per day", [human_count(p.tok_per_day) for p in plans]),
        ("wall time", [human_duration(p.wall_s) for p in plans]),
        ("wall time (hours)", [f"{p.wall_hours:,.1f} h" for p in plans]),
        ("wall time (days)", [f"{p.wall_days:,.2f} d" for p in plans]),
        ("GPU-hours", [f"{p.gpu_hours:,.0f}" if p.gpu_hours >= 10 else f"{p.gpu_hours:.2f}" for p in plans]),
        ("cost per GPU-hour", [money(p.gpu_hour_cost) for p in plans]),
        ("cost per fleet-hour", [money(p.fleet_hour_cost) for p in plans]),
        ("total cost", [money(p.cost) for p in plans]),
    ]


def count_findings(path: str | Path) -> int:
    """The number of failing rows in a scan's ``findings.parquet`` (``path`` is the file or the
    scan folder). Raises ``InputError`` when it is missing or lacks the ``row`` column."""
    import pyarrow.parquet as pq

    path = Path(path)
    file = path / "findings.parquet" if path.is_dir() else path
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
) -> Calibration:
    """Regenerate the first ``sample`` failing prompts of ``dataset`` on the fleet (a real,
    in-process ``dqa regen`` run: ``dqa.regen.run.regenerate``) and return what it measured.

    The run's folder is ``out`` (kept, resumable), or a temporary one that is removed. Raises
    ``UsageError`` for a non-positive sample, ``InputError`` for bad inputs (from regen), and
    ``RuntimeFailure`` when the run stops early or completes nothing.
    """
    import tempfile

    from dqa.regen.run import RegenConfig, regenerate

    if sample < 1:
        raise UsageError(f"--sample {sample}: must be >= 1")
    urls = list(endpoints)
    if fleet is not None:
        from .fleet_file import read_fleet

        urls = read_fleet(fleet).urls
    if not any(answers_ok(u.rstrip("/") + "/health", 5.0) for u in urls):
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
                dataset=str(dataset),
                out=str(run_dir),
                endpoints=list(endpoints),
                fleet=None if fleet is None else str(fleet),
                findings=None if findings is None else str(findings),
                limit=sample,
                protocol=protocol,
                max_new_tokens=max_new_tokens,
                max_in_flight=max_in_flight,
                tokenizer=tokenizer,
                live=False,
                log=lambda msg: None,
                down_deadline=down_deadline,
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
