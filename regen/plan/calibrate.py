"""Measure the throughput with a short real regeneration: the only plan module that runs a regen.

``calibrate`` checks that some endpoint answers its server kind's health path, runs
``dqa.regen.run.regenerate`` on the first failing prompts in process, and reads what the run's
``progress.json`` measured (``calibration_from_progress``) into a ``Calibration``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from dqa.errors import RuntimeFailure, UsageError
from dqa.regen.config import DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_NEW_TOKENS, DEFAULT_TOKENIZER
from dqa.regen.wire.http_probe import answers_ok


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


def up_path(kind: str | None) -> str:
    """The path that says whether a server of kind ``kind`` (a ``dqa.regen.servers.KINDS`` name)
    is up: the last of the kind's ``health_paths``, which run best first, so the last is the
    plainest answer (a cheap liveness reply, not a one-token test generation). A name that is no
    kind, or ``None``, gets the base ``ServerKind``'s. Returns the path; raises nothing."""
    from dqa.regen.servers import KINDS, ServerKind

    return KINDS.get(kind or "", ServerKind).health_paths[-1]


def calibrate(
    dataset: str | Path,
    findings: str | Path | None,
    sample: int,
    fleet: str | Path | Sequence[str | Path] | None,
    endpoints: list[str],
    out: str | Path | None = None,
    protocol: str | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    tokenizer: str = DEFAULT_TOKENIZER,
    down_deadline: float = 120.0,
    ca_bundle: str | None = None,
) -> Calibration:
    """Regenerate the first ``sample`` failing prompts of ``dataset`` on the fleet (``fleet``: one
    fleet file or several, one per node; else ``endpoints``) (a real, in-process ``dqa regen``
    run: ``dqa.regen.run.regenerate``) and return what it measured. A fleet file that records a
    router is calibrated through the router, as `dqa regen --fleet` sends (``FleetSet.send_urls``).

    The run's folder is ``out`` (kept, resumable), or a temporary one that is removed. Raises
    ``UsageError`` for a non-positive sample, ``InputError`` for bad inputs (from regen), and
    ``RuntimeFailure`` when the run stops early or completes nothing.
    """
    import tempfile

    from dqa.regen.config import DatasetSpec, DispatchSpec, OutputSpec, RegenConfig, SamplingSpec, Selection, Timeouts
    from dqa.regen.fleet.file import fleet_paths, read_fleets
    from dqa.regen.run import regenerate

    if sample < 1:
        raise UsageError(f"--sample {sample}: must be >= 1")
    # (URL, the path that says it is up): bare endpoints get the kind of the protocol they are
    # asked to speak, a fleet's its engine's. A fleet is asked where `dqa regen --fleet` sends
    # (``send_urls``): its router when the file records one, else its servers.
    probes = [(u, up_path(protocol)) for u in endpoints]
    fleet_files = fleet_paths(fleet)
    if fleet_files:
        probes = [(u, up_path(f.engine)) for f in read_fleets(fleet_files).fleets for u in f.send_urls]
    from dqa.regen.wire.http_policy import HttpPolicy

    policy = HttpPolicy(ca_bundle)  # the same TLS trust and proxies as the regen run below
    if not any(answers_ok(u.rstrip("/") + health, 5.0, policy) for u, health in probes):
        paths = sorted({health for _, health in probes}) or [up_path(protocol)]
        raise RuntimeFailure(
            f"calibration: no endpoint answers {' or '.join(paths)} ({', '.join(u for u, _ in probes)}); is the fleet up? (`dqa fleet status`)"
        )
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
                dispatch=DispatchSpec(endpoints=tuple(endpoints), fleet=fleet_files or None, protocol=protocol,
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

