"""Fixtures for the regen reliability campaign (helpers live in regen_harness.py). The throughput
figures its tests record (regen_harness.FIGURES) are printed by tests/conftest.py's terminal summary,
which also gathers them from pytest-xdist's workers."""

from __future__ import annotations

import pytest

from regen_harness import SECRET, SECRET_ENV, RegenData, build_regen_data, start_fleet


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
