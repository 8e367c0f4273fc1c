"""What every HTTP call dqa makes to a model server trusts and goes through: one policy.

``dqa regen`` (generation, health checks, discovery, preflight), ``dqa plan --calibrate`` (the
same regen), ``dqa fleet up`` (waiting for health) and ``dqa fleet status`` (health and
``/metrics``: ``http_probe``) all go over aiohttp (``transport.AiohttpTransport``) and take their
TLS trust and their proxy from ``HttpPolicy``, so a setting that works for one works for all.

TLS: the CA bundle that verifies ``https://`` servers is, first found,
``--ca-bundle PATH``, ``$SSL_CERT_FILE``, ``$REQUESTS_CA_BUNDLE``, else the system's store. A
bundle given replaces the system's CAs (as in ``requests`` and ``curl --cacert``).

Proxies: the standard environment variables, read once per URL: ``HTTP_PROXY`` for ``http://``
URLs, ``HTTPS_PROXY`` for ``https://`` (lower-case names too), and ``NO_PROXY``, a comma-separated
list of host names, domain suffixes (``.cluster.local``), addresses (``10.0.0.5``, with
``:port`` optionally) or ``*``, that go direct. This is Python's ``urllib`` reading of them, the
one ``requests`` and ``aiohttp`` share; address ranges (``10.0.0.0/8``) are not understood, so list
a fleet's addresses or its domain. Set ``NO_PROXY`` for the cluster-internal servers when a proxy
is set for the outside world.
"""

from __future__ import annotations

import os
import ssl
import urllib.request
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import urlsplit

from dqa.errors import UsageError

CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")  # after --ca-bundle, in this order


def resolve_ca_bundle(explicit: str | None = None) -> tuple[str | None, str]:
    """``(path, where it came from)``: ``explicit`` (``--ca-bundle``), else the first of
    ``CA_ENV`` that is set; ``(None, "the system's CA store")`` when none is. Raises
    ``UsageError`` (exit 2) for an ``explicit`` bundle that is not a file (one from the environment
    is checked when an ``https://`` server needs it: ``HttpPolicy.ssl_context``)."""
    if explicit:
        if not os.path.isfile(explicit):
            raise UsageError(f"--ca-bundle {explicit}: no such file (expected a PEM file of CA certificates)")
        return explicit, f"--ca-bundle {explicit}"
    for name in CA_ENV:
        if os.environ.get(name):
            return os.environ[name], f"{name}={os.environ[name]}"
    return None, "the system's CA store"


@lru_cache(maxsize=8)
def _context(path: str | None, source: str) -> ssl.SSLContext:
    if path is None:
        return ssl.create_default_context()
    if not os.path.isfile(path):
        raise UsageError(f"{source}: no such file (expected a PEM file of CA certificates)")
    try:
        return ssl.create_default_context(cafile=path)
    except ssl.SSLError as exc:
        raise UsageError(f"{source}: not a PEM file of CA certificates ({exc.reason or exc})") from None


def proxy_for(url: str) -> str | None:
    """The proxy URL the environment names for ``url`` (``HTTP_PROXY``/``HTTPS_PROXY`` by its
    scheme), or None when there is none or ``NO_PROXY`` lists its host."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme)
    if not proxy or not parts.hostname:
        return None
    # proxy_bypass_environment matches NO_PROXY against "host" or "host:port" (a bare IPv6 in brackets).
    host = parts.netloc.rsplit("@", 1)[-1]
    if urllib.request.proxy_bypass_environment(host, proxies) or urllib.request.proxy_bypass_environment(parts.hostname, proxies):
        return None
    return proxy


@dataclass(frozen=True)
class HttpPolicy:
    """TLS trust and proxies for dqa's HTTP calls (see the module docstring). ``ca_bundle``: the
    ``--ca-bundle`` given, None for the environment's or the system's."""

    ca_bundle: str | None = None
    _resolved: tuple[str | None, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_resolved", resolve_ca_bundle(self.ca_bundle))

    @property
    def trust(self) -> str:
        """Where the CAs come from, for messages: ``--ca-bundle PATH``, ``SSL_CERT_FILE PATH``, ..."""
        return self._resolved[1]

    def ssl_context(self) -> ssl.SSLContext:
        """The verifying SSL context for ``https://`` servers (one per bundle, cached). Raises
        ``UsageError`` for a bundle that is not a file of certificates."""
        return _context(*self._resolved)

    def proxy_for(self, url: str) -> str | None:
        """See ``proxy_for``."""
        return proxy_for(url)

    def tls_fix(self, url: str, reason: str) -> str:
        """The one-line usage error for a server whose TLS ``url`` could not be verified."""
        return (f"{url}: TLS failed ({reason}; CAs from {self.trust}): pass --ca-bundle PATH with the CA that signed "
                "the server's certificate (or set SSL_CERT_FILE), or use http:// if the server speaks plain HTTP")
