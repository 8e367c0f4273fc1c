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
