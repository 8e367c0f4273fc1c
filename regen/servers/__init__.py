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
``protocol``): both read off ``KINDS``, the only list of kinds. ``facts`` is what a server says
about itself. Adding a kind: its module (a ``ServerKind`` named ``KIND``, its ``Protocol`` if it
has its own) and its name in the line below. Importing this package imports numpy (the
protocols), not aiohttp; `dqa --help` imports neither.
"""

from __future__ import annotations

from . import openai, sglang, transformers
from .base import Protocol, ServerKind

KINDS: dict[str, ServerKind] = {m.KIND.name: m.KIND for m in (sglang, openai, transformers)}
ENGINES = tuple(name for name, k in KINDS.items() if k.launchable)  # ("sglang", "transformers")
PROTOCOLS = tuple(name for name, k in KINDS.items() if k.protocol == name)  # ("sglang", "openai")

__all__ = ["ENGINES", "KINDS", "PROTOCOLS", "Protocol", "ServerKind"]
