"""Steps 2 and 3 of a ``dqa regen`` run: the dataset and its rows, then the chat format.

* ``open_and_select(DatasetSpec, Selection) -> Inputs``: the dataset, the selected rows and the
  run's identity (``warn_thinking_off`` reads the scan's summary);
* ``load_template(DatasetSpec, SamplingSpec, Inputs, kind) -> TemplateSpec``: the chat format;
  adds the identity's sampling part.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from dqa.errors import UsageError
from dqa.regen.config import DatasetSpec, SamplingSpec, Selection
from dqa.regen.jobs.rows import check_findings_for, findings_for, narrow, selected_rows, selection_digest
from dqa.regen.run_values import Inputs
from dqa.regen.servers import ServerKind


def dataset_identity(ds, num_rows: int) -> dict[str, Any]:
    """run.json's ``identity.dataset``: name, format, rows and the files with their sizes."""
    base = ds.path if ds.path.is_dir() else ds.path.parent
    files = []
    for f in ds.files:
        try:
            rel = str(f.relative_to(base))
        except ValueError:
            rel = f.name
        files.append([rel, f.stat().st_size])
    return {"name": ds.name, "format": ds.format, "rows": num_rows, "files": files}


def count_rows(ds) -> int:
    """Rows of ``ds``: from metadata where the format keeps it, else from the record batch lengths
    of the ids column alone (JSONL, Arrow streams, HF), without decoding tokens."""
    n = ds.num_rows
    if n is None:
        n = sum(rb.num_rows for _, rb in ds.record_batches(1 << 30, [ds.columns.ids]))
    return int(n)


def open_and_select(data: DatasetSpec, sel: Selection) -> Inputs:
    """Open the dataset (conversations: rendered with the chat template, as ``dqa scan`` reads
    them), count its rows and select the rows to regenerate. Returns ``Inputs`` with the identity's
    dataset and selection parts; raises ``InputError`` for an unreadable dataset, findings of another
    dataset (or one changed since its scan) and rows past the dataset's end."""
    from dqa.audit.readers import open_dataset
    from dqa.audit.template import load_template

    ds = open_dataset(data.path, data.ids_column, data.mask_column, data.labels_column, data.id_column)
    early_spec = None
    if ds.format == "conversations":  # rendered with the chat template at read time (as dqa scan reads it)
        early_spec = load_template(data.tokenizer, decode=True)
        ds.set_chat_format(early_spec)
    num_rows = count_rows(ds)
    # Resolved: run.json records it for `dqa merge`, which may run from another directory.
    findings = (Path(sel.findings) if sel.findings else findings_for(data.path)).resolve()
    if sel.failed_only:
        check_findings_for(findings, ds)  # another dataset's findings, or a dataset changed since its scan
    reasons = list(sel.reasons) if sel.reasons is not None else None
    rows_all = selected_rows(num_rows, findings if sel.failed_only else None, sel.failed_only, reasons)
    shard = sel.shard_pair
    rows = narrow(rows_all, shard, sel.limit)
    identity: dict[str, Any] = {
        "dataset": dataset_identity(ds, num_rows),
        "selection": {
            "failed_only": sel.failed_only,
            "reasons": sorted(reasons) if reasons else None,
            "rows_sha256": selection_digest(rows_all),
            "shard": f"{shard[0]}/{shard[1]}",
            "turns": sel.turns,
        },
    }
    return Inputs(ds, num_rows, findings, rows_all, rows, early_spec, identity, sel)


def warn_thinking_off(inputs: Inputs, log: Callable[[str], None]) -> None:
    """Say so when the scan found a thinking-off set (``thinking_expected`` false: almost no
    sample thinks, as LLaMA-Factory data rendered with empty think blocks) and only its flagged
    rows are regenerated: those come back thinking, the rest do not, and a rescan of the merged
    set then expects thinking and flags every untouched sample's empty think block."""
    if not inputs.selection.failed_only or inputs.rows.size == 0 or inputs.rows.size >= inputs.num_rows:
        return
    from dqa.audit.scan_folder import read_summary, scan_folder_of

    summary = read_summary(scan_folder_of(inputs.findings))
    if summary is not None and summary.get("thinking_expected") is False:
        log(f"note: the scan found thinking not expected in this set (no or almost no sample thinks); the {inputs.rows.size:,} "
            f"regenerated rows will think and the other {inputs.num_rows - inputs.rows.size:,} will not, so a rescan of the "
            "merged set will flag their empty think blocks (empty_thinking): regenerate every row (--all) for one mode")


def load_template(data: DatasetSpec, sampling: SamplingSpec, inputs: Inputs, kind: ServerKind) -> Any:
    """The chat format (the one the dataset was read with, else ``--tokenizer``); adds the
    identity's sampling part (parameters, seed base, assistant header, and the generation prompt
    when the kind's servers take the prompt tokens as they are). Returns the template spec;
    raises ``UsageError`` when a chat-rendering kind has no tokenizer folder."""
    from dqa.audit.template import load_template as load

    spec = inputs.spec or load(data.tokenizer, decode=kind.chat_rendered)
    inputs.spec = spec
    identity = inputs.identity
    identity["sampling"] = {**sampling.as_dict(), "seed_base": sampling.seed_base, "template": list(spec.assistant_header)}
    if spec.think_prefix and not kind.chat_rendered:  # the generation prompt goes past the header (Qwen3.5/3.6: "<think>\n")
        identity["sampling"]["generation_prompt"] = list(spec.generation_prompt)
    if kind.chat_rendered and spec.tokenizer_dir is None:
        raise UsageError(f"--protocol {kind.protocol} renders replies with the chat template: give --tokenizer PATH "
                         "(a folder with tokenizer.json)")
    return spec
