"""`dqa plan` reproduces the seed incident's arithmetic and shows scenarios side by side."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dqa.errors import InputError, RuntimeFailure, UsageError
from dqa.regen.plan import budget, counts
from dqa.regen.plan import calibrate as calibration


def _plan_json(cli, *args):
    r = cli("plan", *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["scenarios"]


def test_914k_samples_of_2500_tokens_at_1600_tok_s_take_16_5_days(cli):
    (p,) = _plan_json(cli, "--samples", "914000", "--avg-output-tokens", "2500", "--tok-per-s", "1600")
    assert p["total_tokens"] == 914_000 * 2_500 == 2_285_000_000
    assert p["wall_s"] == pytest.approx(1_428_125)
    assert round(p["wall_days"], 1) == 16.5


def test_four_gpus_at_400_tok_s_each_is_the_same_16_5_day_plan(cli):
    (p,) = _plan_json(cli, "--samples", "914000", "--avg-output-tokens", "2500", "--tok-per-gpu", "400", "--gpus", "4")
    assert p["tok_per_s"] == 1600
    assert round(p["wall_days"], 1) == 16.5
    assert p["gpu_hours"] == pytest.approx(4 * 1_428_125 / 3600)


def test_5_6_req_s_of_2306_tokens_is_12_900_tok_s_45_hours_and_1215_dollars_at_27_per_hour(cli):
    (p,) = _plan_json(
        cli, "--samples", "913786", "--avg-output-tokens", "2306", "--req-per-s", "5.6", "--gpus", "7", "--fleet-hour-cost", "27"
    )
    assert p["tok_per_s"] == pytest.approx(12_913.6)
    assert round(p["tok_per_s"], -2) == 12_900
    assert p["wall_hours"] == pytest.approx(45.33, abs=0.01)
    assert round(p["wall_hours"]) == 45
    assert p["fleet_hour_cost"] == pytest.approx(27.0)
    assert p["gpu_hour_cost"] == pytest.approx(27 / 7)
    # The seed rounded to 45 h x $27/h = $1,215; the unrounded 45.33 h gives $1,224.
    assert p["cost"] == pytest.approx(1_215, rel=0.01)
    assert p["cost"] == pytest.approx(p["wall_hours"] * 27)


def test_1500_tok_s_is_5_4m_per_hour_and_129_6m_per_day_shown_side_by_side(cli):
    (p,) = _plan_json(cli, "--samples", "914000", "--avg-output-tokens", "2500", "--tok-per-s", "1500")
    assert p["tok_per_hour"] == 5_400_000
    assert p["tok_per_day"] == 129_600_000
    r = cli("plan", "--samples", "914000", "--avg-output-tokens", "2500", "--tok-per-s", "1500")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    hour = next(i for i, ln in enumerate(lines) if "tokens per hour" in ln)
    assert "5.40M" in lines[hour]
    assert "tokens per day" in lines[hour + 1] and "129.6M" in lines[hour + 1]


def test_scenarios_appear_as_columns_of_one_table_with_cost_per_gpu_hour(cli):
    args = ["--samples", "914000", "--avg-output-tokens", "2500", "--scenario", "pro6000:4:400", "--scenario", "b200:7:2300:3.857"]
    plans = _plan_json(cli, *args)
    assert [p["name"] for p in plans] == ["pro6000", "b200"]
    assert plans[0]["cost"] is None
    assert plans[1]["tok_per_s"] == 16_100
    assert plans[1]["cost"] == pytest.approx(plans[1]["wall_hours"] * 7 * 3.857)
    r = cli("plan", *args)
    header = next(ln for ln in r.stdout.splitlines() if "pro6000" in ln)
    assert header.index("pro6000") < header.index("b200")
    assert sum("wall time (days)" in ln for ln in r.stdout.splitlines()) == 1


def test_a_fleet_hour_cost_is_divided_by_each_scenarios_own_gpu_count(cli):
    """$27/h for a 7-GPU node is 3.857 per GPU-hour for that scenario, whatever the top-level --gpus."""
    plans = _plan_json(
        cli, "--samples", "913786", "--avg-output-tokens", "2306", "--fleet-hour-cost", "27",
        "--tok-per-gpu", "1845", "--gpus", "7", "--scenario", "b200:7:2300", "--scenario", "half:4:2300", "--scenario", "own:2:2300:1.5",
    )  # fmt: skip
    given, b200, half, own = plans
    assert given["gpu_hour_cost"] == pytest.approx(27 / 7) and given["fleet_hour_cost"] == pytest.approx(27)
    assert b200["gpu_hour_cost"] == pytest.approx(27 / 7) and b200["fleet_hour_cost"] == pytest.approx(27)
    assert half["gpu_hour_cost"] == pytest.approx(27 / 4) and half["fleet_hour_cost"] == pytest.approx(27)
    assert own["gpu_hour_cost"] == 1.5  # a scenario's own price wins
    # Without --gpus (default 1) the scenario still gets 27/7, not 27 per GPU-hour.
    (b200,) = _plan_json(cli, "--samples", "1000", "--avg-output-tokens", "100", "--fleet-hour-cost", "27", "--scenario", "b200:7:2300")
    assert b200["gpu_hour_cost"] == pytest.approx(27 / 7)
    assert b200["cost"] == pytest.approx(b200["wall_hours"] * 27)


def test_plan_short_flags_do_not_clash_with_scan_validate_and_gate(cli):
    """-t is --tokenizer and -s is --suite elsewhere; plan has neither short flag."""
    for flag in ("-t", "-s"):
        r = cli("plan", "--samples", "10", flag, "100", "--tok-per-s", "10")
        assert r.exit_code == 2 and "No such option" in r.output


def test_quiet_plan_prints_nothing_and_still_checks_its_input(cli):
    r = cli("plan", "--samples", "10", "--avg-output-tokens", "100", "--tok-per-s", "10", "--quiet")
    assert r.exit_code == 0 and r.stdout == ""
    assert cli("plan", "--samples", "10", "--avg-output-tokens", "100", "--quiet").exit_code == 2


def test_a_scenario_takes_the_default_gpu_hour_cost_unless_it_names_its_own():
    s = budget.parse_scenario("a:2:100", 10, 50.0, default_cost=2.0)
    assert (s.gpus, s.tok_per_gpu, s.gpu_hour_cost) == (2, 100.0, 2.0)
    assert budget.parse_scenario("a:2:100:$5", 10, 50.0, default_cost=2.0).gpu_hour_cost == 5.0
    for bad in ("a:2", "a:x:100", "a:2:fast", ":2:100", "a:2:100:cheap"):
        with pytest.raises(UsageError, match="--scenario"):
            budget.parse_scenario(bad, 10, 50.0, None)


def test_findings_folder_sets_the_sample_count_to_its_failing_rows(cli, tmp_path):
    table = pa.table({"row": pa.array([3, 7, 9], pa.int64()), "id": ["a", "b", "c"], "reasons": [["truncated"]] * 3})
    pq.write_table(table, tmp_path / "findings.parquet")
    (p,) = _plan_json(cli, "--findings", str(tmp_path), "--avg-output-tokens", "100", "--tok-per-s", "10")
    assert p["samples"] == 3
    assert p["wall_s"] == pytest.approx(30)


def test_a_parquet_without_the_row_column_is_not_findings(tmp_path):
    pq.write_table(pa.table({"x": [1]}), tmp_path / "findings.parquet")
    with pytest.raises(InputError, match="'row' missing"):
        counts.count_findings(tmp_path)
    with pytest.raises(InputError, match="no findings.parquet"):
        counts.count_findings(tmp_path / "nowhere")


def test_fleet_file_gives_the_gpu_count(cli, tmp_path):
    """One GPU per endpoint that `fleet up` started; a hand-written TP server lists several."""
    fleet = {
        "version": 1, "engine": "sglang", "protocol": "sglang", "model": "m",
        "endpoints": [{"url": f"http://127.0.0.1:{30000 + i}", "gpu": str(i)} for i in range(7)],
    }  # fmt: skip
    (tmp_path / "fleet.json").write_text(json.dumps(fleet))
    (p,) = _plan_json(cli, "--samples", "1000", "--avg-output-tokens", "100", "--tok-per-gpu", "50", "--fleet", str(tmp_path / "fleet.json"))
    assert p["gpus"] == 7 and p["tok_per_s"] == 350
    fleet["endpoints"] = [{"url": "http://127.0.0.1:30000", "gpu": "0,1"}, {"url": "http://127.0.0.1:30001", "gpu": "2,3"}]
    (tmp_path / "fleet.json").write_text(json.dumps(fleet))
    (p,) = _plan_json(cli, "--samples", "1000", "--avg-output-tokens", "100", "--tok-per-gpu", "50", "--fleet", str(tmp_path / "fleet.json"))
    assert p["gpus"] == 4  # two tensor-parallel servers of two GPUs each


@pytest.mark.parametrize(
    "args, message",
    [
        (["--avg-output-tokens", "100", "--tok-per-s", "10"], "how many samples"),
        (["--samples", "10", "--tok-per-s", "10"], "mean output tokens"),
        (["--samples", "10", "--avg-output-tokens", "100"], "throughput"),
        (["--samples", "10", "--avg-output-tokens", "100", "--tok-per-s", "10", "--req-per-s", "1"], "throughput once"),
        (["--samples", "10", "--avg-output-tokens", "0", "--tok-per-s", "10"], "must be > 0"),
        (["--samples", "10", "--avg-output-tokens", "5", "--tok-per-s", "1", "--gpu-hour-cost", "1", "--fleet-hour-cost", "7"], "not both"),
        (["--samples", "10", "--avg-output-tokens", "5", "--scenario", "a:1:1", "--scenario", "a:2:2"], "used twice"),
        (["--samples", "10", "--avg-output-tokens", "5", "--calibrate", "--endpoint", "http://x"], "--dataset"),
        (["--samples", "10", "--avg-output-tokens", "5", "--tok-per-gpu", "10", "--gpus", "0"], "--gpus 0"),
        (["--samples", "10", "--avg-output-tokens", "5", "--scenario", "a:0:100"], "gpus must be >= 1"),
    ],
)
def test_incomplete_or_contradictory_input_is_a_one_line_usage_error(cli, args, message):
    r = cli("plan", *args)
    assert r.exit_code == 2
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_calibration_reads_rates_and_mean_output_from_progress_json():
    progress = {
        "state": "finished", "total": 393, "done": 393, "ok": 390, "failed": 3, "truncated": 5,
        "elapsed_s": 70.2, "req_per_s": 5.6, "output_tok_per_s": 12_913.6, "mean_output_tokens": 2306,
        "endpoints": {f"http://h:{30000 + i}": {} for i in range(7)},
    }  # fmt: skip
    c = calibration.calibration_from_progress(progress, sample=393, out=None)
    assert (c.req_per_s, c.mean_output_tokens, c.endpoints, c.failed) == (5.6, 2306, 7, 3)
    p = budget.compute(budget.Scenario("measured", 913_786, c.mean_output_tokens, gpus=7, req_per_s=c.req_per_s))
    assert round(p.wall_hours) == 45
    with pytest.raises(RuntimeFailure, match="measured nothing"):
        calibration.calibration_from_progress({"state": "failed", "done": 0, "ok": 0}, sample=8, out=None)


@pytest.fixture()
def failing_set(tmp_path):
    from fleet_helpers import write_failing_set

    return write_failing_set(tmp_path)


@pytest.mark.slow
def test_calibrate_plans_from_a_real_short_regeneration_on_a_server(cli, tmp_path, failing_set):
    from servers.sglang_contract import StubServer

    data, scan = failing_set
    with StubServer(tmp_path / "stub", "--latency-s", "0.05") as server:
        r = cli(
            "plan", "--calibrate", "--endpoint", server.url, "--dataset", data, "--findings", scan, "--sample", "4",
            "--gpu-hour-cost", "2", "--calibrate-out", tmp_path / "cal", "--json",
        )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    cal, (p,) = out["calibration"], out["scenarios"]
    progress = json.loads((tmp_path / "cal" / "progress.json").read_text())
    assert cal["done"] == progress["done"] == 4 and cal["ok"] == 4
    assert cal["mean_output_tokens"] == progress["mean_output_tokens"] > 0
    assert cal["req_per_s"] == progress["req_per_s"] > 0
    assert p["name"] == "measured" and p["samples"] == 6 and p["gpus"] == 1
    assert p["avg_output_tokens"] == cal["mean_output_tokens"]
    assert p["tok_per_s"] == pytest.approx(cal["req_per_s"] * cal["mean_output_tokens"])
    assert p["wall_s"] == pytest.approx(6 / cal["req_per_s"])
    assert p["cost"] == pytest.approx(p["wall_hours"] * 2)


def test_calibrate_without_a_sample_count_is_refused_before_any_generation(cli, tmp_path, failing_set):
    """No --samples/--findings: a usage error at once, nothing sent to the server, no run folder."""
    from servers.sglang_contract import StubServer

    data, _ = failing_set
    with StubServer(tmp_path / "stub", "--latency-s", "0.05") as server:
        r = cli(
            "plan", "--calibrate", "--endpoint", server.url, "--dataset", data, "--sample", "2",
            "--calibrate-out", tmp_path / "cal",
        )  # fmt: skip
        assert r.exit_code == 2 and "how many samples" in r.stderr
        assert not (tmp_path / "cal").exists()
        r = cli(
            "plan", "--calibrate", "--endpoint", server.url, "--dataset", data, "--sample", "2", "--samples", "10",
            "--scenario", "x:y", "--calibrate-out", tmp_path / "cal",
        )  # fmt: skip
        assert r.exit_code == 2 and "--scenario" in r.stderr
        assert not (tmp_path / "cal").exists()


def test_calibrate_against_a_dead_endpoint_fails_with_exit_3(cli, tmp_path, failing_set):
    from fleet_helpers import free_port_base

    data, scan = failing_set
    r = cli(
        "plan", "--calibrate", "--endpoint", f"http://127.0.0.1:{free_port_base(1)}", "--dataset", data,
        "--findings", scan, "--sample", "2",
    )  # fmt: skip
    assert r.exit_code == 3
    assert r.stderr.startswith("dqa: error: ")
