"""Graceful stops of the `dqa regen` driver at random instants: SIGTERM, Ctrl-C (SIGINT), Ctrl-C
twice, SIGTERM then Ctrl-C, each landing anywhere from interpreter start-up through dataset
loading, recovery, dispatch, draining and the final flush.

After every stop: exit 3 with exactly one ``dqa: error:`` line and no traceback; every shard on
disk reads completely and no row is in two places; ``progress.json`` (when written) parses and,
once dispatch has begun, says ``interrupted`` with nothing in flight. The same command run again
after the last stop finishes with every selected row exactly once, with the server's tokens.

kill -9 of the same driver is helper F's campaign (test_regen_crash_campaign.py); this file only
sends the signals a person or a scheduler sends. Soak (DQA_SOAK=1): 60 stops instead of 12.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from regen_harness import (
    MAX_NEW_TOKENS,
    SECRET,
    SECRET_ENV,
    assert_exactly_once,
    assert_no_duplicate_rows,
    build_regen_data,
    soak,
    start_fleet,
    wait_until,
)

PATTERNS = {
    "SIGINT": (signal.SIGINT,),
    "SIGTERM": (signal.SIGTERM,),
    "SIGINT x2": (signal.SIGINT, signal.SIGINT),
    "SIGTERM+SIGINT": (signal.SIGTERM, signal.SIGINT),
}

STATS: dict = {}  # read by RELIABILITY.md's author from the -s output


def regen_cmd(data, out: Path, fleet, in_flight: int) -> list[str]:
    cmd = [sys.executable, "-m", "dqa.cli", "regen", str(data.dataset), "--findings", str(data.findings), "--out", str(out),
           "--api-key-env", SECRET_ENV, "--max-new-tokens", str(MAX_NEW_TOKENS), "--shard-rows", "15",
           "--max-in-flight", str(in_flight)]
    for s in fleet:
        cmd += ["-e", s.url]
    return cmd


def launch(cmd: list[str], err: Path) -> subprocess.Popen:
    env = {**os.environ, SECRET_ENV: SECRET}
    env.pop("DQA_DEBUG", None)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(err, "wb"))


def generated(fleet) -> int:
    return sum(s.status()["n_generate"] for s in fleet)


def pause(seconds: float, p: subprocess.Popen, fleet, before: int, cap: int) -> None:
    """Sleep ``seconds``, or less: until the run ``p`` ended or has sent ``cap`` requests (the fleet's
    count above ``before``), polled 20 times a second. However fast the machine runs the driver
    compared with the start-up last seen, one run cannot do more than its share of the work."""
    end = time.perf_counter() + seconds
    while p.poll() is None and generated(fleet) - before < cap:
        left = end - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(0.05, left))


def dqa_handler_installed(pid: int) -> bool | None:
    """Whether process ``pid`` catches SIGTERM, i.e. dqa's entry point has installed its handler (Python
    itself only catches SIGINT); None where /proc cannot tell."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, ValueError):
        return None
    return None


