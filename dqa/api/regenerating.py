"""``dqa.regenerate``: regenerate the flagged samples on a fleet from Python; what ``dqa regen`` runs.

::

    run = dqa.regenerate("train.parquet", "regen-out/", endpoints=["http://10.0.0.5:30000"], tokenizer="qwen3")
    run.progress["ok"], run.shards

The options are ``RegenConfig``'s flat keywords (one per ``dqa regen`` option: ``endpoints``,
``fleet`` (a fleet file, or several: one per node), ``reasons``, ``turns``, ``max_new_tokens`` ...),
or a whole ``config``. A run that stops
before every selected row is recorded raises ``RegenStopped`` (its ``result`` holds the progress);
rerunning resumes it. Messages never carry the credentials of an ``out``/``mirror`` URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dqa.errors import DqaError, RegenStopped

if TYPE_CHECKING:
    from dqa.regen.config import RegenConfig
    from dqa.regen.run import RunResult


def _findings_here(config: "RegenConfig") -> "RegenConfig":
    """``config`` with findings given as a URL replaced by their local copy (a scan folder in a store is read
    through ``dqa.storage.input_folder``, refused when an upload left it incomplete)."""
    from dataclasses import replace

    from dqa.audit.scan_folder import SUMMARY_FILE
    from dqa.storage import input_folder, is_url, location

    given = config.selection.findings
    if not given or not is_url(given):
        return config
    loc = location(given)
    local = input_folder(loc.parent, SUMMARY_FILE) / loc.name if loc.is_file() else input_folder(loc, SUMMARY_FILE)
    return replace(config, selection=replace(config.selection, findings=str(local)))


def regenerate(dataset: str | Path | None = None, out: str | None = None, *, config: "RegenConfig | None" = None,
               **options: Any) -> "RunResult":
    """Run (or resume) the regeneration of ``dataset``'s selected rows into ``out``; returns its ``RunResult``.

    Give ``dataset``, ``out`` and ``RegenConfig``'s flat keywords, or a built ``config`` alone.
    Raises ``UsageError``/``InputError`` for a bad option, dataset, findings or output folder (before
    any server is contacted), ``RuntimeFailure`` when the fleet cannot be reached at start-up,
    ``RegenStopped`` when the run stopped before every selected row was recorded, ``TypeError`` for an
    unknown option or a ``config`` given with other arguments.
    """
    from dqa.regen.config import RegenConfig
    from dqa.regen.run import regenerate as run_regenerate
    from dqa.regen.wire.urls import strip_userinfo

    if config is None:
        config = RegenConfig(dataset=dataset, out=out, **options)
    elif dataset is not None or out is not None or options:
        raise TypeError("regenerate: give a config, or the dataset, out and options; not both")
    try:
        result = run_regenerate(_findings_here(config))
    except DqaError as exc:  # an --out/--mirror URL may carry credentials: never show them
        raise type(exc)(strip_userinfo(str(exc))) from None
    except OSError as exc:
        raise OSError(exc.errno, strip_userinfo(exc.strerror or str(exc)), strip_userinfo(str(exc.filename or ""))) from None
    if result.exit_code != 0:
        raise RegenStopped(result.message, result, result.exit_code)
    return result
