"""``Link``: a ``dqa regen`` run's one event loop and one transport, opened once the inputs are
checked and shared by the start-up probe (``preflight.probe_servers``) and the dispatch.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dqa.regen.config import DispatchSpec
from dqa.regen.dispatch.scheduler import DispatchSettings, open_transport
from dqa.regen.servers import Protocol


class Link:
    """The run's one event loop and one transport (one aiohttp session) to ``servers`` (a
    ``run_values.Servers``: ``urls``, ``headers``, ``protocol``), speaking ``protocol``: the
    preflight and the dispatch share its connections. ``settings`` are the dispatcher's, derived
    from the dispatch group ``d`` (``DispatchSettings.from_spec``). ``run(coro)`` runs a step in
    that loop; ``facts`` is what the start-up probe found (``preflight.probe_servers``)."""

    def __init__(self, d: DispatchSpec, servers: Any, protocol: Protocol):
        self.servers = servers
        self.protocol = protocol
        self.settings = DispatchSettings.from_spec(d)
        self.facts: dict[str, Any] = {}
        self.transport = open_transport(self.settings, servers.headers, d.http_policy())
        self._runner = asyncio.Runner() if hasattr(asyncio, "Runner") else None  # Python 3.10: a plain loop
        self._loop = asyncio.new_event_loop() if self._runner is None else None

    def run(self, coro):
        """The result of ``coro``, run to the end in the run's loop."""
        if self._runner is not None:
            return self._runner.run(coro)
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        """Close the transport's connections, then the loop."""
        try:
            self.run(self.transport.close())
        finally:
            if self._runner is not None:
                self._runner.close()
            else:
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                self._loop.close()
