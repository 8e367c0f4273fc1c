"""``regenerate(config)``: the whole ``dqa regen`` run, callable in-process (CLI, ``dqa plan --calibrate``, benchmarks).

Order of work: check options, the fleet file and the output folder (a folder
that dqa regen did not make, or one that cannot be written, is refused at
once), open the dataset, select rows, open the template, lock and check the
output folder (refuse one made for another dataset, selection or sampling),
and only then load the chat-template tokenizer (``--protocol openai``: slow)
and contact the servers; recover the folder after any crash; when rows are
left, probe every endpoint (``server_probe.preflight``: reachable, the right
protocol, context length, speculative reserve, whether seeds take effect);
dispatch the rows not yet recorded, journaling each finished row, and finally
compact the journal into shards and write ``progress.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from dqa.regen.dispatch import DispatchSettings, Dispatcher
from dqa.regen.journal import Journal, list_shards, partial_outputs, recover
from dqa.regen.prompts import TURN_MODES
from dqa.regen.progress import Progress, render
from dqa.regen.selection import (check_findings_for, findings_for, iter_turn_jobs, narrow, parse_shard, read_first_turns,
                                 selected_rows, selection_digest)
from dqa.regen.upload import Target, Uploader, is_url, local_path, pull_shards, stage_dir
from dqa.regen.urls import strip_userinfo

RUN_VERSION = 1


@dataclass
class RegenConfig:
    """Every option of ``dqa regen``; defaults are the CLI's defaults.

    ``endpoints`` or ``fleet`` (a fleet file from ``dqa fleet up``) names the
    servers. ``out`` is a folder or an fsspec URL. Sampling defaults follow
    Qwen3's recommendation for thinking mode (temperature 0.6, top_p 0.95,
    top_k 20); ``max_new_tokens`` 8192 covers the long tail of thinking traces
    (the seed run averaged ~2.3K output tokens) and must fit the servers'
    context length together with the prompt.
    """

    dataset: str
    out: str
    endpoints: list[str] = field(default_factory=list)
    # column overrides, as for ``dqa scan`` (None: detected)
    ids_column: str | None = None
    mask_column: str | None = None
    labels_column: str | None = None
    id_column: str | None = None
    fleet: str | None = None
    failed_only: bool = True
    findings: str | None = None
    reasons: list[str] | None = None
    limit: int | None = None
    protocol: str | None = None  # sglang | openai; default: the fleet file's, else sglang
    model: str | None = None
    api_key_env: str | None = None
    max_in_flight: int = 48
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_new_tokens: int = 8192
    shard: str | None = None
    gpu_hour_cost: float = 0.0
    gpus: int | None = None
    mirror: list[str] = field(default_factory=list)
    tokenizer: str | None = "qwen3"
    retry_failed: bool = False
    seed_base: int = 0
    turns: str = "flagged"  # which assistant turns of a conversation: flagged (from the first flagged on), all, last
    # durability and timing
    shard_rows: int = 20_000
    shard_seconds: float = 300.0
    commit_interval: float = 0.1
    progress_interval: float = 2.0
    max_attempts: int = 6
    request_timeout: float = 3600.0
    connect_timeout: float = 10.0
    health_interval: float = 15.0
    health_timeout: float = 30.0
    down_deadline: float = 600.0
    preflight_window: float = 6.0  # seconds of connect tries at start-up before an endpoint counts as unreachable
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    fail_threshold: int = 3
    # presentation
    live: bool | None = None  # None: a live display when stderr is a terminal
    log: Callable[[str], None] | None = None  # one-line events; default: print to stderr
    install_signal_handlers: bool = True


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
    fh = open(folder / ".lock", "a+")
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


OWN_NAMES = {".lock", "run.json", "progress.json", "shards", "journal"}


def _check_out_folder(folder: Path) -> None:
    """Refuse (``InputError``, exit 2) an ``--out`` that is a file, that cannot be created or written,
    or a non-empty folder that dqa regen did not make. Creates nothing (a probe folder is made and
    removed at once), so it runs before any input is opened."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder}: not a folder; give --out a new or existing folder")
    if folder.is_dir() and not (folder / "run.json").is_file():
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
    sampling (the parts of ``identity`` named by ``keys``), or to write into a non-empty folder that
    dqa regen did not make."""
    if not run_json.is_file():
        _check_out_folder(run_json.parent)
        return
    try:
        old = json.loads(run_json.read_text()).get("identity", {})
    except (OSError, ValueError):
        raise InputError(f"{run_json}: unreadable; this folder was not made by dqa regen (use another --out)") from None
    for key in keys:
        if old.get(key) != identity[key]:
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
        old = json.loads(run_json.read_text())
    except (OSError, ValueError):
        old = {}
    if isinstance(old, dict) and isinstance(old.get("servers"), dict):
        return {"servers": old["servers"], "seed_applied": old.get("seed_applied")}
    return {"servers": {strip_userinfo(u): None for u in urls}, "seed_applied": None}


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
    from dqa.audit.readers import open_dataset
    from dqa.audit.template import load_template

    # --- options and fleet -------------------------------------------------------------
    if bool(c.endpoints) == bool(c.fleet):
        raise UsageError("give --endpoint URL (repeatable) or --fleet FILE, not both and not neither")
    from dqa.regen.fleet_file import read_fleet

    fleet = read_fleet(c.fleet) if c.fleet else None
    urls = fleet.urls if fleet else list(c.endpoints)
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise UsageError(f"endpoint {u!r}: expected an http:// or https:// URL")
    urls = list(dict.fromkeys(u.rstrip("/") for u in urls))
    protocol_name = c.protocol or (fleet.protocol if fleet else "sglang")
    if protocol_name not in ("sglang", "openai"):
        raise UsageError(f"--protocol {protocol_name!r}: expected sglang or openai")
    model = c.model or (fleet.model if fleet else "")
    if c.max_in_flight < 1:
        raise UsageError("--max-in-flight must be >= 1")
    if c.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be >= 1")
    headers: dict[str, str] = {}
    if c.api_key_env:
        key = os.environ.get(c.api_key_env)
        if not key:
            raise UsageError(f"--api-key-env {c.api_key_env}: that environment variable is not set")
        headers["Authorization"] = f"Bearer {key}"
    gpus = c.gpus if c.gpus is not None else (fleet.gpu_count if fleet else len(urls))
    shard = parse_shard(c.shard)
    if c.turns not in TURN_MODES:
        raise UsageError(f"--turns {c.turns!r}: expected one of {', '.join(TURN_MODES)}")
    remote = is_url(c.out)
    if not remote:  # a bad --out is refused before any input is read or any tokenizer loaded
        _check_out_folder(local_path(c.out))

    # --- dataset, selection, template ----------------------------------------------------
    ds = open_dataset(c.dataset, c.ids_column, c.mask_column, c.labels_column, c.id_column)
    early_spec = None
    if ds.format == "conversations":  # rendered with the chat template at read time (as dqa scan reads it)
        early_spec = load_template(c.tokenizer, decode=True)
        ds.set_chat_format(early_spec)
    num_rows = _count_rows(ds)
    # Resolved: run.json records it for `dqa merge`, which may run from another directory.
    findings = (Path(c.findings) if c.findings else findings_for(c.dataset)).resolve()
    if c.failed_only:
        check_findings_for(findings, ds)  # another dataset's findings, or a dataset changed since its scan
    rows_all = selected_rows(num_rows, findings if c.failed_only else None, c.failed_only, c.reasons)
    rows = narrow(rows_all, shard, c.limit)
    sampling = Sampling(c.temperature, c.top_p, c.top_k, c.max_new_tokens)
    identity: dict[str, Any] = {
        "dataset": _dataset_identity(ds, num_rows),
        "selection": {
            "failed_only": c.failed_only,
            "reasons": sorted(c.reasons) if c.reasons else None,
            "rows_sha256": selection_digest(rows_all),
            "shard": f"{shard[0]}/{shard[1]}",
            "turns": c.turns,
        },
    }
    if not remote:  # a folder made for another dataset or selection: refused before the template is read
        _check_identity(local_path(c.out) / "run.json", identity, ("dataset", "selection"))
    spec = early_spec or load_template(c.tokenizer, decode=protocol_name == "openai")
    identity["sampling"] = {**sampling.as_dict(), "seed_base": c.seed_base, "template": list(spec.assistant_header)}
    if spec.think_prefix and protocol_name != "openai":  # the generation prompt goes past the header (Qwen3.5/3.6: "<think>\n")
        identity["sampling"]["generation_prompt"] = list(spec.generation_prompt)
    if protocol_name == "openai" and spec.tokenizer_dir is None:
        raise UsageError("--protocol openai renders replies with the chat template: give --tokenizer PATH (a folder with tokenizer.json)")

    # --- output folder -------------------------------------------------------------------
    out = stage_dir(c.out) if remote else local_path(c.out)
    targets = ([Target(c.out)] if remote else []) + [Target(m) for m in c.mirror]
    shard_tag = f"s{shard[0]}of{shard[1]}"
    if not remote:
        _check_identity(out / "run.json", identity)  # before the lock file, so a refused folder stays untouched
    with _locked(out):
        if remote:
            log(f"staging {c.out} in {out}")
            if not (out / "run.json").is_file() and targets[0].exists("run.json"):
                targets[0].get("run.json", out / "run.json")
            _check_identity(out / "run.json", identity)
            if not (out / "progress.json").is_file() and (out / "run.json").is_file() and targets[0].exists("progress.json"):
                targets[0].get("progress.json", out / "progress.json")  # earlier sessions' working time
            (out / "shards").mkdir(parents=True, exist_ok=True)
            pulled = pull_shards(targets[0], out)
            if pulled:
                log(f"pulled {pulled} shards from {c.out}")
        else:
            _check_identity(out / "run.json", identity)
        # Every input and the folder are checked: now the (slow) chat-template tokenizer.
        protocol = _make_protocol(protocol_name, spec, sampling, model)
        rec = recover(out, retry_failed=c.retry_failed)
        if rec.torn_bytes or rec.recovered_records or rec.dropped_duplicates:
            log(
                f"resumed {out}: compacted {rec.recovered_records} journaled rows"
                + (f", discarded a torn tail of {rec.torn_bytes} bytes" if rec.torn_bytes else "")
                + (f", dropped {rec.dropped_duplicates} duplicate records" if rec.dropped_duplicates else "")
            )
        done_mask = np.isin(rows, rec.rows)
        todo = rows[~done_mask]
        # Conversations an earlier session left half done continue at their next turn.
        partial = partial_outputs(out, rec.partial[np.isin(rec.partial, todo)]) if rec.partial.size else {}
        facts: dict[str, Any] = {}
        servers_info = _prior_servers_info(out / "run.json", urls)  # a rerun with nothing to do keeps them
        if todo.size:
            # Before the first request: which endpoints answer, what they are (exit 2 for the wrong
            # protocol, 3 when none answers at all).
            from dqa.regen.server_probe import describe, preflight

            facts = preflight(urls, protocol_name, headers, connect_timeout=c.connect_timeout,
                              info_timeout=min(c.health_timeout, 10.0), window=c.preflight_window)
            if isinstance(protocol, OpenAIProtocol):
                protocol.use_facts(facts)  # token-exact chat route where the probe found it (issue 11, item 2)
            for u, f in facts.items():
                if f is None:
                    log(f"{strip_userinfo(u)}: not reachable at start-up; waiting for it with the others")
                elif f.complete:
                    log(describe(strip_userinfo(u), f))
            servers_info = _servers_info(urls, facts)
        uploader = Uploader(targets)
        for p in rec.rewritten:
            uploader.submit(p)
        run_info = {
            "version": RUN_VERSION,
            "identity": identity,
            "dataset_path": str(Path(c.dataset).resolve()),
            "findings": str(findings) if c.failed_only else None,
            # the column overrides given (null: detected); `dqa merge` uses them when given none
            "columns": {"ids": c.ids_column, "mask": c.mask_column, "labels": c.labels_column, "id": c.id_column},
            "limit": c.limit,
            "protocol": protocol_name,
            "model": model or None,
            "endpoints": [strip_userinfo(u) for u in urls],
            "max_in_flight": c.max_in_flight,
            "gpus": gpus,
            "gpu_hour_cost": c.gpu_hour_cost,
            # resolved when it is a folder, so that `dqa merge` finds the chat format from anywhere
            "tokenizer": str(Path(c.tokenizer).resolve()) if c.tokenizer and Path(c.tokenizer).is_dir() else c.tokenizer,
            "mirror": [strip_userinfo(m) for m in c.mirror],
            # What each server said about itself, and whether the per-row seeds reproduce outputs.
            **servers_info,
            "updated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        atomic.write_json(out / "run.json", run_info)
        uploader.put_now(out / "run.json", "run.json")

        progress = Progress(total=int(rows.size), gpus=gpus, gpu_hour_cost=c.gpu_hour_cost)
        progress.counting = bool(todo.size)  # a rerun with nothing left to do adds no working time
        if rec.rows.size:
            progress.add_prior(*rec.tally(rows))  # this selection's rows only (a smaller --limit than before)
            prior = _read_prior(out / "progress.json")
            progress.prior_elapsed_s = _prior_working_time(prior, out)
            if not todo.size:
                _keep_endpoint_counts(progress, prior)

        journal = Journal(out, shard_tag, rec.next_seq, c.shard_rows, c.shard_seconds, c.commit_interval, on_shard=uploader.submit)
        settings = DispatchSettings(
            max_in_flight=c.max_in_flight,
            max_attempts=c.max_attempts,
            backoff_base=c.backoff_base,
            backoff_max=c.backoff_max,
            fail_threshold=c.fail_threshold,
            health_interval=c.health_interval,
            health_timeout=c.health_timeout,
            down_deadline=c.down_deadline,
            request_timeout=c.request_timeout,
            connect_timeout=c.connect_timeout,
        )
        first_flagged = read_first_turns(findings, todo) if c.failed_only and c.turns == "flagged" else None
        # openai: the server renders the generation prompt from messages; the prompt ends at the header
        gen = tuple(spec.assistant_header) if protocol_name == "openai" else None
        source = iter_turn_jobs(ds, todo, spec, c.turns, first_flagged, partial, c.seed_base, generation_prompt=gen)
        journal.start()

        def journal_error() -> str | None:
            if journal.error is not None:
                return f"{out}: writing the journal failed ({journal.error}); rerun the same command to resume"
            return None

        dispatcher = Dispatcher(
            urls, protocol, source, journal.append, progress, settings,
            headers=headers, model=model, log=log, check=journal_error, facts=facts,
        )
        live = c.live if c.live is not None else (sys.stderr.isatty() and os.environ.get("TERM") != "dumb")
        try:
            state = asyncio.run(_drive(dispatcher, progress, out, c, live))
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
        progress.state = {"finished": "finished", "interrupted": "interrupted", "failed": "failed"}[state]
        snap = progress.snapshot()
        atomic.write_json(out / "progress.json", snap)
        uploader.put_now(out / "progress.json", "progress.json")
        if todo.size:  # what the servers said once they were up (some were not at start-up)
            run_info.update(_servers_info(urls, {ep.url: ep.facts for ep in dispatcher.endpoints}))
            run_info["updated_at"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            atomic.write_json(out / "run.json", run_info)
            uploader.put_now(out / "run.json", "run.json")
        shards = list_shards(out)
        uploader.sync(shards)
        if uploader.errors:
            log(f"could not copy {len(uploader.errors)} files: {uploader.errors[0]}")
    if state == "finished" and dispatcher.request_failures and not dispatcher.answered:
        # Every request of this session failed: the fleet or the options are wrong, not the rows.
        msg = (f"every request of this run failed ({dispatcher.request_failures} rows recorded as failed; last: "
               f"{dispatcher.last_failure[:300]}); fix the cause and rerun with --retry-failed")
        return RunResult(EXIT_RUNTIME, "finished", snap, strip_userinfo(c.out), strip_userinfo(msg), [str(p) for p in shards])
    if state == "finished":
        return RunResult(EXIT_OK, "finished", snap, strip_userinfo(c.out), "", [str(p) for p in shards])
    msg = dispatcher.fatal or f"interrupted with {snap['total'] - snap['done']} rows left; rerun the same command to resume"
    return RunResult(EXIT_RUNTIME, progress.state, snap, strip_userinfo(c.out), strip_userinfo(msg), [str(p) for p in shards])


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

    async def report() -> None:
        last_write = 0.0
        while True:
            await asyncio.sleep(0.5 if display else c.progress_interval)
            snap = progress.snapshot()
            if display:
                display.update(render(snap))
            now = time.monotonic()
            if now - last_write >= c.progress_interval:
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
