"""Helpers shared by the command modules: error handling, console, output modes, and the help's
metavars in click's conventions (``ClickStyleGroup``)."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, TypeVar

import typer
from typer.core import TyperGroup

from dqa.errors import EXIT_RUNTIME, DqaError

F = TypeVar("F", bound=Callable[..., Any])


def stderr_is_tty() -> bool:
    """True when progress bars and colour should be shown (an interactive terminal)."""
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


_stopping = False  # a command has begun to end: further SIGINT/SIGTERM are ignored
_interrupts = 0  # KeyboardInterrupts raised by interrupt_handler so far


def interrupt_handler(signum: int, frame: Any) -> None:
    """SIGINT/SIGTERM handler of the CLI process: ``KeyboardInterrupt`` (exit 3 through
    ``handles_errors``) until a command has begun to end; then nothing, so a second signal
    cannot cut its cleanup or exit short. An interrupt swallowed somewhere (a weakref
    callback) is delivered again (``redeliver_swallowed_interrupt``)."""
    global _interrupts
    if not _stopping:
        _interrupts += 1
        raise KeyboardInterrupt


def redeliver_swallowed_interrupt(unraisable: Any) -> None:
    """``sys.unraisablehook`` of the CLI process. ``interrupt_handler``'s ``KeyboardInterrupt`` can
    land inside a callback that cannot raise (a weakref or import-lock callback): Python would print
    a traceback and drop the interrupt, so the command would run on. The interrupt is delivered
    again instead: a SIGINT to the main thread 10 ms later, from a bare thread (by then that callback
    has returned, and a real signal also wakes a main thread blocked in a wait), unless another
    interrupt was raised meanwhile. Anything else goes to the default hook."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)
        return
    if _stopping:
        return
    import _thread
    import signal
    import threading
    import time

    seen, main = _interrupts, threading.main_thread().ident

    def later() -> None:
        time.sleep(0.01)
        if _interrupts == seen and not _stopping:
            signal.pthread_kill(main, signal.SIGINT)

    try:
        _thread.start_new_thread(later, ())  # not threading.Thread: no lock the interrupted code may hold
    except RuntimeError:  # the interpreter is shutting down: nothing left to interrupt
        pass


def stop_interrupts() -> None:
    """From now on ``interrupt_handler`` ignores signals (the process is ending)."""
    global _stopping
    _stopping = True


def fail(message: str, code: int) -> None:
    """Print ``dqa: error: message`` on one line to stderr and exit with ``code``."""
    from dqa.storage.faults import without_credentials

    stop_interrupts()
    first = without_credentials(" ".join(str(message).split("\n")[0].split()))  # a URL's user:password@ never shown
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


STORAGE_OPTION_HELP = (
    "A setting for the object store of any URL given (repeatable): KEY=VALUE, e.g. endpoint_url=http://127.0.0.1:9000, "
    "region=eu-west-1, anonymous=true (S3); an fsspec backend's own keyword arguments for other schemes. Credentials "
    "come from the SDKs' environment (AWS_*, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN) and are never printed."
)


def storage_option_param() -> Any:
    """The ``--storage-option KEY=VALUE`` option every command that takes a URL has (``dqa.storage.configure``)."""
    return typer.Option([], "--storage-option", help=STORAGE_OPTION_HELP)


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


# ------------------------------------------------------------------ help: click's conventions
#
# typer >= 0.2x (pyproject asks only for typer>=0.12; CI gets the newest) renders each parameter's
# *Python* type in its help: `--json <bool>` (a flag, as if it took a value), `<str>`, `<path>`,
# `<list[str]>`, and arguments by their Python name, `{dataset}` when required and `[dataset]`
# when optional. ``ClickStyleGroup`` (the root group's class, see dqa/cli.py) restores click's
# conventions for every command at once: flags show no metavar; values show TEXT, INTEGER, FLOAT,
# PATH or a choice [a|b] (an explicit ``metavar=`` is kept); arguments read DATASET in the help
# and DATASET / [DATASET] / [NAME]... in the usage line.

