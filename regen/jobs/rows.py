"""Which rows to regenerate: findings -> rows (the jobs built from them: ``turns``).

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

import numpy as np

from dqa.errors import InputError, UsageError


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
