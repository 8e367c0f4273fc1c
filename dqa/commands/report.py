"""``dqa report``: one self-contained HTML file from a scan, a regen run and a validation."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from dqa.commands.common import handles_errors, storage_option_param
from dqa.errors import EXIT_OK


def report(
    scan_dir: Optional[str] = typer.Argument(None, help="A scan folder written by `dqa scan` (holds summary.json, metrics.parquet), "
                                             "or a `dqa repair` work folder (holds repair.json); a path or a URL (s3://...).", show_default=False),
    regen: Optional[str] = typer.Option(None, "--regen", "-r", help="A `dqa regen` output folder: throughput over time, progress."),
    validation: Optional[str] = typer.Option(None, "--validation", "-v",
                                              help="A `dqa validate` output folder, made from this scan. \\[default: the newest such one in SCAN_DIR]"),
    after: Optional[str] = typer.Option(None, "--after", "-a",
                                         help="A scan folder of the new release, for the 'after' histogram. \\[default: the regen outputs]"),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="The HTML file to write, a path or a URL. \\[default: SCAN_DIR/report.html]"),
    as_json: bool = typer.Option(False, "--json", help="Print {\"report\": PATH} on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing."),
    storage_option: List[str] = storage_option_param(),
) -> None:
    """Write a self-contained HTML report (one file, works offline, no scripts).

    Shows the supervised-token histogram before and after, the findings table, the top
    degenerate templates (decoded, escaped), regen throughput over time (from the shards'
    completed_at and output_tokens) and the expectation results with the gate verdict.
    Validations and gates in SCAN_DIR made from another scan (another dataset, or before a
    rescan) are skipped with a note; --validation or --regen of another dataset is refused.

    On a `dqa repair` work folder the report shows the rounds: a chart of failing samples per
    round, and per round the samples selected, regenerated ok, still failing by reason, output
    tokens, elapsed and cost, with the total (also printed as a table); its scan is the dataset's,
    its 'after' the last round's rescan. Where no round ran (the budget refused round 1), it shows
    what the folder holds: the refused round's plan, why it was not started and how the repair
    ended. Written to WORK/report.html by default.

    Example:  dqa report dqa-out/train --regen regen-out --after dqa-out/train-merged
    Example:  dqa report dqa-out/train-repair

    Exit codes: 0 written, 2 a missing or unreadable input, 3 could not write.
    """
    raise typer.Exit(_run(scan_dir, regen, validation, after, out, as_json, quiet, storage_option))


def _local(folder: Optional[str]) -> Optional[Path]:
    """A folder given to the report, local: a URL's local copy (``dqa.storage.input_folder``)."""
    from dqa.storage import input_folder

    return None if folder is None else input_folder(folder)


def _write(dest: str | Path, page: str) -> str:
    """Write the report to ``dest`` (a path, or a URL: written here, then uploaded as one object); returns what to show."""
    from dqa import atomic
    from dqa.storage import location, output_path

    with output_path(dest) as local:
        atomic.write_text(local, page)
    return str(location(dest))


@handles_errors
def _run(scan_dir, regen, validation, after, out, as_json, quiet, storage_option=()) -> int:
    from dqa import storage

    storage.configure(storage_option)
    if scan_dir is not None and out is None and storage.is_url(scan_dir):
        out = f"{str(storage.location(scan_dir)).rstrip('/')}/report.html"  # beside the scan, in its store
    scan_dir, regen, validation, after = _local(scan_dir), _local(regen), _local(validation), _local(after)
    from dqa.audit.scan_folder import read_summary
    from dqa.errors import UsageError
    from dqa.reports.html import load_inputs, render_report

    if scan_dir is None:
        raise UsageError("missing SCAN_DIR (a folder written by `dqa scan`; see dqa report --help)")
    from dqa.repair.work import REPAIR_FILE

    if (scan_dir / REPAIR_FILE).is_file():
        return _run_repair(scan_dir, regen, validation, after, out, as_json, quiet)
    summary = read_summary(scan_dir)
    vdir, notes = pick_validation(scan_dir, summary, validation)
    if regen is not None:
        check_regen_of(Path(regen), scan_dir, summary)
    inputs = load_inputs(scan_dir, regen, vdir, after)
    if vdir is None:  # every validation found was skipped: load_inputs' own search must not bring one back
        inputs.validation = inputs.validation_dir = inputs.gate = None
    inputs.notes.extend(notes)
    for note in notes:
        if not quiet:
            typer.echo(f"note: {note}", err=True)
    path = _write(out if out is not None else scan_dir / "report.html", render_report(inputs))
    if as_json:
        sys.stdout.write(json.dumps({"report": str(path)}) + "\n")
    elif not quiet:
        typer.echo(str(path))
    return EXIT_OK


