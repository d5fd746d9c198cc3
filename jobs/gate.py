"""The nightly publication gate: the would-be output holds exactly the valid input rows (count, unique ids,
same id set), every vector finite with the transform's output dimension, and every ``output_bounds``
metric inside its [low, high]; otherwise :class:`GateError` lists every failed check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from anisotropy_spark.rows import one_row

if TYPE_CHECKING:  # annotations only: every job imports jobs.cli, which imports GateError; the settings stay out
    from jobs.nightly_config import NightlyConfig


class GateError(RuntimeError):
    """The would-be output failed the publication gate; ``problems`` lists every failed check."""

    def __init__(self, problems: list[str]):
        super().__init__("gate rejected the output: " + "; ".join(problems))
        self.problems = problems


def _count_where(condition: Column) -> Column:
    """The number of rows (of the aggregated group) where ``condition`` holds."""
    return F.sum(F.when(condition, 1).otherwise(0))


def gate(
    candidate: DataFrame,
    valid: DataFrame,
    config: NightlyConfig,
    d_out: int,
    out_metrics: dict | None,
    diagnose_error: str | None,
) -> dict:
    """Check the would-be output against the valid input rows; raise :class:`GateError` listing every failure.

    ``candidate``: the full would-be output table; ``valid``: the validated input rows. ONE Spark job reads
    each once (the candidate is not cached: at 10M × 768 a cached copy is as big as the table): the candidate's
    rows become (id, copies, wrong-dimension copies, non-finite copies) per id, the valid rows (id, copies),
    and a full outer join on id of those two small per-id tables gives every count exactly. Returns the counts.
    """
    idc, vec = config.id_col, F.col(config.out_col)
    bad = F.exists(vec, lambda x: x.isNull() | F.isnan(x) | (F.abs(x) == float("inf")))
    output = candidate.groupBy(idc).agg(
        F.count(F.lit(1)).alias("copies"),
        _count_where(vec.isNull() | (F.size(vec) != d_out)).alias("wrong_dim"),
        _count_where(bad).alias("non_finite"),
    )
    valid_ids = valid.groupBy(idc).agg(F.count(F.lit(1)).alias("valid_copies"))
    in_output, in_valid = F.col("copies").isNotNull(), F.col("valid_copies").isNotNull()
    row = one_row(
        output.join(valid_ids, idc, "full_outer").agg(
            F.sum("copies").alias("rows"),
            _count_where(in_output).alias("ids"),
            F.sum("valid_copies").alias("valid_rows"),
            F.sum("wrong_dim").alias("wrong_dim"),
            F.sum("non_finite").alias("non_finite"),
            _count_where(in_valid & ~in_output).alias("missing"),
            F.sum(F.when(~in_valid, F.col("copies")).otherwise(0)).alias("extra"),
        )
    )
    counts = {
        "output_rows": int(row["rows"] or 0),
        "valid_rows": int(row["valid_rows"] or 0),
        "missing_ids": int(row["missing"] or 0),
        "unexpected_ids": int(row["extra"] or 0),
        "wrong_dimension": int(row["wrong_dim"] or 0),
        "non_finite": int(row["non_finite"] or 0),
    }
    return verdict(counts, int(row["ids"]), config, d_out, out_metrics, diagnose_error)


def gate_facts(
    output_rows: int | None,
    valid_rows: int,
    config: NightlyConfig,
    d_out: int,
    out_metrics: dict | None,
    diagnose_error: str | None = None,
) -> dict:
    """The gate of a full rebuild from the facts of its one output pass
    (:func:`anisotropy_spark.output_pass.output_facts`): ``output_rows`` the pass produced from the valid rows,
    ``valid_rows`` the validation pass counted, and the output's metrics; raises :class:`GateError` as
    :func:`gate` does. The pass maps each valid row (neither invalid nor of a duplicated id) to one ``d_out``-wide
    vector, finite after the cast, or raises naming the row, so no row of its output can be of another dimension,
    non-finite or share an id; a count that differs from the validation's is reported as missing or unexpected
    rows. ``output_rows`` None with ``diagnose_error``: the pass failed, which is the one problem reported.
    Returns the counts, keyed as :func:`gate`'s."""
    if output_rows is None:
        raise GateError([f"output diagnosis failed: {diagnose_error}"])
    counts = {
        "output_rows": output_rows,
        "valid_rows": valid_rows,
        "missing_ids": max(0, valid_rows - output_rows),
        "unexpected_ids": max(0, output_rows - valid_rows),
        "wrong_dimension": 0,
        "non_finite": 0,
    }
    return verdict(counts, output_rows, config, d_out, out_metrics, diagnose_error)


def verdict(
    counts: dict,
    distinct_ids: int,
    config: NightlyConfig,
    d_out: int,
    out_metrics: dict | None,
    diagnose_error: str | None,
) -> dict:
    """Every failed check of ``counts`` (:func:`gate`'s keys), the output's ``distinct_ids``, ``diagnose_error``
    and ``config.output_bounds`` on ``out_metrics``, in ONE :class:`GateError`; else ``counts``."""
    expected, missing, extra = counts["valid_rows"], counts["missing_ids"], counts["unexpected_ids"]
    problems = []
    if counts["output_rows"] != expected:
        problems.append(f"output has {counts['output_rows']} rows, the input has {expected} valid rows")
    if distinct_ids != counts["output_rows"]:
        problems.append(f"duplicate ids: {counts['output_rows'] - distinct_ids} rows share an id")
    if missing or extra:
        problems.append(f"id set differs from the input's valid rows: {missing} missing, {extra} unexpected")
    if counts["wrong_dimension"]:
        problems.append(f"{counts['wrong_dimension']} vectors do not have the transform's dimension {d_out}")
    if counts["non_finite"]:
        problems.append(f"{counts['non_finite']} vectors contain NaN/Inf")
    if diagnose_error:
        problems.append(f"output diagnosis failed: {diagnose_error}")
    for key, (low, high) in config.output_bounds.items():
        value = None if out_metrics is None else out_metrics[key]
        if value is not None and (low is not None and value < low or high is not None and value > high):
            problems.append(f"output {key} = {value:.6g} outside the bounds [{low}, {high}]")
    if problems:
        raise GateError(problems)
    return counts
