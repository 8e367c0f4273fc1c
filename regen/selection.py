"""Which rows to regenerate, and the stream of their prompts.

Selection: the failing rows of ``dqa scan``'s ``findings.parquet`` (columns
``row`` int64, ``id``, ``reasons`` list<string>), optionally narrowed to
``reasons``; or every row (``--all``). ``--shard i/N`` keeps rows with
``row % N == i`` (deterministic, so N driver hosts split the work without
talking to each other); ``--limit`` then keeps the first ``limit`` rows.

Findings belong to one dataset (``check_findings_for``): those in a scan folder (with its
``summary.json``) only to the dataset the scan recorded, and only while that dataset's files
are unchanged since the scan; a bare ``findings.parquet`` only where its ids equal the
dataset's ids at the same rows (when both have ids). Rows past the dataset's end are refused by
``selected_rows``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import numpy as np

from dqa.arrays import ranks as _ranks
from dqa.errors import InputError, UsageError
from dqa.regen.client import Job
from dqa.regen.prompts import TURN_MODES, Conversation, header_starts, sample_seed, turn_ends

# The first list of jobs is short, so the first requests go out within milliseconds of the start.
FIRST_CHUNK = 256


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"i/N"`` -> ``(i, N)``; None -> ``(0, 1)``. Raises ``UsageError`` unless ``0 <= i < N``."""
    if not text:
        return 0, 1
    try:
        a, b = text.split("/")
        i, n = int(a), int(b)
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected i/N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"--shard {text!r}: expected 0 <= i < N")
    return i, n


def findings_for(dataset: str | Path) -> Path:
    """Where ``dqa scan DATASET`` writes its findings by default: ``findings.parquet`` in the
    dataset's default scan folder (``dqa.audit.scan.default_out_dir``, keyed by identity, so a
    same-named other dataset's findings are never picked)."""
    from dqa.audit.identity import default_scan_dir  # what default_out_dir returns, without importing the scan (polars)
    from dqa.audit.scan_folder import FINDINGS_FILE

    return default_scan_dir(dataset) / FINDINGS_FILE


def check_findings_for(findings: Path, dataset) -> None:
    """Refuse findings that do not belong to ``dataset`` (an opened ``Dataset``).

    With a ``summary.json`` beside ``findings.parquet`` (a scan folder): refused when the scan
    recorded another dataset, or when the dataset's files changed since the scan (size or mtime
    of a file, a file added or gone). A bare ``findings.parquet``: refused when it has ids and
    the dataset has an id column, and a row's id differs from the dataset's id at that row (rows
    past the dataset's end are left to ``selected_rows``). Raises ``InputError`` naming the
    findings, both datasets and the fix (rescan).
    """
    from dqa.audit import identity
    from dqa.audit.scan_folder import findings_file, read_summary, scan_folder_of

    folder, file = scan_folder_of(findings), findings_file(findings)
    summary = read_summary(folder)
    if summary is not None and (identity.same_dataset(summary, dataset.path) is not None or identity.recorded_files(summary)):
        identity.check_scan_of(folder, summary, dataset.path, "findings", "--findings DIR")
        return
    if file.is_file():
        _check_finding_ids(file, dataset)


