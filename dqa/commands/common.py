"""Helpers shared by the command modules: error handling, console, output modes."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, TypeVar

import typer

from dqa.errors import EXIT_RUNTIME, DqaError

F = TypeVar("F", bound=Callable[..., Any])


def stderr_is_tty() -> bool:
    """True when progress bars and colour should be shown (an interactive terminal)."""
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


_stopping = False  # a command has begun to end: further SIGINT/SIGTERM are ignored


def interrupt_handler(signum: int, frame: Any) -> None:
    """SIGINT/SIGTERM handler of the CLI process: ``KeyboardInterrupt`` (exit 3 through
    ``handles_errors``) until a command has begun to end; then nothing, so a second signal
    cannot cut its cleanup or exit short. An interrupt swallowed somewhere (a weakref
    callback) leaves the next signal effective."""
    if not _stopping:
        raise KeyboardInterrupt


def stop_interrupts() -> None:
    """From now on ``interrupt_handler`` ignores signals (the process is ending)."""
    global _stopping
    _stopping = True


def fail(message: str, code: int) -> None:
    """Print ``dqa: error: message`` on one line to stderr and exit with ``code``."""
    stop_interrupts()
    first = " ".join(str(message).split("\n")[0].split())
    print(f"dqa: error: {first}", file=sys.stderr)
    raise typer.Exit(code)


def handles_errors(fn: F) -> F:
    """Turn ``DqaError`` into its one-line message and exit code; Ctrl-C into exit 3.

    Anything else is a bug in dqa: one line naming the exception and exit 3 (never 1, which
    means "quality failure"); ``DQA_DEBUG=1`` shows the traceback instead.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DqaError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_RUNTIME)
        except OSError as exc:
            if os.environ.get("DQA_DEBUG"):
                raise
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            fail(f"{where}{exc.strerror or exc}", EXIT_RUNTIME)
        except typer.Exit:
            raise
        except Exception as exc:  # a bug: still one line and a code that cannot read as "quality failure"
            if os.environ.get("DQA_DEBUG"):
                raise
            fail(f"internal error: {type(exc).__name__}: {exc} (rerun with DQA_DEBUG=1 for the traceback)", EXIT_RUNTIME)

    return wrapper  # type: ignore[return-value]


def console(stderr: bool = True):
    """A rich Console on stderr (progress, tables for people) or stdout (results)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def help_text(doc: str | None) -> str:
    """A docstring for ``--help``: each paragraph joined into one line so the terminal wraps it
    (rich keeps the source's newlines); paragraphs (and one-paragraph examples) stay apart."""
    import inspect

    paras = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paras)
