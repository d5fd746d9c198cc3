"""Apply job: write a corrected copy of an embedding table with a saved transform artifact.

    anisotropy apply --conf conf/apply.yaml [--input PATH] [--input-version V] [--artifact DIR] ...
    python -m jobs.apply --conf conf/apply.yaml ...

Reads ``input`` pinned to one Delta version, validates it (the io contract; the table's dimension must be
the artifact's), maps Arrow batches through the numpy transform (``mapInArrow``), and writes ``output``
as a Delta table: every input column (id and metadata) with ``output_col`` (default: the vector column
itself) replaced by the corrected vector, plus a ``transform_version`` column.

* Atomic: the write is ONE Delta ``overwrite`` commit; a failure anywhere (e.g. in one partition) leaves
  no commit, so readers keep seeing the previous table version unchanged.
* Idempotent: the commit's ``userMetadata`` records {input path, input version, transform version}; a
  re-run whose latest output commit already records the same triple is skipped (``force: true``
  rewrites). Even a forced or Parquet-input re-run overwrites rather than appends: rows never duplicate.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from anisotropy_core.artifact import Artifact, load_artifact
from anisotropy_spark.estimators import CorrectionModel
from anisotropy_spark.io import as_double_array, is_delta_table, read_table, validate
from anisotropy_spark.session import get_spark
from jobs.config import InputSettings, parse_args

VERSION_COLUMN = "transform_version"
JOB_NAME = "anisotropy.apply"


@dataclasses.dataclass(kw_only=True)
class ApplyConfig(InputSettings):
    """Settings of the apply job (conf/apply.yaml)."""

    artifact: str
    output: str
    input_version: int | None = None
    output_col: str | None = None
    force: bool = False
    master: str | None = None

    def check(self) -> list[str]:
        problems = self.output_problems(self.output) + self.input_problems()
        if self.output_col == VERSION_COLUMN:
            problems.append(f"output_col may not be {VERSION_COLUMN!r}")
        return problems


def latest_commit(spark: SparkSession, path: str) -> tuple[int, dict] | None:
    """(version, parsed userMetadata or {}) of the latest commit of the Delta table ``path``; None if absent."""
    if not is_delta_table(spark, path):
        return None
    from delta.tables import DeltaTable

    row = DeltaTable.forPath(spark, path).history(1).select("version", "userMetadata").first()
    try:
        metadata = json.loads(row["userMetadata"]) if row["userMetadata"] else {}
    except json.JSONDecodeError:
        metadata = {}
    return int(row["version"]), metadata


def run_apply(spark: SparkSession, config: ApplyConfig, artifact: Artifact | None = None) -> dict:
    """Run the job; returns a JSON-ready summary with ``status`` ``written`` or ``skipped``.

    ``artifact``: an already-loaded artifact (default: ``load_artifact(config.artifact)``, hash-verified).
    """
    artifact = artifact or load_artifact(config.artifact)
    df, ref = read_table(spark, config.input, config.input_version)
    stamp = {"job": JOB_NAME, "input_path": ref.path, "input_version": ref.version,
             "transform_version": artifact.transform_version}
    summary = {"input": dataclasses.asdict(ref), "output": config.output,
               "transform_version": artifact.transform_version}
    previous = latest_commit(spark, config.output)
    if previous and not config.force and ref.version is not None and previous[1] == stamp:
        return {**summary, "status": "skipped", "output_version": previous[0],
                "reason": "the latest output commit already holds this input version and transform version"}
    vector_col = config.vector_col
    checked = validate(as_double_array(df, vector_col), vector_col, config.id_col, config.dimension,
                       config.on_invalid, config.quarantine_path)
    try:
        artifact.check_dimension(checked.dimension)
        model = CorrectionModel.from_artifact(artifact, vector_col, config.output_col or vector_col)
        corrected = model.transform(checked.valid).withColumn(VERSION_COLUMN, F.lit(artifact.transform_version))
        (corrected.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
         .option("userMetadata", json.dumps(stamp, sort_keys=True)).save(config.output))
    finally:
        checked.release()
    version, _ = latest_commit(spark, config.output)
    return {**summary, "status": "written", "output_version": version,
            "invalid_rows": checked.invalid_count, "invalid_by_reason": checked.invalid_by_reason}


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_args(ApplyConfig, argv, "Apply a saved anisotropy correction to an embedding table")
    spark = get_spark("anisotropy-apply", master=config.master)
    print(json.dumps(run_apply(spark, config), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
