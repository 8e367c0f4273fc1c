"""One HTTP request per attempt, for two protocols behind one interface.

``sglang``: ``POST /generate`` with ``input_ids`` and ``sampling_params``;
the reply's ``output_ids`` are kept as is (token-exact).

``openai``: ``POST /v1/chat/completions`` with ``messages`` decoded from the
prompt tokens and ``chat_template_kwargs: {"enable_thinking": true}``. Token-exact
where the server allows it (SGLang 0.5.23: SGLANG.md): the body also carries the
prompt as ``input_ids`` (the server then skips its chat template; ``messages`` only
give the stop tokens) and ``"return_token_ids": true``, and the reply's
``choices[0].response_token_ids`` are kept as they are, like ``/generate``'s
``output_ids`` (the stop token included), when its ``prompt_token_ids`` are the
prompt sent. Otherwise (another server, an older SGLang: unknown chat fields are
ignored there, or refused with a 400/422 naming them) the text round trip: the
reply (``reasoning_content`` + ``content``) is rendered back into tokens with the
tokenizer's chat template, and the rendered prompt part must equal the prompt
tokens; whitespace the server trimmed is lost. Which route an endpoint takes is
decided at start-up (``server_probe``: a one-token probe request) or by its first
reply, per endpoint (``OpenAIProtocol.routes``). Output token counts everywhere
are the tokens that go into the shard, not the reply's ``usage``.

A call returns an ``Outcome``; it never raises for server behaviour. The
``kind`` says what the dispatcher does next (see SGLANG.md, client rules):
``ok``/``length`` are recorded, ``retry`` is retried with backoff, ``fail`` is
recorded as a failure without retrying, ``fatal`` stops the run without recording the row:
the request itself is wrong for this server whatever the row (SGLang 0.5.22+ rejecting an
unknown ``sampling_params`` field: a dqa bug; a 404 for the generate route: the wrong
``--protocol``), so every other row would fail the same way.

Aborts follow SGLang (SGLANG.md, "Aborts"): a plain abort is an HTTP 200 whose
``finish_reason`` is ``{"type": "abort", "status_code": null}`` with partial ``output_ids``
(retried; the partial output is not kept); an abort with a status code arrives as a real HTTP
400/500/503 and is classified like any such status.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OK = "ok"
LENGTH = "length"
RETRY = "retry"
FAIL = "fail"
FATAL = "fatal"

# The two routes of the openai protocol (run.json: servers[url].openai_route).
TOKEN_EXACT = "token-exact"
TEXT = "text"
TOKEN_FIELDS = ("input_ids", "return_token_ids")  # the token-exact route's request fields

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# Statuses that say the endpoint itself is in trouble (count towards taking it out).
ENDPOINT_FAULT_STATUS = frozenset({500, 502, 503, 504})
EMPTY_IDS = np.zeros(0, dtype=np.int32)


@dataclass
class Outcome:
    """What one attempt produced.

    ``endpoint_fault`` marks failures that speak against the endpoint
    (connection refused or dropped, 5xx, read timeout) rather than the request.
    """

    kind: str
    output_ids: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    finish_reason: str = ""
    error: str | None = None
    endpoint_fault: bool = False
    refused: bool = False
    route: str = ""  # openai: TOKEN_EXACT or TEXT, the route the reply took ("" when not known)


@dataclass
class Sampling:
    """Sampling parameters sent with every request (seed is per sample)."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_new_tokens: int = 8192

    def as_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "max_new_tokens": self.max_new_tokens}


class Job:
    """One selected row on its way through the fleet."""

    __slots__ = ("row", "sample_id", "key", "prompt", "seed", "attempts", "last_endpoint", "error", "body_cache", "messages", "max_new", "rid_prefix", "prompt_text")

    def __init__(self, row: int, sample_id: str | None, prompt: np.ndarray, seed: int, error: str | None = None):
        self.row = row
        self.sample_id = sample_id
        self.key = sample_id if sample_id is not None else str(row)
        self.prompt = prompt
        self.seed = seed
        self.attempts = 0
        self.last_endpoint: str | None = None
        self.error = error  # set when the row cannot be sent at all (no assistant header)
        self.body_cache: bytes | None = None
        self.messages: list[dict] | None = None
        self.max_new = 0  # max_new_tokens of the latest attempt
        self.rid_prefix: bytes | None = None
        self.prompt_text: bytes | None = None  # the prompt ids as JSON list items, b"1,2,3" (prebuilt per batch)


def _short(text: Any, n: int = 300) -> str:
    return " ".join(str(text).split())[:n]


_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")


