"""Copy closed shards (and run.json / progress.json) to URLs (``dqa.storage``): an object-store ``--out`` or a ``--mirror``.

Each file is put under a temporary name and then moved to its final name, so a
reader of the target never sees a half-written shard. Uploads run in one
background thread; a failed upload is retried at the next shard and at the
end (``sync``), which raises ``RuntimeFailure`` if a shard still cannot be
copied.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path

from dqa import storage
from dqa.errors import RuntimeFailure
from dqa.regen.wire.urls import strip_userinfo


def is_url(s: str) -> bool:
    """True for ``proto://...`` other than ``file://`` (which is a local folder)."""
    return storage.is_url(s)


def local_path(s: str) -> Path:
    """The local folder of a plain path or a ``file://`` URL."""
    return Path(s[len("file://") :]) if s.startswith("file://") else Path(s)


def stage_dir(url: str) -> Path:
    """Where a run with an object-store ``--out`` keeps its journal and shards before upload: a private
    folder per URL, credentials left out of its name (``dqa.storage.folders.stage_dir``). Raises
    ``RuntimeFailure`` when the staging root is not a private folder of this user's."""
    from dqa.storage.folders import stage_dir as private_stage

    return private_stage(strip_userinfo(url), "regen-stage")


class Target:
    """One destination folder: a URL (``dqa.storage``: pyarrow's S3, GCS, Azure filesystems, fsspec's
    for the rest) or a local folder. A file put in a store is one object PUT, which appears whole or
    not at all; in a local folder it is written under a temporary name and renamed."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.name = strip_userinfo(self.url)  # what messages show
        loc = storage.location(self.url)
        self.root = loc if isinstance(loc, storage.StorePath) else storage.StorePath.local(loc)

    def put(self, local: Path, rel: str) -> None:
        from dqa.storage.folders import put_file

        dest = self.root / rel
        if self.root.scheme != "file":
            put_file(local, dest)
            return
        Path(dest.parent.key).mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".tmp-{local.name}")
        put_file(local, tmp)
        os.replace(tmp.key, dest.key)

    def shard_names(self) -> set[str]:
        try:
            return {p.name for p in (self.root / "shards").iterdir() if p.is_file()}
        except (FileNotFoundError, OSError):
            return set()

    def get(self, rel: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(".tmp-" + local.name)
        tmp.write_bytes((self.root / rel).read_bytes())
        tmp.replace(local)

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()


class Uploader:
    """Copies shards to every target in a background thread."""

    def __init__(self, targets: list[Target]):
        self.targets = targets
        self._q: queue.Queue[Path | None] = queue.Queue()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="dqa-upload", daemon=True)
        if targets:
            self._thread.start()

    def submit(self, shard: Path) -> None:
        if self.targets:
            self._q.put(shard)

    def put_now(self, local: Path, rel: str) -> None:
        """Copy a small file (run.json, progress.json) to every target; errors are remembered, not raised."""
        for t in self.targets:
            try:
                t.put(local, rel)
            except Exception as exc:  # any backend error: keep the run going
                self.errors.append(strip_userinfo(f"{t.name}/{rel}: {exc}"))

    def _run(self) -> None:
        while True:
            p = self._q.get()
            if p is None:
                return
            self.put_now(p, f"shards/{p.name}")

    def sync(self, shards: list[Path]) -> None:
        """Stop the thread, then make sure every local shard exists at every target (re-put modified ones).

        Raises ``RuntimeFailure`` when a shard cannot be copied.
        """
        if not self.targets:
            return
        self._q.put(None)
        self._thread.join()
        for t in self.targets:
            try:
                have = t.shard_names()
                for p in shards:
                    if p.name not in have:
                        t.put(p, f"shards/{p.name}")
            except Exception as exc:
                raise RuntimeFailure(strip_userinfo(f"{t.name}: could not copy shards ({exc}); rerun the same command to retry")) from None


def pull_shards(target: Target, local_out: Path) -> int:
    """Download the target's shards missing from ``local_out/shards`` (resume on another host); return how many."""
    have = {p.name for p in (local_out / "shards").glob("*.parquet")}
    n = 0
    for name in sorted(target.shard_names()):
        if name.endswith(".parquet") and name.startswith("part-") and name not in have:
            target.get(f"shards/{name}", local_out / "shards" / name)
            n += 1
    return n
