"""Every shell command and Python example in README.md and the docs/ pages runs as written from the repository root.

Each ```bash and ```python block of those files is preceded by a marker, invisible on GitHub and
in the docs site:

    <!-- readme-test: run -->            the test runs the block
    <!-- readme-test: skip: REASON -->   it needs what CI has not (GPUs, model folders, your own data)

A block without a marker fails the test, so a new example cannot slip in untried.

Order and state: one copy of the repository's files (what a fresh clone has), with this
environment's `dqa` and `python` on PATH, after the quick start's data build. The README runs
first, then each docs page in the order of `mkdocs.yml`'s nav (PAGES: index, scan, plan, fleet,
regen, merge, validate, gate, report, repair, formats, reliability, design, sglang), all in that
same copy. Within a file the run blocks execute in file order. The pages are not self-contained:
they use what the README's blocks made (`examples/data/`, the scan `dqa-out/example/`, the
loop's `regen-out/`, `release/example-v2.parquet` and its scan `dqa-out/example-v2/`), and say
so where they do; a page must not depend on a page after it in the nav.

Each command must exit 0, or the code its trailing comment names (`# exit 1 ...`); a command
ending in `&` runs in the background of its block. A ```python block is one command: its whole
text, run by `python -` (it must exit 0: an assert that fails, fails it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NAV_PAGE = re.compile(r"^\s*-\s*(?:[^:\n]+:\s*)?(\S+\.md)\s*$", re.M)


def docs_pages() -> list[str]:
    """The docs pages in the order of mkdocs.yml's nav, as paths relative to the repository root."""
    return [f"docs/{name}" for name in NAV_PAGE.findall((REPO / "mkdocs.yml").read_text())]


def pages() -> list[str]:
    """The files whose commands run, in run order: the README, then the docs pages in nav order."""
    return ["README.md", *docs_pages()]
MARKER = re.compile(r"<!--\s*readme-test:\s*(run|skip:\s*(?P<why>.+?))\s*-->")
EXPECTED_EXIT = re.compile(r"#\s*exit (\d)\b")


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    action: str  # "run" or "skip"
    why: str
    commands: list[tuple[int, str]]  # (line, command) with continuations joined, comments kept; python: one, the whole text
    lang: str = "bash"  # "bash" or "python"


def readme_blocks(text: str, name: str = "README.md") -> list[Block]:
    """The ```bash and ```python blocks of one file (NAME, for messages) with their markers.

    Raises AssertionError for an unmarked block.
    """
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() not in ("```bash", "```python"):
            i += 1
            continue
        lang = lines[i].strip()[3:]
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        m = MARKER.search(prev)
        assert m, f"{name}:{i + 1}: a ```{lang} block without a <!-- readme-test: run|skip: why --> marker"
        start, i = i + 1, i + 1
        commands: list[tuple[int, str]] = []
        if lang == "python":
            while lines[i].strip() != "```":
                i += 1
            body = "\n".join(lines[start:i])
            commands = [(start + 1, body)] if body.strip() else []
            blocks.append(Block(start, "run" if m.group(1) == "run" else "skip", m.group("why") or "", commands, lang))
            i += 1
            continue
        pending = ""
        while lines[i].strip() != "```":
            line = lines[i]
            if pending:
                pending += "\n" + line
            elif line.strip() and not line.lstrip().startswith("#"):
                pending, first = line, i + 1
            if pending and not line.rstrip().endswith("\\"):
                commands.append((first, pending))
                pending = ""
            i += 1
        blocks.append(Block(start, "run" if m.group(1) == "run" else "skip", m.group("why") or "", commands))
        i += 1
    return blocks


