"""Shared bench helpers: a synthetic Parquet corpus written with pyarrow (or an existing one), its moments
in one process (one loop, or one thread per core), timing in rounds and plain timing."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import functools
import json
import os
import pathlib
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from threadpoolctl import threadpool_limits

from anisotropy_core.moments import Moments
from anisotropy_core.synthetic import cone
from anisotropy_spark.io import is_delta_table
from anisotropy_spark.table_files import filesystem_of

BATCH_ROWS = 8192


def write_parquet_corpus(path: pathlib.Path, n: int, d: int, files: int = 4, seed: int = 0) -> np.ndarray:
    """Write an (n, d) float32 narrow-cone corpus as ``files`` Parquet files (id, vector); return it."""
    path.mkdir(parents=True, exist_ok=True)
    X = cone(n, d, offset=4.0, alpha=1.0, seed=seed).astype(np.float32)
    for part, rows in enumerate(np.array_split(np.arange(n), files)):
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(X[rows].ravel()), d).cast(pa.list_(pa.float32()))
        pq.write_table(
            pa.table({"id": pa.array(rows.astype(np.int64)), "vector": vectors}), path / f"part-{part:03d}.parquet"
        )
    return X


def add_corpus_arguments(parser: argparse.ArgumentParser, rows: int, dim: int) -> None:
    """``--rows``/``--dim`` of a generated corpus, or ``--corpus`` (an existing one, e.g. a Delta table
    ``bench.scale`` wrote: tables too large to generate in this process's memory)."""
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--dim", type=int, default=dim)
    parser.add_argument(
        "--corpus",
        default=None,
        help="an existing directory of float32 (id, vector) Parquet files, or a Delta table (read "
        "at its current version), e.g. one written by bench.scale (its --rows/--dim are then "
        "read from it); default: generate",
    )


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A bench corpus: ``path`` (a Delta table or a directory of Parquet files) and ``files``, the Parquet data
    files a reader of it sees (a Delta table's: those of its current version, not files an overwrite left behind
    and no vacuum removed yet)."""

    path: pathlib.Path
    files: list[pathlib.Path]
    is_delta: bool

    def read(self, spark: SparkSession) -> DataFrame:
        """The corpus as Spark reads it: through Delta for a Delta table, else the Parquet files."""
        return spark.read.format("delta" if self.is_delta else "parquet").load(str(self.path))


def corpus(args: argparse.Namespace, path: pathlib.Path, spark: SparkSession) -> tuple[Corpus, np.ndarray | None]:
    """(the corpus, its (n, d) float32 matrix or None): ``--corpus`` as given, with ``args.rows``/``args.dim`` set
    from its data files; else a corpus of ``args.rows`` × ``args.dim`` Parquet files written to ``path``."""
    if args.corpus is None:
        X = write_parquet_corpus(path, args.rows, args.dim)
        return Corpus(path, sorted(path.glob("*.parquet")), is_delta=False), X
    root = pathlib.Path(args.corpus)
    if is_delta_table(spark, str(root)):
        uris = spark.read.format("delta").load(str(root)).inputFiles()  # file: URIs of the current version
        files = sorted(pathlib.Path(filesystem_of(uri)[1]) for uri in uris)
        found = Corpus(root, files, is_delta=True)
    else:
        found = Corpus(root, sorted(root.glob("*.parquet")), is_delta=False)
    rows = {f: pq.ParquetFile(f).metadata.num_rows for f in found.files}
    first = next((f for f, n in rows.items() if n), None)  # a writer may leave empty Parquet files
    if first is None:
        raise SystemExit(f"--corpus {args.corpus}: no Parquet file with rows")
    args.dim = len(next(pq.ParquetFile(first).iter_batches(batch_size=1, columns=["vector"])).column(0)[0])
    args.rows = sum(rows.values())
    return found, None


def parquet_moments(files: list[pathlib.Path], dim: int, threads: int = 1) -> Moments:
    """Single-process pyarrow + numpy moments of the ``vector`` column of the Parquet ``files``: float32 read
    ``BATCH_ROWS`` rows at a time, float64 accumulation, merged (Chan).

    ``threads`` = 1: one loop over the files' batches, numpy's BLAS with its own threads (one per core). ``threads``
    > 1: the files' row groups are shared by ``threads`` Python threads, each folding its own with single-threaded
    BLAS (threadpoolctl), merged in file and row-group order. pyarrow's reads and numpy's BLAS calls release the GIL,
    so the process computes on ``threads`` cores at once; numpy's code outside BLAS runs on one core in the loop.
    Returns the same moments either way; which is faster depends on the corpus (bench/RESULTS.md).
    """
    if threads == 1:
        return fold_batches((batch for file in files for batch in row_group_batches(file)), dim)
    units = [(file, [group]) for file in files for group in range(pq.ParquetFile(file).num_row_groups)]
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(lambda unit: fold_batches(row_group_batches(*unit), dim), units))
    return functools.reduce(Moments.merge, parts, Moments.empty(dim))


def row_group_batches(file: pathlib.Path, row_groups: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    """The ``vector`` column of ``file`` (of its ``row_groups``; None: all) in batches of ``BATCH_ROWS`` rows."""
    return pq.ParquetFile(file).iter_batches(batch_size=BATCH_ROWS, row_groups=row_groups, columns=["vector"])


def fold_batches(batches: Iterator[pa.RecordBatch], dim: int) -> Moments:
    """Moments of the (B, ``dim``) float32 matrices of one-column ``list<float>`` ``batches``, merged in order."""
    state = Moments.empty(dim)
    for batch in batches:
        state = state.merge(Moments.of_batch(batch.column(0).values.to_numpy().reshape(-1, dim)))
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
        print(
            f"{name:9s} {best[name]:8.2f} s  {rows / best[name]:12,.0f} rows/s  "
            f"time ratio to {baseline} {best[name] / best[baseline]:.2f}  (rounds: "
            + " ".join(f"{t:.2f}" for t in times)
            + " s)"
        )


@contextmanager
def timed(results: dict, name: str):
    """Record the wall-clock seconds of the ``with`` body in ``results[name]``."""
    start = time.perf_counter()
    yield
    results[name] = time.perf_counter() - start


RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


def append_result(file_name: str, header: dict, corpus_text: str, figures: str, conditions: str) -> None:
    """Append one run as a row of ``bench/results/<file_name>`` (created with ``header``: title, order, intro,
    command, when absent): its conditions (UTC time, commit, load average), corpus and figures;
    ``python -m bench.render_results`` renders the file into ``bench/RESULTS.md``."""
    path = RESULTS_DIR / file_name
    body = (
        json.loads(path.read_text())
        if path.exists()
        else {
            **header,
            "columns": [
                {"header": "bench", "field": "conditions"},
                {"header": "size", "field": "corpus"},
                {"header": "result", "field": "figures"},
            ],
            "rows": [],
            "notes": [],
        }
    )
    now = _dt.datetime.now(_dt.timezone.utc)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    body["rows"].append(
        {
            "conditions": f"{now:%Y-%m-%d %H:%M} UTC, {commit}, {conditions}; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end",
            "corpus": corpus_text,
            "figures": figures,
            "dates": [f"{now:%Y-%m-%d}"],
            "commits": [commit],
        }
    )
    path.write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")


def _process_kind(pid: int, own: int) -> str | None:
    """``driver`` (this process), ``jvm`` (a java descendant) or ``python_workers`` (pyspark daemon/workers)."""
    if pid == own:
        return "driver"
    try:
        command = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return None
    if b"java" in command.split(b" ")[0]:
        return "jvm"
    if b"pyspark" in command:
        return "python_workers"
    return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _rss_mb(pid: int) -> float:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class PeakMemory:
    """``with PeakMemory() as peak:`` samples, every ``interval`` seconds, the resident memory of this process and
    its descendants summed per kind (``driver``, ``jvm``, ``python_workers``); ``peak.peaks`` is the peak of each
    sum in MiB (Linux ``/proc``)."""

    def __init__(self, interval: float = 0.5):
        self.interval, self.peaks = interval, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        own = os.getpid()
        while not self._stop.is_set():
            totals: dict[str, float] = {}
            for pid in _descendants(own):
                kind = _process_kind(pid, own)
                if kind is not None:
                    totals[kind] = totals.get(kind, 0.0) + _rss_mb(pid)
            for kind, value in totals.items():
                self.peaks[kind] = round(max(self.peaks.get(kind, 0.0), value), 1)
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
