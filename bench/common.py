"""Shared bench helpers: a synthetic Parquet corpus written with pyarrow, best-of and plain timing."""
from __future__ import annotations

import pathlib
import time
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from anisotropy_core.synthetic import cone


def write_parquet_corpus(path: pathlib.Path, n: int, d: int, files: int = 4, seed: int = 0) -> np.ndarray:
    """Write an (n, d) float32 narrow-cone corpus as ``files`` Parquet files (id, vector); return it."""
    path.mkdir(parents=True, exist_ok=True)
    X = cone(n, d, offset=4.0, alpha=1.0, seed=seed).astype(np.float32)
    for part, rows in enumerate(np.array_split(np.arange(n), files)):
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(X[rows].ravel()), d).cast(pa.list_(pa.float32()))
        pq.write_table(pa.table({"id": pa.array(rows.astype(np.int64)), "vector": vectors}),
                       path / f"part-{part:03d}.parquet")
    return X


def best_of(runs: dict, repeats: int) -> tuple[dict, dict]:
    """Time each ``name → callable`` of ``runs`` after one warm-up call (JIT, Python workers, file cache).

    Returns ``({name: best wall-clock seconds over repeats}, {name: the warm-up call's return value})``.
    The runs are interleaved by name, in one process, so their ratios share the machine's state.
    """
    best, answers = {}, {}
    for name, run in runs.items():
        answers[name] = run()
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - start)
        best[name] = min(seconds)
    return best, answers


def print_ratios(best: dict, rows: int, baseline: str) -> None:
    """One line per timed run: seconds, rows/s and the time ratio to the ``baseline`` run."""
    for name, seconds in best.items():
        print(f"{name:9s} {seconds:8.2f} s  {rows / seconds:12,.0f} rows/s  "
              f"time ratio to {baseline} {seconds / best[baseline]:.2f}")


@contextmanager
def timed(results: dict, name: str):
    """Record the wall-clock seconds of the ``with`` body in ``results[name]``."""
    start = time.perf_counter()
    yield
    results[name] = time.perf_counter() - start
