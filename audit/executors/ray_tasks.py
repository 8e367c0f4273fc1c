"""``RayUnits``: a scan's units as Ray tasks on a cluster (``dqa scan --ray [ADDRESS]``).

Each unit is one task of one CPU. The task opens its rows itself, on whatever node runs it (from the object
store, or a path every node sees), scans them with ``scan_workers.scan_unit`` into parts on that node, and
returns the parts' bytes: per-sample and per-turn metrics, lz4-compressed Arrow IPC, never token rows. The
dataset handle and the kernel tables go into the cluster's object store once (``ray.put``), not with every task.
This process takes each result as it is ready, writes its parts into the scan's work folder and drops its
reference, so results do not pile up in the object store (nor spill); the merge is the one every executor
shares (``scan_workers.scan_parts``). Once every result is here, a connection of the scan's own is closed in a
thread of its own, while this process merges the parts and writes the outputs (``dqa.audit.scan.run_scan`` closes
the runner after them).

Faults:
- a task whose worker process or node is lost is run again by Ray (``TASK_RETRIES`` times: Ray's task retries
  for system failures), and its result is the same, since a unit's result depends only on its rows;
- a unit that still fails, or raises, fails the scan: ``RuntimeFailure`` (exit 3) naming the unit and the cause,
  after the units before it in dataset order (so the first bad unit is the one named); bad input in a unit is
  the ``InputError`` it raised (exit 2); the other tasks stop with the job when the connection is this scan's
  own (``dqa scan``), and run out on a caller's (``RayUnits.results`` says why they are not cancelled);
- Ray not installed, or no cluster at the address: ``InputError`` (exit 2) with the fix, within seconds (nothing
  listening) or ``CLUSTER_WAIT`` seconds (a server that is not a Ray cluster, which Ray would retry for minutes);
  a cluster that refuses this process's authentication token (or its lack of one): ``InputError`` naming
  ``RAY_AUTH_MODE=token``, within seconds.

Ray is imported only here, and only when a scan asks for it (the ``ray`` extra).
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from dqa.audit.kernels import KernelTables
from dqa.audit.readers import Dataset
from dqa.audit.scan_workers import UnitDone, UnitTask, scan_unit
from dqa.errors import InputError, RuntimeFailure
from dqa.memory import reuse_freed_memory

TASK_RETRIES = 3  # Ray's retries of a task whose worker process or node died (its max_retries)
CONNECT_TIMEOUT = 5.0  # seconds to reach a cluster's address before saying that nothing answers there
CLUSTER_WAIT = 20.0  # seconds for Ray to connect to what answers there (a cluster connects in about one)
INSTALL_HINT = "pip install 'dqa[ray]'"


class RayUnits:
    """A ``dqa.audit.executors.UnitRunner`` over a Ray cluster; use as a context manager (``connect``)."""

    def __init__(self, ray: Any, slots: int, owns_connection: bool):
        self._ray = ray
        self.slots = slots
        self._owns = owns_connection
        self._leaving: threading.Thread | None = None  # the disconnection begun when the last result came

    def __enter__(self) -> "RayUnits":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect (and stop a cluster ``connect`` started) unless the connection was the caller's; wait for a
        disconnection ``results`` began."""
        if self._leaving is not None:
            self._leaving.join()
        elif self._owns and self._ray.is_initialized():
            self._ray.shutdown()

    def _leave_soon(self) -> None:
        """Disconnect in a thread of its own (a connection of this runner's own, once every result is here): Ray's
        ``shutdown`` waits about 0.27 s (its driver flushes the job's task events, measured on this project's 2-core
        machine), which the merge of the parts and the writing of the outputs then hide; ``close`` waits for it."""
        if self._owns and self._leaving is None:
            self._leaving = threading.Thread(target=self._ray.shutdown, name="dqa-ray-disconnect", daemon=True)
            self._leaving.start()

    def results(self, ds: Dataset, tables: KernelTables, tasks: list[UnitTask],
                started: Callable[[], None]) -> Iterator[UnitDone]:
        """See ``dqa.audit.executors.UnitRunner.results``."""
        ray = self._ray
        shared = ray.put((_with_absolute_files(ds), tables))
        remote = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(scan_on_node)
        pending = {remote.remote(shared, task): task for task in tasks}
        done: dict[int, UnitDone] = {}
        failed: dict[int, BaseException] = {}
        following = 0  # the next unit to hand back, in unit order
        # The tasks left when this stops (a unit failed, the caller stopped) are not cancelled: Ray's cancellation of
        # a task can race the task's reply and abort this process (a failed check in its core worker's task manager,
        # "it != submissible_tasks_.end()", seen with Ray 2.60 in this project's CI after a unit failed). With a
        # connection of its own, ``close`` ends the job and Ray stops the job's tasks with it; on a caller's
        # connection they run out (a unit is seconds of work) and their results go with their references.
        started()
        while following < len(tasks):
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                task = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # Ray's wrapping of the task's error or of a lost worker
                    failed[task.k] = exc
                else:
                    done[task.k] = _unpack(result, task)
                del ref
            if not pending and not failed:
                self._leave_soon()  # every result is in this process: the cluster is not needed for the rest
            while following in done:
                yield done.pop(following)
                following += 1
            if following in failed:
                raise _failure(failed[following], tasks[following], ray) from None


