"""``regenerate(config)``: the whole ``dqa regen`` run, callable in-process (CLI, ``dqa plan --calibrate``, benchmarks).

Order of work (each a named step of ``_regenerate``): check options (``RegenConfig``'s groups check
their own fields), the fleet file and the output folder (a folder that dqa regen did not make, or
one that cannot be written, is refused at once: ``_resolve_servers``); open the dataset and select
rows (``_open_and_select``), refuse a folder made for another dataset or selection, open the
template (``_load_template``); lock and check the output folder (refuse one made for another
sampling: ``_stage_output``), and only then load the chat-template tokenizer (``--protocol
openai``: slow) and recover the folder after any crash (``_recover``); when rows are left, probe
every endpoint (``_probe_servers``: reachable, the right protocol, context length, speculative
reserve, whether seeds take effect); record the run (``_manifest``, run.json); dispatch the rows not
yet recorded, journaling each finished row, and finally compact the journal into shards
(``_dispatch``) and write ``progress.json`` and the final run.json (``_finish``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dqa import atomic
from dqa.errors import EXIT_OK, EXIT_RUNTIME, InputError, UsageError
from dqa.regen.client import OpenAIProtocol, Sampling, SglangProtocol
from dqa.regen.config import (DatasetSpec, DispatchSpec, OutputSpec, RegenConfig, Retries, SamplingSpec, Selection,  # noqa: F401 - re-exported
                              Timeouts)
from dqa.regen.dispatch import DispatchSettings, Dispatcher, open_transport
from dqa.regen.journal import Journal, Recovery, partial_outputs, recover
from dqa.regen.progress import Progress, render
from dqa.regen.run_folder import OWN_NAMES, RUN_JSON, RUN_VERSION, RunFolder, RunManifest, list_shards  # noqa: F401 - re-exported
from dqa.regen.selection import check_findings_for, findings_for, iter_turn_jobs, narrow, read_first_turns, selected_rows, selection_digest
from dqa.regen.upload import Target, Uploader, is_url, local_path, pull_shards, stage_dir
from dqa.regen.urls import strip_userinfo


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


def _dataset_identity(ds, num_rows: int) -> dict[str, Any]:
    base = ds.path if ds.path.is_dir() else ds.path.parent
    files = []
    for f in ds.files:
        try:
            rel = str(f.relative_to(base))
        except ValueError:
            rel = f.name
        files.append([rel, f.stat().st_size])
    return {"name": ds.name, "format": ds.format, "rows": num_rows, "files": files}


def _count_rows(ds) -> int:
    """Rows of ``ds``: from metadata where the format keeps it, else from the record batch lengths
    of the ids column alone (JSONL, Arrow streams, HF), without decoding tokens."""
    n = ds.num_rows
    if n is None:
        n = sum(rb.num_rows for _, rb in ds.record_batches(1 << 30, [ds.columns.ids]))
    return int(n)


@contextlib.contextmanager
def _locked(folder: Path):
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    fh = open(RunFolder(folder).lock_file, "a+")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise InputError(f"{folder}: another dqa regen is writing to this folder; wait for it or use another --out") from None
    try:
        yield
    finally:
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        fh.close()


def _check_out_folder(folder: Path) -> None:
    """Refuse (``InputError``, exit 2) an ``--out`` that is a file, that cannot be created or written,
    or a non-empty folder that dqa regen did not make. Creates nothing (a probe folder is made and
    removed at once), so it runs before any input is opened."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder}: not a folder; give --out a new or existing folder")
    if folder.is_dir() and not RunFolder(folder).has_manifest():
        try:
            names = [p.name for p in folder.iterdir()]
        except OSError as exc:
            raise InputError(f"{folder}: cannot list this folder ({exc.strerror or exc}); use another --out") from None
        other = sorted(n for n in names if n not in OWN_NAMES and not n.startswith(".tmp-"))
        if other:
            raise InputError(f"{folder}: not empty and not a dqa regen output folder (holds {other[0]!r}); use a new --out")
    base = folder
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise InputError(f"{folder}: cannot be created ({base} is not a folder); use another --out")
    try:  # a real write, not os.access: root passes access checks on read-only file systems
        os.rmdir(tempfile.mkdtemp(prefix=".tmp-dqa-probe-", dir=base))
    except OSError as exc:
        what = "not writable" if base == folder else f"cannot be created in {base}"
        raise InputError(f"{folder}: {what} ({exc.strerror or exc}); use another --out") from None