def block_script(block: Block, name: str = "README.md") -> str:
    """A bash script running each command and stopping at the first unexpected exit code (NAME: the file, for messages)."""
    out = ["set -u"]
    if block.lang == "python":
        (line, body), = block.commands
        return "\n".join([*out, f"python - <<'README_PY'\n{body}\nREADME_PY",
                          f"rc=$?\nif [ $rc != 0 ]; then echo '{name}:{line}: python exit '$rc', expected 0' >&2; exit 99; fi"])
    for line, cmd in block.commands:
        code = EXPECTED_EXIT.search(cmd.splitlines()[-1])
        body = re.sub(r"\s+#[^\n]*$", "", cmd)
        if body.rstrip().endswith("&"):
            out.append(body)
            continue
        want = int(code.group(1)) if code else 0
        out.append(f"{body}\nrc=$?\nif [ $rc != {want} ]; then echo '{name}:{line}: exit '$rc', expected {want}' >&2; "
                   f"kill $(jobs -p) 2>/dev/null; exit 99; fi")
    out.append("kill $(jobs -p) 2>/dev/null; wait; exit 0")
    return "\n".join(out)


def test_every_bash_block_is_marked_and_skips_say_why():
    blocks = readme_blocks((REPO / "README.md").read_text())
    assert blocks, "no ```bash block found in README.md"
    # the quick start's scan, the whole loop, the loop on a bucket, the scan on Ray, the From Python example
    assert sum(b.action == "run" for b in blocks) >= 5
    assert any(b.lang == "python" and b.action == "run" for b in blocks), "the From Python example is not run"
    runs = 0
    for name in pages():
        for b in readme_blocks((REPO / name).read_text(), name):
            runs += b.action == "run"
            assert b.commands, f"{name}:{b.line}: an empty block"
            if b.action == "skip":
                assert len(b.why) > 10, f"{name}:{b.line}: a skip needs a reason"
    assert runs >= 10, f"only {runs} run blocks in {pages()}"


def test_every_docs_page_is_in_the_nav_and_runs():
    """mkdocs.yml's nav lists every page of docs/ once (its order is the run order), and each command page runs something."""
    nav = docs_pages()
    assert len(nav) == len(set(nav)), f"a page listed twice in mkdocs.yml's nav: {nav}"
    on_disk = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))
    assert sorted(nav) == on_disk, f"mkdocs.yml's nav {sorted(nav)} != the pages of docs/ {on_disk}"
    for command in ("scan", "plan", "fleet", "regen", "merge", "validate", "gate", "report", "repair"):
        name = f"docs/{command}.md"
        assert name in nav, f"no page for dqa {command}"
    for command in ("scan", "plan", "fleet", "regen", "merge", "validate", "gate", "report", "repair"):
        name = f"docs/{command}.md"
        assert any(b.action == "run" for b in readme_blocks((REPO / name).read_text(), name)), f"{name}: nothing runs"


def repo_copy(dest: Path) -> Path:
    """The files a fresh clone of this working tree would have (tracked and untracked, not ignored)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.mark.slow
def test_the_readme_and_docs_commands_run_as_written(tmp_path):
    root = repo_copy(tmp_path / "clone")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "120"}
    env.pop("DQA_FLEET", None)
    env.pop("GITHUB_STEP_SUMMARY", None)
    # The quick start's data build (examples/quickstart.sh also makes a venv and installs dqa: CI has done that).
    subprocess.run([sys.executable, "examples/build_example.py", "examples/data", "--rows", "3000", "--seed", "0"],
                   cwd=root, env=env, check=True, capture_output=True, timeout=600)
    ran = []
    for name in pages():
        for block in readme_blocks((REPO / name).read_text(), name):
            if block.action != "run":
                continue
            proc = subprocess.run(["bash", "-c", block_script(block, name)], cwd=root, env=env, capture_output=True,
                                  text=True, timeout=600)
            assert proc.returncode == 0, (f"{name}:{block.line}: block failed\n--- stdout\n{proc.stdout[-3000:]}"
                                          f"\n--- stderr\n{proc.stderr[-3000:]}")
            ran.append((name, block.line))
    assert ran
    assert {name for name, _ in ran} >= {"README.md", "docs/plan.md", "docs/gate.md", "docs/repair.md"}
    # The loop's outputs are where the README says they are.
    assert (root / "report.html").is_file()
    assert (root / "dqa-out" / "example" / "findings.parquet").is_file()
    assert (root / "dqa-out" / "example-v2" / "gate" / "gate.json").is_file()
