"""What a ``dqa regen`` run records besides the rows: run.json and progress.json.

* ``manifest(...) -> RunManifest``: this session's run.json (``servers_info`` from the start-up
  probe, ``prior_servers_info`` for a rerun that sends nothing);
* ``open_books(...) -> Books``: run.json written, the uploader and the progress counters, with
  what earlier sessions recorded (their working time: progress.json, else the shards' times);
* ``finish(...) -> Finished``: the final progress.json and run.json, copied with every shard.
"""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dqa import atomic
from dqa.errors import InputError
from dqa.regen.config import DatasetSpec, DispatchSpec, OutputSpec
from dqa.regen.dispatch.progress import EndpointCounts, Progress, active_seconds
from dqa.regen.run_values import Books, Dispatched, Finished, Inputs, Place, Resume, Servers
from dqa.regen.store.folder import RUN_JSON, RUN_VERSION, RunFolder, RunManifest
from dqa.regen.store.shards import completion_times
from dqa.regen.store.upload import Uploader
from dqa.regen.wire.urls import strip_userinfo
from dqa.storage import url_of


def servers_info(urls: list[str], facts: dict[str, Any]) -> dict[str, Any]:
    """run.json's ``servers`` (per endpoint without credentials: what it said about itself, null when
    it was never reached) and ``seed_applied`` (true when every known server applies the per-row
    seeds, false when one does not, null when no server said)."""
    servers = {strip_userinfo(u): (facts[u].to_json() if facts.get(u) is not None else None) for u in urls}
    applied = [f.seed_applied for f in facts.values() if f is not None and f.seed_applied is not None]
    return {"servers": servers, "seed_applied": (all(applied) if applied else None)}


def prior_servers_info(folder: RunFolder, urls: list[str]) -> dict[str, Any]:
    """``servers`` and ``seed_applied`` as an earlier session of this folder recorded them (for a
    rerun that sends nothing); nulls when there is none."""
    try:
        old = RunManifest.read(folder.run_json)
    except InputError:
        old = None
    if old is not None and old.servers is not None:
        return {"servers": dict(old.servers), "seed_applied": old.seed_applied}
    return {"servers": {strip_userinfo(u): None for u in urls}, "seed_applied": None}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest(data: DatasetSpec, d: DispatchSpec, o: OutputSpec, servers: Servers, inputs: Inputs, info: dict[str, Any]) -> RunManifest:
    """The run.json of this session (no URL credentials in it): the groups' recorded parts (the
    selection's from ``inputs``), the servers and what they said about themselves (``info``)."""
    tok = data.tokenizer
    return RunManifest(
        version=RUN_VERSION,
        identity=inputs.identity,
        dataset_path=url_of(data.path),  # a local path resolved, or the URL
        findings=str(inputs.findings) if inputs.selection.failed_only else None,
        # the column overrides given (null: detected); `dqa merge` uses them when given none
        columns=data.columns,
        limit=inputs.selection.limit,
        protocol=servers.protocol,
        model=servers.model or None,
        endpoints=tuple(strip_userinfo(u) for u in servers.urls),
        max_in_flight=d.max_in_flight,
        gpus=servers.gpus,
        gpu_hour_cost=d.gpu_hour_cost,
        # resolved when it is a folder, so that `dqa merge` finds the chat format from anywhere
        tokenizer=str(Path(tok).resolve()) if tok and Path(tok).is_dir() else tok,
        mirror=tuple(strip_userinfo(m) for m in o.mirror),
        # What each server said about itself, and whether the per-row seeds reproduce outputs.
        servers=info["servers"],
        seed_applied=info["seed_applied"],
        updated_at=_now(),
    )


def open_books(run_json: RunManifest, place: Place, resume: Resume, rows: np.ndarray) -> Books:
    """Write run.json (``run_json``) and copy it to the targets (with the shards recovery rewrote);
    start the progress counters (GPUs and price: run.json's), with what earlier sessions recorded
    of ``rows``. Returns ``Books``."""
    folder = place.folder
    uploader = Uploader(place.targets)
    for p in resume.rec.rewritten:
        uploader.submit(p)
    run_json.write(folder.run_json)
    uploader.put_now(folder.run_json, RUN_JSON)
    todo, rec = resume.todo, resume.rec
    progress = Progress(total=int(rows.size), gpus=run_json.gpus, gpu_hour_cost=run_json.gpu_hour_cost)
    progress.counting = bool(todo.size)  # a rerun with nothing left to do adds no working time
    if rec.rows.size:
        progress.add_prior(*rec.tally(rows))  # this selection's rows only (a smaller --limit than before)
        prior = folder.read_progress()
        progress.prior_elapsed_s = _prior_working_time(prior, place.out)
        if not todo.size:
            _keep_endpoint_counts(progress, prior)
    return Books(run_json, progress, uploader, bool(todo.size), rec.next_seq)


def _prior_working_time(prior: dict[str, Any], out: Path) -> float:
    """Seconds earlier sessions worked: their progress.json ``elapsed_s``; without one (deleted, or
    never copied to an object store), estimated from the shards' ``completed_at`` and ``latency_s``."""
    try:
        elapsed = float(prior.get("elapsed_s") or 0.0)
    except (TypeError, ValueError):
        elapsed = 0.0
    if elapsed > 0:
        return elapsed
    done_at, latency = completion_times(out)
    if not done_at.size:
        return 0.0
    return active_seconds(done_at, latency)


def _keep_endpoint_counts(progress: Progress, prior: dict[str, Any]) -> None:
    """A rerun with nothing to do keeps the per-endpoint counts the run finished with, and its
    consecutive-turn figures (same-endpoint share, turns moved)."""
    with contextlib.suppress(TypeError, ValueError):
        n = int(prior.get("consecutive_turns") or 0)
        share = prior.get("same_endpoint_share")
        if n > 0 and share is not None:
            progress.consecutive_turns, progress.same_endpoint = n, round(float(share) * n)
        progress.turns_moved = int(prior.get("turns_moved") or 0)
    eps = prior.get("endpoints")
    if not isinstance(eps, dict):
        return
    for url, e in eps.items():
        if isinstance(e, dict):
            with contextlib.suppress(TypeError, ValueError):
                progress.endpoints[str(url)] = EndpointCounts(
                    healthy=False, done=int(e.get("done") or 0), failed=int(e.get("failed") or 0),
                    output_tokens=int(e.get("output_tokens") or 0),
                )


def finish(place: Place, urls: list[str], books: Books, done: Dispatched, log: Callable[[str], None]) -> Finished:
    """Write the final progress.json and, when rows were sent, run.json with what the servers
    (``urls``) said once they were up; copy both and every shard to the targets. Returns ``Finished``; copy errors
    are logged, not raised."""
    folder, progress, uploader = place.folder, books.progress, books.uploader
    progress.state = {"finished": "finished", "interrupted": "interrupted", "failed": "failed"}[done.state]
    snap = progress.snapshot()
    atomic.write_json(folder.progress_json, snap)
    uploader.put_now(folder.progress_json, "progress.json")
    if books.sent:  # what the servers said once they were up (some were not at start-up)
        info = servers_info(urls, {ep.url: ep.facts for ep in done.dispatcher.endpoints})
        run_json = dataclasses.replace(books.manifest, servers=info["servers"], seed_applied=info["seed_applied"], updated_at=_now())
        run_json.write(folder.run_json)
        uploader.put_now(folder.run_json, RUN_JSON)
    shards = folder.shards()
    uploader.sync(shards)
    if uploader.errors:
        log(f"could not copy {len(uploader.errors)} files: {uploader.errors[0]}")
    return Finished(snap, shards)
