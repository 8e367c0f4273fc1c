"""What a server says about itself: ``ServerFacts`` (which server, its version, model, context
length, speculative reserve, whether seeds take effect, whether its chat route is token-exact).

- Which server: ``GET /server_info`` (older ``/get_server_info``) answering a JSON object is
  SGLang; ``GET /v1/models`` answering ``{"data": [...]}`` is OpenAI-compatible (``discover``,
  read by ``facts_from``).
- Limits: the model name and context length from ``/v1/models`` ``data[0].id`` /
  ``max_model_len`` (``/server_info`` ``context_length`` otherwise; ``/model_info`` does not carry
  it), the speculative reserve, the version (how SGLang compares lengths) and whether
  ``sampling_seed`` takes effect (``enable_deterministic_inference``). See ``sglang_releases``
  and docs/sglang.md.
- Token-exact OpenAI route (``--protocol openai``): ``ServerFacts.token_ids``, set by the openai
  kind's preflight (``servers.openai.probe_token_ids``; None: not known, e.g. still starting; the
  first real reply decides); run.json records it per endpoint as ``openai_route``
  (``token-exact`` / ``text``).
- Routes: ``route_status`` (what ``GET`` of a route answers: 404 is no such route, 405 a
  POST-only one) and ``redirected`` (a route that redirects is a usage error), for the kinds'
  preflight checks.

``dqa regen``'s start-up preflight (``dqa.regen.dispatch.preflight``) and the dispatcher (for an
endpoint that was not up at start-up, once it becomes healthy) ask ``discover``; the preflight
then ``settle``s each endpoint's facts. What an SGLang router changes is answered here and in
``sglang_router`` (``ServerFacts.retries_itself``, ``no_capacity``, ``unknown_context``), so the
dispatcher and the run never ask whether an endpoint is a router.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from dqa.errors import UsageError
from dqa.regen.wire.transport import Transport, TransportError

from . import sglang_releases as sg
from . import sglang_router as router

SGLANG = "sglang"
OPENAI = "openai"
UNKNOWN = "unknown"


@dataclass
class ServerFacts:
    """What one endpoint told about itself (``None``: it did not say)."""

    kind: str = UNKNOWN  # sglang | openai | unknown
    version: str | None = None
    model: str | None = None
    context_length: int | None = None
    reserve: int = 0  # speculative reserve added to the prompt in SGLang's length check
    deterministic: bool | None = None  # SGLang: --enable-deterministic-inference (seeds take effect)
    complete: bool = False  # the server answered the info requests (not still starting)
    # openai protocol: the chat route takes input_ids and returns response_token_ids (None: not known)
    token_ids: bool | None = None
    # An SGLang gateway (sglang-router or smg) in front of workers: what dqa learnt through it (None:
    # not one). Keys: gateway ("sglang-router" | "smg"), release (null: not known; from the fleet
    # file that launched it), release_from ("fleet file" | null), workers (their URLs),
    # workers_answered, context_from ("workers" | "--context-length" | null), sampling_fields
    # ({key: "applied" | "dropped" | "unknown"}).
    router: dict[str, Any] | None = None

    @property
    def inclusive(self) -> bool:
        """Equal to the context length is already over (0.5.4 and older, or no version said)."""
        return sg.inclusive_length_check(sg.parse_version(self.version))

    @property
    def seed_applied(self) -> bool | None:
        """Whether a request's seed reproduces its output: SGLang only with deterministic
        inference; None for other servers (not known)."""
        if self.kind == SGLANG:
            return bool(self.deterministic)
        return None

    @property
    def retries_itself(self) -> bool:
        """Whether the endpoint retries across servers of its own before it answers (an SGLang
        router in front of workers): its 5xx are its workers' faults, so the dispatcher takes it
        out only when it refuses connections itself."""
        return self.router is not None

    def no_capacity(self, error: str | None) -> str | None:
        """Why an attempt whose error text is ``error`` reached no model server, or None: an SGLang
        router's 503 ``no_available_workers`` (no healthy worker, or every circuit open; it has
        retried already). Such an attempt is not counted, and the dispatcher sends nothing more
        there until its health path answers 200 (``EndpointHealth.pause``)."""
        if self.router is not None and router.says_no_workers(error):
            return "the router has no available worker"
        return None

    def output_cap(self, prompt_len: int) -> int | None:
        """The largest ``max_new_tokens`` this server accepts for the prompt; None when its context
        length is not known."""
        if not self.context_length:
            return None
        return sg.output_cap(self.context_length, prompt_len, self.reserve, self.inclusive)

    def to_json(self) -> dict[str, Any]:
        """What run.json records per endpoint."""
        return {
            "server": self.kind,
            "version": self.version,
            "model": self.model,
            "context_length": self.context_length,
            "speculative_reserve": self.reserve,
            "deterministic_inference": self.deterministic,
            "seed_applied": self.seed_applied,
            # --protocol openai: token-exact (input_ids in, response_token_ids out) or text (the
            # reply rendered back into tokens); null for --protocol sglang or when not known
            "openai_route": None if self.token_ids is None else ("token-exact" if self.token_ids else "text"),
            # through an SGLang router: its workers and what it passes on (null: not a router)
            "router": self.router,
        }


def facts_from(server_info: Any, models: Any, missing_info: Any = None) -> ServerFacts:
    """``ServerFacts`` from the parsed ``/server_info`` (else ``/get_server_info``) and
    ``/v1/models`` replies (either may be None); ``missing_info`` is the parsed body of a 404 to
    ``/server_info`` (how smg is recognised)."""
    f = ServerFacts()
    gateway = router.gateway_of(server_info, missing_info)
    if gateway is not None:
        # A gateway: its info reply is its own object (sglang-router) or one worker's (smg); the
        # version, context length and speculative settings that count are every worker's
        # (``discover`` asks them). Its requests are SGLang's.
        f.kind = SGLANG
        f.router = {"gateway": gateway, "release": None, "release_from": None, "workers": [], "workers_answered": 0,
                    "context_from": None, "sampling_fields": None}
        server_info = None
    if isinstance(server_info, dict) and server_info:
        info = dict(server_info)
        nested = info.get("server_args")  # some releases nest the arguments
        if isinstance(nested, dict):
            info = {**nested, **info}
        f.kind = SGLANG
        f.version = str(info["version"]) if info.get("version") is not None else None
        f.reserve = sg.speculative_reserve(info)
        f.deterministic = sg.deterministic_inference(info)
        n = info.get("context_length") or info.get("max_context_length")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            f.context_length = n
        name = info.get("served_model_name") or info.get("model_path")
        if isinstance(name, str) and name:
            f.model = name
    card = None
    if isinstance(models, dict):
        data = models.get("data")
        if isinstance(data, list) and data and isinstance(data[0], dict):
            card = data[0]
            if f.kind == UNKNOWN:
                f.kind = OPENAI
    if card is not None:
        n = card.get("max_model_len")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            f.context_length = n  # the served limit: what the length check uses
        if isinstance(card.get("id"), str) and card["id"]:
            f.model = card["id"]
    f.complete = f.kind != UNKNOWN
    return f


def through_router(f: ServerFacts, workers: list[str], found: list[ServerFacts]) -> None:
    """Fill in a router's facts ``f`` (in place) from what its workers (``workers``, their URLs)
    said (``found``, in that order): the smallest context length, the largest speculative reserve,
    the oldest version (none when a worker did not say: the strict length check), seeds applied
    only when every worker applies them. Workers that did not answer count for nothing."""
    known = [w for w in found if w.complete and w.router is None]
    assert f.router is not None
    f.router.update(workers=list(workers), workers_answered=len(known))
    if not known:
        return
    lengths = [w.context_length for w in known if w.context_length]
    if lengths:
        f.context_length = min(lengths)
        f.router["context_from"] = "workers"
    f.reserve = max(w.reserve for w in known)
    versions = [sg.parse_version(w.version) for w in known]
    if all(v is not None for v in versions):
        f.version = known[min(range(len(known)), key=lambda i: versions[i])].version
    f.deterministic = all(bool(w.deterministic) for w in known)
    f.model = f.model or known[0].model


def with_context_length(f: ServerFacts, n: int | None) -> None:
    """Apply ``--context-length n`` to ``f`` (in place): the smaller of ``n`` and what the server
    said, the server's when ``n`` is None."""
    if not n:
        return
    if f.context_length is None or n < f.context_length:
        f.context_length = n
        if f.router is not None:
            f.router["context_from"] = "--context-length"


