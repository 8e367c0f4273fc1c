"""One HTTP GET for probing model servers: health checks and metrics scrapes.

`fleet up` (waiting for health), `fleet status` (health and /metrics) and `plan --calibrate`
(is any endpoint up?) all probe servers the same way: a plain GET with a timeout, where a
connection error or timeout means "no answer" rather than an exception. TLS trust and proxies
are ``http_policy.HttpPolicy``'s, the same as ``dqa regen``'s requests.
"""

from __future__ import annotations

from dqa.regen.wire.http_policy import HttpPolicy


def http_get(url: str, timeout: float, policy: HttpPolicy | None = None):
    """``GET url`` (redirects not followed); the ``httpx.Response`` (any status), or ``None`` when
    nothing answered in ``timeout`` seconds (refused, reset, timed out, bad URL, TLS failed).
    ``policy``: TLS trust and proxy (default: the environment's)."""
    import httpx

    policy = policy or HttpPolicy()
    try:
        verify = policy.ssl_context() if url.startswith("https:") else True
        with httpx.Client(timeout=timeout, verify=verify, proxy=policy.proxy_for(url), trust_env=False) as client:
            return client.get(url)
    except httpx.HTTPError:
        return None


def answers_ok(url: str, timeout: float, policy: HttpPolicy | None = None) -> bool:
    """True when ``GET url`` answers 200 within ``timeout`` seconds."""
    r = http_get(url, timeout, policy)
    return r is not None and r.status_code == 200
