"""What a server is, asked before the first request: reachable? which protocol? its limits.

``preflight`` runs once at the start of ``dqa regen``, on every endpoint at once:

- Reachable: any HTTP answer counts (a server still starting answers 503 on ``/health``: that is
  reachable, and the dispatcher waits for it up to ``--down-deadline``). A connect failure is
  tried again a few times over a few seconds; when no endpoint ever answers, the run stops at
  once (``RuntimeFailure``, exit 3) instead of waiting ``--down-deadline`` for a typo.
- Which server: ``GET /server_info`` (older ``/get_server_info``) answering a JSON object is
  SGLang; ``GET /v1/models`` answering ``{"data": [...]}`` is OpenAI-compatible. Then the
  protocol's own checks (``ServerKind.preflight`` in ``servers.sglang`` / ``servers.openai``):
  ``--protocol sglang`` against a server without ``/generate`` (``GET /generate`` is 404: the
  route does not exist; SGLang answers 405, POST only) is a ``UsageError`` (exit 2) saying to use
  ``--protocol openai``; the other way round likewise.
- Token-exact OpenAI route (``--protocol openai``): an SGLang endpoint gets one probe request
  (``servers.openai.probe_token_ids``), ``POST /v1/chat/completions`` with ``input_ids``,
  ``"return_token_ids": true`` and ``max_tokens`` 1 (SGLang 0.5.23 answers ``choices[0].response_token_ids`` and
  ``prompt_token_ids`` equal to the ids sent; older releases ignore the fields). Other servers
  take the text round trip without a probe. ``ServerFacts.token_ids`` holds the answer (None:
  not known, e.g. still starting; the first real reply decides) and run.json records it per
  endpoint as ``openai_route`` (``token-exact`` / ``text``).
- Limits (``ServerFacts``): the model name and context length from ``/v1/models``
  ``data[0].id`` / ``max_model_len`` (``/server_info`` ``context_length`` otherwise; ``/model_info``
  does not carry it), the speculative reserve, the version (how SGLang compares lengths) and
  whether ``sampling_seed`` takes effect (``enable_deterministic_inference``). See
  ``server_sglang`` and SGLANG.md.

``discover`` is the same fact finding for one endpoint; the dispatcher calls it again for an
endpoint that was not up at start-up, once it becomes healthy.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dqa.errors import RuntimeFailure, UsageError

from . import server_sglang as sg
from .servers import KINDS
from .wire.transport import AiohttpTransport, Transport, TransportError
from .servers.openai import PROBE_IDS, probe_token_ids, token_ids_answer  # noqa: F401  (the token-exact probe)
from .wire.urls import strip_userinfo

SGLANG = "sglang"
OPENAI = "openai"
UNKNOWN = "unknown"
# Start-up reachability: tries over this many seconds before an endpoint counts as never reachable.
PREFLIGHT_WINDOW_S = 6.0


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
        }


def facts_from(server_info: Any, models: Any) -> ServerFacts:
    """``ServerFacts`` from the parsed ``/server_info`` and ``/v1/models`` replies (either may be None)."""
    f = ServerFacts()
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


async def _get_json(transport: Transport, url: str, timeout: float) -> tuple[int | None, Any]:
    """(status, parsed JSON or None); status None when nothing answered."""
    try:
        status, raw = await transport.request("GET", url, timeout=timeout)
    except TransportError:
        return None, None
    if status != 200:
        return status, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


async def discover(transport: Transport, url: str, timeout: float) -> ServerFacts:
    """Ask one endpoint (base URL) what it is: ``/server_info`` (``/get_server_info``) and
    ``/v1/models``, each answering within ``timeout`` seconds. Never raises for server behaviour."""
    info = None
    for path in ("/server_info", "/get_server_info"):
        status, obj = await _get_json(transport, url + path, timeout)
        if isinstance(obj, dict):
            info = obj
            break
    _, models = await _get_json(transport, url + "/v1/models", timeout)
    return facts_from(info, models)


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


async def _reachable(transport: Transport, url: str, window: float, try_timeout: float, read_timeout: float) -> tuple[bool, str, str | None]:
    """Whether ``url`` answers HTTP at all (any status; a connection that is accepted but slow to
    answer counts too) within ``window`` seconds: ``(answers, the last connect error when it does
    not, the usage error of a TLS failure)``."""
    deadline = time.monotonic() + window
    delay = 0.25
    err = ""
    while True:
        try:
            await transport.request("GET", url + "/health", timeout=read_timeout, connect_timeout=try_timeout)
            return True, "", None
        except TransportError as exc:
            if exc.kind == "tls":  # a wrong setup, not a server still starting: say the fix now
                return False, str(exc), str(exc)
            if exc.connected:
                return True, "", None  # connected, then slow or misbehaving: it is there
            err = " ".join(str(exc).split())[:160] or exc.kind
        if time.monotonic() + delay > deadline:
            return False, err, None
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


async def _one(transport: Transport, url: str, protocol: str, window: float, try_timeout: float,
               info_timeout: float) -> tuple[bool, str, ServerFacts, str | None]:
    name = strip_userinfo(url)
    ok, err, wrong = await _reachable(transport, url, window, try_timeout, info_timeout or 10.0)
    if not ok:
        return False, err, ServerFacts(), wrong
    facts = await discover(transport, url, info_timeout)
    kind = KINDS.get(protocol)
    # The protocol's own checks: its route exists (else the usage error), what route it takes.
    wrong = await kind.preflight(transport, url, name, facts, info_timeout) if kind is not None else None
    return True, "", facts, wrong


async def preflight_async(
    urls: list[str], protocol: str, headers: dict[str, str] | None = None, connect_timeout: float = 10.0,
    info_timeout: float = 10.0, window: float = PREFLIGHT_WINDOW_S, transport: Transport | None = None,
) -> dict[str, ServerFacts | None]:
    """Probe every endpoint at once, over ``transport`` (the run's; None: one of its own, closed
    after); ``{url: facts}`` (None: not reachable during ``window``).

    Raises ``UsageError`` (exit 2) for an endpoint that does not speak ``protocol`` or whose TLS
    cannot be verified, and ``RuntimeFailure`` (exit 3) when no endpoint answers at all.
    """
    try_timeout = max(1.0, min(connect_timeout, 3.0))
    own = transport is None
    if own:
        transport = AiohttpTransport(headers, connect_timeout=try_timeout, request_timeout=info_timeout)
    try:
        results = await asyncio.gather(*[_one(transport, u, protocol, window, try_timeout, info_timeout) for u in urls])
    finally:
        if own:
            await transport.close()
    for _, _, _, wrong in results:
        if wrong:
            raise UsageError(strip_userinfo(wrong))
    if not any(ok for ok, *_ in results):
        why = "; ".join(f"{strip_userinfo(u)}: {err}" for u, (_, err, _, _) in zip(urls, results))
        raise RuntimeFailure(
            f"no endpoint answers ({why[:400]}): all {len(urls)} down at start-up; "
            "check the URLs, start the servers and rerun"
        )
    return {u: (facts if ok else None) for u, (ok, _, facts, _) in zip(urls, results)}


def preflight(urls: list[str], protocol: str, headers: dict[str, str] | None = None, connect_timeout: float = 10.0,
              info_timeout: float = 10.0, window: float = PREFLIGHT_WINDOW_S) -> dict[str, ServerFacts | None]:
    """``preflight_async`` in its own event loop, over a transport of its own (see there)."""
    return asyncio.run(preflight_async(urls, protocol, headers, connect_timeout, info_timeout, window))


def describe(name: str, f: ServerFacts) -> str:
    """One log line about an endpoint's facts."""
    parts = [f.kind if f.kind != SGLANG else f"SGLang {f.version or '(version not said)'}"]
    if f.model:
        parts.append(f.model)
    if f.context_length:
        parts.append(f"context {f.context_length}")
    if f.reserve:
        parts.append(f"speculative reserve {f.reserve}")
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
