"""Expectation suites as data: load a Great Expectations 1.x suite JSON file and read its severities.

A suite is GX's own JSON (``name``, ``expectations`` of ``{type, kwargs, meta}``), so users
copy and edit the bundled ``release.json`` and ``regen.json``. dqa adds one convention:
``meta.severity`` is ``critical`` (the default), ``warning`` or ``info``. GX computes
``success`` without looking at severity; dqa's verdict does (see ``counts_as_failure``).

This module does not import Great Expectations except in ``to_gx_suite``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dqa.errors import InputError

SUITES_DIR = Path(__file__).parent
BUILTIN = ("release", "regen")
SEVERITIES = ("info", "warning", "critical")
DEFAULT_SEVERITY = "critical"
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class SuiteExpectation:
    """One expectation of a suite: its position, GX type, kwargs, meta and dqa severity."""

    index: int
    type: str
    kwargs: dict[str, Any]
    meta: dict[str, Any]
    severity: str
    id: str

    @property
    def columns(self) -> list[str]:
        """The metrics columns this expectation reads (empty for table-level ones)."""
        k = self.kwargs
        cols = [k[key] for key in ("column", "column_A", "column_B") if isinstance(k.get(key), str)]
        cols += [c for c in k.get("column_list") or [] if isinstance(c, str)]
        return cols

    @property
    def title(self) -> str:
        """A short readable name: ``expect_column_values_to_be_between(supervised_tokens)``."""
        cols = ", ".join(self.columns)
        return f"{self.type}({cols})" if cols else self.type

    @property
    def why(self) -> str:
        """The expectation's ``meta.why`` (or ``meta.notes``) sentence, or ''."""
        return str(self.meta.get("why") or self.meta.get("notes") or "")


@dataclass(frozen=True)
class Suite:
    """A loaded suite: name, source file, the raw JSON and its expectations in file order."""

    name: str
    path: Path
    raw: dict[str, Any]
    expectations: list[SuiteExpectation] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        """Every metrics column any expectation reads, in first-use order."""
        seen: dict[str, None] = {}
        for e in self.expectations:
            for c in e.columns:
                seen.setdefault(c, None)
        return list(seen)


def builtin_suite_path(name: str) -> Path:
    """Path of a bundled suite (``release`` or ``regen``)."""
    return SUITES_DIR / f"{name}.json"


def resolve_suite_path(name_or_path: str | Path) -> Path:
    """Map ``--suite`` to a file: a bundled name (``release``, ``regen``) or a path to a JSON file.

    Raises ``InputError`` when the path does not exist.
    """
    text = str(name_or_path)
    if text in BUILTIN:
        return builtin_suite_path(text)
    path = Path(text)
    if not path.is_file():
        raise InputError(f"{path}: no such suite file (expected a GX suite JSON file, or a bundled suite: {', '.join(BUILTIN)})")
    return path


def severity_of(expectation: dict[str, Any]) -> str:
    """The dqa severity of an expectation dict: ``meta.severity``, else GX's own ``severity`` field, else critical.

    Raises ``InputError`` for a value outside info / warning / critical.
    """
    meta = expectation.get("meta") or {}
    value = meta.get("severity") if isinstance(meta, dict) else None
    if value is None:
        value = expectation.get("severity")
    if value is None:
        return DEFAULT_SEVERITY
    value = str(getattr(value, "value", value)).lower()
    if value not in _RANK:
        raise InputError(f"severity {value!r}: expected one of {', '.join(SEVERITIES)}")
    return value


def counts_as_failure(severity: str, fail_on: str) -> bool:
    """True when a failed expectation of ``severity`` fails the run at threshold ``fail_on``."""
    return _RANK[severity] >= _RANK[fail_on]


def check_fail_on(fail_on: str) -> str:
    """Validate ``--fail-on``; returns it lower-cased. Raises ``InputError`` otherwise."""
    value = fail_on.lower()
    if value not in ("warning", "critical"):
        raise InputError(f"--fail-on {fail_on!r}: expected critical or warning")
    return value


def load_suite(name_or_path: str | Path) -> Suite:
    """Read and check a suite JSON file (or a bundled name); returns a ``Suite``.

    Raises ``InputError`` naming the file (and the expectation's position) when the file is
    not JSON, lacks ``name`` or ``expectations``, or an expectation lacks ``type`` / ``kwargs``
    or has an unknown severity.
    """
    path = resolve_suite_path(name_or_path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the suite ({exc})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object with 'name' and 'expectations'")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{path}: the suite needs a non-empty string 'name'")
    items = raw.get("expectations")
    if not isinstance(items, list):
        raise InputError(f"{path}: 'expectations' must be a list")
    out = []
    for i, e in enumerate(items):
        where = f"{path}: expectation #{i}"
        if not isinstance(e, dict):
            raise InputError(f"{where}: expected an object with 'type' and 'kwargs'")
        etype = e.get("type") or e.get("expectation_type")
        if not isinstance(etype, str) or not etype.startswith("expect_"):
            raise InputError(f"{where}: 'type' must name a GX expectation (expect_...)")
        kwargs = e.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise InputError(f"{where} ({etype}): 'kwargs' must be an object")
        meta = e.get("meta") or {}
        if not isinstance(meta, dict):
            raise InputError(f"{where} ({etype}): 'meta' must be an object")
        try:
            severity = severity_of(e)
        except InputError as exc:
            raise InputError(f"{where} ({etype}): {exc}") from None
        eid = str(e.get("id") or uuid.uuid5(uuid.NAMESPACE_URL, f"dqa:{name}:{i}:{etype}"))
        out.append(SuiteExpectation(i, etype, dict(kwargs), dict(meta), severity, eid))
    return Suite(name=name, path=path, raw=raw, expectations=out)


def to_gx_suite(suite: Suite):
    """Build the ``great_expectations.ExpectationSuite`` for ``suite`` (imports GX).

    Expectations keep file order and their meta; the native ``severity`` field is set too
    where this GX version has one. Raises
    ``InputError`` naming the file and expectation for an unknown type or bad kwargs.
    """
    import great_expectations as gx
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    gx_expectations = []
    for e in suite.expectations:
        where = f"{suite.path}: expectation #{e.index} ({e.type})"
        try:
            config = ExpectationConfiguration(type=e.type, kwargs=e.kwargs, meta=e.meta)
            obj = config.to_domain_obj()
        except Exception as exc:  # GX raises many types for bad configs; all are the user's input
            raise InputError(f"{where}: {_one_line(exc)}") from None
        if hasattr(obj, "severity"):
            try:
                obj.severity = e.severity
            except Exception:  # an older GX without the field's validator: meta still carries it
                pass
        gx_expectations.append(obj)
    return gx.ExpectationSuite(name=suite.name, expectations=gx_expectations, meta=suite.raw.get("meta") or {})


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(getattr(exc, "message", None) or exc).split())
    return text[:300] or type(exc).__name__