def _check_identity(run_json: Path, identity: dict[str, Any], keys: tuple[str, ...] = ("dataset", "selection", "sampling")) -> None:
    """Refuse (``InputError``, exit 2) to resume into a folder made for another dataset, selection or
    sampling (the parts of ``identity`` named by ``keys``), to write into a non-empty folder that
    dqa regen did not make, or into one whose run.json is unreadable or malformed."""
    if not run_json.is_file():
        _check_out_folder(run_json.parent)
        return
    try:
        old = RunManifest.read(run_json).identity
    except InputError as exc:
        raise InputError(f"{exc} (this folder was not made by this dqa regen: use another --out)") from None
    sel = old.get("selection")
    if isinstance(sel, dict) and "turns" not in sel:  # a run from before multi-turn regeneration: the final turn only
        old = {**old, "selection": {**sel, "turns": "last"}}
    for key in keys:
        if old.get(key) == identity[key]:
            continue
        if key == "selection" and isinstance(old.get(key), dict):
            turns = old[key].get("turns")
            if {**old[key], "turns": None} == {**identity[key], "turns": None}:  # only --turns differs: name it
                raise InputError(f"{run_json.parent}: made with --turns {turns}; rerun with --turns {turns} to resume, "
                                 "or use another --out")
        raise InputError(
            f"{run_json.parent}: made for a different {key} ({json.dumps(old.get(key), sort_keys=True)[:160]}); "
            f"use another --out, or rerun with the original options to resume"
        )


def _make_protocol(protocol_name: str, spec, sampling: Sampling, model: str):
    """The request protocol. ``openai`` decodes prompts with ``tokenizers``; transformers (seconds to
    import and load) is loaded only when the first reply is rendered with the chat template."""
    if protocol_name != "openai":
        return SglangProtocol(sampling, model)
    from dqa.regen.prompts import ChatTokenizer

    tok = ChatTokenizer(spec.tokenizer_dir, lambda: spec.tokenizer)
    if not tok.chat_template:
        raise InputError(f"{spec.tokenizer_dir}: tokenizer has no chat template; --protocol openai needs one")
    return OpenAIProtocol(sampling, tok, spec.turn_start, spec.eot, model)


