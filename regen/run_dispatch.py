"""The dispatch step of a ``dqa regen`` run, and the jobs it sends:

* ``turn_jobs(Selection, seed_base, Inputs, Resume, kind)``: the jobs of the rows not yet
  recorded, each at its first pending turn;
* ``dispatch(DispatchSpec, OutputSpec, Place, Link, jobs, Books, View) -> Dispatched``: the jobs
  sent over the run's ``dispatch.link.Link``, each finished turn journaled, with signal handlers,
  progress.json rewrites and the live display (``dqa.reports.regen_live``) while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Iterator

from dqa import atomic
from dqa.errors import InputError, RuntimeFailure
from dqa.regen.config import DispatchSpec, OutputSpec, Selection
from dqa.regen.dispatch.link import Link
from dqa.regen.dispatch.progress import Progress
from dqa.regen.dispatch.scheduler import Dispatcher
from dqa.regen.jobs.rows import read_first_turns
from dqa.regen.jobs.turns import iter_turn_jobs
from dqa.regen.run_values import Books, Dispatched, Inputs, Place, Resume, View
from dqa.regen.servers import ServerKind
from dqa.regen.store.journal import Journal


def turn_jobs(sel: Selection, seed_base: int, inputs: Inputs, resume: Resume, kind: ServerKind) -> Iterator:
    """The jobs of the rows not yet recorded, each at its first pending turn (``iter_turn_jobs``,
    lazy): a chat-rendering kind's server renders the generation prompt from messages, so its
    prompts end at the assistant header."""
    first_flagged = read_first_turns(inputs.findings, resume.todo) if sel.failed_only and sel.turns == "flagged" else None
    spec = inputs.spec
    gen = tuple(spec.assistant_header) if kind.chat_rendered else None
    return iter_turn_jobs(inputs.ds, resume.todo, spec, sel.turns, first_flagged, resume.partial, seed_base, generation_prompt=gen)


def dispatch(d: DispatchSpec, o: OutputSpec, place: Place, link: Link, jobs: Iterator, books: Books, show: View) -> Dispatched:
    """Send ``jobs`` over ``link``, journaling each finished turn in ``place``, until done,
    interrupted or the fleet is down; the journal is compacted into shards on return. Returns
    ``Dispatched``; raises ``RuntimeFailure`` when the journal cannot be written, and the
    ``InputError`` of a request every server rejects."""
    out, progress = place.out, books.progress
    journal = Journal(out, place.shard_tag, books.next_seq, o.shard_rows, o.shard_seconds, o.commit_interval,
                      on_shard=books.uploader.submit)
    journal.start()

    def journal_error() -> str | None:
        if journal.error is not None:
            return f"{out}: writing the journal failed ({journal.error}); rerun the same command to resume"
        return None

    s = link.servers
    dispatcher = Dispatcher(
        s.urls, link.protocol, jobs, journal.append, progress, link.settings,
        headers=s.headers, model=s.model, log=show.log, check=journal_error, facts=link.facts, transport=link.transport,
    )
    try:
        state = link.run(_drive(dispatcher, progress, out, o.progress_interval, show))
    finally:
        journal_exc = None
        try:
            journal.close()
        except BaseException as exc:  # disk full etc.
            journal_exc = exc
    if journal_exc is not None:
        raise RuntimeFailure(f"{out}: writing results failed ({journal_exc}); rerun the same command to resume")
    if isinstance(dispatcher.fatal_exc, InputError):
        raise dispatcher.fatal_exc
    return Dispatched(state, dispatcher)


async def _drive(dispatcher: Dispatcher, progress: Progress, out: Path, interval: float, show: View) -> str:
    """Run the dispatcher with signal handlers, progress.json rewrites (every ``interval`` s) and
    the live display."""
    loop = asyncio.get_running_loop()
    installed = []
    if show.signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, dispatcher.request_stop)
                installed.append(sig)
    display = None
    if show.live:
        from dqa.reports.regen_live import LiveProgress

        display = LiveProgress(progress.snapshot)

    async def report() -> None:
        last_write = 0.0
        while True:
            await asyncio.sleep(0.5 if display else interval)
            snap = progress.snapshot()
            if display:
                display.update(snap)
            now = time.monotonic()
            if now - last_write >= interval:
                last_write = now
                await asyncio.to_thread(atomic.write_json, out / "progress.json", snap)
                if show.on_progress is not None:
                    await asyncio.to_thread(show.on_progress, snap)

    reporter = loop.create_task(report())
    try:
        state = await dispatcher.run()
        progress.stop()  # working time ends here; the final flush and uploads are not work
        progress.state = state
        return state
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        for sig in installed:
            loop.remove_signal_handler(sig)
            # remove_signal_handler restores SIGINT's KeyboardInterrupt and SIGTERM's default action:
            # either would cut the journal's final compaction short. The run is stopping anyway.
            signal.signal(sig, signal.SIG_IGN)
        if display:
            display.stop()
