"""OpenAI-compatible chat servers: ``POST /v1/chat/completions`` with thinking on, token-exact
where the server allows it, else the reply rendered back into tokens. Any server that speaks
the OpenAI chat API (an SGLang, a vLLM, ``transformers serve``: ``servers.transformers``); dqa
does not launch this kind itself.

The request carries ``messages`` decoded from the prompt tokens and ``chat_template_kwargs:
{"enable_thinking": true}``. Token-exact where the server allows it (SGLang 0.5.23: docs/sglang.md):
the body also carries the prompt as ``input_ids`` (the server then skips its chat template;
``messages`` only give the stop tokens) and ``"return_token_ids": true``, and the reply's
``choices[0].response_token_ids`` are kept as they are, like ``/generate``'s ``output_ids`` (the
stop token included), when its ``prompt_token_ids`` are the prompt sent. Otherwise (another
server, an older SGLang: unknown chat fields are ignored there, or refused with a 400/422 naming
them) the text round trip: the reply (``reasoning_content`` + ``content``) is rendered back into
tokens with the tokenizer's chat template, and the rendered prompt part must equal the prompt
tokens; whitespace the server trimmed is lost. Which route an endpoint takes is decided at
start-up (the preflight, ``OpenAI.preflight``: a one-token probe request) or by its first reply, per endpoint
(``OpenAIProtocol.routes``). Output token counts everywhere are the tokens that go into the
shard, not the reply's ``usage``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from dqa.regen.servers.replies import error_in_body
from dqa.regen.wire.outcome import FAIL, LENGTH, OK, RETRY, Outcome, count_or_none, short
from dqa.regen.config import SamplingSpec
from dqa.regen.jobs.job import Job

from .base import Protocol, ServerKind

# The two routes of the openai protocol (run.json: servers[url].openai_route).
TOKEN_EXACT = "token-exact"
TEXT = "text"
TOKEN_FIELDS = ("input_ids", "return_token_ids")  # the token-exact route's request fields


def _cached(obj: dict) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of a chat reply (SGLang sends it with
    ``--enable-cache-report``), or None when the reply does not say."""
    usage = obj.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    return count_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None


