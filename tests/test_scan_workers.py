"""`dqa scan --workers N`: the same findings, turns and metrics for every N.

The example set (the real Qwen3.6 tokenizer and chat template, planted defects, multi-turn rows)
written with small row groups and as a folder of shards, so the pool has units to cut; the
set-level checks (duplicates, template shares) count over the whole set whatever the cut.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

from build_example import build_example  # noqa: E402


def scan(cwd: Path, data: Path, out: Path, workers: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", "scan", str(data), "-t", "qwen3.6", "--out", str(out),
                           "--workers", str(workers), "--batch-rows", "64", "--json"], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ}, timeout=600)
    assert proc.returncode == 1, proc.stderr  # defects found
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    base = tmp_path_factory.mktemp("layouts")
    data = build_example(base / "data", rows=600, seed=4)
    table = pq.read_table(data)
    one = base / "row-groups.parquet"
    pq.write_table(table, one, row_group_size=40)  # 15 row groups
    shards = base / "shards"
    shards.mkdir()
    for k in range(4):
        pq.write_table(table.slice(k * 150, 150), shards / f"part-{k:05d}.parquet", row_group_size=50)
    return {"row groups": one, "shards": shards}


@pytest.mark.parametrize("layout", ["row groups", "shards"])
def test_findings_turns_and_metrics_are_the_same_for_every_number_of_workers(tmp_path, layouts, layout):
    data = layouts[layout]
    summaries, tables = {}, {}
    for n in (1, 2, 3):
        out = tmp_path / f"scan-{n}"
        summaries[n] = scan(tmp_path, data, out, n)
        tables[n] = {name: pl.read_parquet(out / f"{name}.parquet") for name in ("findings", "turns", "metrics")}
    assert tables[1]["findings"].height > 0
    for n in (2, 3):
        for name in ("findings", "turns", "metrics"):
            assert tables[n][name].equals(tables[1][name]), f"{name} differ with --workers {n}"
        for key in ("failing_rows", "checks", "degenerate_templates", "conventions", "thinking_share"):
            assert summaries[n][key] == summaries[1][key], key


def test_a_negative_worker_count_is_refused_naming_the_option(tmp_path, layouts):
    # 0 is the default: the CPUs the process may run on
    proc = subprocess.run([sys.executable, "-m", "dqa.cli", "scan", str(layouts["row groups"]), "-t", "qwen3.6", "--out",
                           str(tmp_path / "s"), "--workers", "-1"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "--workers -1" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_scan_never_imports_pandas_or_numpy_ma(tmp_path, layouts, workers):
    """pyarrow imports pandas (0.13-0.2 s of CPU) on the first ``to_numpy``, ``pa.array`` or ``pa.table`` of a
    process, and ``np.unique`` imports numpy.ma (25-35 ms) on its first call; a pool worker would pay each again,
    and the scan's process after the pass, serially: the scan converts between numpy and Arrow and takes distinct
    values without them."""
    code = ("import sys; from dqa.audit.scan import ScanOptions, run_scan; "
            f"r = run_scan({str(layouts['row groups'])!r}, {str(tmp_path / 'o')!r}, ScanOptions(tokenizer='qwen3.6', workers={workers})); "
            "assert r.summary['failing_rows'] > 0 and r.summary['degenerate_templates']; "
            "print('pandas' in sys.modules, 'numpy.ma' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_the_workers_start_before_the_scan_imports_polars(tmp_path, layouts):
    """The kernel pass needs numpy and Arrow only; polars (~0.2 s of import) is for what follows it. `dqa scan`
    forks its workers before anything imports polars, and imports it while they scan: each worker, started from
    the CLI, finds polars not imported, and the scan's own process has it by the end."""
    probe = tmp_path / "probe"
    probe.mkdir()
    code = (
        "import os, sys\n"
        "import dqa.audit.executors.processes as w\n"
        "init = w._init_worker\n"
        "def probed(*args):\n"
        f"    open(os.path.join({str(probe)!r}, str(os.getpid())), 'w').write(str('polars' in sys.modules))\n"
        "    init(*args)\n"
        "w._init_worker = probed\n"
        f"sys.argv = ['dqa', 'scan', {str(layouts['row groups'])!r}, '-t', 'qwen3.6', '--out', {str(tmp_path / 'o')!r},"
        " '--workers', '2', '--batch-rows', '64', '--quiet']\n"
        "from dqa.cli import main\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print('polars' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stderr  # defects found
    assert proc.stdout.split() == ["True"]
    seen = [p.read_text() for p in probe.iterdir()]
    assert seen == ["False", "False"]


def _scan_with_patched_worker(tmp_path, layouts, patch: str) -> subprocess.CompletedProcess:
    """`dqa scan --workers 2` of the row-group set from the CLI, with ``patch`` (Python source run first: it may
    replace functions of ``dqa.audit.executors.processes``, imported as ``w``, which the forked workers inherit)."""
    code = ("import sys\nimport dqa.audit.executors.processes as w\n" + patch +
            f"sys.argv = ['dqa', 'scan', {str(layouts['row groups'])!r}, '-t', 'qwen3.6', '--out', {str(tmp_path / 'o')!r},"
            " '--workers', '2', '--batch-rows', '64', '--quiet']\n"
            "from dqa.cli import main\nmain()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)


def _processes_naming(path: Path) -> list[int]:
    """Pids of live processes whose command line names ``path`` (the scan's forked workers share its command line)."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and str(path) in " ".join(proc.info["cmdline"] or []):
                pids.append(proc.pid)
        except psutil.Error:
            pass
    return pids


def _on_unit(k: int, action: str, otherwise: str = "pass") -> str:
    """A patch for ``_scan_with_patched_worker``: the worker given unit ``k`` runs ``action`` (one line of Python)
    first, the others ``otherwise``; then each scans its unit."""
    return ("scan_unit = w._scan_unit\n"
            "def patched(task):\n"
            f"    if task[0] == {k}:\n"
            f"        {action}\n"
            "    else:\n"
            f"        {otherwise}\n"
            "    return scan_unit(task)\n"
            "w._scan_unit = patched\n")


def test_a_worker_that_dies_fails_the_scan_at_once_in_one_line(tmp_path, layouts):
    """The out-of-memory killer ends a worker with SIGKILL: the scan says so and exits 3, instead of waiting
    forever for the units that worker held (as a multiprocessing.Pool does); nothing is written."""
    proc = _scan_with_patched_worker(tmp_path, layouts, _on_unit(3, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "worker process was killed (SIGKILL" in lines[0] and "--workers" in lines[0], proc.stderr
    assert not (tmp_path / "o").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert _processes_naming(tmp_path / "o") == []


def test_a_worker_that_fails_otherwise_names_its_exit_code(tmp_path, layouts):
    proc = _scan_with_patched_worker(tmp_path, layouts, _on_unit(2, "import os; os._exit(7)"))
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"dqa: error: {layouts['row groups']}: a scan worker process died (exit 7); rerun with --workers 1 to see the "
        "error in this process"]


def test_the_workers_die_with_the_scan_when_it_is_killed(tmp_path, layouts):
    """`kill -9` of the scan (or the out-of-memory killer choosing it) leaves no worker behind: orphans would wait
    forever on the pool's pipes, holding a batch of memory each."""
    import time

    patch = _on_unit(0, "pass", otherwise="import time; time.sleep(60)")  # the other units wait: the pool is busy
    code = ("import sys\nimport dqa.audit.executors.processes as w\n" + patch +
            f"sys.argv = ['dqa', 'scan', {str(layouts['row groups'])!r}, '-t', 'qwen3.6', '--out', {str(tmp_path / 'o')!r},"
            " '--workers', '2', '--batch-rows', '64', '--quiet']\n"
            "from dqa.cli import main\nmain()\n")
    scan = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_processes_naming(tmp_path / "o")) < 3 and time.monotonic() < deadline:  # the scan and its 2 workers
            time.sleep(0.2)
        assert len(_processes_naming(tmp_path / "o")) == 3
    finally:
        scan.kill()
        scan.wait()
    deadline = time.monotonic() + 20
    while _processes_naming(tmp_path / "o") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_naming(tmp_path / "o") == []


def test_a_bad_row_stops_the_other_workers_even_inside_the_cli(tmp_path, layouts):
    """A unit's error stops the pool by SIGTERM. The workers are forked from the CLI, whose SIGTERM handler raises
    KeyboardInterrupt: a worker keeps it no longer, so none can swallow the signal and outlive the scan."""
    patch = (_on_unit(1, "from dqa.errors import InputError; raise InputError('planted: row 80 is bad')",
                      otherwise="import time; time.sleep(0.2)") +
             "init = w._init_worker\n"
             "def checked(*args):\n"
             "    init(*args)\n"
             "    import signal\n"
             "    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
             "w._init_worker = checked\n")
    proc = _scan_with_patched_worker(tmp_path, layouts, patch)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "dqa: error: planted: row 80 is bad"
    assert _processes_naming(tmp_path / "o") == []  # the other worker, asleep in its unit, was stopped and joined


def test_numpy_and_arrow_views_round_trip_numbers_bools_and_sliced_arrays():
    import numpy as np
    import pyarrow as pa

    from dqa.audit.token_batch import arrow_view, numpy_view

    for values in (np.arange(11, dtype=np.int32), np.linspace(0, 1, 7), np.array([True, False, True] * 5),
                   np.arange(20, dtype=np.uint64)[::3]):
        arr = arrow_view(values)
        assert arr.to_pylist() == values.tolist()
        assert numpy_view(arr).tolist() == values.tolist()
        assert numpy_view(arr.slice(2, 3)).tolist() == values[2:5].tolist()
    assert numpy_view(arrow_view(np.zeros(0, dtype=np.int64))).dtype == np.int64
    with_nulls = pa.array([1, None, 3], type=pa.int32())
    assert np.isnan(numpy_view(with_nulls)[1])  # not a view: to_numpy's copy


def test_units_shrink_towards_the_end_so_the_workers_finish_together():
    """Guided self-scheduling: each unit is the shortest run of neighbouring row-group cuts of one file whose rows
    reach 1/(GUIDED_SHARE x workers) of the rows not yet in a unit, or the rest of its file; whole-file cuts (Arrow
    files) stay alone. Large units first (few parts), single cuts last, so no worker waits out another's large last
    unit. Every row once, in dataset order."""
    from dqa.audit.readers import WorkUnit
    from dqa.audit.scan_workers import GUIDED_SHARE, guided_units

    cuts = [WorkUnit(0, 100 * g, 100, (g,)) for g in range(40)]  # one file, 40 row groups of 100 rows
    cuts += [WorkUnit(1, 4000 + 100 * g, 100, (g,)) for g in range(4)]  # a second file, 4 row groups
    cuts += [WorkUnit(2, 4400, 300), WorkUnit(3, 4700, 300)]  # two Arrow files: whole-file cuts
    units = guided_units(cuts, workers=2)

    rows_before, remaining, i = 0, 5000, 0
    for u in units:
        assert u.start_row == rows_before
        run = cuts[i:i + max(len(u.row_groups or ()), 1)]
        assert u.rows == sum(c.rows for c in run) and {c.file for c in run} == {u.file}
        assert u.row_groups == (tuple(g for c in run for g in c.row_groups) if u.row_groups else None)
        target = remaining / (GUIDED_SHARE * 2)
        file_ends = i + len(run) == len(cuts) or cuts[i + len(run)].file != u.file
        assert u.rows >= target or file_ends or u.row_groups is None  # long enough, or the file ran out
        assert u.rows - run[-1].rows < target  # and no longer than that
        rows_before, remaining, i = rows_before + u.rows, remaining - u.rows, i + len(run)
    assert i == len(cuts) and rows_before == 5000
    if GUIDED_SHARE == 4:  # the default, spelled out
        assert [u.rows for u in units] == [700, 600, 500, 400, 400, 300, 300, 300, 200, 200, 100, 200, 100, 100, 300, 300]
    assert guided_units(cuts, workers=1)[0].rows > units[0].rows  # fewer workers, larger units


def test_the_pool_is_given_units_that_shrink_towards_the_end(tmp_path, layouts):
    """From the CLI: the workers get the guided units of the set's row groups, in order, largest first."""
    data = tmp_path / "groups-of-10.parquet"
    pq.write_table(pq.read_table(layouts["row groups"]), data, row_group_size=10)  # 60 row groups of 10 rows
    log = tmp_path / "units.log"
    patch = ("scan_unit = w._scan_unit\n"
             "def logged(task):\n"
             f"    with open({str(log)!r}, 'a') as f:\n"
             "        f.write(f'{task[0]} {task[1].start_row} {task[1].rows}\\n')\n"
             "    return scan_unit(task)\n"
             "w._scan_unit = logged\n")
    proc = _scan_with_patched_worker(tmp_path, {"row groups": data}, patch)
    assert proc.returncode == 1, proc.stderr  # defects found, as planted
    units = sorted(tuple(map(int, line.split())) for line in log.read_text().splitlines())
    sizes = [n for _, _, n in units]
    assert [k for k, _, _ in units] == list(range(len(units)))
    assert [start for _, start, _ in units] == [sum(sizes[:k]) for k in range(len(sizes))] and sum(sizes) == 600
    # --batch-rows 64: cuts of 7 row groups (70 rows); the first unit joins two, the last is the file's rest
    assert sizes == [140, 70, 70, 70, 70, 70, 70, 40]
