"""The steps of a ``dqa regen`` run (``dqa.regen.run.regenerate`` calls them in order), each handed
only its group of settings and returning a typed value:

* ``resolve_servers(DispatchSpec) -> Servers``: the endpoints or the fleet file, the server kind
  of the protocol, the key, the GPU count;
* ``open_and_select(DatasetSpec, Selection) -> Inputs``: the dataset, the selected rows and the
  run's identity (``warn_thinking_off`` reads the scan's summary);
* ``load_template(DatasetSpec, SamplingSpec, Inputs, kind) -> TemplateSpec``: the chat format;
  adds the identity's sampling part;
* ``place_output(OutputSpec, shard) -> Place`` and ``stage_output``: the local folder (an
  object-store ``--out`` staged in one), the copy targets, the shard tag;
* ``recover(folder, rows, retry_failed) -> Resume``: the folder repaired after any crash and what
  is left;
* ``Link(DispatchSpec, Servers, protocol)``: the one event loop and transport;
  ``probe_servers(Timeouts, Link)`` the start-up facts;
* ``open_books(...) -> Books``: run.json written, the uploader and the progress counters;
* ``turn_jobs(Selection, seed_base, Inputs, Resume, kind)``: the jobs to send;
* ``dispatch(DispatchSpec, OutputSpec, Place, Link, jobs, Books, View) -> Dispatched``;
* ``finish(Place, Link, Books, Dispatched, log) -> Finished``: the final progress.json and run.json.

What depends on the server kind is asked of it (``dqa.regen.servers.protocol_kind``): no kind name
is spelled here. Run-folder policy (lock, identity) is ``RunFolder``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from dqa import atomic
from dqa.errors import InputError, UsageError
from dqa.regen.config import DEFAULT_PROTOCOL, DatasetSpec, DispatchSpec, OutputSpec, RegenConfig, SamplingSpec, Selection, Timeouts
from dqa.regen.dispatch.scheduler import DispatchSettings, Dispatcher, open_transport
from dqa.regen.store.journal import Journal, Recovery, partial_outputs
from dqa.regen.store.journal import recover as recover_folder
from dqa.regen.dispatch.progress import Progress, render
from dqa.regen.store.folder import RUN_JSON, RUN_VERSION, RunFolder, RunManifest
from dqa.regen.store.shards import list_shards
from dqa.regen.jobs.rows import check_findings_for, findings_for, narrow, read_first_turns, selected_rows, selection_digest
from dqa.regen.jobs.turns import iter_turn_jobs
from dqa.regen.servers import Protocol, ServerKind, protocol_kind
from dqa.regen.store.upload import Target, Uploader, is_url, local_path, pull_shards, stage_dir
from dqa.storage import url_of
from dqa.regen.wire.urls import strip_userinfo

# ------------------------------------------------------------------------------------ the values


@dataclass(frozen=True)
class View:
    """How the run shows itself: ``log`` (one-line events, URL credentials removed), ``live`` (the
    live display), ``signals`` (drain on the first SIGINT/SIGTERM: the CLI, on the main thread) and
    ``on_progress`` (called with each progress.json snapshot as it is written; ``--report-to``)."""

    log: Callable[[str], None]
    live: bool
    signals: bool
    on_progress: Callable[[dict[str, Any]], None] | None = None


@dataclass(frozen=True)
class Servers:
    """The servers a run talks to, resolved from ``--endpoint``/``--fleet``: ``urls`` (deduplicated,
    no trailing slash), ``kind`` (the server kind of the request protocol), ``model`` ("" when not
    known), request ``headers`` (the bearer key) and ``gpus`` for the cost figures."""

    urls: list[str]
    kind: ServerKind
    model: str
    headers: dict[str, str]
    gpus: int

    @property
    def protocol(self) -> str:
        """The request protocol's name (run.json's ``protocol``)."""
        return self.kind.protocol


@dataclass
class Inputs:
    """The dataset opened and the rows selected: ``ds``, its ``num_rows``, the resolved ``findings``
    path, the rows selected before and after ``--shard``/``--limit`` (``rows_all``, ``rows``), the
    chat format read so far (``spec``: conversations are rendered at read time) and the run's
    ``identity`` (dataset, selection; ``load_template`` adds sampling); ``selection`` is the group
    they were selected by."""

    ds: Any
    num_rows: int
    findings: Path
    rows_all: np.ndarray
    rows: np.ndarray
    spec: Any
    identity: dict[str, Any]
    selection: Selection


@dataclass(frozen=True)
class Place:
    """Where this session writes: ``folder`` (``--out`` itself, or the local staging folder of an
    object-store ``--out``), ``url`` (``--out`` as given), ``remote`` (an object-store ``--out``),
    ``targets`` (that ``--out`` first, then the mirrors) and ``shard_tag`` (``s<i>of<N>``)."""

    url: str
    remote: bool
    folder: RunFolder
    targets: list[Target]
    shard_tag: str

    @property
    def out(self) -> Path:
        return self.folder.path


@dataclass
class Resume:
    """What the output folder already holds (``rec``), the selected rows still to do (``todo``), and
    the outputs of conversations an earlier session left half done (``partial``)."""

    rec: Recovery
    todo: np.ndarray
    partial: dict[int, dict[int, np.ndarray]]


@dataclass
class Books:
    """What the session records: ``manifest`` (run.json as written at start), ``progress`` (the
    counters), ``uploader`` (copies to the targets), ``sent`` (rows were left to send) and
    ``next_seq`` (the journal's next shard number)."""

    manifest: RunManifest
    progress: Progress
    uploader: Uploader
    sent: bool
    next_seq: int


@dataclass(frozen=True)
class Dispatched:
    """How dispatch ended: ``state`` (finished, interrupted or failed) and the ``dispatcher`` (its
    endpoints, failures and fatal message)."""

    state: str
    dispatcher: Dispatcher


@dataclass(frozen=True)
class Finished:
    """The final progress snapshot (``snap``) and the shards of the folder."""

    snap: dict[str, Any]
    shards: list[Path]


# ------------------------------------------------------------------------------------ the steps


def view(c: RegenConfig) -> View:
    """The run's presentation from the config's: ``log`` default prints to stderr; ``live``
    default: when stderr is a terminal."""
    log = c.log or _default_log
    live = c.live if c.live is not None else (sys.stderr.isatty() and os.environ.get("TERM") != "dumb")
    signals = c.install_signal_handlers and threading.current_thread() is threading.main_thread()
    return View(lambda msg: log(strip_userinfo(msg)), live, signals, c.on_progress)


def _default_log(msg: str) -> None:
    print(f"dqa regen: {msg}", file=sys.stderr, flush=True)


def resolve_servers(d: DispatchSpec) -> Servers:
    """The servers of ``--endpoint`` or the ``--fleet`` files (one per node: their union), checked.
    Returns ``Servers``; raises ``UsageError`` for a URL that is not http(s), an unknown protocol
    or an unset ``--api-key-env``, ``InputError`` for a bad fleet file, a URL in two fleet files,
    or fleet files that record different protocols or models (unless ``--protocol``/``--model``
    says which)."""
    from dqa.regen.fleet.file import read_fleets

    fleets = read_fleets(d.fleet) if d.fleet else None
    urls = fleets.send_urls if fleets else list(d.endpoints)  # a fleet with a router: the router
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise UsageError(f"endpoint {u!r}: expected an http:// or https:// URL")
    urls = list(dict.fromkeys(u.rstrip("/") for u in urls))
    kind = protocol_kind(d.protocol or (fleets.agreed("protocol", "--protocol") if fleets else DEFAULT_PROTOCOL))
    model = d.model or (fleets.agreed("model", "--model NAME, when they serve the same model") if fleets else "")
    headers: dict[str, str] = {}
    if d.api_key_env:
        key = os.environ.get(d.api_key_env)
        if not key:
            raise UsageError(f"--api-key-env {d.api_key_env}: that environment variable is not set")
        headers["Authorization"] = f"Bearer {key}"
    gpus = d.gpus if d.gpus is not None else (fleets.gpu_count if fleets else len(urls))
    return Servers(urls, kind, model, headers, gpus)


def dataset_identity(ds, num_rows: int) -> dict[str, Any]:
    """run.json's ``identity.dataset``: name, format, rows and the files with their sizes."""
    base = ds.path if ds.path.is_dir() else ds.path.parent
    files = []
    for f in ds.files:
        try:
            rel = str(f.relative_to(base))
        except ValueError:
            rel = f.name
        files.append([rel, f.stat().st_size])
    return {"name": ds.name, "format": ds.format, "rows": num_rows, "files": files}


def count_rows(ds) -> int:
    """Rows of ``ds``: from metadata where the format keeps it, else from the record batch lengths
    of the ids column alone (JSONL, Arrow streams, HF), without decoding tokens."""
    n = ds.num_rows
    if n is None:
        n = sum(rb.num_rows for _, rb in ds.record_batches(1 << 30, [ds.columns.ids]))
    return int(n)


def open_and_select(data: DatasetSpec, sel: Selection) -> Inputs:
    """Open the dataset (conversations: rendered with the chat template, as ``dqa scan`` reads
    them), count its rows and select the rows to regenerate. Returns ``Inputs`` with the identity's
    dataset and selection parts; raises ``InputError`` for an unreadable dataset, findings of another
    dataset (or one changed since its scan) and rows past the dataset's end."""
    from dqa.audit.readers import open_dataset
    from dqa.audit.template import load_template

    ds = open_dataset(data.path, data.ids_column, data.mask_column, data.labels_column, data.id_column)
    early_spec = None
    if ds.format == "conversations":  # rendered with the chat template at read time (as dqa scan reads it)
        early_spec = load_template(data.tokenizer, decode=True)
        ds.set_chat_format(early_spec)
    num_rows = count_rows(ds)
    # Resolved: run.json records it for `dqa merge`, which may run from another directory.
    findings = (Path(sel.findings) if sel.findings else findings_for(data.path)).resolve()
    if sel.failed_only:
        check_findings_for(findings, ds)  # another dataset's findings, or a dataset changed since its scan
    reasons = list(sel.reasons) if sel.reasons is not None else None
    rows_all = selected_rows(num_rows, findings if sel.failed_only else None, sel.failed_only, reasons)
    shard = sel.shard_pair
    rows = narrow(rows_all, shard, sel.limit)
    identity: dict[str, Any] = {
        "dataset": dataset_identity(ds, num_rows),
        "selection": {
            "failed_only": sel.failed_only,
            "reasons": sorted(reasons) if reasons else None,
            "rows_sha256": selection_digest(rows_all),
            "shard": f"{shard[0]}/{shard[1]}",
            "turns": sel.turns,
        },
    }
    return Inputs(ds, num_rows, findings, rows_all, rows, early_spec, identity, sel)


def warn_thinking_off(inputs: Inputs, log: Callable[[str], None]) -> None:
    """Say so when the scan found a thinking-off set (``thinking_expected`` false: almost no
    sample thinks, as LLaMA-Factory data rendered with empty think blocks) and only its flagged
    rows are regenerated: those come back thinking, the rest do not, and a rescan of the merged
    set then expects thinking and flags every untouched sample's empty think block."""
    if not inputs.selection.failed_only or inputs.rows.size == 0 or inputs.rows.size >= inputs.num_rows:
        return
    from dqa.audit.scan_folder import read_summary, scan_folder_of

    summary = read_summary(scan_folder_of(inputs.findings))
    if summary is not None and summary.get("thinking_expected") is False:
        log(f"note: the scan found thinking not expected in this set (no or almost no sample thinks); the {inputs.rows.size:,} "
            f"regenerated rows will think and the other {inputs.num_rows - inputs.rows.size:,} will not, so a rescan of the "
            "merged set will flag their empty think blocks (empty_thinking): regenerate every row (--all) for one mode")


def load_template(data: DatasetSpec, sampling: SamplingSpec, inputs: Inputs, kind: ServerKind) -> Any:
    """The chat format (the one the dataset was read with, else ``--tokenizer``); adds the
    identity's sampling part (parameters, seed base, assistant header, and the generation prompt
    when the kind's servers take the prompt tokens as they are). Returns the template spec;
    raises ``UsageError`` when a chat-rendering kind has no tokenizer folder."""
    from dqa.audit.template import load_template as load

    spec = inputs.spec or load(data.tokenizer, decode=kind.chat_rendered)
    inputs.spec = spec
    identity = inputs.identity
    identity["sampling"] = {**sampling.as_dict(), "seed_base": sampling.seed_base, "template": list(spec.assistant_header)}
    if spec.think_prefix and not kind.chat_rendered:  # the generation prompt goes past the header (Qwen3.5/3.6: "<think>\n")
        identity["sampling"]["generation_prompt"] = list(spec.generation_prompt)
    if kind.chat_rendered and spec.tokenizer_dir is None:
        raise UsageError(f"--protocol {kind.protocol} renders replies with the chat template: give --tokenizer PATH "
                         "(a folder with tokenizer.json)")
    return spec


def place_output(o: OutputSpec, shard: tuple[int, int]) -> Place:
    """Where the session writes: ``--out`` itself, or a local staging folder for an object-store
    ``--out``; its copy targets (raises for a URL fsspec cannot open) and the shard tag."""
    remote = is_url(o.out)
    out = stage_dir(o.out) if remote else local_path(o.out)
    targets = ([Target(o.out)] if remote else []) + [Target(m) for m in o.mirror]
    return Place(o.out, remote, RunFolder(out), targets, f"s{shard[0]}of{shard[1]}")


def stage_output(place: Place, identity: dict[str, Any], log: Callable[[str], None]) -> None:
    """With the folder locked: check it was made for this run (``InputError`` otherwise). An
    object-store ``--out`` is staged in the local folder: its run.json, progress.json (earlier
    sessions' working time) and shards are pulled first."""
    folder = place.folder
    if not place.remote:
        folder.check_identity(identity)
        return
    log(f"staging {place.url} in {place.out}")
    target = place.targets[0]
    if not folder.has_manifest() and target.exists(RUN_JSON):
        target.get(RUN_JSON, folder.run_json)
    folder.check_identity(identity)
    if not folder.progress_json.is_file() and folder.has_manifest() and target.exists("progress.json"):
        target.get("progress.json", folder.progress_json)  # earlier sessions' working time
    folder.shards_dir.mkdir(parents=True, exist_ok=True)
    pulled = pull_shards(target, place.out)
    if pulled:
        log(f"pulled {pulled} shards from {place.url}")


def recover(out: Path, rows: np.ndarray, retry_failed: bool, log: Callable[[str], None]) -> Resume:
    """Repair the folder after any crash (compact the journal, drop a torn tail and duplicates;
    ``retry_failed``: drop failed records) and work out what is left of ``rows``. Returns ``Resume``."""
    rec = recover_folder(out, retry_failed=retry_failed)
    if rec.torn_bytes or rec.recovered_records or rec.dropped_duplicates:
        log(
            f"resumed {out}: compacted {rec.recovered_records} journaled rows"
            + (f", discarded a torn tail of {rec.torn_bytes} bytes" if rec.torn_bytes else "")
            + (f", dropped {rec.dropped_duplicates} duplicate records" if rec.dropped_duplicates else "")
        )
    todo = rows[~np.isin(rows, rec.rows)]
    # Conversations an earlier session left half done continue at their next turn.
    partial = partial_outputs(out, rec.partial[np.isin(rec.partial, todo)]) if rec.partial.size else {}
    return Resume(rec, todo, partial)


def dispatch_settings(d: DispatchSpec) -> DispatchSettings:
    """The dispatcher's knobs from the dispatch group."""
    t, r = d.timeouts, d.retries
    return DispatchSettings(
        max_in_flight=d.max_in_flight,
        max_attempts=r.max_attempts,
        backoff_base=r.backoff_base,
        backoff_max=r.backoff_max,
        fail_threshold=r.fail_threshold,
        health_interval=t.health_interval,
        health_timeout=t.health,
        down_deadline=t.down_deadline,
        request_timeout=t.request,
        connect_timeout=t.connect,
        context_length=d.context_length,
        sticky_wait=t.sticky_wait,
        sticky=d.sticky,
    )


class Link:
    """The run's one event loop and one transport (one aiohttp session) to ``servers``, speaking
    ``protocol``: the preflight and the dispatch share its connections. ``run(coro)`` runs a step
    in that loop; ``facts`` is what the start-up probe found (``probe_servers``)."""

    def __init__(self, d: DispatchSpec, servers: Servers, protocol: Protocol):
        self.servers = servers
        self.protocol = protocol
        self.settings = dispatch_settings(d)
        self.facts: dict[str, Any] = {}
        self.transport = open_transport(self.settings, servers.headers, d.http_policy())
        self._runner = asyncio.Runner() if hasattr(asyncio, "Runner") else None  # Python 3.10: a plain loop
        self._loop = asyncio.new_event_loop() if self._runner is None else None

    def run(self, coro):
        """The result of ``coro``, run to the end in the run's loop."""
        if self._runner is not None:
            return self._runner.run(coro)
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        """Close the transport's connections, then the loop."""
        try:
            self.run(self.transport.close())
        finally:
            if self._runner is not None:
                self._runner.close()
            else:
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                self._loop.close()


def probe_servers(t: Timeouts, link: Link, log: Callable[[str], None]) -> dict[str, Any]:
    """Before the first request: which endpoints answer and what they are. Returns the facts per URL
    (None: not reachable yet; also kept as ``link.facts`` and given to the protocol); raises
    ``UsageError`` (exit 2) for an endpoint of the wrong protocol or with a TLS certificate it
    cannot verify, and ``RuntimeFailure`` (exit 3) when none answers at all."""
    from dqa.regen.dispatch.preflight import preflight_async
    from dqa.regen.servers.facts import describe, unknown_context, with_context_length
    from dqa.regen.servers.sglang_router import DROPPED, sampling_fields

    s = link.servers
    facts = link.run(preflight_async(s.urls, s.protocol, s.headers, connect_timeout=t.connect,
                                     info_timeout=min(t.health, 10.0), window=t.preflight_window, transport=link.transport))
    for u, f in facts.items():
        if f is None:
            continue
        with_context_length(f, link.settings.context_length)
        refused = unknown_context(strip_userinfo(u), f)
        if refused:  # never uncapped through a router: its circuit breaker counts the 400s
            raise UsageError(refused)
        if f.router is not None:
            f.router["sampling_fields"] = fields = sampling_fields(link.protocol.sampling_keys)
            dropped = sorted(k for k, v in fields.items() if v == DROPPED)
            if dropped:
                log(f"{strip_userinfo(u)}: the SGLang router drops {', '.join(dropped)} from every request (run.json: servers.router.sampling_fields)")
    link.protocol.use_facts(facts)  # e.g. openai: the token-exact chat route where the probe found it (issue 11, item 2)
    for u, f in facts.items():
        if f is None:
            log(f"{strip_userinfo(u)}: not reachable at start-up; waiting for it with the others")
        elif f.complete:
            log(describe(strip_userinfo(u), f))
    link.facts = facts
    return facts


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
    import pyarrow.parquet as pq

    from dqa.regen.dispatch.progress import active_seconds

    done_at, latency = [], []
    for p in list_shards(out):
        with contextlib.suppress(OSError, ValueError, KeyError):
            t = pq.read_table(p, columns=["completed_at", "latency_s"])
            done_at.append(t.column("completed_at").cast("int64").to_numpy(zero_copy_only=False) / 1e6)
            latency.append(t.column("latency_s").to_numpy(zero_copy_only=False))
    if not done_at:
        return 0.0
    return active_seconds(np.concatenate(done_at), np.concatenate(latency))


def _keep_endpoint_counts(progress: Progress, prior: dict[str, Any]) -> None:
    """A rerun with nothing to do keeps the per-endpoint counts the run finished with, and its
    consecutive-turn figures (same-endpoint share, turns moved)."""
    from dqa.regen.dispatch.progress import EndpointCounts

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
        from dqa.errors import RuntimeFailure

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
        from rich.console import Console
        from rich.live import Live

        display = Live(render(progress.snapshot()), console=Console(stderr=True), refresh_per_second=4, transient=False)
        display.start()

    async def report() -> None:
        last_write = 0.0
        while True:
            await asyncio.sleep(0.5 if display else interval)
            snap = progress.snapshot()
            if display:
                display.update(render(snap))
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
            display.update(render(progress.snapshot()))
            display.stop()


def finish(place: Place, link: Link, books: Books, done: Dispatched, log: Callable[[str], None]) -> Finished:
    """Write the final progress.json and, when rows were sent, run.json with what the servers said
    once they were up; copy both and every shard to the targets. Returns ``Finished``; copy errors
    are logged, not raised."""
    folder, progress, uploader = place.folder, books.progress, books.uploader
    progress.state = {"finished": "finished", "interrupted": "interrupted", "failed": "failed"}[done.state]
    snap = progress.snapshot()
    atomic.write_json(folder.progress_json, snap)
    uploader.put_now(folder.progress_json, "progress.json")
    if books.sent:  # what the servers said once they were up (some were not at start-up)
        info = servers_info(link.servers.urls, {ep.url: ep.facts for ep in done.dispatcher.endpoints})
        run_json = dataclasses.replace(books.manifest, servers=info["servers"], seed_applied=info["seed_applied"], updated_at=_now())
        run_json.write(folder.run_json)
        uploader.put_now(folder.run_json, RUN_JSON)
    shards = folder.shards()
    uploader.sync(shards)
    if uploader.errors:
        log(f"could not copy {len(uploader.errors)} files: {uploader.errors[0]}")
    return Finished(snap, shards)
