"""`dqa scan --ray`: the scan's units as Ray tasks, on a real Ray cluster, with the findings of the local pool.

One cluster for the module, built as Ray's own tests build one (``ray.cluster_utils.Cluster``): a head node with
no CPUs and two nodes of one CPU each, every one on 127.0.0.1 and nothing else. On it:
- a single-turn set, the multi-turn example set (real Qwen3.6 template) and a set built by SpecForge's rules
  (real Qwen3 tokenizer) give findings, metrics and turns identical, row for row, to ``--workers 2``; so does
  the multi-turn set read from an S3 API server (moto, its own process) by URL, its units read on both nodes
  and none in this process;
- a node lost while it scans a unit: Ray runs the unit again elsewhere, and the findings are the same;
- a unit that always fails (its worker dies every time, or it raises) fails the scan with exit 3 and one line
  naming the unit, and leaves no scan folder;
- ``--ray local`` starts a cluster of its own for the scan and stops it; no cluster at an address, a cluster
  that refuses this process's authentication token, or no Ray installed, is exit 2 with the fix, in seconds; a
  scan without ``--ray`` never imports Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Ray's own switch for clusters on one machine: with it, "127.0.0.1" stays the loopback address when this process
# connects, instead of being swapped for the machine's network address (where this cluster does not listen).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import polars as pl  # noqa: E402
import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from chatdata import conversation, render  # noqa: E402
from s3_store import S3Server, new_bucket, store_env, upload  # noqa: E402
from test_scan_checks import good_rows  # noqa: E402

import dqa  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

from build_example import build_example  # noqa: E402

# One cluster for the module: under pytest-xdist (.ci/run) its tests stay on one worker (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("ray-cluster")

LOOPBACK = "127.0.0.1"
STORE_MEMORY = 80 * 2**20  # each node's object store: the results are small tables, never rows
BATCH_ROWS = 32  # small batches: the sets here cut into a dozen units or more


def node_args() -> dict:
    return {"num_cpus": 1, "node_ip_address": LOOPBACK, "object_store_memory": STORE_MEMORY}


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    saved = {k: os.environ.get(k) for k in store_env(server.url)}
    os.environ.update(store_env(server.url))  # before the cluster starts: its nodes read the store with it
    yield server
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture(scope="module")
def cluster(s3):
    assert not ray._private.ray_constants.ENABLE_RAY_CLUSTER, "ray was imported before this module set its switch"
    c = Cluster(initialize_head=True, head_node_args={**node_args(), "num_cpus": 0, "include_dashboard": False,
                                                      "_system_config": {"health_check_period_ms": 500,
                                                                         "health_check_failure_threshold": 3}})
    for _ in range(2):
        c.add_node(**node_args())
    c.wait_for_nodes()
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


@pytest.fixture()
def connected(cluster):
    """Connect this process to the cluster, with an optional worker setup hook (Ray's ``worker_process_setup_hook``,
    run in every worker process of the connection); dqa uses a connection it finds. Disconnects after the test."""

    def connect(hook=None):
        ray.init(address=cluster.address, logging_level="ERROR",
                 runtime_env={"worker_process_setup_hook": hook} if hook else None)

    yield connect
    ray.shutdown()


def unit_hook(log: Path, fail_unit: int | None = None, how: str = "", delay: float = 0.0):
    """A worker setup hook: every attempt at a unit appends ``k node pid`` to ``log``, then waits ``delay`` s;
    unit ``fail_unit`` instead ends its worker process (``how="crash"``) or raises (``how="raise"``)."""

    def hook():
        import os
        import time

        import ray

        from dqa.audit import scan_workers

        once = scan_workers.scan_unit_once

        def logged(task, ds, tables):
            with open(log, "a") as f:
                f.write(f"{task.k} {ray.get_runtime_context().get_node_id()} {os.getpid()}\n")
            if task.k == fail_unit:
                if how == "crash":
                    os._exit(1)
                raise RuntimeError("a planted failure")
            time.sleep(delay)
            return once(task, ds, tables)

        scan_workers.scan_unit_once = logged

    return hook


def attempts(log: Path) -> list[tuple[int, str, int]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [(int(k), node, int(pid)) for k, node, pid in (line.split() for line in lines)]


@pytest.fixture(scope="module")
def sets(tmp_path_factory, s3):
    """The sets, each with small row groups or as shards so that it cuts into units, and its pool scan."""
    base = tmp_path_factory.mktemp("ray-sets")
    ok = [render(conversation(f"Ask {i}", None, "OK."), enable_thinking=False) for i in range(40)]
    rows = good_rows(200) + ok
    single = base / "single-turn.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([r[0] for r in rows], type=pa.list_(pa.int32())),
                             "loss_mask": pa.array([r[1] for r in rows], type=pa.list_(pa.int8()))}), single,
                   row_group_size=20)
    multi = base / "multi-turn.parquet"
    pq.write_table(pq.read_table(build_example(base / "example", rows=600, seed=4)), multi, row_group_size=40)
    peer = base / "specforge-qwen3"
    peer.mkdir()
    from peer_conventions import load_model, tokenizer_folder
    from test_peer_conventions import planted_set

    folder = tokenizer_folder("qwen3", base)
    peer_rows, _ = planted_set("specforge", "qwen3", load_model("qwen3", str(folder)))
    peer_table = pa.table({"input_ids": pa.array([r[0] for r in peer_rows], type=pa.list_(pa.int32())),
                           "loss_mask": pa.array([r[1] for r in peer_rows], type=pa.list_(pa.int8()))})
    third = -(-peer_table.num_rows // 3)
    for k in range(3):  # three shards: whole files as units
        pq.write_table(peer_table.slice(k * third, third), peer / f"part-{k:05d}.parquet", row_group_size=8)
    bucket = new_bucket(s3.url)
    upload(s3.url, multi, f"s3://{bucket}/multi-turn/train.parquet")
    found = {
        "single-turn": (single, "qwen3"),
        "multi-turn": (multi, "qwen3.6"),
        "specforge-qwen3": (peer, str(folder)),
        "multi-turn-in-s3": (f"s3://{bucket}/multi-turn/train.parquet", "qwen3.6"),
    }
    pooled = {name: scan_with(data, tok, base / f"pool-{name}", workers=2) for name, (data, tok) in found.items()}
    return {name: (data, tok, pooled[name]) for name, (data, tok) in found.items()}


def scan_with(data, tokenizer, out: Path, **options) -> dict:
    """A scan's tables and summary (``dqa.scan``)."""
    result = dqa.scan(data, tokenizer, out=out, batch_rows=BATCH_ROWS, **options)
    tables = {name: pl.read_parquet(out / f"{name}.parquet") for name in ("findings", "metrics", "turns")}
    return {**tables, "summary": result.summary}


