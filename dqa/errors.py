"""Errors that map to dqa's exit codes.

Every command exits with: 0 ok; 1 quality failure; 2 usage or input error;
3 runtime failure. Code raises one of the classes below with a message that
names the file, row or column and what was expected; the CLI prints that one
line and exits with the class's code, never a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_QUALITY = 1
EXIT_INPUT = 2
EXIT_RUNTIME = 3


class DqaError(Exception):
    """Base class: a failure the user can act on. ``exit_code`` is what the CLI returns."""

    exit_code = EXIT_RUNTIME


class InputError(DqaError):
    """Bad input data or a bad argument: a file, row or column that is not what was expected."""

    exit_code = EXIT_INPUT


class UsageError(InputError):
    """Bad command-line usage (conflicting or missing options)."""


class RuntimeFailure(DqaError):
    """The run could not finish: fleet unreachable, disk full, interrupted."""

    exit_code = EXIT_RUNTIME


class RegenStopped(RuntimeFailure):
    """A regeneration ended before every selected row was recorded (interrupted, fleet down, a request
    every server rejects, every request failed); rerunning resumes it. ``result`` is the run's
    ``RunResult`` (``progress`` says how far it got); ``exit_code`` the code the CLI exits with."""

    def __init__(self, message: str, result: object = None, exit_code: int = EXIT_RUNTIME):
        super().__init__(message)
        self.result = result
        self.exit_code = exit_code
