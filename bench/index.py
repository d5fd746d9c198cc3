"""Our Spark index build against a single-process faiss build of the same index from the same Parquet files.

For each factory string (default ``IVF1024,Flat`` and ``IVF1024,PQ32``), both builds read the corpus's float32
Parquet files (:func:`bench.common.corpus`: the narrow-cone corpus, or ``--corpus``), L2-normalise, train on
``--train-size`` uniformly sampled rows and add every row with its id; both are timed end to end, load included:

* ``faiss`` — pyarrow reads every file into one (n, d) float32 array in this process, ``faiss.normalize_L2``,
  ``index.train`` on a random subset, ``index.add_with_ids`` of all rows;
* ``ours``  — :func:`anisotropy_spark.index_build.build_index` on ``spark.read.parquet``: a count, the driver
  sample (:func:`anisotropy_spark.index_build.draw`), training on the driver, the adds in Spark tasks (one shard
  each) and the merge on the driver (``--merge-memory-mb``: on disk beyond that many MiB of shards, its
  ``.ivfdata`` left in the work folder).

Each build runs twice per factory (:func:`bench.common.time_in_rounds`: a warm-up call, then the timed one). The
recall@10 of both indexes against exact top-10 (a flat inner-product index over the same unit vectors; the query's
own row excluded) of ``--queries`` corpus rows is measured at nprobe 8, 16 and 32, with faiss's list-size
imbalance factor. Printed: seconds, the time ratio ours / faiss (target ≤ 1.5) and the recall difference
(target within 0.01); ``--record`` appends the run as a row of ``bench/results/index.json``.

    .venv/bin/python -m bench.index --rows 1000000 --dim 384 [--record]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

import numpy as np
import pyarrow.parquet as pq

from anisotropy_core import index as core

from .common import add_corpus_arguments, append_result, corpus, time_in_rounds

NPROBES = (8, 16, 32)
K = 10


def load(files: list[pathlib.Path], d: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids (n,) int64, unit vectors (n, d) float32) of the Parquet ``files``, in file order."""
    table = pq.read_table(files, columns=["id", "vector"])
    x = np.ascontiguousarray(table.column("vector").combine_chunks().values.to_numpy().reshape(-1, d), dtype=np.float32)
    import faiss

    faiss.normalize_L2(x)
    return table.column("id").to_numpy().astype(np.int64), x