def _run_repair(work: Path, regen, validation, after, out, as_json, quiet) -> int:
    """``dqa report WORK`` for a repair work folder: the HTML report with its rounds, and the rounds
    table on stdout. Where no round ran (the budget refused round 1, or the repair stopped before
    it), what the folder holds: the refused round's plan and why, how the repair stopped, above the
    dataset's scan when it is there. Raises ``InputError`` for an unreadable repair.json."""
    from rich.console import Console

    from dqa.audit.scan_folder import is_scan_folder
    from dqa.errors import InputError
    from dqa.reports.html import load_inputs, render_repair_only, render_report
    from dqa.reports.repair_rounds import not_started_lines, round_rows, stop_line, terminal_table
    from dqa.repair.work import REPAIR_FILE

    state = _read_json(work / REPAIR_FILE)
    if state is None:
        raise InputError(f"{work / REPAIR_FILE}: not a repair record (expected a JSON object)")
    rounds = state.get("rounds") or []
    first_scan = rounds[0].get("scan") if rounds else ((state.get("final") or {}).get("not_started") or {}).get("scan")
    rescans = [work / f"round-{r['round']}" / "rescan" for r in rounds if "rescan" in (r.get("done") or ())]
    repair = {**state, "work": str(work)}
    if first_scan and is_scan_folder(first_scan):
        inputs = load_inputs(Path(first_scan), regen, validation, after if after is not None else (rescans[-1] if rescans else None))
        if after is None and rescans:
            inputs.after_label = f"after round {len(rescans)} (its rescan)"
        inputs.repair = repair
        page = render_report(inputs)
    else:
        page = render_repair_only(repair)
    path = _write(out if out is not None else work / "report.html", page)
    if as_json:
        sys.stdout.write(json.dumps({"report": str(path)}) + "\n")
    elif not quiet:
        if round_rows(state):
            Console(soft_wrap=False).print(terminal_table(state))
            for line in not_started_lines(state):  # a later round the budget refused
                typer.echo(line)
        else:
            typer.echo(f"dqa repair · {state.get('dataset', '')}")
            for line in [*not_started_lines(state), stop_line(state)]:
                typer.echo(line)
        typer.echo(str(path))
    return EXIT_OK


def _read_json(path: Path) -> dict | None:
    """A JSON object from ``path``; None when the file is absent. Raises ``InputError`` when it is not JSON."""
    from dqa.errors import InputError

    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})") from None
    return data if isinstance(data, dict) else None


def validation_mismatch(vdir: Path, scan_summary: dict | None) -> str | None:
    """Why the validation in ``vdir`` (and the gate.json beside it, if any) was not made from the scan
    ``scan_summary``; None when it was, or when it records nothing to tell (written before dqa
    recorded scans). Raises ``InputError`` for unreadable JSON."""
    from dqa.audit.identity import output_scan_record, scan_mismatch

    records = [output_scan_record(_read_json(vdir / "summary.json"))]
    gate = _read_json(vdir.parent / "gate.json")  # the report shows the gate verdict beside the validation
    if gate is not None:
        records.append(output_scan_record(None, gate))
    return next((why for why in (scan_mismatch(r, scan_summary) for r in records) if why), None)


def find_validations(scan_dir: Path) -> list[Path]:
    """The validation folders inside a scan folder (``validation-*/``, ``gate/validation/``), newest first."""
    found = [p.parent for p in scan_dir.glob("validation*/summary.json")]
    found += [p.parent for p in scan_dir.glob("gate/validation/summary.json")]
    return sorted(found, key=lambda p: (p / "summary.json").stat().st_mtime, reverse=True)


def pick_validation(scan_dir: Path, scan_summary: dict | None, explicit: Path | None) -> tuple[Path | None, list[str]]:
    """The validation folder the report shows, and notes about the ones skipped.

    ``explicit`` (``--validation``) is refused when it was made from another scan (another
    dataset, or an earlier scan of this one): ``InputError`` naming it and the fix. Otherwise
    the newest validation inside SCAN_DIR made from this scan; the others found there that were
    not are skipped, each with a note ("not for this scan").
    """
    from dqa.errors import InputError

    if explicit is not None:
        explicit = Path(explicit)
        why = validation_mismatch(explicit, scan_summary) if explicit.is_dir() else None
        if why:
            raise InputError(f"--validation {explicit}: {why}, not for the scan in {scan_dir}: "
                             f"validate this scan (dqa validate {scan_dir}) or pass its folder")
        return explicit, []
    notes = []
    for vdir in find_validations(scan_dir):
        why = validation_mismatch(vdir, scan_summary)
        if why is None:
            return vdir, notes
        notes.append(f"{vdir} not shown: not for this scan ({why}); rerun dqa validate / dqa gate on {scan_dir}")
    return None, notes


def check_regen_of(regen: Path, scan_dir: Path, scan_summary: dict | None) -> None:
    """Refuse a regen folder whose run.json records another dataset than the scan in SCAN_DIR.

    Folders without run.json (or without ``dataset_path``) and scans that record no dataset are
    accepted. Raises ``InputError`` naming both datasets, or naming a malformed run.json."""
    from dqa.audit.identity import describe, recorded_dataset
    from dqa.errors import InputError

    from dqa.regen.store.folder import RunFolder

    run = RunFolder(regen).manifest() if regen.is_dir() else None
    theirs, mine = (run.dataset_path if run else None), recorded_dataset(scan_summary)
    if isinstance(theirs, str) and mine and theirs != mine:
        raise InputError(f"--regen {regen}: a regen run of {theirs}, but {scan_dir} is the scan of {describe(scan_summary)}: "
                         f"pass the scan of {theirs} as SCAN_DIR, or the regen folder of {mine}")


def register(app: typer.Typer) -> None:
    """Add ``report`` to the CLI."""
    app.command("report")(report)
