"""``Link``: a ``dqa regen`` run's one event loop and one transport, opened once the inputs are
checked and shared by the start-up probe (``preflight.probe_servers``) and the dispatch.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from dqa.regen.config import DispatchSpec
from dqa.regen.dispatch.scheduler import DispatchSettings, open_transport
from dqa.regen.servers import Protocol


class Link:
    """The run's one event loop and one transport (one aiohttp session) to ``servers`` (a
    ``run_values.Servers``: ``urls``, ``headers``, ``protocol``), speaking ``protocol``: the
    preflight and the dispatch share its connections. ``settings`` are the dispatcher's, derived
    from the dispatch group ``d`` (``DispatchSettings.from_spec``). ``run(coro)`` runs a step in
    that loop; ``facts`` is what the start-up probe found (``preflight.probe_servers``). With
    ``signals`` (the run handles SIGINT/SIGTERM: ``run_view.View.signals``) a signal cancels the
    step being run (``_Interrupts``)."""

    def __init__(self, d: DispatchSpec, servers: Any, protocol: Protocol, signals: bool = False):
        self.servers = servers
        self.signals = signals
        self.protocol = protocol
        self.settings = DispatchSettings.from_spec(d)
        self.facts: dict[str, Any] = {}
        self.transport = open_transport(self.settings, servers.headers, d.http_policy())
        self._runner = asyncio.Runner() if hasattr(asyncio, "Runner") else None  # Python 3.10: a plain loop
        self._loop = asyncio.new_event_loop() if self._runner is None else None

    def run(self, coro):
        """The result of ``coro``, run to the end in the run's loop. Raises ``KeyboardInterrupt``
        when SIGINT or SIGTERM stopped it (``_Interrupts``), and whatever ``coro`` raises."""
        with _Interrupts(self.signals) as interrupts:
            async def main():
                interrupts.task = asyncio.current_task()
                if interrupts.seen:  # a signal came while the loop was starting
                    coro.close()
                    raise asyncio.CancelledError
                return await coro

            try:
                if self._runner is not None:
                    return self._runner.run(main())
                return self._loop.run_until_complete(main())
            except asyncio.CancelledError:
                if not interrupts.seen:
                    raise
        raise AssertionError("unreachable: a step cancelled by a signal ends in _Interrupts.__exit__'s KeyboardInterrupt")

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


class _Interrupts:
    """While a step runs in the loop, SIGINT and SIGTERM cancel its task instead of raising where
    the loop happens to be: a ``KeyboardInterrupt`` raised inside a task is stored on that task and
    also unwinds the loop, so asyncio prints "Task exception was never retrieved" with a traceback,
    and closing the loop raises it again. asyncio.Runner does the same for SIGINT, but only under
    Python's default handler; here the process's own handler decides: it is called, and its
    ``KeyboardInterrupt`` (if it raises one) becomes the cancellation, re-raised as
    ``KeyboardInterrupt`` by ``__exit__`` once the step has unwound and the handlers are back (so a
    signal at any instant either reaches ``seen`` before that check or the process's handler after
    it, never neither). A handler the step installs itself (the dispatch's
    ``loop.add_signal_handler``) is left in place on the way out."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.task: asyncio.Task | None = None
        self.seen = False
        self._before: dict[int, Any] = {}

    def __enter__(self) -> _Interrupts:
        if self.enabled:  # the run's View.signals: on the main thread (run_view.view checks it)
            try:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    before = signal.getsignal(sig)
                    if callable(before):
                        self._before[sig] = before
                        signal.signal(sig, self._on_signal)
            except BaseException:  # a signal between the two: its KeyboardInterrupt, with the handlers as they were
                self._restore()
                raise
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        try:
            self._before[signum](signum, frame)
        except KeyboardInterrupt:
            self.seen = True
            if self.task is not None and not self.task.done():
                self.task.cancel()
                self.task.get_loop().call_soon_threadsafe(lambda: None)  # wake a loop blocked in select

    def __exit__(self, *exc: object) -> None:
        """Put the handlers back, then raise ``KeyboardInterrupt`` if a signal was seen (in that order: see the class
        docstring)."""
        self._restore()
        if self.seen:
            raise KeyboardInterrupt

    def _restore(self) -> None:
        for sig, before in self._before.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, before)
