"""The start-up preflight of ``dqa regen``, asked before the first request: reachable? which
protocol? its limits (``servers.facts``).

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
  ``servers.sglang_releases`` and docs/sglang.md.

``servers.facts.discover`` is the same fact finding for one endpoint; the dispatcher calls it again
for an endpoint that was not up at start-up, once it becomes healthy.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from dqa.errors import RuntimeFailure, UsageError
from dqa.regen.servers import KINDS
from dqa.regen.config import DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFLIGHT_WINDOW, DEFAULT_PROBE_TIMEOUT, Timeouts
from dqa.regen.servers.facts import ServerFacts, describe, discover, settle
from dqa.regen.wire.transport import AiohttpTransport, Transport, TransportError
from dqa.regen.wire.urls import strip_userinfo


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
    ok, err, wrong = await _reachable(transport, url, window, try_timeout, info_timeout or DEFAULT_PROBE_TIMEOUT)
    if not ok:
        return False, err, ServerFacts(), wrong
    facts = await discover(transport, url, info_timeout)
    kind = KINDS.get(protocol)
    # The protocol's own checks: its route exists (else the usage error), what route it takes.
    wrong = await kind.preflight(transport, url, name, facts, info_timeout) if kind is not None else None
    return True, "", facts, wrong


async def preflight_async(
    urls: list[str], protocol: str, headers: dict[str, str] | None = None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    info_timeout: float = DEFAULT_PROBE_TIMEOUT, window: float = DEFAULT_PREFLIGHT_WINDOW, transport: Transport | None = None,
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


def preflight(urls: list[str], protocol: str, headers: dict[str, str] | None = None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
              info_timeout: float = DEFAULT_PROBE_TIMEOUT, window: float = DEFAULT_PREFLIGHT_WINDOW) -> dict[str, ServerFacts | None]:
    """``preflight_async`` in its own event loop, over a transport of its own (see there)."""
    return asyncio.run(preflight_async(urls, protocol, headers, connect_timeout, info_timeout, window))


def probe_servers(t: Timeouts, link, log: Callable[[str], None]) -> dict[str, ServerFacts | None]:
    """Before the first request, over the run's ``link`` (a ``link.Link``): which endpoints answer
    and what they are, each endpoint's facts settled (``servers.facts.settle``: ``--context-length``,
    what it drops from requests, logged). Returns the facts per URL (None: not reachable yet; also
    kept as ``link.facts`` and given to the protocol); raises
    ``UsageError`` (exit 2) for an endpoint of the wrong protocol or with a TLS certificate it
    cannot verify, and ``RuntimeFailure`` (exit 3) when none answers at all."""
    s = link.servers
    facts = link.run(preflight_async(s.urls, s.protocol, s.headers, connect_timeout=t.connect,
                                     info_timeout=min(t.health, DEFAULT_PROBE_TIMEOUT), window=t.preflight_window,
                                     transport=link.transport))
    for u, f in facts.items():
        if f is not None:
            note = settle(strip_userinfo(u), f, link.settings.context_length, link.protocol.sampling_keys, s.declared.get(u))
            if note:
                log(note)
    link.protocol.use_facts(facts)  # e.g. openai: the token-exact chat route where the probe found it (issue 11, item 2)
    for u, f in facts.items():
        if f is None:
            log(f"{strip_userinfo(u)}: not reachable at start-up; waiting for it with the others")
        elif f.complete:
            log(describe(strip_userinfo(u), f))
    link.facts = facts
    return facts
