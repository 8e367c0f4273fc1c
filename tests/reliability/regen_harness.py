"""Helpers for the regen reliability campaign: a fleet of SGLang-contract stub servers (real
processes), a small tokenized dataset with findings, and the checks every fault test ends with:
every selected row exactly once, the right status, the exact tokens the server produced, and
no secret anywhere on disk or in the logs."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from servers.sglang_contract import READY_PREFIX, StubServer, plan_reply  # noqa: E402

IM_START, IM_END, NL, NL2, THINK, END_THINK, ASSISTANT, USER, SYSTEM = 151644, 151645, 198, 271, 151667, 151668, 77091, 872, 8948
SECRET = "sk-dqa-reliability-3f9c2e"  # the API key the fleet demands; must never reach a file or log
SECRET_ENV = "DQA_TEST_FLEET_KEY"

# Fast stubs: ~40 output tokens, 50 ms per request, a stuck /health_generate answers 503 in 0.3 s.
# Deterministic inference on, as `dqa fleet up --deterministic` runs SGLang: only then are the
# per-row seeds applied, so every reply can be checked against plan_reply(prompt, seed).
STUB_ARGS = ("--latency-s", "0.05", "--think-min", "8", "--think-max", "30", "--answer-min", "2", "--answer-max", "6",
             "--health-timeout-s", "0.3", "--log-interval-s", "0.5", "--api-key", SECRET, "--enable-deterministic-inference")
MAX_NEW_TOKENS = 40  # below the longest planned reply (50 tokens): some rows finish by length


def soak() -> bool:
    """Long variants run only with DQA_SOAK=1."""
    return os.environ.get("DQA_SOAK") == "1"


# ---------------------------------------------------------------------------- data


@dataclass
class RegenData:
    """A parquet dataset, its findings, and what regen must produce for it."""

    dataset: Path
    findings: Path
    selected: np.ndarray  # sorted rows the findings select
    prompts: dict[int, list[int]]  # row -> prompt ids the server must receive
    no_header: set[int] = field(default_factory=set)  # selected rows that cannot be regenerated


def build_regen_data(folder: Path, rows: int, seed: int = 0, no_header_rows: tuple[int, ...] = (4,)) -> RegenData:
    """Qwen3 ChatML rows with the degenerate thinking-off "OK." answer; findings flag 2 of every 3 rows.

    Rows in ``no_header_rows`` lose their assistant header (regen must record them as failed).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    head = [IM_START, SYSTEM, NL, 2610, 525, 264, 10950, 17847, 13, IM_END, NL, IM_START, USER, NL]
    tail_prompt = [IM_END, NL, IM_START, ASSISTANT, NL]
    answer = [THINK, NL2, END_THINK, NL2, 3925, 13, IM_END, NL]
    ids, masks, prompts = [], [], {}
    for r in range(rows):
        body = rng.integers(1000, 100000, size=int(rng.integers(8, 40))).tolist()
        prompt = head + body + tail_prompt
        if r in no_header_rows:
            prompt = head + body + [IM_END, NL]
        sample = prompt + answer
        ids.append(sample)
        masks.append([0] * len(prompt) + [1] * 7 + [0])
        prompts[r] = prompt
    folder.mkdir(parents=True, exist_ok=True)
    dataset = folder / "train.parquet"
    pq.write_table(pa.table({
        "id": pa.array([f"sample-{r:05d}" for r in range(rows)]),
        "input_ids": pa.array(ids, pa.list_(pa.int32())),
        "loss_mask": pa.array(masks, pa.list_(pa.int8())),
    }), dataset)
    selected = np.array([r for r in range(rows) if r % 3 != 0], dtype=np.int64)
    findings = folder / "scan" / "findings.parquet"
    findings.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "row": pa.array(selected, pa.int64()),
        "id": pa.array([f"sample-{r:05d}" for r in selected]),
        "reasons": pa.array([["degenerate_template", "short_response"]] * selected.size, pa.list_(pa.string())),
    }), findings)
    return RegenData(dataset, findings, selected, {int(r): prompts[int(r)] for r in selected},
                     {r for r in no_header_rows if r in set(selected.tolist())})


