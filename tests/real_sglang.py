"""Helpers of the opt-in tests against a REAL SGLang 0.5.23 on the CPU (tests/sglang_cpu/README.md).

``sglang_python()`` skips the calling test module unless ``DQA_REAL_SGLANG_PYTHON`` names a python
with sglang 0.5.23; ``running_server`` starts one server (its own process group, killed whole at
the end); ``turn_ending_model`` derives from the tiny random Qwen3 a model whose replies end in
``<|im_end|>`` after a few tokens, so multi-turn regeneration gets past turn 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

SGLANG_VERSION = "0.5.23"
STARTUP_TIMEOUT_S = 300  # ~55-60 s seen on 2 cores; the scheduler imports every model class
MAX_TOTAL_TOKENS = 4096  # the KV pool; without a bound the scheduler reserves ~15 GB and is killed
IM_END = 151645


def sglang_python() -> str:
    """The absolute path of ``$DQA_REAL_SGLANG_PYTHON``; skips the whole calling module when it is
    unset, does not run, or has no sglang 0.5.23."""
    py = os.environ.get("DQA_REAL_SGLANG_PYTHON")
    if not py:
        pytest.skip("opt-in: set DQA_REAL_SGLANG_PYTHON to a python with sglang 0.5.23 "
                    "(see tests/sglang_cpu/setup_sglang_cpu.sh)", allow_module_level=True)
    py = os.path.abspath(py)  # not resolve(): a venv's python is a symlink to the base interpreter
    try:
        out = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                             capture_output=True, text=True, timeout=60)
    except OSError as exc:
        pytest.skip(f"DQA_REAL_SGLANG_PYTHON={py} does not run: {exc}", allow_module_level=True)
    version = out.stdout.strip()
    if out.returncode != 0 or version != SGLANG_VERSION:
        pytest.skip(f"DQA_REAL_SGLANG_PYTHON={py} has sglang {version or 'missing'}, not {SGLANG_VERSION}",
                    allow_module_level=True)
    return py


def free_port() -> int:
    """A port free now. SGLang's warm-up request goes to its own --port, so port 0 cannot be passed
    on (/health would stay 503): the OS picks one here."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    """GET ``url`` (POST ``body`` as JSON when given); returns ``(status, body text)``, also for 4xx/5xx."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Launch:
    """One ``sglang.launch_server`` process on the CPU, started by ``__init__`` (not yet healthy)."""

    def __init__(self, python: str, model: Path, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_path
        self.health: list[int] = []  # the /health codes seen while starting
        self.t0 = time.monotonic()
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
        # --sleep-on-idle: an idle scheduler otherwise polls its sockets nonstop, ~80% of a core each.
        cmd = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu",
               "--host", "127.0.0.1", "--port", str(self.port), "--max-total-tokens", str(MAX_TOTAL_TOKENS), "--sleep-on-idle"]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.startup_s: float | None = None

    def poll_healthy(self) -> bool:
        """One /health probe: True once it answered 200; ``pytest.fail`` with the log's tail when the
        server exited or is not healthy after ``STARTUP_TIMEOUT_S``."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                self.health.append(r.status)
        except urllib.error.HTTPError as exc:
            self.health.append(exc.code)
        except OSError:
            pass  # not listening yet
        if self.health and self.health[-1] == 200:
            self.startup_s = time.monotonic() - self.t0
            return True
        if self.proc.poll() is not None:
            pytest.fail(f"SGLang exited with {self.proc.returncode} while starting:\n" + self.log.read_text(errors="replace")[-4000:])
        if time.monotonic() - self.t0 > STARTUP_TIMEOUT_S:
            pytest.fail(f"SGLang not healthy after {STARTUP_TIMEOUT_S} s:\n" + self.log.read_text(errors="replace")[-4000:])
        return False

    def stop(self) -> None:
        """SIGTERM to the whole group (launch_server forks a scheduler, a detokenizer and a resource
        tracker), then SIGKILL to stragglers."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def facts(self) -> dict:
        """url, log, health (the /health codes seen while starting), startup_s."""
        return {"url": self.url, "log": self.log, "health": self.health, "startup_s": self.startup_s}


@contextlib.contextmanager
def running_servers(python: str, model: Path, logs: list[Path]) -> Iterator[list[dict]]:
    """``len(logs)`` servers of ``model``, started side by side; yields each one's ``Launch.facts()``
    plus ``model`` once all answer /health 200; stops them all on exit."""
    launches: list[Launch] = []
    try:
        for log in logs:
            launches.append(Launch(python, model, log))
        waiting = list(launches)
        while waiting:
            waiting = [s for s in waiting if not s.poll_healthy()]
            time.sleep(0.25)
        yield [{**s.facts(), "model": str(model)} for s in launches]
    finally:
        for s in launches:
            s.stop()


def flush_cache(url: str) -> None:
    """Empty the server's radix cache (``POST /flush_cache``; it answers 200 when nothing is running)."""
    status, body = http(url + "/flush_cache", {})
    assert status == 200, (status, body)


def turn_ending_model(base: Path, dest: Path, eot_boost: float = 1.7) -> Path:
    """A copy of the tiny random Qwen3 in ``base`` (examples/tiny_model.py) whose replies end in
    ``<|im_end|>`` after a few tokens: 1-28, ~7 on average, seen from SGLang with dqa's default
    sampling (temperature 0.6, top_p 0.95, top_k 20). The random model alone almost never samples
    ``<|im_end|>``, so every reply runs to ``max_new_tokens`` and a conversation stops after its
    first turn (dqa continues one only after a turn finished ``ok``).

    How: hidden dimension 0 is made a constant. Every token's embedding has ``0.02`` there (the
    init's std) and no layer writes to it (row 0 of each ``o_proj`` and ``down_proj`` zeroed), so
    the final norm's dimension 0 is positive at every position. With tied embeddings every token's
    logit gets the same ``0.02 * h0`` (which softmax ignores) except ``<|im_end|>``'s, whose
    dimension 0 is ``0.02 + eot_boost``. Returns ``dest`` (rebuilt when present)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(base / "model.safetensors"))
    emb = weights["model.embed_tokens.weight"]
    emb[:, 0] = 0.02
    emb[IM_END, 0] = 0.02 + eot_boost
    for key, w in weights.items():
        if key.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            w[0, :] = 0.0
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest, ignore=shutil.ignore_patterns("model.safetensors"))
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest
