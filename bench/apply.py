"""Throughput of the apply path against the I/O floor (a plain Delta read + write of the same table).

    .venv/bin/python -m bench.apply [--rows 100000] [--dim 128 | --corpus DIR] [--method abtt|whitening|center]
                                    [--repeats 2] [--tmp DIR]

Same Delta input, same Spark session, run side by side:
  floor      — read the Delta table, write it to a new Delta table unchanged (the I/O floor)
  roundtrip  — the part of ``transform`` that is Spark's, no math: read, ``mapInArrow`` that hands every Arrow
               batch back unchanged, write Delta (the JVM→Python→JVM transfer on top of the floor)
  transform  — read, CorrectionModel.transform (mapInArrow + numpy), add transform_version, write Delta
  job        — the whole apply job (jobs.apply.run_apply: pin version, validate + quarantine count in the
               transform pass, dimension check, one commit), as it runs by default (``vector_reader: auto``: pyarrow
               reads the pinned data files in the Spark tasks, one task per row group; the reader is printed)
  job_spark  — the same job with Spark's scan reading the table (``vector_reader: spark``)
Each runs once as a warm-up, then ``repeats`` rounds run each once (:func:`bench.common.time_in_rounds`); the best
time is reported with its ratio to the floor, and every round's time after it.
Every output is deleted (untimed) before each call, so each one writes a fresh table and the disk holds one
output at a time. ``--corpus``: a Delta table is read as it is, Parquet files are first copied into Delta.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import tempfile
from typing import Iterator

import pyarrow as pa
from pyspark.sql import functions as F

from anisotropy_core.artifact import save_artifact
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import fit
from anisotropy_spark.estimators import CorrectionModel
from anisotropy_spark.python_worker import install_in_python_worker
from anisotropy_spark.session import get_spark
from bench.common import add_corpus_arguments, corpus, parquet_moments, print_ratios, time_in_rounds
from jobs.apply import ApplyConfig, run_apply


def hand_back(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function of the ``roundtrip`` run: every batch back unchanged. Pickled by value when this
    module runs as ``__main__``, so it installs :mod:`anisotropy_spark.python_worker` itself: its workers are then
    in the same state as those of ``transform``, whose functions import the package."""
    install_in_python_worker()
    yield from batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_arguments(parser, rows=100_000, dim=128)
    parser.add_argument("--method", choices=["center", "abtt", "whitening"], default="abtt")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tmp", default=None, help="directory for the generated tables (default: system temp)")
    args = parser.parse_args()
    spark = get_spark("bench-apply", master="local[2]")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = pathlib.Path(tmp)
        found, X = corpus(args, root / "parquet", spark)
        source = str(found.path) if found.is_delta else str(root / "corpus")
        if not found.is_delta:
            found.read(spark).write.format("delta").save(source)  # array<float>
        params = {"D": max(1, args.dim // 100)} if args.method == "abtt" else {}
        transform = fit(
            args.method, Moments.of_batch(X) if X is not None else parquet_moments(found.files, args.dim), **params
        )
        manifest = save_artifact(str(root / "artifact"), transform, n=args.rows)
        model = CorrectionModel(transform, n=args.rows)._set(inputCol="vector", outputCol="vector")
        outputs = [root / name for name in ("floor", "roundtrip", "transformed", "job", "quarantine")]
        readers = {}

        def delete_outputs():
            for output in outputs:
                shutil.rmtree(output, ignore_errors=True)

        def floor():
            spark.read.format("delta").load(source).write.format("delta").mode("overwrite").save(str(root / "floor"))

        def roundtrip():
            table = spark.read.format("delta").load(source)
            (
                table.mapInArrow(hand_back, table.schema)
                .write.format("delta")
                .mode("overwrite")
                .save(str(root / "roundtrip"))
            )

        def transform_only():
            out = model.transform(spark.read.format("delta").load(source))
            (
                out.withColumn("transform_version", F.lit(manifest["transform_version"]))
                .write.format("delta")
                .mode("overwrite")
                .save(str(root / "transformed"))
            )

        def job(reader):
            summary = run_apply(
                spark,
                ApplyConfig(
                    input=source,
                    artifact=str(root / "artifact"),
                    output=str(root / "job"),
                    on_invalid="quarantine",
                    quarantine_path=str(root / "quarantine"),
                    vector_reader=reader,
                    force=True,
                ),
            )
            readers[reader] = summary["reader"]

        runs = {
            "floor": floor,
            "roundtrip": roundtrip,
            "transform": transform_only,
            "job": lambda: job("auto"),
            "job_spark": lambda: job("spark"),
        }
        seconds, _ = time_in_rounds(runs, args.repeats, reset=delete_outputs)
    print(f"table: {args.rows} x {args.dim} float32, method {args.method}, Spark local[2]; best of {args.repeats}")
    print(f"job reader: {readers['auto']}; job_spark reader: {readers['spark']}")
    print_ratios(seconds, args.rows, baseline="floor")
    spark.stop()


if __name__ == "__main__":
    main()