def _read_prior(path: Path) -> dict[str, Any]:
    """The progress.json of earlier sessions ({} when missing or unreadable)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


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

    from dqa.regen.progress import active_seconds

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
    """A rerun with nothing to do keeps the per-endpoint counts the run finished with."""
    from dqa.regen.progress import EndpointCounts

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


def _servers_info(urls: list[str], facts: dict[str, Any]) -> dict[str, Any]:
    """run.json's ``servers`` (per endpoint without credentials: what it said about itself, null when
    it was never reached) and ``seed_applied`` (true when every known server applies the per-row
    seeds, false when one does not, null when no server said)."""
    servers = {strip_userinfo(u): (facts[u].to_json() if facts.get(u) is not None else None) for u in urls}
    applied = [f.seed_applied for f in facts.values() if f is not None and f.seed_applied is not None]
    return {"servers": servers, "seed_applied": (all(applied) if applied else None)}


def _prior_servers_info(run_json: Path, urls: list[str]) -> dict[str, Any]:
    """``servers`` and ``seed_applied`` as an earlier session of this folder recorded them (for a
    rerun that sends nothing); nulls when there is none."""
    try:
        old = RunManifest.read(run_json)
    except InputError:
        old = None
    if old is not None and old.servers is not None:
        return {"servers": dict(old.servers), "seed_applied": old.seed_applied}
    return {"servers": {strip_userinfo(u): None for u in urls}, "seed_applied": None}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _default_log(msg: str) -> None:
    print(f"dqa regen: {msg}", file=sys.stderr, flush=True)


def _redacting(log: Callable[[str], None]) -> Callable[[str], None]:
    """``log`` with URL credentials (``--out s3://key:secret@...``) removed from every message."""
    return lambda msg: log(strip_userinfo(msg))


def regenerate(config: RegenConfig) -> RunResult:
    """Run (or resume) a regeneration and return how it ended (see ``_regenerate``).

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


# ------------------------------------------------------------------------------------------ the steps


@dataclass(frozen=True)
class _Servers:
    """The servers a run talks to, resolved from ``--endpoint``/``--fleet``: ``urls`` (deduplicated,
    no trailing slash), ``protocol`` (sglang | openai), ``model`` ("" when not known), request
    ``headers`` (the bearer key) and ``gpus`` for the cost figures."""

    urls: list[str]
    protocol: str
    model: str
    headers: dict[str, str]
    gpus: int


@dataclass
class _Inputs:
    """The dataset opened and the rows selected: ``ds``, its ``num_rows``, the resolved ``findings``
    path, the rows selected before and after ``--shard``/``--limit`` (``rows_all``, ``rows``), the
    chat format read so far (``spec``: conversations are rendered at read time) and the run's
    ``identity`` (dataset, selection; ``_load_template`` adds sampling)."""

    ds: Any
    num_rows: int
    findings: Path
    rows_all: np.ndarray
    rows: np.ndarray
    spec: Any
    identity: dict[str, Any]


@dataclass
class _Resume:
    """What the output folder already holds (``rec``), the selected rows still to do (``todo``), and
    the outputs of conversations an earlier session left half done (``partial``)."""

    rec: Recovery
    todo: np.ndarray
    partial: dict[int, dict[int, np.ndarray]]


def _resolve_servers(c: RegenConfig) -> _Servers:
    """The servers of ``--endpoint`` or the ``--fleet`` file, checked. Returns ``_Servers``; raises
    ``UsageError`` for a URL that is not http(s), an unknown protocol or an unset ``--api-key-env``,
    ``InputError`` for a bad fleet file."""
    from dqa.regen.fleet_file import read_fleet

    d = c.dispatch
    fleet = read_fleet(d.fleet) if d.fleet else None
    urls = fleet.urls if fleet else list(d.endpoints)
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise UsageError(f"endpoint {u!r}: expected an http:// or https:// URL")
    urls = list(dict.fromkeys(u.rstrip("/") for u in urls))
    protocol_name = d.protocol or (fleet.protocol if fleet else "sglang")
    if protocol_name not in ("sglang", "openai"):
        raise UsageError(f"--protocol {protocol_name!r}: expected sglang or openai")
    model = d.model or (fleet.model if fleet else "")
    headers: dict[str, str] = {}
    if d.api_key_env:
        key = os.environ.get(d.api_key_env)
        if not key:
            raise UsageError(f"--api-key-env {d.api_key_env}: that environment variable is not set")
        headers["Authorization"] = f"Bearer {key}"
    gpus = d.gpus if d.gpus is not None else (fleet.gpu_count if fleet else len(urls))
    return _Servers(urls, protocol_name, model, headers, gpus)


def _open_and_select(c: RegenConfig) -> _Inputs:
    """Open the dataset (conversations: rendered with the chat template, as ``dqa scan`` reads
    them), count its rows and select the rows to regenerate. Returns ``_Inputs`` with the identity's
    dataset and selection parts; raises ``InputError`` for an unreadable dataset, findings of another
    dataset (or one changed since its scan) and rows past the dataset's end."""
    from dqa.audit.readers import open_dataset
    from dqa.audit.template import load_template

    data, sel = c.data, c.selection
    ds = open_dataset(data.path, data.ids_column, data.mask_column, data.labels_column, data.id_column)
    early_spec = None
    if ds.format == "conversations":  # rendered with the chat template at read time (as dqa scan reads it)
        early_spec = load_template(data.tokenizer, decode=True)
        ds.set_chat_format(early_spec)
    num_rows = _count_rows(ds)
    # Resolved: run.json records it for `dqa merge`, which may run from another directory.
    findings = (Path(sel.findings) if sel.findings else findings_for(data.path)).resolve()
    if sel.failed_only:
        check_findings_for(findings, ds)  # another dataset's findings, or a dataset changed since its scan
    reasons = list(sel.reasons) if sel.reasons is not None else None
    rows_all = selected_rows(num_rows, findings if sel.failed_only else None, sel.failed_only, reasons)
    shard = sel.shard_pair
    rows = narrow(rows_all, shard, sel.limit)
    identity: dict[str, Any] = {
        "dataset": _dataset_identity(ds, num_rows),
        "selection": {
            "failed_only": sel.failed_only,
            "reasons": sorted(reasons) if reasons else None,
            "rows_sha256": selection_digest(rows_all),
            "shard": f"{shard[0]}/{shard[1]}",
            "turns": sel.turns,
        },
    }
    return _Inputs(ds, num_rows, findings, rows_all, rows, early_spec, identity)


def _warn_thinking_off(inputs: _Inputs, failed_only: bool, log: Callable[[str], None]) -> None:
    """Say so when the scan found a thinking-off set (``thinking_expected`` false: almost no
    sample thinks, as LLaMA-Factory data rendered with empty think blocks) and only its flagged
    rows are regenerated: those come back thinking, the rest do not, and a rescan of the merged
    set then expects thinking and flags every untouched sample's empty think block."""
    if not failed_only or inputs.rows.size == 0 or inputs.rows.size >= inputs.num_rows:
        return
    from dqa.audit.scan_folder import read_summary, scan_folder_of

    summary = read_summary(scan_folder_of(inputs.findings))
    if summary is not None and summary.get("thinking_expected") is False:
        log(f"note: the scan found thinking not expected in this set (no or almost no sample thinks); the {inputs.rows.size:,} "
            f"regenerated rows will think and the other {inputs.num_rows - inputs.rows.size:,} will not, so a rescan of the "
            "merged set will flag their empty think blocks (empty_thinking): regenerate every row (--all) for one mode")


def _load_template(c: RegenConfig, inputs: _Inputs, protocol_name: str, sampling: Sampling) -> Any:
    """The chat format (the one the dataset was read with, else ``--tokenizer``); adds the
    identity's sampling part (parameters, seed base, assistant header, generation prompt). Returns
    the template spec; raises ``UsageError`` when ``--protocol openai`` has no tokenizer folder."""
    from dqa.audit.template import load_template

    spec = inputs.spec or load_template(c.data.tokenizer, decode=protocol_name == "openai")
    inputs.spec = spec
    identity = inputs.identity
    identity["sampling"] = {**sampling.as_dict(), "seed_base": c.sampling.seed_base, "template": list(spec.assistant_header)}
    if spec.think_prefix and protocol_name != "openai":  # the generation prompt goes past the header (Qwen3.5/3.6: "<think>\n")
        identity["sampling"]["generation_prompt"] = list(spec.generation_prompt)
    if protocol_name == "openai" and spec.tokenizer_dir is None:
        raise UsageError("--protocol openai renders replies with the chat template: give --tokenizer PATH (a folder with tokenizer.json)")
    return spec


def _stage_output(c: RegenConfig, out: Path, remote: bool, targets: list[Target], identity: dict[str, Any],
                  log: Callable[[str], None]) -> None:
    """With the folder locked: check it was made for this run (``InputError`` otherwise). An
    object-store ``--out`` is staged in ``out``: its run.json, progress.json (earlier sessions'
    working time) and shards are pulled first."""
    folder = RunFolder(out)
    if not remote:
        _check_identity(folder.run_json, identity)
        return
    log(f"staging {c.output.out} in {out}")
    if not folder.has_manifest() and targets[0].exists(RUN_JSON):
        targets[0].get(RUN_JSON, folder.run_json)
    _check_identity(folder.run_json, identity)
    if not folder.progress_json.is_file() and folder.has_manifest() and targets[0].exists("progress.json"):
        targets[0].get("progress.json", folder.progress_json)  # earlier sessions' working time
    folder.shards_dir.mkdir(parents=True, exist_ok=True)
    pulled = pull_shards(targets[0], out)
    if pulled:
        log(f"pulled {pulled} shards from {c.output.out}")


def _recover(c: RegenConfig, out: Path, rows: np.ndarray, log: Callable[[str], None]) -> _Resume:
    """Repair the folder after any crash (compact the journal, drop a torn tail and duplicates;
    ``--retry-failed``: drop failed records) and work out what is left. Returns ``_Resume``."""
    rec = recover(out, retry_failed=c.selection.retry_failed)
    if rec.torn_bytes or rec.recovered_records or rec.dropped_duplicates:
        log(
            f"resumed {out}: compacted {rec.recovered_records} journaled rows"
            + (f", discarded a torn tail of {rec.torn_bytes} bytes" if rec.torn_bytes else "")
            + (f", dropped {rec.dropped_duplicates} duplicate records" if rec.dropped_duplicates else "")
        )
    todo = rows[~np.isin(rows, rec.rows)]
    # Conversations an earlier session left half done continue at their next turn.
    partial = partial_outputs(out, rec.partial[np.isin(rec.partial, todo)]) if rec.partial.size else {}
    return _Resume(rec, todo, partial)


class _Wire:
    """The run's one event loop and one transport (one aiohttp session): the preflight and the
    dispatch share its connections. ``run(coro)`` runs a step in that loop."""

    def __init__(self, c: RegenConfig, servers: _Servers):
        self.transport = open_transport(_dispatch_settings(c), servers.headers, c.dispatch.http_policy())
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


def _probe_servers(c: RegenConfig, servers: _Servers, protocol: Any, wire: _Wire, log: Callable[[str], None]) -> dict[str, Any]:
    """Before the first request: which endpoints answer and what they are. Returns the facts per URL
    (None: not reachable yet); raises ``UsageError`` (exit 2) for an endpoint of the wrong protocol
    or with a TLS certificate it cannot verify, and ``RuntimeFailure`` (exit 3) when none answers at all."""
    from dqa.regen.server_probe import describe, preflight_async

    t = c.dispatch.timeouts
    facts = wire.run(preflight_async(servers.urls, servers.protocol, servers.headers, connect_timeout=t.connect,
                                     info_timeout=min(t.health, 10.0), window=t.preflight_window, transport=wire.transport))
    if isinstance(protocol, OpenAIProtocol):
        protocol.use_facts(facts)  # token-exact chat route where the probe found it (issue 11, item 2)
    for u, f in facts.items():
        if f is None:
            log(f"{strip_userinfo(u)}: not reachable at start-up; waiting for it with the others")
        elif f.complete:
            log(describe(strip_userinfo(u), f))
    return facts


def _manifest(c: RegenConfig, servers: _Servers, inputs: _Inputs, servers_info: dict[str, Any]) -> RunManifest:
    """The run.json of this session (no URL credentials in it)."""
    tok = c.data.tokenizer
    return RunManifest(
        version=RUN_VERSION,
        identity=inputs.identity,
        dataset_path=str(Path(c.data.path).resolve()),
        findings=str(inputs.findings) if c.selection.failed_only else None,
        # the column overrides given (null: detected); `dqa merge` uses them when given none
        columns=c.data.columns,
        limit=c.selection.limit,
        protocol=servers.protocol,
        model=servers.model or None,
        endpoints=tuple(strip_userinfo(u) for u in servers.urls),
        max_in_flight=c.dispatch.max_in_flight,
        gpus=servers.gpus,
        gpu_hour_cost=c.dispatch.gpu_hour_cost,
        # resolved when it is a folder, so that `dqa merge` finds the chat format from anywhere
        tokenizer=str(Path(tok).resolve()) if tok and Path(tok).is_dir() else tok,
        mirror=tuple(strip_userinfo(m) for m in c.output.mirror),
        # What each server said about itself, and whether the per-row seeds reproduce outputs.
        servers=servers_info["servers"],
        seed_applied=servers_info["seed_applied"],
        updated_at=_now(),
    )


def _dispatch_settings(c: RegenConfig) -> DispatchSettings:
    d, t, r = c.dispatch, c.dispatch.timeouts, c.dispatch.retries
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
    )