def assert_same(got: dict, pooled: dict) -> None:
    assert pooled["findings"].height > 0
    for name in ("findings", "metrics", "turns"):
        assert got[name].equals(pooled[name]), f"{name} differ from the local pool's"
    for key in ("rows", "tokens", "failing_rows", "checks", "degenerate_templates", "conventions", "thinking_share"):
        assert got["summary"].get(key) == pooled["summary"].get(key), key


@pytest.mark.parametrize("name", ["single-turn", "multi-turn", "specforge-qwen3"])
def test_findings_are_the_local_pools_row_for_row(name, sets, connected, tmp_path):
    data, tok, pooled = sets[name]
    log = tmp_path / "attempts.log"
    connected(unit_hook(log))
    assert_same(scan_with(data, tok, tmp_path / "scan", ray="auto"), pooled)
    units = sorted(k for k, _, _ in attempts(log))
    assert len(units) >= 3 and units == list(range(len(units)))  # every unit once, as a Ray task
    assert ray.is_initialized()  # the caller's connection stays the caller's


def test_a_scan_on_a_connection_of_its_own_has_ended_it_when_it_returns(sets, cluster, tmp_path):
    """The scan disconnects while it merges and writes (in a thread of its own), and is done with that by the time
    it returns: the next scan connects again."""
    data, tok, pooled = sets["single-turn"]
    assert not ray.is_initialized()
    for k in range(2):
        assert_same(scan_with(data, tok, tmp_path / f"scan-{k}", ray=cluster.address), pooled)
        assert not ray.is_initialized()
        assert not [t for t in threading.enumerate() if t.name.startswith("dqa-ray")]


