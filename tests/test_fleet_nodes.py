"""A fleet across nodes is one fleet file per node, read together: `dqa regen`, `dqa fleet status`,
`dqa fleet down` and `dqa plan` take `--fleet` once per file, and their servers are the union.
Run here on one machine with two fleet files, each from its own `dqa fleet up` of SGLang stand-ins
(tests/servers/sglang_contract.py behind the exact `python -m sglang.launch_server` command); one
fleet binds 0.0.0.0, as a node serving others does, so its URLs carry the advertised address.
A duplicated URL, a missing or malformed file is refused in one line naming the file(s), exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fleet_helpers import dqa, fake_sglang_python, fleet_up, read_json, write_failing_set
from regen_helpers import read_shards

from dqa.errors import InputError, UsageError
from dqa.regen.config import DispatchSpec
from dqa.regen.fleet import file as ff
from dqa.regen.fleet import launch as fl
from dqa.regen.run_servers import resolve_servers


def _one_error_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("dqa: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Node a: one server on 127.0.0.1; node b: two servers bound to 0.0.0.0 (URLs: the advertised
    address). Each `fleet up` writes its own fleet file into one shared folder."""
    folder = tmp_path_factory.mktemp("nodes")
    py = fake_sglang_python(folder)
    a, b = folder / "node-a.json", folder / "node-b.json"
    ra, _ = fleet_up("fleet", "up", "--model", "Qwen/Qwen3-8B", "--gpus", "0", "--python", py, "--fleet", a,
                     "--timeout", "120", ports=1, cwd=folder)  # fmt: skip
    assert ra.returncode == 0, ra.stderr
    try:
        rb, _ = fleet_up("fleet", "up", "--model", "Qwen/Qwen3-8B", "--gpus", "0-1", "--python", py, "--fleet", b,
                         "--host", "0.0.0.0", "--timeout", "120", ports=2, cwd=folder)  # fmt: skip
        assert rb.returncode == 0, rb.stderr
        yield folder, a, b
    finally:
        dqa("fleet", "down", "--fleet", a, "--fleet", b, "--grace", "10", cwd=folder)


def test_each_node_writes_its_own_fleet_file_with_urls_other_nodes_can_reach(two_nodes):
    folder, a, b = two_nodes
    ea, eb = read_json(a)["endpoints"], read_json(b)["endpoints"]
    assert urlsplit(ea[0]["url"]).hostname == "127.0.0.1"
    # Bound to 0.0.0.0: the URL names this machine's address (what another node dials), not the wildcard.
    advertised = fl.advertised_host("0.0.0.0", None)
    assert [urlsplit(e["url"]).hostname for e in eb] == [advertised, advertised] and advertised != "0.0.0.0"
    assert all(e["host"] == advertised for e in eb)
    # Both nodes have a GPU 0; their logs do not share a file (NAME-logs/ next to NAME.json).
    assert Path(ea[0]["log"]) == folder / "node-a-logs" / "gpu0.log"
    assert [Path(e["log"]) for e in eb] == [folder / "node-b-logs" / "gpu0.log", folder / "node-b-logs" / "gpu1.log"]


def test_up_will_not_overwrite_the_fleet_file_of_another_node_whose_servers_answer(two_nodes):
    folder, a, _ = two_nodes
    rec = read_json(a)
    rec["endpoints"][0].update(host="203.0.113.7", pid=1)  # as if node 203.0.113.7 had written it into this shared folder
    shared = folder / "fleet.json"
    shared.write_text(json.dumps(rec))
    line = _one_error_line(dqa("fleet", "up", "--model", "Qwen/Qwen3-8B", "--fleet", shared, cwd=folder))
    assert f"{shared} records servers of another machine (203.0.113.7) that still answer" in line
    assert read_json(shared) == rec and not (folder / "fleet-logs").exists()  # nothing written, nothing started


def test_status_shows_every_node_and_sums_them(two_nodes):
    folder, a, b = two_nodes
    r = dqa("fleet", "status", "--fleet", a, "--fleet", b, "--json", cwd=folder)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    urls = [e["url"] for e in read_json(a)["endpoints"] + read_json(b)["endpoints"]]
    assert [e["url"] for e in st["endpoints"]] == urls
    assert [e["fleet"] for e in st["endpoints"]] == [str(a), str(b), str(b)]
    assert st["fleet"] == [str(a), str(b)] and st["engine"] == "sglang" and st["model"] == "Qwen/Qwen3-8B"
    assert st["total"]["endpoints"] == 3 and st["total"]["up"] == 3
    assert all(e["source"] == "metrics" and e["process"] == "running" for e in st["endpoints"])
    table = dqa("fleet", "status", "--fleet", a, "--fleet", b, cwd=folder, env={"COLUMNS": "200"})
    assert table.returncode == 0 and "3/3" in table.stdout and "2 fleet files" in table.stdout


def test_plan_counts_the_gpus_of_every_fleet_file(two_nodes):
    folder, a, b = two_nodes
    r = dqa("plan", "--samples", "1000", "--avg-output-tokens", "100", "--tok-per-gpu", "50", "--fleet", a, "--fleet", b, "--json", cwd=folder)
    assert r.returncode == 0, r.stderr
    (given,) = json.loads(r.stdout)["scenarios"]
    assert given["gpus"] == 3 and given["tok_per_s"] == 150


