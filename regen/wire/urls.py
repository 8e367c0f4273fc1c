"""Keep credentials out of what dqa regen shows and writes.

Endpoints, ``--out`` and ``--mirror`` may be given as ``scheme://user:password@host/...``;
the URL itself is needed to connect, but logs, progress, run.json and error messages get it
without the ``user:password@`` part.
"""

from __future__ import annotations

from dqa.storage.faults import without_credentials


def strip_userinfo(text: str) -> str:
    """``text`` (a URL, a log line, an exception message) with the ``user:password@`` of every URL in it removed
    (``dqa.storage.faults.without_credentials``: one rule for every command)."""
    return without_credentials(text)
