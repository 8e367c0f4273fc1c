"""Copy closed shards (and run.json / progress.json) to fsspec URLs: an object-store ``--out`` or a ``--mirror``.

Each file is put under a temporary name and then moved to its final name, so a
reader of the target never sees a half-written shard. Uploads run in one
background thread; a failed upload is retried at the next shard and at the
end (``sync``), which raises ``RuntimeFailure`` if a shard still cannot be
copied.
"""

from __future__ import annotations

import hashlib
import os
import queue
import stat
import tempfile
import threading
from pathlib import Path

from dqa.errors import InputError, RuntimeFailure
from dqa.regen.wire.urls import strip_userinfo


def is_url(s: str) -> bool:
    """True for ``proto://...`` other than ``file://`` (which is a local folder)."""
    return "://" in s and not s.startswith("file://")


def local_path(s: str) -> Path:
    """The local folder of a plain path or a ``file://`` URL."""
    return Path(s[len("file://") :]) if s.startswith("file://") else Path(s)


def stage_dir(url: str) -> Path:
    """Where a run with an object-store ``--out`` keeps its journal and shards before upload.

    A folder per URL (credentials left out of the name) under a per-user root made ``0700``:
    ``$XDG_CACHE_HOME/dqa/regen-stage`` when that variable is set, else
    ``<tempdir>/dqa-<uid>/regen-stage``. Raises ``RuntimeFailure`` when the root exists but is
    a link or belongs to another user (someone could read or plant shards there).
    """
    h = hashlib.sha1(strip_userinfo(url).encode()).hexdigest()[:16]
    cache = os.environ.get("XDG_CACHE_HOME")
    root = Path(cache) / "dqa" if cache else Path(tempfile.gettempdir()) / f"dqa-{os.getuid()}"
    _private_dir(root)
    return root / "regen-stage" / h


def _private_dir(d: Path) -> None:
    """Make ``d`` (mode 0700) or check that the existing one is a real folder of ours, closed to others."""
    d.parent.mkdir(parents=True, exist_ok=True)
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = d.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise RuntimeFailure(f"{d}: staging folder is not a folder owned by this user; remove it or set XDG_CACHE_HOME")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(d, 0o700)


def _fs(url: str):
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise InputError(strip_userinfo(f"{url}: cannot open this URL ({exc}); install the fsspec backend for it")) from None


class Target:
    """One fsspec destination folder."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.name = strip_userinfo(self.url)  # what messages show
        self.fs, self.root = _fs(self.url)

    def put(self, local: Path, rel: str) -> None:
        dest = f"{self.root}/{rel}"
        parent = dest.rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{parent}/.tmp-{local.name}"
        self.fs.put_file(str(local), tmp)
        self.fs.mv(tmp, dest)

    def shard_names(self) -> set[str]:
        try:
            return {p.rsplit("/", 1)[-1] for p in self.fs.ls(f"{self.root}/shards", detail=False)}
        except (FileNotFoundError, OSError):
            return set()

    def get(self, rel: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(".tmp-" + local.name)
        self.fs.get_file(f"{self.root}/{rel}", str(tmp))
        tmp.replace(local)

    def exists(self, rel: str) -> bool:
        return self.fs.exists(f"{self.root}/{rel}")


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
