"""Shared bench helpers: a synthetic Parquet corpus written with pyarrow (or an existing one), its moments
streamed file by file, best-of and plain timing."""
from __future__ import annotations

import argparse
import pathlib
import time
from contextlib import contextmanager
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from anisotropy_core.moments import Moments
from anisotropy_core.synthetic import cone

BATCH_ROWS = 8192


def write_parquet_corpus(path: pathlib.Path, n: int, d: int, files: int = 4, seed: int = 0) -> np.ndarray:
    """Write an (n, d) float32 narrow-cone corpus as ``files`` Parquet files (id, vector); return it."""
    path.mkdir(parents=True, exist_ok=True)
    X = cone(n, d, offset=4.0, alpha=1.0, seed=seed).astype(np.float32)
    for part, rows in enumerate(np.array_split(np.arange(n), files)):
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(X[rows].ravel()), d).cast(pa.list_(pa.float32()))
        pq.write_table(pa.table({"id": pa.array(rows.astype(np.int64)), "vector": vectors}),
                       path / f"part-{part:03d}.parquet")
    return X


def add_corpus_arguments(parser: argparse.ArgumentParser, rows: int, dim: int) -> None:
    """``--rows``/``--dim`` of a generated corpus, or ``--corpus`` (an existing one, e.g. a Delta table
    ``bench.scale`` wrote: tables too large to generate in this process's memory)."""
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--dim", type=int, default=dim)
    parser.add_argument("--corpus", default=None,
                        help="an existing directory of float32 (id, vector) Parquet files, e.g. a Delta table "
                             "written by bench.scale (its --rows/--dim are then read from it); default: generate")


def corpus(args: argparse.Namespace, path: pathlib.Path) -> tuple[pathlib.Path, np.ndarray | None]:
    """(directory of the corpus's Parquet files, its (n, d) float32 matrix or None): ``--corpus`` as given, with
    ``args.rows``/``args.dim`` set from its files; else a corpus of ``args.rows`` × ``args.dim`` written to
    ``path``."""
    if args.corpus is None:
        return path, write_parquet_corpus(path, args.rows, args.dim)
    rows = {f: pq.ParquetFile(f).metadata.num_rows for f in sorted(pathlib.Path(args.corpus).glob("*.parquet"))}
    first = next((f for f, n in rows.items() if n), None)  # a Delta table may keep empty data files
    if first is None:
        raise SystemExit(f"--corpus {args.corpus}: no Parquet file with rows")
    args.dim = len(next(pq.ParquetFile(first).iter_batches(batch_size=1, columns=["vector"])).column(0)[0])
    args.rows = sum(rows.values())
    return pathlib.Path(args.corpus), None


def parquet_moments(path: pathlib.Path, dim: int) -> Moments:
    """Single-process pyarrow + numpy moments of the ``vector`` column of every Parquet file under ``path``:
    float32 read ``BATCH_ROWS`` rows at a time, float64 accumulation, merged (Chan)."""
    state = Moments.empty(dim)
    for file in sorted(path.glob("*.parquet")):
        for batch in pq.ParquetFile(file).iter_batches(batch_size=BATCH_ROWS, columns=["vector"]):
            values = batch.column(0).values.to_numpy()
            state = state.merge(Moments.of_batch(values.reshape(-1, dim)))
    return state


def time_in_rounds(runs: dict, repeats: int, reset: Callable[[], None] | None = None) -> tuple[dict, dict]:
    """Time each ``name → callable`` of ``runs`` after one warm-up call of each (JIT, Python workers, file
    cache); ``reset`` (untimed) runs before every call, e.g. to delete the outputs the last one wrote.

    The timed calls go round by round, every name once per round in the order given, so a drift of the
    machine's speed during the run reaches every name alike instead of whichever ran last.

    Returns ``({name: wall-clock seconds of each of the ``repeats`` rounds}, {name: the warm-up call's return
    value})``.
    """
    reset = reset or (lambda: None)
    answers = {}
    for name, run in runs.items():
        reset()
        answers[name] = run()
    seconds = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            reset()
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return seconds, answers


def print_ratios(seconds: dict, rows: int, baseline: str) -> None:
    """One line per timed run: its best seconds, rows/s and time ratio to the ``baseline``'s best, then every
    round's seconds."""
    best = {name: min(times) for name, times in seconds.items()}
    for name, times in seconds.items():
        print(f"{name:9s} {best[name]:8.2f} s  {rows / best[name]:12,.0f} rows/s  "
              f"time ratio to {baseline} {best[name] / best[baseline]:.2f}  (rounds: "
              + " ".join(f"{t:.2f}" for t in times) + " s)")


@contextmanager
def timed(results: dict, name: str):
    """Record the wall-clock seconds of the ``with`` body in ``results[name]``."""
    start = time.perf_counter()
    yield
    results[name] = time.perf_counter() - start