def error_message(body: bytes) -> str:
    """The error text of an error reply: ``{"error": "..."}`` (SGLang's schema check, a string),
    ``{"error": {"message": ...}}``, ``{"message": ...}`` or ``{"detail": ...}``; else the body."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, str):
            return err
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        for key in ("message", "detail"):
            if isinstance(obj.get(key), str):
                return obj[key]
    return body.decode("utf-8", "replace")


def unknown_field(status: int, body: bytes) -> str | None:
    """The field named by a 400 "unknown field `x`" (SGLang 0.5.22+ validates ``sampling_params``
    strictly), else None."""
    if status != 400:
        return None
    m = _UNKNOWN_FIELD.search(error_message(body))
    return m.group(1) if m else None


def classify_status(status: int, body: bytes) -> Outcome:
    """Map a non-200 HTTP status to an outcome (retry with backoff, a recorded failure, or fatal)."""
    text = _short(body.decode("utf-8", "replace"))
    err = f"HTTP {status}: {text}" if text else f"HTTP {status}"
    field_name = unknown_field(status, body)
    if field_name is not None:
        msg = _short(error_message(body), 400)
        return Outcome(FATAL, error=(
            f"BUG: the server rejects the request field `{field_name}` (HTTP 400: {msg}); dqa sent a field this "
            f"SGLang version does not accept. Please report it with the server's version; no row was recorded "
            f"for it, so rerunning the same command resumes once fixed"))
    if status == 404:
        return Outcome(FATAL, error=f"HTTP 404 for the generate route ({_short(error_message(body), 160)}): wrong --protocol, endpoint URL or --model?")
    if status in RETRY_STATUS:
        return Outcome(RETRY, error=err, endpoint_fault=status in ENDPOINT_FAULT_STATUS)
    if status == 400 and "duplicate request id" in text.lower():
        # A request of an earlier run with the same rid may still be aborting on the server.
        return Outcome(RETRY, error=err)
    return Outcome(FAIL, error=err)


def error_in_body(obj: Any) -> Outcome | None:
    """An ``{"error": ...}`` object inside a 200 reply (how SGLang streams errors) as an outcome, else None."""
    if not isinstance(obj, dict) or "error" not in obj or obj.get("choices") or obj.get("output_ids"):
        return None
    err = obj["error"]
    code = err.get("code") if isinstance(err, dict) else None
    msg = err.get("message") if isinstance(err, dict) else err
    try:
        code = int(code) if code is not None else None
    except (TypeError, ValueError):
        code = None
    kind = FAIL if code is not None and 400 <= code < 500 and code not in RETRY_STATUS else RETRY
    return Outcome(kind, error=f"error in reply{f' ({code})' if code else ''}: {_short(msg)}", endpoint_fault=kind == RETRY)


class SglangProtocol:
    """Native SGLang ``/generate`` with ``input_ids`` (token-exact)."""

    name = "sglang"
    path = "/generate"

    def __init__(self, sampling: Sampling, model: str | None = None):
        self.sampling = sampling
        self.model = model or ""
        sp = sampling.as_dict()
        sp.pop("max_new_tokens")
        self._sp_head = json.dumps(sp)[:-1].encode()  # '{"temperature": ..., "top_k": 20' (no closing brace)

    def body(self, job: Job, attempt: int, extras_off: frozenset[str], max_new: int) -> bytes:
        if job.body_cache is None:
            # The prompt's JSON is built once per sample, not once per attempt.
            text = job.prompt_text if job.prompt_text is not None else ",".join(map(str, job.prompt.tolist())).encode()
            job.body_cache = b'{"input_ids":[' + text + b'],"sampling_params":' + self._sp_head
            job.prompt_text = None
            job.rid_prefix = json.dumps(job.key + ":").encode()[:-1]  # '"key:' (JSON-escaped, open quote)
        return job.body_cache + b',"max_new_tokens":%d,"sampling_seed":%d},"rid":%s%d"}' % (max_new, job.seed, job.rid_prefix, attempt)

    def parse(self, obj: Any, job: Job) -> Outcome:
        """Read ``output_ids`` and ``meta_info.finish_reason`` (dict shapes per SGLANG.md)."""
        bad = error_in_body(obj)
        if bad is not None:
            return bad
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]
        if not isinstance(obj, dict):
            return Outcome(FAIL, error=f"reply is not a JSON object: {_short(obj, 120)}")
        meta = obj.get("meta_info") or {}
        fr = meta.get("finish_reason")
        if isinstance(fr, dict):
            ftype = str(fr.get("type", ""))
        elif isinstance(fr, str):
            ftype = fr
        else:
            return Outcome(FAIL, error="reply has no meta_info.finish_reason")
        if ftype == "abort":
            msg = fr.get("message", "") if isinstance(fr, dict) else ""
            code = fr.get("status_code") if isinstance(fr, dict) else None
            if not isinstance(code, int) or isinstance(code, bool):
                # A plain abort (HTTP 200, no status code): not the row's fault; the partial
                # output is dropped and the row is asked again.
                partial = obj.get("output_ids")
                n = len(partial) if isinstance(partial, list) else 0
                return Outcome(RETRY, finish_reason="abort", error=f"aborted by the server (HTTP 200, no status code): {_short(msg) or 'Aborted'}; {n} partial tokens dropped")
            err = f"aborted by the server ({code}): {_short(msg)}"
            if 400 <= code < 500 and code not in RETRY_STATUS:
                return Outcome(FAIL, finish_reason="abort", error=err)
            return Outcome(RETRY, finish_reason="abort", error=err, endpoint_fault=code in ENDPOINT_FAULT_STATUS)
        out = obj.get("output_ids")
        if out is None:
            return Outcome(FAIL, finish_reason=ftype, error="reply has no output_ids (SGLang too old? it needs a version that returns output_ids)")
        try:
            ids = np.asarray(out, dtype=np.int32)
        except (TypeError, ValueError, OverflowError):
            return Outcome(FAIL, finish_reason=ftype, error="output_ids are not token ids")
        if ids.ndim != 1:
            return Outcome(FAIL, finish_reason=ftype, error="output_ids are not a flat list")
        kind = LENGTH if ftype == "length" else OK
        return Outcome(kind, output_ids=ids, finish_reason=ftype)


class OpenAIProtocol:
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

    def __init__(self, sampling: Sampling, tokenizer, turn_start: int, eot: int, model: str | None = None, token_ids: bool = True):
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
        ``server_probe.preflight``): an endpoint whose ``token_ids`` is known gets that route; the
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

    def messages(self, job: Job) -> list[dict]:
        from dqa.regen.prompts import chatml_messages

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
            return Outcome(FAIL, error=f"reply has no choices[0]: {_short(obj, 120)}")
        if finish == "abort":
            return Outcome(RETRY, finish_reason="abort", error="aborted by server")
        exact = self.token_exact_ids(choice, job)
        if isinstance(exact, Outcome):
            return exact
        if exact is not None:
            kind = LENGTH if finish == "length" else OK
            return Outcome(kind, output_ids=exact, finish_reason=finish or "stop", route=TOKEN_EXACT)
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
        return Outcome(kind, output_ids=ids, finish_reason=finish or "stop", route=TEXT)

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


async def call(
    session, url: str, protocol, job: Job, attempt: int, headers: dict | None, extras_off: frozenset[str], max_new: int, timeout=None
) -> tuple[Outcome, frozenset[str]]:
    """POST one attempt to ``url`` (the endpoint's generate URL); return its outcome and the optional fields the server rejected (to drop next time).

    Never raises for HTTP or connection trouble; ``asyncio.CancelledError`` propagates.
    """
    import aiohttp

    openai = isinstance(protocol, OpenAIProtocol)
    if openai:
        extras_off = extras_off | protocol.extras_for(url)
    try:
        body = protocol.body(job, attempt, extras_off, max_new)
    except ValueError as exc:
        return Outcome(FAIL, error=f"row {job.row}: cannot build request ({exc})"), frozenset()
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
            raw = await resp.read()
            status = resp.status
    except asyncio.TimeoutError:
        return Outcome(RETRY, error="timed out waiting for the reply", endpoint_fault=True), frozenset()
    except aiohttp.ClientConnectorError as exc:
        return Outcome(RETRY, error=f"connection failed: {_short(exc, 160)}", endpoint_fault=True, refused=True), frozenset()
    except (aiohttp.ClientError, OSError) as exc:
        return Outcome(RETRY, error=f"connection error: {type(exc).__name__}: {_short(exc, 160)}", endpoint_fault=True), frozenset()
    if status != 200:
        if openai:
            rejected = protocol.rejected_extras(status, raw) - extras_off
            if rejected:
                if rejected.intersection(TOKEN_FIELDS):
                    protocol.learn(url, TEXT)  # refused: this endpoint takes the text route
                    rejected = rejected | frozenset(TOKEN_FIELDS)
                return Outcome(RETRY, error=f"HTTP {status}: server rejects {sorted(rejected)}"), rejected
        return classify_status(status, raw), frozenset()
    try:
        obj = json.loads(raw)
    except ValueError:
        return Outcome(RETRY, error=f"reply is not JSON: {_short(raw[:120])}", endpoint_fault=True), frozenset()
    outcome = protocol.parse(obj, job)
    if openai and outcome.route and not extras_off.intersection(TOKEN_FIELDS):
        protocol.learn(url, outcome.route)  # asked token-exact: the reply says whether the server is
    return outcome, frozenset()