def settle(name: str, f: ServerFacts, context_length: int | None, sampling_keys: tuple[str, ...],
           declared: dict[str, Any] | None = None) -> str | None:
    """What the start-up probe does with one reachable endpoint's facts ``f`` (in place; ``name``
    without credentials): apply ``--context-length`` (``with_context_length``), and for an SGLang
    gateway take its release from ``declared`` (what the fleet file that launched it recorded,
    ``{"name": ..., "version": ...}``; used only when it names the gateway found) and record which
    of the ``sampling_keys`` sent it passes on (``router.sampling_fields``, run.json's
    ``servers.<url>.router.sampling_fields``). Returns the log line naming the fields dropped from
    every request (or why that is not known), or None; raises ``UsageError`` for a gateway whose
    context length is not known (``unknown_context``: never uncapped through a gateway, whose
    circuit breaker counts the 400s)."""
    with_context_length(f, context_length)
    refused = unknown_context(name, f)
    if refused:
        raise UsageError(refused)
    r = f.router
    if r is None:
        return None
    if isinstance(declared, dict) and declared.get("name") == r["gateway"] and isinstance(declared.get("version"), str):
        r["release"], r["release_from"] = declared["version"], "fleet file"
    r["sampling_fields"] = fields = router.sampling_fields(sampling_keys, r["gateway"], r["release"])
    which = f"{r['gateway']} {r['release'] or '(release not known)'}"
    if any(v == router.UNKNOWN for v in fields.values()):
        return (f"{name}: the SGLang gateway is {which}; which sampling fields it passes on is not known for it "
                "(run.json: servers.router.sampling_fields unknown; `dqa fleet up --router` records the release)")
    dropped = sorted(k for k, v in fields.items() if v == router.DROPPED)
    if not dropped:
        return None
    return f"{name}: the SGLang gateway ({which}) drops {', '.join(dropped)} from every request (run.json: servers.router.sampling_fields)"