def _dispatch(c: RegenConfig, out: Path, shard_tag: str, servers: _Servers, inputs: _Inputs, resume: _Resume, protocol: Any,
              facts: dict[str, Any], progress: Progress, uploader: Uploader, wire: _Wire,
              log: Callable[[str], None]) -> tuple[str, Dispatcher]:
    """Send the rows not yet recorded, journaling each finished turn, until done, interrupted or the
    fleet is down; the journal is compacted into shards on return. Returns ``(state, dispatcher)``
    (state: finished, interrupted or failed); raises ``RuntimeFailure`` when the journal cannot be
    written, and the ``InputError`` of a request every server rejects."""
    journal = Journal(out, shard_tag, resume.rec.next_seq, c.output.shard_rows, c.output.shard_seconds, c.output.commit_interval,
                      on_shard=uploader.submit)
    sel = c.selection
    first_flagged = read_first_turns(inputs.findings, resume.todo) if sel.failed_only and sel.turns == "flagged" else None
    # openai: the server renders the generation prompt from messages; the prompt ends at the header
    spec = inputs.spec
    gen = tuple(spec.assistant_header) if servers.protocol == "openai" else None
    source = iter_turn_jobs(inputs.ds, resume.todo, spec, sel.turns, first_flagged, resume.partial, c.sampling.seed_base,
                            generation_prompt=gen)
    journal.start()

    def journal_error() -> str | None:
        if journal.error is not None:
            return f"{out}: writing the journal failed ({journal.error}); rerun the same command to resume"
        return None

    dispatcher = Dispatcher(
        servers.urls, protocol, source, journal.append, progress, _dispatch_settings(c),
        headers=servers.headers, model=servers.model, log=log, check=journal_error, facts=facts, transport=wire.transport,
    )
    live = c.live if c.live is not None else (sys.stderr.isatty() and os.environ.get("TERM") != "dumb")
    try:
        state = wire.run(_drive(dispatcher, progress, out, c, live))
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
    return state, dispatcher


