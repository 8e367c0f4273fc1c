"""Fixtures for the regen reliability campaign (helpers live in regen_harness.py)."""

from __future__ import annotations

import json

import pytest

from regen_harness import FIGURES, SECRET, SECRET_ENV, RegenData, build_regen_data, start_fleet


@pytest.fixture()
def fleet(tmp_path):
    """Three SGLang-contract stub servers, real processes, each demanding the test API key; on
    explicit ports (below the ephemeral range), since fault tests restart them on their port."""
    servers = start_fleet(tmp_path / "fleet", 3, restartable=True)
    yield servers
    for s in servers:
        s.kill()


@pytest.fixture()
def regen_data(tmp_path) -> RegenData:
    """480 rows, 320 selected by the findings, one selected row without an assistant header."""
    return build_regen_data(tmp_path / "data", rows=480)


@pytest.fixture()
def secret_env(monkeypatch):
    """The API key in the environment variable regen reads it from."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    return SECRET_ENV


def pytest_terminal_summary(terminalreporter):
    """Print the throughput figures the fault tests recorded (they go into RELIABILITY.md)."""
    if not FIGURES:
        return
    tr = terminalreporter
    tr.section("regen reliability figures (3 stub endpoints, 50 ms/request, 8 in flight each)")
    base = next((f for f in FIGURES if f.scenario == "clean"), None)
    tr.write_line("rows/s is measured between the first and the last completed row; wall includes startup")
    for f in FIGURES:
        rel = f" {f.rows_per_s / base.rows_per_s:5.0%} of clean" if base and base.rows_per_s else ""
        tr.write_line(f"{f.scenario:<38} {f.rows:5d} rows  wall {f.wall_s:6.2f} s  {f.rows_per_s:7.1f} rows/s{rel}  "
                      f"attempts/row {f.attempts_mean:4.2f}  {json.dumps(f.statuses, sort_keys=True)}  {f.note}")