class OpenAIProtocol(Protocol):
    """OpenAI-compatible ``/v1/chat/completions`` with thinking on: token-exact where the server
    takes ``input_ids`` and returns ``response_token_ids``, else rendered back into tokens.

    ``tokenizer`` is a transformers tokenizer with the model's chat template. Optional fields
    some servers reject as unknown (``top_k``, ``rid``, and the token-exact ``input_ids`` /
    ``return_token_ids``) are dropped per endpoint when a server answers that they are
    unexpected. ``token_ids=False`` never asks for the token-exact route.

    ``routes`` maps an endpoint's chat URL to ``TOKEN_EXACT`` or ``TEXT`` once known: from the
    start-up probe (``use_facts``) or from the endpoint's first reply. An endpoint not known yet is
    asked token-exact; a reply without ``response_token_ids`` (a server that ignores the fields)
    is rendered from its text, and the endpoint is sent text requests from then on.
    """

    name = "openai"
    path = "/v1/chat/completions"
    OPTIONAL = ("top_k", "rid") + TOKEN_FIELDS

    def __init__(self, sampling: SamplingSpec, tokenizer, turn_start: int, eot: int, model: str | None = None, token_ids: bool = True):
        self.sampling = sampling
        self.tokenizer = tokenizer
        self.turn_start = turn_start
        self.eot = eot
        self.model = model or ""
        self.token_ids = token_ids
        self.routes: dict[str, str] = {}
        self._facts: dict[str, Any] = {}  # chat URL -> ServerFacts, updated when a reply teaches the route

    def use_facts(self, facts: dict[str, Any]) -> None:
        """Take the start-up probe's findings (``{base URL: ServerFacts | None}``, see
        ``dqa.regen.dispatch.preflight.preflight``): an endpoint whose ``token_ids`` is known gets that route; the
        facts objects are kept and their ``token_ids`` updated when a reply says otherwise."""
        for url, f in facts.items():
            if f is None:
                continue
            key = url.rstrip("/") + self.path
            self._facts[key] = f
            if f.token_ids is not None:
                self.routes[key] = TOKEN_EXACT if (f.token_ids and self.token_ids) else TEXT

    def learn(self, url: str, route: str) -> None:
        """Record that the endpoint at ``url`` (its chat URL) answered by ``route``."""
        if route not in (TOKEN_EXACT, TEXT) or self.routes.get(url) == route:
            return
        if route == TEXT and self.routes.get(url) == TOKEN_EXACT:
            return  # one odd reply does not demote an endpoint that answered token-exact
        self.routes[url] = route
        f = self._facts.get(url)
        if f is not None:
            f.token_ids = route == TOKEN_EXACT

    def extras_for(self, url: str) -> frozenset[str]:
        """The fields not to send to ``url``: the token-exact ones where it takes the text route."""
        if not self.token_ids or self.routes.get(url) == TEXT:
            return frozenset(TOKEN_FIELDS)
        return frozenset()

    def rejected(self, url: str, status: int, body: bytes, extras_off: frozenset[str]) -> frozenset[str]:
        """The optional fields a 400/422 from ``url`` refuses (see ``rejected_extras``), not counting
        those already off; a refused token-exact field sends the endpoint the text route from then
        on (all of ``TOKEN_FIELDS`` dropped)."""
        rejected = self.rejected_extras(status, body) - extras_off
        if rejected.intersection(TOKEN_FIELDS):
            self.learn(url, TEXT)  # refused: this endpoint takes the text route
            rejected = rejected | frozenset(TOKEN_FIELDS)
        return rejected

    def replied(self, url: str, outcome: Outcome, extras_off: frozenset[str]) -> None:
        """A reply to a token-exact request says whether the endpoint is token-exact."""
        if outcome.route and not extras_off.intersection(TOKEN_FIELDS):
            self.learn(url, outcome.route)

    def messages(self, job: Job) -> list[dict]:
        from dqa.regen.jobs.prompts import chatml_messages

        if job.messages is None:
            job.messages = chatml_messages(job.prompt, self.tokenizer, self.turn_start, self.eot)
        return job.messages

    def body(self, job: Job, attempt: int, extras_off: frozenset[str], max_new: int) -> bytes:
        s = self.sampling
        payload: dict[str, Any] = {
            "messages": self.messages(job),
            "max_tokens": max_new,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": job.seed,
            "chat_template_kwargs": {"enable_thinking": True},
        }
        if self.model:
            payload["model"] = self.model
        if "top_k" not in extras_off:
            payload["top_k"] = s.top_k
        if "rid" not in extras_off:
            payload["rid"] = f"{job.key}:{attempt}"
        if self.token_ids and not extras_off.intersection(TOKEN_FIELDS):
            # SGLang 0.5.23: the prompt as token ids (no chat template on the server; messages still
            # give the stop tokens) and the output as token ids.
            payload["input_ids"] = job.prompt.tolist()
            payload["return_token_ids"] = True
        return json.dumps(payload).encode()

    @classmethod
    def rejected_extras(cls, status: int, body: bytes) -> frozenset[str]:
        """Optional fields a 400/422 reply names as unexpected (empty when it is another error)."""
        if status not in (400, 422):
            return frozenset()
        text = body.decode("utf-8", "replace").lower()
        if not any(w in text for w in ("unexpected", "extra", "not permitted", "unknown field")):
            return frozenset()
        return frozenset(f for f in cls.OPTIONAL if f"'{f}'" in text or f'"{f}"' in text or f"`{f}`" in text)

    def parse(self, obj: Any, job: Job) -> Outcome:
        bad = error_in_body(obj)
        if bad is not None:
            return bad
        try:
            choice = obj["choices"][0]
            message = choice.get("message") or {}
            finish = choice.get("finish_reason") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            return Outcome(FAIL, error=f"reply has no choices[0]: {short(obj, 120)}")
        if finish == "abort":
            return Outcome(RETRY, finish_reason="abort", error="aborted by server")
        exact = self.token_exact_ids(choice, job)
        if isinstance(exact, Outcome):
            return exact
        if exact is not None:
            kind = LENGTH if finish == "length" else OK
            return Outcome(kind, output_ids=exact, finish_reason=finish or "stop", route=TOKEN_EXACT, cached_tokens=_cached(obj))
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content")
        if reasoning is None:
            reasoning = message.get("reasoning")
        try:
            ids = self.render_output(job, content, reasoning, finish)
        except ValueError as exc:
            return Outcome(FAIL, finish_reason=finish, error=f"row {job.row}: {exc}")
        kind = LENGTH if finish == "length" else OK
        # The rendered ids are what the shard records; every figure (live display, progress.json,
        # report) counts them, not the server's `usage` (which may count differently).
        return Outcome(kind, output_ids=ids, finish_reason=finish or "stop", route=TEXT, cached_tokens=_cached(obj))

    def token_exact_ids(self, choice: dict, job: Job) -> np.ndarray | Outcome | None:
        """The reply's ``response_token_ids`` when the server answered token-exact: a flat list of
        ids, and ``prompt_token_ids`` (when given) equal to the prompt sent. ``None`` when the reply
        has none, or its prompt differs (a server that ignored ``input_ids`` and rendered the
        messages itself): the text round trip then applies. A malformed list is a failed ``Outcome``."""
        out = choice.get("response_token_ids")
        if out is None:
            return None
        finish = choice.get("finish_reason") or ""
        try:
            ids = np.asarray(out, dtype=np.int32)
        except (TypeError, ValueError, OverflowError):
            return Outcome(FAIL, finish_reason=finish, error="response_token_ids are not token ids")
        if ids.ndim != 1:
            return Outcome(FAIL, finish_reason=finish, error="response_token_ids are not a flat list")
        prompt = choice.get("prompt_token_ids")
        if prompt is not None and (not isinstance(prompt, list) or len(prompt) != job.prompt.size
                                   or not np.array_equal(np.asarray(prompt, dtype=np.int64), job.prompt)):
            return None
        return ids

    def render_output(self, job: Job, content: str, reasoning: str | None, finish: str) -> np.ndarray:
        """Render prompt messages + the reply with the chat template; return the tokens after the prompt.

        Raises ``ValueError`` when the rendered prompt part differs from the prompt tokens.
        """
        unclosed = False
        if reasoning is None and "<think>" in content:
            head, _, rest = content.partition("<think>")
            if "</think>" in rest:
                reasoning, _, content = rest.partition("</think>")
                content = head + content.lstrip("\n")
            else:  # thinking cut off by the length limit, no parser on the server
                reasoning, content, unclosed = rest, head, True
        elif reasoning is not None and not content and finish == "length":
            unclosed = True
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            reply["reasoning_content"] = reasoning
        tok = self.tokenizer
        text = tok.apply_chat_template(self.messages(job) + [reply], tokenize=False, enable_thinking=True)
        if not isinstance(text, str):
            raise ValueError("chat template did not render text")
        eot_text = tok.decode([self.eot], skip_special_tokens=False)
        cut = text.rfind(eot_text)
        if finish == "length" and cut >= 0:
            text = text[:cut]  # a truncated reply has no end of turn
            if unclosed:
                close = text.rfind("</think>")
                if close >= 0:
                    text = text[:close].rstrip("\n")
        elif cut >= 0:
            text = text[: cut + len(eot_text)]  # drop the template's newline after <|im_end|>
        ids = np.asarray(tok.encode(text, add_special_tokens=False), dtype=np.int32)
        p = job.prompt.size
        if ids.size < p or not np.array_equal(ids[:p], job.prompt):
            diff = int(np.argmax(ids[: min(p, ids.size)] != job.prompt[: min(p, ids.size)])) if ids.size else 0
            raise ValueError(f"the chat template renders the prompt differently from its tokens (first difference at token {diff}); use --protocol sglang for token-exact prompts")
        return ids[p:]