def unknown_context(name: str, f: ServerFacts) -> str | None:
    """The usage error for a router whose context length is not known (dqa would send
    ``max_new_tokens`` uncapped, and every over-length 400 counts against the router's circuit
    breaker); None otherwise."""
    if f.router is None or f.context_length:
        return None
    r = f.router
    n, answered = len(r["workers"]), r["workers_answered"]
    if not n:
        why = "GET /workers lists no worker"
    elif answered:
        why = (f"{answered} of its {n} workers (GET /workers) answered, but none said its context length "
               "(/server_info context_length, /v1/models max_model_len)")
    else:
        why = f"none of its {n} workers (GET /workers) answered /server_info or /v1/models from here"
    return (f"{name}: an SGLang router, and dqa cannot learn its workers' context length ({why}); "
            "pass --context-length N (the workers' --context-length; less their speculative reserve when they use one)")


async def _get_json(transport: Transport, url: str, timeout: float, any_status: bool = False) -> tuple[int | None, Any]:
    """(status, parsed JSON or None); status None when nothing answered. The body of a reply
    other than 200 is parsed only with ``any_status``."""
    try:
        status, raw = await transport.request("GET", url, timeout=timeout)
    except TransportError:
        return None, None
    if status != 200 and not any_status:
        return status, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


