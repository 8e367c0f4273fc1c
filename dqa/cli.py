"""The ``dqa`` command line: a thin typer app; each command lives in ``dqa.commands.<name>``."""

from __future__ import annotations

import importlib
import importlib.util

import typer

app = typer.Typer(
    name="dqa",
    help=(
        "Audit, regenerate and gate tokenized LLM training sets.\n\n"
        "Typical flow: dqa scan DATA -> dqa regen DATA --failed-only -> dqa merge -> dqa gate.\n\n"
        "Exit codes: 0 ok, 1 quality failure, 2 usage or input error, 3 runtime failure."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# Commands in the order `dqa --help` lists them.
COMMANDS = ["scan", "plan", "fleet", "regen", "merge", "validate", "gate", "report"]

for _name in COMMANDS:
    if importlib.util.find_spec(f"dqa.commands.{_name}") is not None:
        importlib.import_module(f"dqa.commands.{_name}").register(app)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    if version:
        from dqa import __version__

        typer.echo(f"dqa {__version__}")
        raise typer.Exit(0)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
