"""A dataset's identity, and the checks that keep one dataset's outputs apart from another's.

A dataset **is** its resolved path (a file or a folder): ``summary.json`` records it as
``dataset_path``. Its **content** at scan time is the ``files`` part of the scan
``fingerprint`` (``[path, size, mtime_ns]`` of every input file, see
``dqa.audit.scan.scan_fingerprint``); the whole fingerprint (files and scan options) says which
scan a metrics table came from. Validations and gates record that scan as ``scan``
(``scan_record``): ``{"folder", "dataset", "fingerprint"}``, the last a sha256 of the fingerprint.

The rules (FORMATS.md):

- a scan folder holds the scan of one dataset: ``dqa scan`` refuses a folder holding another
  dataset's scan (``check_scan_folder``) and the default folder is keyed by identity
  (``default_scan_dir``: ``dqa-out/<name>/`` for the first dataset of that name);
- outputs made from a scan (``validation-*/``, ``gate/``, ``report.html``) belong to that scan:
  a rescan with another fingerprint drops them (``derived_outputs``), and readers skip or refuse
  those whose recorded scan is not the current one (``scan_mismatch``);
- a scan's findings or metrics are used for a dataset only when the scan recorded that dataset
  and its files are unchanged (``check_scan_of``).

Scans written before ``dataset_path`` existed are recognised by their fingerprint's files
(``same_dataset``); what records nothing is taken as it is (the checks cannot tell).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

from dqa.audit.scan_folder import read_summary
from dqa.errors import InputError
from dqa.storage import location, url_of

DEFAULT_ROOT = Path("dqa-out")
DERIVED_FILES = ("report.html",)


# --- identity ------------------------------------------------------------------------------


def dataset_path(dataset: str | Path) -> str:
    """The dataset's identity: its absolute path with symlinks resolved (it need not exist), or its URL."""
    return url_of(dataset)


def files_fingerprint(files: Iterable[Path]) -> list[list[Any]]:
    """``[resolved path or URL, size, mtime_ns]`` of every file, in order: what the dataset held when read
    (for a store: the object's size and last-modified time from the listing, no data fetched).

    Raises ``OSError`` for a file that cannot be stat'ed.
    """
    out = []
    for f in files:
        loc = location(f)
        st = loc.stat()
        out.append([url_of(loc), st.st_size, st.st_mtime_ns])
    return out


def dataset_files(dataset: str | Path) -> list[Path]:
    """The input files of the dataset at ``dataset`` (as ``open_dataset`` finds them).

    Raises ``InputError`` for a missing path or an unknown format.
    """
    from dqa.audit.dataset_files import detect_files

    p = location(dataset)
    if not p.exists():
        raise InputError(f"{p}: no such file or folder")
    return detect_files(p)[1]


def fingerprint_digest(fingerprint: Any) -> str | None:
    """sha256 of a scan fingerprint (canonical JSON), or None when there is none."""
    if not isinstance(fingerprint, dict):
        return None
    text = json.dumps(fingerprint, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- what a scan folder records ------------------------------------------------------------


def recorded_dataset(summary: dict[str, Any] | None) -> str | None:
    """The dataset path a scan summary records (``dataset_path``, else an absolute ``dataset``); None if unknown."""
    if not summary:
        return None
    if isinstance(summary.get("dataset_path"), str):
        return summary["dataset_path"]
    given = summary.get("dataset")
    if isinstance(given, str) and Path(given).is_absolute():
        return dataset_path(given)
    return None


def recorded_files(summary: dict[str, Any] | None) -> list[list[Any]] | None:
    """The ``files`` of a scan summary's fingerprint, or None when it records none."""
    fp = (summary or {}).get("fingerprint")
    files = fp.get("files") if isinstance(fp, dict) else None
    return files if isinstance(files, list) else None


def describe(summary: dict[str, Any] | None) -> str:
    """The scanned dataset for a message: its recorded path, else the path as given, else 'an unknown dataset'."""
    return recorded_dataset(summary) or str((summary or {}).get("dataset") or "an unknown dataset")


def same_dataset(summary: dict[str, Any] | None, dataset: str | Path) -> bool | None:
    """Whether the scan summarised by ``summary`` is a scan of ``dataset``; None when it cannot tell.

    Compares the recorded ``dataset_path``; for older summaries without it, the fingerprint's
    files (the dataset file itself, or files under the dataset folder).
    """
    me = dataset_path(dataset)
    recorded = recorded_dataset(summary)
    if recorded is not None:
        return recorded == me
    files = recorded_files(summary)
    if not files:
        return None
    paths = [Path(str(f[0])) for f in files if isinstance(f, list) and f]
    return bool(paths) and all(str(p) == me or Path(me) in p.parents for p in paths)


def files_change(before: list[list[Any]], after: list[list[Any]]) -> str | None:
    """How the files changed between two ``files_fingerprint`` lists, in a few words; None when equal."""
    old = {str(f[0]): f[1:] for f in before if isinstance(f, list) and f}
    new = {str(f[0]): f[1:] for f in after}
    if old == new:
        return None
    for path in sorted(old.keys() | new.keys()):
        if path not in new:
            return f"{path} is gone"
        if path not in old:
            return f"{path} is new"
        if old[path] != new[path]:
            return f"{path} was modified"
    return "its files differ"


# --- scan folders --------------------------------------------------------------------------


def candidate_dirs(dataset: str | Path, root: Path = DEFAULT_ROOT) -> list[Path]:
    """The default scan folders a dataset may use, in order of preference.

    ``root/<name>`` (``train.v2.parquet`` -> ``train.v2``), ``root/<parent folder>-<name>``
    (``release/example.parquet`` -> ``release-example``), ``root/<name>-<8 hex digits of the
    path's sha256>``.
    """
    from dqa.audit.readers import dataset_name

    name = dataset_name(dataset)
    me = dataset_path(dataset)
    parent = Path(me).parent.name
    tag = hashlib.sha256(me.encode("utf-8")).hexdigest()[:8]
    out = [root / name]
    if parent:
        out.append(root / f"{parent}-{name}")
    out.append(root / f"{name}-{tag}")
    return out


def default_scan_dir(dataset: str | Path, root: Path = DEFAULT_ROOT) -> Path:
    """The scan folder of ``dataset`` by default: the first candidate (``candidate_dirs``) that holds
    a scan of this dataset, else the first that holds no other dataset's scan.

    The first dataset of a name gets ``dqa-out/<name>/``; another one of the same name, scanned
    while that folder holds the first one's scan, gets the next candidate. Never raises.
    """
    cands = candidate_dirs(dataset, root)
    verdicts = [same_dataset(read_summary(c), dataset) for c in cands]
    for c, same in zip(cands, verdicts):
        if same is True:
            return c
    for c, same in zip(cands, verdicts):
        if same is not False:
            return c
    return cands[-1]


def check_scan_folder(out: Path, dataset: str | Path, summary: dict[str, Any] | None, option: str = "--out") -> None:
    """Refuse to write the scan of ``dataset`` into ``out`` when ``out`` holds another dataset's scan.

    ``summary`` is ``out``'s current ``summary.json`` (None when there is none); ``option`` the
    command's option for the scan folder. A rescan of the same dataset (even with new content)
    is allowed. Raises ``InputError`` naming both datasets and a folder to use instead.
    """
    if same_dataset(summary, dataset) is not False:
        return
    suggest = default_scan_dir(dataset)
    if suggest.resolve() == out.resolve():
        suggest = candidate_dirs(dataset)[-1]
    raise InputError(
        f"{out}/ holds the scan of {describe(summary)}, not {dataset}: pass {option} DIR (e.g. {suggest})"
    )


def derived_outputs(folder: Path) -> list[str]:
    """Names of the entries of a scan folder that were made from its scan: validation folders
    (``validation.json`` inside), gate folders (``gate.json`` inside) and ``report.html``."""
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.iterdir()):
        if p.is_dir() and ((p / "validation.json").is_file() or (p / "gate.json").is_file()):
            out.append(p.name)
        elif p.is_file() and p.name in DERIVED_FILES:
            out.append(p.name)
    return out


