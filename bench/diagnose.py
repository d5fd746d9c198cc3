"""Throughput of the diagnosis pass against Spark MLlib's PCA and single-process numpy, side by side.

    .venv/bin/python -m bench.diagnose [--rows 200000] [--dim 256] [--repeats 2]

All three compute the full centred covariance + eigendecomposition of the same float32 corpus:
  ours    — Parquet → Arrow batches → numpy Moments per partition → treeReduce → eigh (jobs' path)
  mllib   — Parquet → VectorUDT → pyspark.ml.feature.PCA(k=10).fit (RowMatrix covariance on the JVM)
  numpy   — the corpus already in this process's memory → Moments.of_batch → diagnose
Each is run ``repeats`` times after one warm-up; the best time is reported, with ratios to ours.
"""
from __future__ import annotations

import argparse
import pathlib
import tempfile

from pyspark.ml.feature import PCA
from pyspark.ml.functions import array_to_vector

from anisotropy_core import diagnose
from anisotropy_spark.diagnostics import diagnose_dataframe
from anisotropy_spark.io import as_double_array
from anisotropy_spark.session import get_spark
from bench.common import best_of, print_ratios, write_parquet_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    spark = get_spark("bench-diagnose", master="local[2]", extra_conf={"spark.driver.memory": "6g"})
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "corpus"
        X = write_parquet_corpus(path, args.rows, args.dim)

        def ours():
            df = as_double_array(spark.read.parquet(str(path)), "vector")
            return diagnose_dataframe(df, "vector", args.dim)["top1_var"]

        def mllib():
            df = spark.read.parquet(str(path)).select(array_to_vector("vector").alias("features"))
            model = PCA(k=10, inputCol="features").fit(df)
            return float(model.explainedVariance[0])

        def numpy_in_memory():
            return diagnose(X)["top1_var"]

        best, answers = best_of({"ours": ours, "mllib": mllib, "numpy": numpy_in_memory}, args.repeats)
    print(f"corpus: {args.rows} x {args.dim} float32, Spark local[2]; best of {args.repeats}")
    print(f"top-1 variance share  ours {answers['ours']:.6f}  mllib {answers['mllib']:.6f}  numpy {answers['numpy']:.6f}")
    print_ratios(best, args.rows, baseline="ours")
    spark.stop()


if __name__ == "__main__":
    main()
