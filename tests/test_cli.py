"""The `dqa` entry point: version, help, and exit code 2 for usage errors."""

from __future__ import annotations

import subprocess
import sys

from dqa import __version__
from dqa.cli import COMMANDS


def dqa(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dqa.cli", *args], capture_output=True, text=True, timeout=120)


def test_version():
    r = dqa("--version")
    assert (r.returncode, r.stdout.strip()) == (0, f"dqa {__version__}")


def test_help_lists_every_command():
    r = dqa("--help")
    assert r.returncode == 0
    for name in COMMANDS:
        assert name in r.stdout, name


def test_usage_errors_exit_2_in_one_line():
    for args in (("scan",), ("no-such-command",), ()):
        r = dqa(*args)
        assert r.returncode == 2, args
        assert "Traceback" not in r.stderr


def test_a_signal_while_the_command_tree_is_built_exits_3_in_one_line(monkeypatch, capsys):
    """SIGTERM/SIGINT raise KeyboardInterrupt from the moment main() installs its handler. One that
    lands while typer builds the commands (before any command body: seen under load in the signal
    campaign) ends like a stopped command, exit 3 and one line, not a traceback and a signal death."""
    import pytest

    import dqa.cli as cli

    def building(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "app", building)
    hook = sys.unraisablehook
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 3
    assert capsys.readouterr().err == "dqa: error: interrupted\n"
    assert sys.unraisablehook is hook  # main() leaves the host program's hook as it was


def test_an_interrupt_swallowed_by_a_callback_is_delivered_again_without_a_traceback(monkeypatch, capsys):
    """A SIGTERM/SIGINT whose KeyboardInterrupt lands in a weakref (or import-lock) callback would be
    printed as 'Exception ignored ... Traceback' and lost; the CLI's hook raises it again outside."""
    import signal
    import threading
    import time
    import weakref

    import pytest

    from dqa.commands import common
    from dqa.commands.common import interrupt_handler, redeliver_swallowed_interrupt

    class Thing:
        pass

    def callback(ref):
        raise KeyboardInterrupt  # what interrupt_handler does when the signal lands here

    monkeypatch.setattr(sys, "unraisablehook", redeliver_swallowed_interrupt)
    monkeypatch.setattr(common, "_stopping", False)  # a command still running (main() of an earlier test ended)
    previous = signal.signal(signal.SIGINT, interrupt_handler)  # as dqa.cli.main sets it
    thing = Thing()
    ref = weakref.ref(thing, callback)
    try:
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            del thing  # the callback runs here and its exception cannot propagate
            threading.Event().wait(10)  # a real signal: even a blocked wait is woken
        assert time.monotonic() - t0 < 5
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ref() is None
    assert "Traceback" not in capsys.readouterr().err


def test_other_unraisable_errors_still_reach_the_default_hook(monkeypatch):
    from dqa.commands import common

    seen = []
    monkeypatch.setattr(sys, "__unraisablehook__", seen.append)

    class Args:
        exc_value = ValueError("boom")

    common.redeliver_swallowed_interrupt(Args)
    assert seen == [Args]


def test_a_swallowed_interrupt_is_not_delivered_twice_when_another_came_meanwhile(monkeypatch):
    """A real signal handled before the re-delivery is due makes it moot: one interrupt, not two."""
    import signal
    import time

    from dqa.commands import common

    monkeypatch.setattr(common, "_stopping", False)
    sent = []
    monkeypatch.setattr(signal, "pthread_kill", lambda tid, sig: sent.append(sig))

    class Swallowed:
        exc_value = KeyboardInterrupt()

    common.redeliver_swallowed_interrupt(Swallowed)
    monkeypatch.setattr(common, "_interrupts", common._interrupts + 1)  # interrupt_handler raised again meanwhile
    time.sleep(0.2)
    assert sent == []
    common.redeliver_swallowed_interrupt(Swallowed)
    time.sleep(0.2)
    assert sent == [signal.SIGINT]