def _finish(out: Path, state: str, progress: Progress, manifest: RunManifest, servers: _Servers, dispatcher: Dispatcher,
            sent: bool, uploader: Uploader, log: Callable[[str], None]) -> tuple[dict[str, Any], list[Path]]:
    """Write the final progress.json and, when rows were sent, run.json with what the servers said
    once they were up; copy both and every shard to the targets. Returns ``(progress snapshot,
    shards)``; copy errors are logged, not raised."""
    folder = RunFolder(out)
    progress.state = {"finished": "finished", "interrupted": "interrupted", "failed": "failed"}[state]
    snap = progress.snapshot()
    atomic.write_json(folder.progress_json, snap)
    uploader.put_now(folder.progress_json, "progress.json")
    if sent:  # what the servers said once they were up (some were not at start-up)
        info = _servers_info(servers.urls, {ep.url: ep.facts for ep in dispatcher.endpoints})
        manifest = dataclasses.replace(manifest, servers=info["servers"], seed_applied=info["seed_applied"], updated_at=_now())
        manifest.write(folder.run_json)
        uploader.put_now(folder.run_json, RUN_JSON)
    shards = folder.shards()
    uploader.sync(shards)
    if uploader.errors:
        log(f"could not copy {len(uploader.errors)} files: {uploader.errors[0]}")
    return snap, shards


