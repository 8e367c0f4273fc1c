"""Which files make up a dataset, and of which format: ``detect_files`` and the stored schemas.

A file is one dataset of the format its content shows (``dqa.audit.formats.detect_file``). A
folder is a Hugging Face ``save_to_disk`` folder (the Arrow stream files listed in its
``state.json``; a ``DatasetDict`` is refused, naming its splits), or a folder of shards of one
format (``_detect_folder``: parquet first, then Arrow, then JSONL; ``datasets`` cache folders
read as ``datasets`` wrote them). ``file_schema`` / ``read_schema`` read one file's stored
schema. Errors are ``InputError`` naming the file or folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa

from dqa.audit import formats
from dqa.audit.formats.base import FileFormat, unreadable
from dqa.errors import InputError
from dqa.storage import check_complete


def detect_files(path: Path) -> tuple[str, list[Path]]:
    """The format name and the data files (in dataset order) of the dataset at ``path`` (a file or a
    folder, see the module docstring). Raises ``InputError`` naming the file or folder when no
    dataset is found there."""
    if path.is_file():
        return formats.detect_file(path).name, [path]
    check_complete(path)
    # A folder: HF save_to_disk, or shards of one format.
    if (path / "dataset_dict.json").is_file():
        try:
            splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        except (ValueError, AttributeError, OSError) as exc:
            raise InputError(f"{path / 'dataset_dict.json'}: not a datasets DatasetDict file ({exc})") from None
        raise InputError(f"{path}: a DatasetDict; point dqa at one split folder ({', '.join(map(str, splits)) or 'none listed'})")
    if (path / "state.json").is_file():
        try:
            state = json.loads((path / "state.json").read_text())
            files = [path / d["filename"] for d in state["_data_files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{path / 'state.json'}: not a datasets save_to_disk state file ({exc})") from None
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise InputError(f"{missing[0]}: listed in state.json but missing")
        return "hf", files
    return _detect_folder(path)


def _detect_folder(path: Path) -> tuple[str, list[Path]]:
    """The shards of a folder (files under it, at any depth, in sorted path order; names starting
    with ``.`` are skipped).

    A file named with a dataset suffix (``.parquet``, ``.arrow``, ``.jsonl``, ...) is a shard, of
    the format its content shows (``formats.detect_file``: an empty or unrecognisable one is an
    error, never skipped). A file with another name is a shard when its magic bytes show parquet
    or Arrow IPC, and is otherwise left alone (a README, a licence, a ``.pt`` file). The first
    family present is read: parquet, then Arrow, then JSONL.

    Arrow streams are read as ``datasets`` wrote them: indices files (``.filter``/``.select``
    output, one ``indices`` column) are skipped, and streams with another name (SpecForge's
    ``KEY.pkl``, or ``KEY_00000_of_00008.pkl`` ... from ``num_proc`` processes) must be the shards
    of one cache, all of them present.
    """
    by_family: dict[str, list[tuple[Path, FileFormat, bool]]] = {}
    broken: dict[str, InputError] = {}  # per family: the first file named like it that is not
    for p in sorted(q for q in path.rglob("*") if q.is_file() and not q.name.startswith(".")):
        claimed = formats.family_of_name(p.name)
        if claimed is None:
            fmt = formats.sniff_magic(p)
        else:
            try:
                fmt = formats.detect_file(p)
            except InputError as exc:
                broken.setdefault(claimed, exc)
                continue
        if fmt is not None:
            by_family.setdefault(fmt.family, []).append((p, fmt, claimed is not None))
    for family in ("parquet", "arrow", "jsonl"):
        if family in broken:
            raise broken[family]
        found = by_family.get(family)
        if not found:
            continue
        if family == "arrow":
            found = _arrow_shards(path, found)
            if not found:
                break
        kinds = {fmt.name for _, fmt, _ in found}
        if family == "jsonl" and len(kinds) > 1:
            a = next(p for p, fmt, _ in found if fmt.name == "jsonl")
            b = next(p for p, fmt, _ in found if fmt.name == "conversations")
            raise InputError(f"{path}: mixes tokenized JSONL ({a.name}) and conversation JSONL ({b.name}); keep one kind per folder")
        if len(kinds) > 1:
            a = next(p for p, fmt, _ in found if fmt.name == "arrow-file")
            b = next(p for p, fmt, _ in found if fmt.name == "arrow-stream")
            raise InputError(f"{path}: mixes Arrow IPC files ({a.name}) and streams ({b.name}); keep one format per folder")
        return found[0][1].name, [p for p, _, _ in found]
    raise InputError(f"{path}: folder holds no dataset files (expected {formats.EXPECTED})")


def _arrow_shards(path: Path, found: list[tuple[Path, FileFormat, bool]]) -> list[tuple[Path, FileFormat, bool]]:
    """The Arrow files of a folder without ``datasets`` indices files; refuses several caches in one folder."""
    from dqa.audit.formats.arrow import cache_name, is_indices_file

    kept = []
    for p, fmt, named in found:
        if fmt.name == "arrow-stream" and is_indices_file(read_schema(p, fmt.name)):
            continue
        kept.append((p, fmt, named))
    caches: dict[tuple[Path, str, int], set[int]] = {}
    for p, fmt, named in kept:
        if fmt.name == "arrow-stream" and not named:
            base, rank, count = cache_name(p)
            caches.setdefault((p.parent, base, count), set()).add(rank)
    if len(caches) > 1:
        names = ", ".join(sorted(str((d / b).relative_to(path)) for d, b, _ in caches))
        raise InputError(
            f"{path}: holds more than one datasets cache ({names}); point dqa at one cache file, "
            "or at a folder holding one cache's files"
        )
    for (d, base, count), ranks in caches.items():
        missing = sorted(set(range(count)) - ranks)
        if missing:
            stem, ext = os.path.splitext(base)  # as datasets splits the cache_file_name
            miss = f"{stem}_{missing[0]:05d}_of_{count:05d}{ext}"
            raise InputError(f"{d / miss}: missing ({len(ranks)} of the {count} files of datasets cache {base} are there)")
    return kept


def file_schema(f: Path, fmt: str) -> pa.Schema | None:
    """The stored schema of one file (with its metadata); None for JSONL, which has none stored.

    Raises pyarrow or OS errors for unreadable files (``read_schema`` turns them into ``InputError``).
    """
    ff = formats.get(fmt)
    return ff.schema(f) if ff.typed else None


def read_schema(f: Path, fmt: str) -> pa.Schema:
    """The schema of ``f`` (JSONL: inferred from its rows). Raises ``InputError`` naming the file when it is unreadable."""
    try:
        return formats.get(fmt).schema(f)  # type: ignore[return-value]  # every format yields one (JSONL: inferred)
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise unreadable(f, f"{fmt} file", exc) from None
