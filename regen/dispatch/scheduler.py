"""The scheduler: least-outstanding-requests over healthy endpoints, retries, draining, records.

One asyncio loop drives everything: a dispatch loop hands ready jobs to the
healthy endpoint with the fewest requests in flight (below its cap),
preferring another endpoint than the one a retry failed on; each attempt is a
task. Conversations are sticky: a conversation's next turn (its prompt extends the previous
turn's, which that server holds in its prefix cache) goes to the endpoint that answered the
previous turn; while that endpoint is at its cap the turn waits for it (``Endpoint.parked``), for
at most ``sticky_wait`` seconds, then goes to whichever endpoint has room; a turn whose endpoint
is out, and a retry, go elsewhere at once. Where a conversation's turn was answered is kept only
while it has turns to go (``home``). Retry rules follow docs/sglang.md: backoff on 408/429/5xx/abort/connection
errors with a fresh ``rid``; 400s and other client errors are recorded as
failures; a request the server rejects whatever the row (an unknown field, no such route)
stops the run (``fatal``) without recording the row. An endpoint with ``fail_threshold`` consecutive endpoint faults (or a
refused connection, or two failed health checks) is taken out: its in-flight
requests are cancelled and go back to the queue for the others, and it is
probed back in with its server kind's health path (``/health_generate``; ``/health`` for servers
without it: ``servers.base.ServerKind.health_paths``). That health state machine is
``endpoints.EndpointHealth``; the queue, the pick, the attempts and the journal records are here.

What each endpoint is (``servers.facts.ServerFacts``: context length, speculative reserve,
version, whether seeds take effect) comes from the start-up preflight, or is asked once the
endpoint first becomes healthy; ``max_new_tokens`` is capped per request so SGLang's length
check passes, and each row's ``sampling`` records ``seed_applied``; a prompt that cannot fit is
recorded failed without being sent. ``attempts`` counts the requests that may have reached a model
server (not one cancelled before it was sent, nor one the endpoint sent to no model server:
``ServerFacts.no_capacity``), and giving up uses that count. An endpoint that retries across
servers of its own (``ServerFacts.retries_itself``) is not taken out for their faults; with no
server available behind it, it is paused (``EndpointHealth.pause``). What such an endpoint is,
is ``servers/``' knowledge: nothing here asks.

Start: nothing is sent until every endpoint's first health probe has answered (healthy or not),
or for at most ``sticky_wait`` seconds after the first endpoint came in. SGLang's
``/health_generate`` runs a 1-token generation (~1 s), so without the wait the endpoint that
answered first got every queued first turn, up to its cap, and sticky dispatch kept those
conversations there.

Stopping: ``request_stop()`` (first Ctrl-C / SIGTERM) stops dispatching and
drains in-flight work; ``request_cancel()`` (second Ctrl-C) cancels it. Rows
not recorded are simply not in the output and a rerun picks them up.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import json
import random
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator

import numpy as np

from dqa.regen.dispatch.endpoints import Endpoint, EndpointHealth
from dqa.regen.config import DispatchSpec, Retries, Timeouts
from dqa.regen.dispatch.progress import Progress
from dqa.regen.jobs.job import Job
from dqa.regen.servers.facts import ServerFacts, unknown_context
from dqa.regen.store.journal import Result, encode
from dqa.regen.wire.call import call
from dqa.regen.wire.outcome import FAIL, FATAL, LENGTH, OK, RETRY, Outcome
from dqa.regen.wire.transport import AiohttpTransport, Transport
from dqa.regen.wire.urls import strip_userinfo

STATUS = {OK: "ok", LENGTH: "length", FAIL: "failed"}


def _turn_fields(job: Job) -> tuple[int, int, int]:
    """``(turn, turns, kept_len)`` of a job for its journal record (a plain ``Job``: one turn, the whole prompt kept)."""
    if hasattr(job, "turn"):
        return job.turn, job.turns, job.kept_len  # type: ignore[attr-defined]
    return 0, 1, -1


_SPEC_GROUPS = {"timeouts": Timeouts, "retries": Retries}


def _from_spec(path: str) -> Any:
    """A ``DispatchSettings`` field read from the dispatch group at ``path`` (``"max_in_flight"``,
    ``"timeouts.health"``), whose default is that option's default (written once, in
    ``dqa.regen.config``)."""
    group, _, name = path.rpartition(".")
    cls = _SPEC_GROUPS[group] if group else DispatchSpec
    default = next(f.default for f in fields(cls) if f.name == name)
    return field(default=default, metadata={"spec": path})


@dataclass
class DispatchSettings:
    """Timing and retry knobs (seconds). Each field but ``probe_max_interval`` is one option of the
    dispatch group (``config.DispatchSpec``, its ``Timeouts`` and ``Retries``), named by its
    field's ``spec`` path, with that option's default; ``from_spec`` reads them all."""

    max_in_flight: int = _from_spec("max_in_flight")
    max_attempts: int = _from_spec("retries.max_attempts")
    backoff_base: float = _from_spec("retries.backoff_base")
    backoff_max: float = _from_spec("retries.backoff_max")
    fail_threshold: int = _from_spec("retries.fail_threshold")
    health_interval: float = _from_spec("timeouts.health_interval")
    health_timeout: float = _from_spec("timeouts.health")
    probe_max_interval: float = 30.0  # the longest wait between probes of an endpoint that is out
    down_deadline: float = _from_spec("timeouts.down_deadline")
    request_timeout: float = _from_spec("timeouts.request")
    connect_timeout: float = _from_spec("timeouts.connect")
    context_length: int | None = _from_spec("context_length")  # --context-length (servers.facts.with_context_length)
    sticky_wait: float = _from_spec("timeouts.sticky_wait")
    sticky: bool = _from_spec("sticky")  # False: no conversation affinity, every request to the least busy endpoint

    @classmethod
    def from_spec(cls, d: DispatchSpec) -> DispatchSettings:
        """The dispatcher's knobs of the dispatch group ``d``: every field with a ``spec`` path
        read from there, the others their defaults."""
        values = {}
        for f in fields(cls):
            path = f.metadata.get("spec")
            if path:
                value: Any = d
                for part in path.split("."):
                    value = getattr(value, part)
                values[f.name] = value
        return cls(**values)


def open_transport(settings: DispatchSettings, headers: dict[str, str] | None = None, policy=None) -> AiohttpTransport:
    """The transport of a run driven by ``settings``: its timeouts, ``max_in_flight`` connections
    per endpoint plus a few for health checks and discovery, TLS and proxies from ``policy``
    (an ``http_policy.HttpPolicy``; default: the environment's)."""
    return AiohttpTransport(headers, connect_timeout=settings.connect_timeout, request_timeout=settings.request_timeout,
                            per_host=settings.max_in_flight + 8, policy=policy)


class Dispatcher:
    """Runs the selected jobs through the fleet; ``run()`` returns the final state.

    ``source`` yields lists of jobs (blocking reads run in a worker thread);
    ``sink(frame)`` receives each encoded journal record; ``log(msg)`` gets
    one-line events (endpoint taken out / back, stopping).
    """

    def __init__(
        self,
        urls: list[str],
        protocol,
        source: Iterator[list[Job]],
        sink: Callable[[bytes, Result], None],
        progress: Progress,
        settings: DispatchSettings,
        headers: dict[str, str] | None = None,
        model: str = "",
        log: Callable[[str], None] = lambda m: None,
        check: Callable[[], str | None] = lambda: None,
        facts: dict[str, ServerFacts | None] | None = None,
        transport: Transport | None = None,
    ):
        self.protocol = protocol
        self.source = source
        self.sink = sink
        self.progress = progress
        self.s = settings
        self.headers = dict(headers or {})
        # The run's one transport (run.py opens it for the preflight too); else one of its own.
        self.transport: Transport | None = transport
        self._own_transport = transport is None
        self.model = model
        self.log = lambda msg: log(strip_userinfo(msg))  # error texts may quote an endpoint URL
        self.check = check
        # The endpoints and their health (taken out, brought back); the list is theirs.
        self.health = EndpointHealth(urls, protocol, progress, settings, self.log, facts)
        self.endpoints: list[Endpoint] = self.health.endpoints
        self.pending: list[Job] = []  # used as a stack of lists: see _next_job
        self._pending_pos = 0
        self.retries: list[tuple[float, int, Job]] = []
        self._tick = itertools.count()
        self.exhausted = False
        self.refilling = False
        self.stopping = False
        self.cancelling = False
        self.fatal: str | None = None
        self.fatal_exc: Exception | None = None  # the exception behind ``fatal`` when reading the dataset failed
        self.in_flight = 0
        self._sampling_json: dict[tuple[frozenset[str], int, bool | None], str] = {}
        # This session's requests: how many rows the servers answered, how many failed after a request.
        self.answered = 0
        self.request_failures = 0
        self.last_failure = ""
        self._rng = random.Random(0)
        self._sent: set[asyncio.Task] = set()  # attempts whose request may have reached the server
        # Sticky conversations: row -> the endpoint that answered its latest turn, while it has turns to go.
        # (Kept without sticky dispatch too: progress.json's same-endpoint share is read off it.)
        self.home: dict[int, Endpoint] = {}
        # The start gate (see the module docstring): open once every endpoint was probed, or
        # ``sticky_wait`` seconds after the first came in (``first_in_at``).
        self.started = False
        self.first_in_at: float | None = None

    @property
    def parked(self) -> int:
        """Next turns waiting for their endpoint now (the sum of the endpoints' parked queues;
        progress.json's ``turns_parked``)."""
        return self.progress.turns_parked

    @parked.setter
    def parked(self, n: int) -> None:
        self.progress.turns_parked = n

    @property
    def moved(self) -> int:
        """Next turns this session sent elsewhere than the endpoint that answered the turn before
        (progress.json's ``turns_moved``)."""
        return self.progress.turns_moved

    @moved.setter
    def moved(self, n: int) -> None:
        self.progress.turns_moved = n

    # -- public control -----------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop dispatching and drain in flight (first Ctrl-C); a second call cancels (second Ctrl-C)."""
        if self.stopping:
            self.request_cancel()
            return
        self.stopping = True
        self.progress.state = "draining"
        self.log(f"stopping: draining {self.in_flight} in-flight requests (Ctrl-C again to cancel them)")
        self.wake.set()

    def request_cancel(self) -> None:
        self.stopping = True
        self.cancelling = True
        self.progress.state = "interrupted"
        self.wake.set()

    # -- main ---------------------------------------------------------------------------
    async def run(self) -> str:
        """Dispatch until done, stopped or failed. Returns ``finished``, ``interrupted`` or ``failed`` (see ``fatal``)."""
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        if self.transport is None:  # generation, health checks and discovery: one session
            self.transport = open_transport(self.s, self.headers)
        self.health.transport = self.transport
        self.health.wake = self.wake.set
        ticker = self.loop.create_task(self._ticker())
        try:
            await self._dispatch_loop()
        finally:
            ticker.cancel()
            tasks = [t for ep in self.endpoints for t in ep.tasks]
            for t in tasks:
                t.cancel()
            await asyncio.gather(ticker, *tasks, return_exceptions=True)
            if self._own_transport:
                await self.transport.close()
        if self.fatal:
            return "failed"
        return "interrupted" if self.stopping else "finished"

    async def _dispatch_loop(self) -> None:
        while True:
            self.wake.clear()
            if self.fatal and not self.stopping:
                self.stopping = True
                self.cancelling = True
            if self.cancelling:
                for ep in self.endpoints:
                    for t in list(ep.tasks):
                        t.cancel()
                if self.in_flight == 0:
                    return
            elif self.stopping:
                if self.in_flight == 0:
                    return
            else:
                if not self.exhausted and not self.refilling and self._queued() < self._low_water():
                    self.refilling = True
                    self.loop.create_task(self._refill())
                self._dispatch_ready()
                if (self.exhausted and not self.refilling and self._queued() == 0 and not self.retries and self.in_flight == 0
                        and self.parked == 0):
                    return
            await self.wake.wait()

    def _low_water(self) -> int:
        return max(256, 2 * self.s.max_in_flight * len(self.endpoints))

    def _queued(self) -> int:
        return len(self.pending) - self._pending_pos

    async def _refill(self) -> None:
        try:
            while self._queued() < self._low_water():
                jobs = await asyncio.to_thread(next, self.source, None)
                if jobs is None:
                    self.exhausted = True
                    break
                if self._pending_pos:
                    self.pending = self.pending[self._pending_pos :]
                    self._pending_pos = 0
                self.pending.extend(jobs)
                self.wake.set()
        except Exception as exc:
            self.fatal = str(exc) if getattr(exc, "exit_code", None) else f"reading the dataset failed: {exc}"
            self.fatal_exc = exc
        finally:
            self.refilling = False
            self.wake.set()

    def _next_job(self, now: float) -> tuple[Job | None, bool]:
        """The next ready job (retries first) and whether it came from the retry heap."""
        if self.retries and self.retries[0][0] <= now:
            return self.retries[0][2], True
        if self._pending_pos < len(self.pending):
            return self.pending[self._pending_pos], False
        return None, False

    def _pop(self, from_retry: bool) -> None:
        if from_retry:
            heapq.heappop(self.retries)
        else:
            self._pending_pos += 1

    def _pick(self, avoid: str | None) -> Endpoint | None:
        best = None
        fallback = None
        for ep in self.endpoints:
            if not ep.healthy or ep.in_flight >= self.s.max_in_flight:
                continue
            if ep.url == avoid:
                fallback = ep
                continue
            if best is None or ep.in_flight < best.in_flight:
                best = ep
        return best or fallback

    def _start_gate_open(self, now: float) -> bool:
        """True once dispatching may start: every endpoint's first health probe has answered, or
        ``sticky_wait`` seconds have passed since the first endpoint came in (then a wake-up is due
        at that time). Stays True for the rest of the run."""
        if self.started:
            return True
        if self.first_in_at is None and any(ep.healthy for ep in self.endpoints):
            self.first_in_at = now
            self.loop.call_later(self.s.sticky_wait, self.wake.set)
        if all(ep.probed for ep in self.endpoints) or (self.first_in_at is not None and now - self.first_in_at >= self.s.sticky_wait):
            self.started = True
        return self.started

    def _dispatch_ready(self) -> None:
        now = time.monotonic()
        cap = self.s.max_in_flight
        if not self._start_gate_open(now):
            return
        if self.parked:
            self._unpark(now)
        while True:
            job, from_retry = self._next_job(now)
            if job is None:
                return
            if job.error is not None:
                self._pop(from_retry)
                self._record_failure(job, None, job.error, 0.0)
                continue
            home = self.home.get(job.row) if job.last_endpoint is None and self.s.sticky else None  # a retry goes elsewhere
            if home is not None and home.healthy:
                self._pop(from_retry)
                if home.in_flight < cap and not home.parked:
                    self._send(job, home)
                    if self.fatal:
                        return
                else:  # wait for it (the turns parked before this one go first)
                    home.parked.append((now, job))
                    self.parked += 1
                    self.loop.call_later(self.s.sticky_wait, self.wake.set)
                continue
            ep = self._pick(job.last_endpoint)
            if ep is None:
                return
            self._pop(from_retry)
            if home is not None:
                self.moved += 1
            self._send(job, ep)
            if self.fatal:
                return

    def _unpark(self, now: float) -> None:
        """Send the parked next turns: to their endpoint when it has room, elsewhere when they have
        waited ``sticky_wait`` seconds (and another endpoint has room) or their endpoint is out (back
        to the queue). Each queue is oldest first, so only its head can be due."""
        cap = self.s.max_in_flight
        for ep in self.endpoints:
            q = ep.parked
            while q:
                since, job = q[0]
                if not ep.healthy:
                    q.popleft()
                    self.parked -= 1
                    self._requeue_now(job)  # its home is out: the queue's pick sends it elsewhere
                    continue
                if ep.in_flight < cap:
                    q.popleft()
                    self.parked -= 1
                    self._send(job, ep)
                    continue
                if now - since < self.s.sticky_wait:
                    break
                other = self._pick(ep.url)
                if other is None or other is ep:
                    break
                q.popleft()
                self.parked -= 1
                self.moved += 1
                self._send(job, other)

    def _send(self, job: Job, ep: Endpoint) -> None:
        """Start an attempt of ``job`` on ``ep`` (a task; ``_finish`` is its done callback), or
        record it refused, never sent, when ``ep`` is known to reject it (``_refuse``)."""
        job.max_new = self._max_new(job, ep)
        if job.max_new < 1 or ep.facts is not None and unknown_context(ep.name, ep.facts):
            # Known to be rejected (or not known to fit where a 400 costs more than the row:
            # servers.facts.unknown_context): never sent.
            self._refuse(job, ep)
            return
        job.attempts += 1
        ep.in_flight += 1
        ep.counts.in_flight += 1
        self.in_flight += 1
        self.progress.in_flight += 1
        task = self.loop.create_task(self._attempt(job, ep))
        task.add_done_callback(functools.partial(self._finish, job, ep))
        ep.tasks.add(task)

    # -- one attempt ----------------------------------------------------------------------
    def _refuse(self, job: Job, ep: Endpoint) -> None:
        """Record ``job`` failed without sending it: its prompt leaves no room for output under
        ``ep``'s context length (with the speculative reserve), or ``ep``'s context length must be
        known and is not (``servers.facts.unknown_context``; then the run stops: nothing could be
        sent safely)."""
        f = ep.facts
        refused = unknown_context(ep.name, f) if f is not None else None
        if refused:
            if not self.fatal:
                self.fatal = refused  # the row is not recorded: a rerun with --context-length sends it
            return
        reserve = f" with its speculative reserve of {f.reserve} tokens" if f is not None and f.reserve else ""
        ctx = f.context_length if f is not None else None
        msg = (f"row {job.row}: prompt of {job.prompt.size} tokens leaves no room for output under {ep.name}'s "
               f"context length {ctx}{reserve}; not sent")
        self._record_failure(job, ep, msg, 0.0)

    async def _attempt(self, job: Job, ep: Endpoint) -> tuple[Outcome, frozenset[str], float]:
        t0 = time.monotonic()
        self._sent.add(asyncio.current_task())  # from here the request may reach the server: it counts as an attempt
        outcome, rejected = await call(self.transport, ep.gen_url, self.protocol, job, job.attempts, None, ep.extras_off, job.max_new)
        return outcome, rejected, time.monotonic() - t0

    def _max_new(self, job: Job, ep: Endpoint | None) -> int:
        """max_new_tokens for this request: the configured limit, capped so that the server's length
        check passes (context - prompt - speculative reserve, per its version; see servers.sglang_releases)."""
        n = self.protocol.sampling.max_new_tokens
        cap = ep.facts.output_cap(int(job.prompt.size)) if ep is not None and ep.facts is not None else None
        if cap is not None:
            n = min(n, cap)
        return n

    def _finish(self, job: Job, ep: Endpoint, task: asyncio.Task) -> None:
        """Done callback of an attempt (runs even when the task was cancelled before it started)."""
        ep.in_flight -= 1
        ep.counts.in_flight -= 1
        self.in_flight -= 1
        self.progress.in_flight -= 1
        ep.tasks.discard(task)
        sent = task in self._sent
        self._sent.discard(task)
        self.wake.set()
        if task.cancelled():
            if not sent:
                job.attempts -= 1  # cancelled before it was sent: not an attempt
            if not self.cancelling:
                # The endpoint was taken out: the request goes to the others. A request that was sent
                # counts as an attempt, towards giving up too (``attempts`` is what was sent).
                job.last_endpoint = ep.url
                if sent and job.attempts >= self.s.max_attempts:
                    self._record_failure(job, ep, f"gave up after {job.attempts} attempts; last: cancelled when {ep.name} was taken out ({ep.last_error or 'failing'})", 0.0)
                    return
                self._requeue_now(job)
            return
        exc = task.exception()
        if exc is not None:  # a bug, not server behaviour: retry like a failed attempt, say what happened
            outcome, rejected, latency = Outcome(RETRY, error=f"client error: {type(exc).__name__}: {exc}"), frozenset(), 0.0
        else:
            outcome, rejected, latency = task.result()
        if rejected:
            if rejected - ep.extras_off:
                self.log(f"{ep.name}: server rejects {', '.join(sorted(rejected))}; sending without them")
            ep.extras_off = ep.extras_off | rejected
            job.attempts -= 1
            self._requeue_now(job)
            return
        kind = outcome.kind
        if kind == FATAL:
            # Wrong for this server whatever the row: stop, record nothing (a rerun resumes).
            if not self.fatal:
                self.fatal = f"{ep.name}: {outcome.error}"
            self.wake.set()
            return
        if kind == OK or kind == LENGTH:
            ep.fails = 0
            self._record(job, ep, outcome, latency)
            if not self.stopping:
                self._dispatch_ready()  # refill the freed slot now, without a loop wake-up
            return
        if kind == FAIL:
            ep.fails = 0
            self._record_failure(job, ep, outcome.error or "failed", latency, outcome.finish_reason)
            return
        ep.last_error = outcome.error or ""
        if outcome.endpoint_fault:
            ep.fails += 1
            # An endpoint that retries across servers of its own has done so already and is
            # re-sending the other requests in flight: it is taken out only when it refuses
            # connections itself (its health path says whether a server is healthy behind it).
            facts = ep.facts
            retries_itself = facts is not None and facts.retries_itself
            no_capacity = facts.no_capacity(outcome.error) if facts is not None else None
            if ep.healthy and (outcome.refused or (ep.fails >= self.s.fail_threshold and not retries_itself)):
                self.health.take_out(ep, outcome.error or "failing")
            elif no_capacity:
                # Sent to no model server: not an attempt; dqa stops sending there until its
                # health path answers 200 again.
                self.health.pause(ep, no_capacity)
                job.attempts -= 1
                if not self.stopping:
                    job.last_endpoint = ep.url
                    self._requeue_now(job)
                return
        if self.stopping:
            return  # not recorded: a rerun regenerates it
        if job.attempts >= self.s.max_attempts:
            self._record_failure(job, ep, f"gave up after {job.attempts} attempts; last: {outcome.error}", latency, outcome.finish_reason)
            return
        job.last_endpoint = ep.url
        delay = min(self.s.backoff_max, self.s.backoff_base * (2 ** (job.attempts - 1))) * (0.75 + 0.5 * self._rng.random())
        heapq.heappush(self.retries, (time.monotonic() + delay, next(self._tick), job))
        self.loop.call_later(delay, self.wake.set)

    def _requeue_now(self, job: Job) -> None:
        heapq.heappush(self.retries, (0.0, next(self._tick), job))
        self.wake.set()

    # -- recording --------------------------------------------------------------------------
    def _sampling_for(self, ep: Endpoint | None, job: Job) -> str:
        """The sampling parameters as sent (JSON) and ``seed_applied`` (whether the server applies
        the seed: false for SGLang without --enable-deterministic-inference, null when not known),
        cached per (dropped fields, max_new_tokens, seed_applied)."""
        off = ep.extras_off if ep is not None else frozenset()
        applied = ep.facts.seed_applied if ep is not None and ep.facts is not None else None
        key = (off, job.max_new, applied)
        s = self._sampling_json.get(key)
        if s is None:
            d: dict = self.protocol.sampling.as_dict()
            d["max_new_tokens"] = job.max_new or self.protocol.sampling.max_new_tokens
            if "top_k" in off:
                d.pop("top_k")
            d["seed_applied"] = applied
            s = self._sampling_json[key] = json.dumps(d)
        return s

    def _record(self, job: Job, ep: Endpoint, outcome: Outcome, latency: float) -> None:
        status = STATUS[outcome.kind]
        # Every figure counts the output tokens the shard records (openai: the rendered reply, not `usage`).
        n = int(outcome.output_ids.size)
        r = Result(
            job.row, job.sample_id, job.prompt, outcome.output_ids, status, outcome.finish_reason, None,
            ep.name, job.attempts, latency, self.protocol.model or self.model, self._sampling_for(ep, job), job.seed, time.time(),
            *_turn_fields(job), outcome.cached_tokens,
        )
        self.sink(encode(r), r)
        # A conversation goes on with its next turn, on the history regenerated so far, only after an ok
        # turn; its record is appended first, so the journal holds turn k before turn k + 1 (a resume
        # never sees a later turn without the earlier one). A length cut ends the conversation.
        nxt = job.next_job(outcome.output_ids) if status == "ok" and hasattr(job, "next_job") else None
        before = self.home.get(job.row) if self.home else None  # the endpoint that answered the turn before
        if before is not None:
            self.progress.record_consecutive(before is ep)
        if nxt is not None:
            self.home[job.row] = ep  # sticky: its next turn goes back here
            self.progress.record_turn(n)
            self._requeue_now(nxt)
        else:
            if self.home:
                self.home.pop(job.row, None)  # the conversation is done: forget where it ran
            self.progress.record(status, n)
        self.answered += 1
        ep.counts.done += 1
        ep.counts.output_tokens += n

    def _record_failure(self, job: Job, ep: Endpoint | None, error: str, latency: float, finish: str = "") -> None:
        r = Result(
            job.row, job.sample_id, job.prompt, np.zeros(0, np.int32), "failed", finish or "", strip_userinfo(error),
            ep.name if ep is not None else "", job.attempts, latency, self.protocol.model or self.model, self._sampling_for(ep, job), job.seed, time.time(),
            *_turn_fields(job),
        )
        self.sink(encode(r), r)
        if self.home:
            self.home.pop(job.row, None)
        self.progress.record("failed", 0)
        if ep is not None:
            ep.counts.failed += 1
            self.request_failures += 1
            self.last_failure = strip_userinfo(error)

    # -- the clock --------------------------------------------------------------------------
    async def _ticker(self) -> None:
        health = self.health
        while True:
            now = time.monotonic()
            health.start_due_probes(now, self.loop.create_task)
            if health.all_down_since is not None and not self.stopping:
                down = health.down_too_long(now)
                if down is not None:
                    self.fatal = down
            msg = self.check()
            if msg and not self.fatal:
                self.fatal = msg
            self.wake.set()
            await asyncio.sleep(0.25)
