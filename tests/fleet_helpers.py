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


def ephemeral_port_low() -> int:
    """The first port of the kernel's ephemeral range (Linux ``ip_local_port_range``; 32768, its
    default, where it cannot be read). Outgoing connections of every process on the machine take
    their local ports from that range at any moment, so a test port chosen there can be taken
    between the check that it is free and the server's bind."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_HANDED_OUT: set[int] = set()  # ports this process has handed out already


def free_port_base(n: int, start: int = 10000, stop: int | None = None) -> int:
    """A port p such that p .. p+n-1 are all free on 127.0.0.1 right now.

    For servers that need explicit, contiguous ports (``dqa fleet up --port-base``); everywhere
    else bind port 0. Drawn at random (per process) from [start, stop), by default below the
    ephemeral range, so that only another explicit bind can take them; never a port this process
    handed out before.
    """
    import random

    stop = min(stop if stop is not None else ephemeral_port_low(), 65536)
    if stop - n <= start:
        raise RuntimeError(f"no room for {n} ports in [{start}, {stop})")
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(start, stop - n + 1)
        ports = range(base, base + n)
        if _HANDED_OUT.intersection(ports):
            continue
        socks = []
        try:
            for port in ports:
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            _HANDED_OUT.update(ports)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


PORT_TAKEN = ("address already in use", "is not free")  # a bind or dqa's port check lost a race


def port_race(text: str) -> bool:
    """Whether ``text`` (dqa fleet up's stderr, which ends with the failed server's log tail) says a
    port was taken by another process: the only failure ``fleet_up`` retries."""
    low = text.lower()
    return any(m in low for m in PORT_TAKEN)


def fleet_up(*args, ports: int, cwd: Path, tries: int = 3, run=None, **kw) -> tuple[subprocess.CompletedProcess, int]:
    """``dqa fleet up ARGS --port-base BASE`` on a freshly drawn base of ``ports`` ports; returns
    (the completed process, BASE). Only when the run failed because another process took one of
    the ports between the draw and the bind (``port_race``) is it run again on a fresh base: a
    collision with an unrelated program, not dqa's behaviour; any other outcome is returned as is.
    ``args`` must not hold ``--port-base``; it goes before a ``--`` that passes server flags. ``run``
    (default ``dqa``) runs the CLI."""
    assert "--port-base" not in map(str, args)
    args = list(args)
    at = args.index("--") if "--" in args else len(args)
    for k in range(tries):
        base = free_port_base(ports)
        r = (run or dqa)(*args[:at], "--port-base", base, *args[at:], cwd=cwd, **kw)
        if r.returncode == 0 or not port_race(r.stderr) or k == tries - 1:
            return r, base
        print(f"fleet up: a port of {base}..{base + ports - 1} was taken by another process; again on a fresh base")
    raise AssertionError("unreachable")


def listening_port(log: Path, proc: subprocess.Popen, pattern: str, timeout: float = 180) -> int:
    """The port a server started with ``--port 0`` reports in its log (``pattern``: a regex whose
    first group is the port), read once it appears; raises ``RuntimeError`` when the process ends
    first or nothing appears within ``timeout`` seconds (that only bounds a hang)."""
    import re

    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while True:
        m = rx.search(log.read_text(errors="replace")) if log.exists() else None
        if m:
            return int(m.group(1))
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server reported no listening port (exit {proc.poll()}); see {log}")
        time.sleep(0.2)


UVICORN_PORT = r"Uvicorn running on https?://[^\s:]+:(\d+)"  # `transformers serve` (uvicorn) once it listens


def fake_sglang_python(folder: Path, fail_gpu: str | None = None, fail_once_ready: Path | None = None) -> Path:
    """An executable that stands in for the Python of an SGLang node: called as
    ``PY -m sglang.launch_server FLAGS``, it runs the SGLang-contract stub server with FLAGS.
    With ``fail_gpu``, the server of that GPU dies like a CUDA out-of-memory during its start:
    3 s into it, or, with ``fail_once_ready`` (another server's log), once that log shows the
    stub's ready line (the others are up, however slowly this machine starts them; at most 120 s)."""
    import shlex

    path = folder / "python-with-sglang"
    fail = ""
    if fail_gpu is not None:
        wait = "sleep 3"
        if fail_once_ready is not None:
            log = shlex.quote(str(fail_once_ready))
            wait = f'i=0; while ! grep -q SGLANG_CONTRACT_READY {log} 2>/dev/null && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done'
        fail = (
            f'if [ "$CUDA_VISIBLE_DEVICES" = "{fail_gpu}" ]; then\n'
            f'  echo "loading weights"; {wait}; echo "torch.OutOfMemoryError: CUDA out of memory on this GPU"; exit 1\n'
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
