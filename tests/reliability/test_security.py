"""Security properties across the pipeline.

- Untrusted text (decoded degenerate templates, sample ids) is escaped in the HTML report: a
  dataset plants ``<script>``, ``</textarea>`` and ``"'><img src=x onerror=...>`` and the report's
  parsed DOM holds them only as text.
- Secrets never reach disk or logs: a fleet of SGLang-contract stubs demanding an API key is
  started with ``dqa fleet up ... -- --api-key KEY --env HF_TOKEN=...`` (a model path with
  spaces and shell metacharacters), then ``dqa regen --fleet --api-key-env``, ``dqa fleet
  status``, ``dqa merge`` and ``dqa report`` run; every file written under the test folder
  (parquet decoded) and every captured output is searched for both secrets.
- Fleet commands are argument lists: the model path reaches the server's argv intact (from
  /proc), the fleet file's ``cmd`` holds it as one element, and the ``--dry-run`` script, run by
  bash, passes it through intact and runs none of its metacharacters.
- Output paths never come from data: ids like ``../../x/passwd`` through scan, regen, merge and
  report create no file outside the output folders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet_helpers import fake_sglang_python, fleet_up

TESTS = Path(__file__).resolve().parent.parent
PAYLOADS = ("<script>alert(1)</script>", "</textarea><b>x</b>", "\"'><img src=x onerror=alert(2)>")
SECRET = "sk-dqa-security-77aa19"
TOKEN = "hf_dqaSecurityToken0042"
WEIRD_MODEL = "models/my model; touch PWNED $(touch PWNED2) `touch PWNED3` 'q\" & | > out.txt"


def dqa(*args, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    e.pop("DQA_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "dqa.cli", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=e)


# ----------------------------------------------------------------------------- HTML escaping


class DomAudit(HTMLParser):
    """Collects element names, event-handler attributes and text of an HTML document."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.handlers: list[tuple[str, str]] = []
        self.text: list[str] = []
        self.script: list[str] = []  # text inside <script> elements
        self.in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.handlers += [(tag, k) for k, _ in attrs if k.lower().startswith("on")]
        self.in_script = tag == "script"

    def handle_endtag(self, tag):
        self.in_script = False

    def handle_data(self, data):
        (self.script if self.in_script else self.text).append(data)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A scan of 40 clean samples and 3 x 12 samples whose only answer is a payload; ids carry payloads too."""
    from gate_data import clean_rows, ok_mode_rows
    from chatdata import write_parquet

    d = tmp_path_factory.mktemp("planted")
    rows = clean_rows(40, seed=31)
    for k, p in enumerate(PAYLOADS):
        rows += ok_mode_rows(12, seed=40 + k, answer=p)
    ids = [f"clean-{i}" for i in range(40)] + [f"{PAYLOADS[i % 3]}-{i}" for i in range(36)]
    data = write_parquet(d / "planted.parquet", rows, ids=ids)
    scan = d / "scan"
    r = dqa("scan", data, "--out", scan, "--quiet", cwd=d)
    assert r.returncode == 1, r.stderr
    return d, data, scan


def test_report_holds_planted_markup_only_as_text(planted):
    d, data, scan = planted
    v = dqa("validate", scan, "--out", scan / "validation-release", "--no-docs", "--quiet", cwd=d)
    assert v.returncode == 1, v.stderr
    out = d / "report.html"
    r = dqa("report", scan, "--out", out, cwd=d)
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    for p in PAYLOADS:
        assert p not in html, f"raw payload in the report: {p}"
    audit = DomAudit()
    audit.feed(html)
    assert not audit.tags & {"img", "textarea", "iframe", "object", "embed", "b"}, audit.tags
    assert not audit.handlers, audit.handlers
    text = "".join(audit.text)
    assert "alert(1)" in text and "onerror=alert(2)" in text  # shown to the reader, as text
    assert "alert(" not in "".join(audit.script)  # no payload inside a script the report may have


def test_markdown_and_junit_of_validate_escape_planted_ids(planted):
    d, data, scan = planted
    out = d / "v2"
    assert dqa("validate", scan, "--out", out, "--no-docs", "--quiet", cwd=d).returncode == 1
    import xml.etree.ElementTree as ET

    junit = next(out.glob("*.xml"))
    root = ET.parse(junit)  # well-formed: the payloads did not break the XML
    assert any("<script>" in (e.text or "") + " ".join(e.attrib.values()) for e in root.iter())
    md = (out / "summary.md").read_text()
    assert "<script>" not in md and "<img" not in md


# ----------------------------------------------------------------------------- secrets + argument lists


def all_text_written(root: Path) -> list[tuple[Path, str]]:
    """(file, text) for every file under ``root``: parquet decoded to its string/list values, others raw."""
    out = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.is_symlink():
            continue
        if p.suffix == ".parquet":
            try:
                out.append((p, json.dumps(pq.read_table(p).to_pylist(), default=str)))
            except Exception:  # a parquet the test did not expect must still be searched as bytes
                out.append((p, p.read_bytes().decode("latin-1")))
        else:
            out.append((p, p.read_bytes().decode("latin-1")))
    return out


def test_no_secret_anywhere_and_a_hostile_model_path_passes_through_intact(tmp_path):
    sys.path.insert(0, str(TESTS / "reliability"))
    from regen_harness import build_regen_data

    data = build_regen_data(tmp_path / "data", rows=90)
    py = fake_sglang_python(tmp_path)
    fleet = tmp_path / "fleet.json"
    env = {"DQA_SEC_KEY": SECRET}
    outputs: list[str] = []
    up, _ = fleet_up("fleet", "up", "--model", WEIRD_MODEL, "--gpus", "0-1", "--python", py,
                     "--fleet", fleet, "--timeout", "60", "--env", f"HF_TOKEN={TOKEN}", "--",
                     "--api-key", SECRET, "--latency-s", "0.01", ports=2, cwd=tmp_path, run=dqa)
    outputs += [up.stdout, up.stderr]
    assert up.returncode == 0, up.stderr
    rec = json.loads(fleet.read_text())
    try:
        assert rec["model"] == WEIRD_MODEL
        for e in rec["endpoints"]:
            assert e["cmd"][e["cmd"].index("--model-path") + 1] == WEIRD_MODEL
            argv = Path(f"/proc/{e['pid']}/cmdline").read_bytes().split(b"\0")
            assert WEIRD_MODEL.encode() in argv, argv  # one argument, byte for byte
        out = tmp_path / "regen"
        r = dqa("regen", data.dataset, "--findings", data.findings, "--fleet", fleet, "--out", out,
                "--api-key-env", "DQA_SEC_KEY", "--max-new-tokens", "40", "--json", cwd=tmp_path, env=env)
        outputs += [r.stdout, r.stderr]
        assert r.returncode == 0, r.stderr
        s = dqa("fleet", "status", "--fleet", fleet, "--json", cwd=tmp_path)
        outputs += [s.stdout, s.stderr]
        scan = tmp_path / "scan"
        outputs += [x for c in (dqa("scan", data.dataset, "--out", scan, "-q", cwd=tmp_path),) for x in (c.stdout, c.stderr)]
        m = dqa("merge", data.dataset, "--regen", out, "--out", tmp_path / "merged.parquet", cwd=tmp_path)
        outputs += [m.stdout, m.stderr]
        assert m.returncode == 0, m.stderr
        rep = dqa("report", scan, "--regen", out, "--out", tmp_path / "report.html", cwd=tmp_path)
        outputs += [rep.stdout, rep.stderr]
        assert rep.returncode == 0, rep.stderr
    finally:
        down = dqa("fleet", "down", "--fleet", fleet, cwd=tmp_path)
        outputs += [down.stdout, down.stderr]
    assert not list(tmp_path.rglob("PWNED*")) and not (tmp_path / "out.txt").exists()
    searched = 0
    for p, text in all_text_written(tmp_path):
        if p.is_relative_to(tmp_path / "data") or p.name == py.name:
            continue
        searched += 1
        assert SECRET not in text, f"API key written to {p}"
        assert TOKEN not in text, f"HF token written to {p}"
    for text in outputs:
        assert SECRET not in text and TOKEN not in text
    assert searched >= 10  # fleet file, fleet logs, run.json, progress.json, shards, scan, merge, report


def test_dry_run_script_passes_a_hostile_model_path_through_bash_intact(tmp_path):
    """Run the printed script with bash; a stand-in 'python' records its argv."""
    record = tmp_path / "argv.jsonl"
    py = tmp_path / "record-argv"
    py.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    py.chmod(0o755)
    r = dqa("fleet", "up", "--model", WEIRD_MODEL, "--gpus", "0-2", "--python", py, "--dry-run", "--mtp", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run = subprocess.run(["bash", "-c", r.stdout + "\nwait\n"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(calls) == 3
    for argv in calls:
        assert argv[:2] == ["-m", "sglang.launch_server"]
        assert argv[argv.index("--model-path") + 1] == WEIRD_MODEL
    assert not list(tmp_path.rglob("PWNED*")) and not (tmp_path / "out.txt").exists()


# ----------------------------------------------------------------------------- paths from data


def test_ids_that_look_like_paths_never_become_file_names(tmp_path):
    sys.path.insert(0, str(TESTS / "reliability"))
    from regen_harness import build_regen_data, start_fleet

    data = build_regen_data(tmp_path / "w" / "data", rows=60)
    t = pq.read_table(data.dataset)
    hostile = [f"../../../escape/passwd-{i}" if i % 2 else f"/tmp/abs-{i}/x" for i in range(t.num_rows)]
    t = t.set_column(t.schema.get_field_index("id"), "id", pa.array(hostile))
    pq.write_table(t, data.dataset)
    f = pq.read_table(data.findings)
    f = f.set_column(f.schema.get_field_index("id"), "id", pa.array([hostile[r] for r in f.column("row").to_pylist()]))
    pq.write_table(f, data.findings)
    work = tmp_path / "w"
    before = {p for p in tmp_path.rglob("*")}
    fleet = start_fleet(tmp_path / "w" / "fleet", 1)
    try:
        env = {"DQA_TEST_FLEET_KEY": "sk-dqa-reliability-3f9c2e"}
        assert dqa("scan", data.dataset, "--out", work / "scan", "-q", cwd=work).returncode == 1
        r = dqa("regen", data.dataset, "--findings", data.findings, "-e", fleet[0].url, "--out", work / "regen",
                "--api-key-env", "DQA_TEST_FLEET_KEY", "--max-new-tokens", "40", cwd=work, env=env)
        assert r.returncode == 0, r.stderr
        assert dqa("merge", data.dataset, "--regen", work / "regen", "--out", work / "merged.parquet", cwd=work).returncode == 0
        assert dqa("report", work / "scan", "--regen", work / "regen", "--out", work / "report.html", cwd=work).returncode == 0
    finally:
        for s in fleet:
            s.kill()
    new = {p for p in tmp_path.rglob("*")} - before
    outside = [p for p in new if not p.is_relative_to(work)]
    assert not outside, outside
    assert not any("passwd" in p.name or "abs-" in p.name or "escape" in p.name for p in new)
    assert not Path("/tmp/abs-0").exists() and not (tmp_path.parent / "escape").exists()
    merged = pq.read_table(work / "merged.parquet")
    assert merged.column("id").to_pylist() == hostile  # the ids themselves survive, as data
