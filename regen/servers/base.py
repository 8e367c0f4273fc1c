"""The two extension points every server kind fills in: its request ``Protocol`` and its ``ServerKind``.

A ``Protocol`` turns one ``Job`` attempt into a request body and a reply into an ``Outcome``
(``dqa.regen.wire.call.call`` does the HTTP around it, the same for every kind). A ``ServerKind``
says the rest: which protocol its servers speak, where their health is read, how `dqa fleet up`
launches one, and what `dqa fleet status` can read from it. One module per kind implements both
(``servers/sglang.py``, ``servers/openai.py``, ``servers/transformers.py``); the registry is
``dqa.regen.servers.KINDS``.

A kind that `dqa fleet up` launches also owns the options only its servers have: an
``EngineOptions`` subclass in its module (``servers.sglang.SglangOptions``: MTP, the Mamba cache
strategy, the SGLang release, deterministic inference), named by ``ServerKind.options``. A
``fleet.spec.FleetSpec`` carries them as ``engine_options``; ``fleet/`` never reads their fields.

Nothing here imports numpy, aiohttp or the kind modules at load (``Protocol.classify`` imports
``servers.replies``, and with it numpy, when it is first asked): a kind is added by writing its
module and listing it in ``servers/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dqa.errors import UsageError


class Protocol:
    """How a kind's servers are asked for one completion (``POST path``).

    ``body`` builds the request of one attempt; ``parse`` reads a 200 reply into an ``Outcome``
    and ``classify`` any other status; neither raises for server behaviour. The hooks let a
    protocol adapt per endpoint; they do
    nothing here: ``use_facts`` takes what the start-up probe found, ``extras_for`` names
    optional fields not to send to that endpoint, ``rejected`` reads an error reply that refuses
    optional fields (the fields to drop and ask again without; empty: an ordinary error),
    ``replied`` sees every parsed reply.
    """

    name = ""
    path = ""
    # The sampling_params keys every request carries (what run.json's router sampling_fields judge).
    sampling_keys: tuple[str, ...] = ()

    def body(self, job, attempt: int, extras_off: frozenset[str], max_new: int) -> bytes:
        raise NotImplementedError

    def parse(self, obj: Any, job):
        raise NotImplementedError

    def use_facts(self, facts: dict[str, Any]) -> None:
        """Take what the start-up probe found (``{base URL: ServerFacts | None}``)."""

    def extras_for(self, url: str) -> frozenset[str]:
        """Optional fields not to send to ``url`` (the endpoint's generate URL)."""
        return frozenset()

    def rejected(self, url: str, status: int, body: bytes, extras_off: frozenset[str]) -> frozenset[str]:
        """The optional fields a non-200 reply from ``url`` refuses, to drop from then on (empty:
        the reply is an ordinary error, classified by its status)."""
        return frozenset()

    def replied(self, url: str, outcome, extras_off: frozenset[str]) -> None:
        """Called with the parsed ``outcome`` of every 200 reply from ``url``."""

    def classify(self, status: int, body: bytes):
        """The ``wire.outcome.Outcome`` of a non-200 reply whose fields were not refused
        (``rejected`` was empty): retried, a recorded failure or fatal, read from SGLang's error
        shapes (``servers.replies.classify_status``; every kind here speaks through SGLang or an
        OpenAI-compatible server answering the same way). Never raises."""
        from dqa.regen.servers.replies import classify_status  # numpy: not at this module's import

        return classify_status(status, body)


@dataclass(frozen=True)
class EngineOptions:
    """The `dqa fleet up` options one server kind has and the others do not (this base: none).

    A kind's subclass (a frozen dataclass, one field per option) lives in its module and is named
    by its ``ServerKind.options``; ``fleet.spec.FleetSpec.engine_options`` holds one. Values are
    checked when the launch is prepared, not when the object is made (``check``).
    """

    def check(self) -> None:
        """Raise ``UsageError`` for a value these options cannot take (here: none)."""

    def refuse_for(self, engine: str) -> None:
        """Raise ``UsageError`` when an option is given that changes what runs but ``--engine
        engine`` (another kind) has no use for; options that only refine these (a release number,
        say) are let through, and dropped. Here: none."""


class ServerKind:
    """One kind of model server: what dqa knows about it apart from the request itself.

    ``protocol``: the name of the request protocol its servers speak (a kind that has one of its
    own names itself; ``dqa regen`` asks that kind for its ``make_protocol``). ``chat_rendered``:
    the server renders the prompt from chat messages with its own template, so the prompt sent
    ends at the assistant header and replies are rendered back into tokens with the tokenizer
    (``--tokenizer`` must be a folder); otherwise the prompt tokens go as they are, the
    generation prompt past the header included. ``health_paths``: where its health is read, best first; a 404 moves on to
    the next (the first is what `dqa fleet up` waits on). ``launchable``: `dqa fleet up --engine`
    can start it (``launch_argv``); ``options``: its ``EngineOptions`` class. ``status`` fills in
    what `dqa fleet status` can read besides up/down. ``no_router``: why sglang-router cannot
    front its servers (`dqa fleet up --router` refuses with it before anything starts); None: it can.
    """

    name = ""
    protocol = ""
    chat_rendered = False
    health_paths: tuple[str, ...] = ("/health",)
    launchable = False
    options: type[EngineOptions] = EngineOptions
    no_metrics = "this server kind reports no metrics"
    no_router: str | None = None

    def __repr__(self) -> str:
        return f"<server kind {self.name}>"

    # ------------------------------------------------------------------ dqa regen

    async def preflight(self, transport, url: str, name: str, facts, timeout: float) -> str | None:
        """Start-up checks of one reachable endpoint (base ``url``; ``name`` without credentials)
        for ``dqa regen --protocol`` this kind, after ``facts.discover`` found ``facts``
        (a ``ServerFacts``, updated in place), with requests over ``transport`` (a
        ``dqa.regen.wire.transport.Transport``) answered within ``timeout`` seconds: the usage error
        when the server does not speak this protocol, else None. Here: nothing to check."""
        return None

    def make_protocol(self, sampling, spec, model: str) -> Protocol:
        """The request ``Protocol`` of this kind's protocol for a run: ``sampling`` (a
        ``config.SamplingSpec``) on every request, ``spec`` the chat format (a
        ``TemplateSpec``), ``model`` the name to send. Raises ``InputError`` when the chat
        format cannot serve it."""
        raise NotImplementedError(f"{self.name}: speaks the {self.protocol} protocol; ask that kind")

    # ------------------------------------------------------------------ fleet up

    def launch_options(self, given: EngineOptions | None) -> EngineOptions:
        """The engine options of a launch with this kind: ``given`` when they are this kind's
        (checked), this kind's defaults for None, and for another kind's options their own check,
        then their ``refuse_for`` this kind, then this kind's defaults. Raises ``UsageError``."""
        if given is None:
            return self.options()
        given.check()
        if isinstance(given, self.options):
            return given
        given.refuse_for(self.name)
        return self.options()

    def missing_model_notes(self, spec) -> list[str]:
        """What a dry run without the model folder decides without it, besides the folder itself
        (``spec``: the checked ``fleet.spec.FleetSpec``)."""
        return []

    def prepare(self, spec, model_dir, notes: list[str]) -> EngineOptions:
        """Settle what the launch command depends on before the commands are built: returns
        ``spec.engine_options`` (this kind's; ``spec`` the checked ``fleet.spec.FleetSpec``) with
        what was found filled in. ``model_dir``: the model folder on this machine to read (its
        source, not the staged copy), None when it is not here; ``notes`` get what was assumed."""
        return spec.engine_options

    def launch_argv(self, spec, port: int) -> list[str]:
        """The argument list of one server of ``spec`` listening on ``port``."""
        raise UsageError(f"--engine {self.name!r}: dqa cannot launch this server kind")

    # ------------------------------------------------------------------ fleet status

    def status(self, fleet, ep, st, timeout: float) -> None:
        """Fill in ``st`` (a ``fleet.status.EndpointStatus`` whose ``up`` is known) with the
        figures the server reports; here: none, and the note says so."""
        st.note = f"metrics unavailable ({self.no_metrics})"