# ------------------------------------------------------------------------------ start-up probe

# The token-exact probe's prompt: ids every vocabulary has; one output token.
PROBE_IDS = [0, 1, 2]


def token_ids_answer(status: int | None, obj: Any, sent: list[int]) -> bool | None:
    """What a token-exact probe reply says: True when ``choices[0]`` carries a
    ``response_token_ids`` list and ``prompt_token_ids`` equal to ``sent`` (the server used the
    ids), False when a 200 lacks them (the fields were ignored) or a 400/422 refuses them, None
    for anything else (not known: starting, overloaded, unreachable)."""
    if status in (400, 422):
        text = json.dumps(obj) if obj is not None else ""
        return False if any(f in text for f in TOKEN_FIELDS) else None
    if status != 200 or not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    return isinstance(choice.get("response_token_ids"), list) and choice.get("prompt_token_ids") == sent


async def probe_token_ids(transport, url: str, timeout: float, model: str | None = None) -> bool | None:
    """Ask an endpoint (base URL) once whether its ``/v1/chat/completions`` is token-exact: a
    one-token request with ``input_ids`` ``PROBE_IDS`` and ``"return_token_ids": true`` (see
    ``token_ids_answer``), answered within ``timeout`` seconds, over ``transport`` (a
    ``dqa.regen.wire.transport.Transport``). Never raises for server behaviour."""
    from dqa.regen.wire.transport import TransportError

    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "hi"}], "input_ids": PROBE_IDS, "return_token_ids": True,
        "max_tokens": 1, "temperature": 0.0, "stream": False,
    }  # fmt: skip
    if model:
        body["model"] = model
    try:
        status, raw = await transport.request("POST", url + OpenAIProtocol.path, json.dumps(body).encode(), timeout=timeout)
    except TransportError:
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if obj is None and status in (400, 422):
        obj = raw.decode("utf-8", "replace")
    return token_ids_answer(status, obj, PROBE_IDS)


