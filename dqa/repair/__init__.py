"""dqa.repair: from a broken set to a gated release, round after round (``dqa repair``).
Owns the loop scan -> regen -> merge -> rescan, its work folder (``work.py``) and its budget (``budget.py``).

Round 1 scans DATASET (or reuses its scan when the fingerprint matches), regenerates the failing
samples, merges them into a new set and rescans it. Each later round regenerates the samples that
still fail in the last merged set, from the same prompts with new seeds (``seed_base`` + round - 1);
when rows were cut by the length limit, ``max_new_tokens`` doubles, up to what the servers'
context allows. A row cut at the servers' context cannot fit: later rounds hold it back (it is
not sent again; ``held.py``) and it stays failing, noted "cannot fit in C tokens of context". The
loop stops when nothing fails, when nothing regenerable fails (every failing row is held back),
after ``rounds`` rounds, when a round fixed nothing (unless the next one gets a larger
``max_new_tokens``), or before a round the budget cannot pay for. Then NEW is written (the last merged set; ``failed="drop"`` leaves out the rows still
failing) and gated. Every step calls the steps' Python API (``dqa.scan``, ``dqa.regenerate``,
``dqa.merge``, ``dqa.gate``), never the CLI.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dqa.audit.scan_folder import findings_file
from dqa import storage
from dqa.errors import EXIT_OK, EXIT_QUALITY, InputError, UsageError
from dqa.repair.budget import RoundPlan, cut_rows, plan_round, read_calibration, regen_figures, turns_to_regenerate
from dqa.repair.held import SELECT_DIR, cannot_fit_note, failing_rows, held_back, write_selection
from dqa.repair.work import WorkFolder, default_work_dir

DEFAULT_ROUNDS = 3
NOTHING_REGENERABLE = "nothing regenerable"  # every sample still failing cannot fit in the servers' context
FAILED_CHOICES = ("keep", "drop")


@dataclass(frozen=True)
class RepairOptions:
    """What a repair may do. ``regen``: ``dqa.regenerate``'s flat keywords (``endpoints``,
    ``fleet`` (one fleet file or a tuple of several, one per node), ``max_new_tokens``, ``max_in_flight``, ``protocol``, ``turns``, ``gpus``,
    ``gpu_hour_cost``, ...), used in every round; ``rounds``: at most this many; ``budget_usd``: no
    round starts that the plan says would go past it (cost from ``gpu_hour_cost`` x ``gpus``);
    ``failed``: ``keep`` (rows still failing stay as the last round left them) or ``drop`` (in any
    format the merge writes); ``plan``: a ``dqa plan --calibrate --json`` file whose calibration
    estimates round 1 (without one, round 1's estimate is ``max_new_tokens`` per sample, an upper
    bound, and its cost is unknown until it has run)."""

    tokenizer: str | None = None
    rounds: int = DEFAULT_ROUNDS
    budget_usd: float | None = None
    failed: str = "keep"
    regen: dict[str, Any] = field(default_factory=dict)
    plan: str | None = None

    def check(self) -> None:
        """Raises ``UsageError`` for a bad option."""
        if self.rounds < 1:
            raise UsageError(f"--rounds {self.rounds}: expected 1 or more")
        if self.failed not in FAILED_CHOICES:
            raise UsageError(f"--failed {self.failed}: expected keep or drop")
        if self.budget_usd is not None:
            if self.budget_usd <= 0:
                raise UsageError(f"--budget-usd {self.budget_usd}: expected a positive amount")
            if not self.regen.get("gpu_hour_cost"):
                raise UsageError("--budget-usd needs --gpu-hour-cost (and --gpus, or a fleet file) to price a round")
        if not self.regen.get("endpoints") and not self.regen.get("fleet"):
            raise UsageError("give the servers: --endpoint URL (repeatable) or --fleet FILE (repeatable)")

    def recorded(self) -> dict[str, Any]:
        """The options as ``repair.json`` records them (what a rerun must repeat)."""
        return {"tokenizer": self.tokenizer, "rounds": self.rounds, "budget_usd": self.budget_usd, "failed": self.failed,
                **({"plan": str(self.plan)} if self.plan else {}),
                **{f"regen.{k}": (list(v) if isinstance(v, tuple) else v) for k, v in sorted(self.regen.items())}}


@dataclass
class RepairResult:
    """How a repair ended. ``exit_code``: 0 NEW passes the gate, 1 samples still fail (NEW is
    written) or the gate fails; ``stop``: why the loop ended (``clean``, ``nothing regenerable``,
    ``rounds``, ``budget``, ``no progress``); ``still_failing``: rows failing in NEW's scan (by reason in
    ``failing_reasons``); ``spent_usd``: the rounds' cost; ``rounds``: repair.json's round records."""

    exit_code: int
    out: Path
    work: Path
    stop: str
    still_failing: int
    failing_reasons: dict[str, int]
    spent_usd: float
    gate_passed: bool
    rounds: list[dict[str, Any]]
    message: str = ""


def repair(dataset: str | Path, out: str | Path, options: RepairOptions, *, work: str | Path | None = None,
           log: Callable[[str], None] | None = None, force: bool = False) -> RepairResult:
    """Repair ``dataset`` into ``out`` (see the module docstring); returns a ``RepairResult``.

    Rerunning the same call after a crash or kill -9 continues where it stopped: finished steps
    are reused (repair.json), an open regen run resumes from its journal. Raises ``UsageError``
    for a bad option, ``InputError`` for a missing dataset, an ``out`` that is the dataset or
    exists (without ``force``, unless this repair wrote it), or a ``work`` folder of another
    repair; ``RegenStopped`` when a round's regen run stopped (rerun to resume); what the steps
    raise otherwise.
    """
    from dqa import api
    from dqa.audit.scan import ScanOptions, default_out_dir, reusable_scan

    options.check()
    if storage.is_url(out) or (work is not None and storage.is_url(work)):
        return _repair_into_store(dataset, out, options, work, log, force)
    say = log or (lambda msg: None)
    dataset, out = storage.location(dataset), Path(out)
    if not dataset.exists():
        raise InputError(f"{dataset}: no such file or folder")
    if str(out.resolve()) == storage.url_of(dataset):
        raise InputError(f"--out {out}: is the dataset itself; give a new path")
    wf = WorkFolder.open(work or default_work_dir(dataset), dataset, options.recorded())
    final = wf.state.get("final") or {}
    if out.exists() and not force and final.get("out") != str(out.resolve()):
        raise InputError(f"--out {out}: exists; give a new path or --force")
    ext = "" if dataset.is_dir() else "".join(dataset.suffixes[-1:])
    regen_opts = dict(options.regen)
    max_new = int(regen_opts.pop("max_new_tokens", 0) or 0) or None
    seed_base = int(regen_opts.pop("seed_base", 0) or 0)
    quiet_regen = dict(live=False, log=say)
    calibration = read_calibration(options.plan) if options.plan else None

    src, scan_dir = dataset, None
    stop, spent = "rounds", 0.0
    stalled = False  # the last round fixed none of the rows it sent
    not_started: dict[str, Any] | None = None  # the round the budget refused: its plan and why
    for k in range(1, options.rounds + 1):
        rec = wf.round(k)
        rdir = wf.round_dir(k)
        # 1. the round's scan: round 1 scans DATASET (or reuses its scan), later rounds have the last rescan
        if k == 1:
            if not wf.done(1, "scan"):
                reused = default_out_dir(dataset)
                if reusable_scan(dataset, reused, ScanOptions(tokenizer=options.tokenizer)):
                    scan_dir, how = reused, "reused"
                else:
                    scan_dir, how = rdir / "scan", "scanned"
                    api.scan(dataset, options.tokenizer, out=scan_dir)
                failing, reasons = _failing(scan_dir)
                wf.mark(1, "scan", input=str(dataset), scan=str(scan_dir), scan_was=how, selected=failing, selected_reasons=reasons)
            scan_dir = Path(rec["scan"])
        selected = int(rec["selected"])
        if selected == 0:
            stop = NOTHING_REGENERABLE if rec.get("held_back") else "clean"
            _drop_round(wf, k)
            break
        if stalled and not any(c.get("option") == "max_new_tokens" for c in rec.get("changes") or ()):
            stop = "no progress"
            _drop_round(wf, k)
            break
        # 2. the plan, and the budget
        if "regen" not in rec["done"]:
            mn = rec.get("max_new_tokens") or max_new
            turns = turns_to_regenerate(scan_dir, regen_opts.get("turns") or _default_turns()) if k == 1 else None
            plan = plan_round(selected, wf.state["rounds"][: k - 1], regen_opts, options.budget_usd, spent,
                              max_new_tokens=mn or _default_max_new(), calibration=calibration, turns=turns)
            say(f"round {k}: {selected:,} samples to regenerate; {plan.describe()}")
            if plan.over_budget:
                stop = "budget"
                not_started = {"round": k, "selected": selected, "scan": str(scan_dir), "plan": plan.as_dict(),
                               "plan_line": plan.describe(), "why": plan.describe_budget()}
                _drop_round(wf, k)
                say(f"round {k} not started: {plan.describe_budget()}")
                break
            wf.mark(k, "plan", plan=plan.as_dict(), max_new_tokens=mn, seed_base=seed_base + k - 1)
            # 3. regen the failing samples of the round's input, new seeds each round
            # rows that cannot fit are held back: the round reads the rescan's findings without them
            findings = write_selection(scan_dir, rec["held_back_rows"], rdir / SELECT_DIR) if rec.get("held_back_rows") else scan_dir
            kw = dict(regen_opts, findings=str(findings), failed_only=True, seed_base=seed_base + k - 1,
                      tokenizer=options.tokenizer)
            if mn:
                kw["max_new_tokens"] = mn
            result = api.regenerate(str(src), str(rdir / "regen"), **kw, **quiet_regen)
            p = result.progress
            wf.mark(k, "regen", regenerated_ok=p.get("ok", 0), regen_failed=p.get("failed", 0), cut=p.get("truncated", 0),
                    output_tokens=_output_tokens(p), elapsed_s=p.get("elapsed_s"), cost_usd=p.get("cost_so_far") or 0.0)
        # 4. merge into this round's set, 5. rescan it
        merged = rdir / f"merged{ext}"
        if "merge" not in rec["done"]:
            summary = api.merge(str(src), str(rdir / "regen"), str(merged), force=True)
            wf.mark(k, "merge", merged=str(merged), replaced=getattr(summary, "replaced", None))
        if "rescan" not in rec["done"]:
            api.scan(str(merged), options.tokenizer, out=rdir / "rescan")
            failing, reasons = _failing(rdir / "rescan")
            wf.mark(k, "rescan", still_failing=failing, still_failing_reasons=reasons)
        rec = wf.round(k)
        spent += float(rec.get("cost_usd") or 0.0)
        figures = regen_figures(rdir / "regen")
        if "cannot_fit" not in rec:
            wf.mark(k, "rescan", cannot_fit=figures.cannot_fit, cannot_fit_rows=list(figures.cannot_fit_rows), context=figures.context)
        held = held_back(wf.state["rounds"][:k], failing_rows(rdir / "rescan")) if rec["still_failing"] else {}
        regenerable = int(rec["still_failing"]) - len(held)
        stalled = regenerable >= selected
        say(f"round {k}: {rec['regenerated_ok']:,} regenerated ok, {rec['still_failing']:,} still failing"
            + (f" ({_reasons_text(rec['still_failing_reasons'])})" if rec["still_failing"] else "")
            + (f"; {figures.cannot_fit:,} cannot fit in {figures.context:,} tokens of context (cut at the servers' limit)"
               if figures.cannot_fit else "")
            + (f"; {len(held):,} held back (cannot fit), {regenerable:,} left to regenerate" if held else ""))
        src, scan_dir = merged, rdir / "rescan"
        if rec["still_failing"] > 0 and regenerable == 0:
            stop = NOTHING_REGENERABLE
            break
        if k < options.rounds and rec["still_failing"] > 0:
            nxt = wf.round(k + 1)
            if "scan" not in nxt["done"]:
                grow = figures.next_max_new(rec.get("max_new_tokens") or max_new or _default_max_new())
                facts: dict[str, Any] = dict(input=str(merged), scan=str(scan_dir), scan_was="rescan of round %d" % k,
                                             selected=regenerable, selected_reasons=_reasons_without(scan_dir, held) if held
                                             else rec["still_failing_reasons"], held_back=len(held), held_back_rows=list(held))
                if grow is not None:
                    facts["max_new_tokens"] = grow
                    facts["changes"] = [{"option": "max_new_tokens", "from": rec.get("max_new_tokens") or max_new or _default_max_new(),
                                         "to": grow, "why": f"{figures.cut:,} samples were cut by the length limit"}]
                facts["changes"] = facts.get("changes", []) + [{"option": "seed_base", "from": seed_base + k - 1, "to": seed_base + k,
                                                                "why": "new seeds for the samples still failing"}]
                wf.mark(k + 1, "scan", **facts)
        if rec["still_failing"] == 0:
            stop = "clean"
            break
    # the release: the last merged set (or the dataset itself when nothing ran), then the gate
    still, reasons = _failing(scan_dir) if scan_dir is not None else (0, {})
    if not (final.get("out") == str(out.resolve()) and final.get("written")):
        _write_release(src, out, scan_dir if options.failed == "drop" and still else None)
        wf.state["final"] = {"out": str(out.resolve()), "written": True, "source": str(src)}
        wf.save()
    gate = api.gate(str(out), tokenizer=options.tokenizer)
    kept = still if options.failed == "keep" else 0
    code = EXIT_OK if gate.passed and kept == 0 else EXIT_QUALITY
    failing_list = _failing_rows(scan_dir, wf.state["rounds"]) if still else []
    cannot_fit = sum(1 for r in failing_list if "note" in r)
    wf.state["final"].update(stop=stop, still_failing=still, still_failing_reasons=reasons, cannot_fit=cannot_fit,
                             still_failing_rows=failing_list, spent_usd=round(spent, 4), gate_passed=gate.passed, exit_code=code)
    wf.state["final"].pop("not_started", None)
    if not_started is not None:
        wf.state["final"]["not_started"] = not_started
    wf.state["status"] = "finished"
    wf.save()
    left = f", ${options.budget_usd - spent:,.2f} of the ${options.budget_usd:,.2f} budget left" if options.budget_usd is not None else ""
    msg = (f"{out}: gate {'passed' if gate.passed else 'failed'}; {len(wf.state['rounds'])} round(s), stopped: {stop}; "
           f"{still:,} samples still failing" + (f" ({_reasons_text(reasons)})" if still else "")
           + (f", {cannot_fit:,} of them cannot fit in the servers' context" if cannot_fit else "")
           + (" (dropped)" if still and options.failed == "drop" else "") + f"; spent ${spent:,.2f}{left}")
    return RepairResult(code, out, wf.path, stop, still, reasons, spent, gate.passed, wf.state["rounds"], msg)


def _default_max_new() -> int:
    from dqa.regen.config import DEFAULT_MAX_NEW_TOKENS

    return DEFAULT_MAX_NEW_TOKENS


def _default_turns() -> str:
    from dqa.regen.config import DEFAULT_TURNS

    return DEFAULT_TURNS


def _drop_round(wf: WorkFolder, k: int) -> None:
    """Forget round ``k``'s record when it never started (only its scan was carried over)."""
    rounds = wf.state["rounds"]
    if len(rounds) >= k and not set(rounds[k - 1]["done"]) - {"scan", "plan"}:
        del rounds[k - 1:]
        wf.save()


