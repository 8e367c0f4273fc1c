"""Step 1 of a ``dqa regen`` run: ``resolve_servers(DispatchSpec) -> Servers``, the endpoints or
the fleet files, the server kind of the protocol, the key and the GPU count. What depends on the
server kind is asked of it (``dqa.regen.servers.protocol_kind``): no kind name is spelled here.
"""

from __future__ import annotations

import os

from dqa.errors import UsageError
from dqa.regen.config import DEFAULT_PROTOCOL, DispatchSpec
from dqa.regen.run_values import Servers
from dqa.regen.servers import protocol_kind


def resolve_servers(d: DispatchSpec) -> Servers:
    """The servers of ``--endpoint`` or the ``--fleet`` files (one per node: their union), checked.
    Returns ``Servers``; raises ``UsageError`` for a URL that is not http(s), an unknown protocol
    or an unset ``--api-key-env``, ``InputError`` for a bad fleet file, a URL in two fleet files,
    or fleet files that record different protocols or models (unless ``--protocol``/``--model``
    says which)."""
    from dqa.regen.fleet.file import read_fleets

    fleets = read_fleets(d.fleet) if d.fleet else None
    urls = fleets.send_urls if fleets else list(d.endpoints)  # the URLs the fleet files say to send to
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise UsageError(f"endpoint {u!r}: expected an http:// or https:// URL")
    urls = list(dict.fromkeys(u.rstrip("/") for u in urls))
    kind = protocol_kind(d.protocol or (fleets.agreed("protocol", "--protocol") if fleets else DEFAULT_PROTOCOL))
    model = d.model or (fleets.agreed("model", "--model NAME, when they serve the same model") if fleets else "")
    headers: dict[str, str] = {}
    if d.api_key_env:
        key = os.environ.get(d.api_key_env)
        if not key:
            raise UsageError(f"--api-key-env {d.api_key_env}: that environment variable is not set")
        headers["Authorization"] = f"Bearer {key}"
    gpus = d.gpus if d.gpus is not None else (fleets.gpu_count if fleets else len(urls))
    return Servers(urls, kind, model, headers, gpus, fleets.declared if fleets else {})
