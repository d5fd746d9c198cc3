"""Apply job: write a corrected copy of an embedding table with a saved transform artifact.

    anisotropy apply --conf conf/apply.yaml [--input PATH] [--input-version V] [--artifact DIR] ...
    python -m jobs.apply --conf conf/apply.yaml ...

Reads ``input`` pinned to one Delta version and, in ONE pass, checks every row against the input contract
while mapping the Arrow batches through the numpy transform (``mapInArrow``), then writes ``output`` as a
Delta table: every input column (id and metadata) with ``output_col`` (default: the vector column itself)
replaced by the corrected vector (element type per ``output_dtype``), plus a ``transform_version`` column.

Who reads the input (``vector_reader``, :mod:`anisotropy_spark.table_files`; the summary's ``reader``): by
default (``auto``) pyarrow reads the pinned version's Parquet data files inside the Spark tasks, one task per row
group, where those files are exactly the version's rows and columns (no deletion vectors or column mapping, no
partition columns, an array vector column, footers adding up to the version's row count); else Spark's scan
does. pyarrow skips the JVM's rebuilding of every input batch from rows, the largest cost of the pass over a
plain Delta copy. A data file pyarrow cannot read as the table's columns fails that write (nothing is committed)
and the job writes again through Spark's scan (``vector_reader: pyarrow`` raises instead). After the write the
rows the pass read (its ``Observation``) are checked against the version's row count too; since the footers were
checked first a mismatch is not expected, and it would be repaired by a second overwrite through Spark's scan.

* Invalid rows, ``on_invalid: error``: the first invalid row met fails the write (so nothing is committed)
  and the job raises :class:`InvalidRowsError` naming its id, the column and the reason.
* Invalid rows, ``on_invalid: quarantine``: the pass tags them, a Spark ``Observation`` counts them during
  the write, and the write keeps only the valid ones; only when the count is non-zero is the input read a
  second time to count the reasons and append those rows to ``quarantine_path`` (after the output commit).
* Input of another dimension: a partition whose first Arrow batch holds vectors but not one of the artifact's
  dimension fails the pass (nothing is committed) and the job raises :class:`ArtifactError` naming both
  dimensions; scattered rows of another length are invalid rows (``wrong_dimension:<length>``) like any other.
* Rows the transform cannot map (an output beyond ``output_dtype``'s range after the cast): the write fails
  (nothing is committed) and the job raises :class:`~anisotropy_spark.contract.TransformRowError` naming the row
  (exit 5), under either ``on_invalid``.
* The norm-outlier rule (``max_norm_ratio``) is not applied here: the artifact records no median length of the
  table it was fitted on (the summary's ``norm_outlier_rule`` says so; the nightly job applies it).
* Duplicate ids: one aggregate over the id column before the pass. Every copy of an id held by more than one
  otherwise-valid row is left out and quarantined (reason ``duplicate_id``), or, with ``on_invalid: error``,
  the job stops before writing, naming sample ids.

* Files: the write is coalesced (no shuffle) to ``ceil(input bytes / target_file_mb)`` data files at most, the
  input bytes being the pinned version's data files (:mod:`anisotropy_spark.output_files`; the summary's
  ``output_files``), instead of one file per input row group.
* Atomic: the write is ONE Delta ``overwrite`` commit; a failure anywhere (e.g. in one partition) leaves
  no commit, so readers keep seeing the previous table version unchanged.
* Idempotent: the commit's ``userMetadata`` records {input path, input version, transform version}; a
  re-run whose latest output commit already records the same triple is skipped (``force: true``
  rewrites). Even a forced or Parquet-input re-run overwrites rather than appends: rows never duplicate.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from anisotropy_core.artifact import Artifact, load_artifact
from anisotropy_core.methods import OutputDtype
from anisotropy_spark.contract import REASON_COLUMN, ForeignDimensionError, Tally, require_schema
from anisotropy_spark.estimators import CorrectionModel
from anisotropy_spark.io import (
    as_vector_array,
    count_invalid,
    is_delta_table,
    latest_delta_version,
    read_table,
    settle_invalid,
    valid_rows,
)
from anisotropy_spark.output_files import file_count, scan_bytes
from anisotropy_spark.quarantine import Duplicates, find_duplicates
from anisotropy_spark.rows import one_row
from anisotropy_spark.session import get_spark
from anisotropy_spark.table_files import pyarrow_or_spark, table_files
from anisotropy_spark.worker_errors import worker_error
from jobs.cli import run
from jobs.columns import VERSION_COLUMN
from jobs.config import InputSettings, OutputFiles, VectorReader, parse_args

JOB_NAME = "anisotropy.apply"
NORM_OUTLIER_NOTE = (
    "not applied: the artifact records no median length of its fitted input "
    "(the nightly job applies the rule; docs/errors.md)"
)


@dataclasses.dataclass(kw_only=True)
class ApplyConfig(InputSettings, OutputFiles):
    """Settings of the apply job (conf/apply.yaml)."""

    artifact: str
    output: str
    input_version: int | None = None
    output_col: str | None = None
    output_dtype: OutputDtype = "same"
    vector_reader: VectorReader = "auto"
    force: bool = False
    master: str | None = None

    def check(self) -> list[str]:
        problems = self.output_problems(self.output) + self.input_problems() + self.output_file_problems()
        if self.output_col == VERSION_COLUMN:
            problems.append(f"output_col may not be {VERSION_COLUMN!r}")
        return problems


def latest_commit(spark: SparkSession, path: str) -> tuple[int, dict] | None:
    """(version, parsed userMetadata or {}) of the latest commit of the Delta table ``path``; None if absent."""
    if not is_delta_table(spark, path):
        return None
    from delta.tables import DeltaTable

    row = one_row(DeltaTable.forPath(spark, path).history(1).select("version", "userMetadata"))
    try:
        metadata = json.loads(row["userMetadata"]) if row["userMetadata"] else {}
    except json.JSONDecodeError:
        metadata = {}
    return int(row["version"]), metadata


def checked_duplicates(df: DataFrame, config: ApplyConfig, dimension: int) -> Duplicates:
    """The duplicated ids among the otherwise-valid rows of ``df``: one aggregate over the ids; only when some id
    repeats, a count of the invalid rows first (a copy with an invalid vector is quarantined for that reason).
    With ``on_invalid: error`` a duplicate stops the job before anything is written."""
    duplicates = find_duplicates(df, config.id_col)
    if not duplicates.tally.total:
        return duplicates
    tally = count_invalid(df, config.vector_col, config.id_col, dimension)
    duplicates = find_duplicates(valid_rows(df, config.vector_col, config.id_col, dimension, tally), config.id_col)
    if config.on_invalid == "error":
        settle_invalid(df, Tally(), config.vector_col, config.id_col, dimension, "error", None, duplicates=duplicates)
    return duplicates


def error_from_worker(exc: Exception, artifact: Artifact) -> Exception | None:
    """The job's own error for the typed error a Python worker raised inside ``exc``
    (:func:`~anisotropy_spark.worker_errors.worker_error`): :class:`ArtifactError` for vectors of another
    dimension, else the worker's error itself (an invalid row, a row the transform cannot map, a data file pyarrow
    cannot read); None for any other error."""
    found = worker_error(exc)
    if isinstance(found, ForeignDimensionError):
        return artifact.dimension_mismatch(found.length)
    return found


def publish(
    corrected: DataFrame, duplicates: Duplicates, config: ApplyConfig, stamp: dict, artifact: Artifact, files: int
) -> dict:
    """Write the valid, non-duplicated rows of ``corrected`` (:meth:`CorrectionModel.transform`'s rows,
    with ``invalid_reason`` under ``on_invalid: quarantine``) to ``config.output`` in ONE overwrite commit
    stamped ``stamp``, coalesced to at most ``files`` data files (no shuffle); returns the pass's counts {``rows``
    read, ``invalid`` rows}. A worker's invalid row or foreign dimension is raised as the job's own error (:func:`error_from_worker`); nothing is committed then."""
    observed = Observation("apply_pass")
    tagged = REASON_COLUMN in corrected.columns
    corrected = duplicates.drop_from(
        corrected.observe(
            observed,
            F.count(F.lit(1)).alias("rows"),
            (F.count_if(F.col(REASON_COLUMN).isNotNull()) if tagged else F.lit(0)).alias("invalid"),
        )
    )
    if tagged:
        corrected = corrected.where(F.col(REASON_COLUMN).isNull()).drop(REASON_COLUMN)
    try:
        (
            corrected.withColumn(VERSION_COLUMN, F.lit(artifact.transform_version))
            .coalesce(files)
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .option("userMetadata", json.dumps(stamp, sort_keys=True))
            .save(config.output)
        )
    except Exception as exc:  # the worker's error arrives wrapped (Py4J / captured Spark error)
        found = error_from_worker(exc, artifact)
        if found is None:
            raise
        raise found from None
    return observed.get


def run_apply(spark: SparkSession, config: ApplyConfig, artifact: Artifact | None = None) -> dict:
    """Run the job; returns a JSON-ready summary with ``status`` ``written`` or ``skipped`` and the ``reader``
    of the pass (``pyarrow`` where it reads the data files, else ``spark (<why>)``: ``vector_reader``).

    ``artifact``: an already-loaded artifact (default: ``load_artifact(config.artifact)``, hash-verified).
    """
    artifact = artifact or load_artifact(config.artifact)
    df, ref = read_table(spark, config.input, config.input_version)
    require_schema(df.columns, config.named_columns())  # before any pass over the table
    stamp = {
        "job": JOB_NAME,
        "input_path": ref.path,
        "input_version": ref.version,
        "transform_version": artifact.transform_version,
    }
    summary = {
        "input": dataclasses.asdict(ref),
        "output": config.output,
        "transform_version": artifact.transform_version,
    }
    previous = latest_commit(spark, config.output)
    if previous and not config.force and ref.version is not None and previous[1] == stamp:
        return {
            **summary,
            "status": "skipped",
            "output_version": previous[0],
            "reason": "the latest output commit already holds this input version and transform version",
        }
    vector_col, id_col = config.vector_col, config.id_col
    files, planned = table_files(spark, df, ref.path, ref.format, vector_col, None, config.vector_reader)
    output_files = file_count(scan_bytes(df), config.target_file_mb)
    df = as_vector_array(df, vector_col)
    quarantine = config.on_invalid == "quarantine"
    model = (
        CorrectionModel.from_artifact(artifact, vector_col, config.output_col or vector_col)
        .setOutputDtype(config.output_dtype)
        .setIdCol(id_col)
        .setHandleInvalid("keep" if quarantine else "error")
    )
    duplicates = checked_duplicates(df, config, artifact.transform.d_in)
    write = functools.partial(
        publish, duplicates=duplicates, config=config, stamp=stamp, artifact=artifact, files=output_files
    )
    if files:  # one pass either way: pyarrow reads the pinned files, or Spark's scan where they cannot serve
        counts, reader = pyarrow_or_spark(
            files,
            df.columns,
            lambda found: write(model.transform_files(spark, found)),
            lambda: write(model.transform(df)),
            lambda counted: counted["rows"],
        )
    else:
        counts, reader = write(model.transform(df)), planned
    version = latest_delta_version(spark, config.output)  # the commit just written
    by_reason = {}
    if quarantine and (counts["invalid"] or duplicates.tally.total):
        tally = count_invalid(df, vector_col, id_col, artifact.transform.d_in)
        settle_invalid(
            df,
            tally,
            vector_col,
            id_col,
            artifact.transform.d_in,
            "quarantine",
            config.quarantine_path,
            duplicates=duplicates,
            input_version=ref.version,
        )
        by_reason = tally.merge(duplicates.tally).counts
    return {
        **summary,
        "status": "written",
        "output_version": version,
        "reader": reader,
        "output_files": output_files,
        "invalid_rows": sum(by_reason.values()),
        "invalid_by_reason": by_reason,
        "norm_outlier_rule": NORM_OUTLIER_NOTE,
    }


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_args(ApplyConfig, argv, "Apply a saved anisotropy correction to an embedding table")
    spark = get_spark("anisotropy-apply", master=config.master)
    print(json.dumps(run_apply(spark, config), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
