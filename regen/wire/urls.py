"""Keep credentials out of what dqa regen shows and writes.

Endpoints, ``--out`` and ``--mirror`` may be given as ``scheme://user:password@host/...``;
the URL itself is needed to connect, but logs, progress, run.json and error messages get it
without the ``user:password@`` part.
"""

from __future__ import annotations

import re

# scheme://userinfo@ : userinfo stops at the first "/", "?", "#" or space, so an "@" later in a
# path or query is left alone (RFC 3986 requires "@" and "/" inside a password to be escaped).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s@]*@")


def strip_userinfo(text: str) -> str:
    """``text`` (a URL, a log line, an exception message) with the ``user:password@`` of every URL in it removed."""
    return _USERINFO.sub(r"\g<scheme>", text)
