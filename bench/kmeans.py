"""Our distributed k-means vs ``pyspark.ml.clustering.KMeans``, side by side on the same cached data.

Both start from k-means|| with the same k, seed and ``initSteps`` and run Lloyd with tol = 0 (so neither
stops early). Time per Lloyd iteration is measured the same way for both, so that initialisation and job
start-up cancel: fit once with ``maxIter = 1`` and once with ``maxIter = 1 + iters``,

    per-iteration = (T(1 + iters) − T(1)) / (iterations(1 + iters) − iterations(1)).

Reported: per-iteration seconds of each, the ratio Spark-ML / ours (> 1: ours is faster), and the final
inertia (Σ squared distance, or Σ(1 − cos) for cosine) of both after the same number of iterations.

Usage::

    .venv/bin/python -m bench.kmeans --n 100000 --d 128 --k 16 --iters 8 --partitions 2
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.ml.clustering import KMeans
from pyspark.ml.functions import array_to_vector

from anisotropy_core.synthetic import mixture
from anisotropy_spark.arrow import matrix_column
from anisotropy_spark.kmeans import fit_kmeans
from anisotropy_spark.session import get_spark

from .common import timed


def write_corpus(path: str, n: int, d: int, k: int, seed: int) -> None:
    """Parquet table ``id long, vector array<double>``: k equal Gaussian populations (separation 4, spread 1)."""
    X, _ = mixture(n, d, tuple([1.0 / k] * k), separation=4.0, spread=1.0, seed=seed)
    pq.write_table(pa.table({"id": pa.array(np.arange(n)), "vector": matrix_column(X)}), path)


def run(args: argparse.Namespace) -> dict:
    spark = get_spark("bench-kmeans", master=args.master, extra_conf={
        "spark.sql.shuffle.partitions": str(args.partitions), "spark.driver.memory": "4g",
        "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "corpus.parquet")
        write_corpus(path, args.n, args.d, args.k, args.seed)
        vectors = spark.read.parquet(path).select("vector").repartition(args.partitions).cache()
        features = vectors.select(array_to_vector("vector").alias("features")).cache()
        assert vectors.count() == features.count() == args.n

        def ours(max_iter: int):
            result = fit_kmeans(vectors, "vector", args.k, args.metric, seed=args.seed, max_iter=max_iter, tol=0.0,
                                init_steps=args.init_steps, dimension=args.d)
            return result.n_iter, result.inertia

        def engine(max_iter: int):
            model = KMeans(k=args.k, seed=args.seed, maxIter=max_iter, tol=0.0, initMode="k-means||",
                           initSteps=args.init_steps, distanceMeasure=args.metric).fit(features)
            return model.summary.numIter, model.summary.trainingCost

        report = {"n": args.n, "d": args.d, "k": args.k, "metric": args.metric, "partitions": args.partitions,
                  "master": args.master, "init_steps": args.init_steps}
        for name, fit in (("ours", ours), ("spark_ml", engine)):
            fit(1)                                                     # warm-up: Python workers, JIT, caches
            seconds: dict[str, float] = {}
            with timed(seconds, "short"):
                iters_short, _ = fit(1)
            with timed(seconds, "long"):
                iters_long, inertia = fit(1 + args.iters)
            if iters_long <= iters_short:
                raise RuntimeError(f"{name} converged after {iters_long} iterations: no Lloyd time to measure")
            report[name] = {"per_iteration_s": (seconds["long"] - seconds["short"]) / (iters_long - iters_short),
                            "iterations": iters_long, "fit_s": seconds["long"], "inertia": inertia}
        vectors.unpersist()
        features.unpersist()
    report["ratio_spark_ml_over_ours"] = report["spark_ml"]["per_iteration_s"] / report["ours"]["per_iteration_s"]
    report["inertia_ours_over_spark_ml"] = report["ours"]["inertia"] / report["spark_ml"]["inertia"]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--iters", type=int, default=8, help="extra Lloyd iterations timed")
    parser.add_argument("--metric", choices=("euclidean", "cosine"), default="euclidean")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--init-steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--master", default="local[2]")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
