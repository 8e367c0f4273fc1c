"""JUnit XML for CI test viewers: one ``<testcase>`` per expectation (and per drift check).

A failed expectation that counts against the verdict is a ``<failure>``; one that GX could
not evaluate is an ``<error>``; a failed ``warning`` expectation below ``--fail-on`` passes
with its message in ``<system-out>`` (prefixed ``WARNING``), so CI shows it without going red.
ElementTree does the escaping, so untrusted sample ids cannot break the XML.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dqa import atomic
from dqa.reports.markdown_validation import describe_kwargs, describe_observed, describe_unexpected


@dataclass
class Case:
    """One test case: ``outcome`` is pass, fail, warn or error."""

    name: str
    classname: str
    outcome: str
    message: str = ""
    details: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    time_s: float = 0.0


@dataclass
class JUnitSuite:
    """A named group of cases (``dqa.validate.release``, ``dqa.gate.drift``)."""

    name: str
    cases: list[Case]
    time_s: float = 0.0


def _case_text(e: dict[str, Any]) -> tuple[str, str]:
    observed = describe_observed(e)
    unexpected = describe_unexpected(e)
    msg = f"{e['severity']}: {e['title']} expected {describe_kwargs(e['kwargs']) or 'to hold'}"
    if observed:
        msg += f"; observed {observed}"
    if unexpected:
        msg += f"; unexpected {unexpected}"
    ids = e.get("failing_ids") or []
    details = [msg]
    if e.get("why"):
        details.append(f"why: {e['why']}")
    if ids:
        details.append(f"first failing samples: {', '.join(str(i) for i in ids)}")
    if e.get("exception"):
        details.append(f"error: {e['exception']}")
    return msg, "\n".join(details)


def validation_testsuite(summary: dict[str, Any]) -> JUnitSuite:
    """A ``JUnitSuite`` with one case per expectation of a validation ``summary.json``."""
    cases = []
    for e in summary["expectations"]:
        msg, details = _case_text(e)
        cases.append(
            Case(
                name=f"#{e['index']:02d} {e['title']}",
                classname=f"dqa.validate.{summary['suite']}",
                outcome=e["status"],
                message=msg,
                details=details,
                properties={"severity": e["severity"], "type": e["type"]},
            )
        )
    return JUnitSuite(name=f"dqa.validate.{summary['suite']}", cases=cases, time_s=summary.get("timings", {}).get("validate_s", 0.0))


def _clean(text: str) -> str:
    """Drop characters XML 1.0 cannot hold (control characters from untrusted text)."""
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20)


def render_junit(suites: list[JUnitSuite]) -> str:
    """The ``<testsuites>`` document as a string."""
    root = ET.Element("testsuites", name="dqa")
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for s in suites:
        fails = sum(c.outcome == "fail" for c in s.cases)
        errs = sum(c.outcome == "error" for c in s.cases)
        el = ET.SubElement(root, "testsuite", name=_clean(s.name), tests=str(len(s.cases)), failures=str(fails),
                           errors=str(errs), skipped="0", time=f"{s.time_s:.3f}")
        totals["tests"] += len(s.cases)
        totals["failures"] += fails
        totals["errors"] += errs
        for c in s.cases:
            tc = ET.SubElement(el, "testcase", name=_clean(c.name), classname=_clean(c.classname), time=f"{c.time_s:.3f}")
            if c.properties:
                props = ET.SubElement(tc, "properties")
                for k, v in c.properties.items():
                    ET.SubElement(props, "property", name=_clean(k), value=_clean(str(v)))
            if c.outcome == "fail":
                f = ET.SubElement(tc, "failure", message=_clean(c.message), type=c.properties.get("severity", "failure"))
                f.text = _clean(c.details)
            elif c.outcome == "error":
                f = ET.SubElement(tc, "error", message=_clean(c.message), type="error")
                f.text = _clean(c.details)
            elif c.outcome == "warn":
                out = ET.SubElement(tc, "system-out")
                out.text = _clean("WARNING (not failing at this --fail-on): " + c.details)
        root.set("tests", str(totals["tests"]))
        root.set("failures", str(totals["failures"]))
        root.set("errors", str(totals["errors"]))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(path: str | Path, suites: list[JUnitSuite]) -> None:
    """Atomically write the JUnit XML for ``suites`` to ``path``."""
    atomic.write_text(path, render_junit(suites))
