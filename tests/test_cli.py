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
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 3
    assert capsys.readouterr().err == "dqa: error: interrupted\n"
