"""GPU-hours, cost and wall time of one scenario: the plain arithmetic of ``dqa plan``.

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

``compute(Scenario(...))`` works out one scenario as a ``Plan``; ``parse_scenario`` reads the
``--scenario name:gpus:tok_per_gpu[:cost_per_gpu_hour]`` text. Nothing here reads a file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dqa.errors import UsageError

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

