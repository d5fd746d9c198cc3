"""Reading embedding tables and checking them against the input contract (:mod:`.contract`).

Input contract: a Delta or Parquet table with an id column and a vector column of type
``array<float>``, ``array<double>`` or Spark ML ``VectorUDT``; every other column is metadata.

Validation never drops a row silently and never caches the table: the rows are checked in numpy inside an
Arrow pass (:func:`~anisotropy_spark.contract.check_batch`), which yields a :class:`Tally` of reasons. The
caller then either raises :class:`InvalidRowsError` (naming the reason counts and sample ids) or quarantines
the invalid rows with their reason into a Delta table (a second pass, only when some exist). Later passes
read the valid rows through :func:`valid_rows`, which is the table itself when nothing was invalid.

The norm-outlier rule (:mod:`anisotropy_core.norms`, ``max_norm_ratio``) needs the median length, known only
after the pass: :func:`validate` takes it from the pass's length sketch and, only when the longest valid row is
above ``max_norm_ratio`` × median, counts the invalid rows again with that limit (reason ``norm_outlier``) and
recomputes the moments without them, as it does for duplicated ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, FloatType, StringType, StructField, StructType

from anisotropy_core.moments import Moments
from anisotropy_core.norms import max_norm as norm_limit

from .contract import REASON_COLUMN, InvalidRowsError, SchemaError, Tally, check_batch, require_columns
from .moments import checked_pass, corpus_moments
from .quarantine import Duplicates, find_duplicates, write_quarantine
from .row_sample import RowSample
from .rows import one_row
from .table_files import TableFiles
from .tree_reduce import tree_reduce

INFER_ROWS = 10_000


@dataclass(frozen=True)
class TableRef:
    """A table read at a pinned version: ``path``, ``format`` (delta|parquet), Delta ``version`` or None."""

    path: str
    format: str
    version: int | None


def is_delta_table(spark: SparkSession, path: str) -> bool:
    """True when ``path`` (local or any URI Hadoop resolves: ``file://``, ``s3a://``, ``gs://``, ``hdfs://``)
    is the root of a Delta table, asked of Delta itself. ``DeltaTable.isDeltaTable`` answers from the session's
    cached snapshot of the path, which still says "no table" after another process created it (e.g. the winner of
    a concurrent first publish); a "no" is therefore checked again with ``DeltaTable.forPath``, which reads the
    log afresh (and raises when there is no table)."""
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, path):
        return True
    try:
        DeltaTable.forPath(spark, path)
    except AnalysisException:
        return False
    return True


def read_table(spark: SparkSession, path: str, version: int | None = None) -> tuple[DataFrame, TableRef]:
    """Read a Delta (pinned to ``version``, default the latest at call time) or Parquet table."""
    if is_delta_table(spark, path):
        pinned = version if version is not None else latest_delta_version(spark, path)
        df = spark.read.format("delta").option("versionAsOf", pinned).load(path)
        return df, TableRef(path, "delta", pinned)
    if version is not None:
        raise ValueError(f"{path} is not a Delta table: a version cannot be pinned")
    return spark.read.parquet(path), TableRef(path, "parquet", None)


def latest_delta_version(spark: SparkSession, path: str) -> int:
    from delta.tables import DeltaTable

    return int(one_row(DeltaTable.forPath(spark, path).history(1).select("version"))[0])


def as_vector_array(df: DataFrame, vector_col: str) -> DataFrame:
    """Return ``df`` with ``vector_col`` as an array column: ``array<float>``/``array<double>`` unchanged (float32
    stays float32 all the way into the Arrow batches), ``VectorUDT`` → ``array<double>``; else ValueError."""
    require_column(df, vector_col, "vector")
    dtype = df.schema[vector_col].dataType
    if isinstance(dtype, VectorUDT):
        return df.withColumn(vector_col, vector_to_array(F.col(vector_col), "float64"))
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, (FloatType, DoubleType)):
        return df
    raise SchemaError(
        f"vector column {vector_col!r} has type {dtype.simpleString()}; expected array<float>, "
        "array<double> or VectorUDT"
    )


def infer_dimension(df: DataFrame, vector_col: str, rows: int = INFER_ROWS) -> int:
    """Most common length among the first ``rows`` non-null vectors, the larger on a tie (the corpus dimension when
    none is configured); reads only that many rows, not the table, and counts their lengths on the driver (an
    aggregate in Spark would add a shuffle stage)."""
    lengths = df.where(F.col(vector_col).isNotNull()).select(F.size(vector_col).alias("d")).limit(rows).toArrow()
    if not lengths.num_rows:
        raise InvalidRowsError(f"no non-null vectors in column {vector_col!r}: the table is empty")
    values, counts = np.unique(lengths.column("d").to_numpy(), return_counts=True)
    return int(values[counts == counts.max()].max())


def count_invalid(df: DataFrame, vector_col: str, id_col: str, dimension: int, max_norm: float | None = None) -> Tally:
    """One Arrow pass over ``id_col`` and ``vector_col`` only → the merged :class:`Tally` of invalid rows (rows
    longer than ``max_norm`` too, when given)."""

    def tally(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state = Tally()
        for batch in batches:
            state.add(check_batch(batch, vector_col, id_col, dimension, max_norm), batch.column(0))
        yield pa.RecordBatch.from_pydict({"tally": [state.to_json()]})

    return tree_reduce(
        df.select(id_col, vector_col)
        .mapInArrow(tally, "tally string")
        .rdd.map(lambda row: Tally.from_json(row["tally"])),
        Tally.merge,
    )


def _filtered(
    df: DataFrame, vector_col: str, id_col: str, dimension: int, keep_valid: bool, max_norm: float | None = None
) -> DataFrame:
    """``df`` restricted to its valid rows (``keep_valid``) or to its invalid rows plus ``invalid_reason``; rows
    longer than ``max_norm`` (when given) are invalid."""
    fields = list(df.schema.fields) + ([] if keep_valid else [StructField(REASON_COLUMN, StringType(), False)])

    def split(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            checked = check_batch(batch, vector_col, id_col, dimension, max_norm)
            if checked.reasons is None:
                if keep_valid:
                    yield batch
                continue
            mask = checked.valid if keep_valid else ~checked.valid
            kept = batch.filter(pa.array(mask))
            if not keep_valid:
                kept = kept.append_column(REASON_COLUMN, pa.array(checked.reasons[mask], pa.string()))
            yield kept

    return df.mapInArrow(split, StructType(fields))


def valid_rows(
    df: DataFrame, vector_col: str, id_col: str, dimension: int, tally: Tally, max_norm: float | None = None
) -> DataFrame:
    """The valid rows of ``df`` for a later pass: ``df`` itself when ``tally`` (of the same pinned input, counted
    with the same ``max_norm``) found no invalid row, else a filtering Arrow pass."""
    return df if tally.total == 0 else _filtered(df, vector_col, id_col, dimension, True, max_norm)


def settle_invalid(
    df: DataFrame,
    tally: Tally,
    vector_col: str,
    id_col: str,
    dimension: int,
    on_invalid: str,
    quarantine_path: str | None,
    *,
    duplicates: Duplicates | None = None,
    run_id: str | None = None,
    input_version: int | None = None,
    max_norm: float | None = None,
) -> None:
    """Act on the invalid rows ``tally`` counted in ``df`` (with ``max_norm``) and the ``duplicates`` among its
    valid rows: raise
    :class:`InvalidRowsError` with reason counts and sample ids (``'error'``), or add them with
    ``invalid_reason`` to the quarantine table ``quarantine_path`` (``'quarantine'``; see
    :func:`anisotropy_spark.quarantine.write_quarantine`; one extra pass, only when some exist)."""
    found = tally if duplicates is None else tally.merge(duplicates.tally)
    if not found.total:
        return
    if on_invalid == "error":
        raise InvalidRowsError(
            f"{found.total} invalid row(s) in column {vector_col!r} (expected dimension {dimension}) or sharing an "
            f"{id_col!r} value: {dict(sorted(found.counts.items()))}; sample {id_col} values: "
            f"{found.sample_ids()}. Fix the input or set on_invalid: quarantine."
        )
    if not quarantine_path:
        raise ValueError("on_invalid: quarantine needs a quarantine_path")
    parts = [_filtered(df, vector_col, id_col, dimension, False, max_norm)] if tally.total else []
    if duplicates is not None and duplicates.tally.total:
        parts.append(duplicates.rows_of(valid_rows(df, vector_col, id_col, dimension, tally, max_norm)))
    rows = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    write_quarantine(rows, quarantine_path, run_id, input_version)


@dataclass
class ValidatedInput:
    """Result of :func:`validate`: the valid rows, the dimension, and what was set aside."""

    valid: DataFrame
    dimension: int
    invalid_count: int
    invalid_by_reason: dict[str, int]
    moments: Moments | None = None  # the valid rows' merged moments (``with_moments``), else None
    drawn: pa.Table | None = None  # valid rows drawn in the moments pass for ``sample`` (see :func:`validate`)
    lowest: pa.Table | None = None  # ``sample.lowest`` valid rows of smallest id hash, drawn in that pass (or None)
    reader: str | None = None  # what read the moments pass (``with_moments``): "pyarrow" or "spark (…)"
    median_length: float | None = None  # the valid rows' median length, from the pass's sketch (None: no sketch)
    max_norm: float | None = None  # the norm-outlier limit (None: the rule off); rows above it are invalid
    duplicates: Duplicates | None = None  # the ids held by more than one otherwise-valid row (every copy left out)


def require_column(df: DataFrame, column: str, role: str) -> None:
    """:class:`SchemaError` naming ``column`` (the ``role`` column, e.g. "id") when ``df`` does not have it."""
    require_columns(df.columns, [column], role)


def validate(
    df: DataFrame,
    vector_col: str,
    id_col: str,
    dimension: int | None = None,
    on_invalid: str = "error",
    quarantine_path: str | None = None,
    *,
    run_id: str | None = None,
    input_version: int | None = None,
    with_moments: bool = False,
    sample: RowSample | None = None,
    files: TableFiles | None = None,
    max_norm_ratio: float | None = None,
) -> ValidatedInput:
    """Count the invalid rows of ``df`` (one pass over id + vector, nothing cached) and the duplicated ids among
    the others (one aggregate over the ids), act on them (:func:`settle_invalid`) and return the valid rows:
    neither invalid nor sharing an id.

    ``with_moments``: the counting pass is the moments pass (:func:`~anisotropy_spark.moments.checked_pass`),
    so a job that needs the valid rows' moments (diagnose, nightly, a moment-based fit) reads the vectors once;
    the result's ``moments`` holds them, recomputed in one more pass only when duplicated ids or norm outliers were
    set aside. ``sample`` (with ``with_moments``): that pass also draws a random sample of the valid rows
    (:mod:`.row_sample`), the result's ``drawn`` (and, with ``sample.lowest``, its ``lowest`` rows of smallest id
    hash); None when rows were set aside after it (the rows drawn may hold them). ``files`` (with ``with_moments``): ``df``'s data files, which pyarrow then reads for that pass where it
    can (:func:`~anisotropy_spark.moments.checked_moments`); the result's ``reader`` says which reader ran.

    ``max_norm_ratio`` (None or 0: off): rows longer than it × the median length of the valid rows are invalid,
    reason ``norm_outlier`` (:mod:`anisotropy_core.norms`). The median needs the moments pass, so the rule makes
    the counting pass the moments pass; when the longest valid row is within the limit nothing more is read, else
    the invalid rows are counted again with the limit and the moments recomputed without them.
    """
    if on_invalid not in ("error", "quarantine"):
        raise ValueError(f"on_invalid must be 'error' or 'quarantine', got {on_invalid!r}")
    require_column(df, id_col, "id")
    d = dimension if dimension is not None else infer_dimension(df, vector_col)
    state, drawn, reader, median, threshold, limit = None, None, None, None, None, None
    lowest = None
    if with_moments or max_norm_ratio:
        scanned = checked_pass(df, vector_col, id_col, d, sample, files)
        tally, median = scanned.tally, scanned.lengths.median()
        if with_moments:
            state, drawn, reader, lowest = scanned.moments, scanned.drawn, scanned.reader, scanned.lowest
        threshold = norm_limit(median, max_norm_ratio)
        if threshold is not None and scanned.lengths.maximum > threshold:  # else nothing more to read
            limit = threshold
            tally = count_invalid(df, vector_col, id_col, d, limit)
    else:
        tally = count_invalid(df, vector_col, id_col, d)
    valid = valid_rows(df, vector_col, id_col, d, tally, limit)
    duplicates = find_duplicates(valid, id_col)
    settle_invalid(
        df,
        tally,
        vector_col,
        id_col,
        d,
        on_invalid,
        quarantine_path,
        duplicates=duplicates,
        run_id=run_id,
        input_version=input_version,
        max_norm=limit,
    )
    valid = duplicates.drop_from(valid)
    found = tally.merge(duplicates.tally)
    set_aside = [
        why
        for why, count in (("the duplicated ids", duplicates.tally.total), ("the norm outliers", limit is not None))
        if count
    ]
    if state is not None and set_aside:
        state, drawn, lowest = corpus_moments(valid, vector_col, d), None, None
        reader = f"{reader}; the moments again through Spark, without {' and '.join(set_aside)}"
    if valid.isEmpty() if state is None else state.n == 0:
        raise InvalidRowsError(f"no valid rows left in column {vector_col!r} after validation ({found.counts})")
    return ValidatedInput(
        valid=valid,
        dimension=d,
        invalid_count=found.total,
        invalid_by_reason=found.counts,
        moments=state,
        drawn=drawn,
        lowest=lowest,
        reader=reader,
        median_length=median,
        max_norm=threshold,
        duplicates=duplicates,
    )
