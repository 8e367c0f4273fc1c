"""Benchmark: `dqa validate`'s GX run over a 1M-row metrics table, against a polars floor.

    python bench/bench_validate.py [--rows 1000000] [--naive-rows 100000] [--repeat 3]

One run prints, side by side:
- Great Expectations' import time (paid once per process, shown apart);
- dqa's validation (the bundled release suite through GX's ephemeral context, pandas
  datasource, rows as an unnamed index, COMPLETE result with every failing row), with and
  without building Data Docs;
- the floor: one polars pass doing the same checks (row count, pair equality, bounds with
  ``mostly``, unique share, set membership, mean, quantiles) and collecting every failing row;
- GX with ``unexpected_index_column_names`` (the documented way to get ids in results) on
  ``--naive-rows`` rows, to show why dqa does not use it.

Two tables: a release with a few % defects, and the seed incident (87% 'OK.' answers).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

CHECKS = ("no_loss", "length_mismatch", "degenerate_template", "duplicate_response", "short_response",
          "empty_thinking", "missing_thinking", "truncated", "repetition_loop", "mask_misaligned")


def metrics_table(n: int, incident: bool, seed: int = 0) -> pl.DataFrame:
    """A metrics table with FORMATS.md's columns: a release with ~3% defects, or the 87% 'OK.' incident."""
    rng = np.random.default_rng(seed)
    sup = rng.integers(200, 4000, n)
    bad = rng.random(n) < (0.87 if incident else 0.03)
    sup = np.where(bad, 7, sup)
    think = np.where(bad, 0, sup // 2)
    hashes = rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64)
    hashes = np.where(bad, np.uint64(12345), hashes)
    mism = rng.random(n) < 0.001
    cols = {
        "row": np.arange(n, dtype=np.int64), "id": [f"ex-{i:07d}" for i in range(n)],
        "n_tokens": sup + 120, "n_mask": np.where(mism, sup + 119, sup + 120), "supervised_tokens": sup,
        "content_tokens": np.maximum(sup - 6, 0), "prompt_tokens": np.full(n, 120), "thinking_tokens": think,
        "answer_tokens": sup - think, "has_assistant": np.ones(n, bool), "think_present": np.ones(n, bool),
        "think_closed": np.ones(n, bool), "final_turn_closed": np.ones(n, bool), "last_supervised_eot": np.ones(n, bool),
        "misaligned_tokens": (rng.random(n) < 0.001).astype(np.int64) * 5, "ngram_repeat_share": rng.random(n) * 0.1,
        "supervised_hash": hashes, "prompt_hash": rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64),
        "template_rows": np.where(bad, int(bad.sum()), 1), "template_prompts": np.where(bad, int(bad.sum()), 1),
    }
    for c in CHECKS:
        cols[c] = np.zeros(n, bool)
    cols["degenerate_template"] = bad
    cols["empty_thinking"] = bad
    cols["truncated"] = rng.random(n) < 0.01
    cols["failed"] = bad | cols["truncated"]
    return pl.DataFrame(cols)


def polars_floor(m: pl.DataFrame) -> dict:
    """The release suite's checks as one polars pass, with every failing row of the row-level ones."""
    row_rules = {
        "pair": pl.col("n_mask") != pl.col("n_tokens"),
        "misaligned": pl.col("misaligned_tokens") > 0,
        "bounds": ~pl.col("supervised_tokens").is_between(16, 32768),
        "degenerate": pl.col("degenerate_template"),
        "thinking": pl.col("thinking_tokens") < 1,
        "truncated": pl.col("truncated"),
        "loop": pl.col("repetition_loop"),
        "dup": pl.col("duplicate_response"),
    }
    aggregates = m.select(
        pl.len().alias("rows"),
        (pl.col("supervised_hash").n_unique() / pl.len()).alias("unique_share"),
        pl.col("supervised_tokens").mean().alias("mean"),
        *[pl.col("supervised_tokens").quantile(q, "nearest").alias(f"q{q}") for q in (0.1, 0.5, 0.9)],
        *[expr.sum().alias(name) for name, expr in row_rules.items()],
    ).row(0, named=True)
    failing = {name: m.filter(expr)["row"].to_numpy() for name, expr in row_rules.items()}
    return {"aggregates": aggregates, "failing": failing}


def gx_naive(m: pl.DataFrame) -> float:
    """GX with unexpected_index_column_names=['row'] (a named id column) on the same suite; returns seconds."""
    from dqa.expectations.suites import load_suite, to_gx_suite
    from dqa.expectations.validate import import_gx

    gx, _ = import_gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    suite = load_suite("release")
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    pdf = m.select(["row", *suite.columns]).to_pandas()
    t0 = time.perf_counter()
    batch = ctx.data_sources.add_pandas("n").add_dataframe_asset("m").add_batch_definition_whole_dataframe("b").get_batch(
        batch_parameters={"dataframe": pdf})
    batch.validate(to_gx_suite(suite), result_format={"result_format": "SUMMARY", "unexpected_index_column_names": ["row"]})
    return time.perf_counter() - t0


def best(fn, repeat: int) -> tuple[float, object]:
    best_s, best_out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        took = time.perf_counter() - t0
        if took < best_s:
            best_s, best_out = took, out
    return best_s, best_out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--naive-rows", type=int, default=100_000, help="rows for the named-index GX comparison (0: skip)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from dqa.expectations.validate import import_gx, run_validation

    _, import_s = import_gx()
    print(f"great_expectations import: {import_s:.2f} s (once per process; dqa imports it lazily, only in validate/gate)")
    from dqa.expectations.suites import load_suite

    suite = load_suite("release")
    for label, incident in (("release, ~3% defects", False), ("incident, 87% 'OK.'", True)):
        m = metrics_table(args.rows, incident)
        gx_s, v = best(lambda: run_validation(m, suite), args.repeat)
        with tempfile.TemporaryDirectory() as d:
            docs_s, _ = best(lambda: run_validation(m, suite, docs_dir=Path(d) / "docs"), 1)
        floor_s, floor = best(lambda: polars_floor(m), args.repeat)
        failing_gx = {o.expectation.title: len(o.failing_rows) for o in v.outcomes}
        same = (failing_gx["expect_column_values_to_be_between(supervised_tokens)"] == len(floor["failing"]["bounds"])
                and failing_gx["expect_column_pair_values_to_be_equal(n_mask, n_tokens)"] == len(floor["failing"]["pair"]))
        print(f"\n{label}: {args.rows:,} rows, verdict {'pass' if v.success else 'fail'}, "
              f"{sum(failing_gx.values()):,} failing (expectation, row) pairs; GX and floor agree: {same}")
        print(f"  dqa validate (GX, no docs)   {gx_s:7.3f} s   (GX validate {v.timings['validate_s']:.3f} s, prepare {v.timings['prepare_s']:.3f} s)")
        print(f"  dqa validate (GX + docs)     {docs_s:7.3f} s")
        print(f"  polars floor                 {floor_s:7.3f} s")
        print(f"  ratio GX / floor             {gx_s / floor_s:7.1f} x")
        if args.naive_rows:
            small = m.head(args.naive_rows)
            naive_s = gx_naive(small)
            fast_s, _ = best(lambda: run_validation(small, suite), 1)
            print(f"  on {args.naive_rows:,} rows: GX with unexpected_index_column_names {naive_s:.3f} s vs dqa's unnamed index "
                  f"{fast_s:.3f} s ({naive_s / fast_s:.1f} x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
