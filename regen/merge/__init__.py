"""dqa.regen.merge: put regenerated samples back into the dataset (``dqa merge``).
Owns ``merge`` and its ``MergeOptions`` and ``MergeSummary`` report; its modules do the steps.

The steps
    ``index`` (which rows the shards replace, and where each lives) -> ``convention`` (how the
    input masks a turn) -> ``tokens`` (the tokenized merge) or ``conversations`` (conversation
    JSONL), each writing ``provenance`` (the ``dqa_regen`` column) and the report (``report``).
    ``options`` and ``report`` are leaves, so the steps can use them without an import circle;
    ``columns`` holds the two Arrow helpers they share.

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

    Conversation JSONL input is written back as conversation JSONL (``conversations``):
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

import time
from dataclasses import replace
from pathlib import Path

from dqa.errors import InputError
from dqa.regen.merge.conversations import merge_conversations
from dqa.regen.merge.index import COLUMN_KEYS, load_regen_index, run_columns
from dqa.regen.merge.options import ACCEPT_CHOICES, DEFAULT_ACCEPT, MergeOptions
from dqa.regen.merge.provenance import PROVENANCE_COLUMN
from dqa.regen.merge.report import MergeSummary, report_path
from dqa.regen.merge.tokens import merge_tokens

__all__ = ["ACCEPT_CHOICES", "DEFAULT_ACCEPT", "PROVENANCE_COLUMN", "MergeOptions", "MergeSummary", "merge", "report_path"]


def merge(dataset: str | Path, regen_dirs: list[str | Path], out: str | Path, options: MergeOptions | None = None) -> MergeSummary:
    """Merge the regen shards of ``regen_dirs`` into a copy of ``dataset`` at ``out``, as ``options``
    say (None: ``MergeOptions()``, the defaults of ``dqa merge``).

    Returns a ``MergeSummary`` (also written, with the unregenerated rows, to
    ``report_path(out)``). Raises ``InputError`` / ``RuntimeFailure`` as described in the
    module docstring; on any error ``out`` is not created.
    """
    from dqa.audit.readers import open_dataset
    from dqa.audit.writers import check_output_path

    options = MergeOptions() if options is None else options
    t0 = time.perf_counter()
    out = Path(out)
    regen = [Path(d) for d in regen_dirs]
    if not regen:
        raise InputError("give --regen DIR (the --out folder of dqa regen)")
    cols = (options.ids_column, options.mask_column, options.labels_column, options.id_column)
    if not any(cols):  # none given here: the ones given to dqa regen, so both read the same columns
        cols = tuple(run_columns(regen)[k] for k in COLUMN_KEYS)
    ds = open_dataset(dataset, *cols)
    check_output_path(ds, out, options.force)
    for d in regen:
        shards = (d / "shards").resolve()
        if shards == out.resolve() or shards in out.resolve().parents:
            raise InputError(f"--out {out}: inside the regen shards folder {shards}; choose another place")
    accept = tuple(dict.fromkeys(options.accept))
    bad = [a for a in accept if a not in ACCEPT_CHOICES]
    if bad or "ok" not in accept:
        raise InputError(f"--accept {','.join(accept)}: expected ok or ok,length")
    options = replace(options, accept=accept)
    index = load_regen_index(regen, accept)
    if ds.format == "conversations":
        return merge_conversations(ds, regen, out, index, options, t0)
    return merge_tokens(ds, regen, out, index, options, t0)