def _check_finding_ids(file: Path, dataset) -> None:
    """Compare the ids of a bare findings file with the dataset's ids at the same rows (see ``check_findings_for``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    id_col = dataset.columns.id
    try:
        schema = pq.read_schema(file)
        if id_col is None or "id" not in schema.names or "row" not in schema.names:
            return
        if not pa.types.is_integer(schema.field("row").type):
            return  # read_findings names the bad column
        t = pq.read_table(file, columns=["row", "id"])
        t = t.filter(pc.and_(pc.is_valid(t.column("id")), pc.greater_equal(t.column("row"), 0))).sort_by("row")
        rows = t.column("row").to_numpy().astype(np.int64)
        want = t.column("id").cast(pa.string()).to_pylist()
    except (pa.ArrowException, OSError):
        return  # read_findings names the unreadable file
    start = i = 0
    for _, rb in dataset.record_batches(columns=[id_col]):
        if i >= len(rows):
            return
        end = start + rb.num_rows
        j = int(np.searchsorted(rows, end))
        if j > i:
            try:
                have = rb.column(0).cast(pa.string()).take(pa.array(rows[i:j] - start)).to_pylist()
            except pa.ArrowException:
                return  # ids that do not read as text: nothing to compare
            for k, (got, exp) in enumerate(zip(have, want[i:j])):
                if got != exp:
                    raise InputError(
                        f"{file}: row {int(rows[i + k])} has id {exp!r}, but that row of {dataset.path} has id {got!r}: "
                        f"findings of another dataset? rescan it (dqa scan {dataset.path}) and pass --findings DIR of that scan"
                    )
        i, start = j, end


def read_findings(path: Path, reasons: list[str] | None) -> np.ndarray:
    """Sorted unique failing rows of ``findings.parquet`` (a file, or a folder holding it).

    Raises ``InputError`` for a missing or malformed file and for a reason that
    neither is a known check nor appears in the file.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dqa.audit.checks import CHECK_NAMES
    from dqa.audit.scan_folder import findings_file

    path = findings_file(path)
    if not path.is_file():
        raise InputError(f"{path}: no findings file; run `dqa scan DATASET` first, or pass --findings DIR, or --all")
    try:
        t = pq.read_table(path, columns=["row", "reasons"] if reasons else ["row"])
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise InputError(f"{path}: not a findings file with columns row and reasons ({' '.join(str(exc).split())[:160]})") from None
    if not pa.types.is_integer(t.schema.field("row").type):
        raise InputError(f"{path}: column 'row' must be int64, found {t.schema.field('row').type}")
    rows = t.column("row").combine_chunks()
    if rows.null_count:
        raise InputError(f"{path}: column 'row' has nulls")
    if reasons:
        col = t.column("reasons").combine_chunks()
        if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            raise InputError(f"{path}: column 'reasons' must be list<string>, found {col.type}")
        flat = col.flatten()
        parents = pc.list_parent_indices(col)
        present = set(pc.unique(flat).to_pylist())
        unknown = [r for r in reasons if r not in present and r not in CHECK_NAMES]
        if unknown:
            raise InputError(f"--reasons: unknown check {unknown[0]!r} (known: {', '.join(CHECK_NAMES)})")
        hit = pc.is_in(flat, value_set=pa.array(reasons, pa.string()))
        keep = np.unique(parents.filter(hit).to_numpy())
        rows = rows.take(pa.array(keep))
    out = np.unique(rows.to_numpy().astype(np.int64))
    if out.size and out[0] < 0:
        raise InputError(f"{path}: column 'row' holds a negative row {int(out[0])}")
    return out


def selected_rows(num_rows: int, findings: Path | None, failed_only: bool, reasons: list[str] | None) -> np.ndarray:
    """Every row the run selects before ``--shard`` and ``--limit``, sorted: the findings' failing
    rows (narrowed to ``reasons``), or all ``num_rows`` rows when not ``failed_only``.

    Raises ``InputError`` for rows past the dataset's end, ``UsageError`` for ``reasons`` without
    ``failed_only``.
    """
    if failed_only:
        assert findings is not None
        rows = read_findings(findings, reasons)
        if rows.size and rows[-1] >= num_rows:
            raise InputError(f"{findings}: row {int(rows[-1])} is past the dataset's end ({num_rows} rows); findings of another dataset?")
        return rows
    if reasons:
        raise UsageError("--reasons needs --failed-only (it narrows the findings)")
    return np.arange(num_rows, dtype=np.int64)


def narrow(rows: np.ndarray, shard: tuple[int, int], limit: int | None) -> np.ndarray:
    """The rows of ``selected_rows`` this driver takes: ``row % N == i`` for ``shard=(i, N)``, then the first ``limit``."""
    i, n = shard
    if n > 1:
        rows = rows[rows % n == i]
    if limit is not None:
        if limit < 0:
            raise UsageError("--limit must be >= 0")
        rows = rows[:limit]
    return rows


def select_rows(
    num_rows: int,
    findings: Path | None,
    failed_only: bool,
    reasons: list[str] | None,
    shard: tuple[int, int],
    limit: int | None,
) -> np.ndarray:
    """The sorted dataset rows this driver regenerates: ``narrow(selected_rows(...), shard, limit)``."""
    return narrow(selected_rows(num_rows, findings, failed_only, reasons), shard, limit)