class OpenAI(ServerKind):
    name = "openai"
    protocol = "openai"
    chat_rendered = True  # the server renders the generation prompt from messages
    # An SGLang behind the OpenAI routes has the real liveness check; other servers answer 404.
    health_paths = ("/health_generate", "/health")

    async def preflight(self, transport, url: str, name: str, facts, timeout: float) -> str | None:
        """No ``/v1/chat/completions`` (404) is the wrong protocol. Otherwise an SGLang endpoint
        gets the token-exact probe (``facts.token_ids``); another server takes the text round
        trip, unprobed; a server that did not say what it is stays unknown (its first reply decides)."""
        from dqa.regen.servers.facts import redirected, route_status

        status = await route_status(transport, url + OpenAIProtocol.path, timeout)
        if (moved := redirected(name, OpenAIProtocol.path, status)) is not None:
            return moved
        if status == 404:
            what = "an SGLang server without the OpenAI routes" if facts.kind == "sglang" else "not an OpenAI-compatible server"
            return f"{name}: this server has no /v1/chat/completions ({what}): use --protocol sglang"
        if facts.kind == "sglang":
            facts.token_ids = await probe_token_ids(transport, url, timeout)
        elif facts.kind == "openai":
            facts.token_ids = False  # not SGLang: the text round trip, no probe
        return None

    def make_protocol(self, sampling, spec, model: str) -> Protocol:
        """``POST /v1/chat/completions``: prompts are decoded with ``tokenizers``; transformers
        (seconds to import and load) is loaded only when the first reply is rendered with the chat
        template. Raises ``InputError`` when the tokenizer has no chat template, or its turns have
        no end-of-turn token to decode prompts into messages by (GLM)."""
        from dqa.errors import InputError
        from dqa.regen.jobs.prompts import ChatTokenizer

        if getattr(spec, "ends_at_next_role", False):
            raise InputError(f"{spec.tokenizer_dir}: its turns end at the next role token (GLM), which --protocol {self.protocol} "
                             "cannot decode into messages yet; use --protocol sglang (token ids)")
        tok = ChatTokenizer(spec.tokenizer_dir, lambda: spec.tokenizer)
        if not tok.chat_template:
            raise InputError(f"{spec.tokenizer_dir}: tokenizer has no chat template; --protocol {self.protocol} needs one")
        return OpenAIProtocol(sampling, tok, spec.turn_start, spec.eot, model)


KIND = OpenAI()
