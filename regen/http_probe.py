"""One HTTP GET for probing model servers: health checks and metrics scrapes.

`fleet up` (waiting for health), `fleet status` (health and /metrics) and `plan --calibrate`
(is any endpoint up?) all probe servers the same way: a plain GET with a timeout, where a
connection error or timeout means "no answer" rather than an exception.
"""

from __future__ import annotations


def http_get(url: str, timeout: float):
    """``GET url``; the ``httpx.Response`` (any status), or ``None`` when nothing answered in
    ``timeout`` seconds (refused, reset, timed out, bad URL)."""
    import httpx

    try:
        return httpx.get(url, timeout=timeout)
    except httpx.HTTPError:
        return None


def answers_ok(url: str, timeout: float) -> bool:
    """True when ``GET url`` answers 200 within ``timeout`` seconds."""
    r = http_get(url, timeout)
    return r is not None and r.status_code == 200