def test_a_relative_path_is_read_by_the_tasks_from_this_working_folder(sets, connected, tmp_path, monkeypatch):
    """Ray's workers do not run in the driver's working folder: the tasks are handed the files' absolute paths."""
    data, tok, pooled = sets["single-turn"]
    (tmp_path / "rel").mkdir()
    shutil.copy(data, tmp_path / "rel" / "train.parquet")
    monkeypatch.chdir(tmp_path)
    connected()
    assert_same(scan_with("rel/train.parquet", tok, tmp_path / "scan", ray="auto"), pooled)


def test_a_set_in_a_bucket_is_read_by_the_tasks_on_their_nodes(sets, cluster, connected, tmp_path):
    data, tok, pooled = sets["multi-turn-in-s3"]
    log = tmp_path / "attempts.log"
    connected(unit_hook(log, delay=0.2))  # slow enough for both nodes to take units
    assert_same(scan_with(data, tok, tmp_path / "scan", ray="auto"), pooled)
    seen = attempts(log)
    workers = {n.node_id for n in cluster.worker_nodes}
    assert {node for _, node, _ in seen} == workers  # both nodes scanned units
    assert os.getpid() not in {pid for _, _, pid in seen}  # and this process none


def test_the_cluster_listens_on_loopback_only(cluster):
    ours = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in ours]
    assert listening
    assert {c.laddr.ip for c in listening} <= {LOOPBACK, "::ffff:127.0.0.1"}, listening


def test_a_node_lost_mid_scan_gives_the_same_findings(sets, cluster, connected, tmp_path):
    data, tok, pooled = sets["multi-turn"]
    victim = cluster.add_node(**node_args())  # a third node, to lose
    cluster.wait_for_nodes()
    log = tmp_path / "attempts.log"
    connected(unit_hook(log, delay=0.5))
    got: dict = {}
    scan = threading.Thread(target=lambda: got.update(scan_with(data, tok, tmp_path / "scan", ray="auto")))
    scan.start()
    deadline = time.monotonic() + 60
    while not any(node == victim.node_id for _, node, _ in attempts(log)):
        assert time.monotonic() < deadline and scan.is_alive(), "the third node never took a unit"
        time.sleep(0.05)
    lost = [k for k, node, _ in attempts(log) if node == victim.node_id]
    cluster.remove_node(victim, allow_graceful=False)  # its raylet and workers killed mid-unit
    scan.join(180)
    assert not scan.is_alive()
    assert_same(got, pooled)
    again = [k for k, node, _ in attempts(log) if k in lost and node != victim.node_id]
    assert again, "the units the lost node held were not run again elsewhere"


@pytest.mark.parametrize("how, says", [("crash", "failed 4 times on the Ray cluster: its worker process or node was lost"),
                                       ("raise", "failed on the Ray cluster: RuntimeError: a planted failure")])
def test_a_unit_that_always_fails_exits_3_naming_it(how, says, sets, connected, cli, tmp_path):
    data, tok, _ = sets["single-turn"]
    log = tmp_path / "attempts.log"
    connected(unit_hook(log, fail_unit=2, how=how))
    out = tmp_path / "scan"
    result = cli("scan", data, "-t", tok, "--out", out, "--batch-rows", BATCH_ROWS, "--ray", "auto", "--quiet")
    assert result.exit_code == 3, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "scan unit 2 (rows " in lines[0] and says in lines[0], result.stderr
    assert [k for k, _, _ in attempts(log)].count(2) == (4 if how == "crash" else 1)  # Ray's 3 retries, for a lost worker
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def run_cli(*args, cwd: Path, env: dict | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    """``dqa ARGS`` in a new process (``code``: Python run before the CLI's main; ``env``: variables to set, None to
    unset)."""
    prog = (code or "") + f"\nimport sys\nsys.argv = ['dqa', *{[str(a) for a in args]!r}]\nfrom dqa.cli import main\nmain()\n"
    merged = {**os.environ, **(env or {})}  # a None in env: that variable unset
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={k: v for k, v in merged.items() if v is not None})


