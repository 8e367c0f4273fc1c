"""The run's event loop (``regen.dispatch.link.Link``) under SIGINT/SIGTERM: a signal stops the
step being run as a cancellation, so it unwinds every task it started and the process's handler's
``KeyboardInterrupt`` comes out of ``Link.run`` once, with nothing printed by asyncio. The CLI's
signal campaign (reliability/test_regen_signals.py) lands signals at random instants; these pin the
instant that once leaked a traceback: a signal while a task is running Python code (aiohttp
connecting, during the start-up probe)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import asyncio, os, signal, sys, threading, time, types
    from dqa.commands.common import interrupt_handler
    from dqa.regen.config import DispatchSpec
    from dqa.regen.dispatch.link import Link

    signal.signal(signal.SIGINT, interrupt_handler)
    signal.signal(signal.SIGTERM, interrupt_handler)
    servers = types.SimpleNamespace(urls=["http://127.0.0.1:9"], headers={}, protocol=None)
    link = Link(DispatchSpec(endpoints=("http://127.0.0.1:9",)), servers, None, signals=SIGNALS)
    unwound = []

    async def busy():  # a task running Python code when the signal lands
        try:
            end = time.monotonic() + 1
            while time.monotonic() < end:
                pass
        finally:
            unwound.append("busy")

    async def waiting():
        try:
            await asyncio.sleep(5)
        finally:
            unwound.append("waiting")

    async def step():
        await asyncio.gather(waiting(), busy())  # waiting starts first, then busy holds the loop

    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIG)).start()
    t0 = time.monotonic()
    try:
        link.run(step())
        print("no interrupt")
    except KeyboardInterrupt:
        print("interrupted", time.monotonic() - t0 < 4, sorted(unwound))
    print("handler back", signal.getsignal(signal.SIG) is interrupt_handler)
    link.close()
    print("closed")
""")


def run_script(sig: str, signals: bool) -> subprocess.CompletedProcess:
    code = SCRIPT.replace("SIGNALS", str(signals)).replace("signal.SIG)", f"signal.{sig})")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_signal_while_a_task_runs_stops_the_step_once_and_asyncio_prints_nothing():
    for sig in ("SIGTERM", "SIGINT"):
        p = run_script(sig, signals=True)
        assert p.returncode == 0, p.stderr
        # A cancellation reaches a task at its next await: the busy task runs its second to the end,
        # the waiting one is cancelled in its sleep, and both have unwound when Link.run raises.
        assert p.stdout.splitlines() == ["interrupted True ['busy', 'waiting']", "handler back True", "closed"], p.stdout
        assert p.stderr == "", p.stderr  # no "Task exception was never retrieved", no traceback


def test_without_signal_handling_the_link_leaves_the_process_handlers_alone():
    p = run_script("SIGTERM", signals=False)
    # The process's own handler raises inside the busy task, as Python does anywhere.
    assert "handler back True" in p.stdout
    assert "interrupted" in p.stdout
