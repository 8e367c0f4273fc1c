"""A server's log file, read from its end: ``read_tail`` (the last bytes as text) and ``log_tail``
(the last lines). `fleet up` shows a failed server's tail; `fleet status` (``servers.sglang``) reads
the latest ``Decode batch`` line. Imports nothing of dqa, so a server kind can use it.
"""

from __future__ import annotations

import os
from pathlib import Path


def read_tail(path: Path | None, max_bytes: int) -> str | None:
    """The last ``max_bytes`` of a (possibly huge) log file as text, carriage returns (progress
    bars) turned into newlines; ``None`` when it cannot be read."""
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return None
    return data.decode("utf-8", errors="replace").replace("\r", "\n")


def log_tail(path: Path | None, lines: int = 20, max_bytes: int = 64 << 10) -> list[str]:
    """The last ``lines`` non-blank lines of a (possibly huge) log file; [] when it cannot be read."""
    text = read_tail(path, max_bytes)
    if text is None:
        return []
    return [ln for ln in text.split("\n") if ln.strip()][-lines:]
