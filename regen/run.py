"""``regenerate(config)``: the whole ``dqa regen`` run, callable in-process (CLI, ``dqa plan --calibrate``, benchmarks).

The run is named steps in order (``_regenerate``), each in the module of its room and handed only
its group of settings; their typed values are ``run_values``':

1. ``run_view.view``: how the run shows itself (log, live display, signals on the main thread);
2. ``run_servers.resolve_servers``: the ``--endpoint``s or the fleet files, the server kind of
   the protocol; ``run_output.local_folder``: an output folder that dqa regen did not make, or one
   that cannot be written, is refused at once;
3. ``run_inputs.open_and_select``: the dataset and the selected rows (a folder made for another
   dataset or selection is refused), then ``run_inputs.load_template``: the chat format (adding the
   sampling to the run's identity);
4. ``run_output.place_output`` / ``stage_output``: lock the folder, check it was made for this run
   (an object-store ``--out`` is staged locally first); only then the kind's request protocol
   (openai loads the chat-template tokenizer: slow) and ``run_output.recover``: the folder
   repaired after any crash, and what is left;
5. ``dispatch.link.Link``: the one event loop and transport; when rows are left,
   ``dispatch.preflight.probe_servers``: every endpoint probed (reachable, the right protocol,
   context length, speculative reserve, whether seeds take effect);
6. ``run_books.manifest`` / ``open_books``: run.json recorded, the counters started;
7. ``run_dispatch.turn_jobs`` / ``dispatch``: the rows not yet recorded sent, each finished row
   journaled, the journal compacted into shards;
8. ``run_books.finish``: ``progress.json`` and the final run.json; then how it ended (``RunResult``).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from dqa.errors import EXIT_OK, EXIT_RUNTIME
from dqa.regen.config import RegenConfig
from dqa.regen.dispatch.link import Link
from dqa.regen.dispatch.preflight import probe_servers
from dqa.regen.run_books import finish, manifest, open_books, prior_servers_info, servers_info
from dqa.regen.run_dispatch import dispatch, turn_jobs
from dqa.regen.run_inputs import load_template, open_and_select, warn_thinking_off
from dqa.regen.run_output import local_folder, place_output, recover, stage_output
from dqa.regen.run_servers import resolve_servers
from dqa.regen.run_values import Books, Dispatched, Finished, View
from dqa.regen.run_view import view
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

    With ``install_signal_handlers`` (the CLI) on the main thread (``run_view.view``'s
    ``signals``), dispatch drains on the first SIGINT/SIGTERM and cancels on the second, and
    signals after dispatch are ignored so the final flush is never cut short; the process's
    earlier handlers come back on return.
    """
    show = view(config)
    if not show.signals:
        return _regenerate(config, show)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _regenerate(config, show)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _regenerate(config: RegenConfig, show: View) -> RunResult:
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
    servers = resolve_servers(c.dispatch)
    local = local_folder(c.output)
    if local is not None:  # a bad --out is refused before any input is read or any tokenizer loaded
        local.check_usable()
    inputs = open_and_select(c.data, c.selection)
    warn_thinking_off(inputs, show.log)
    if local is not None:  # a folder made for another dataset or selection: refused before the template is read
        local.check_identity(inputs.identity, ("dataset", "selection"))
    spec = load_template(c.data, c.sampling, inputs, servers.kind)
    place = place_output(c.output, c.selection.shard_pair)
    if local is not None:
        local.check_identity(inputs.identity)  # before the lock file, so a refused folder stays untouched
    with place.folder.lock():
        stage_output(place, inputs.identity, show.log)
        # Every input and the folder are checked: now the kind's protocol (openai: the slow chat-template tokenizer).
        protocol = servers.kind.make_protocol(c.sampling, spec, servers.model)
        resume = recover(place.out, inputs.rows, c.selection.retry_failed, show.log)
        info = prior_servers_info(place.folder, servers.urls)  # a rerun with nothing to do keeps them
        link = Link(c.dispatch, servers, protocol, show.signals)  # from here on, every request goes over one session
        try:
            if resume.todo.size:
                info = servers_info(servers.urls, probe_servers(c.dispatch.timeouts, link, show.log))
            run_json = manifest(c.data, c.dispatch, c.output, servers, inputs, info)
            books = open_books(run_json, place, resume, inputs.rows)
            jobs = turn_jobs(c.selection, c.sampling.seed_base, inputs, resume, servers.kind)
            done = dispatch(c.dispatch, c.output, place, link, jobs, books, show)
        finally:
            link.close()
        finished = finish(place, servers.urls, books, done, show.log)
    return _result(place.url, done, books, finished)


def _result(out_url: str, done: Dispatched, books: Books, finished: Finished) -> RunResult:
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
