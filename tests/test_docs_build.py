"""The docs site (mkdocs.yml, docs/) builds with `mkdocs build --strict`: a warning fails it.

Strict mode with mkdocs.yml's `validation` settings turns into failures: a link to a page or an
anchor that does not exist, a link outside docs/ (a repository file is named as code instead,
e.g. `bench/README.md`), a page of docs/ missing from the nav, and a missing file included with
pymdownx.snippets (docs/formats.md and docs/reliability.md include FORMATS.md and RELIABILITY.md
from the repository root). Needs mkdocs and mkdocs-material (the `test` extra).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]


def test_the_docs_site_builds_strict(tmp_path):
    import importlib.util

    assert importlib.util.find_spec("material"), "mkdocs-material is not installed: pip install -e '.[test]' installs it"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log[-4000:]}"
    assert "WARNING" not in log, log[-4000:]
    site = tmp_path / "site"
    for page in ("scan", "plan", "fleet", "regen", "merge", "validate", "gate", "report", "repair", "design",
                 "sglang", "formats", "reliability"):
        assert (site / page / "index.html").is_file(), f"docs/{page}.md was not built"
    # the included files really were included
    assert "findings.parquet" in (site / "formats" / "index.html").read_text()
    assert "What was tried, what held" in (site / "reliability" / "index.html").read_text()