def check_scan_of(folder: Path, summary: dict[str, Any] | None, dataset: str | Path, what: str, fix: str) -> None:
    """Refuse the scan in ``folder`` as the scan of ``dataset`` when it records another dataset, or
    when the dataset's files changed since (size or mtime of a file, a file added or gone).

    ``what`` names the thing refused (``findings``, ``metrics``), ``fix`` the option that points
    elsewhere (``--findings DIR``). A summary that records neither is accepted (nothing to
    compare). Raises ``InputError`` naming the folder, both datasets and the fix.
    """
    if same_dataset(summary, dataset) is False:
        raise InputError(
            f"{folder}: {what} of {describe(summary)}, not of {dataset}: scan it (dqa scan {dataset}) and pass {fix} of that scan"
        )
    before = recorded_files(summary)
    if before is None:
        return
    try:
        now = files_fingerprint(dataset_files(dataset))
    except OSError as exc:
        raise InputError(f"{dataset}: cannot read ({exc.strerror or exc})") from None
    change = files_change(before, now)
    if change is not None:
        raise InputError(
            f"{folder}: {what} of an earlier state of {dataset} ({change} since the scan): rescan it (dqa scan {dataset} --out {folder})"
        )


# --- what validations and gates record -----------------------------------------------------


def scan_record(folder: Path, summary: dict[str, Any] | None) -> dict[str, Any]:
    """What a validation or gate records about the scan it was made from: ``folder`` (absolute),
    ``dataset`` (the recorded dataset path, or None) and ``fingerprint`` (sha256, or None)."""
    return {
        "folder": str(Path(folder).resolve()),
        "dataset": recorded_dataset(summary),
        "fingerprint": fingerprint_digest((summary or {}).get("fingerprint")),
    }


def scan_mismatch(record: Any, summary: dict[str, Any] | None) -> str | None:
    """Why an output made from the scan ``record`` (see ``scan_record``) is not an output of the scan
    ``summary``: another dataset, or an earlier scan of it. None when it is, or when either side
    records too little to tell."""
    if not isinstance(record, dict):
        return None
    mine, theirs = recorded_dataset(summary), record.get("dataset")
    if mine and theirs and mine != theirs:
        return f"made from the scan of {theirs}, not of {mine}"
    fp_mine, fp_theirs = fingerprint_digest((summary or {}).get("fingerprint")), record.get("fingerprint")
    if fp_mine and fp_theirs and fp_mine != fp_theirs:
        return f"made from an earlier scan of {mine or theirs or 'this dataset'} (the scan was redone since)"
    return None


def output_scan_record(validation: dict[str, Any] | None, gate: dict[str, Any] | None = None) -> Any:
    """The scan record of a validation ``summary.json`` or a ``gate.json`` (gate first); None if neither has one."""
    for doc in (gate, validation, (gate or {}).get("validation")):
        if isinstance(doc, dict) and isinstance(doc.get("scan"), dict):
            return doc["scan"]
    return None