# ---------------------------------------------------------------------------- fleet


def start_fleet(folder: Path, n: int = 3, *extra: str, restartable: bool = False) -> list[StubServer]:
    """Start ``n`` stub servers in parallel (each a real process on its own port).

    Each binds port 0 (the kernel picks a free port), unless ``restartable``: a test that will
    ``restart()`` a server on the port it had needs a port that nothing else takes meanwhile,
    so then each gets an explicit port drawn below the kernel's ephemeral range (where
    outgoing connections take their local ports), drawn again should another process bind it
    first."""
    import subprocess

    from fleet_helpers import free_port_base, port_race

    servers = [StubServer(folder, *STUB_ARGS, *extra, name=f"stub{i}") for i in range(n)]
    for s in servers:
        s.log_dir.mkdir(parents=True, exist_ok=True)

    def spawn(s: StubServer) -> subprocess.Popen:
        port = free_port_base(1) if restartable else 0
        cmd = [sys.executable, str(Path(sys.modules[StubServer.__module__].__file__).resolve()), "--host", "127.0.0.1",
               "--port", str(port), "--log-file", str(s.log_path), *s.args]
        with open(s.log_path, "ab") as err:
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)

    procs = [spawn(s) for s in servers]
    for s, p in zip(servers, procs):
        for tries in range(3):
            line = p.stdout.readline()
            if line.startswith(READY_PREFIX) or not restartable or tries == 2:
                break
            p.wait()
            if not port_race(s.log_path.read_text(errors="replace")):
                break
            p = spawn(s)  # another process bound the drawn port first: a fresh one
        assert line.startswith(READY_PREFIX), f"stub did not start: {s.log_path.read_text()[-500:]}"
        s.proc = p
        s.port = int(line.strip().rsplit(":", 1)[1])
    return servers


def fast_config(data: RegenData, out: Path, urls: list[str], log=None, **over):
    """A RegenConfig with test-sized timings (health every 0.3 s, short backoff, small shards)."""
    from dqa.regen.config import RegenConfig

    kw = dict(
        dataset=str(data.dataset), out=str(out), endpoints=list(urls), failed_only=True, findings=str(data.findings),
        api_key_env=SECRET_ENV, max_in_flight=8, max_new_tokens=MAX_NEW_TOKENS, max_attempts=30,
        health_interval=0.3, health_timeout=1.0, backoff_base=0.05, backoff_max=0.3, fail_threshold=3,
        request_timeout=3.0, connect_timeout=1.0, down_deadline=30.0, shard_rows=50, shard_seconds=1.0,
        commit_interval=0.05, progress_interval=0.2, live=False, install_signal_handlers=False,
        log=(log.append if isinstance(log, list) else log or (lambda m: None)),
    )
    kw.update(over)
    return RegenConfig(**kw)


# ---------------------------------------------------------------------------- checks


