"""examples/tiny_model.py without torch says which extra to install (one line, exit 2), not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_without_torch_it_names_the_serve_extra(tmp_path):
    # torch hidden from the import system, as in an environment without the `serve` extra.
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['tiny_model.py', sys.argv[1]]; "
            "runpy.run_path(%r, run_name='__main__')" % str(REPO / "examples" / "tiny_model.py"))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tiny")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "tiny_model: torch is not installed: pip install -e '.[serve]' (CPU torch 2.13.0 and transformers serve; "
        "see README, Install)"]
    assert not (tmp_path / "tiny").exists()
