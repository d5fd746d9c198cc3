"""The Python driver's peak memory when P per-partition d × d states are merged: Spark's ``treeReduce`` at a fixed
depth 2 against :func:`anisotropy_spark.tree_reduce.tree_reduce`, whose depth bounds the states the driver collects.

    .venv/bin/python -m bench.driver_fan_in [--partitions 23 232] [--dim 768]

Each run is its own process (so its peak RSS is its own), with an embedded ``local[2]`` session: P tasks each
build one float64 (d, d) state (4.7 MB at d = 768, the size of a moments state), merged by addition. ``count``
builds the same states and only counts them (the baseline: the driver collects P integers). The table prints
each run's driver peak RSS (``ru_maxrss``) and how many states its final level collects; the job's read splits
are the P of a real table (23 at 1M × 768, 232 at 10M × 768).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys

import numpy as np

from anisotropy_spark.session import get_spark
from anisotropy_spark.tree_reduce import tree_depth, tree_reduce

MODES = ("count", "depth2", "tree_reduce")


def one_run(mode: str, partitions: int, dim: int) -> None:
    """Merge (or count) ``partitions`` states in this process; print its peak RSS (MiB) and the sum's check value."""
    spark = get_spark("bench-driver-fan-in", master="local[2]")
    states = spark.sparkContext.parallelize(range(partitions), partitions).map(lambda i: np.full((dim, dim), float(i)))
    if mode == "count":
        check = float(states.count())
    elif mode == "depth2":
        check = float(states.treeReduce(np.add, depth=2)[0, 0])
    else:
        check = float(tree_reduce(states, np.add)[0, 0])
    spark.stop()
    print(f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} {check:.0f}")


def final_fan_in(partitions: int, depth: int) -> int:
    """How many states pyspark's ``treeReduce(depth)`` collects to the driver at its last level (its own loop)."""
    scale = max(int(np.ceil(partitions ** (1.0 / depth))), 2)
    remaining = float(partitions)
    while remaining > scale + remaining / scale:
        remaining /= scale
    return int(remaining)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[23, 232])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_run(args.one, args.partitions[0], args.dim)
        return
    for partitions in args.partitions:
        expected = partitions * (partitions - 1) / 2
        peaks = {}
        for mode in MODES:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.driver_fan_in",
                    "--one",
                    mode,
                    "--partitions",
                    str(partitions),
                    "--dim",
                    str(args.dim),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            peak, check = out.stdout.split()[-2:]
            assert float(check) == (partitions if mode == "count" else expected), (mode, check)
            peaks[mode] = float(peak)
        depth = tree_depth(partitions)
        print(
            f"P = {partitions:5d}, d = {args.dim}: python driver peak RSS  count {peaks['count']:6.0f} MiB  "
            f"depth 2 {peaks['depth2']:6.0f} MiB ({final_fan_in(partitions, 2)} states collected)  "
            f"tree_reduce {peaks['tree_reduce']:6.0f} MiB (depth {depth}, "
            f"{final_fan_in(partitions, depth)} states collected)",
            flush=True,
        )


if __name__ == "__main__":
    main()
