"""A check is self-contained: it declares its priority and the metrics it needs, by the names of the
one typed metrics schema (``dqa.audit.metrics_schema``) that the kernel, the scan's outputs and the
expectation suites' source read too. These tests fail when a check lacks a priority, shares one,
needs a metric the schema does not have, or reads a column it did not declare.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from dqa.audit import checks, kernels, metrics_schema
from dqa.errors import InputError


def typed_frame(schema: dict[str, metrics_schema.Metric], columns, n: int = 64, seed: int = 0) -> pl.DataFrame:
    """``n`` random rows of ``columns``, each typed as the schema says (small numbers, so thresholds both pass and fail)."""
    rng = np.random.default_rng(seed)
    data = {}
    for name in columns:
        m = schema[name]
        if m.dtype == pl.Boolean:
            data[name] = pl.Series(name, rng.random(n) < 0.5)
        elif m.dtype.is_float():
            data[name] = pl.Series(name, rng.random(n))
        elif m.dtype == pl.String:
            data[name] = pl.Series(name, [None] * n, dtype=pl.String)
        else:
            data[name] = pl.Series(name, rng.integers(0, 100, n)).cast(m.dtype)
    return pl.DataFrame(data)


def test_every_check_has_its_own_priority():
    fields = {f.name: f for f in dataclasses.fields(checks.Check)}
    assert fields["priority"].default is dataclasses.MISSING, "a check without a priority must not construct"
    with pytest.raises(TypeError):
        checks.Check(name="x", label="x", flags_when="x", why="x", needs=(), rule=lambda ctx: pl.lit(True))  # type: ignore[call-arg]
    priorities = [c.priority for c in checks.CHECKS]
    assert all(isinstance(p, int) for p in priorities)
    assert len(set(priorities)) == len(priorities), "two checks share a priority: primary_reason would depend on list order"
    assert sorted(checks.priority_order()) == sorted(checks.CHECK_NAMES)
    assert not hasattr(checks, "PRIORITY"), "one list of checks: priorities live in the checks"


def test_the_root_cause_order_is_the_documented_one():
    assert checks.priority_order() == (
        "length_mismatch", "no_loss", "degenerate_template", "mask_misaligned", "repetition_loop",
        "truncated", "duplicate_response", "empty_thinking", "missing_thinking", "short_response",
    )


@pytest.mark.parametrize("check", checks.CHECKS, ids=lambda c: c.name)
def test_a_check_needs_only_metrics_of_the_schema_and_reads_only_what_it_declares(check):
    assert check.needs, f"{check.name} declares no metrics"
    assert set(check.needs) <= set(metrics_schema.SAMPLE), f"{check.name} needs {set(check.needs) - set(metrics_schema.SAMPLE)}"
    assert (check.turn_rule is None) == (not check.turn_needs), f"{check.name}: a turn rule and its turn metrics go together"
    assert set(check.turn_needs) <= set(metrics_schema.TURN), f"{check.name} needs {set(check.turn_needs) - set(metrics_schema.TURN)}"
    ctx = checks.Context(rows=64, thinking_expected=True, params=checks.default_params())
    # Only the declared columns exist: a rule reading another one raises ColumnNotFoundError.
    out = typed_frame(metrics_schema.SAMPLE, check.needs).select(check.rule(ctx).alias("flag"))
    assert out.schema["flag"] == pl.Boolean and out.height == 64
    if check.turn_rule is not None:
        out = typed_frame(metrics_schema.TURN, check.turn_needs).select(check.turn_rule(ctx).alias("flag"))
        assert out.schema["flag"] == pl.Boolean and out.height == 64


def test_every_flagged_sample_has_a_primary_reason():
    schema = metrics_schema.SAMPLE
    needed = sorted({n for c in checks.CHECKS for n in c.needs})
    ctx = checks.Context(rows=400, thinking_expected=True, params=checks.default_params())
    for seed in range(5):
        frame = typed_frame(schema, needed, n=400, seed=seed).with_row_index("row")
        out = checks.evaluate(frame, ctx)
        assert out.filter(pl.col("failed"))["primary_reason"].null_count() == 0
        assert set(out["primary_reason"].drop_nulls()) <= set(checks.CHECK_NAMES)


def test_the_kernel_computes_the_schema_with_its_types(tmp_path):
    """The kernel's columns are the schema's kernel and convention metrics, in the schema's dtypes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dqa.audit.readers import open_dataset
    from dqa.audit.template import qwen3_preset

    assert kernels.METRIC_COLUMNS == metrics_schema.names(metrics_schema.SAMPLE_METRICS, "kernel")
    assert kernels.TURN_COLUMNS == metrics_schema.names(metrics_schema.TURN_METRICS, "kernel")
    ids = [151644, 77091, 198, 1000, 1001, 151645, 198]
    path = tmp_path / "one.parquet"
    pq.write_table(pa.table({"input_ids": [ids], "loss_mask": [[0, 0, 0, 1, 1, 1, 1]]}), path)
    batch = next(open_dataset(path).batches(16))
    m, t = kernels.batch_metrics_and_turns(batch, kernels.KernelTables.build(qwen3_preset(decode=False)))
    assert set(m) == set(metrics_schema.names(metrics_schema.SAMPLE_METRICS, "kernel", "convention"))
    for name, values in m.items():
        assert values.dtype == metrics_schema.SAMPLE[name].numpy_dtype, name
    assert set(t) == set(kernels.TURN_COLUMNS)
    for name, values in t.items():
        assert values.dtype == metrics_schema.TURN[name].numpy_dtype, name


def test_the_suites_source_reads_the_same_schema(tmp_path):
    """``dqa validate`` refuses a metrics table by the schema: a missing kernel metric, a verdict of the
    wrong type, a null where the schema allows none; a null primary_reason (a passing sample) is fine."""
    from dqa.audit.scan_folder import check_metrics_table

    schema = metrics_schema.metrics_table_schema()
    good = typed_frame(schema, list(schema), n=8).with_row_index("row").with_columns(pl.col("row").cast(pl.Int64))
    check_metrics_table(good, tmp_path / "metrics.parquet")
    for name in metrics_schema.names(metrics_schema.SAMPLE_METRICS, "kernel"):
        with pytest.raises(InputError, match=name):
            check_metrics_table(good.drop(name), tmp_path / "metrics.parquet")
    with pytest.raises(InputError, match="flagged_turns.*integers"):
        check_metrics_table(good.with_columns(pl.col("flagged_turns").cast(pl.Float64)), tmp_path / "metrics.parquet")
    with pytest.raises(InputError, match="repetition_loop.*booleans"):
        check_metrics_table(good.with_columns(pl.col("repetition_loop").cast(pl.Int64)), tmp_path / "metrics.parquet")
    with pytest.raises(InputError, match="template_prompts.*row 3"):
        check_metrics_table(good.with_columns(pl.when(pl.col("row") == 3).then(None).otherwise(pl.col("template_prompts"))
                                              .alias("template_prompts")), tmp_path / "metrics.parquet")
