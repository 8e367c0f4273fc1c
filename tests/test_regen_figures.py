"""The figures a regen run reports (issue 9 items 6 and 8a, issue 11): rates of a finished run, what
"output tokens" counts, and bad arguments refused before any tokenizer is loaded.

No timing is asserted: rates are checked against the run's own counts and working time, and the
working time of a session against a fake clock.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from dqa.regen.config import RegenConfig
from dqa.regen.run import regenerate
from regen_helpers import degenerate_dataset, read_shards, write_findings
from servers.sglang_contract import StubServer

FAST = dict(health_interval=0.5, health_timeout=2.0, backoff_base=0.05, backoff_max=0.3, live=False, install_signal_handlers=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("figures-data")
    return degenerate_dataset(d / "chat.parquet", 12), write_findings(d / "scan", list(range(12)))


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    s = StubServer(tmp_path_factory.mktemp("stub"), "--reasoning-parser", "qwen3").start()
    yield s
    s.stop()


def _cfg(data, out, urls, **kw) -> RegenConfig:
    path, findings = data
    return RegenConfig(dataset=str(path), out=str(out), endpoints=urls, findings=str(findings), log=lambda m: None, **{**FAST, **kw})


def _progress(out: Path) -> dict:
    return json.loads((out / "progress.json").read_text())


# --------------------------------------------------------------------------- rates of a finished run


def test_a_finished_run_reports_its_mean_rates_and_a_rerun_keeps_them(data, stub, tmp_path):
    out = tmp_path / "out"
    assert regenerate(_cfg(data, out, [stub.url], gpu_hour_cost=3.0)).exit_code == 0
    first = _progress(out)
    tokens = sum(read_shards(out).column("output_tokens").to_pylist())
    assert first["state"] == "finished" and first["done"] == 12 and first["elapsed_s"] > 0
    # The rates of a finished run are its mean rates over the time it worked, not the last minute's.
    assert first["req_per_s"] == pytest.approx(12 / first["elapsed_s"], rel=1e-3) and first["req_per_s"] > 0
    assert first["output_tok_per_s"] == pytest.approx(tokens / first["elapsed_s"], rel=1e-3) and first["output_tok_per_s"] > 0

    # Issue 11: a rerun of the finished run sends nothing and rewrites progress.json with the same figures.
    before = stub.status()["num_requests"]
    res = regenerate(_cfg(data, out, [stub.url], gpu_hour_cost=3.0))
    assert res.exit_code == 0 and stub.status()["num_requests"] == before
    again = _progress(out)
    keep = ("state", "done", "ok", "elapsed_s", "req_per_s", "output_tok_per_s", "mean_output_tokens", "cost_so_far")
    assert {k: again[k] for k in keep} == {k: first[k] for k in keep}
    assert again["endpoints"][stub.url]["done"] == first["endpoints"][stub.url]["done"] == 12
    assert res.progress["req_per_s"] == first["req_per_s"]  # --json prints the same object


def test_a_resume_without_progress_json_estimates_earlier_working_time_from_the_shards(data, stub, tmp_path):
    out = tmp_path / "out"
    assert regenerate(_cfg(data, out, [stub.url], limit=6)).exit_code == 0
    (out / "progress.json").unlink()  # e.g. never copied, or deleted
    assert regenerate(_cfg(data, out, [stub.url])).exit_code == 0
    p = _progress(out)
    assert p["done"] == 12 and p["req_per_s"] > 0
    assert p["req_per_s"] == pytest.approx(12 / p["elapsed_s"], rel=1e-3)


def test_working_time_leaves_out_the_idle_time_between_sessions_and_a_no_op_rerun(monkeypatch):
    """Progress against a fake clock: time between sessions, and a session with nothing to do, add nothing."""
    from dqa.regen.dispatch import progress as progress_mod
    from dqa.regen.dispatch.progress import Progress

    clock = [1000.0]
    monkeypatch.setattr(progress_mod, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    first = Progress(total=10, started=clock[0])
    for _ in range(4):
        clock[0] += 5.0
        first.record("ok", 100)
    first.stop()
    clock[0] += 3600.0  # the final flush, then an hour with no run at all
    first.state = "interrupted"
    snap1 = first.snapshot()
    assert snap1["elapsed_s"] == 20.0 and snap1["req_per_s"] == 0.2 and snap1["output_tok_per_s"] == 20.0

    second = Progress(total=10, prior_elapsed_s=snap1["elapsed_s"], started=clock[0])  # the resume, an hour later
    second.add_prior(4, 0, 0, 400)
    for _ in range(6):
        clock[0] += 10.0
        second.record("ok", 100)
    second.stop()
    second.state = "finished"
    snap2 = second.snapshot()
    assert snap2["elapsed_s"] == 80.0  # 20 s + 60 s; not the hour between
    assert snap2["req_per_s"] == 0.125 and snap2["output_tok_per_s"] == 12.5

    rerun = Progress(total=10, prior_elapsed_s=snap2["elapsed_s"], counting=False, started=clock[0])  # nothing left to do
    rerun.add_prior(10, 0, 0, 1000)
    clock[0] += 30.0
    rerun.stop()
    rerun.state = "finished"
    snap3 = rerun.snapshot()
    assert {k: snap3[k] for k in ("elapsed_s", "req_per_s", "output_tok_per_s")} == {"elapsed_s": 80.0, "req_per_s": 0.125, "output_tok_per_s": 12.5}


def test_working_time_from_shards_splits_at_idle_gaps():
    import numpy as np

    from dqa.regen.dispatch.progress import active_seconds, work_spans

    # Two sessions of requests of 10 s each, back to back, an hour apart.
    done = np.array([10, 20, 30, 40, 3640, 3650, 3660], dtype=float)
    lat = np.full(done.size, 10.0)
    spans = work_spans(done, lat)
    assert [(a, b) for a, b, _ in spans] == [(0, 4), (4, 7)]
    assert active_seconds(done, lat) == pytest.approx(40 + 30)
    # Long requests in flight across a quiet stretch keep it one span: the fleet was working.
    assert len(work_spans(np.array([10.0, 200.0]), np.array([10.0, 195.0]))) == 1


# --------------------------------------------------------------------------- what "output tokens" counts


def test_openai_figures_count_the_tokens_the_shards_record_not_the_servers_usage(data, stub, tmp_path):
    """The live display, progress.json and the report all count the rendered tokens in the shards."""
    from dqa.reports.regen_live import render

    out = tmp_path / "out"
    res = regenerate(_cfg(data, out, [stub.url], protocol="openai", max_new_tokens=64))
    assert res.exit_code == 0, res.message
    rows = read_shards(out).to_pylist()
    generated = [r["output_tokens"] for r in rows if r["status"] in ("ok", "length")]
    assert len(generated) == 12
    p = _progress(out)
    assert p["endpoints"][stub.url]["output_tokens"] == sum(generated)
    assert p["mean_output_tokens"] == pytest.approx(sum(generated) / len(generated), abs=0.05)
    assert p["output_tok_per_s"] == pytest.approx(sum(generated) / p["elapsed_s"], rel=1e-3)
    # The live display shows the same per-endpoint count.
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(render(p))
    assert f"{sum(generated):,}" in console.export_text()


# --------------------------------------------------------------------------- arguments before tokenizers (item 8a)


class _Loader:
    """Stands in for every tokenizer loader; records calls and fails if called."""

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, what: str):
        def load(*a, **k):
            self.calls.append(what)
            raise AssertionError(f"{what} was called before the arguments were checked")

        return load


@pytest.fixture()
def loaders(monkeypatch):
    spy = _Loader()
    fake = types.ModuleType("transformers")
    fake.AutoTokenizer = types.SimpleNamespace(from_pretrained=spy("AutoTokenizer.from_pretrained"))
    monkeypatch.setitem(sys.modules, "transformers", fake)
    import dqa.audit.template as template
    import dqa.tokenizer_files as tokenizer_files

    monkeypatch.setattr(template, "load_template", spy("load_template"))
    monkeypatch.setattr(tokenizer_files, "load_tokenizer", spy("tokenizers.Tokenizer.from_file"))
    return spy


@pytest.fixture()
def fleet_file(tmp_path):
    """A fleet of `transformers serve` (openai protocol: the slow chat-template tokenizer) nobody listens on."""
    f = tmp_path / "fleet.json"
    f.write_text(json.dumps({"version": 1, "engine": "transformers", "protocol": "openai", "model": "tiny",
                             "endpoints": [{"url": "http://127.0.0.1:9"}]}))
    return f


def _bad_out_package(tmp_path: Path) -> Path:
    pkg = tmp_path / "regen"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    return pkg


@pytest.mark.parametrize("case", ["source package", "a file", "under a file", "unwritable", "missing findings",
                                  "missing dataset", "bad shard", "another dataset"])
def test_bad_arguments_are_refused_before_any_tokenizer_is_loaded(cli, data, tmp_path, fleet_file, loaders, case):
    path, findings = data
    out = tmp_path / "out"
    args = [path, "--fleet", fleet_file, "--findings", findings]
    expect = ""
    if case == "source package":
        out, expect = _bad_out_package(tmp_path), "holds '__init__.py'"
    elif case == "a file":
        out = tmp_path / "notes.txt"
        out.write_text("x")
        expect = "not a folder"
    elif case == "under a file":
        (tmp_path / "notes.txt").write_text("x")
        out, expect = tmp_path / "notes.txt" / "run", "is not a folder"
    elif case == "unwritable":
        out, expect = Path("/proc/dqa-regen-out"), "cannot be created"  # not writable, even for root
    elif case == "missing findings":
        args[4], expect = tmp_path / "no-scan", "no-scan"  # the value of --findings
    elif case == "missing dataset":
        args[0], expect = tmp_path / "missing.parquet", "missing.parquet"
    elif case == "bad shard":
        args += ["--shard", "3/2"]
        expect = "shard"
    elif case == "another dataset":
        out.mkdir()
        (out / "run.json").write_text(json.dumps({"identity": {"dataset": {"name": "other"}, "selection": {}, "sampling": {}}}))
        expect = "different dataset"
    r = cli("regen", *args, "--out", out)
    assert r.exit_code == 2, r.output
    assert expect in r.stderr, r.stderr
    assert loaders.calls == []  # refused before any tokenizer was loaded (and before any server was asked)


def test_the_tokenizer_is_loaded_once_the_arguments_are_good(cli, data, tmp_path, fleet_file, loaders):
    """The same spy, with good arguments: the run gets as far as loading the template (so the spy sees it)."""
    path, findings = data
    r = cli("regen", path, "--fleet", fleet_file, "--findings", findings, "--out", tmp_path / "out")
    assert loaders.calls == ["load_template"]
    assert r.exit_code == 3 and "load_template was called" in r.stderr  # the spy's failure, as an internal error
