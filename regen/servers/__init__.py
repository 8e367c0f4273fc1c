"""One module per server kind, behind one registry: ``KINDS``.

- ``sglang`` (``servers/sglang.py``): ``POST /generate``, token-exact; ``/health_generate``;
  launched as ``python -m sglang.launch_server``; `fleet status` reads ``/metrics`` or the log.
  What differs between SGLang releases (length check, launch flags) is ``sglang_releases``.
- ``openai`` (``servers/openai.py``): ``POST /v1/chat/completions`` (token-exact where the server
  allows it, else rendered back into tokens); ``/health_generate``, else ``/health``; any
  OpenAI-compatible server, not launched by dqa.
- ``transformers`` (``servers/transformers.py``): ``transformers serve``, the CPU stand-in; the
  ``openai`` protocol; ``/health``; no metrics.

``KINDS[name]`` is a ``base.ServerKind``; ``ENGINES`` are the kinds `dqa fleet up --engine` can
launch, ``PROTOCOLS`` the request protocols (`dqa regen --protocol`, the fleet file's
``protocol``; the choice list lives with the defaults in ``dqa.regen.config``, checked against ``KINDS`` here). ``protocol_kind(name)`` is the kind that speaks a protocol: `dqa regen` asks it for its request protocol (``make_protocol``) and what that protocol needs (``chat_rendered``), so no kind name is spelled outside this package and the defaults. ``facts`` is what a server says
about itself; ``replies`` reads SGLang's error shapes into outcomes (``Protocol.classify``);
``sglang_router`` is what dqa knows of SGLang's router (detection, the sampling fields it drops,
its ``no_available_workers``, its metrics), asked through ``facts.ServerFacts`` so that nothing
outside this package branches on it. Adding a kind: its module (a ``ServerKind`` named ``KIND``, its ``Protocol`` if it
has its own) and its name in the line below. Importing this package imports numpy (the
protocols), not aiohttp; `dqa --help` imports neither.
"""

from __future__ import annotations

from dqa.errors import UsageError
from dqa.regen.config import PROTOCOLS

from . import openai, sglang, transformers
from .base import Protocol, ServerKind

KINDS: dict[str, ServerKind] = {m.KIND.name: m.KIND for m in (sglang, openai, transformers)}
ENGINES = tuple(name for name, k in KINDS.items() if k.launchable)  # ("sglang", "transformers")
assert PROTOCOLS == tuple(name for name, k in KINDS.items() if k.protocol == name), "config.PROTOCOLS names the kinds' protocols"



def protocol_kind(name: str) -> ServerKind:
    """The kind whose request protocol is ``name`` (``--protocol``, a fleet file's ``protocol``):
    it makes the run's ``Protocol`` and says what the protocol needs. Raises ``UsageError`` for a
    name that is not one of ``PROTOCOLS``."""
    kind = KINDS.get(name)
    if kind is None or kind.protocol != name:
        raise UsageError(f"--protocol {name!r}: expected {' or '.join(PROTOCOLS)}")
    return kind


__all__ = ["ENGINES", "KINDS", "PROTOCOLS", "Protocol", "ServerKind", "protocol_kind"]
