"""What dqa knows about SGLang, release by release (docs/sglang.md, "Behaviour by
release", read from the released source, 0.5.4 to 0.5.23).

Two sides use it: ``dqa regen`` reads a running server's ``/server_info`` (``ServerFacts`` in
``servers.facts``) to cap each request's ``max_new_tokens`` the way that server checks lengths and
to know whether ``sampling_seed`` takes effect; ``dqa fleet up`` picks the launch flags that exist
in the SGLang version installed on the GPU node.

- Length check: SGLang adds a speculative reserve of ``max(num_steps x eagle_topk,
  num_draft_tokens)`` tokens to the prompt before comparing prompt + ``max_new_tokens`` with the
  context length; over the limit is a 400. 0.5.4 compares with ``>=`` (equal is already over),
  later releases with ``>``.
- Seeds: ``sampling_seed`` takes effect only with ``--enable-deterministic-inference``.
- Hybrid Mamba models with speculative decoding: ``--mamba-scheduler-strategy extra_buffer`` up to
  0.5.13; from 0.5.14 the flag is ``--mamba-radix-cache-strategy`` (the old name a deprecated alias
  through 0.5.17); from 0.5.20 the old name is gone (exit 2, unrecognized argument) and the default
  ``auto`` already picks ``extra_buffer``, so nothing is passed.
"""

from __future__ import annotations

import functools
import re
from typing import Any

# The newest release docs/sglang.md describes: what `fleet up` assumes when it cannot ask the node.
NEWEST_KNOWN = "0.5.23"
# Equal is already over the context length up to this release (docs/sglang.md: 0.5.4 compares with >=).
LAST_INCLUSIVE_LENGTH_CHECK = (0, 5, 4)
# Tokens kept free on top of the speculative reserve while speculative decoding is on: newer
# releases reserve for the largest draft-token count an adaptive algorithm may switch to.
SPECULATIVE_MARGIN = 4
# Speculative algorithms whose draft tokens use output slots (NEXTN is rewritten to EAGLE).
_RESERVING = ("EAGLE", "EAGLE3", "NEXTN", "MTP", "FROZEN_KV_MTP")

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: Any) -> tuple[int, int, int] | None:
    """``"0.5.4.post3"`` -> ``(0, 5, 4)``; ``"v0.5.23rc1"`` -> ``(0, 5, 23)``; None when ``text`` holds
    no version (parsed defensively: the format of ``version`` drifts between releases)."""
    if not isinstance(text, str):
        return None
    return _parse_version_text(text)


@functools.lru_cache(maxsize=64)
def _parse_version_text(text: str) -> tuple[int, int, int] | None:
    # cached: the dispatcher asks for each request's output cap, always with the same few versions
    m = _VERSION.search(text)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def inclusive_length_check(version: tuple[int, int, int] | None) -> bool:
    """True when prompt + ``max_new_tokens`` equal to the context length is already a 400: 0.5.4
    and older, and a server that does not say its version (assumed the strict way)."""
    return version is None or version <= LAST_INCLUSIVE_LENGTH_CHECK


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def speculative_reserve(info: dict[str, Any]) -> int:
    """Tokens SGLang adds to the prompt length before its length check (``/server_info`` fields
    ``speculative_algorithm``, ``speculative_num_steps``, ``speculative_eagle_topk``,
    ``speculative_num_draft_tokens``, and ``max_speculative_num_draft_tokens`` where a release
    has it); 0 without speculative decoding."""
    algo = info.get("speculative_algorithm")
    if not algo or str(algo).upper() in ("NONE", "NULL"):
        return 0
    name = str(algo).upper()
    steps = _int(info.get("speculative_num_steps")) or 0
    topk = _int(info.get("speculative_eagle_topk")) or 1
    drafts = max(_int(info.get("speculative_num_draft_tokens")) or 0, _int(info.get("max_speculative_num_draft_tokens")) or 0)
    if not any(name == r or name.startswith(r) for r in _RESERVING) and not (steps or drafts):
        return 0
    return max(steps * topk, drafts)


def deterministic_inference(info: dict[str, Any]) -> bool:
    """Whether the server runs with ``--enable-deterministic-inference`` (only then does
    ``sampling_seed`` take effect). A ``/server_info`` without the field: off."""
    return info.get("enable_deterministic_inference") is True


def output_cap(context_length: int, prompt_len: int, reserve: int, inclusive: bool) -> int:
    """The largest ``max_new_tokens`` such a server accepts for a prompt of ``prompt_len`` tokens:
    context - prompt - reserve, one less where equal is already over, and ``SPECULATIVE_MARGIN``
    less with speculative decoding on. May be < 1 (the prompt leaves no room)."""
    n = context_length - prompt_len - reserve
    if inclusive:
        n -= 1
    if reserve:
        n -= SPECULATIVE_MARGIN
    return n


# ------------------------------------------------------------------------------ launch flags


def mamba_extra_buffer_flags(version: tuple[int, int, int] | None) -> list[str]:
    """The flags that select the ``extra_buffer`` Mamba cache strategy on that release (hybrid Mamba
    models with speculative decoding); ``version`` None: the newest known release."""
    v = version or parse_version(NEWEST_KNOWN)
    if v >= (0, 5, 20):
        return []  # the flag is gone; the default `auto` picks extra_buffer
    if v >= (0, 5, 14):
        return ["--mamba-radix-cache-strategy", "extra_buffer"]  # the new name; the old one is a deprecated alias
    return ["--mamba-scheduler-strategy", "extra_buffer"]


MAMBA_STRATEGY_FLAGS = ("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy")
