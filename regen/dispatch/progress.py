"""Live figures of a regen run: counts, rates, ETA, cost; ``progress.json`` (the terminal display
that draws them is ``dqa.reports.regen_live``).

While a session runs (``running``/``draining``), rates come from measured counts over a sliding
window (last 60 s) of this session. Once it stops (``finished``/``interrupted``/``failed``) they
are the run's mean rates over its working time: ``done / elapsed_s`` and ``output tokens /
elapsed_s``, so a finished run keeps real figures. ``done``/``ok``/... include rows finished by
earlier sessions of the same output folder, and ``elapsed_s``/``cost_so_far`` add up the time
each session worked (idle time between sessions is not counted; a rerun with nothing left to
do adds none). Tokens are always the output tokens recorded in the shards (``output_tokens``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from dqa.regen.store.shards import ShardStatus

WINDOW_S = 60.0
GAP_S = 60.0  # no request in flight for this long: the run was not working (between sessions, fleet down)
LIVE_STATES = ("running", "draining")


def work_spans(completed_at: np.ndarray, latency_s: np.ndarray | None = None, min_gap_s: float = GAP_S) -> list[tuple[int, int, float]]:
    """Split a run's completions into stretches of work, from the shards' ``completed_at`` (epoch s)
    and ``latency_s``.

    Each row had a request in flight over ``[completed_at - latency_s, completed_at]``; a stretch
    of ``min_gap_s`` or more covered by no such interval (between two sessions of the run, or while
    the whole fleet was down) separates two spans. ``completed_at`` must be sorted. Returns
    ``(start index, end index, first request time)`` per span (indexes into the sorted rows, end
    exclusive). Without ``latency_s`` the whole run is one span.
    """
    t = np.asarray(completed_at, dtype=np.float64)
    n = t.size
    if n == 0:
        return []
    if latency_s is None:
        return [(0, n, float(t[0]))]
    lat = np.nan_to_num(np.asarray(latency_s, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    start = t - np.maximum(lat, 0.0)
    later = np.minimum.accumulate(start[::-1])[::-1]  # earliest request start among rows i.. (completing at or after t[i])
    cuts = (np.flatnonzero(later[1:] - t[:-1] >= min_gap_s) + 1).tolist()
    bounds = [0, *cuts, n]
    return [(a, b, float(min(start[a:b].min(), t[a]))) for a, b in zip(bounds, bounds[1:])]


def active_seconds(completed_at: np.ndarray, latency_s: np.ndarray | None = None, min_gap_s: float = GAP_S) -> float:
    """Seconds a run worked according to its shards: the spans of ``work_spans`` from the first
    request to the last completion, idle gaps left out."""
    t = np.sort(np.asarray(completed_at, dtype=np.float64))
    if latency_s is not None:
        order = np.argsort(np.asarray(completed_at, dtype=np.float64), kind="stable")
        latency_s = np.asarray(latency_s, dtype=np.float64)[order]
    return float(sum(t[b - 1] - first for _, b, first in work_spans(t, latency_s, min_gap_s)))


@dataclass
class EndpointCounts:
    healthy: bool = False
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    output_tokens: int = 0


@dataclass
class Progress:
    """Counters updated by the dispatcher; ``snapshot()`` is the progress.json object (FORMATS.md)."""

    total: int
    gpus: int = 1
    gpu_hour_cost: float = 0.0
    prior_elapsed_s: float = 0.0  # working time of earlier sessions (their progress.json elapsed_s)
    counting: bool = True  # False: this session has nothing to do, and adds no time (a rerun of a finished run)
    done: int = 0
    ok: int = 0
    failed: int = 0
    truncated: int = 0
    in_flight: int = 0
    output_tokens: int = 0
    session_done: int = 0
    session_output_tokens: int = 0
    # Multi-turn runs, this session: consecutive turns of a conversation both answered (turn k + 1
    # recorded after turn k), how many of them by the same endpoint; next turns the dispatcher sent
    # away from their endpoint, and those waiting for it now (scheduler.py's sticky dispatch).
    consecutive_turns: int = 0
    same_endpoint: int = 0
    turns_moved: int = 0
    turns_parked: int = 0
    state: str = "running"
    endpoints: dict[str, EndpointCounts] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    stopped: float | None = None  # when this session stopped working (``stop()``)
    _samples: deque = field(default_factory=deque)

    def stop(self) -> None:
        """The session's work is over: its time stops counting (final flush and uploads are not work)."""
        if self.stopped is None:
            self.stopped = time.monotonic()

    def elapsed(self, now: float | None = None) -> float:
        """Working seconds of all sessions so far."""
        if not self.counting:
            return self.prior_elapsed_s
        end = self.stopped if self.stopped is not None else (time.monotonic() if now is None else now)
        return self.prior_elapsed_s + max(0.0, end - self.started)

    def add_prior(self, ok: int, failed: int, truncated: int, output_tokens: int) -> None:
        """Count rows finished by earlier sessions."""
        self.ok += ok
        self.failed += failed
        self.truncated += truncated
        self.done += ok + failed + truncated
        self.output_tokens += output_tokens

    def record(self, status: str, output_tokens: int) -> None:
        self.done += 1
        self.session_done += 1
        self.output_tokens += output_tokens
        self.session_output_tokens += output_tokens
        if status == ShardStatus.OK:
            self.ok += 1
        elif status == ShardStatus.LENGTH:
            self.truncated += 1
        else:
            self.failed += 1

    def record_turn(self, output_tokens: int) -> None:
        """An earlier turn of a conversation finished: its tokens count, the conversation is not done yet."""
        self.output_tokens += output_tokens
        self.session_output_tokens += output_tokens

    def record_consecutive(self, same: bool) -> None:
        """A conversation's turn was answered after its previous turn; ``same``: by the same endpoint."""
        self.consecutive_turns += 1
        self.same_endpoint += bool(same)

    def same_endpoint_share(self) -> float | None:
        """Share of this session's consecutive turns answered by the same endpoint; ``None`` when
        there were none (a single-turn run)."""
        return self.same_endpoint / self.consecutive_turns if self.consecutive_turns else None

    def _rates(self, now: float) -> tuple[float, float]:
        s = self._samples
        s.append((now, self.session_done, self.session_output_tokens))
        while len(s) > 2 and now - s[0][0] > WINDOW_S:
            s.popleft()
        t0, d0, k0 = s[0]
        if now - t0 < 1.0:  # too short a window: use the whole session
            t0, d0, k0 = self.started, 0, 0
        dt = max(now - t0, 1e-9)
        return (self.session_done - d0) / dt, (self.session_output_tokens - k0) / dt

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        elapsed = round(self.elapsed(now), 3)  # as written: a rerun that adds no time reproduces the rates exactly
        if self.state in LIVE_STATES:
            req_s, tok_s = self._rates(now)
        else:  # stopped: the run's mean rates over the time it worked
            req_s = self.done / elapsed if elapsed > 0 else 0.0
            tok_s = self.output_tokens / elapsed if elapsed > 0 else 0.0
        remaining = max(self.total - self.done, 0)
        eta = remaining / req_s if req_s > 0 else None
        rate = self.gpus * self.gpu_hour_cost / 3600.0
        cost = elapsed * rate
        generated = self.ok + self.truncated  # failed rows produced no output
        mean_out = self.output_tokens / generated if generated else 0.0
        return {
            "state": self.state,
            "total": self.total,
            "done": self.done,
            "ok": self.ok,
            "failed": self.failed,
            "truncated": self.truncated,
            "in_flight": self.in_flight,
            "elapsed_s": elapsed,
            "req_per_s": round(req_s, 3),
            "output_tok_per_s": round(tok_s, 1),
            "mean_output_tokens": round(mean_out, 1),
            "eta_s": round(eta, 1) if eta is not None else (0.0 if remaining == 0 else None),
            "gpus": self.gpus,
            "gpu_hour_cost": self.gpu_hour_cost,
            "cost_so_far": round(cost, 4),
            "cost_projected": round(cost + (eta or 0.0) * rate, 4) if (eta is not None or remaining == 0) else None,
            "consecutive_turns": self.consecutive_turns,
            "same_endpoint_share": None if (share := self.same_endpoint_share()) is None else round(share, 4),
            "turns_moved": self.turns_moved,
            "turns_parked": self.turns_parked,
            "endpoints": {
                url: {"healthy": e.healthy, "in_flight": e.in_flight, "done": e.done, "failed": e.failed, "output_tokens": e.output_tokens}
                for url, e in self.endpoints.items()
            },
            "updated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
