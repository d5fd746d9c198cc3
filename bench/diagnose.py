"""Throughput of the diagnosis pass against the single-process I/O floor, Spark MLlib's PCA and numpy.

    .venv/bin/python -m bench.diagnose [--rows 200000] [--dim 256 | --corpus DIR] [--repeats 2] [--tmp DIR]

All compute the full centred covariance + eigendecomposition of the same float32 Parquet corpus:
  floor   — one process, one thread per core of the Spark session (its default parallelism): pyarrow reads the
            Parquet row groups' batches as float32 numpy, each thread folds its row groups' batches into Moments in
            float64 with single-threaded BLAS, merged (Chan), then diagnose (the same accumulation as ours, no
            Spark): the faster single-process form on large corpora
  loop    — the same in one loop over the batches, numpy's BLAS with its own threads (the floor of the earlier
            bench rows; faster than ``floor`` on small corpora, where starting threads costs more)
  scan    — the part of ``spark`` that is Spark's, no math: Parquet → Arrow batches (float32) into the Python
            workers, which only count rows (the JVM decode + JVM→Python transfer and the tasks' start-up that
            ``spark`` pays on top of the floor's work)
  ours    — the moments pass as ``jobs.diagnose`` runs it by default (``vector_reader: auto``): the pinned table's row
            count and data files (:func:`anisotropy_spark.table_files.table_files`), a Spark job listing their
            row groups, then one Spark task per row group in which pyarrow reads its batches (float32) → contract
            check + numpy Moments → treeReduce → eigh
  spark   — the same pass with Spark's scan reading the table (``vector_reader: spark``; ``ours`` in the bench rows
            before the pyarrow reader): Parquet → Arrow batches via ``mapInArrow`` → the same fold
  job     — the whole ``jobs.diagnose`` run without clusters or metadata (read, moments, sample, report files)
  job_spark — the same with ``vector_reader: spark``
  mllib   — Parquet → VectorUDT → pyspark.ml.feature.PCA(k=10).fit (RowMatrix covariance on the JVM)
  numpy   — the corpus already in this process's memory → Moments.of_batch → diagnose (not with --corpus)
Each runs once as a warm-up, then ``repeats`` rounds run each once (:func:`bench.common.time_in_rounds`); the best
time is reported with its ratio to the faster of ``floor`` and ``loop`` (the anchor), and every round's time after it;
a last line gives the ratios to the other one.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import tempfile
from typing import Iterator

import pyarrow as pa
from pyspark.ml.feature import PCA
from pyspark.ml.functions import array_to_vector
from pyspark.sql import functions as F

from anisotropy_core import diagnose
from anisotropy_spark.diagnostics import diagnose_dataframe
from anisotropy_spark.io import read_table
from anisotropy_spark.moments import checked_moments
from anisotropy_spark.python_worker import install_in_python_worker
from anisotropy_spark.session import get_spark
from anisotropy_spark.table_files import table_files
from bench.common import add_corpus_arguments, corpus, parquet_moments, print_ratios, time_in_rounds
from jobs.diagnose import DiagnoseConfig, run_diagnosis, write_outputs


def parquet_floor(files: list[pathlib.Path], dim: int, threads: int) -> dict:
    """Single-process pyarrow + numpy moments over the Parquet ``files`` (float32 read, float64 accumulation) in
    ``threads`` threads (:func:`bench.common.parquet_moments`), then diagnose."""
    return diagnose(parquet_moments(files, dim, threads))


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function of the ``scan`` run: receive every batch, compute nothing, yield the row count.

    Pickled by value when this module runs as ``__main__``, so it installs :mod:`anisotropy_spark.python_worker`
    itself: its workers are then in the same state as those of ``ours``, whose functions import the package."""
    install_in_python_worker()
    yield pa.RecordBatch.from_pydict({"rows": [sum(batch.num_rows for batch in batches)]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_arguments(parser, rows=200_000, dim=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tmp", default=None, help="directory for the generated corpus (default: system temp)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["mllib", "numpy"], help="runs to leave out")
    args = parser.parse_args()
    spark = get_spark("bench-diagnose", master="local[2]")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        found, X = corpus(args, pathlib.Path(tmp) / "corpus", spark)
        config = DiagnoseConfig(
            input=str(found.path),
            metadata_cols=[],
            cluster_k=None,
            metrics_table=None,
            output_dir=str(pathlib.Path(tmp) / "report"),
        )

        def floor():
            return parquet_floor(found.files, args.dim, spark.sparkContext.defaultParallelism)["top1_var"]

        def loop():
            return parquet_floor(found.files, args.dim, 1)["top1_var"]

        def scan():
            return found.read(spark).select("vector").mapInArrow(count_rows, "rows long").agg(F.sum("rows")).first()[0]

        def ours():
            df, ref = read_table(spark, str(found.path))
            files, _ = table_files(spark, df, ref.path, ref.format, "vector", df.count())
            state, _, _, reader = checked_moments(df, "vector", None, args.dim, files=files)
            readers.add(reader)
            return diagnose(state)["top1_var"]

        def spark_scan():
            return diagnose_dataframe(found.read(spark), "vector", args.dim)["top1_var"]

        def job(settings=config):
            result = run_diagnosis(spark, settings)
            write_outputs(spark, settings, result)
            readers.add(next(stage["reader"] for stage in result.stages if stage["name"] == "moments"))
            return result.metrics["top1_var"]

        def mllib():
            df = found.read(spark).select(array_to_vector("vector").alias("features"))
            model = PCA(k=10, inputCol="features").fit(df)
            return float(model.explainedVariance[0])

        def numpy_in_memory():
            return diagnose(X)["top1_var"]

        readers = set()
        runs = {
            "floor": floor,
            "loop": loop,
            "scan": scan,
            "ours": ours,
            "spark": spark_scan,
            "job": job,
            "job_spark": lambda: job(dataclasses.replace(config, vector_reader="spark")),
            "mllib": mllib,
            "numpy": numpy_in_memory,
        }
        skip = set(args.skip) | ({"numpy"} if X is None else set())
        seconds, answers = time_in_rounds({k: v for k, v in runs.items() if k not in skip}, args.repeats)
    print(
        f"corpus: {args.rows} x {args.dim} float32, Spark local[2]; best of {args.repeats}; moments readers: "
        + "; ".join(sorted(readers))
    )
    print("top-1 variance share  " + "  ".join(f"{k} {v:.6f}" for k, v in answers.items() if k != "scan"))
    anchor, other = sorted(("floor", "loop"), key=lambda name: min(seconds[name]))  # the faster one is the anchor
    print_ratios(seconds, args.rows, baseline=anchor)
    print(
        f"time ratio to {other}  "
        + "  ".join(
            f"{name} {min(times) / min(seconds[other]):.2f}" for name, times in seconds.items() if name != other
        )
    )
    spark.stop()


if __name__ == "__main__":
    main()
