"""Session fixtures shared by the validate, gate and report tests: real scans of small sets.

Registered for every test by ``pytest_plugins`` in conftest.py: request ``clean_scan`` or ``defect_scan`` by name.
"""

from __future__ import annotations

import pytest

from gate_data import clean_rows, length_mismatch_row, misaligned_row, ok_mode_rows, write_set

N_CLEAN = 60
N_OK = 30


@pytest.fixture(scope="session")
def clean_scan(tmp_path_factory):
    """A scan folder of 60 clean thinking samples (ids s0..s59)."""
    from dqa.audit.scan import run_scan

    d = tmp_path_factory.mktemp("clean")
    data = write_set(d / "clean.parquet", clean_rows(N_CLEAN, seed=10))
    return run_scan(data, d / "scan").out_dir


@pytest.fixture(scope="session")
def defect_scan(tmp_path_factory):
    """A scan folder of 60 clean samples, 30 'OK.' samples (s60..s89), a length mismatch (s90), a misaligned mask (s91)."""
    from dqa.audit.scan import run_scan

    d = tmp_path_factory.mktemp("defect")
    rows = clean_rows(N_CLEAN, seed=10) + ok_mode_rows(N_OK) + [length_mismatch_row(), misaligned_row()]
    data = write_set(d / "defect.parquet", rows)
    return run_scan(data, d / "scan").out_dir