def _result(c: RegenConfig, state: str, progress: Progress, snap: dict[str, Any], dispatcher: Dispatcher, shards: list[Path]) -> RunResult:
    """How the run ended: exit 0 when finished, 3 when every request of this session failed (the
    fleet or the options are wrong, not the rows), interrupted, or stopped."""
    out, files = strip_userinfo(c.output.out), [str(p) for p in shards]
    if state == "finished" and dispatcher.request_failures and not dispatcher.answered:
        msg = (f"every request of this run failed ({dispatcher.request_failures} rows recorded as failed; last: "
               f"{dispatcher.last_failure[:300]}); fix the cause and rerun with --retry-failed")
        return RunResult(EXIT_RUNTIME, "finished", snap, out, strip_userinfo(msg), files)
    if state == "finished":
        return RunResult(EXIT_OK, "finished", snap, out, "", files)
    msg = dispatcher.fatal or f"interrupted with {snap['total'] - snap['done']} rows left; rerun the same command to resume"
    return RunResult(EXIT_RUNTIME, progress.state, snap, out, strip_userinfo(msg), files)


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
    log = _redacting(c.log or _default_log)
    servers = _resolve_servers(c)
    remote = is_url(c.output.out)
    if not remote:  # a bad --out is refused before any input is read or any tokenizer loaded
        _check_out_folder(local_path(c.output.out))
    inputs = _open_and_select(c)
    _warn_thinking_off(inputs, c.selection.failed_only, log)
    if not remote:  # a folder made for another dataset or selection: refused before the template is read
        _check_identity(RunFolder(local_path(c.output.out)).run_json, inputs.identity, ("dataset", "selection"))
    sampling = c.sampling.sampling()
    spec = _load_template(c, inputs, servers.protocol, sampling)

    out = stage_dir(c.output.out) if remote else local_path(c.output.out)
    targets = ([Target(c.output.out)] if remote else []) + [Target(m) for m in c.output.mirror]
    shard = c.selection.shard_pair
    shard_tag = f"s{shard[0]}of{shard[1]}"
    if not remote:
        _check_identity(RunFolder(out).run_json, inputs.identity)  # before the lock file, so a refused folder stays untouched
    with _locked(out):
        _stage_output(c, out, remote, targets, inputs.identity, log)
        # Every input and the folder are checked: now the (slow) chat-template tokenizer.
        protocol = _make_protocol(servers.protocol, spec, sampling, servers.model)
        resume = _recover(c, out, inputs.rows, log)
        facts: dict[str, Any] = {}
        servers_info = _prior_servers_info(RunFolder(out).run_json, servers.urls)  # a rerun with nothing to do keeps them
        wire = _Wire(c, servers)  # from here on, every request goes over one session
        with contextlib.closing(wire):
            if resume.todo.size:
                facts = _probe_servers(c, servers, protocol, wire, log)
                servers_info = _servers_info(servers.urls, facts)
            uploader = Uploader(targets)
            for p in resume.rec.rewritten:
                uploader.submit(p)
            manifest = _manifest(c, servers, inputs, servers_info)
            manifest.write(RunFolder(out).run_json)
            uploader.put_now(RunFolder(out).run_json, RUN_JSON)

            rows, todo, rec = inputs.rows, resume.todo, resume.rec
            progress = Progress(total=int(rows.size), gpus=servers.gpus, gpu_hour_cost=c.dispatch.gpu_hour_cost)
            progress.counting = bool(todo.size)  # a rerun with nothing left to do adds no working time
            if rec.rows.size:
                progress.add_prior(*rec.tally(rows))  # this selection's rows only (a smaller --limit than before)
                prior = _read_prior(RunFolder(out).progress_json)
                progress.prior_elapsed_s = _prior_working_time(prior, out)
                if not todo.size:
                    _keep_endpoint_counts(progress, prior)

            state, dispatcher = _dispatch(c, out, shard_tag, servers, inputs, resume, protocol, facts, progress, uploader, wire, log)
        snap, shards = _finish(out, state, progress, manifest, servers, dispatcher, bool(todo.size), uploader, log)
    return _result(c, state, progress, snap, dispatcher, shards)


async def _drive(dispatcher: Dispatcher, progress: Progress, out: Path, c: RegenConfig, live: bool) -> str:
    """Run the dispatcher with signal handlers, progress.json rewrites and the live display."""
    loop = asyncio.get_running_loop()
    installed = []
    if c.install_signal_handlers and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, dispatcher.request_stop)
                installed.append(sig)
    display = None
    if live:
        from rich.console import Console
        from rich.live import Live

        display = Live(render(progress.snapshot()), console=Console(stderr=True), refresh_per_second=4, transient=False)
        display.start()
    interval = c.output.progress_interval

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