def _with_absolute_files(ds: Dataset) -> Dataset:
    """A copy of ``ds`` whose local files are absolute paths: a Ray worker does not run in this process's working
    folder (a relative path failed as "no such file" on a ``ray start`` cluster of this machine). URLs stay as they
    are."""
    seen = copy.copy(ds)
    seen.files = [f.absolute() if isinstance(f, Path) else f for f in ds.files]
    return seen


def scan_on_node(shared: tuple[Dataset, KernelTables], task: UnitTask) -> tuple[UnitDone, bytes, bytes]:
    """The task: scan ``task``'s unit into parts in a temporary folder of this node; return its ``UnitDone`` and the
    two parts' bytes (metrics, turns). Raises what ``scan_unit`` raises."""
    # As a pool worker does: the kernels' batches reuse their freed pages instead of faulting them in again. It is
    # process-wide: a Ray worker of this job keeps that heap (about a batch's worth) for its later tasks too.
    reuse_freed_memory()
    ds, tables = shared
    with tempfile.TemporaryDirectory(prefix="dqa-unit-") as tmp:
        pair = (Path(tmp) / "metrics.arrow", Path(tmp) / "turns.arrow")
        unit = scan_unit(task._replace(pair=pair, threads=False), ds, tables)
        return unit, pair[0].read_bytes(), pair[1].read_bytes()


def _unpack(result: tuple[UnitDone, bytes, bytes], task: UnitTask) -> UnitDone:
    """Write a task's parts to the unit's paths in the work folder; return its ``UnitDone``."""
    unit, metrics, turns = result
    for path, data in zip(task.pair, (metrics, turns)):
        path.write_bytes(data)
    return unit


