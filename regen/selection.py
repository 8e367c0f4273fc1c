"""Which rows to regenerate, and the stream of their prompts.

Selection: the failing rows of ``dqa scan``'s ``findings.parquet`` (columns
``row`` int64, ``id``, ``reasons`` list<string>), optionally narrowed to
``reasons``; or every row (``--all``). ``--shard i/N`` keeps rows with
``row % N == i`` (deterministic, so N driver hosts split the work without
talking to each other); ``--limit`` then keeps the first ``limit`` rows.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import numpy as np

from dqa.arrays import ranks as _ranks
from dqa.errors import InputError, UsageError
from dqa.regen.client import Job
from dqa.regen.prompts import NO_HEADER, prompt_ends, sample_seed

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


def default_findings(dataset_name: str) -> Path:
    """Where ``dqa scan`` writes findings by default: ``dqa-out/<dataset name>/findings.parquet``."""
    return Path("dqa-out") / dataset_name / "findings.parquet"


def read_findings(path: Path, reasons: list[str] | None) -> np.ndarray:
    """Sorted unique failing rows of ``findings.parquet`` (a file, or a folder holding it).

    Raises ``InputError`` for a missing or malformed file and for a reason that
    neither is a known check nor appears in the file.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dqa.audit.checks import CHECK_NAMES

    if path.is_dir():
        path = path / "findings.parquet"
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


def iter_jobs(dataset, rows: np.ndarray, header: tuple[int, ...], seed_base: int = 0, batch_rows: int = 4096) -> Iterator[list[Job]]:
    """Stream ``Job`` lists, one per dataset batch that holds selected rows, in dataset order.

    A selected row without an assistant header becomes a ``Job`` with
    ``error`` set (recorded as failed, never sent). Prompts are gathered and
    their JSON text (``"1,2,3"``) is built per batch with Arrow kernels, off the
    event loop and without the GIL. Memory is bounded by a batch.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if rows.size == 0:
        return
    last = int(rows[-1])
    for b in dataset.batches(batch_rows=batch_rows):
        lo, hi = b.start_row, b.start_row + b.num_rows
        i0, i1 = np.searchsorted(rows, [lo, hi])
        if i1 > i0:
            local = rows[i0:i1] - lo
            ends = prompt_ends(b.ids, b.offsets, header)[local]
            lens = np.where(ends == NO_HEADER, 0, ends)
            starts = b.offsets[local]
            p_off = np.zeros(local.size + 1, dtype=np.int64)
            np.cumsum(lens, out=p_off[1:])
            values = b.ids[np.repeat(starts, lens) + _ranks(lens)]
            listed = pa.ListArray.from_arrays(pa.array(p_off.astype(np.int32)), pa.array(values, pa.int32()))
            text = pc.binary_join(pa.ListArray.from_arrays(listed.offsets, pc.cast(listed.values, pa.string())), ",")
            t_off = np.frombuffer(text.buffers()[1], dtype=np.int32, count=len(text) + 1, offset=text.offset * 4)
            t_data = text.buffers()[2].to_pybytes() if text.buffers()[2] is not None else b""
            ids_col = b.row_ids.take(local).cast("string").to_pylist() if b.row_ids is not None else [None] * local.size
            jobs = []
            for k in range(local.size):
                row = lo + int(local[k])
                sid = ids_col[k]
                key = sid if sid is not None else str(row)
                if ends[k] == NO_HEADER:
                    err = f"row {row}: no assistant header in input_ids; nothing to regenerate from"
                    jobs.append(Job(row, sid, values[0:0], sample_seed(key, seed_base), error=err))
                    continue
                job = Job(row, sid, values[p_off[k] : p_off[k + 1]], sample_seed(key, seed_base))
                job.prompt_text = t_data[t_off[k] : t_off[k + 1]]
                jobs.append(job)
            yield jobs
        if hi > last:
            return
