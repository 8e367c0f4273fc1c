"""The repair work folder: where each round's scan, regen run and merge live, and ``repair.json``.

::

    WORK/
      repair.json           what was asked (dataset, options) and, per round, what each step did
      round-1/scan/         the scan of the round's input (round 1: DATASET, unless a matching scan is reused)
      round-1/regen/        the regen run folder (resumable from its journal)
      round-1/merged.EXT    the round's merged set (EXT: the input's; a folder for a folder)
      round-1/rescan/       the scan of the merged set: round 2's scan
      round-2/...

``repair.json`` is rewritten atomically after every step, so a killed repair resumes at the first
step it does not record as done; each step is itself resumable or atomic (scan and merge write
whole folders/files or nothing, regen resumes from its journal).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dqa import atomic
from dqa.audit import identity
from dqa.errors import InputError
from dqa.storage import location

REPAIR_FILE = "repair.json"
VERSION = 1


def default_work_dir(dataset: str | Path) -> Path:
    """``dqa-out/<dataset name>-repair/`` (``train.parquet`` -> ``dqa-out/train-repair/``)."""
    p = location(dataset)
    name = p.name[: -len(p.suffix)] if p.suffix and p.is_file() else p.name
    return identity.DEFAULT_ROOT / f"{name}-repair"


def options_digest(options: dict[str, Any]) -> str:
    """A short stable digest of the options a repair was started with."""
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class WorkFolder:
    """One repair's work folder and its ``repair.json`` record (``state``)."""

    path: Path
    state: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path, dataset: str | Path, options: dict[str, Any]) -> "WorkFolder":
        """Open (or start) the work folder of a repair of ``dataset`` with ``options``.

        Raises ``InputError`` when the folder holds a repair of another dataset (or of this one
        after its files changed), or one started with other options, naming what differs.
        """
        path = Path(path).absolute()  # the records hold paths into it: the same from any working directory
        record = path / REPAIR_FILE
        files = identity.files_fingerprint(identity.dataset_files(dataset))
        asked = {"dataset": identity.dataset_path(dataset), "files": files, "options": options,
                 "options_digest": options_digest(options)}
        if record.exists():
            try:
                state = json.loads(record.read_text())
            except (OSError, ValueError) as exc:
                raise InputError(f"{record}: not a repair record ({exc}); remove the folder or give another --work") from None
            if not isinstance(state, dict) or state.get("version") != VERSION:
                raise InputError(f"{record}: not a repair record of this dqa (version {VERSION}); give another --work")
            if state.get("dataset") != asked["dataset"]:
                raise InputError(f"{path}: holds the repair of {state.get('dataset')}, not {asked['dataset']}; give another --work")
            change = identity.files_change(state.get("files") or [], files)
            if change:
                raise InputError(f"{path}: {asked['dataset']} changed since this repair began ({change}); give another --work")
            if state.get("options_digest") != asked["options_digest"]:
                diff = sorted(k for k in set(options) | set(state.get("options") or {})
                              if (state.get("options") or {}).get(k) != options.get(k))
                raise InputError(f"{path}: this repair was started with other options ({', '.join(diff)} differ); "
                                 f"rerun it as it was, or give another --work")
            return cls(path, state)
        path.mkdir(parents=True, exist_ok=True)
        wf = cls(path, {"version": VERSION, **asked, "rounds": [], "status": "running"})
        wf.save()
        return wf

    @staticmethod
    def peek(path: str | Path) -> dict[str, Any]:
        """The ``repair.json`` of the folder at ``path`` as it stands, unchecked; ``{}`` when there is none or it is unreadable."""
        try:
            state = json.loads((Path(path) / REPAIR_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def save(self) -> None:
        """Rewrite ``repair.json`` atomically."""
        atomic.write_json(self.path / REPAIR_FILE, self.state)

    def round_dir(self, k: int) -> Path:
        return self.path / f"round-{k}"

    def round(self, k: int) -> dict[str, Any]:
        """Round ``k``'s record (1-based), created empty when new."""
        rounds = self.state["rounds"]
        while len(rounds) < k:
            rounds.append({"round": len(rounds) + 1, "done": []})
        return rounds[k - 1]

    def done(self, k: int, step: str) -> bool:
        return step in self.round(k)["done"]

    def mark(self, k: int, step: str, **facts: Any) -> None:
        """Record ``step`` of round ``k`` as done, with its facts, and save."""
        r = self.round(k)
        r.update(facts)
        if step not in r["done"]:
            r["done"].append(step)
        self.save()