def short_ray_tmp() -> Path:
    """A new folder for a cluster's files (Ray's RAY_TMPDIR, ``ray start --temp-dir``), so that its processes are
    told apart from the module's cluster and any other on the machine; under /tmp, since Ray's socket paths in it
    must fit 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="dqa-ray-", dir="/tmp"))


def processes_under(ray_tmp: Path) -> list[psutil.Process]:
    """The processes whose command line names ``ray_tmp``: those of the clusters whose files are there. A zombie
    (dead, not yet reaped by its adopter) has no command line and is not among them."""
    return [p for p in psutil.process_iter(["cmdline", "name"]) if str(ray_tmp) in " ".join(p.info["cmdline"] or ())]


def cluster_processes(ray_tmp: Path) -> set[int]:
    """The GCS and raylet processes among ``processes_under(ray_tmp)``."""
    return {p.pid for p in processes_under(ray_tmp) if p.info["name"] in ("raylet", "gcs_server")}


def stop_processes_under(ray_tmp: Path) -> None:
    """Kill ``processes_under(ray_tmp)``: a ``ray start`` cluster of a test's, leaving the module's cluster (``ray
    stop`` would stop every cluster on the machine)."""
    procs = processes_under(ray_tmp)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=20)


def assert_cli_scan_same(proc: subprocess.CompletedProcess, out: Path, pooled: dict) -> None:
    """A ``dqa scan --json`` run's scan folder ``out`` and printed summary are the local pool's."""
    got = {name: pl.read_parquet(out / f"{name}.parquet") for name in ("findings", "metrics", "turns")}
    assert_same({**got, "summary": json.loads(proc.stdout)}, pooled)


def test_ray_local_starts_a_cluster_for_the_scan_and_stops_it(sets, cluster, tmp_path):
    data, tok, pooled = sets["multi-turn"]
    ray_tmp = short_ray_tmp()  # the scan's own cluster's files
    try:
        proc = run_cli("scan", data, "-t", tok, "--out", tmp_path / "scan", "--batch-rows", BATCH_ROWS, "--workers", 2,
                       "--ray", "local", "--json", cwd=tmp_path, env={"RAY_TMPDIR": str(ray_tmp)})
        assert proc.returncode == 1, proc.stderr  # defects found, as planted
        assert proc.stderr.strip() == ""
        assert_cli_scan_same(proc, tmp_path / "scan", pooled)
        assert list((ray_tmp / "ray").glob("session_2*")), "the scan started no cluster of its own"
        deadline = time.monotonic() + 20
        while cluster_processes(ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not cluster_processes(ray_tmp), "the local cluster outlived the scan"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_no_cluster_at_the_address_is_exit_2_in_seconds(sets, tmp_path):
    data, tok, _ = sets["single-turn"]
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]  # nothing listens on it
    started = time.monotonic()
    proc = run_cli("scan", data, "-t", tok, "--out", tmp_path / "scan", "--ray", f"{LOOPBACK}:{port}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"nothing answers at {LOOPBACK}:{port}" in lines[0] and "ray start --head" in lines[0]
    assert time.monotonic() - started < 30 and not (tmp_path / "scan").exists()


def test_a_server_that_is_not_ray_at_the_address_is_exit_2_within_the_wait(sets, tmp_path):
    """An HTTP server accepts the TCP check, and Ray would retry it for minutes: the scan gives Ray
    ``CLUSTER_WAIT`` seconds (3 here), then says so and exits 2."""
    import http.server

    data, tok, _ = sets["single-turn"]
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        started = time.monotonic()
        proc = run_cli("scan", data, "-t", tok, "--out", tmp_path / "scan", "--ray", f"{LOOPBACK}:{port}", cwd=tmp_path,
                       code="import dqa.audit.executors.ray_tasks as t\nt.CLUSTER_WAIT = 3.0")
        took = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # Ray's own connection warnings may come before it
    assert last.startswith(f"dqa: error: --ray {LOOPBACK}:{port}: no Ray cluster answered at {LOOPBACK}:{port} within 3 s"), last
    assert "ray start --head" in last and not (tmp_path / "scan").exists()
    assert took < 60, took  # not Ray's minutes of retries


def test_a_cluster_with_token_authentication_names_ray_auth_mode_in_seconds(sets, tmp_path):
    """A head started by ``ray start`` with token authentication (Ray's default for a new cluster). Ray sends its
    token to an address named explicitly (RAY_ADDRESS, --ray HOST:PORT) only under RAY_AUTH_MODE=token, and
    without it retries for minutes: the scan says so within seconds, and the fix it names works."""
    data, tok, pooled = sets["single-turn"]
    token = secrets.token_hex(16)
    home = tmp_path / "home"  # no ~/.ray/auth_token of this machine's
    home.mkdir()
    ray_tmp = short_ray_tmp()
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    head = {"HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    try:
        subprocess.run([str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}", "--num-cpus=1",
                        f"--node-ip-address={LOOPBACK}", f"--temp-dir={ray_tmp}", "--include-dashboard=false",
                        "--disable-usage-stats", f"--object-store-memory={STORE_MEMORY}"],
                       env={**os.environ, **head}, check=True, capture_output=True, timeout=120)
        address = f"{LOOPBACK}:{port}"
        common = {"HOME": str(home), "RAY_ADDRESS": address, "RAY_AUTH_TOKEN": None, "RAY_AUTH_MODE": None}
        for env, says in [({}, "requires an authentication token, which Ray sends to an address named explicitly "
                               "only with RAY_AUTH_MODE=token: set RAY_AUTH_MODE=token"),
                          ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}, "refused this process's "
                               "authentication token (RAY_AUTH_MODE=token)")]:
            started = time.monotonic()
            proc = run_cli("scan", data, "-t", tok, "--out", tmp_path / "scan", "--ray", "auto", cwd=tmp_path,
                           env={**common, **env})
            assert proc.returncode == 2, proc.stderr
            last = proc.stderr.strip().splitlines()[-1]  # after one warning line of Ray's own, saying the same
            assert last.startswith(f"dqa: error: --ray auto: the Ray cluster at {address} ") and says in last, last
            assert time.monotonic() - started < 15 and not (tmp_path / "scan").exists()  # not CLUSTER_WAIT's 20 s
        proc = run_cli("scan", data, "-t", tok, "--out", tmp_path / "scan", "--batch-rows", BATCH_ROWS, "--ray", "auto",
                       "--json", cwd=tmp_path, env={**common, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
        assert proc.returncode == 1, proc.stderr  # the fix named: connected, and the planted defects found
        assert_cli_scan_same(proc, tmp_path / "scan", pooled)
    finally:
        stop_processes_under(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_without_ray_installed_the_fix_is_named(sets, tmp_path):
    data, tok, _ = sets["single-turn"]
    proc = run_cli("scan", data, "-t", tok, "--out", tmp_path / "scan", "--ray", "auto", cwd=tmp_path,
                   code="import sys\nsys.modules['ray'] = None  # as if not installed")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "dqa: error: --ray: Ray is not installed; pip install 'dqa[ray]'", proc.stderr


def test_a_scan_without_ray_never_imports_it(sets, tmp_path):
    data, tok, _ = sets["single-turn"]
    code = ("import sys\nfrom dqa.audit.scan import ScanOptions, run_scan\n"
            f"run_scan({str(data)!r}, {str(tmp_path / 'o')!r}, ScanOptions(tokenizer={tok!r}, workers=2, batch_rows={BATCH_ROWS}))\n"
            "print('ray' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]