def test_plan_calibrates_on_the_servers_of_every_fleet_file(two_nodes):
    folder, a, b = two_nodes
    work = folder / "calibrate"
    work.mkdir()
    data, scan = write_failing_set(work, n=6)
    r = dqa("plan", "--calibrate", "--dataset", data, "--findings", scan, "--sample", "6", "--fleet", a, "--fleet", b,
            "--calibrate-out", work / "run", "--json", cwd=work, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["calibration"]["done"], out["calibration"]["endpoints"]) == (6, 3) and out["scenarios"][0]["gpus"] == 3
    used = {x["endpoint"] for x in read_shards(work / "run").to_pylist()}
    assert used <= {e["url"] for e in read_json(a)["endpoints"] + read_json(b)["endpoints"]}


def test_regen_goes_to_the_servers_of_both_files_exactly_once(two_nodes):
    folder, a, b = two_nodes
    work = folder / "regen-run"
    work.mkdir()
    data, scan = write_failing_set(work, n=12)
    r = dqa("regen", data, "--findings", scan, "--fleet", a, "--fleet", b, "--out", work / "out", "--json", cwd=work, timeout=300)
    assert r.returncode == 0, r.stderr
    progress = json.loads(r.stdout)
    assert (progress["done"], progress["failed"]) == (12, 0)
    rows = read_shards(work / "out").to_pylist()
    assert sorted(x["row"] for x in rows) == list(range(12))  # each row once
    urls_a = {e["url"] for e in read_json(a)["endpoints"]}
    urls_b = {e["url"] for e in read_json(b)["endpoints"]}
    used = {x["endpoint"] for x in rows}
    assert used <= urls_a | urls_b and used & urls_a and used & urls_b, used
    run = read_json(work / "out" / "run.json")
    assert sorted(run["endpoints"]) == sorted(urls_a | urls_b)


def test_a_url_in_two_files_a_missing_and_a_malformed_file_are_one_line_each_exit_2(two_nodes):
    folder, a, b = two_nodes
    copy = folder / "node-c.json"
    shutil.copy(a, copy)  # node a's servers again, as if its fleet file had been copied
    missing = folder / "node-d.json"
    bad = folder / "node-e.json"
    bad.write_text('{"version": 1, "engine": "sglang"')
    url = read_json(a)["endpoints"][0]["url"]
    data, scan = write_failing_set(folder, n=2)
    commands = {
        "regen": ("regen", data, "--findings", scan, "--out", folder / "never"),
        "status": ("fleet", "status"),
        "plan": ("plan", "--samples", "10", "--avg-output-tokens", "10", "--tok-per-gpu", "5"),
    }
    for name, cmd in commands.items():
        line = _one_error_line(dqa(*cmd, "--fleet", a, "--fleet", b, "--fleet", copy, cwd=folder))
        assert f"{url} is in both {a} and {copy}" in line, (name, line)
        assert "--host 0.0.0.0" in line  # a loopback URL: the hint for a node's fleet
        line = _one_error_line(dqa(*cmd, "--fleet", a, "--fleet", missing, cwd=folder))
        assert f"{missing}: fleet file not found" in line, (name, line)
        line = _one_error_line(dqa(*cmd, "--fleet", bad, "--fleet", b, cwd=folder))
        assert f"{bad}: not a dqa fleet file" in line, (name, line)
    assert not (folder / "never").exists()


def test_the_files_of_one_run_must_agree_on_protocol_and_model_unless_told(tmp_path):
    def write(name: str, node: int, **kw) -> Path:
        rec = {"version": 1, "engine": "sglang", "protocol": "sglang", "model": "/dev/shm/Qwen3.6-27B",
               "endpoints": [{"url": f"http://10.0.0.{node}:30000", "gpu": "0"}], **kw}  # fmt: skip
        (tmp_path / name).write_text(json.dumps(rec))
        return tmp_path / name

    a = write("a.json", 5)
    b = write("b.json", 6, model="/models/Qwen3.6-27B")
    o = write("o.json", 7, protocol="openai")
    with pytest.raises(InputError, match=r"a\.json has model '/dev/shm/Qwen3\.6-27B' but .*b\.json has '/models/Qwen3\.6-27B'.*--model"):
        resolve_servers(DispatchSpec(fleet=(str(a), str(b))))
    servers = resolve_servers(DispatchSpec(fleet=(str(a), str(b)), model="Qwen3.6-27B"))
    assert servers.urls == ["http://10.0.0.5:30000", "http://10.0.0.6:30000"] and servers.model == "Qwen3.6-27B" and servers.gpus == 2
    with pytest.raises(InputError, match=r"protocol 'sglang' but .*o\.json has 'openai'.*--protocol"):
        resolve_servers(DispatchSpec(fleet=(str(a), str(o))))
    assert resolve_servers(DispatchSpec(fleet=(str(a), str(o)), protocol="openai")).protocol == "openai"
    # One file, as before: a path, not a tuple, is fine too.
    assert DispatchSpec(fleet=str(a)).fleet == (str(a),)
    assert ff.read_fleets([a, o]).gpu_count == 2
    with pytest.raises(UsageError, match="given twice"):
        ff.read_fleets([a, tmp_path / "." / "a.json"])