def test_sigterm_and_ctrl_c_at_random_instants_then_resume_exactly_once(tmp_path):
    stops_wanted = 60 if soak() else 12
    data = build_regen_data(tmp_path / "data", rows=12000 if soak() else 3000)
    fleet = start_fleet(tmp_path / "fleet", 3)
    out = tmp_path / "out"
    rng = random.Random(int(os.environ.get("DQA_SIGNAL_SEED", "20261201")))
    cmd = regen_cmd(data, out, fleet, in_flight=2)
    log: list[dict] = []
    try:
        # The interpreter's own start (no dqa handler yet), measured generously.
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import dqa.cli"], check=True)
        interpreter_s = 1.5 * (time.perf_counter() - t0)
        # Measure start-up (interpreter, imports, dataset, selection) once, so instants can fall in it.
        err = tmp_path / "run-0.err"
        g0 = generated(fleet)
        p = launch(cmd, err)
        t0 = time.perf_counter()
        assert wait_until(lambda: generated(fleet) > 0 or p.poll() is not None, 60)
        startup = time.perf_counter() - t0
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 3, err.read_text()[-2000:]
        while len(log) < stops_wanted:
            err = tmp_path / f"run-{len(log) + 1}.err"
            before = generated(fleet)
            # Rows certainly left (each recorded row took a request): each stop leaves at least half
            # of them to the stops after it, so every stop lands before the run's end.
            left = data.selected.size - len(data.no_header) - (before - g0)
            cap = left // (2 * (stops_wanted - len(log)))
            assert cap >= 1, f"the workload is too small for {stops_wanted} stops"
            p = launch(cmd, err)
            t0 = time.perf_counter()
            name = rng.choice(list(PATTERNS))
            # Alternate the phase, and place instants by what is observed, not by one measured run:
            # start-up stops fall within the start-up last seen (it tracks the machine's load);
            # dispatch stops wait for the fleet's first request of this run.
            if len(log) % 2 == 0:
                pause(rng.uniform(0.0, 0.8 * startup), p, fleet, before, cap)
            else:
                assert wait_until(lambda: generated(fleet) > before or p.poll() is not None, 60)
                startup = time.perf_counter() - t0
                pause(rng.uniform(0.0, 0.5), p, fleet, before, cap)
            instant = time.perf_counter() - t0
            dispatching = generated(fleet) > before
            handler = dqa_handler_installed(p.pid)
            for k, sig in enumerate(PATTERNS[name]):
                if p.poll() is not None:
                    break
                p.send_signal(sig)
                if k + 1 < len(PATTERNS[name]):
                    time.sleep(rng.uniform(0.0, 0.4))
            try:
                rc = p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                raise AssertionError(f"{name} at {instant:.2f} s: the driver did not stop within 30 s")
            text = err.read_text()
            if rc == 0:  # only when the run finished before the signal; a swallowed signal is a bug
                assert assert_no_duplicate_rows(out) == data.selected.size, (
                    f"{name} at {instant:.2f} s: exit 0 with rows left (the signal was lost)\n{text[-2000:]}")
                break
            early = (not handler) if handler is not None else instant < interpreter_s
            if rc in (-signal.SIGTERM, -signal.SIGINT) and early and generated(fleet) == before:
                # Before dqa's entry point runs (interpreter start, `import dqa.cli`) the default
                # actions apply; nothing has been opened or written yet.
                log.append({"signals": name, "instant_s": round(instant, 2), "dispatching": False,
                            "rows": assert_no_duplicate_rows(out), "message": f"default action (exit {rc})"})
                continue
            assert rc == 3, f"{name} at {instant:.2f} s: exit {rc}\n{text[-2000:]}"
            assert "Traceback" not in text, f"{name} at {instant:.2f} s:\n{text[-3000:]}"
            errors = [line for line in text.splitlines() if line.startswith("dqa: error:")]
            assert len(errors) == 1, f"{name} at {instant:.2f} s: {text[-2000:]}"
            rows = assert_no_duplicate_rows(out)
            state = None
            if (out / "progress.json").exists():
                prog = json.loads((out / "progress.json").read_text())
                state = prog["state"]
                if dispatching:
                    assert state == "interrupted", f"{name} at {instant:.2f} s: progress.json state {state}"
                    assert prog["in_flight"] == 0
            assert not list((out / "shards").glob(".tmp-*")) if (out / "shards").exists() else True
            log.append({"signals": name, "instant_s": round(instant, 2), "dispatching": dispatching, "rows": rows,
                        "message": errors[0][len("dqa: error: "):][:60]})
        final = subprocess.run(regen_cmd(data, out, fleet, in_flight=8), env={**os.environ, SECRET_ENV: SECRET},
                               capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stderr[-2000:]
        counts = assert_exactly_once(out, data)
        assert json.loads((out / "progress.json").read_text())["state"] == "finished"
    finally:
        for s in fleet:
            s.kill()
    assert len(log) == stops_wanted, f"only {len(log)} stops landed before the run finished"
    assert any(e["dispatching"] for e in log) and any(not e["dispatching"] for e in log)
    by = {k: sum(e["signals"] == k for e in log) for k in PATTERNS}
    STATS.update(stops=len(log), by_pattern=by, startup_s=round(startup, 2), statuses=counts,
                 during_startup=sum(not e["dispatching"] for e in log), selected=int(data.selected.size))
    print(f"\nregen signal campaign: {json.dumps(STATS)}")
    for e in log:
        print(f"  {e}")