def read_shards(out: Path):
    """All shards of an output folder as one table; every shard must be readable on its own."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted((out / "shards").glob("*.parquet"))]
    return pa.concat_tables(tables) if tables else None


def assert_no_duplicate_rows(out: Path) -> int:
    """Every shard on disk reads completely and no row is in two places; returns the rows held."""
    t = read_shards(out)
    if t is None:
        return 0
    rows = t.column("row").to_numpy()
    uniq, counts = np.unique(rows, return_counts=True)
    dup = uniq[counts > 1]
    assert dup.size == 0, f"rows written twice: {dup[:10].tolist()}"
    return int(rows.size)


def assert_exactly_once(out: Path, data: RegenData, max_new_tokens: int = MAX_NEW_TOKENS) -> dict[str, int]:
    """Every selected row is in the shards exactly once, with the status and tokens the server gives.

    A regenerated row is prompt + the stub's deterministic reply for (prompt, seed), cut at
    ``max_new_tokens`` (status ``length``) or ending in <|im_end|> (status ``ok``); rows without an
    assistant header are ``failed``. Returns the status counts.
    """
    t = read_shards(out)
    assert t is not None, f"no shards in {out}"
    rows = t.column("row").to_numpy()
    assert rows.size == np.unique(rows).size, "a row is written twice"
    assert np.array_equal(np.sort(rows), data.selected), (
        f"missing {sorted(set(data.selected.tolist()) - set(rows.tolist()))[:10]}, "
        f"extra {sorted(set(rows.tolist()) - set(data.selected.tolist()))[:10]}")
    assert not list((out / "journal").glob("*.log")), "journal segments left after a finished run"
    counts: dict[str, int] = {}
    for rec in t.select(["row", "id", "input_ids", "loss_mask", "prompt_len", "output_tokens", "status", "seed", "attempts"]).to_pylist():
        r, status = rec["row"], rec["status"]
        counts[status] = counts.get(status, 0) + 1
        assert rec["id"] == f"sample-{r:05d}"
        if r in data.no_header:
            assert status == "failed", rec
            continue
        prompt = data.prompts[r]
        planned = plan_reply(prompt, rec["seed"], (8, 30), (2, 6))
        expected = planned[:max_new_tokens]
        assert rec["prompt_len"] == len(prompt)
        assert rec["input_ids"] == prompt + expected, f"row {r}: tokens differ from the server's reply"
        assert rec["loss_mask"] == [0] * len(prompt) + [1] * len(expected)
        assert rec["output_tokens"] == len(expected)
        assert status == ("ok" if len(planned) <= max_new_tokens else "length"), (r, status)
        assert rec["attempts"] >= 1
    return counts


def assert_no_secret(out: Path, *texts: str, log_dirs: tuple[Path, ...] = ()) -> None:
    """The API key appears in no file of the output folder (shards decoded), no log file and no captured text."""
    for p in out.rglob("*"):
        if p.is_file() and p.suffix != ".parquet":
            assert SECRET.encode() not in p.read_bytes(), f"API key written to {p}"
    t = read_shards(out)
    if t is not None:
        for name in ("endpoint", "error", "sampling", "model", "finish_reason"):
            if name in t.column_names:
                assert not any(SECRET in (v or "") for v in t.column(name).to_pylist()), f"API key in shard column {name}"
    for d in log_dirs:
        for p in d.rglob("*.log"):
            assert SECRET not in p.read_text(errors="replace"), f"API key in {p}"
    for text in texts:
        assert SECRET not in text


# ---------------------------------------------------------------------------- figures


@dataclass
class Figure:
    scenario: str
    rows: int
    wall_s: float  # the whole run (or runs), startup included
    rows_per_s: float  # between the first and the last completed row (startup excluded)
    statuses: dict
    attempts_mean: float
    note: str = ""


FIGURES: list[Figure] = []


def record_figure(scenario: str, out: Path, wall_s: float, statuses: dict, note: str = "") -> Figure:
    """Keep a throughput figure for the terminal summary (and RELIABILITY.md)."""
    t = read_shards(out)
    attempts = float(np.mean(t.column("attempts").to_numpy())) if t is not None else 0.0
    done = np.sort(t.column("completed_at").cast("int64").to_numpy()) / 1e6 if t is not None else np.zeros(0)
    rate = (done.size - 1) / (done[-1] - done[0]) if done.size > 1 and done[-1] > done[0] else 0.0
    f = Figure(scenario, t.num_rows if t is not None else 0, wall_s, rate, statuses, attempts, note)
    FIGURES.append(f)
    path = os.environ.get("DQA_RELIABILITY_FIGURES")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(f.__dict__) + "\n")
    return f


def wait_until(cond, timeout: float = 10.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return False