def selection_digest(rows: np.ndarray) -> str:
    """sha256 of the rows of ``selected_rows`` (little-endian int64): run.json's ``rows_sha256``,
    which ties an output folder to its selection and lets ``dqa merge`` check it can rebuild it."""
    return hashlib.sha256(np.ascontiguousarray(rows, dtype="<i8").tobytes()).hexdigest()


class TurnJob(Job):
    """A ``Job`` for one assistant turn of a conversation: ``turn`` (0-based among the sample's
    assistant turns), ``turns`` (how many it has), ``kept_len`` (prompt tokens copied from the row
    unchanged) and, for a conversation with later turns to regenerate, ``conv`` (the
    ``Conversation``) to build the next turn's job from this one's output."""

    __slots__ = ("conv", "turn", "turns", "kept_len")

    def __init__(self, row, sample_id, prompt, seed, turn: int, turns: int, kept_len: int, conv=None, error=None):
        super().__init__(row, sample_id, prompt, seed, error)
        self.turn = turn
        self.turns = turns
        self.kept_len = kept_len
        self.conv = conv
        if conv is not None and turn != turns - 1:
            self.key = f"{self.key}:turn{turn}"  # the rid of an earlier turn differs from the final turn's

    def next_job(self, output: np.ndarray) -> "TurnJob | None":
        """After this turn finished ``ok`` with ``output``: the job of the conversation's next turn, or None."""
        conv = self.conv
        if conv is None or self.turn + 1 >= self.turns:
            return None
        conv.outputs[self.turn] = np.asarray(output, dtype=np.int32)
        return turn_job(conv, self.turn + 1)


def turn_job(conv: Conversation, k: int) -> TurnJob:
    """The job of turn ``k`` of ``conv`` (its earlier regenerated turns' outputs in ``conv.outputs``)."""
    return TurnJob(conv.row, conv.sample_id, conv.prompt(k), conv.seed(k), k, conv.n_turns, conv.kept_len, conv)


