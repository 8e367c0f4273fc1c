"""Untrusted text made safe for the Markdown dqa writes (scan and validation ``summary.md``,
``gate.md``; GitHub's job summary): ``md_escape`` (a table-safe line of text) and ``md_code``
(inline code GitHub shows literally). Shared by ``dqa.audit`` (the scan folder's summary.md) and
``dqa.reports``; imports nothing of dqa.
"""

from __future__ import annotations

import re
from typing import Any


def _cut(text: str, limit: int | None) -> str:
    return text[: limit - 1] + "…" if limit is not None and len(text) > limit else text


def md_escape(value: Any, limit: int = 80) -> str:
    """One table-safe line of Markdown text: no pipes, no HTML, no emphasis, no newlines, at most
    ``limit`` characters. For text outside code spans only (see ``md_code``)."""
    text = _cut(" ".join(str(value).split()), limit)
    return (
        text.replace("\\", "\\\\")  # first: a backslash must not escape the characters escaped next
        .replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        .replace("|", "\\|").replace("`", "'").replace("[", "\\[").replace("]", "\\]")
        .replace("*", "\\*").replace("_", "\\_").replace("~", "\\~")
    )


# Inside <code> Markdown still parses inlines: HTML's specials, the table's pipe and Markdown's own
# punctuation go in as character references. A backslash only escapes ASCII punctuation, and an
# underscore between two letters or digits never makes emphasis: those stay as they are (readable).
_CODE_REFS = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "&#124;", "`": "&#96;", "*": "&#42;", "[": "&#91;",
              "]": "&#93;", "~": "&#126;", "\\": "&#92;", "_": "&#95;", "\n": " ", "\r": " ", "\t": " "}
_CODE_RE = re.compile(r"""[&<>|`*\[\]~\n\r\t]|\\(?=[!-/:-@\[-`{-~]|$)|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])""")


def md_code(value: Any, limit: int | None = 80) -> str:
    """Untrusted text as inline code that GitHub shows literally, also in a table cell: ``<code>``
    with HTML escaping and Markdown's punctuation as character references (``<think>`` shows as
    ``<think>``). A backtick code span would not do: its content is shown verbatim, so escaped
    text shows its escapes, and a ``|`` in it still splits a table row. Newlines become spaces;
    at most ``limit`` characters."""
    return "<code>" + _CODE_RE.sub(lambda m: _CODE_REFS[m.group(0)], _cut(str(value), limit)) + "</code>"
