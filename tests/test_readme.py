"""Every shell command and Python example in README.md runs as written from the repository root.

Each ```bash and ```python block of the README is preceded by a marker, invisible on GitHub:

    <!-- readme-test: run -->            the test runs the block
    <!-- readme-test: skip: REASON -->   it needs what CI has not (GPUs, model folders, your own data)

A block without a marker fails the test, so a new example cannot slip in untried. The run
blocks execute in README order, in one copy of the repository's files (what a fresh clone
has), with this environment's `dqa` and `python` on PATH, after the quick start's data build.
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
MARKER = re.compile(r"<!--\s*readme-test:\s*(run|skip:\s*(?P<why>.+?))\s*-->")
EXPECTED_EXIT = re.compile(r"#\s*exit (\d)\b")


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    action: str  # "run" or "skip"
    why: str
    commands: list[tuple[int, str]]  # (line, command) with continuations joined, comments kept; python: one, the whole text
    lang: str = "bash"  # "bash" or "python"


def readme_blocks(text: str) -> list[Block]:
    """The README's ```bash and ```python blocks with their markers; raises AssertionError for an unmarked block."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() not in ("```bash", "```python"):
            i += 1
            continue
        lang = lines[i].strip()[3:]
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        m = MARKER.search(prev)
        assert m, f"README.md:{i + 1}: a ```{lang} block without a <!-- readme-test: run|skip: why --> marker"
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


def block_script(block: Block) -> str:
    """A bash script running each command and stopping at the first unexpected exit code."""
    out = ["set -u"]
    if block.lang == "python":
        (line, body), = block.commands
        return "\n".join([*out, f"python - <<'README_PY'\n{body}\nREADME_PY",
                          f"rc=$?\nif [ $rc != 0 ]; then echo 'README.md:{line}: python exit '$rc', expected 0' >&2; exit 99; fi"])
    for line, cmd in block.commands:
        code = EXPECTED_EXIT.search(cmd.splitlines()[-1])
        body = re.sub(r"\s+#[^\n]*$", "", cmd)
        if body.rstrip().endswith("&"):
            out.append(body)
            continue
        want = int(code.group(1)) if code else 0
        out.append(f"{body}\nrc=$?\nif [ $rc != {want} ]; then echo 'README.md:{line}: exit '$rc', expected {want}' >&2; "
                   f"kill $(jobs -p) 2>/dev/null; exit 99; fi")
    out.append("kill $(jobs -p) 2>/dev/null; wait; exit 0")
    return "\n".join(out)


def test_every_bash_block_is_marked_and_skips_say_why():
    blocks = readme_blocks((REPO / "README.md").read_text())
    assert blocks, "no ```bash block found in README.md"
    for b in blocks:
        assert b.commands, f"README.md:{b.line}: an empty block"
        if b.action == "skip":
            assert len(b.why) > 10, f"README.md:{b.line}: a skip needs a reason"
    assert sum(b.action == "run" for b in blocks) >= 5
    assert any(b.lang == "python" and b.action == "run" for b in blocks), "the From Python example is not run"


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
def test_the_readme_commands_run_as_written(tmp_path):
    root = repo_copy(tmp_path / "clone")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "120"}
    env.pop("DQA_FLEET", None)
    env.pop("GITHUB_STEP_SUMMARY", None)
    # The quick start's data build (examples/quickstart.sh also makes a venv and installs dqa: CI has done that).
    subprocess.run([sys.executable, "examples/build_example.py", "examples/data", "--rows", "3000", "--seed", "0"],
                   cwd=root, env=env, check=True, capture_output=True, timeout=600)
    ran = []
    for block in readme_blocks((REPO / "README.md").read_text()):
        if block.action != "run":
            continue
        proc = subprocess.run(["bash", "-c", block_script(block)], cwd=root, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (f"README.md:{block.line}: block failed\n--- stdout\n{proc.stdout[-3000:]}"
                                      f"\n--- stderr\n{proc.stderr[-3000:]}")
        ran.append(block.line)
    assert ran
    # The loop's outputs are where the README says they are.
    assert (root / "report.html").is_file()
    assert (root / "dqa-out" / "example" / "findings.parquet").is_file()
    assert (root / "dqa-out" / "example-v2" / "gate" / "gate.json").is_file()
