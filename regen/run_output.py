"""Where a ``dqa regen`` run writes, and what its folder already holds:

* ``local_folder(OutputSpec)``: ``--out`` as a local ``RunFolder`` (None for an object-store URL),
  checked before any input is read;
* ``place_output(OutputSpec, shard) -> Place`` and ``stage_output``: the local folder (an
  object-store ``--out`` staged in one), the copy targets, the shard tag;
* ``recover(folder, rows, retry_failed) -> Resume``: the folder repaired after any crash and what
  is left.

Run-folder policy (lock, identity) is ``RunFolder``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from dqa.regen.config import OutputSpec
from dqa.regen.run_values import Place, Resume
from dqa.regen.store.folder import RUN_JSON, RunFolder
from dqa.regen.store.journal import partial_outputs
from dqa.regen.store.journal import recover as recover_folder
from dqa.regen.store.upload import Target, is_url, local_path, pull_shards, stage_dir


def local_folder(o: OutputSpec) -> RunFolder | None:
    """``--out`` as a ``RunFolder`` when it is a local path (None for an object-store URL, checked
    once staged): the run refuses a bad local folder before it reads any input."""
    return None if is_url(o.out) else RunFolder(local_path(o.out))


def place_output(o: OutputSpec, shard: tuple[int, int]) -> Place:
    """Where the session writes: ``--out`` itself, or a local staging folder for an object-store
    ``--out``; its copy targets (raises for a URL fsspec cannot open) and the shard tag."""
    remote = is_url(o.out)
    out = stage_dir(o.out) if remote else local_path(o.out)
    targets = ([Target(o.out)] if remote else []) + [Target(m) for m in o.mirror]
    return Place(o.out, remote, RunFolder(out), targets, f"s{shard[0]}of{shard[1]}")


def stage_output(place: Place, identity: dict[str, Any], log: Callable[[str], None]) -> None:
    """With the folder locked: check it was made for this run (``InputError`` otherwise). An
    object-store ``--out`` is staged in the local folder: its run.json, progress.json (earlier
    sessions' working time) and shards are pulled first."""
    folder = place.folder
    if not place.remote:
        folder.check_identity(identity)
        return
    log(f"staging {place.url} in {place.out}")
    target = place.targets[0]
    if not folder.has_manifest() and target.exists(RUN_JSON):
        target.get(RUN_JSON, folder.run_json)
    folder.check_identity(identity)
    if not folder.progress_json.is_file() and folder.has_manifest() and target.exists("progress.json"):
        target.get("progress.json", folder.progress_json)  # earlier sessions' working time
    folder.shards_dir.mkdir(parents=True, exist_ok=True)
    pulled = pull_shards(target, place.out)
    if pulled:
        log(f"pulled {pulled} shards from {place.url}")


def recover(out: Path, rows: np.ndarray, retry_failed: bool, log: Callable[[str], None]) -> Resume:
    """Repair the folder after any crash (compact the journal, drop a torn tail and duplicates;
    ``retry_failed``: drop failed records) and work out what is left of ``rows``. Returns ``Resume``."""
    rec = recover_folder(out, retry_failed=retry_failed)
    if rec.torn_bytes or rec.recovered_records or rec.dropped_duplicates:
        log(
            f"resumed {out}: compacted {rec.recovered_records} journaled rows"
            + (f", discarded a torn tail of {rec.torn_bytes} bytes" if rec.torn_bytes else "")
            + (f", dropped {rec.dropped_duplicates} duplicate records" if rec.dropped_duplicates else "")
        )
    todo = rows[~np.isin(rows, rec.rows)]
    # Conversations an earlier session left half done continue at their next turn.
    partial = partial_outputs(out, rec.partial[np.isin(rec.partial, todo)]) if rec.partial.size else {}
    return Resume(rec, todo, partial)
