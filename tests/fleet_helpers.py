"""Helpers for the fleet tests: free ports, a stand-in for `python -m sglang.launch_server`,
the CLI as a real subprocess, and process checks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

STUB = Path(__file__).parent / "servers" / "sglang_contract.py"
REPO = Path(__file__).resolve().parent.parent


def free_port_base(n: int, start: int = 20000, stop: int = 60000) -> int:
    """A port p such that p .. p+n-1 are all free on 127.0.0.1 right now."""
    import random

    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(start, stop - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def fake_sglang_python(folder: Path, fail_gpu: str | None = None) -> Path:
    """An executable that stands in for the Python of an SGLang node: called as
    ``PY -m sglang.launch_server FLAGS``, it runs the SGLang-contract stub server with FLAGS.
    With ``fail_gpu``, the server of that GPU dies 3 s into its start like a CUDA out-of-memory
    (after the others are up)."""
    path = folder / "python-with-sglang"
    fail = ""
    if fail_gpu is not None:
        fail = (
            f'if [ "$CUDA_VISIBLE_DEVICES" = "{fail_gpu}" ]; then\n'
            '  echo "loading weights"; sleep 3; echo "torch.OutOfMemoryError: CUDA out of memory on this GPU"; exit 1\n'
            "fi\n"
        )
    path.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ] || { echo "unexpected: $*"; exit 2; }\n'
        "shift 2\n" + fail + f'exec "{sys.executable}" "{STUB}" "$@"\n'
    )
    path.chmod(0o755)
    return path


def dqa(*args: str, cwd: Path, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the dqa CLI as a real subprocess (as an operator would)."""
    return subprocess.run(
        [sys.executable, "-m", "dqa.cli", *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie waiting for its reaper counts as gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def write_failing_set(folder: Path, n: int = 6) -> tuple[Path, Path]:
    """``n`` degenerate thinking-off samples (the seed's "OK." answers, real Qwen3 template) in
    ``folder/train.parquet`` and a scan folder whose findings.parquet lists them all."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from chatdata import conversation, render, write_parquet

    rows = [render(conversation(f"Question {i}: what is {i} + {i}?", None, "OK."), enable_thinking=False) for i in range(n)]
    data = write_parquet(folder / "train.parquet", rows, ids=[f"s{i}" for i in range(n)])
    scan = folder / "scan"
    scan.mkdir(exist_ok=True)
    findings = pa.table(
        {"row": pa.array(range(n), pa.int64()), "id": [f"s{i}" for i in range(n)], "reasons": [["degenerate_template"]] * n}
    )
    pq.write_table(findings, scan / "findings.parquet")
    return Path(data), scan
