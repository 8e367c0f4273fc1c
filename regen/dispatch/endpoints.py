"""The fleet's endpoints and their health: which endpoints take requests, taking one out and
bringing it back.

An ``Endpoint`` is one server URL and what the scheduler knows about it (requests in flight,
faults in a row, its ``servers.facts.ServerFacts``). ``EndpointHealth`` is the state machine over
them: an endpoint with ``fail_threshold`` consecutive endpoint faults (or a refused connection, or
two failed health checks) is taken out (``take_out``: its in-flight requests are cancelled and go
back to the queue for the others), and it is probed back in with its server kind's health path
(``/health_generate``; ``/health`` for servers without it: ``servers.base.ServerKind.health_paths``),
probes backing off up to ``probe_max_interval``. What an endpoint is comes from the start-up
preflight, or is asked once it first becomes healthy (``discover``). When no endpoint is healthy
for ``down_deadline`` seconds the run stops (``down_too_long``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable

from dqa.regen.dispatch.progress import EndpointCounts, Progress
from dqa.regen.servers import KINDS
from dqa.regen.servers.facts import SeedNotice, ServerFacts, describe, discover, with_context_length
from dqa.regen.wire.transport import Transport, TransportError
from dqa.regen.wire.urls import strip_userinfo


class Endpoint:
    """One server URL and what the dispatcher knows about it."""

    def __init__(self, url: str, name: str, counts: EndpointCounts, health_path: str = "/health_generate"):
        self.url = url.rstrip("/")
        self.name = name  # the URL without credentials: what logs and shards show
        self.counts = counts
        self.in_flight = 0
        self.healthy = False
        self.fails = 0
        self.health_fails = 0
        self.probing = False
        self.next_check = 0.0
        self.probe_backoff = 1.0
        self.health_path = health_path  # the next one of the kind's health_paths after a 404
        self.extras_off: frozenset[str] = frozenset()
        self.tasks: set[asyncio.Task] = set()
        self.last_error = ""
        self.ever_healthy = False
        self.probed = False  # a health probe has answered (either way): the scheduler's start gate
        self.facts: ServerFacts | None = None  # what the server said about itself (preflight or first health)
        self.gen_url = self.url  # the generate URL (set by the dispatcher from the protocol)
        # Conversations' next turns waiting for this endpoint (it served their previous turn and is
        # full): (since when, job), oldest first; the scheduler's sticky dispatch owns it.
        self.parked: deque = deque()


class EndpointHealth:
    """The endpoints of one run (``endpoints``, in the order given) and their health.

    ``log(msg)`` gets the one-line events (taken out, healthy again, no healthy endpoint);
    ``facts`` are the start-up preflight's findings per URL. ``transport`` (the run's) and
    ``wake`` (the scheduler's wake-up) are set when the run starts.
    """

    def __init__(self, urls: list[str], protocol, progress: Progress, settings, log: Callable[[str], None],
                 facts: dict[str, ServerFacts | None] | None = None):
        self.protocol = protocol
        self.s = settings
        self.log = log
        self.transport: Transport | None = None
        self.wake: Callable[[], None] = lambda: None
        self.endpoints: list[Endpoint] = []
        path = protocol.path
        # Health: where the protocol's server kind reads it, best first (a 404 moves on).
        self.health_paths = KINDS[protocol.name].health_paths
        self.seed_notice = SeedNotice()
        for u in urls:
            name = strip_userinfo(u.rstrip("/"))
            ep = Endpoint(u, name, progress.endpoints.setdefault(name, EndpointCounts()), self.health_paths[0])
            ep.gen_url = ep.url + path
            known = (facts or {}).get(u)
            if known is not None:
                self.learn(ep, known)
            self.endpoints.append(ep)
        self.all_down_since: float | None = time.monotonic()
        self._warned_down = False

    def take_out(self, ep: Endpoint, why: str) -> None:
        """Take ``ep`` out of the fleet: its in-flight requests are cancelled (the scheduler puts them
        back in the queue for the others) and it is probed back in, with backoff."""
        ep.healthy = False
        ep.counts.healthy = False
        ep.probe_backoff = 1.0
        ep.next_check = time.monotonic() + ep.probe_backoff
        moved = 0
        for t in list(ep.tasks):
            if not t.done():
                t.cancel()
                moved += 1
        self.log(f"{ep.name}: taken out ({why}); {moved} in-flight requests go to the other endpoints")
        if not any(e.healthy for e in self.endpoints) and self.all_down_since is None:
            self.all_down_since = time.monotonic()

    def pause(self, ep: Endpoint, why: str) -> None:
        """Stop sending to ``ep`` until its health path answers 200 again, leaving its in-flight
        requests alone: an endpoint with no model server behind it to send to
        (``ServerFacts.no_capacity``; it still finishes, or re-sends, what it holds)."""
        if not ep.healthy:
            return
        ep.healthy = False
        ep.counts.healthy = False
        ep.probe_backoff = 1.0
        ep.next_check = time.monotonic() + ep.probe_backoff
        self.log(f"{ep.name}: paused ({why}); sending again once its {ep.health_path} answers 200")
        if not any(e.healthy for e in self.endpoints) and self.all_down_since is None:
            self.all_down_since = time.monotonic()

    def bring_in(self, ep: Endpoint) -> None:
        """Put ``ep`` (healthy again, or for the first time) back into the fleet."""
        self._warned_down = False
        ep.healthy = True
        ep.counts.healthy = True
        ep.fails = 0
        ep.health_fails = 0
        if ep.ever_healthy:
            self.log(f"{ep.name}: healthy again, back in the fleet")
        ep.ever_healthy = True
        self.all_down_since = None

    def start_due_probes(self, now: float, spawn: Callable) -> None:
        """Start a health probe (``spawn(coroutine)``, the loop's ``create_task``) of every endpoint
        whose next check is due and that is not being probed."""
        for ep in self.endpoints:
            if not ep.probing and now >= ep.next_check:
                ep.probing = True
                spawn(self._probe(ep))

    def down_too_long(self, now: float) -> str | None:
        """While no endpoint is healthy (``all_down_since`` set): says so once after 5 s, and returns
        the message that stops the run once that has lasted ``down_deadline`` seconds, else None."""
        if not self._warned_down and now - self.all_down_since > 5.0:
            self._warned_down = True
            why = "; ".join(f"{e.name}: {e.last_error}" for e in self.endpoints if e.last_error)[:300]
            self.log(f"no healthy endpoint{f' ({why})' if why else ''}; waiting up to {self.s.down_deadline:g} s")
        if now - self.all_down_since > self.s.down_deadline:
            errs = "; ".join(f"{e.name}: {e.last_error}" for e in self.endpoints if e.last_error)
            return strip_userinfo(
                f"all {len(self.endpoints)} endpoints down for more than {self.s.down_deadline:g} s"
                f"{f' ({errs[:300]})' if errs else ''}; rerun the same command to resume"
            )
        return None

    async def _probe(self, ep: Endpoint) -> None:
        try:
            ok, err = await self._health(ep)
            if ok and not ep.ever_healthy:
                await self._discover_model(ep)
        except Exception as exc:  # a probe never kills the run
            ok, err = False, f"{type(exc).__name__}: {exc}"
        finally:
            ep.probing = False
            ep.probed = True
        now = time.monotonic()
        if ok:
            if not ep.healthy:
                self.bring_in(ep)
            ep.health_fails = 0
            ep.next_check = now + self.s.health_interval
        elif ep.healthy:
            ep.health_fails += 1
            ep.last_error = err
            if ep.health_fails >= 2:
                self.take_out(ep, f"health check failed: {err}")
            else:
                ep.next_check = now + min(self.s.health_interval, 2.0)
        else:
            ep.last_error = err or ep.last_error
            ep.probe_backoff = min(ep.probe_backoff * 2, self.s.probe_max_interval)
            ep.next_check = now + ep.probe_backoff
        self.wake()

    async def _health(self, ep: Endpoint) -> tuple[bool, str]:
        paths = self.health_paths
        timeout = self.s.health_timeout
        connect = min(self.s.connect_timeout, timeout) if self.s.connect_timeout > 0 else timeout
        for _ in range(len(paths)):
            try:
                status, _ = await self.transport.request("GET", ep.url + ep.health_path, timeout=timeout, connect_timeout=connect)
            except TransportError as exc:
                if exc.kind == "timeout":
                    return False, f"{ep.health_path} timed out"
                return False, f"{ep.health_path}: {' '.join(str(exc).split())[:120 if exc.kind != 'tls' else 400]}"
            later = paths[paths.index(ep.health_path) + 1:] if ep.health_path in paths else ()
            if status == 404 and later:
                ep.health_path = later[0]  # servers without it (transformers serve has no /health_generate)
                continue
            return status == 200, f"{ep.health_path} HTTP {status}"
        return False, "no health endpoint"

    def learn(self, ep: Endpoint, facts: ServerFacts) -> None:
        """Keep what ``ep`` said about itself; the model name when none was given; say once when
        its seeds do not reproduce outputs. ``--context-length`` (the settings') applies here."""
        with_context_length(facts, getattr(self.s, "context_length", None))
        ep.facts = facts
        if facts.model and not self.protocol.model:
            self.protocol.model = facts.model
        self.seed_notice.check(ep.name, facts, self.log)

    async def _discover_model(self, ep: Endpoint) -> None:
        """Learn what the endpoint is (model name, context length, speculative reserve, seeds) when
        the start-up preflight could not (it was not up yet)."""
        if ep.facts is not None and ep.facts.complete:
            return
        facts = await discover(self.transport, ep.url, self.s.health_timeout)
        if facts.complete or ep.facts is None:
            self.learn(ep, facts)
            if facts.complete:
                self.log(describe(ep.name, facts))
