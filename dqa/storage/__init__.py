"""Where data lives: local paths and object-store URLs, behind one owner.

Every command and Python entry point that takes a dataset, a scan, a run or a release, or writes
one, accepts a local path or a URL. This package turns either into something to read or write:

- ``location(s)``: a local ``pathlib.Path``, or a ``StorePath`` (``store_path``) for a URL: a
  pyarrow filesystem and a path inside it, with the small part of ``Path``'s API the readers use
  (``/``, ``name``, ``is_file``, ``rglob``, ``stat``, ``open``).
- ``filesystems``: which filesystem a URL gets. pyarrow's own C++ filesystems where they exist
  (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``: parallel range reads, the SDKs' own retries
  and credentials), fsspec for every other scheme (``hf://``, ``memory://``, any installed
  backend), wrapped as a pyarrow filesystem so the readers see one interface. ``configure``
  takes ``--storage-option KEY=VALUE`` pairs.
- ``faults``: a store's failures as dqa's errors: missing bucket or key and refused credentials
  are ``InputError`` (exit 2), a store that fails or times out is ``RuntimeFailure`` (exit 3);
  one line naming the URL and the cause, never a credential.
- ``folders``: outputs in a store. A command writes its folder locally as it always does
  (``output_folder`` stages it), then ``publish`` uploads the parts first and the file that
  makes the folder complete last, under an ``_INCOMPLETE`` marker that readers refuse; inputs
  that dqa wrote (a scan folder, a run folder) are read through ``input_folder``.

Imports only ``dqa.errors`` and ``dqa.atomic``; pyarrow's filesystems and fsspec are imported on first use.
"""

from __future__ import annotations

from dqa.storage.store_path import StorePath, is_url, location, open_binary, open_input, open_stream, url_of
from dqa.storage.filesystems import configure, parse_options
from dqa.storage.faults import store_errors
from dqa.storage.folders import INCOMPLETE, check_complete, input_folder, local_if_written, output_folder, output_path, publish, repoint, repoint_files, staged_path

__all__ = [
    "INCOMPLETE", "StorePath", "check_complete", "configure", "input_folder", "is_url", "local_if_written", "location",
    "open_binary", "open_input", "open_stream", "output_folder", "output_path", "parse_options", "publish", "repoint", "repoint_files", "staged_path", "store_errors", "url_of",
]
