"""The ``dqa`` command line: a thin typer app; each command lives in ``dqa.commands.<name>``."""

from __future__ import annotations

import importlib
import importlib.util

import typer

from dqa.commands.common import ClickStyleGroup

app = typer.Typer(
    name="dqa",
    help=(
        "Audit, regenerate and gate tokenized LLM training sets.\n\n"
        "Typical flow: dqa scan DATA -> dqa regen DATA --failed-only -> dqa merge -> dqa gate; or all of it, round after round: dqa repair.\n\n"
        "Exit codes: 0 ok, 1 quality failure, 2 usage or input error, 3 runtime failure."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    # Help in click's conventions (flags without a metavar, TEXT/INTEGER/PATH, DATASET) for every
    # command: see dqa.commands.common.
    cls=ClickStyleGroup,
)

# Commands in the order `dqa --help` lists them.
COMMANDS = ["scan", "plan", "fleet", "regen", "merge", "repair", "validate", "gate", "report"]

for _name in COMMANDS:
    if importlib.util.find_spec(f"dqa.commands.{_name}") is not None:
        importlib.import_module(f"dqa.commands.{_name}").register(app)


def _print_version(value: bool) -> None:
    if value:
        from dqa import __version__

        typer.echo(f"dqa {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
    ),
) -> None:
    """Options that apply before any command."""


def main() -> None:
    """Console-script entry point.

    SIGTERM stops a command like Ctrl-C: ``KeyboardInterrupt``, which every command turns into
    exit 3 with no half-written output. Once a command has begun to end, later signals are
    ignored so they cannot cut its cleanup or the exit short (``dqa regen`` handles its own signals
    while it dispatches: first drains, second cancels).
    """
    import signal
    import sys

    from dqa.commands.common import interrupt_handler, redeliver_swallowed_interrupt, stop_interrupts

    signal.signal(signal.SIGINT, interrupt_handler)
    signal.signal(signal.SIGTERM, interrupt_handler)
    previous_hook, sys.unraisablehook = sys.unraisablehook, redeliver_swallowed_interrupt
    try:
        app()
    except KeyboardInterrupt:
        # A signal while typer builds the command tree (before any command body, so nothing is open
        # or written yet): the same one line and exit 3 as a command that was stopped.
        stop_interrupts()
        print("dqa: error: interrupted", file=sys.stderr)
        raise SystemExit(3) from None
    except SystemExit as exc:
        stop_interrupts()
        if exc.code != 130:
            raise
        # typer turns a Ctrl-C that lands before the command body (argument parsing) into a silent 130.
        print("dqa: error: interrupted", file=sys.stderr)
        raise SystemExit(3) from None
    finally:
        stop_interrupts()
        # Interpreter shutdown resets Python-level handlers to the default action (a late signal
        # would turn the exit code into a signal death) but leaves ignored signals ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.unraisablehook = previous_hook  # main() may run inside another program (tests)
        # CPython (3.11) remembers a KeyboardInterrupt that escaped any exec() of a source string
        # (dataclasses build methods that way while modules import) even when a command caught it
        # later, and then ends the process by SIGINT instead of our exit code. An exec() that
        # completes clears that flag.
        exec("pass")


if __name__ == "__main__":
    main()
