"""A plan can be computed from Python (``dqa.regen.plan.make_plan``) with the same figures,
checks and JSON as `dqa plan`; the table comes from ``dqa.reports.plan_table``."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from dqa.errors import UsageError
from dqa.regen.plan import PlanInputs, PlanResult, make_plan
from dqa.reports.plan_table import PRICE_HINT, plan_table, print_plan, table_rows


def test_914k_samples_of_2500_tokens_at_1600_tok_s_take_16_5_days_from_python():
    result = make_plan(PlanInputs(samples=914_000, avg_output_tokens=2_500, tok_per_s=1_600))
    (p,) = result.plans
    assert p.name == "given" and result.calibration is None
    assert p.total_tokens == 914_000 * 2_500 == 2_285_000_000
    assert p.wall_s == pytest.approx(1_428_125)
    assert round(p.wall_days, 1) == 16.5
    assert result.unpriced


def test_5_6_req_s_on_7_gpus_at_27_dollars_per_fleet_hour_is_45_hours_and_about_1215_dollars():
    result = make_plan(
        PlanInputs(samples=913_786, avg_output_tokens=2_306, req_per_s=5.6, gpus=7, fleet_hour_cost=27)
    )
    (p,) = result.plans
    assert round(p.tok_per_s, -2) == 12_900 and round(p.wall_hours) == 45
    assert p.gpu_hour_cost == pytest.approx(27 / 7)
    assert p.cost == pytest.approx(1_215, rel=0.01)
    assert not result.unpriced


def test_scenarios_keep_their_order_after_the_given_throughput():
    result = make_plan(
        PlanInputs(samples=914_000, avg_output_tokens=2_500, tok_per_gpu=400, gpus=4, scenarios=("b200:7:2300:3.857",))
    )
    assert [p.name for p in result.plans] == ["given", "b200"]
    assert result.plans[0].tok_per_s == 1_600 and result.plans[1].tok_per_s == 16_100


def test_the_python_result_is_the_json_of_the_command(cli):
    args = ["--samples", "1000", "--avg-output-tokens", "100", "--tok-per-s", "50", "--scenario", "x:2:30:1.5"]
    r = cli("plan", *args, "--json")
    assert r.exit_code == 0, r.output
    result = make_plan(PlanInputs(samples=1000, avg_output_tokens=100, tok_per_s=50, scenarios=("x:2:30:1.5",)))
    assert json.loads(r.stdout) == json.loads(json.dumps(result.to_dict()))


def test_the_gpu_count_comes_from_a_fleet_file(tmp_path):
    fleet = {"version": 1, "engine": "sglang", "protocol": "sglang", "model": "m",
             "endpoints": [{"url": f"http://127.0.0.1:{30000 + i}", "gpu": str(i)} for i in range(7)]}  # fmt: skip
    (tmp_path / "fleet.json").write_text(json.dumps(fleet))
    (p,) = make_plan(PlanInputs(samples=1000, avg_output_tokens=100, tok_per_gpu=50, fleet=tmp_path / "fleet.json")).plans
    assert p.gpus == 7 and p.tok_per_s == 350


@pytest.mark.parametrize(
    "inputs, message",
    [
        (PlanInputs(avg_output_tokens=100, tok_per_s=10), "how many samples"),
        (PlanInputs(samples=10, findings="scan-dir", tok_per_s=10), "not both"),
        (PlanInputs(samples=10, tok_per_s=10), "mean output tokens"),
        (PlanInputs(samples=10, avg_output_tokens=100), "say the throughput"),
        (PlanInputs(samples=10, avg_output_tokens=100, tok_per_s=10, req_per_s=1), "throughput once"),
        (PlanInputs(samples=10, avg_output_tokens=5, scenarios=("a:1:1", "a:2:2")), "used twice"),
        (PlanInputs(samples=10, avg_output_tokens=5, tok_per_gpu=10, gpus=0), "--gpus 0"),
    ],
)
def test_missing_or_contradictory_inputs_raise_usage_errors(inputs, message):
    with pytest.raises(UsageError, match=message):
        make_plan(inputs)


def test_calibration_inputs_are_checked_before_anything_is_sent():
    """No dataset, or a throughput given as well: refused before the progress hook is entered."""
    entered = []

    def progress(message):
        entered.append(message)
        raise AssertionError("calibration must not start")

    for inputs, message in [
        (PlanInputs(samples=10, calibrate=True, endpoints=("http://127.0.0.1:9",)), "--dataset"),
        (PlanInputs(samples=10, calibrate=True, tok_per_s=5, dataset="d.parquet", endpoints=("http://x",)), "drop --tok-per-s"),
        (PlanInputs(samples=10, calibrate=True, dataset="d.parquet"), "--fleet FILE or --endpoint URL"),
        (PlanInputs(samples=10, calibrate=True, dataset="d.parquet", scenarios=("bad",), endpoints=("http://x",)), "--scenario"),
    ]:
        with pytest.raises(UsageError, match=message):
            make_plan(inputs, progress=progress)
    assert entered == []


def test_the_table_has_one_column_per_scenario_and_per_hour_and_per_day_rates_side_by_side():
    result = make_plan(PlanInputs(samples=914_000, avg_output_tokens=2_500, tok_per_s=1_500, scenarios=("b200:7:2300",)))
    rows = dict(table_rows(result.plans))
    assert rows["tokens per hour"][0] == "5.40M" and rows["tokens per day"][0] == "129.6M"
    labels = [label for label, _ in table_rows(result.plans)]
    assert labels.index("tokens per day") == labels.index("tokens per hour") + 1
    table = plan_table(result.plans)
    assert [c.header for c in table.columns] == ["", "given", "b200"]


def test_print_plan_adds_the_price_hint_only_when_a_scenario_has_no_price():
    console = Console(record=True, width=120, color_system=None)
    print_plan(make_plan(PlanInputs(samples=10, avg_output_tokens=100, tok_per_s=10)), console)
    assert PRICE_HINT in console.export_text()
    priced: PlanResult = make_plan(PlanInputs(samples=10, avg_output_tokens=100, tok_per_s=10, gpu_hour_cost=2))
    print_plan(priced, console)
    assert PRICE_HINT not in console.export_text()
