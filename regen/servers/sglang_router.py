"""SGLang's router (PyPI ``sglang-router``, the "SGLang Model Gateway"; a Rust process) in front
of SGLang workers: how dqa recognises one and what it does to a ``/generate`` request (see
shared/SGLANG.md, "The SGLang router").

- Recognised by ``GET /get_server_info`` answering ``{"router_manager": true, ...}`` (its own
  object: no version, no context length); ``/server_info`` is a 404 there and its ``/v1/models``
  has no ``max_model_len``. What the workers are is asked of the workers themselves: ``GET
  /workers`` lists them (``{"workers": [{"url": ..., "is_healthy": ...}, ...]}``).
- It rewrites request bodies: unknown top-level fields and unknown ``sampling_params`` keys are
  dropped before the request reaches a worker. ``PASSED_SAMPLING_PARAMS`` are the keys 0.3.2
  passes on (observed by sending every SGLang sampling key through it to a worker that records
  bodies; ``tests/test_regen_router.py`` checks the table against the installed router), so
  run.json can say per field dqa sends whether it was ``applied`` or ``dropped``.

Nothing here does I/O; ``servers.facts.discover`` asks the router and its workers.
"""

from __future__ import annotations

from typing import Any, Iterable

RELEASE = "0.3.2"  # the sglang-router release the table below was read from

# sampling_params keys sglang-router 0.3.2 passes on to the worker on POST /generate; any other key is dropped.
PASSED_SAMPLING_PARAMS = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "no_stop_trim",
    "regex", "min_new_tokens", "n", "sampling_seed",
})  # fmt: skip

APPLIED = "applied"
DROPPED = "dropped"


def is_router(server_info: Any) -> bool:
    """Whether a ``/get_server_info`` reply is the router's own (``router_manager`` true)."""
    return isinstance(server_info, dict) and server_info.get("router_manager") is True


def worker_urls(reply: Any) -> list[str]:
    """The worker base URLs of a ``GET /workers`` reply, in its order (empty when it lists none
    or is not that shape)."""
    workers = reply.get("workers") if isinstance(reply, dict) else None
    if not isinstance(workers, list):
        return []
    urls = [w.get("url") for w in workers if isinstance(w, dict)]
    return [u.rstrip("/") for u in urls if isinstance(u, str) and u.startswith(("http://", "https://"))]


def sampling_fields(sent: Iterable[str]) -> dict[str, str]:
    """``{sampling key: "applied" | "dropped"}`` for the ``sampling_params`` keys dqa sends: whether
    the router passes each on to the worker."""
    return {k: (APPLIED if k in PASSED_SAMPLING_PARAMS else DROPPED) for k in sent}


NO_WORKERS = "no_available_workers"  # the router's 503 code: no healthy worker, or every circuit open


def says_no_workers(error: str | None) -> bool:
    """Whether an attempt's error text is the router's 503 ``no_available_workers`` (it has retried
    already; sending more only burns attempts until a worker is back)."""
    return bool(error) and NO_WORKERS in error
