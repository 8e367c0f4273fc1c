"""Every command's --help follows click's conventions: a flag shows no metavar (it takes no
value), a value option shows TEXT, INTEGER, FLOAT, PATH or a choice [a|b], and an argument reads
DATASET in the help and DATASET / [DATASET] in the usage line. (typer >= 0.2x shows Python types
instead: `--json <bool>`, `<str>`, `<path>`, `{dataset}`.)"""

from __future__ import annotations

import re

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from dqa.cli import app

# What typer prints for Python types (`<bool>`, `<str>`, `<list[str]>`, `<int range>`, ...).
PYTHON_TYPE = re.compile(r"<(?:bool|str|int|float|path|file|directory|datetime|list\[[^\]]*\]|[a-z]+ range)>")
METAVAR = re.compile(r"^(?:TEXT|INTEGER|FLOAT|PATH|BOOLEAN|DATETIME|[A-Z][A-Z_]*|\[[\w|.-]+\]|\[-- [A-Z .]+\])$")
VALUE_TYPES = {"TEXT", "INTEGER", "FLOAT", "PATH"}


def _commands(cmd, path=()):
    """(path, click command) for every command and group of the app, the root first."""
    yield path, cmd
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        yield from _commands(sub, (*path, name))


ROOT = typer.main.get_command(app)
ALL = [(path, cmd) for path, cmd in _commands(ROOT)]


def _help(path: tuple[str, ...]) -> str:
    r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    return r.stdout


def _row_cells(text: str, name: str) -> list[str]:
    """The cells of the help table row of ``name`` (an option or argument, its first cell)."""
    for line in text.splitlines():
        if line.startswith("│"):
            cells = [c for c in re.split(r"\s{2,}", line.strip("│ ")) if c and c != "*"]
            if cells and cells[0].split(",")[0] == name:
                return cells
    raise AssertionError(f"no help row lists {name!r}")


def _params(cmd):
    """The command's parameters as its help lists them (``--help`` included)."""
    return cmd.get_params(typer.Context(cmd))


@pytest.mark.parametrize("path", [p for p, _ in ALL], ids=lambda p: " ".join(("dqa", *p)))
def test_help_shows_click_style_metavars(path):
    cmd = dict(ALL)[path]
    text = _help(path)
    assert not PYTHON_TYPE.search(text), PYTHON_TYPE.search(text).group(0)
    usage = next(ln for ln in text.splitlines() if "Usage:" in ln)
    assert not re.search(r"\{\w+\}|\[\[", usage), usage  # typer's {dataset}, or a metavar bracketed twice
    for p in _params(cmd):
        if p.param_type_name == "argument":
            cells = _row_cells(text, p.metavar)
            assert cells[0] == p.metavar and METAVAR.match(p.metavar), cells
            assert cells[1] in VALUE_TYPES, cells  # the argument's value type, as for options
            explicit = p.metavar.startswith("[")
            piece = p.metavar if explicit or p.required else f"[{p.metavar}]"
            assert piece in usage, (piece, usage)
            continue
        cells = _row_cells(text, p.opts[0])
        help_cell = cells[-1]
        before_help = cells[:-1]
        if p.is_flag:
            assert not [c for c in before_help if METAVAR.match(c)], f"flag {p.opts[0]} shows a metavar: {cells}"
            assert help_cell and not METAVAR.match(help_cell), cells
        else:
            shown = [c for c in before_help if METAVAR.match(c)]
            assert len(shown) == 1, f"{p.opts[0]}: {cells}"
            assert shown[0] in VALUE_TYPES or shown[0] == p.metavar, f"{p.opts[0]}: {cells}"


def test_arguments_read_in_capitals_and_required_ones_without_brackets():
    assert "Usage: dqa scan [OPTIONS] [DATASET]" in _help(("scan",))
    assert "Usage: dqa regen [OPTIONS] DATASET" in _help(("regen",))
    assert "Usage: dqa fleet up [OPTIONS] [-- SERVER FLAGS...]" in _help(("fleet", "up"))


def test_a_choice_metavar_reads_like_clicks_choice_and_flags_show_nothing():
    text = _help(("merge",))
    assert "[keep|drop]" in _row_cells(text, "--failed")
    assert _row_cells(text, "--force")[1].startswith("Replace --out")
    up = _help(("fleet", "up"))
    assert _row_cells(up, "--dry-run")[0] == "--dry-run"
    assert _row_cells(up, "--dry-run")[1].startswith("Print the exact commands")
    assert _row_cells(up, "--port-base")[1] == "INTEGER"
    assert _row_cells(up, "--timeout")[1] == "FLOAT"
    assert _row_cells(up, "--stage")[1] == "PATH"
    assert _row_cells(up, "--env")[1] == "TEXT"  # repeatable: the element's type, as click shows it


def test_a_missing_required_argument_is_named_as_in_the_help():
    r = CliRunner().invoke(app, ["regen"])
    assert r.exit_code == 2 and "DATASET" in r.output


# A page of the repository the help may cite: docs/PAGE.md or a top-level NAME.md (not an output file such as summary.md).
DOC_PATH = re.compile(r"\b(docs/[\w./-]+\.md|[A-Z][A-Z_]+\.md)\b")


@pytest.mark.parametrize("path", [p for p, _ in ALL], ids=lambda p: " ".join(("dqa", *p)))
def test_help_points_at_files_that_are_in_the_repository(path):
    """A page the help cites is in the repository (the manual moved from the README to docs/, so
    "see README" for a command's option is a dead end), and an extra in brackets survives rich markup."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = " ".join(_help(path).replace("│", " ").split())  # one line: the table wraps names
    assert "see README" not in text, f"dqa {' '.join(path)} --help cites the README for what docs/ documents"
    for name in DOC_PATH.findall(text):
        assert (root / name).is_file(), f"dqa {' '.join(path)} --help cites {name}, which is not in the repository"
    if "--report-to" in text:
        assert "pip install 'dqa[wandb]'" in text, "rich markup ate the extra's [wandb]"
