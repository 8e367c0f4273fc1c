"""Numbers and durations for people: the one place dqa turns counts and seconds into short text.

Used by `dqa plan`'s table, the regen live display, and the HTML report's charts, so a figure
reads the same wherever it appears (``2.29B`` tokens, ``16.5 d``).
"""

from __future__ import annotations

SECONDS_PER_MINUTE = 60.0
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0

_UNITS = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))


def _scaled(v: float, trim: bool) -> str:
    """``v`` (already divided by its unit, 1 <= |v| < 1000) with 3 significant digits."""
    text = f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def human_count(x: float, trim: bool = False) -> str:
    """A count in at most ~4 characters plus a unit: ``2285000000`` -> ``2.29B``,
    ``5400000`` -> ``5.40M``, ``129600000`` -> ``129.6M``, ``12913.6`` -> ``12.91K``.

    Below 1,000: integers plain (``256``), other values with up to 3 significant digits
    (``0.25``, ``12.5``). ``trim=True`` drops trailing zeros (``5.4M``, ``1K``), for chart
    axes. Units are K, M, B (billion) and T.
    """
    x = float(x)
    ax = abs(x)
    for i, (div, suffix) in enumerate(_UNITS):
        if ax >= div:
            v = x / div
            # 999,999 rounds to "1000.0K": promote it to the next unit instead.
            if i > 0 and abs(float(_scaled(v, False))) >= 1000:
                div, suffix = _UNITS[i - 1]
                v = x / div
            return _scaled(v, trim) + suffix
    if x.is_integer():
        return f"{x:.0f}"
    if ax >= 100:
        text = f"{x:.0f}"
        return human_count(float(text), trim) if abs(float(text)) >= 1000 else text
    return f"{x:.3g}"


def human_duration(seconds: float | None) -> str:
    """A duration in one unit, 3 significant digits at most: ``1428125`` -> ``16.5 d``,
    ``163176`` -> ``45.3 h``, ``90`` -> ``90 s``, ``150`` -> ``2.5 min``, ``0.25`` -> ``0.25 s``.

    Days from 2 days up, hours from 2 hours, minutes from 2 minutes, else seconds (2
    significant digits under 10 s). ``None`` (unknown, e.g. an ETA with no rate yet) -> ``?``.
    """
    if seconds is None:
        return "?"
    s = float(seconds)
    if s >= 2 * SECONDS_PER_DAY:
        return f"{s / SECONDS_PER_DAY:.1f} d"
    if s >= 2 * SECONDS_PER_HOUR:
        return f"{s / SECONDS_PER_HOUR:.1f} h"
    if s >= 2 * SECONDS_PER_MINUTE:
        return f"{s / SECONDS_PER_MINUTE:.1f} min"
    if s >= 10:
        return f"{s:.0f} s"
    if abs(s) < 0.001:  # not "6.2e-05 s"
        return "0 s"
    return f"{s:.2g} s"
