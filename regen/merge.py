"""Merge regenerated samples back into a dataset: ``dqa merge DATASET --regen DIR --out NEW``.

What it writes
    ``NEW`` is a copy of DATASET in the same format and file layout (see
    ``dqa.audit.writers``) where every conversation that ``dqa regen`` completed replaces its
    original: every turn the run regenerated finished ``ok`` (``accept`` may also take a final
    turn cut by the length limit, status ``length``; the default, ``ok``, keeps the original):

    - the ids column gets the final turn's shard ``input_ids`` (the regenerated history +
      the output), plus the template's post-end-of-turn tokens when the input trains them;
    - the mask is rebuilt in the input's own convention (``Convention``: the scan's
      ``conventions``, else detected from the input; the chat format from run.json's
      ``tokenizer``): every assistant turn trained or only the last, the newline after end
      of turn trained or not, an untrained ``<think>\n`` in the header. Without a chat format
      (shards with no run.json) the shard's mask is used (0 over the prompt, 1 over the output);
    - the supervision column, in the input's convention and value type: ``loss_mask`` gets
      that mask; ``labels`` gets the id where the mask is 1, else -100 (both are
      rewritten when the input has both);
    - an ``attention_mask`` column, when present, becomes all ones of the new length;
    - a token column stored as one ``[1, L]`` list per row (``list<list<int>>``, SpecForge's
      ``datasets`` cache) is written back in that layout, so NEW keeps the input's schema;
    - every other column is kept as it was (an ``id``, a ``messages`` column, ...);
    - a provenance column ``dqa_regen`` is added: a struct of ``endpoint``, ``model``,
      ``finish_reason``, ``status``, ``sampling`` (JSON text) and ``completed_at``
      (timestamp, UTC), null for rows that were not replaced. In JSONL it is the same
      object as JSON text, and the text ``null`` for untouched rows: JSONL readers infer a
      column's type from the first rows and reject a null column that later holds objects.
      Where the token columns are ``[1, L]`` lists it is the same JSON text (null for
      untouched rows): such a dataset is read as torch tensors (SpecForge calls
      ``set_format(type="torch")``), which cannot hold a timestamp.
      Merging a merged dataset keeps the earlier provenance of rows it does not replace.

    Rows keep their order. Rows that could not be regenerated — a turn with shard status
    ``failed``, a length cut not accepted (or before the final turn: the conversation stopped
    there), a conversation the run has not finished, or selected for the run (``run.json``'s
    selection) but absent from the shards — keep their original (``--failed keep``, the
    default) or are left out (``--failed drop``).

    Conversation JSONL input is written back as conversation JSONL (``_merge_conversations``):
    each regenerated assistant turn gets its new ``content`` and ``reasoning_content``.

The report
    ``NEW.merge-report.json`` next to NEW (also when NEW is a folder: a file inside a
    dataset folder could be taken for data) lists each row that could not be regenerated
    with ``row``, ``id`` and ``reason``, plus the counts of ``MergeSummary``. It is staged
    with NEW and renamed into place right after it (an earlier report is removed before NEW
    is replaced), so a report never describes a NEW that is not there.

Safety
    The input is streamed in batches (memory: one batch plus the shard row groups that the
    current batch needs). Before replacing a row the merge checks that the shard's ``id``
    (when both have one) and its prompt tokens (``input_ids[:prompt_len]``) match the
    dataset row (multi-turn: its first ``kept_len`` tokens, before the first regenerated turn),
    so shards of another dataset are refused. NEW is built under a temporary
    name and renamed into place at the end: a crash leaves no NEW.

Errors
    ``InputError`` (exit 2): missing regen folder or shards, an unreadable or truncated
    shard, a shard row beyond the dataset, an id or prompt mismatch, NEW existing without
    ``force``, NEW being the input. ``RuntimeFailure`` (exit 3): a row present twice in the
    shards (the run broke its exactly-once promise; the merge will not pick one).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dqa.arrays import ranks as _ranks
from dqa.audit import formats
from dqa.audit.readers import IGNORE_INDEX, _is_int_list, flatten_token_lists, is_nested_list, nest_token_lists
from dqa.errors import InputError, RuntimeFailure
from dqa.regen.store.folder import RunFolder, RunManifest
from dqa.regen.store.shards import STATUSES, ShardStatus

PROVENANCE_COLUMN = "dqa_regen"
PROVENANCE_TYPE = pa.struct(
    [
        ("endpoint", pa.string()),
        ("model", pa.string()),
        ("finish_reason", pa.string()),
        ("status", pa.string()),
        ("sampling", pa.string()),
        ("completed_at", pa.timestamp("us", tz="UTC")),
    ]
)
_OK, _LENGTH, _FAILED = ShardStatus.OK.code, ShardStatus.LENGTH.code, ShardStatus.FAILED.code
REPORT_SUFFIX = ".merge-report.json"
ACCEPT_CHOICES = (ShardStatus.OK.value, ShardStatus.LENGTH.value)
DEFAULT_ACCEPT = (ShardStatus.OK.value,)
CACHE_BYTES = 1 << 30  # shard row groups held at once, beyond those the current batch needs
_SHARD_DATA_COLUMNS = ("input_ids", "loss_mask", "prompt_len", "kept_len", "id") + tuple(f.name for f in PROVENANCE_TYPE)


@dataclass
class MergeSummary:
    """What a merge did. ``kept``/``dropped`` count rows that could not be regenerated."""

    dataset: str
    regen: list[str]
    output: str
    report: str
    format: str
    failed_policy: str
    accept: str = "ok"
    convention: dict[str, Any] | None = None  # how replaced rows were masked (None: as the shards hold them)
    rows_in: int = 0
    rows_out: int = 0
    replaced: int = 0
    truncated: int = 0
    unregenerated: int = 0
    kept: int = 0
    dropped: int = 0
    untouched: int = 0
    elapsed_s: float = 0.0
    selection: list[str] = field(default_factory=list)  # per regen folder: where the selected rows came from
    unregenerated_rows: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def as_dict(self, with_rows: bool = False) -> dict[str, Any]:
        d = asdict(self)
        rows = d.pop("unregenerated_rows")
        if with_rows:
            d["unregenerated_rows"] = rows
        return d


def report_path(out: Path) -> Path:
    """Where the merge report of output ``out`` goes: ``NEW.merge-report.json`` beside it."""
    return out.parent / (out.name + REPORT_SUFFIX)


# --- the regen shards -----------------------------------------------------------------------


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


def _read_manifest(d: Path) -> RunManifest | None:
    """``d/run.json``; None when missing. Raises ``InputError`` when it is not a run.json (not JSON,
    not an object, a key of the wrong type, a newer version)."""
    return RunFolder(Path(d)).manifest()


def read_run_selection(d: Path) -> RunSelection:
    """Reconstruct the rows ``dqa regen`` selected in folder ``d`` from its ``run.json``.

    run.json records the findings file (an absolute path), ``--reasons``, ``--shard``,
    ``--limit`` and ``identity.selection.rows_sha256`` (``selection_digest`` of the selected
    rows before shard and limit); the selection is recomputed with
    ``dqa.regen.selection`` and accepted only when the digest matches (the findings file may
    have been rescanned since). Never raises for a missing or changed findings file: the
    result then has ``rows=None`` and a ``note``. Raises ``InputError`` when run.json exists
    but is malformed.
    """
    run = RunFolder(Path(d)).run_json
    manifest = _read_manifest(d)
    if manifest is None:
        return RunSelection(None, None, f"{run}: missing; only failed shard rows are listed")
    sel, ds_rows = manifest.selection, manifest.dataset_rows
    if sel is None or ds_rows is None:
        return RunSelection(None, ds_rows, f"{run}: no selection recorded; only failed shard rows are listed")
    from dqa.regen.jobs.rows import narrow, parse_shard, selected_rows, selection_digest

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
        manifest = _read_manifest(Path(d))
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
                if not _is_int_list(st.field("input_ids").type):
                    raise InputError(f"{p}: column 'input_ids' must be a list of integers, found {st.field('input_ids').type}")
                if not _is_int_list(st.field("loss_mask").type, allow_bool=True):
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
            parts["ids"].append(_as_strings(t.column("id")) if "id" in t.column_names else pa.nulls(len(rows_np), pa.string()))
            parts["errors"].append(_as_strings(t.column("error")) if "error" in t.column_names else pa.nulls(len(rows_np), pa.string()))
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


def _as_strings(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col if col.type == pa.string() else col.cast(pa.string())


class _GroupCache:
    """Decoded shard row groups: kept until the last dataset row they serve has passed, and
    otherwise bounded by ``budget`` bytes (least recently used first; re-read if needed again)."""

    def __init__(self, index: RegenIndex, budget: int = CACHE_BYTES):
        import pyarrow.parquet as pq

        self.index = index
        self.budget = budget
        self.last_use = index.last_use
        self._files: dict[int, Any] = {}
        self._pq = pq
        self._tables: OrderedDict[tuple[int, int], pa.Table] = OrderedDict()
        self.reads = 0

    def get(self, key: tuple[int, int]) -> pa.Table:
        t = self._tables.get(key)
        if t is not None:
            self._tables.move_to_end(key)
            return t
        fi, g = key
        path = self.index.files[fi]
        try:
            pf = self._files.get(fi) or self._pq.ParquetFile(path)
            self._files[fi] = pf
            names = set(pf.schema_arrow.names)
            t = pf.read_row_group(g, columns=[c for c in _SHARD_DATA_COLUMNS if c in names])
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InputError(f"{path}: unreadable or truncated regen shard ({' '.join(str(exc).split())[:160]})") from None
        self.reads += 1
        self._tables[key] = t
        return t

    def release(self, passed_row: int) -> None:
        """Drop groups whose rows all lie before ``passed_row``; then shrink to the budget (oldest use first)."""
        for key in [k for k in self._tables if self.last_use.get(k, -1) < passed_row]:
            del self._tables[key]
        total = sum(t.nbytes for t in self._tables.values())
        for key in list(self._tables):
            if total <= self.budget:
                break
            total -= self._tables.pop(key).nbytes
            self._files.pop(key[0], None)


# --- the input's masking convention --------------------------------------------------------------


@dataclass(frozen=True)
class Convention:
    """How the input masks an assistant turn, so that a regenerated sample is masked the same way.

    ``turns``: ``all`` (every assistant turn trained: SpecForge, TRL, LLaMA-Factory) or ``last``
    (only the final one: SpecForge's ``train_only_last_turn``, speculators' last boundary);
    ``post_eot``: the tokens the template puts after end of turn (ChatML's ``\n``) are trained, and
    appended after a final turn that ends in end of turn; ``think_prefix``: tokens right after the
    header that stay untrained (SpecForge's ``qwen3.5`` header ``<|im_start|>assistant\n<think>\n``);
    ``header_trained``: the assistant header is trained too (TRL's DeepSeek V3 template trains
    ``<｜Assistant｜>``); ``eot_trained``: the end-of-turn token is trained (False: axolotl's
    ``train_on_eos: none``, where the span stops before it and nothing after it is trained).
    """

    turns: str = "all"
    post_eot: bool = False
    think_prefix: tuple[int, ...] = ()
    source: str = ""
    header_trained: bool = False
    eot_trained: bool = True

    @classmethod
    def from_detected(cls, conv: dict[str, Any], fmt: Any, source: str) -> "Convention":
        """From ``detect_conventions``' dict (a scan's ``summary.json`` ``conventions``)."""
        turns = conv.get("trained_turns")
        if turns not in ("all", "last"):
            a, b = conv.get("trained_turns_share_all"), conv.get("trained_turns_share_last")
            turns = "last" if turns == "mixed" and (b or 0) > (a or 0) else "all"
        prefix: tuple[int, ...] = ()
        if conv.get("header_includes_think"):
            prefix = tuple(fmt.think_prefix) or tuple(t for t in (fmt.think_open, fmt.newline) if t is not None)
        return cls(turns, bool(conv.get("post_eot_trained")), prefix, source,
                   header_trained=conv.get("header_trained") is True, eot_trained=conv.get("eot_trained") is not False)

    def describe(self) -> dict[str, Any]:
        return {"trained_turns": self.turns, "post_eot_trained": self.post_eot, "header_includes_think": bool(self.think_prefix),
                "header_trained": self.header_trained, "eot_trained": self.eot_trained, "source": self.source}


def rebuild_in_convention(values: np.ndarray, offsets: np.ndarray, fmt: Any, conv: Convention) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Regenerated samples (flat ``values``, ``offsets``) as the input would have stored them:
    ``(values, offsets, mask)`` with the post-end-of-turn tokens appended after a final end of turn
    when the convention trains them, and the mask over each trained assistant turn from after its
    header (and an untrained think prefix; from the header itself when ``header_trained``) through
    its end of turn (and the tokens after it when trained; up to it when not ``eot_trained``); a
    final turn without end of turn (a length cut) is trained to the sample's end.
    Vectorized over all samples (loops only over the few tokens of a header or think prefix)."""
    from dqa.regen.jobs.prompts import header_starts

    values = np.asarray(values)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = offsets.size - 1
    lens = offsets[1:] - offsets[:-1]
    post = np.asarray(fmt.post_eot or (), dtype=values.dtype if values.size else np.int64)
    if conv.post_eot and conv.eot_trained and post.size and n:
        last_tok = values[np.maximum(offsets[1:] - 1, 0)] if values.size else np.zeros(n, values.dtype)
        add = ((lens > 0) & (last_tok == fmt.eot)).astype(np.int64) * post.size
        if add.any():
            new_lens = lens + add
            new_off = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(new_lens, out=new_off[1:])
            out = np.empty(int(new_off[-1]), dtype=values.dtype)
            row_of = np.repeat(np.arange(n), new_lens)
            rank = np.arange(out.size) - new_off[row_of]
            old = rank < lens[row_of]
            out[old] = values[offsets[row_of[old]] + rank[old]]
            out[~old] = post[rank[~old] - lens[row_of[~old]]]
            values, offsets, lens = out, new_off, new_lens
    total = values.size
    mask = np.zeros(total, dtype=np.uint8)
    hpos, hrow = header_starts(values, offsets, tuple(fmt.assistant_header))
    if hpos.size == 0:
        return values, offsets, mask
    hlen = len(fmt.assistant_header)
    row_end = offsets[hrow + 1]
    nxt = np.r_[hpos[1:], total]
    nxt = np.where(np.r_[hrow[1:] == hrow[:-1], False], nxt, row_end)
    if conv.turns == "last":
        keep = np.r_[hrow[1:] != hrow[:-1], True]
        hpos, hrow, row_end, nxt = hpos[keep], hrow[keep], row_end[keep], nxt[keep]
    start = hpos + hlen
    if conv.think_prefix:
        k = len(conv.think_prefix)
        match = start + k <= nxt
        for j, t in enumerate(conv.think_prefix):
            match &= values[np.minimum(start + j, max(total - 1, 0))] == t
        start = np.where(match, start + k, start)
    eots = np.flatnonzero(values == fmt.eot)
    e = np.searchsorted(eots, start)
    found = e < eots.size
    e_at = eots[np.minimum(e, max(eots.size - 1, 0))] if eots.size else start
    found &= e_at < nxt
    if conv.header_trained:
        start = hpos
    end = np.where(found, e_at + (1 if conv.eot_trained else 0), nxt)
    if conv.post_eot and conv.eot_trained and post.size:
        follows = found.copy()
        for t in post:
            follows &= (end < nxt) & (values[np.minimum(end, max(total - 1, 0))] == t)
            end = end + follows
    end = np.maximum(end, start)
    edges = np.zeros(total + 1, dtype=np.int64)
    np.add.at(edges, start, 1)
    np.add.at(edges, end, -1)
    mask[np.cumsum(edges[:-1]) > 0] = 1
    return values, offsets, mask


# --- the replacement kernel ----------------------------------------------------------------------


def _flat(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Values (numpy) and absolute offsets (int64, ``len == n + 1``) of a list array."""
    offs = np.asarray(arr.offsets, dtype=np.int64)
    vals = arr.values
    return (vals.to_numpy(zero_copy_only=False) if len(vals) else np.zeros(0, np.int64)), offs


def _refuse_bad_values(arr: pa.Array, where: Callable[[int], str], col: str, kind: str) -> None:
    """Raise ``InputError`` naming ``where(row)`` and ``col`` for a null list, a null inside a list,
    a negative token id (``kind`` ids), a mask value outside 0/1 (mask) or a negative label other
    than -100 (labels): what ``dqa scan`` refuses, checked with whole-array kernels."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        r = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"{where(r)}: column {col!r}: null list (expected a list of integers)")
    vals = pc.list_flatten(arr)
    if len(vals) == 0 or pa.types.is_boolean(vals.type) or not pa.types.is_integer(vals.type):
        bad = None if vals.null_count == 0 else vals.is_null()
    elif kind == "mask":
        bad = pc.or_kleene(pc.less(vals, 0), pc.greater(vals, 1))
    elif kind == "labels":
        bad = pc.and_kleene(pc.less(vals, 0), pc.not_equal(vals, -100))
    else:
        bad = pc.less(vals, 0)
    if bad is None or not pc.any(pc.fill_null(bad, True)).as_py():
        return
    pos = int(np.flatnonzero(pc.fill_null(bad, True).to_numpy(zero_copy_only=False))[0])
    row = int(pc.list_parent_indices(arr)[pos].as_py())
    value = vals[pos].as_py()
    if value is None:
        what = "null inside the list (expected integers)"
    elif kind == "ids":
        what = f"negative token id {value}"
    else:
        what = f"value {value} (expected {'0 or 1' if kind == 'mask' else '-100 or a token id'})"
    raise InputError(f"{where(row)}: column {col!r}: {what}")


def _list_array(values: np.ndarray, offsets: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A list array of ``typ`` from flat ``values`` and absolute ``offsets`` into them."""
    lo, hi = int(offsets[0]), int(offsets[-1])
    vals = pa.array(values[lo:hi])
    offs = pa.array(offsets - lo, type=pa.int64() if pa.types.is_large_list(typ) else pa.int32())
    cls = pa.LargeListArray if pa.types.is_large_list(typ) else pa.ListArray
    return cls.from_arrays(offs, vals).cast(typ)


def _cast_to(arr: pa.Array, typ: pa.DataType, column: str) -> pa.Array:
    try:
        return arr.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"column {column!r} of type {typ} cannot hold the regenerated rows ({' '.join(str(exc).split())[:120]})") from None


@dataclass
class _Replacement:
    """The shard data for the rows of one batch that get replaced, in row order."""

    local: np.ndarray  # positions in the batch
    table: pa.Table  # input_ids, loss_mask, provenance columns, ...


class Merger:
    """Stream a dataset and a ``RegenIndex`` into a merged dataset; see the module docstring."""

    def __init__(self, dataset: Any, index: RegenIndex, failed: str = "keep", check_prompts: bool = True,
                 cache_bytes: int = CACHE_BYTES, fmt: Any = None, convention: Convention | None = None):
        if failed not in ("keep", "drop"):
            raise InputError(f"--failed {failed}: expected keep or drop")
        self.fmt = fmt  # the run's chat format: with ``convention``, replaced rows are rebuilt in the input's masking
        self.convention = convention
        self.ds = dataset
        self.index = index
        self.drop = failed == "drop"
        self.check_prompts = check_prompts
        self.cache = _GroupCache(index, cache_bytes)
        cols = dataset.columns
        names = set(dataset.schema.names)
        self.ids_col = cols.ids
        self.mask_cols = [c for c in dict.fromkeys([cols.mask, "loss_mask" if cols.mask is None else None]) if c and c in names]
        self.label_cols = [c for c in dict.fromkeys([cols.labels, "labels" if cols.labels is None else None]) if c and c in names]
        self.attention_col = "attention_mask" if "attention_mask" in names else None
        self.token_cols = [self.ids_col, *self.mask_cols, *self.label_cols] + ([self.attention_col] if self.attention_col else [])
        # Provenance as JSON text where a struct cannot go: JSONL (no stored types), and a dataset whose
        # token columns hold [1, L] tensors (SpecForge's cache: set_format("torch") cannot tensorize a timestamp).
        self.tensor_layout = any(is_nested_list(dataset.schema.field(c).type) for c in self.token_cols)
        self.untyped = not formats.get(dataset.format).typed
        self.json_provenance = self.untyped or self.tensor_layout
        self.id_col = cols.id
        self.unregen_rows: list[np.ndarray] = []
        self.unregen_reasons: list[np.ndarray] = []
        self.unregen_ids: list[pa.Array] = []
        self.replaced = self.truncated = self.dropped = self.kept = 0

    # provenance column type in the output
    @property
    def provenance_type(self) -> pa.DataType:
        return pa.string() if self.json_provenance else PROVENANCE_TYPE

    def output_schema(self, stored: pa.Schema) -> pa.Schema:
        """The output schema of an input file with stored schema ``stored``."""
        if PROVENANCE_COLUMN in stored.names:
            return stored
        return stored.append(pa.field(PROVENANCE_COLUMN, self.provenance_type))

    def merge_batch(self, start: int, rb: pa.RecordBatch) -> pa.RecordBatch:
        """The merged version of ``rb`` (dataset rows ``start .. start + len``), token columns flat
        (``run`` unwraps ``[1, L]`` columns before and wraps them back after)."""
        n = rb.num_rows
        idx = self.index
        lo, hi = np.searchsorted(idx.rows, [start, start + n])
        rows = idx.rows[lo:hi]
        status = idx.status[lo:hi]
        local = rows - start
        if hi > lo and self.id_col is not None:
            self._check_ids(rb, local, idx.ids.slice(lo, hi - lo), rows, lo)
        rep_sel = np.flatnonzero(status != _FAILED)
        failed_sel = np.flatnonzero(status == _FAILED)
        rep = self._fetch(lo + rep_sel, local[rep_sel]) if rep_sel.size else None
        if rep is not None and self.check_prompts:
            self._check_prompt(rb, rep, start)
        if rep is not None and self.fmt is not None and self.convention is not None:
            rep = self._in_convention(rep)

        # rows that could not be regenerated: failed in the shards, or selected and absent
        bad_local = [local[failed_sel]]
        bad_reason = [self._failed_reasons(lo + failed_sel)]
        if idx.selected is not None:
            s_lo, s_hi = np.searchsorted(idx.selected, [start, start + n])
            missing = np.setdiff1d(idx.selected[s_lo:s_hi], rows, assume_unique=True) - start
            if missing.size:
                bad_local.append(missing)
                bad_reason.append(np.full(missing.size, "selected for regeneration but absent from the shards", dtype=object))
        bad = np.concatenate(bad_local)
        if bad.size:
            order = np.argsort(bad, kind="stable")
            bad = bad[order]
            self.unregen_rows.append(bad + start)
            self.unregen_reasons.append(np.concatenate(bad_reason)[order])
            self.unregen_ids.append(
                _as_strings(rb.column(self.id_col).take(pa.array(bad))) if self.id_col else pa.nulls(bad.size, pa.string())
            )
            if self.drop:
                self.dropped += bad.size
            else:
                self.kept += bad.size

        keep = None
        if self.drop and bad.size:
            keep = np.ones(n, dtype=bool)
            keep[bad] = False
        out = self._assemble(rb, rep, keep)
        if rep is not None:
            self.replaced += rep.local.size
            self.truncated += int(np.count_nonzero(status[rep_sel] == _LENGTH))
        self.cache.release(start + n)
        return out

    def _in_convention(self, rep: _Replacement) -> _Replacement:
        """The replacement rows with ``input_ids``/``loss_mask`` rebuilt by ``rebuild_in_convention``."""
        t = rep.table
        ids = t.column("input_ids").chunk(0)
        vals, offs = _flat(ids)
        vals, offs, mask = rebuild_in_convention(vals[offs[0]:offs[-1]], offs - offs[0], self.fmt, self.convention)
        new_ids = _list_array(vals, offs, ids.type)
        new_mask = _list_array(mask, offs, t.column("loss_mask").type)
        t = t.set_column(t.column_names.index("input_ids"), "input_ids", new_ids)
        t = t.set_column(t.column_names.index("loss_mask"), "loss_mask", new_mask)
        return _Replacement(local=rep.local, table=t.combine_chunks())

    def _check_input(self, src: Path, start: int, rb: pa.RecordBatch) -> None:
        """Refuse null lists or values, negative ids, and mask/label values scan would refuse."""
        def where(r: int) -> str:
            return f"{src}: row {start + r}"

        _refuse_bad_values(rb.column(self.ids_col), where, self.ids_col, "ids")
        for c in self.mask_cols:
            _refuse_bad_values(rb.column(c), where, c, "mask")
        for c in self.label_cols:
            _refuse_bad_values(rb.column(c), where, c, "labels")

    def _failed_reasons(self, sel: np.ndarray) -> np.ndarray:
        """Why the conversations at index positions ``sel`` were not regenerated (``load_regen_index``:
        ``regeneration failed: <the shard's error>``, a length cut not accepted, a conversation not finished)."""
        errs = self.index.errors.take(pa.array(sel, type=pa.int64()))
        return pc.fill_null(errs, "regeneration failed").to_numpy(zero_copy_only=False).astype(object)

    def _check_ids(self, rb: pa.RecordBatch, local: np.ndarray, shard_ids: pa.Array, rows: np.ndarray, lo: int) -> None:
        mine = _as_strings(rb.column(self.id_col).take(pa.array(local)))
        differ = pc.fill_null(pc.not_equal(mine, shard_ids), False).to_numpy(zero_copy_only=False)
        if differ.any():
            j = int(np.flatnonzero(differ)[0])
            shard = self.index.files[int(self.index.file[lo + j])]
            raise InputError(
                f"{shard}: row {int(rows[j])} has id {shard_ids[j].as_py()!r} but dataset row {int(rows[j])} has id "
                f"{mine[j].as_py()!r} (regen output of another dataset?)"
            )

    def _fetch(self, sel: np.ndarray, local: np.ndarray) -> _Replacement:
        """Gather the shard rows ``sel`` (positions in the index) in row order, grouped by row group."""
        idx = self.index
        keys = idx.file[sel].astype(np.int64) << 32 | idx.group[sel].astype(np.int64)
        uniq, inverse = np.unique(keys, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        pieces = []
        for u, k in enumerate(uniq):
            members = order[np.searchsorted(inverse[order], u): np.searchsorted(inverse[order], u, side="right")]
            t = self.cache.get((int(k >> 32), int(k & 0xFFFFFFFF)))
            pieces.append(t.take(pa.array(idx.offset[sel[members]])))
        if len(pieces) == 1:  # the usual case: one row group serves the batch, already in row order
            table = pieces[0].combine_chunks()
        else:
            back = np.empty(order.size, dtype=np.int64)
            back[order] = np.arange(order.size)
            table = pa.concat_tables(pieces, promote_options="permissive").take(pa.array(back)).combine_chunks()
        self._validate(table, sel)
        return _Replacement(local=local, table=table)

    def _validate(self, t: pa.Table, sel: np.ndarray) -> None:
        idx = self.index

        def where(j: int) -> str:
            return f"{idx.files[int(idx.file[sel[j]])]}: row {int(idx.rows[sel[j]])}"

        ids = t.column("input_ids").chunk(0) if t.num_rows else None
        mask = t.column("loss_mask").chunk(0) if t.num_rows else None
        if ids is None:
            return
        for name, arr in (("input_ids", ids), ("loss_mask", mask)):
            if arr.null_count:
                j = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                raise InputError(f"{where(j)}: null {name} in a row with status ok/length")
        _refuse_bad_values(ids, where, "input_ids", "ids")
        il = pc.list_value_length(ids).to_numpy()
        ml = pc.list_value_length(mask).to_numpy()
        if (il != ml).any():
            j = int(np.flatnonzero(il != ml)[0])
            raise InputError(f"{where(j)}: input_ids has {int(il[j])} tokens but loss_mask {int(ml[j])}")
        mv, moff = _flat(mask)
        mv = mv[moff[0]:moff[-1]].astype(np.int64)
        if mv.size and (mv.min() < 0 or mv.max() > 1):
            pos = int(np.flatnonzero((mv < 0) | (mv > 1))[0])
            j = int(np.searchsorted(moff - moff[0], pos, side="right") - 1)
            raise InputError(f"{where(j)}: loss_mask value {int(mv[pos])} (expected 0 or 1)")

    def _check_prompt(self, rb: pa.RecordBatch, rep: _Replacement, start: int) -> None:
        """Refuse a replacement whose prompt tokens are not the dataset row's first ``prompt_len`` tokens."""
        t = rep.table
        # Multi-turn: only the tokens before the first regenerated turn come from the row unchanged.
        name = "kept_len" if "kept_len" in t.column_names else "prompt_len"
        if name not in t.column_names:
            return
        plen = t.column(name).chunk(0)
        known = ~plen.is_null().to_numpy(zero_copy_only=False)
        p = pc.fill_null(plen, 0).to_numpy().astype(np.int64)
        orig = rb.column(self.ids_col)
        ov, ooff = _flat(orig)
        nv, noff = _flat(t.column("input_ids").chunk(0))
        olen = ooff[rep.local + 1] - ooff[rep.local]
        nlen = noff[1:] - noff[:-1]
        bad_len = known & ((p > olen) | (p > nlen) | (p < 0))
        if bad_len.any():
            j = int(np.flatnonzero(bad_len)[0])
            raise InputError(
                f"{self._where(rep, j, start)}: prompt_len {int(p[j])} exceeds the dataset row ({int(olen[j])} tokens) "
                "or the regenerated sample (regen output of another dataset?)"
            )
        p = np.where(known, p, 0)
        r = _ranks(p)
        a = ov[np.repeat(ooff[rep.local], p) + r]
        b = nv[np.repeat(noff[:-1], p) + r]
        diff = a != b
        if diff.any():
            pos = int(np.flatnonzero(diff)[0])
            j = int(np.searchsorted(np.cumsum(p), pos, side="right"))
            raise InputError(
                f"{self._where(rep, j, start)}: the regenerated prompt differs from the dataset row's tokens "
                "(regen output of another dataset, or the dataset changed since the run)"
            )

    def _where(self, rep: _Replacement, j: int, start: int) -> str:
        row = int(rep.local[j]) + start
        k = int(np.searchsorted(self.index.rows, row))
        return f"{self.index.files[int(self.index.file[k])]}: row {row}"

    def _assemble(self, rb: pa.RecordBatch, rep: _Replacement | None, keep: np.ndarray | None) -> pa.RecordBatch:
        """Columns of ``rb`` with the replacement rows swapped in (one ``take`` per replaced column),
        rows not in ``keep`` left out, and the provenance column last (or in its existing place)."""
        n = rb.num_rows
        replaced: dict[str, pa.Array] = {}
        take_arr = None
        if rep is not None:
            take = np.arange(n, dtype=np.int64)
            take[rep.local] = n + np.arange(rep.local.size)
            take_arr = pa.array(take if keep is None else take[keep])
            new_ids = rep.table.column("input_ids").chunk(0)
            new_mask = rep.table.column("loss_mask").chunk(0)
            iv, ioff = _flat(new_ids)
            replaced[self.ids_col] = new_ids
            for c in self.mask_cols:
                replaced[c] = new_mask
            if self.label_cols:
                mv, moff = _flat(new_mask)
                sup = mv[moff[0]:moff[-1]].astype(np.int64) == 1
                vals = np.where(sup, iv[ioff[0]:ioff[-1]].astype(np.int64), IGNORE_INDEX)
                labels = _list_array(vals, ioff - ioff[0], pa.list_(pa.int64()))
                for c in self.label_cols:
                    replaced[c] = labels
            if self.attention_col:
                ones = np.ones(int(ioff[-1] - ioff[0]), np.int8)
                replaced[self.attention_col] = _list_array(ones, ioff - ioff[0], pa.list_(pa.int8()))
        keep_arr = pa.array(keep) if keep is not None else None
        prov = self._provenance(rb, rep, keep)
        arrays, fields = [], []
        for f in rb.schema:
            col = rb.column(f.name)
            if f.name == PROVENANCE_COLUMN:
                col, f = prov, pa.field(PROVENANCE_COLUMN, prov.type)
            elif f.name in replaced:
                col = pa.concat_arrays([col, _cast_to(replaced[f.name], f.type, f.name)]).take(take_arr)
            elif keep_arr is not None:
                col = col.filter(keep_arr)
            arrays.append(col)
            fields.append(f)
        if PROVENANCE_COLUMN not in rb.schema.names:
            arrays.append(prov)
            fields.append(pa.field(PROVENANCE_COLUMN, prov.type))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=rb.schema.metadata))

    def _provenance(self, rb: pa.RecordBatch, rep: _Replacement | None, keep: np.ndarray | None) -> pa.Array:
        n = rb.num_rows
        existing = rb.column(PROVENANCE_COLUMN) if PROVENANCE_COLUMN in rb.schema.names else None
        typ = self.provenance_type
        if existing is not None and existing.type != typ:
            try:
                existing = existing.cast(typ)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise InputError(
                    f"column {PROVENANCE_COLUMN!r} exists in the dataset with type {existing.type}; expected {typ}"
                ) from None
        if existing is None:
            existing = pa.repeat(pa.scalar("null"), n) if self.untyped else pa.nulls(n, typ)
        if rep is None:
            return existing if keep is None else existing.filter(pa.array(keep))
        new = self._provenance_of(rep.table)
        take = np.arange(n, dtype=np.int64)
        take[rep.local] = n + np.arange(rep.local.size)
        if keep is not None:
            take = take[keep]
        return pa.concat_arrays([existing, new]).take(pa.array(take))

    def _provenance_of(self, t: pa.Table) -> pa.Array:
        arrays = []
        for f in PROVENANCE_TYPE:
            if f.name in t.column_names:
                arrays.append(_cast_to(t.column(f.name).combine_chunks(), f.type, f"shard {f.name}"))
            else:
                arrays.append(pa.nulls(t.num_rows, f.type))
        st = pa.StructArray.from_arrays(arrays, fields=list(PROVENANCE_TYPE))
        if not self.json_provenance:
            return st
        import polars as pl

        return pl.from_arrow(st).struct.json_encode().to_arrow().cast(pa.string())  # type: ignore[union-attr]

    def run(self, batch_rows: int, writer: Any, on_batch: Callable[[int], None] | None = None) -> int:
        """Stream the dataset through ``merge_batch`` into ``writer``; return the number of input rows.

        Writing (compression, disk) happens on a second thread, at most two merged batches
        behind, so it overlaps the reading and merging of the next batch. A failure on either
        side stops both and is raised here.
        """
        import queue
        import threading

        pending: queue.Queue = queue.Queue(maxsize=2)
        failure: list[BaseException] = []

        def write_behind() -> None:
            while True:
                item = pending.get()
                if item is None:
                    return
                if not failure:
                    try:
                        writer.write(*item)
                    except BaseException as exc:  # handed to the merging thread
                        failure.append(exc)

        thread = threading.Thread(target=write_behind, name="dqa-merge-writer", daemon=True)
        thread.start()
        start = 0
        try:
            for src, rb in self.ds.record_batches(batch_rows):
                if failure:
                    break
                if rb.num_rows == 0:
                    continue
                flat, nested = flatten_token_lists(rb, self.token_cols, src, start)
                self._check_input(src, start, flat)
                pending.put((src, nest_token_lists(self.merge_batch(start, flat), nested)))
                start += rb.num_rows
                if on_batch:
                    on_batch(rb.num_rows)
        finally:
            pending.put(None)
            thread.join()
        if failure:
            raise failure[0]
        return start


def merge(
    dataset: str | Path,
    regen_dirs: list[str | Path],
    out: str | Path,
    failed: str = "keep",
    force: bool = False,
    batch_rows: int = 2048,
    check_prompts: bool = True,
    ids_column: str | None = None,
    mask_column: str | None = None,
    labels_column: str | None = None,
    id_column: str | None = None,
    on_batch: Callable[[int], None] | None = None,
    on_start: Callable[[int | None], None] | None = None,
    cache_bytes: int = CACHE_BYTES,
    accept: Iterable[str] = DEFAULT_ACCEPT,
) -> MergeSummary:
    """Merge the regen shards of ``regen_dirs`` into a copy of ``dataset`` at ``out``.

    Returns a ``MergeSummary`` (also written, with the unregenerated rows, to
    ``report_path(out)``). Raises ``InputError`` / ``RuntimeFailure`` as described in the
    module docstring; on any error ``out`` is not created.
    """
    from dqa.audit.readers import open_dataset
    from dqa.audit.writers import DatasetWriter, check_output_path

    t0 = time.perf_counter()
    out = Path(out)
    regen = [Path(d) for d in regen_dirs]
    if not regen:
        raise InputError("give --regen DIR (the --out folder of dqa regen)")
    cols = (ids_column, mask_column, labels_column, id_column)
    if not any(cols):  # none given here: the ones given to dqa regen, so both read the same columns
        cols = tuple(run_columns(regen)[k] for k in COLUMN_KEYS)
    ds = open_dataset(dataset, *cols)
    check_output_path(ds, out, force)
    for d in regen:
        shards = (d / "shards").resolve()
        if shards == out.resolve() or shards in out.resolve().parents:
            raise InputError(f"--out {out}: inside the regen shards folder {shards}; choose another place")
    accept = tuple(dict.fromkeys(accept))
    bad = [a for a in accept if a not in ACCEPT_CHOICES]
    if bad or "ok" not in accept:
        raise InputError(f"--accept {','.join(accept)}: expected ok or ok,length")
    index = load_regen_index(regen, accept)
    if ds.format == "conversations":
        return _merge_conversations(ds, regen, out, index, failed, force, accept, t0, on_batch, on_start)
    total = ds.num_rows
    if total is not None:
        _check_rows_in_range(index, total, ds.path)
    fmt, convention = run_convention(regen, ds)
    merger = Merger(ds, index, failed, check_prompts, cache_bytes, fmt, convention)
    summary = MergeSummary(
        dataset=str(ds.path), regen=[str(d) for d in regen], output=str(out), report=str(report_path(out)),
        format=ds.format, failed_policy=failed, accept=",".join(accept),
        convention=convention.describe() if convention is not None else None,
    )
    if on_start:
        on_start(total)
    with DatasetWriter(ds, out, merger.output_schema, force=force) as writer:
        rows_in = merger.run(batch_rows, writer, on_batch)
        _check_rows_in_range(index, rows_in, ds.path)
        summary.rows_in = rows_in
        summary.rows_out = writer.rows_written
        summary.replaced = merger.replaced
        summary.truncated = merger.truncated
        summary.kept = merger.kept
        summary.dropped = merger.dropped
        summary.unregenerated = merger.kept + merger.dropped
        summary.untouched = rows_in - merger.replaced - summary.unregenerated
        summary.unregenerated_rows = _unregen_list(merger)
        summary.selection = index.selection_notes
        summary.elapsed_s = round(time.perf_counter() - t0, 3)
        report = json.dumps(summary.as_dict(with_rows=True), indent=2, default=str) + "\n"
        writer.commit(companions={report_path(out): report.encode()})
    return summary


# --- conversation JSONL -----------------------------------------------------------------------------


def _run_tokenizer(regen: list[Path]) -> str | None:
    for d in regen:
        manifest = _read_manifest(Path(d))
        if manifest is not None and manifest.tokenizer:
            return manifest.tokenizer
    return None


def _turn_outputs(index: RegenIndex, rows: np.ndarray) -> tuple[dict[int, dict[int, np.ndarray]], dict[int, np.ndarray]]:
    """The output tokens of every recorded turn of ``rows`` (row -> turn (-1: the final one, for
    shards of runs before multi-turn and records of one turn of one) -> output), and per row the prompt tokens its first
    regenerated turn kept unchanged from the dataset row (``kept_len``; absent for older shards)."""
    import pyarrow.parquet as pq

    out: dict[int, dict[int, np.ndarray]] = {}
    kept: dict[int, tuple[int, np.ndarray]] = {}
    if rows.size == 0:
        return out, {}
    want = pa.array(np.asarray(rows, dtype=np.int64))
    for p in index.files:
        names = set(pq.read_schema(p).names)
        cols = ["row", "status", "input_ids", "prompt_len"] + [c for c in ("turn", "turns", "kept_len") if c in names]
        t = pq.read_table(p, columns=cols)
        t = t.filter(pc.and_(pc.is_in(t.column("row"), value_set=want), pc.not_equal(t.column("status"), ShardStatus.FAILED.value)))
        for rec in t.to_pylist():
            ids = np.asarray(rec["input_ids"], dtype=np.int64)
            row, turn = int(rec["row"]), int(rec["turn"]) if rec.get("turn") is not None else -1
            if rec.get("turns") == 1:  # the final turn: the only one, or a journal record of a run before multi-turn (0 of 1)
                turn = -1
            out.setdefault(row, {})[turn] = ids[int(rec["prompt_len"]):]
            if rec.get("kept_len") is not None and (row not in kept or turn < kept[row][0]):
                kept[row] = (turn, ids[: int(rec["kept_len"])])
    return out, {r: k for r, (_, k) in kept.items()}


def _check_kept_prompt(renderer: Any, obj: Any, kept: np.ndarray, f: Path, line: int, row: int) -> None:
    """Raise ``InputError`` unless the conversation on ``line``, rendered and tokenized as ``dqa scan``
    and ``dqa regen`` read it, starts with ``kept``: the tokens the run copied from this row before its
    first regenerated turn. A conversation edited since the run (or another dataset's run, rows
    without ids) would otherwise get replies written for a different history."""
    ids = renderer.tokenizer.encode(renderer.render(renderer.messages(obj, f, line), f, line), add_special_tokens=False).ids
    if len(ids) < kept.size or not np.array_equal(np.asarray(ids[: kept.size], dtype=np.int64), kept):
        raise InputError(f"{f}: line {line}: row {row}'s conversation before its first regenerated turn differs from the "
                         "one the run regenerated from (the dataset changed since the run, or regen output of another dataset?)")


def split_reply(output: np.ndarray, fmt: Any) -> tuple[str, str | None]:
    """A regenerated turn's output as ``(content, reasoning_content)`` text, the way SpecForge's
    regenerated data stores a turn: the think block's text as reasoning (None when there is none),
    the rest, after ``</think>`` and its newlines, as content; end of turn dropped."""
    ids = [int(t) for t in output]
    if ids and ids[-1] == fmt.eot:
        ids = ids[:-1]
    ids = [*fmt.think_prefix, *ids] if fmt.think_prefix and (not ids or ids[0] != fmt.think_open) else ids
    if fmt.think_close is not None and fmt.think_close in ids:
        cut = len(ids) - 1 - ids[::-1].index(fmt.think_close)
        inner = ids[:cut]
        if inner and inner[0] == fmt.think_open:
            inner = inner[1:]
        reasoning = fmt.decode(inner).strip("\n")
        return fmt.decode(ids[cut + 1 :]).lstrip("\n"), reasoning
    return fmt.decode(ids).lstrip("\n"), None


def _merge_conversations(ds: Any, regen: list[Path], out: Path, index: RegenIndex, failed: str, force: bool,
                         accept: tuple[str, ...], t0: float, on_batch: Callable[[int], None] | None,
                         on_start: Callable[[int | None], None] | None) -> MergeSummary:
    """``merge`` for conversation JSONL: NEW is conversation JSONL (same file names, one line per
    record, blank lines dropped) where each replaced conversation's regenerated assistant turns get
    the new ``content`` and ``reasoning_content`` (SpecForge's regenerated format; ShareGPT records
    keep ``from``/``value``), and a ``dqa_regen`` object records the provenance (null elsewhere).
    Unregenerated rows are kept or dropped as for tokenized data."""
    from dqa import atomic
    from dqa.audit.format_conversations import LIST_KEYS, SHAREGPT_ROLES
    from dqa.audit.template import load_template
    from dqa.audit.writers import output_is_folder
    from dqa.errors import DqaError

    tokenizer = _run_tokenizer(regen)
    if tokenizer is None:
        raise InputError(f"--regen {regen[0]}: run.json names no tokenizer; conversation JSONL is merged as text, decoded with it")
    try:
        fmt = load_template(tokenizer, decode=True)
    except DqaError as exc:
        raise InputError(f"--regen {regen[0]}: the run's tokenizer {tokenizer} cannot be loaded ({exc})") from None
    if fmt.tokenizer is None:
        raise InputError(f"--regen {regen[0]}: the run's tokenizer {tokenizer} has no tokenizer files to decode the replies with")
    replace = index.rows[index.status != _FAILED]
    outputs, kept = _turn_outputs(index, replace)
    from dqa.audit.format_conversations import Renderer

    renderer = Renderer(fmt)
    summary = MergeSummary(dataset=str(ds.path), regen=[str(d) for d in regen], output=str(out), report=str(report_path(out)),
                           format=ds.format, failed_policy=failed, accept=",".join(accept),
                           convention={"format": "conversation JSONL", "reasoning": "reasoning_content per regenerated turn"})
    if on_start:
        on_start(None)
    status_of = dict(zip(index.rows.tolist(), index.status.tolist()))
    reason_of = dict(zip(index.rows.tolist(), index.errors.to_pylist()))
    id_of = dict(zip(index.rows.tolist(), index.ids.to_pylist()))
    selected = set(index.selected.tolist()) if index.selected is not None else set()
    prov = _provenance_rows(index, replace)
    folder = output_is_folder(ds)
    work = atomic.make_work_dir(out) if folder else None
    row = 0
    unregen: list[dict[str, Any]] = []
    replaced = truncated = 0
    base = ds.path if ds.path.is_dir() else ds.path.parent
    try:
        for f in ds.files:
            target = (work / f.relative_to(base)) if work is not None else out
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic.atomic_path(target) if work is None else _plain(target) as tmp, open(tmp, "w", encoding="utf-8") as fh, \
                    open(f, "rb") as src:
                for n, raw in enumerate(src, 1):
                    if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                        raw = raw[3:]
                    if not raw.strip():
                        continue
                    obj = json.loads(raw)
                    st = status_of.get(row)
                    shard_id = id_of.get(row)
                    if shard_id is not None and isinstance(obj, dict) and obj.get("id") is not None and str(obj["id"]) != shard_id:
                        raise InputError(f"{f}: line {n}: row {row} has id {obj['id']!r} but the regen shards' row {row} has id "
                                         f"{shard_id!r} (regen output of another dataset?)")
                    if st is not None and st != _FAILED:
                        if row in kept:
                            _check_kept_prompt(renderer, obj, kept[row], f, n, row)
                        key = next(k for k in LIST_KEYS if k in obj)
                        msgs = obj[key]
                        asst = [i for i, m in enumerate(msgs)
                                if SHAREGPT_ROLES.get(m.get("role", m.get("from")), m.get("role", m.get("from"))) == "assistant"]
                        for turn, output in sorted(outputs.get(row, {}).items()):
                            i = asst[turn] if turn >= 0 else asst[-1]
                            content, reasoning = split_reply(output, fmt)
                            m = msgs[i]
                            m["value" if "value" in m and "content" not in m else "content"] = content
                            m["reasoning_content"] = reasoning
                        obj[PROVENANCE_COLUMN] = prov[row]
                        replaced += 1
                        truncated += st == _LENGTH
                    else:
                        if st == _FAILED or row in selected and st is None:
                            why = reason_of.get(row) or "selected for regeneration but absent from the shards"
                            unregen.append({"row": row, "id": obj.get("id") if isinstance(obj, dict) else None, "reason": why})
                            if failed == "drop":
                                row += 1
                                continue
                        obj.setdefault(PROVENANCE_COLUMN, None)
                    fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
                    row += 1
            if on_batch:
                on_batch(n)
        _check_rows_in_range(index, row, ds.path)
        summary.rows_in = row
        summary.replaced = replaced
        summary.truncated = int(truncated)
        summary.unregenerated = len(unregen)
        summary.kept = 0 if failed == "drop" else len(unregen)
        summary.dropped = len(unregen) if failed == "drop" else 0
        summary.rows_out = row - summary.dropped
        summary.untouched = row - replaced - len(unregen)
        summary.unregenerated_rows = unregen
        summary.selection = index.selection_notes
        summary.elapsed_s = round(time.perf_counter() - t0, 3)
        report = json.dumps(summary.as_dict(with_rows=True), indent=2, default=str) + "\n"
        if work is not None:
            atomic.replace_dir(work, out)
            work = None
        atomic.write_bytes(report_path(out), report.encode())
    finally:
        if work is not None:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    return summary


class _plain:
    """``atomic_path``'s interface for a file inside a work folder (the folder is renamed as a whole)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: Any) -> None:
        return None


def _provenance_rows(index: RegenIndex, rows: np.ndarray) -> dict[int, dict[str, Any]]:
    """The ``dqa_regen`` object (JSON-ready) of each replaced row, from its final record."""
    import pyarrow.parquet as pq

    out: dict[int, dict[str, Any]] = {}
    if rows.size == 0:
        return out
    pos = np.searchsorted(index.rows, rows)
    groups: dict[tuple[int, int], pa.Table] = {}
    names = [f.name for f in PROVENANCE_TYPE]
    for k, r in zip(pos.tolist(), rows.tolist()):
        key = (int(index.file[k]), int(index.group[k]))
        if key not in groups:
            pf = pq.ParquetFile(index.files[key[0]])
            groups[key] = pf.read_row_group(key[1], columns=[c for c in names if c in pf.schema_arrow.names])
        rec = groups[key].slice(int(index.offset[k]), 1).to_pylist()[0]
        out[int(r)] = {f.name: (rec.get(f.name).isoformat() if f.name == "completed_at" and rec.get(f.name) is not None else rec.get(f.name))
                       for f in PROVENANCE_TYPE}
    return out


def run_convention(regen: list[Path], ds: Any) -> tuple[Any, Convention | None]:
    """The chat format the runs used (run.json ``tokenizer``) and the input's masking convention: the
    ``conventions`` of the scan whose findings the run read (``summary.json`` beside them), else
    detected from the input's first rows. ``(None, None)`` when no run.json names a tokenizer: the
    shards' masks are then used as they are (0 over the prompt, 1 over the output). Raises
    ``InputError`` when the named tokenizer cannot be loaded."""
    from dqa.audit.template import load_template
    from dqa.errors import DqaError

    tokenizer = findings = None
    for d in regen:
        manifest = _read_manifest(Path(d))
        if manifest is not None and manifest.tokenizer:
            tokenizer, findings = manifest.tokenizer, manifest.findings
            break
    if tokenizer is None:
        return None, None
    try:
        fmt = load_template(str(tokenizer), decode=False)
    except DqaError as exc:
        raise InputError(f"--regen {regen[0]}: the run's tokenizer {tokenizer} cannot be loaded ({exc}); merge masks the "
                         "regenerated samples with its chat format") from None
    if findings:
        folder = Path(findings) if Path(findings).is_dir() else Path(findings).parent
        summary = folder / "summary.json"
        try:
            conv = json.loads(summary.read_text()).get("conventions")
        except (OSError, ValueError, AttributeError):
            conv = None
        if isinstance(conv, dict) and conv:
            return fmt, Convention.from_detected(conv, fmt, str(summary))
    return fmt, Convention.from_detected(_detect_conventions(ds, fmt), fmt, f"{ds.path} (first rows)")


def _detect_conventions(ds: Any, fmt: Any, rows: int = 4096) -> dict[str, Any]:
    """``detect_conventions`` over the input's first ``rows`` rows."""
    import polars as pl

    from dqa.audit.chat_format import detect_conventions
    from dqa.audit.kernels import KernelTables, batch_metrics

    try:
        batch = next(iter(ds.batches(batch_rows=rows)))
    except StopIteration:
        return {}
    metrics = batch_metrics(batch, KernelTables.build(fmt))
    return detect_conventions(pl.DataFrame(metrics), fmt)


def _check_rows_in_range(index: RegenIndex, total: int, path: Path) -> None:
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


def _unregen_list(m: Merger) -> list[dict[str, Any]]:
    if not m.unregen_rows:
        return []
    rows = np.concatenate(m.unregen_rows).tolist()
    reasons = np.concatenate(m.unregen_reasons).tolist()
    ids = pa.concat_arrays(m.unregen_ids).to_pylist()
    return [{"row": r, "id": i, "reason": why} for r, i, why in zip(rows, ids, reasons)]
