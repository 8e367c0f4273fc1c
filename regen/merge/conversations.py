"""The conversation merge: conversation JSONL in, conversation JSONL out, the replies as text.

``merge_conversations`` rewrites each replaced conversation's regenerated assistant turns with
the new ``content`` and ``reasoning_content`` (``split_reply``: the run's tokens decoded with its
tokenizer), after checking that the conversation still renders to the tokens the run copied
from it (``kept_len``), and records the provenance as a ``dqa_regen`` object.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dqa.errors import InputError
from dqa.regen.merge.index import RegenIndex, check_rows_in_range, read_manifest
from dqa.regen.merge.options import MergeOptions
from dqa.regen.merge.provenance import PROVENANCE_COLUMN, provenance_rows
from dqa.regen.merge.report import MergeSummary, report_path
from dqa.regen.store.shards import ShardStatus

_LENGTH, _FAILED = ShardStatus.LENGTH.code, ShardStatus.FAILED.code


def _run_tokenizer(regen: list[Path]) -> str | None:
    for d in regen:
        manifest = read_manifest(Path(d))
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
    the rest, after ``</think>`` and its newlines, as content; end of turn dropped (GLM: the role token
    the reply stopped on)."""
    ids = [int(t) for t in output]
    if ids and (ids[-1] == fmt.eot or (fmt.ends_at_next_role and ids[-1] in fmt.turn_openers)):
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


def merge_conversations(ds: Any, regen: list[Path], out: Path, index: RegenIndex, options: MergeOptions,
                        t0: float) -> MergeSummary:
    """``merge`` for conversation JSONL: NEW is conversation JSONL (same file names, one line per
    record, blank lines dropped) where each replaced conversation's regenerated assistant turns get
    the new ``content`` and ``reasoning_content`` (SpecForge's regenerated format; ShareGPT records
    keep ``from``/``value``), and a ``dqa_regen`` object records the provenance (null elsewhere).
    Unregenerated rows are kept or dropped as for tokenized data. Returns the ``MergeSummary``;
    raises ``InputError`` when run.json names no loadable tokenizer, or a line's id or kept tokens
    differ from the run's, and as ``merge`` describes."""
    from dqa import atomic
    from dqa.audit.formats.conversations import LIST_KEYS, SHAREGPT_ROLES
    from dqa.audit.template import load_template
    from dqa.audit.writers import output_is_folder
    from dqa.errors import DqaError

    failed, accept, on_batch, on_start = options.failed, options.accept, options.on_batch, options.on_start
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
    from dqa.audit.formats.conversations import Renderer

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
    prov = provenance_rows(index, replace)
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
        check_rows_in_range(index, row, ds.path)
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
