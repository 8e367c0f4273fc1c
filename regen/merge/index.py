"""The shard index: which dataset rows the regen runs replaced, and where each replacement lives.

``load_regen_index`` reads the small columns of every shard under each ``DIR/shards`` (row,
status, turn, id, error) and decides per conversation what the merge does (replace it, or list it
as not regenerated, with the reason); ``read_run_selection`` and ``run_columns`` read what each
run's ``run.json`` recorded (the rows it selected, the column options it was given);
``check_rows_in_range`` refuses an index made from another dataset. The shards' token columns are
read later, a row group at a time, by the merge that needs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dqa.audit.token_columns import is_int_list
from dqa.errors import InputError, RuntimeFailure
from dqa.regen.merge.columns import as_strings
from dqa.regen.merge.options import DEFAULT_ACCEPT
from dqa.regen.store.folder import RunFolder, RunManifest
from dqa.regen.store.shards import STATUSES, ShardStatus

_LENGTH, _FAILED = ShardStatus.LENGTH.code, ShardStatus.FAILED.code


@dataclass
class RegenIndex:
    """Where each regenerated row lives, sorted by dataset row.

    ``rows`` int64 (sorted, unique), ``status`` int8 (0 ok, 1 length, 2 failed), ``file`` /
    ``group`` / ``offset``: shard file index, row group and position inside it. ``ids`` and
    ``errors`` are string arrays aligned with ``rows`` (null when absent).
    """

    files: list[Path]
    rows: np.ndarray
    status: np.ndarray
    file: np.ndarray
    group: np.ndarray
    offset: np.ndarray
    ids: pa.Array
    errors: pa.Array
    selected: np.ndarray | None  # rows the runs meant to regenerate (sorted), when run.json says
    selection_notes: list[str] = field(default_factory=list)  # per folder: where the selection came from
    dataset_rows: int | None = None  # the row count of the dataset the runs read (run.json)

    @property
    def last_use(self) -> dict[tuple[int, int], int]:
        """For each (file, group) holding replacement rows: the largest dataset row it serves."""
        rep = self.status != _FAILED
        keys = self.file[rep].astype(np.int64) << 32 | self.group[rep].astype(np.int64)
        out: dict[tuple[int, int], int] = {}
        if keys.size:
            uniq, last = _group_max(keys, self.rows[rep])
            out = {(int(k >> 32), int(k & 0xFFFFFFFF)): int(r) for k, r in zip(uniq, last)}
        return out


def _group_max(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((values, keys))
    k, v = keys[order], values[order]
    ends = np.flatnonzero(np.append(k[1:] != k[:-1], True))
    return k[ends], v[ends]


def _shard_files(d: Path) -> list[Path]:
    if not d.exists():
        raise InputError(f"--regen {d}: no such folder")
    if not d.is_dir():
        raise InputError(f"--regen {d}: not a folder (expected the --out folder of dqa regen)")
    shards = d / "shards"
    if not shards.is_dir():
        raise InputError(f"--regen {d}: no shards/ folder (expected the --out folder of dqa regen)")
    return sorted(p for p in shards.glob("*.parquet") if not p.name.startswith("."))


@dataclass
class RunSelection:
    """What ``DIR/run.json`` says about the run: the rows it selected (None when they cannot be
    reconstructed, with ``note`` saying why) and the dataset row count it was made for."""

    rows: np.ndarray | None
    dataset_rows: int | None
    note: str


def read_manifest(d: Path) -> RunManifest | None:
    """``d/run.json``; None when missing. Raises ``InputError`` when it is not a run.json (not JSON,
    not an object, a key of the wrong type, a newer version)."""
    return RunFolder(Path(d)).manifest()


def read_run_selection(d: Path) -> RunSelection:
    """Reconstruct the rows ``dqa regen`` selected in folder ``d`` from its ``run.json``.

    run.json records the findings file (an absolute path), ``--reasons``, ``--shard``,
    ``--limit`` and ``identity.selection.rows_sha256`` (``selection_digest`` of the selected
    rows before shard and limit); the selection is recomputed with
    ``dqa.regen.jobs.rows`` and accepted only when the digest matches (the findings file may
    have been rescanned since). Never raises for a missing or changed findings file: the
    result then has ``rows=None`` and a ``note``. Raises ``InputError`` when run.json exists
    but is malformed.
    """
    run = RunFolder(Path(d)).run_json
    manifest = read_manifest(d)
    if manifest is None:
        return RunSelection(None, None, f"{run}: missing; only failed shard rows are listed")
    sel, ds_rows = manifest.selection, manifest.dataset_rows
    if sel is None or ds_rows is None:
        return RunSelection(None, ds_rows, f"{run}: no selection recorded; only failed shard rows are listed")
    from dqa.regen.config import parse_shard
    from dqa.regen.jobs.rows import narrow, selected_rows, selection_digest

    failed_only = bool(sel.get("failed_only", True))
    findings = Path(manifest.findings) if failed_only and manifest.findings else None
    if failed_only:
        if findings is None:
            return RunSelection(None, ds_rows, f"{run}: no findings path recorded; only failed shard rows are listed")
        if not findings.exists():
            return RunSelection(None, ds_rows, f"{findings}: findings of the run not found; only failed shard rows are listed")
    try:
        everything = selected_rows(ds_rows, findings, failed_only, sel.get("reasons") or None)
        if sel.get("rows_sha256") and selection_digest(everything) != sel["rows_sha256"]:
            return RunSelection(None, ds_rows, f"{findings}: changed since the run (rescanned?); only failed shard rows are listed")
        rows = narrow(everything, parse_shard(sel.get("shard")), manifest.limit)
    except InputError as exc:
        return RunSelection(None, ds_rows, f"selection of the run not reconstructed ({exc}); only failed shard rows are listed")
    return RunSelection(np.asarray(rows, dtype=np.int64), ds_rows, f"{run}: {rows.size} rows selected")


COLUMN_KEYS = ("ids", "mask", "labels", "id")


def run_columns(dirs: Iterable[Path]) -> dict[str, str | None]:
    """The column overrides given to ``dqa regen`` (run.json ``columns``: ``ids``, ``mask``,
    ``labels``, ``id``; None where none was given). Raises ``InputError`` when the folders'
    runs were given different ones."""
    found: dict[str, str | None] | None = None
    for d in dirs:
        manifest = read_manifest(Path(d))
        mine = {k: (manifest.column(k) if manifest else None) for k in COLUMN_KEYS}
        if found is not None and mine != found:
            raise InputError(f"--regen {d}: its run was given other column options ({mine}) than the other folders' ({found})")
        found = mine
    return found or dict.fromkeys(COLUMN_KEYS)


def load_regen_index(dirs: Iterable[Path], accept: Iterable[str] = DEFAULT_ACCEPT) -> RegenIndex:
    """Read the ``row``/``status``/``id``/``error`` (and ``turn``/``turns``) columns of every shard
    under each ``DIR/shards``, and decide per dataset row (conversation) what the merge does.

    A conversation is replaced by the record of its final assistant turn (prompt: the regenerated
    history; output: the final turn) when every turn it regenerated finished ``ok``, or the final one
    ``length`` and ``accept`` holds ``length``. Otherwise it counts as not regenerated, with the
    reason in ``errors`` (status 2): a failed turn, a length cut not accepted, or a conversation the
    run has not finished (rerun dqa regen to resume it).

    Raises ``InputError`` for a missing folder, an unreadable or truncated shard, a shard
    lacking a required column, null or negative rows, or an unknown status; and
    ``RuntimeFailure`` when a row (a turn of a row) appears twice.
    """
    accept = frozenset(accept)
    import pyarrow.parquet as pq

    files: list[Path] = []
    parts: dict[str, list[Any]] = {k: [] for k in ("rows", "status", "file", "group", "offset", "ids", "errors", "turn", "turns")}
    selections: list[np.ndarray] = []
    notes: list[str] = []
    dataset_rows: set[int] = set()
    for d in dirs:
        d = Path(d)
        shard_files = _shard_files(d)
        run = read_run_selection(d)
        notes.append(run.note)
        if run.rows is not None:
            selections.append(run.rows)
        if run.dataset_rows is not None:
            dataset_rows.add(run.dataset_rows)
        for p in shard_files:
            try:
                pf = pq.ParquetFile(p)
                names = set(pf.schema_arrow.names)
                for col in ("row", "status", "input_ids", "loss_mask"):
                    if col not in names:
                        raise InputError(f"{p}: regen shard lacks column {col!r} (see FORMATS.md)")
                st = pf.schema_arrow
                if not pa.types.is_integer(st.field("row").type):
                    raise InputError(f"{p}: column 'row' must be integers, found {st.field('row').type}")
                if not is_int_list(st.field("input_ids").type):
                    raise InputError(f"{p}: column 'input_ids' must be a list of integers, found {st.field('input_ids').type}")
                if not is_int_list(st.field("loss_mask").type, allow_bool=True):
                    raise InputError(f"{p}: column 'loss_mask' must be a list of 0/1, found {st.field('loss_mask').type}")
                cols = ["row", "status"] + [c for c in ("id", "error", "turn", "turns") if c in names]
                t = pf.read(columns=cols)
            except InputError:
                raise
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise InputError(f"{p}: unreadable or truncated regen shard ({' '.join(str(exc).split())[:160]})") from None
            fi = len(files)
            files.append(p)
            rows = t.column("row").combine_chunks()
            if rows.null_count:
                raise InputError(f"{p}: null in column 'row'")
            rows_np = rows.to_numpy().astype(np.int64)
            if rows_np.size and rows_np.min() < 0:
                raise InputError(f"{p}: negative row {int(rows_np.min())}")
            status = t.column("status").combine_chunks().cast(pa.string())
            code = np.full(len(rows_np), -1, dtype=np.int8)
            for i, name in enumerate(STATUSES):
                code[pc.fill_null(pc.equal(status, name), False).to_numpy(zero_copy_only=False)] = i
            if (code < 0).any():
                j = int(np.flatnonzero(code < 0)[0])
                raise InputError(f"{p}: row {int(rows_np[j])}: status {status[j].as_py()!r} (expected ok, length or failed)")
            sizes = np.array([pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)], dtype=np.int64)
            starts = np.concatenate(([0], np.cumsum(sizes)))
            pos = np.arange(len(rows_np), dtype=np.int64)
            grp = np.searchsorted(starts, pos, side="right") - 1
            parts["rows"].append(rows_np)
            parts["status"].append(code)
            parts["file"].append(np.full(len(rows_np), fi, dtype=np.int32))
            parts["group"].append(grp.astype(np.int32))
            parts["offset"].append(pos - starts[grp])
            parts["ids"].append(as_strings(t.column("id")) if "id" in t.column_names else pa.nulls(len(rows_np), pa.string()))
            parts["errors"].append(as_strings(t.column("error")) if "error" in t.column_names else pa.nulls(len(rows_np), pa.string()))
            n_rec = len(rows_np)
            if "turn" in t.column_names and "turns" in t.column_names:
                parts["turn"].append(pc.fill_null(t.column("turn").combine_chunks(), 0).to_numpy(zero_copy_only=False).astype(np.int64))
                parts["turns"].append(pc.fill_null(t.column("turns").combine_chunks(), 1).to_numpy(zero_copy_only=False).astype(np.int64))
            else:  # shards of runs before multi-turn: one record per row, its final turn
                parts["turn"].append(np.zeros(n_rec, np.int64))
                parts["turns"].append(np.ones(n_rec, np.int64))
    rows = np.concatenate(parts["rows"]) if parts["rows"] else np.zeros(0, np.int64)
    turn = np.concatenate(parts["turn"]) if parts["turn"] else np.zeros(0, np.int64)
    turns = np.concatenate(parts["turns"]) if parts["turns"] else np.zeros(0, np.int64)
    order = np.lexsort((turn, rows))
    rows, turn, turns = rows[order], turn[order], turns[order]
    file_ = np.concatenate(parts["file"])[order] if parts["file"] else np.zeros(0, np.int32)
    dup = np.flatnonzero((rows[1:] == rows[:-1]) & (turn[1:] == turn[:-1]))
    if dup.size:
        j = int(dup[0])
        a, b = files[int(file_[j])], files[int(file_[j + 1])]
        where = a.name if a == b else f"{a} and {b}"
        what = f"row {int(rows[j])}" if turns[j] <= 1 else f"turn {int(turn[j])} of row {int(rows[j])}"
        raise RuntimeFailure(
            f"regen shards hold {what} twice ({where}); refusing to pick one (the regen run broke exactly-once)"
        )
    status = np.concatenate(parts["status"])[order] if parts["status"] else np.zeros(0, np.int8)
    errors = pa.concat_arrays(parts["errors"]).take(pa.array(order)) if parts["errors"] else pa.nulls(0, pa.string())
    ids = pa.concat_arrays(parts["ids"]).take(pa.array(order)) if parts["ids"] else pa.nulls(0, pa.string())
    # One entry per conversation: its last record (the conversation stops at the first turn not ok).
    last = np.flatnonzero(np.r_[rows[1:] != rows[:-1], True]) if rows.size else np.zeros(0, np.int64)
    first = np.r_[0, last[:-1] + 1] if rows.size else np.zeros(0, np.int64)
    code, reasons = _conversation_verdicts(status, turn, turns, errors, first, last, accept)
    selected = np.unique(np.concatenate(selections)) if selections else None
    if len(dataset_rows) > 1:
        raise InputError(f"the --regen folders were made from datasets of different sizes ({sorted(dataset_rows)} rows)")
    return RegenIndex(
        files=files,
        rows=rows[last],
        status=code,
        file=file_[last],
        group=(np.concatenate(parts["group"])[order] if parts["group"] else np.zeros(0, np.int32))[last],
        offset=(np.concatenate(parts["offset"])[order] if parts["offset"] else np.zeros(0, np.int64))[last],
        ids=ids.take(pa.array(last, pa.int64())),
        errors=reasons,
        selected=selected,
        selection_notes=notes,
        dataset_rows=dataset_rows.pop() if dataset_rows else None,
    )


def _conversation_verdicts(status: np.ndarray, turn: np.ndarray, turns: np.ndarray, errors: pa.Array, first: np.ndarray,
                           last: np.ndarray, accept: frozenset[str]) -> tuple[np.ndarray, pa.Array]:
    """Per conversation (records ``first[i] .. last[i]``, in turn order): the merge's status code
    (ok, length: replaced; failed: not regenerated) and, for the latter, the reason."""
    n = last.size
    code = np.empty(n, dtype=np.int8)
    reasons: list[str | None] = [None] * n
    err = errors.to_pylist()
    for i in range(n):
        j = int(last[i])
        st, t, ts = int(status[j]), int(turn[j]), int(turns[j])
        where = f"turn {t}: " if ts > 1 else ""
        if st == _FAILED:
            code[i] = _FAILED
            reasons[i] = f"{where}regeneration failed: {err[j]}" if err[j] is not None else f"{where}regeneration failed"
        elif t < ts - 1:
            code[i] = _FAILED
            if st == _LENGTH:
                reasons[i] = f"turn {t} cut by the length limit (status length); its later turns were not regenerated"
            else:
                reasons[i] = (f"conversation not finished: turns {int(turn[int(first[i])])}..{t} of {ts} regenerated; "
                              "rerun the same dqa regen command to resume it")
        elif st == _LENGTH and ShardStatus.LENGTH.value not in accept:
            code[i] = _FAILED
            reasons[i] = f"{where}cut by the length limit (status length); --accept ok,length would use it"
        else:
            code[i] = st
    return code, pa.array(reasons, pa.string())


def check_rows_in_range(index: RegenIndex, total: int, path: Path) -> None:
    """Raise ``InputError`` unless ``index`` fits the dataset at ``path`` of ``total`` rows: the runs
    read a dataset of that many rows (run.json), and no shard row or selected row lies beyond it."""
    if index.dataset_rows is not None and index.dataset_rows != total:
        raise InputError(
            f"regen run.json: the run read a dataset of {index.dataset_rows} rows but {path} has {total} "
            "(regen output of another dataset?)"
        )
    if index.rows.size and index.rows[-1] >= total:
        shard = index.files[int(index.file[-1])]
        raise InputError(
            f"{shard}: row {int(index.rows[-1])} is beyond the dataset {path} ({total} rows; regen output of another dataset?)"
        )
    if index.selected is not None and index.selected.size and index.selected[-1] >= total:
        raise InputError(f"regen run.json selects row {int(index.selected[-1])} but the dataset {path} has {total} rows")