def _failing(scan_dir: Path) -> tuple[int, dict[str, int]]:
    """(failing rows, {reason: rows}) of a scan folder's findings."""
    import polars as pl

    f = pl.read_parquet(findings_file(scan_dir), columns=["reasons"])
    if f.height == 0:
        return 0, {}
    counts = f.explode("reasons").group_by("reasons").len().sort("len", descending=True)
    return f.height, {r: int(n) for r, n in counts.iter_rows() if r is not None}


def _failing_rows(scan_dir: Path, rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failing rows of a scan folder's findings: ``{row, id, reasons}`` each (id None without
    one), plus ``note`` "cannot fit in C tokens of context" for a row a round cut at the servers'
    context (held back from the rounds after it; C: that round's context)."""
    import polars as pl

    f = pl.read_parquet(findings_file(scan_dir))
    cols = [c for c in ("row", "id", "reasons") if c in f.columns]
    held = held_back(rounds, set(f["row"].to_list()))
    return [{"id": None, **r, **({"note": cannot_fit_note(held[r["row"]])} if r.get("row") in held else {})}
            for r in f.select(cols).to_dicts()]


def _reasons_without(scan_dir: Path, held: dict[int, Any]) -> dict[str, int]:
    """{reason: rows} of a scan folder's failing rows that are not ``held`` back."""
    import polars as pl

    f = pl.read_parquet(findings_file(scan_dir), columns=["row", "reasons"]).filter(~pl.col("row").is_in(list(held)))
    if f.height == 0:
        return {}
    counts = f.explode("reasons").group_by("reasons").len().sort(["len", "reasons"], descending=[True, False])
    return {r: int(n) for r, n in counts.iter_rows() if r is not None}


def _reasons_text(reasons: dict[str, int]) -> str:
    return ", ".join(f"{r} {n:,}" for r, n in reasons.items())


def _output_tokens(progress: dict[str, Any]) -> int:
    eps = progress.get("endpoints") or {}
    total = sum(int(e.get("output_tokens") or 0) for e in eps.values())
    return total or int((progress.get("mean_output_tokens") or 0) * (progress.get("ok", 0) + progress.get("truncated", 0)))


def _repair_into_store(dataset: str | Path, out: str | Path, options: RepairOptions, work: str | Path | None,
                       log: Callable[[str], None] | None, force: bool) -> RepairResult:
    """``repair`` with ``out`` and/or ``work`` in a store. The work folder is staged here from the store and
    published back, ``repair.json`` last, when the repair ends, also when it stops (a rerun resumes it; the
    paths repair.json records are this machine's staging paths). The release is written and gated here,
    then uploaded (``dqa.storage.output_path``)."""
    from dqa.repair.work import REPAIR_FILE, WorkFolder

    if storage.url_of(out) == storage.url_of(dataset):
        raise InputError(f"--out {storage.location(out)}: is the dataset itself; give a new path")
    target = storage.location(out)
    work_at = work if work is not None else default_work_dir(dataset)
    with contextlib.ExitStack() as stack:
        local_work = stack.enter_context(storage.output_folder(work_at, REPAIR_FILE, on_error=True))
        if isinstance(target, Path):
            return repair(dataset, target, options, work=local_work, log=log, force=force)
        recorded = (WorkFolder.peek(local_work).get("final") or {}).get("out")
        if target.exists() and not force and recorded != str(storage.staged_path(target)):
            raise InputError(f"--out {target}: exists in the store; give a new path or --force")
        kept = recorded == str(storage.staged_path(target)) and target.exists()  # a finished repair's release: gated again
        with storage.output_path(target, fetch=kept) as local_out:
            result = repair(dataset, local_out, options, work=local_work, log=log, force=True)
    result.out = target  # type: ignore[assignment]
    return result


def _write_release(src: Path, out: Path, drop_failing_of: Path | None) -> None:
    """Write the release ``out`` from ``src`` atomically: a copy, or (``drop_failing_of``: a scan
    folder of ``src``) the rows its findings do not flag, in ``src``'s format and file layout."""
    from dqa import atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    if drop_failing_of is not None:
        _write_without_failing(src, out, drop_failing_of)
        return
    if isinstance(src, storage.StorePath):  # nothing ran on a set in a store: the release is a copy of it
        import pyarrow.fs as pafs

        tmp = atomic.new_temp(out)
        tmp.unlink()
        with storage.store_errors(str(src)):
            pafs.copy_files(src.key, str(tmp), source_filesystem=src.fs, destination_filesystem=pafs.LocalFileSystem())
        if tmp.is_dir():
            atomic.replace_dir(tmp, out)
        else:
            tmp.replace(out)
        return
    if src.is_dir():
        tmp = atomic.new_temp(out)
        tmp.unlink()
        shutil.copytree(src, tmp)
        atomic.replace_dir(tmp, out)
        return
    with atomic.atomic_path(out) as tmp:
        shutil.copyfile(src, tmp)


def _write_without_failing(src: Path, out: Path, scan_dir: Path) -> None:
    """``src`` without the rows its scan's findings flag (rows count in dataset order over its
    files), in ``src``'s format and layout: any format ``dqa.audit.writers.DatasetWriter`` writes
    (parquet file or shards, Arrow, JSONL, a ``save_to_disk`` folder), batch by batch; conversation
    JSONL line by line, so each kept record is written back byte for byte."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dqa.audit.readers import open_dataset
    from dqa.audit.writers import DatasetWriter
    from dqa.regen.config import DEFAULT_MERGE_BATCH_ROWS

    bad = np.unique(pq.read_table(findings_file(scan_dir), columns=["row"]).column("row").to_numpy())
    ds = open_dataset(src)
    if ds.format == "conversations":
        _write_conversations_without(ds, out, bad)
        return
    with DatasetWriter(ds, out, force=True) as writer:
        start = 0
        for f, b in ds.record_batches(DEFAULT_MERGE_BATCH_ROWS):
            keep = ~np.isin(np.arange(start, start + b.num_rows), bad, assume_unique=True)
            writer.write(f, b.filter(pa.array(keep)))
            start += b.num_rows
        writer.commit()


def _write_conversations_without(ds: Any, out: Path, bad: Any) -> None:
    """Conversation JSONL ``ds`` (a file or a folder) at ``out`` without the records numbered in
    ``bad`` (non-blank lines, in file order), every other file of a folder copied as it is."""
    from dqa import atomic

    bad_rows = set(int(r) for r in bad)
    row = 0

    def kept_lines(f: Path) -> bytes:
        nonlocal row
        kept = []
        with open(f, "rb") as fh:
            for line in fh:
                if not line.strip():
                    continue
                if row not in bad_rows:
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
                row += 1
        return b"".join(kept)

    src = ds.path
    if not src.is_dir():
        with atomic.atomic_path(out) as tmp:
            tmp.write_bytes(kept_lines(src))
        return
    work = atomic.new_temp(out)
    work.unlink()
    shutil.copytree(src, work)
    for f in ds.files:
        (work / Path(f).resolve().relative_to(src.resolve())).write_bytes(kept_lines(Path(f)))
    atomic.replace_dir(work, out)


__all__ = ["repair", "RepairOptions", "RepairResult", "RoundPlan", "DEFAULT_ROUNDS", "cut_rows"]