_TYPE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "BOOLEAN", "Path": "PATH", "datetime": "DATETIME"}


def type_metavar(param: Any) -> str:
    """The click-style name of ``param``'s value type: TEXT, INTEGER, FLOAT, BOOLEAN, PATH,
    DATETIME or ``[a|b]`` for a choice (an element's type for a repeatable option)."""
    import typing

    desc = getattr(param, "type_descriptor", None)
    if desc is None:  # an older typer: a click ParamType
        ptype = getattr(param, "type", None)
        return getattr(ptype, "name", "text").upper()
    choices = getattr(desc, "choices", None)
    if choices:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in choices) + "]"
    if getattr(desc, "is_path", False):
        return "PATH"
    ann = desc.annotation
    if typing.get_origin(ann) in (list, tuple) and typing.get_args(ann):
        ann = typing.get_args(ann)[0]
    name = getattr(ann, "__name__", str(ann))
    return _TYPE_NAMES.get(name, name.upper())


def _is_flag(param: Any) -> bool:
    return bool(getattr(param, "is_flag", False) or getattr(param, "count", False))


def _param_type_column(param: Any) -> str | None:
    """What the help shows after a parameter's name: nothing for a flag, the value's type for an
    argument (whose metavar is its name), else the metavar."""
    if _is_flag(param):
        return None
    if getattr(param, "param_type_name", "") == "argument":
        return type_metavar(param)
    return param.metavar or type_metavar(param)


def _argument_usage(param: Any) -> str:
    """An argument in the usage line: a metavar the command gave, verbatim (as click does); else
    NAME when required, [NAME] when optional, then ... when it takes several values."""
    if not getattr(param, "_dqa_named", False):
        return param.metavar
    name = param.metavar if param.required else f"[{param.metavar}]"
    return name + ("..." if param.nargs != 1 else "")


_subclasses: dict[type, type] = {}


def _restyle(obj: Any) -> None:
    """Make ``obj`` (a typer parameter or command) an instance of a subclass of its own class that
    renders its help in click's conventions. (A mixin listed first cannot be assigned to
    ``__class__``: the layouts of an ABC subclass differ, so the subclass is made per class.)"""
    base = type(obj)
    if getattr(base, "_dqa_click_style", False):
        return
    if base not in _subclasses:
        body: dict[str, Any] = {"_dqa_click_style": True, "__module__": __name__, "__doc__": base.__doc__}
        if hasattr(base, "param_type_name"):  # a parameter
            body["display_type_rich"] = lambda self, ctx: _param_type_column(self)
            if base.param_type_name == "argument":
                body["get_usage_pieces"] = lambda self, ctx: [_argument_usage(self)]
        else:  # a command or group
            def get_help_option(self: Any, ctx: Any, _base: type = base) -> Any:
                opt = _base.get_help_option(self, ctx)
                if opt is not None:
                    _click_style_param(opt)
                return opt

            body["get_help_option"] = get_help_option
        _subclasses[base] = type(f"ClickStyle{base.__name__}", (base,), body)
    obj.__class__ = _subclasses[base]


def _click_style_param(param: Any) -> None:
    if getattr(param, "param_type_name", "") == "argument":
        if param.metavar is None:
            param.metavar = (param.name or "ARG").upper()
            param._dqa_named = True
    elif not _is_flag(param):
        if param.metavar and "|" in param.metavar and not param.metavar.startswith(("[", "{")):
            param.metavar = f"[{param.metavar}]"  # a choice written as keep|drop
        elif not param.metavar:
            param.metavar = type_metavar(param)
    _restyle(param)


def click_style_help(command: Any) -> None:
    """Give ``command``, its subcommands and all their parameters click's help conventions
    (see above). Returns nothing; safe to call twice."""
    _restyle(command)
    for param in command.params:
        _click_style_param(param)
    for sub in (getattr(command, "commands", None) or {}).values():
        click_style_help(sub)


class ClickStyleGroup(TyperGroup):
    """The root group of ``dqa``: built with every command in it, then ``click_style_help``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        click_style_help(self)
