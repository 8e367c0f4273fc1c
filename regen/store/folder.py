"""The ``dqa regen`` output folder, owned in one place (FORMATS.md, ``dqa regen`` output folder).

* ``RunManifest``: ``run.json``, typed and versioned. ``dqa regen`` writes it; the run itself (a
  resume checks the folder's identity), ``dqa merge`` (selection, column overrides, tokenizer),
  ``dqa report`` (the dataset) and ``dqa plan --calibrate`` (through the run) read it.
  ``RunManifest.read`` is the one parser: a missing key reads as its default (version 1 files
  written before a key existed keep working), a key of the wrong type, a file that is not JSON or a
  version newer than this dqa knows is an ``InputError`` naming the file and what was expected.
* ``RunFolder``: the folder's paths (run.json, progress.json, the lock, the shards) and its
  policy: ``lock`` (one writer at a time), ``check_usable`` (a folder dqa regen made, or a new or
  empty one it can write) and ``check_identity`` (a resume goes into a folder made for the same
  dataset, selection and sampling). The shard store itself (columns, ``status`` values, where
  shards live) is ``store.shards``.

Version history of run.json: 1, the layout of ``RunManifest.to_json`` (files without
``version`` are read as 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Mapping

from dqa.errors import InputError
from dqa.regen.store.shards import SHARDS_DIR, list_shards

RUN_VERSION = 1  # the newest run.json layout this dqa writes and reads

RUN_JSON = "run.json"
PROGRESS_JSON = "progress.json"
JOURNAL_DIR = "journal"
LOCK_FILE = ".lock"
OWN_NAMES = frozenset({LOCK_FILE, RUN_JSON, PROGRESS_JSON, SHARDS_DIR, JOURNAL_DIR})  # what dqa regen puts in --out

# --------------------------------------------------------------------------------------------- run.json


def _no_columns() -> dict[str, str | None]:
    return {"ids": None, "mask": None, "labels": None, "id": None}


# key -> (accepted JSON types, what the message says was expected); None is accepted for every key
# but identity, columns, endpoints and mirror, which read a null as their default.
_EXPECT: dict[str, tuple[tuple[type, ...], str]] = {
    "version": ((int,), "a whole number"),
    "identity": ((dict,), "an object"),
    "dataset_path": ((str,), "a path"),
    "findings": ((str,), "a path"),
    "columns": ((dict,), "an object of column names"),
    "limit": ((int,), "a whole number"),
    "protocol": ((str,), "sglang or openai"),
    "model": ((str,), "a model name"),
    "endpoints": ((list,), "a list of URLs"),
    "max_in_flight": ((int,), "a whole number"),
    "gpus": ((int,), "a whole number"),
    "gpu_hour_cost": ((int, float), "a number"),
    "tokenizer": ((str,), "a tokenizer folder or preset"),
    "mirror": ((list,), "a list of URLs"),
    "servers": ((dict,), "an object (endpoint URL -> what the server said)"),
    "seed_applied": ((bool,), "true, false or null"),
    "updated_at": ((str,), "a UTC time"),
}


@dataclass(frozen=True)
class RunManifest:
    """``run.json``: what a ``dqa regen`` folder was made for (``identity``: dataset, selection,
    sampling; a resume must match it) and how the run was configured. Field per key, in file
    order; ``to_json`` writes exactly these keys, ``read`` parses them back."""

    identity: Mapping[str, Any] = field(default_factory=dict)  # {"dataset", "selection", "sampling"}
    dataset_path: str | None = None  # resolved
    findings: str | None = None  # absolute path; None with --all
    columns: Mapping[str, str | None] = field(default_factory=_no_columns)  # the overrides given (None: detected)
    limit: int | None = None
    protocol: str | None = None
    model: str | None = None
    endpoints: tuple[str, ...] = ()  # without URL credentials
    max_in_flight: int | None = None
    gpus: int | None = None
    gpu_hour_cost: float | None = None
    tokenizer: str | None = None  # absolute when a folder was given
    mirror: tuple[str, ...] = ()  # without URL credentials
    servers: Mapping[str, Any] | None = None  # endpoint -> ServerFacts.to_json() or None (never reached)
    seed_applied: bool | None = None
    updated_at: str | None = None
    version: int = RUN_VERSION

    # --- identity parts -------------------------------------------------------------------------

    @property
    def selection(self) -> dict[str, Any] | None:
        """``identity.selection`` (failed_only, reasons, rows_sha256, shard, turns), None when absent."""
        sel = self.identity.get("selection")
        return sel if isinstance(sel, dict) else None

    @property
    def dataset_rows(self) -> int | None:
        """``identity.dataset.rows``: the row count of the dataset the run read; None when absent."""
        ds = self.identity.get("dataset")
        rows = ds.get("rows") if isinstance(ds, dict) else None
        return rows if isinstance(rows, int) and not isinstance(rows, bool) else None

    def column(self, key: str) -> str | None:
        """The ``--<key>-column`` override the run was given (``ids``, ``mask``, ``labels``, ``id``)."""
        value = self.columns.get(key)
        return value if isinstance(value, str) else None

    # --- file -----------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The JSON object for run.json (``version`` first, then the keys in field order)."""
        obj: dict[str, Any] = {"version": self.version}
        for f in fields(self):
            if f.name == "version":
                continue
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            obj[f.name] = value
        return obj

    def write(self, path: Path) -> None:
        """Write atomically (temp file + fsync + rename) to ``path``."""
        from dqa import atomic

        atomic.write_json(path, self.to_json())

    @classmethod
    def from_json(cls, obj: Any, path: Path | str = RUN_JSON) -> RunManifest:
        """Parse a run.json object. Raises ``InputError`` (one line naming ``path``) for a value that
        is not an object, a key of the wrong type, or a ``version`` newer than ``RUN_VERSION``.
        Missing keys (and unknown ones) are allowed: older version-1 files lack some."""
        if not isinstance(obj, dict):
            raise InputError(f"{path}: not a JSON object; expected the run.json dqa regen writes")
        version = obj.get("version", 1)
        if version is None:
            version = 1
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise InputError(f"{path}: 'version' is {json.dumps(version)[:40]}; expected a whole number >= 1")
        if version > RUN_VERSION:
            raise InputError(f"{path}: run.json version {version} was written by a newer dqa (this one reads up to "
                             f"version {RUN_VERSION}); upgrade dqa to read this folder")
        kw: dict[str, Any] = {"version": version}
        for key, (types, what) in _EXPECT.items():
            if key == "version" or key not in obj or obj[key] is None:
                continue
            value = obj[key]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise InputError(f"{path}: {key!r} is {json.dumps(value)[:60]}; expected {what} (or null)")
            if key in ("endpoints", "mirror"):
                if not all(isinstance(v, str) for v in value):
                    raise InputError(f"{path}: {key!r} holds a non-string; expected {what}")
                value = tuple(value)
            kw[key] = value
        return cls(**kw)

    @classmethod
    def read(cls, path: Path | str) -> RunManifest:
        """Read and parse ``path``. Raises ``InputError`` (one line naming the file) when it is
        missing or unreadable, not JSON, or malformed (see ``from_json``)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"{path}: no such file; expected the run.json dqa regen writes") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: not readable ({getattr(exc, 'strerror', None) or exc})") from None
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise InputError(f"{path}: not valid JSON ({exc}); expected the run.json dqa regen writes") from None
        return cls.from_json(obj, path)


@dataclass(frozen=True)
class RunFolder:
    """The paths of one ``dqa regen`` output folder (local; an object-store ``--out`` is staged
    in a local one)."""

    path: Path

    @property
    def run_json(self) -> Path:
        return self.path / RUN_JSON

    @property
    def progress_json(self) -> Path:
        return self.path / PROGRESS_JSON

    @property
    def shards_dir(self) -> Path:
        return self.path / SHARDS_DIR

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_FILE

    def has_manifest(self) -> bool:
        return self.run_json.is_file()

    def manifest(self) -> RunManifest | None:
        """The folder's run.json, None when it has none. Raises ``InputError`` when it is malformed."""
        if not self.run_json.is_file():
            return None
        return RunManifest.read(self.run_json)

    def shards(self) -> list[Path]:
        return list_shards(self.path)

    def progress(self) -> dict[str, Any] | None:
        """The folder's progress.json (what the report shows), None when there is none. Raises
        ``InputError`` naming the file when it is there but not readable JSON."""
        if not self.progress_json.is_file():
            return None
        try:
            return json.loads(self.progress_json.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{self.progress_json}: not readable JSON ({exc})") from None

    def read_progress(self) -> dict[str, Any]:
        """The progress.json of earlier sessions ({} when missing or unreadable)."""
        try:
            obj = json.loads(self.progress_json.read_text())
        except (OSError, ValueError):
            return {}
        return obj if isinstance(obj, dict) else {}

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder's lock file (the folder is made first) for the block. Raises
        ``InputError`` at once when another dqa regen holds it."""
        import fcntl

        self.path.mkdir(parents=True, exist_ok=True)
        fh = open(self.lock_file, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise InputError(f"{self.path}: another dqa regen is writing to this folder; wait for it or use another --out") from None
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()

    def check_usable(self) -> None:
        """Refuse (``InputError``, exit 2) an ``--out`` that is a file, that cannot be created or
        written, or a non-empty folder that dqa regen did not make. Creates nothing (a probe folder
        is made and removed at once), so it runs before any input is opened."""
        folder = self.path
        if folder.exists() and not folder.is_dir():
            raise InputError(f"{folder}: not a folder; give --out a new or existing folder")
        if folder.is_dir() and not self.has_manifest():
            try:
                names = [p.name for p in folder.iterdir()]
            except OSError as exc:
                raise InputError(f"{folder}: cannot list this folder ({exc.strerror or exc}); use another --out") from None
            other = sorted(n for n in names if n not in OWN_NAMES and not n.startswith(".tmp-"))
            if other:
                raise InputError(f"{folder}: not empty and not a dqa regen output folder (holds {other[0]!r}); use a new --out")
        base = folder
        while not base.exists() and base != base.parent:
            base = base.parent
        if not base.is_dir():
            raise InputError(f"{folder}: cannot be created ({base} is not a folder); use another --out")
        try:  # a real write, not os.access: root passes access checks on read-only file systems
            os.rmdir(tempfile.mkdtemp(prefix=".tmp-dqa-probe-", dir=base))
        except OSError as exc:
            what = "not writable" if base == folder else f"cannot be created in {base}"
            raise InputError(f"{folder}: {what} ({exc.strerror or exc}); use another --out") from None

    def check_identity(self, identity: dict[str, Any], keys: tuple[str, ...] = ("dataset", "selection", "sampling")) -> None:
        """Refuse (``InputError``, exit 2) to resume into a folder made for another dataset,
        selection or sampling (the parts of ``identity`` named by ``keys``), to write into a
        non-empty folder that dqa regen did not make (``check_usable``), or into one whose
        run.json is unreadable or malformed."""
        run_json = self.run_json
        if not run_json.is_file():
            self.check_usable()
            return
        try:
            old = RunManifest.read(run_json).identity
        except InputError as exc:
            raise InputError(f"{exc} (this folder was not made by this dqa regen: use another --out)") from None
        sel = old.get("selection")
        if isinstance(sel, dict) and "turns" not in sel:  # a run from before multi-turn regeneration: the final turn only
            old = {**old, "selection": {**sel, "turns": "last"}}
        for key in keys:
            if old.get(key) == identity[key]:
                continue
            if key == "selection" and isinstance(old.get(key), dict):
                turns = old[key].get("turns")
                if {**old[key], "turns": None} == {**identity[key], "turns": None}:  # only --turns differs: name it
                    raise InputError(f"{run_json.parent}: made with --turns {turns}; rerun with --turns {turns} to resume, "
                                     "or use another --out")
            raise InputError(
                f"{run_json.parent}: made for a different {key} ({json.dumps(old.get(key), sort_keys=True)[:160]}); "
                f"use another --out, or rerun with the original options to resume"
            )