def exact_top_k(x: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(m, K) exact top-K ids of the unit rows ``x[rows]`` among ``x`` (inner product), their own row excluded."""
    import faiss

    flat = faiss.IndexFlatIP(x.shape[1])
    flat.add(x)
    _, found = flat.search(x[rows], K + 1)
    return np.array([[ids[j] for j in row if j != r][:K] for r, row in zip(rows, found)])


def quality(index, queries: np.ndarray, query_ids: np.ndarray, exact: np.ndarray) -> dict:
    """{"imbalance_factor", "recall@10": {nprobe: recall}} of ``index``."""
    recall = {}
    for nprobe in NPROBES:
        core.set_nprobe(index, nprobe)
        recall[nprobe] = core.recall_against(core.search_excluding(index, queries, K, query_ids)[1], exact)
    return {"imbalance_factor": core.imbalance_factor(index), "recall@10": recall}


def run(args: argparse.Namespace) -> dict:
    import faiss

    from anisotropy_spark.index_build import build_index, draw
    from anisotropy_spark.session import get_spark

    spark = get_spark(
        "bench-index",
        master=args.master,
        extra_conf={"spark.driver.memory": args.driver_memory, "spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = pathlib.Path(args.data or tempfile.mkdtemp(prefix="anisotropy-bench-index-"))
    found, _ = corpus(args, work / f"corpus-{args.rows}x{args.dim}", spark)
    d = args.dim

    def run_faiss(factory: str):
        def build():
            ids, x = load(found.files, d)
            index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
            pick = np.random.default_rng(args.seed).choice(len(ids), size=min(args.train_size, len(ids)), replace=False)
            index.train(x[np.sort(pick)])
            index.add_with_ids(x, ids)
            return index

        return build

    def run_ours(factory: str):
        def build():
            df = found.read(spark)
            total = df.count()
            sample = draw(df, "vector", "id", d, args.train_size, args.seed, total)
            return build_index(
                df,
                "vector",
                "id",
                d,
                factory,
                str(work / "index-work"),
                sample,
                total,
                merge_memory_mb=args.merge_memory_mb,
            ).index

        return build

    ids, x = load(found.files, d)  # the queries and exact neighbours, outside the timings
    rows = np.sort(np.random.default_rng(args.seed + 1).choice(len(ids), size=args.queries, replace=False))
    exact = exact_top_k(x, ids, rows)
    queries, query_ids = x[rows].astype(np.float64), ids[rows]
    del x
    print(f"index build {args.rows:,} × {d} float32, train {args.train_size:,} rows, {args.master}", flush=True)
    results = {}
    for factory in args.factories:
        seconds, built = time_in_rounds({"faiss": run_faiss(factory), "ours": run_ours(factory)}, args.repeats)
        best = {name: min(times) for name, times in seconds.items()}
        measured = {name: quality(index, queries, query_ids, exact) for name, index in built.items()}
        ratio = best["ours"] / best["faiss"]
        gaps = {p: measured["ours"]["recall@10"][p] - measured["faiss"]["recall@10"][p] for p in NPROBES}
        for name in ("faiss", "ours"):
            q = measured[name]
            print(
                f"{factory:14s} {name:6s} {best[name]:8.2f} s (rounds "
                + " ".join(f"{t:.2f}" for t in seconds[name])
                + f")  imbalance {q['imbalance_factor']:.3f}  recall@10 "
                + " ".join(f"nprobe {p}: {r:.4f}" for p, r in q["recall@10"].items()),
                flush=True,
            )
        print(
            f"{factory:14s} target ours ≤ 1.5× faiss: {ratio:.2f}× ({'met' if ratio <= 1.5 else 'NOT met'}); "
            f"recall@10 ours − faiss: "
            + ", ".join(f"nprobe {p}: {g:+.4f}" for p, g in gaps.items())
            + f" ({'met' if all(abs(g) <= 0.01 for g in gaps.values()) else 'NOT met'}: within 0.01)",
            flush=True,
        )
        results[factory] = {"seconds": seconds, "ratio": ratio, "quality": measured, "recall_gap": gaps}
    return {
        "rows": args.rows,
        "dim": d,
        "train_size": args.train_size,
        "queries": args.queries,
        "master": args.master,
        "results": results,
    }


def record(summary: dict) -> None:
    """Append ``summary`` as a row of ``bench/results/index.json``."""
    figures = []
    for factory, r in summary["results"].items():
        best = {name: min(t) for name, t in r["seconds"].items()}
        recall = {name: r["quality"][name]["recall@10"] for name in best}
        figures.append(
            f"{factory}: ours {best['ours']:.2f} s vs faiss {best['faiss']:.2f} s = **{r['ratio']:.2f}×** "
            f"({'met' if r['ratio'] <= 1.5 else 'not met'}); recall@10 at nprobe 8/16/32 ours "
            + "/".join(f"{v:.3f}" for v in recall["ours"].values())
            + ", faiss "
            + "/".join(f"{v:.3f}" for v in recall["faiss"].values())
            + "; imbalance ours "
            f"{r['quality']['ours']['imbalance_factor']:.3f}, faiss "
            f"{r['quality']['faiss']['imbalance_factor']:.3f}"
        )
    append_result(
        "index.json",
        {
            "title": "Corpus index build (`bench.index`)",
            "order": 6,
            "intro": [
                "Our Spark build (driver sample + training, adds in Spark tasks, merge on the driver) against a "
                "single-process faiss build of the same factory from the same Parquet files, load included, and "
                "the recall@10 of both against exact top-10. Targets (issue 47): at most 1.5× faiss, recall within "
                "0.01. Measured on the shared 2-core development host: only ratios mean anything."
            ],
            "command": ".venv/bin/python -m bench.index --rows 1000000 --dim 384 --record",
        },
        f"{summary['rows']:,} × {summary['dim']} float32",
        "; ".join(figures),
        f"index build, {summary['master']}, train {summary['train_size']:,} rows",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_arguments(parser, rows=200_000, dim=384)
    parser.add_argument("--factories", nargs="+", default=["IVF1024,Flat", "IVF1024,PQ32"])
    parser.add_argument("--train-size", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="work folder (corpus, shards); default a new temporary one")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument(
        "--merge-memory-mb",
        type=float,
        default=None,
        help="ours merges on disk beyond this many MiB of shards (default: always in memory)",
    )
    parser.add_argument("--record", action="store_true", help="append the run to bench/results/index.json")
    args = parser.parse_args()
    summary = run(args)
    print(json.dumps(summary, default=str))
    if args.record:
        record(summary)


if __name__ == "__main__":
    main()