async def discover(transport: Transport, url: str, timeout: float, ask_workers: bool = True) -> ServerFacts:
    """Ask one endpoint (base URL) what it is: ``/server_info``, falling back to
    ``/get_server_info`` (older SGLang, sglang-router) when that is not a JSON object, and
    ``/v1/models``, each answering within ``timeout`` seconds; for an SGLang gateway (with
    ``ask_workers``), also the workers ``GET /workers`` lists, all at once (``through_router``).
    Never raises for server behaviour."""
    status, info = await _get_json(transport, url + "/server_info", timeout, any_status=True)
    missing = info if status == 404 else None
    if status != 200 or not isinstance(info, dict):
        _, info = await _get_json(transport, url + "/get_server_info", timeout)
    _, models = await _get_json(transport, url + "/v1/models", timeout)
    f = facts_from(info if isinstance(info, dict) else None, models, missing)
    if f.router is not None and ask_workers:
        # A router answers for itself: the facts that matter are its workers'.
        _, listing = await _get_json(transport, url + "/workers", timeout)
        workers = router.worker_urls(listing)
        found = await asyncio.gather(*[discover(transport, w, timeout, ask_workers=False) for w in workers])
        through_router(f, workers, list(found))
    return f


async def route_status(transport: Transport, url: str, timeout: float) -> int | None:
    """The HTTP status of ``GET url`` (redirects not followed); None when nothing answered. A
    route that does not exist answers 404; a POST-only one 405."""
    try:
        status, _ = await transport.request("GET", url, timeout=timeout)
    except TransportError:
        return None
    return status


REDIRECTS = frozenset({301, 302, 303, 307, 308})


def redirected(name: str, path: str, status: int | None) -> str | None:
    """The usage error for a generation route that answers with a redirect, or None for any other
    status. dqa posts to the URL as given: following a redirect would cost every request a second
    round trip, and a 301/302/303 turns a POST into a GET."""
    if status not in REDIRECTS:
        return None
    return (f"{name}: {path} answers HTTP {status}, a redirect; dqa does not follow redirects: "
            f"pass -e the base URL it redirects to, without {path} (behind a proxy often https://)")


def describe(name: str, f: ServerFacts) -> str:
    """One log line about an endpoint's facts."""
    parts = [f.kind if f.kind != SGLANG else f"SGLang {f.version or '(version not said)'}"]
    if f.model:
        parts.append(f.model)
    if f.context_length:
        parts.append(f"context {f.context_length}")
    if f.reserve:
        parts.append(f"speculative reserve {f.reserve}")
    if f.router is not None:
        r = f.router
        parts.append(f"through an SGLang router ({r['gateway']} {r['release'] or '(release not known)'}; "
                     f"{r['workers_answered']} of {len(r['workers'])} workers answered"
                     + (f"; context from {r['context_from']}" if r["context_from"] else "") + ")")
    if f.token_ids is not None:
        parts.append("chat route token-exact (input_ids, response_token_ids)" if f.token_ids else "chat route text (rendered back into tokens)")
    return f"{name}: " + ", ".join(parts)


@dataclass
class SeedNotice:
    """Says once per run that seeds do not reproduce outputs on some endpoints."""

    said: bool = False
    endpoints: list[str] = field(default_factory=list)

    def check(self, name: str, facts: ServerFacts, log: Callable[[str], None]) -> None:
        if facts.seed_applied is not False or name in self.endpoints:
            return
        self.endpoints.append(name)
        if not self.said:
            self.said = True
            log(
                f"{name}: SGLang runs without --enable-deterministic-inference, so sampling_seed is not applied: "
                "a rerun will not reproduce these outputs (run.json and each row's sampling record seed_applied: false)"
            )
