"""One module per server kind, behind one registry.

- ``sglang`` (``servers/sglang.py``): ``POST /generate``, token-exact; ``/health_generate``;
  launched as ``python -m sglang.launch_server``; `fleet status` reads ``/metrics`` or the log.
- ``openai`` (``servers/openai.py``): ``POST /v1/chat/completions`` (token-exact where the server
  allows it, else rendered back into tokens); ``/health_generate``, else ``/health``; any
  OpenAI-compatible server, not launched by dqa.
- ``transformers`` (``servers/transformers.py``): ``transformers serve``, the CPU stand-in; the
  ``openai`` protocol; ``/health``; no metrics.

``KINDS[name]`` is a ``base.ServerKind``; ``ENGINES`` are the kinds `dqa fleet up --engine` can
launch, ``PROTOCOLS`` the request protocols (`dqa regen --protocol`, the fleet file's
``protocol``); ``protocol_kind(name)`` the kind that speaks a protocol, which `dqa regen` asks for
its request protocol (``make_protocol``) and what that protocol needs (``chat_rendered``), so no
kind name is spelled outside this package and the defaults. Importing this package imports numpy (the protocols); `dqa --help` does not.
"""

from __future__ import annotations

from dqa.errors import UsageError

from .base import Protocol, ServerKind
from .openai import KIND as _OPENAI
from .sglang import KIND as _SGLANG
from .transformers import KIND as _TRANSFORMERS

KINDS: dict[str, ServerKind] = {k.name: k for k in (_SGLANG, _OPENAI, _TRANSFORMERS)}
ENGINES = tuple(name for name, k in KINDS.items() if k.launchable)  # ("sglang", "transformers")
PROTOCOLS = tuple(name for name, k in KINDS.items() if k.protocol == name)  # ("sglang", "openai")



def protocol_kind(name: str) -> ServerKind:
    """The kind whose request protocol is ``name`` (``--protocol``, a fleet file's ``protocol``):
    it makes the run's ``Protocol`` and says what the protocol needs. Raises ``UsageError`` for a
    name that is not one of ``PROTOCOLS``."""
    kind = KINDS.get(name)
    if kind is None or kind.protocol != name:
        raise UsageError(f"--protocol {name!r}: expected {' or '.join(PROTOCOLS)}")
    return kind


__all__ = ["ENGINES", "KINDS", "PROTOCOLS", "Protocol", "ServerKind", "protocol_kind"]