def read_first_turns(path: Path, rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows`` (sorted): the first flagged turn in the findings' ``turns`` column, or -1
    (no ``turns`` column, an empty list: only whole-sample checks flag it, or a row not in the file)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dqa.audit.scan_folder import findings_file

    out = np.full(rows.size, -1, dtype=np.int64)
    path = findings_file(path)
    try:
        if "turns" not in pq.read_schema(path).names:
            return out
        t = pq.read_table(path, columns=["row", "turns"])
    except (pa.ArrowException, OSError):
        return out
    col = t.column("turns").combine_chunks()
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or len(col) == 0:
        return out
    flat = pc.fill_null(col.flatten(), -1).to_numpy(zero_copy_only=False).astype(np.int64)
    parents = pc.list_parent_indices(col).to_numpy().astype(np.int64)
    keep = flat >= 0
    mins = np.full(len(col), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(mins, parents[keep], flat[keep])
    f_rows = t.column("row").to_numpy().astype(np.int64)
    has = mins != np.iinfo(np.int64).max
    f_rows, mins = f_rows[has], mins[has]
    order = np.argsort(f_rows, kind="stable")
    f_rows, mins = f_rows[order], mins[order]
    pos = np.searchsorted(f_rows, rows)
    hit = (pos < f_rows.size) & (f_rows[np.minimum(pos, max(f_rows.size - 1, 0))] == rows) if f_rows.size else np.zeros(rows.size, bool)
    out[hit] = mins[pos[hit]]
    return out


def iter_turn_jobs(dataset, rows: np.ndarray, fmt, mode: str = "flagged", first_flagged: np.ndarray | None = None,
                   partial: dict[int, dict[int, np.ndarray]] | None = None, seed_base: int = 0,
                   batch_rows: int = 4096, generation_prompt: tuple[int, ...] | None = None,
                   first_chunk: int = FIRST_CHUNK) -> Iterator[list[Job]]:
    """Stream the first pending turn's ``TurnJob`` of each selected row, in dataset order, one list
    per dataset batch (the first ``first_chunk`` rows come as a list of their own, so the first
    requests go out before the whole first batch is built).

    Which turns a conversation regenerates (``mode``): ``last`` its final assistant turn; ``all``
    every assistant turn; ``flagged`` from the first turn the findings flag (``first_flagged``,
    aligned with ``rows``; -1 or out of range: the final turn) to the last. A conversation in
    ``partial`` (turn -> output of the turns an earlier session recorded ok) continues at its next
    turn on that regenerated history. Every prompt ends in ``generation_prompt`` (default: the
    format's, thinking on; the openai protocol passes the bare header, its server's template adds
    the rest). A row without an assistant header becomes a job with ``error`` set (recorded as
    failed, never sent). Header positions, and the prompts of rows with one turn to regenerate
    (all single-turn data), come from vectorized passes per batch; a conversation with later turns
    to regenerate is built per conversation. Raises ``UsageError`` for an unknown ``mode``.
    """
    if mode not in TURN_MODES:
        raise UsageError(f"--turns {mode!r}: expected one of {', '.join(TURN_MODES)}")
    if rows.size == 0:
        return
    partial = partial or {}
    partial_rows = np.fromiter(partial, dtype=np.int64, count=len(partial))  # conversations to continue
    header = tuple(fmt.assistant_header)
    hlen = len(header)
    gen_ids = tuple(fmt.generation_prompt if generation_prompt is None else generation_prompt)
    gen = np.asarray(gen_ids, dtype=np.int32)
    last = int(rows[-1])
    chunk = max(1, first_chunk)
    for b in dataset.batches(batch_rows=batch_rows):
        lo, hi = b.start_row, b.start_row + b.num_rows
        i0, i1 = np.searchsorted(rows, [lo, hi])
        if i1 > i0:
            hpos, hrow = header_starts(b.ids, b.offsets, header)
            c0 = i0
            while c0 < i1:
                c1 = min(i1, c0 + chunk) if chunk else i1
                chunk = 0  # only the very first list is short
                ff = first_flagged[c0:c1] if mode == "flagged" and first_flagged is not None else None
                yield _batch_turn_jobs(b, rows[c0:c1] - lo, hpos, hrow, mode, ff, partial, partial_rows, seed_base, gen, gen_ids,
                                       hlen, fmt)
                c0 = c1
        if hi > last:
            return


def _batch_turn_jobs(b, local: np.ndarray, hpos: np.ndarray, hrow: np.ndarray, mode: str, first_flagged: np.ndarray | None,
                     partial: dict, partial_rows: np.ndarray, seed_base: int, gen: np.ndarray, gen_ids: tuple[int, ...], hlen: int,
                     fmt) -> list[Job]:
    """The jobs of the batch rows ``local`` (see ``iter_turn_jobs``)."""
    lo = b.start_row
    h_lo = np.searchsorted(hrow, local, side="left")
    h_hi = np.searchsorted(hrow, local, side="right")
    n_heads = h_hi - h_lo
    starts = b.offsets[local].astype(np.int64)
    if mode == "all":
        first = np.zeros(local.size, dtype=np.int64)
    elif first_flagged is not None:
        ff = np.asarray(first_flagged, dtype=np.int64)
        first = np.where((ff >= 0) & (ff < n_heads), ff, n_heads - 1)
    else:
        first = n_heads - 1
    resumed = np.isin(local + lo, partial_rows) if partial_rows.size else np.zeros(local.size, dtype=bool)
    # One turn to regenerate (all single-turn data): the row up to that header, then the
    # generation prompt; built for the whole list at once, with no conversation state to carry.
    single = (n_heads > 0) & (first == n_heads - 1) & ~resumed
    s_idx = np.flatnonzero(single)
    cuts = hpos[h_hi[s_idx] - 1] - starts[s_idx] if s_idx.size else np.zeros(0, dtype=np.int64)
    values, p_off = _prompts_then(b.ids, starts[s_idx], cuts, gen)
    texts = _id_texts(values, p_off)
    slot = np.full(local.size, -1, dtype=np.int64)
    slot[s_idx] = np.arange(s_idx.size)
    ids_col = b.row_ids.take(local).cast("string").to_pylist() if b.row_ids is not None else [None] * local.size
    jobs: list[Job] = []
    built: list[Job] = []  # conversation jobs, whose prompt texts are built at the end
    # Python ints and list indexing in the per-row loop (numpy scalars cost a conversion each)
    rows_l, slot_l, first_l, heads_l = (local + lo).tolist(), slot.tolist(), first.tolist(), n_heads.tolist()
    off_l, kept_l = p_off.tolist(), (cuts + hlen).tolist()
    for k in range(local.size):
        row = rows_l[k]
        sid = ids_col[k]
        seed = sample_seed(sid if sid is not None else str(row), seed_base)
        s = slot_l[k]
        if s >= 0:
            job = TurnJob(row, sid, values[off_l[s] : off_l[s + 1]], seed, first_l[k], heads_l[k], kept_l[s])
            job.prompt_text = texts[s]
            jobs.append(job)
            continue
        n = heads_l[k]
        if n == 0:
            err = f"row {row}: no assistant header in input_ids; nothing to regenerate from"
            jobs.append(TurnJob(row, sid, np.zeros(0, np.int32), seed, -1, 0, 0, error=err))
            continue
        start = int(starts[k])
        heads = hpos[h_lo[k] : h_hi[k]] - start
        done = partial.get(row)
        orig = np.array(b.ids[start : int(b.offsets[local[k] + 1])], dtype=np.int32)  # kept past the batch, for later turns' prompts
        conv = Conversation(row, sid, orig, heads.astype(np.int64), turn_ends(orig, heads, fmt), min(done) if done else first_l[k],
                            fmt, seed_base, gen_ids)
        for t, out in (done or {}).items():
            conv.outputs[t] = out
        nxt = conv.next_turn()
        if nxt >= n:
            continue  # every turn recorded (recovery counts it as ended; not expected here)
        job = turn_job(conv, nxt)
        jobs.append(job)
        built.append(job)
    _prebuild_texts(built)
    return jobs


def _prompts_then(ids: np.ndarray, starts: np.ndarray, cuts: np.ndarray, tail: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ids[starts[k] : starts[k] + cuts[k]]`` followed by ``tail``, for every k, as one flat int32
    array and its offsets (prompt k is ``values[p_off[k] : p_off[k + 1]]``)."""
    lens = cuts + tail.size
    p_off = np.zeros(lens.size + 1, dtype=np.int64)
    np.cumsum(lens, out=p_off[1:])
    values = np.empty(int(p_off[-1]), dtype=np.int32)
    r = _ranks(cuts)
    values[np.repeat(p_off[:-1], cuts) + r] = ids[np.repeat(starts, cuts) + r]
    if tail.size:
        values[(p_off[:-1] + cuts)[:, None] + np.arange(tail.size)] = tail
    return values, p_off


def _id_texts(values: np.ndarray, p_off: np.ndarray) -> list[bytes]:
    """Each prompt of the flat ``values`` (prompt k is ``values[p_off[k] : p_off[k + 1]]``) as JSON
    list items, ``b"1,2,3"``: what a request body embeds. Built with Arrow kernels, which release
    the GIL (the refill thread runs beside the event loop)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = p_off.size - 1
    if n <= 0:
        return []
    strings = pc.cast(pa.array(values, pa.int32()), pa.large_string())  # 64-bit offsets: no size limit per batch
    text = pc.binary_join(pa.LargeListArray.from_arrays(pa.array(p_off, pa.int64()), strings), pa.scalar(",", pa.large_string()))
    t_off = np.frombuffer(text.buffers()[1], dtype=np.int64, count=len(text) + 1, offset=text.offset * 8)
    t_data = text.buffers()[2].to_pybytes() if text.buffers()[2] is not None else b""
    return [t_data[t_off[k] : t_off[k + 1]] for k in range(n)]


def _prebuild_texts(jobs: list[Job]) -> None:
    """Set each sendable job's ``prompt_text`` (``_id_texts``), built for the whole list at once."""
    todo = [j for j in jobs if j.error is None]
    if not todo:
        return
    lens = np.fromiter((j.prompt.size for j in todo), dtype=np.int64, count=len(todo))
    p_off = np.zeros(len(todo) + 1, dtype=np.int64)
    np.cumsum(lens, out=p_off[1:])
    values = np.concatenate([j.prompt for j in todo]).astype(np.int32, copy=False)
    for j, text in zip(todo, _id_texts(values, p_off)):
        j.prompt_text = text
