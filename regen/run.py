"""``regenerate(config)``: the whole ``dqa regen`` run, callable in-process (CLI, ``dqa plan --calibrate``, benchmarks).

The run is named steps in order (``_regenerate``; the steps and their typed values are in
``dqa.regen.run_steps``), each handed only its group of settings: resolve the servers (the
``--endpoint``s or the fleet file, and the server kind of the protocol); refuse an output folder
that dqa regen did not make, or one that cannot be written, at once; open the dataset and select
rows, refuse a folder made for another dataset or selection, open the template (adding the
sampling to the run's identity); lock the folder, check it was made for this sampling (an
object-store ``--out`` is staged locally first), and only then make the kind's request protocol
(the openai protocol loads the chat-template tokenizer: slow) and recover the folder after any
crash; open the one event loop and transport and, when rows are left, probe every endpoint
(reachable, the right protocol, context length, speculative reserve, whether seeds take effect);
record the run (run.json) and start the counters; dispatch the rows not yet recorded, journaling
each finished row, and compact the journal into shards; write ``progress.json`` and the final
run.json; say how it ended (``RunResult``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

from dqa.errors import EXIT_OK, EXIT_RUNTIME
from dqa.regen import run_steps as step
from dqa.regen.config import RegenConfig
from dqa.regen.store.folder import RunFolder
from dqa.regen.store.upload import is_url, local_path
from dqa.regen.wire.urls import strip_userinfo


@dataclass
class RunResult:
    """How a run ended: ``exit_code`` 0 (all selected rows recorded) or 3 (interrupted, fleet down,
    a request every server rejects, or every request of this run failed). ``out`` and ``message``
    carry no URL credentials."""

    exit_code: int
    state: str
    progress: dict[str, Any]
    out: str
    message: str = ""
    shards: list[str] = field(default_factory=list)


def regenerate(config: RegenConfig) -> RunResult:
    """Run (or resume) a regeneration and return how it ended (see ``_regenerate`` for what it raises).

    With ``install_signal_handlers`` (the CLI), dispatch drains on the first SIGINT/SIGTERM
    and cancels on the second, and signals after dispatch are ignored so the final flush is
    never cut short; the process's earlier handlers come back on return.
    """
    if not (config.install_signal_handlers and threading.current_thread() is threading.main_thread()):
        return _regenerate(config)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _regenerate(config)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _regenerate(config: RegenConfig) -> RunResult:
    """Run (or resume) a regeneration and return how it ended.

    Raises ``InputError``/``UsageError`` (exit 2) for bad options, inputs, an
    output folder made for another run, or an endpoint that does not speak the
    protocol; ``RuntimeFailure`` (exit 3) when no endpoint answers at start-up or
    shards cannot be copied to ``--out``/``--mirror`` URLs. An interrupted run, a
    fleet down past the deadline, a request the servers reject whatever the row
    (a dqa bug) and a run whose every request failed are not raised:
    ``RunResult.exit_code`` is 3.
    """
    c = config
    show = step.view(c)
    servers = step.resolve_servers(c.dispatch)
    local = None if is_url(c.output.out) else RunFolder(local_path(c.output.out))
    if local is not None:  # a bad --out is refused before any input is read or any tokenizer loaded
        local.check_usable()
    inputs = step.open_and_select(c.data, c.selection)
    step.warn_thinking_off(inputs, show.log)
    if local is not None:  # a folder made for another dataset or selection: refused before the template is read
        local.check_identity(inputs.identity, ("dataset", "selection"))
    spec = step.load_template(c.data, c.sampling, inputs, servers.kind)
    place = step.place_output(c.output, c.selection.shard_pair)
    if local is not None:
        local.check_identity(inputs.identity)  # before the lock file, so a refused folder stays untouched
    with place.folder.lock():
        step.stage_output(place, inputs.identity, show.log)
        # Every input and the folder are checked: now the kind's protocol (openai: the slow chat-template tokenizer).
        protocol = servers.kind.make_protocol(c.sampling, spec, servers.model)
        resume = step.recover(place.out, inputs.rows, c.selection.retry_failed, show.log)
        info = step.prior_servers_info(place.folder, servers.urls)  # a rerun with nothing to do keeps them
        link = step.Link(c.dispatch, servers, protocol)  # from here on, every request goes over one session
        with contextlib.closing(link):
            if resume.todo.size:
                info = step.servers_info(servers.urls, step.probe_servers(c.dispatch.timeouts, link, show.log))
            run_json = step.manifest(c.data, c.dispatch, c.output, servers, inputs, info)
            books = step.open_books(run_json, place, resume, inputs.rows)
            jobs = step.turn_jobs(c.selection, c.sampling.seed_base, inputs, resume, servers.kind)
            done = step.dispatch(c.dispatch, c.output, place, link, jobs, books, show)
        finished = step.finish(place, link, books, done, show.log)
    return _result(place.url, done, books, finished)


def _result(out_url: str, done: step.Dispatched, books: step.Books, finished: step.Finished) -> RunResult:
    """How the run ended: exit 0 when finished, 3 when every request of this session failed (the
    fleet or the options are wrong, not the rows), interrupted, or stopped."""
    state, dispatcher, snap = done.state, done.dispatcher, finished.snap
    out, files = strip_userinfo(out_url), [str(p) for p in finished.shards]
    if state == "finished" and dispatcher.request_failures and not dispatcher.answered:
        msg = (f"every request of this run failed ({dispatcher.request_failures} rows recorded as failed; last: "
               f"{dispatcher.last_failure[:300]}); fix the cause and rerun with --retry-failed")
        return RunResult(EXIT_RUNTIME, "finished", snap, out, strip_userinfo(msg), files)
    if state == "finished":
        return RunResult(EXIT_OK, "finished", snap, out, "", files)
    msg = dispatcher.fatal or f"interrupted with {snap['total'] - snap['done']} rows left; rerun the same command to resume"
    return RunResult(EXIT_RUNTIME, books.progress.state, snap, out, strip_userinfo(msg), files)