def _failure(exc: BaseException, task: UnitTask, ray: Any) -> BaseException:
    """What a unit's failure means for the scan: the ``InputError`` the unit raised, else a ``RuntimeFailure``
    naming the unit and the cause."""
    cause = getattr(exc, "cause", None)  # a RayTaskError: the task raised
    if isinstance(cause, InputError):
        return cause
    where = f"{task.dataset}: scan unit {task.k} (rows {task.unit.start_row:,}-{task.unit.start_row + task.unit.rows - 1:,})"
    if cause is not None:
        return RuntimeFailure(f"{where} failed on the Ray cluster: {type(cause).__name__}: {_first_line(cause)}")
    lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError)
    if isinstance(exc, lost):
        return RuntimeFailure(f"{where} failed {TASK_RETRIES + 1} times on the Ray cluster: its worker process or node "
                              f"was lost each time ({type(exc).__name__}); see the cluster's logs (ray logs)")
    return RuntimeFailure(f"{where} failed on the Ray cluster: {type(exc).__name__}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def connect(address: str, local_cpus: int) -> RayUnits:
    """A ``RayUnits`` on the cluster at ``address``: ``auto`` (``RAY_ADDRESS``, else the cluster running on this
    machine), ``local`` (start one here, of ``local_cpus`` CPUs, listening on 127.0.0.1 only, stopped with the
    scan), or a cluster address (``HOST:PORT``, ``ray://HOST:PORT``). A Ray connection this process already holds
    (``ray.init`` by the caller) is used as it is, whatever ``address`` says. Returns the runner, whose ``slots``
    are the cluster's CPUs. Raises ``InputError`` when Ray is not installed or no cluster answers at the address."""
    try:
        import ray
    except ImportError:
        raise InputError(f"--ray: Ray is not installed; {INSTALL_HINT}") from None
    owns = not ray.is_initialized()
    if owns:
        _connect(ray, address, local_cpus)
    return RayUnits(ray, _cpus(ray), owns_connection=owns)


def _connect(ray: Any, address: str, local_cpus: int) -> None:
    """``ray.init`` for ``connect``'s ``address``. Raises ``InputError`` when no cluster answers there."""
    quiet = {"logging_level": logging.ERROR, "include_dashboard": False, "configure_logging": True}
    if address == "local":
        ray.init(address="local", num_cpus=local_cpus, _node_ip_address="127.0.0.1", **quiet)
        return
    target = os.environ.get("RAY_ADDRESS") if address == "auto" else address
    if target:
        _check_reachable(target, address)
    client = (target or "").startswith("ray://")
    _init_within(ray, dict(address=target or "auto", **({} if client else quiet)), address,
                 gcs=target if target and not client else None)


def _init_within(ray: Any, kwargs: dict[str, Any], asked: str, gcs: str | None = None) -> None:
    """``ray.init(**kwargs)``, given ``CLUSTER_WAIT`` seconds. Ray itself retries a connection for minutes when
    something other than a Ray cluster listens at the address (each try waits out gRPC timeouts: 82 s for two tries
    against an HTTP server, seen), so it runs in a thread of its own, left behind if it is still trying. With
    ``gcs`` (an explicit ``HOST:PORT``), the cluster's GCS is asked first whether it takes this process's
    authentication (``_check_token``): where it does not, ``ray.init`` would retry for minutes too. Raises
    ``InputError`` when Ray says it found no cluster, the cluster refuses this process's token (or its lack of
    one), or it has not connected in time."""
    outcome: dict[str, BaseException | None] = {}

    def init() -> None:
        try:
            if gcs is not None:
                _check_token(gcs)
            ray.init(**kwargs)
            outcome["error"] = None
        except BaseException as exc:  # handed to the scan's thread
            outcome["error"] = exc

    # A daemon thread, not concurrent.futures': its threads are joined at exit, which would wait out Ray's retries.
    thread = threading.Thread(target=init, name="dqa-ray-connect", daemon=True)
    thread.start()
    thread.join(CLUSTER_WAIT)
    if "error" not in outcome:
        raise InputError(f"--ray {asked}: no Ray cluster answered at {kwargs['address']} within {CLUSTER_WAIT:.0f} s "
                         "(is it a Ray cluster's address, the head's GCS port?); start one (ray start --head), set "
                         "RAY_ADDRESS, or use --ray local")
    error = outcome["error"]
    if isinstance(error, ray.exceptions.AuthenticationError):
        raise InputError(f"--ray {asked}: {_token_fix(kwargs['address'])}") from None
    if isinstance(error, ConnectionError):
        raise InputError(f"--ray {asked}: no Ray cluster found ({_first_line(error)}); start one (ray start --head), "
                         "set RAY_ADDRESS, or use --ray local") from None
    if error is not None:
        raise error


def _check_token(gcs: str) -> None:
    """Open a client of the GCS at ``gcs`` (``HOST:PORT``) as ``ray.init`` would, which fetches the cluster's ID
    once. Raises ``ray.exceptions.AuthenticationError`` when the cluster refuses this process's token, within a
    second (Ray's C++ client logs one warning line saying so on stderr); other failures are left to ``ray.init``."""
    from ray.exceptions import AuthenticationError

    try:
        from ray._raylet import GcsClient  # Ray's own GCS client (``ray status`` uses it); not in its public API
    except ImportError:
        return
    try:
        GcsClient(address=gcs)
    except AuthenticationError:
        raise
    except Exception:  # noqa: BLE001 (ray.init meets it again, and says what it is)
        pass


def _token_fix(address: str) -> str:
    """What to do when the cluster at ``address`` refused this process's authentication token, or its lack of one.
    Ray sends its token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``) to a cluster found on
    this machine, but to an address named explicitly (``--ray HOST:PORT``, ``RAY_ADDRESS``) only under
    ``RAY_AUTH_MODE=token``."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return (f"the Ray cluster at {address} refused this process's authentication token (RAY_AUTH_MODE=token); "
                "give it the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")
    return (f"the Ray cluster at {address} requires an authentication token, which Ray sends to an address named "
            "explicitly only with RAY_AUTH_MODE=token: set RAY_AUTH_MODE=token and the cluster's token "
            "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), or on the head node use --ray auto "
            "without RAY_ADDRESS")


def _check_reachable(target: str, asked: str) -> None:
    """Fail in seconds, not after Ray's minute of retries, when nothing listens at ``target`` (``HOST:PORT`` or
    ``ray://HOST:PORT``). Raises ``InputError``."""
    hostport = target.removeprefix("ray://").rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"--ray {asked}: expected auto, local, HOST:PORT or ray://HOST:PORT, got {target!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise InputError(f"--ray {asked}: nothing answers at {hostport} ({exc.strerror or exc}); start the cluster "
                         "(ray start --head), or check the address") from None


def _cpus(ray: Any) -> int:
    """The cluster's CPUs (at least 1): how many units run at once."""
    return max(int(ray.cluster_resources().get("CPU", 1)), 1)
