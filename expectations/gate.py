"""The release gate: validate a release, compare it with the previous one, give one verdict.

Drift checks against a baseline (both are scan metrics tables), with their defaults:

================================  =========================================================
check                             fails when
================================  =========================================================
``row_count``                     the release has more than ``max_row_drop`` (5%) fewer rows
                                  than the baseline, or more than ``max_row_growth`` more
                                  (no limit by default)
``failing_share``                 the share of samples any scan check flags rose by more
                                  than ``max_failing_share_increase`` (0.01 = 1 point)
``supervised_tokens_ks``          the two-sample Kolmogorov-Smirnov statistic of supervised
                                  tokens per sample exceeds ``max_ks`` (0.10) **and** the
                                  KS critical value at ``ks_alpha`` (0.001) for these sizes,
                                  so small sets do not fail on sampling noise
================================  =========================================================

The quantiles (p10, p50, p90) and mean of supervised tokens on both sides are reported with
their relative shift, for people; they do not gate on their own.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from dqa import atomic
from dqa.audit.identity import scan_record
from dqa.audit.scan_folder import METRICS_FILE, ScanFolder
from dqa.expectations.suites import Suite
from dqa.expectations.validate import MAX_IDS_DEFAULT, validate_to_folder

QUANTILES = (0.10, 0.50, 0.90)


@dataclass
class DriftThresholds:
    """Where drift against the baseline fails the gate (see the module docstring)."""

    max_row_drop: float = 0.05
    max_row_growth: float | None = None
    max_failing_share_increase: float = 0.01
    max_ks: float = 0.10
    ks_alpha: float = 0.001


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    if len(a) == 0 or len(b) == 0:
        return 0.0 if len(a) == len(b) else 1.0
    a = np.sort(np.asarray(a, dtype=np.float64))
    b = np.sort(np.asarray(b, dtype=np.float64))
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / len(a)
    cdf_b = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.max(np.abs(cdf_a - cdf_b)))


def ks_critical(n: int, m: int, alpha: float) -> float:
    """The asymptotic two-sample KS critical value at significance ``alpha`` for sizes ``n``, ``m``."""
    if n == 0 or m == 0:
        return 0.0
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def failing_share(metrics: pl.DataFrame) -> float:
    """Share of samples any scan check flags (the ``failed`` column); 0 for an empty table."""
    if metrics.height == 0 or "failed" not in metrics.columns:
        return 0.0
    return float(metrics["failed"].mean())  # type: ignore[arg-type]


def compute_drift(release: pl.DataFrame, baseline: pl.DataFrame, thr: DriftThresholds) -> dict[str, Any]:
    """Compare two metrics tables; returns ``{"checks": [...], "quantiles": {...}, "passed": bool}``.

    Each check: ``name``, ``baseline``, ``release``, ``value`` (the change or statistic),
    ``threshold_text``, ``passed``.
    """
    n_new, n_old = release.height, baseline.height
    change = (n_new - n_old) / n_old if n_old else (0.0 if n_new == 0 else math.inf)
    rows_ok = change >= -thr.max_row_drop and (thr.max_row_growth is None or change <= thr.max_row_growth)
    growth = "no limit" if thr.max_row_growth is None else f"+{thr.max_row_growth:.0%}"
    checks = [
        {
            "name": "row_count",
            "baseline": n_old,
            "release": n_new,
            "value": change,
            "threshold_text": f"change between -{thr.max_row_drop:.0%} and {growth}",
            "passed": bool(rows_ok),
        }
    ]
    fs_new, fs_old = failing_share(release), failing_share(baseline)
    checks.append(
        {
            "name": "failing_share",
            "baseline": fs_old,
            "release": fs_new,
            "value": fs_new - fs_old,
            "threshold_text": f"increase at most {thr.max_failing_share_increase:g}",
            "passed": bool(fs_new - fs_old <= thr.max_failing_share_increase),
        }
    )
    a = release["supervised_tokens"].to_numpy() if "supervised_tokens" in release.columns else np.zeros(0)
    b = baseline["supervised_tokens"].to_numpy() if "supervised_tokens" in baseline.columns else np.zeros(0)
    d = ks_statistic(a, b)
    crit = ks_critical(len(a), len(b), thr.ks_alpha)
    checks.append(
        {
            "name": "supervised_tokens_ks",
            "baseline": None,
            "release": None,
            "value": d,
            "critical_value": crit,
            "threshold_text": f"KS at most {thr.max_ks:g} (or below the critical value {crit:.3f} at alpha {thr.ks_alpha:g})",
            "passed": bool(not (d > thr.max_ks and d > crit)),
        }
    )
    quantiles: dict[str, dict[str, float]] = {}
    if len(a) and len(b):
        for q in QUANTILES:
            old, new = float(np.quantile(b, q)), float(np.quantile(a, q))
            quantiles[f"p{round(q * 100)}"] = {"baseline": old, "release": new, "shift": (new - old) / old if old else 0.0}
        old, new = float(b.mean()), float(a.mean())
        quantiles["mean"] = {"baseline": old, "release": new, "shift": (new - old) / old if old else 0.0}
    return {"checks": checks, "quantiles": quantiles, "passed": all(c["passed"] for c in checks)}


def expectation_reason(e: dict[str, Any]) -> str:
    """One failed or errored expectation of a validation summary as a sentence.

    ``critical expectation #5 supervised_tokens ... failed (expected min 16, max 32768, mostly 0.99):
    40 unexpected rows (44.44%)``; the bounds part only when the expectation has bounds, then the
    unexpected rows, else the observed value.
    """
    from dqa.reports.markdown_validation import describe_kwargs, describe_observed

    if e["status"] == "error":
        return f"expectation #{e['index']} {e['title']} could not be evaluated: {e.get('exception')}"
    text = f"{e['severity']} expectation #{e['index']} {e['title']} failed"
    bounds = describe_kwargs(e.get("kwargs") or {})
    if bounds:
        text += f" (expected {bounds})"
    n = e.get("unexpected_count")
    if n is not None:
        return text + f": {n:,} unexpected row{'' if n == 1 else 's'} ({e.get('unexpected_percent') or 0.0:.2f}%)"
    seen = describe_observed(e)
    return text + (f": observed {seen}" if seen else "")


def _reasons(validation: dict[str, Any], drift: dict[str, Any] | None) -> list[str]:
    """Why the gate fails: each failed or errored expectation, then each failed drift check."""
    out = [expectation_reason(e) for e in validation["expectations"] if e["status"] in ("fail", "error")]
    for c in (drift or {}).get("checks", []):
        if not c["passed"]:
            out.append(f"drift: {c['name']} {c['value']:.4g} outside {c['threshold_text']}")
    return out


GATE_JSON = "gate.json"


def run_gate(
    release: ScanFolder,
    suite: Suite,
    out_dir: str | Path,
    baseline: ScanFolder | None = None,
    fail_on: str = "critical",
    thresholds: DriftThresholds | None = None,
    max_ids: int = MAX_IDS_DEFAULT,
    docs: bool = True,
) -> dict[str, Any]:
    """Validate ``release`` with ``suite`` and compare it with ``baseline``; returns ``gate.json``'s dict.

    ``verdict`` is ``pass`` only when no expectation at or above ``fail_on`` failed and every
    drift check passed. Writes ``out_dir/validation/`` (see ``validate_to_folder``),
    ``gate.json``, ``gate.md`` and ``junit.xml`` (expectations and drift checks as test
    cases). Raises ``InputError`` / ``RuntimeFailure`` like the validation.
    """
    from dqa import storage

    if storage.is_url(out_dir):  # staged here, published with gate.json last
        with storage.output_folder(out_dir, GATE_JSON) as local:
            gate = run_gate(release, suite, local, baseline, fail_on, thresholds, max_ids, docs)
            storage.repoint_files(local, storage.location(out_dir), (GATE_JSON, "validation/summary.json"))
        return storage.repoint(gate, local, storage.location(out_dir))
    thr = thresholds or DriftThresholds()
    out = Path(out_dir)
    atomic.check_output_dir(out, [], lambda d: (d / GATE_JSON).is_file(), "dqa gate folder")
    # The whole gate folder is built aside and moved into place: a stale gate.json never
    # sits next to a newer validation.
    work = atomic.make_work_dir(out)
    try:
        gate = _gate_into(work, out, release, suite, baseline, fail_on, thr, max_ids, docs)
        atomic.replace_dir(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return gate


def _gate_into(work: Path, out: Path, release: ScanFolder, suite: Suite, baseline: ScanFolder | None, fail_on: str,
               thr: DriftThresholds, max_ids: int, docs: bool) -> dict[str, Any]:
    """Write the gate's files into ``work`` (paths recorded as under ``out``); return gate.json's dict."""
    from dqa.reports.junit import Case, JUnitSuite, validation_testsuite, write_junit
    from dqa.reports.markdown_validation import render_gate_markdown

    v = validate_to_folder(release.metrics, suite, work / "validation", fail_on, max_ids, docs,
                           source=str(release.path / METRICS_FILE), scan=scan_record(release.path, release.summary))
    summary = v.summary()
    drift = compute_drift(release.metrics, baseline.metrics, thr) if baseline is not None else None
    passed = v.success and (drift is None or drift["passed"])
    gate = {
        "verdict": "pass" if passed else "fail",
        "release": release.dataset,
        "release_scan": str(release.path),
        "scan": scan_record(release.path, release.summary),
        "baseline": baseline.dataset if baseline is not None else None,
        "baseline_scan": str(baseline.path) if baseline is not None else None,
        "suite": suite.name,
        "suite_file": str(suite.path),
        "fail_on": fail_on,
        "reasons": _reasons(summary, drift),
        "thresholds": asdict(thr),
        "drift": drift,
        "validation": summary,
        "outputs": {"validation": str(out / "validation"), "junit": str(out / "junit.xml"), "markdown": str(out / "gate.md"),
                    "data_docs": str(out / "validation" / "data_docs" / "index.html")},
    }
    suites = [validation_testsuite(summary)]
    if drift is not None:
        cases = [
            Case(name=c["name"], classname="dqa.gate.drift", outcome="pass" if c["passed"] else "fail",
                 message=f"{c['name']}: {c['value']:.4g} (allowed: {c['threshold_text']})",
                 details=f"baseline {c.get('baseline')}, release {c.get('release')}, value {c['value']:.6g}; allowed: {c['threshold_text']}",
                 properties={"severity": "critical"})
            for c in drift["checks"]
        ]
        suites.append(JUnitSuite(name="dqa.gate.drift", cases=cases))
    atomic.write_json(work / "gate.json", gate)
    atomic.write_text(work / "gate.md", render_gate_markdown(gate))
    write_junit(work / "junit.xml", suites)
    return gate


def gate_release(
    release: str | Path,
    baseline: str | Path | None = None,
    suite: str | Path = "release",
    out_dir: str | Path | None = None,
    fail_on: str = "critical",
    thresholds: DriftThresholds | None = None,
    tokenizer: str | None = None,
    thinking: str = "auto",
    docs: bool = True,
    max_ids: int = MAX_IDS_DEFAULT,
    progress: Any = None,
) -> dict[str, Any]:
    """``dqa gate`` from Python: scan (or reuse scan folders), validate, compare; returns ``gate.json``'s dict.

    ``release`` and ``baseline`` are datasets (each scanned into its own default scan folder,
    ``dqa.audit.scan.default_out_dir``, which keeps same-named datasets apart) or scan folders.
    A baseline that is the release itself is a ``UsageError``. ``out_dir`` defaults to
    ``RELEASE_SCAN_FOLDER/gate/``. ``result["verdict"]`` is ``pass`` or ``fail``. Raises
    ``InputError`` / ``RuntimeFailure`` (exit codes 2 / 3 on the CLI). ``progress(rows, tokens)``
    is called during fresh scans.
    """
    from dqa.errors import UsageError
    from dqa.expectations.source import obtain_scan
    from dqa.expectations.suites import check_fail_on, load_suite

    spec = load_suite(suite)
    fail_on = check_fail_on(fail_on)
    rel = obtain_scan(release, tokenizer=tokenizer, thinking=thinking, progress=progress)
    base = None
    if baseline is not None:
        base = obtain_scan(baseline, tokenizer=tokenizer, thinking=thinking, progress=progress)
        if base.path.resolve() == rel.path.resolve():
            raise UsageError(f"baseline {baseline}: resolves to the release's own scan folder {rel.path}")
    out = out_dir if out_dir is not None else rel.path / "gate"
    return run_gate(rel, spec, out, base, fail_on, thresholds, max_ids=max_ids, docs=docs)
