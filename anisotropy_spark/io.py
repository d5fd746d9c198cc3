"""Reading embedding tables and checking them against the input contract.

Input contract: a Delta or Parquet table with an id column and a vector column of type
``array<float>``, ``array<double>`` or Spark ML ``VectorUDT``; every other column is metadata.

Validation never drops a row silently. Each row gets an ``invalid_reason`` (null when valid):
``null_vector``, ``wrong_dimension``, ``non_finite`` or ``zero_norm``; ``null_id`` when the id is null.
The caller either raises :class:`InvalidRowsError` (naming the reason counts and sample ids) or
quarantines the invalid rows with their reason into a table and reports the count.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, FloatType

REASON_COLUMN = "invalid_reason"
SAMPLE_IDS = 5


class InvalidRowsError(ValueError):
    """Input rows violate the contract and the job was configured with ``on_invalid: error``."""


@dataclass(frozen=True)
class TableRef:
    """A table read at a pinned version: ``path``, ``format`` (delta|parquet), Delta ``version`` or None."""

    path: str
    format: str
    version: int | None


def is_delta_table(path: str) -> bool:
    return os.path.isdir(os.path.join(path, "_delta_log")) or "://" in path and path.rstrip("/").endswith(".delta")


def read_table(spark: SparkSession, path: str, version: int | None = None) -> tuple[DataFrame, TableRef]:
    """Read a Delta (pinned to ``version``, default the latest at call time) or Parquet table."""
    if is_delta_table(path):
        pinned = version if version is not None else latest_delta_version(spark, path)
        df = spark.read.format("delta").option("versionAsOf", pinned).load(path)
        return df, TableRef(path, "delta", pinned)
    if version is not None:
        raise ValueError(f"{path} is not a Delta table: a version cannot be pinned")
    return spark.read.parquet(path), TableRef(path, "parquet", None)


def latest_delta_version(spark: SparkSession, path: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).select("version").first()[0])


def as_array_column(df: DataFrame, vector_col: str) -> DataFrame:
    """Return ``df`` with ``vector_col`` as an array column: ``array<float>`` and ``array<double>`` unchanged
    (no JVM-side copy), VectorUDT as ``array<double>``; any other type raises ValueError naming it."""
    if vector_col not in df.columns:
        raise ValueError(f"vector column {vector_col!r} not found; columns are {df.columns}")
    dtype = df.schema[vector_col].dataType
    if isinstance(dtype, VectorUDT):
        return df.withColumn(vector_col, vector_to_array(F.col(vector_col), "float64"))
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, (FloatType, DoubleType)):
        return df
    raise ValueError(
        f"vector column {vector_col!r} has type {dtype.simpleString()}; expected array<float>, "
        "array<double> or VectorUDT"
    )


def as_double_array(df: DataFrame, vector_col: str) -> DataFrame:
    """Return ``df`` with ``vector_col`` as ``array<double>``; accepts array<float|double> or VectorUDT."""
    return as_array_column(df, vector_col).withColumn(vector_col, F.col(vector_col).cast(ArrayType(DoubleType())))


def infer_dimension(df: DataFrame, vector_col: str) -> int:
    """Most common length of the non-null vectors (the corpus dimension when none is configured)."""
    row = (df.where(F.col(vector_col).isNotNull())
           .groupBy(F.size(vector_col).alias("d")).count()
           .orderBy(F.desc("count"), F.desc("d")).first())
    if row is None:
        raise InvalidRowsError(f"no non-null vectors in column {vector_col!r}: the table is empty")
    return int(row["d"])


def invalid_reason(vector_col: str, id_col: str, dimension: int) -> Column:
    """Spark expression naming why a row is invalid, or null when it is valid."""
    vec = F.col(vector_col)
    non_finite = F.exists(vec, lambda x: F.isnan(x) | (F.abs(x) == float("inf")) | x.isNull())
    squared_norm = F.aggregate(vec, F.lit(0.0), lambda acc, x: acc + x * x)
    return (F.when(F.col(id_col).isNull(), F.lit("null_id"))
            .when(vec.isNull(), F.lit("null_vector"))
            .when(F.size(vec) != dimension, F.concat(F.lit("wrong_dimension:"), F.size(vec).cast("string")))
            .when(non_finite, F.lit("non_finite"))
            .when(squared_norm == 0.0, F.lit("zero_norm")))


@dataclass
class ValidatedInput:
    """Result of :func:`validate`: the valid rows, the dimension, and what was set aside."""

    valid: DataFrame
    dimension: int
    invalid_count: int
    invalid_by_reason: dict[str, int]
    tagged: DataFrame  # the cached input with its reason column; :meth:`release` frees it

    def release(self) -> None:
        """Drop the cached validation pass once the caller is done with ``valid``."""
        self.tagged.unpersist()


def validate(df: DataFrame, vector_col: str, id_col: str, dimension: int | None = None,
             on_invalid: str = "error", quarantine_path: str | None = None) -> ValidatedInput:
    """Split ``df`` (vector column already ``array<double>``) into valid rows and invalid ones.

    ``on_invalid='error'`` raises :class:`InvalidRowsError` with reason counts and up to five sample ids;
    ``'quarantine'`` appends the invalid rows plus ``invalid_reason`` to the Delta table ``quarantine_path``.
    """
    if on_invalid not in ("error", "quarantine"):
        raise ValueError(f"on_invalid must be 'error' or 'quarantine', got {on_invalid!r}")
    if id_col not in df.columns:
        raise ValueError(f"id column {id_col!r} not found; columns are {df.columns}")
    d = dimension if dimension is not None else infer_dimension(df, vector_col)
    tagged = df.withColumn(REASON_COLUMN, invalid_reason(vector_col, id_col, d)).cache()
    counts = {r[REASON_COLUMN]: int(r["count"])
              for r in tagged.where(F.col(REASON_COLUMN).isNotNull()).groupBy(REASON_COLUMN).count().collect()}
    invalid = sum(counts.values())
    if invalid:
        if on_invalid == "error":
            samples = [r[id_col] for r in tagged.where(F.col(REASON_COLUMN).isNotNull())
                       .select(id_col).limit(SAMPLE_IDS).collect()]
            raise InvalidRowsError(
                f"{invalid} invalid row(s) in column {vector_col!r} (expected dimension {d}): "
                f"{dict(sorted(counts.items()))}; sample {id_col} values: {samples}. "
                "Fix the input or set on_invalid: quarantine."
            )
        if not quarantine_path:
            raise ValueError("on_invalid: quarantine needs a quarantine_path")
        (tagged.where(F.col(REASON_COLUMN).isNotNull())
         .withColumn("quarantined_at", F.current_timestamp())
         .write.format("delta").mode("append").option("mergeSchema", "true").save(quarantine_path))
    valid = tagged.where(F.col(REASON_COLUMN).isNull()).drop(REASON_COLUMN)
    if valid.isEmpty():
        raise InvalidRowsError(f"no valid rows left in column {vector_col!r} after validation ({counts})")
    return ValidatedInput(valid=valid, dimension=d, invalid_count=invalid, invalid_by_reason=counts, tagged=tagged)
