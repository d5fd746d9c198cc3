"""Every job on a large float32 table with the embedded default session: wall time and peak memory at two sizes.

    .venv/bin/python -m bench.scale [--rows 1000000 10000000 ...] [--dim 768] [--root DIR]
                                    [--jobs diagnose fit kmeans apply nightly]

For each size it writes a narrow-cone Delta table with Spark (:func:`write_delta_corpus`, generated inside the
tasks, never the whole table in memory), then runs each job as its own ``python -m jobs.<job>`` subprocess
exactly as a user would, with no Spark flags (the embedded session sizes itself), sampling every 0.2 s the RSS
of the process tree: the driver JVM (``java``), the Python driver (the job process) and the executor Python
workers (every other python process, summed as RSS and as PSS, counted, and the largest one), and the driver
JVM's live heap: the heap a full collection leaves, requested every 15 s (JVM RSS only shows the heap it grew
to). It prints one line per job and size, then per job the ratio of the larger size's peaks to the smaller's:
memory bounded by design means ratios near 1 for 10× the rows. The jobs:

* ``diagnose`` — ``jobs.diagnose`` without clusters or metadata columns (moments, sample, report files);
* ``fit``      — ``jobs.fit --method abtt`` (one pass: validation and moments; D from the Marchenko–Pastur edge);
* ``kmeans``   — ``jobs.fit --method cluster_recenter --k 64`` (sample pass, driver fit, full k-means passes,
  per-cluster moments);
* ``apply``    — ``jobs.apply`` of the ``fit`` artifact into a new Delta table (validation, transform, one commit);
  the output is deleted afterwards to free the disk;
* ``nightly``  — ``jobs.nightly`` from scratch (diagnose, recommend, fit, apply, gate, publish), output deleted.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

from typing import Iterable, Iterator

import numpy as np
import psutil
import pyarrow as pa

from anisotropy_core.synthetic import random_rotation

SAMPLE_SECONDS = 0.2
ROWS_PER_TASK = 250_000
ROWS_PER_BATCH = 10_000
JOBS = ("diagnose", "fit", "kmeans", "apply", "nightly")
PEAKS = ("jvm", "python_driver", "python_workers", "python_workers_pss", "python_worker_count", "python_worker_largest")
MIB = 1 << 20
LIVE_HEAP_SECONDS = 15.0
FULL_GC_AFTER = re.compile(r"Pause Full \(Diagnostic Command\) \d+M->(\d+)M\(")


def live_heap_peak(gc_logs: Iterable[pathlib.Path]) -> float:
    """The largest Java heap left by a full collection (MiB) in the unified GC logs ``gc_logs``: the live heap
    at that moment. Only the full collections :func:`peak_rss` requests count (``Pause Full (Diagnostic Command)
    4000M->600M(6144M)``): the heap after a young or remark pause still holds garbage G1 has not reclaimed yet,
    so it tracks G1's heap sizing, not the job's data."""
    after = [float(m) for log in gc_logs for m in FULL_GC_AFTER.findall(log.read_text(errors="replace"))]
    return max(after, default=0.0)


def peak_rss(command: list[str], log: pathlib.Path) -> dict[str, float]:
    """Run ``command`` (stdout and stderr to ``log``); return peak RSS in MiB of {"jvm", "python_driver",
    "python_workers"}, the workers' peak summed PSS ("python_workers_pss": a forked worker's pages shared with
    ``pyspark.daemon`` counted once, not once per worker as summed RSS does), most simultaneous worker
    processes ("python_worker_count") and the largest RSS any one worker reached ("python_worker_largest": the
    memory of one task's Python side), the driver JVM's sampled live-heap peak ("jvm_live_heap", MiB: every
    ``LIVE_HEAP_SECONDS`` a full collection is requested with ``jcmd <pid> GC.run`` and the heap it leaves is
    read from the GC log each JVM writes next to ``log`` through ``JAVA_TOOL_OPTIONS`` — logging only, no
    memory setting) and its wall-clock "seconds". Raises if it exits non-zero."""
    gc_prefix = log.with_suffix("")
    for stale in log.parent.glob(f"{gc_prefix.name}-gc-*.log"):
        stale.unlink()
    env = {**os.environ, "JAVA_TOOL_OPTIONS": f"-Xlog:gc:file={gc_prefix}-gc-%p.log"}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        driver = psutil.Process(process.pid)
        peaks = dict.fromkeys(PEAKS, 0.0)
        start = last_full_gc = time.perf_counter()
        while process.poll() is None:
            jvms = []
            try:
                current = dict.fromkeys(PEAKS, 0.0) | {"python_driver": driver.memory_info().rss / MIB}
                for child in driver.children(recursive=True):
                    if "java" in child.name():
                        current["jvm"] += child.memory_info().rss / MIB
                        jvms.append(child.pid)
                        continue
                    memory = child.memory_full_info()
                    current["python_workers"] += memory.rss / MIB
                    current["python_workers_pss"] += memory.pss / MIB
                    current["python_worker_count"] += 1
                    current["python_worker_largest"] = max(current["python_worker_largest"], memory.rss / MIB)
            except psutil.Error:
                pass
            else:
                peaks = {k: max(peaks[k], current[k]) for k in PEAKS}
            if time.perf_counter() - last_full_gc > LIVE_HEAP_SECONDS:
                for pid in jvms:  # a JVM that just exited or is not attachable yet: no sample this time
                    subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=120, check=False)
                last_full_gc = time.perf_counter()
            time.sleep(SAMPLE_SECONDS)
    if process.returncode:
        raise RuntimeError(f"{' '.join(command)} exited {process.returncode}; see {log}")
    return {
        **peaks,
        "jvm_live_heap": live_heap_peak(log.parent.glob(f"{gc_prefix.name}-gc-*.log")),
        "seconds": time.perf_counter() - start,
    }


def job_command(job: str, table: pathlib.Path, work: pathlib.Path) -> list[str]:
    """The command line of ``job`` on the Delta ``table``, writing under ``work``."""
    module = {"kmeans": "fit"}.get(job, job)
    base = [
        sys.executable,
        "-m",
        f"jobs.{module}",
        "--conf",
        f"conf/{module}.yaml",
        "--input",
        str(table),
        "--on-invalid",
        "error",
    ]
    return (
        base
        + {
            "diagnose": [
                "--metadata-cols",
                "[]",
                "--cluster-k",
                "null",
                "--metrics-table",
                "null",
                "--output-dir",
                str(work / "diagnose"),
            ],
            "fit": ["--method", "abtt", "--artifact", str(work / "abtt")],
            "kmeans": ["--method", "cluster_recenter", "--k", "64", "--artifact", str(work / "clusters")],
            "apply": ["--artifact", str(work / "abtt"), "--output", str(work / "applied")],
            "nightly": [
                "--metadata-cols",
                "[]",
                "--output",
                str(work / "nightly" / "out"),
                "--quarantine-path",
                str(work / "nightly" / "quarantine"),
                "--artifacts-dir",
                str(work / "nightly" / "transforms"),
                "--runs-dir",
                str(work / "nightly" / "runs"),
                "--runs-table",
                str(work / "nightly" / "runs_table"),
            ],
        }[job]
    )


def write_delta_corpus(path: pathlib.Path, n: int, d: int, seed: int = 0) -> None:
    """Write an (n, d) ``array<float>`` Delta table (id, vector) of the narrow cone of :mod:`bench.common` (offset 4,
    1/k spectrum in a random basis), generated in Spark tasks of ``ROWS_PER_TASK`` rows, ``ROWS_PER_BATCH`` at a
    time (seeded by (seed, task, batch)): memory O(ROWS_PER_BATCH · d + d²) per task whatever n is."""
    from anisotropy_spark.arrow import matrix_column
    from anisotropy_spark.session import get_spark

    rng = np.random.default_rng(seed)
    mean = rng.normal(size=d)
    mean = (mean * 4.0 / np.linalg.norm(mean)).astype(np.float32)
    basis = (random_rotation(d, rng) * np.arange(1, d + 1) ** -0.5).astype(np.float32)  # (d, d): scale, rotate

    def generate(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for task in (int(t) for b in batches for t in b.column(0).to_numpy()):
            end = min((task + 1) * ROWS_PER_TASK, n)
            for batch, first in enumerate(range(task * ROWS_PER_TASK, end, ROWS_PER_BATCH)):
                rows = np.arange(first, min(first + ROWS_PER_BATCH, end))
                noise = np.random.default_rng([seed, task, batch]).standard_normal((rows.size, d), dtype=np.float32)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(rows), matrix_column(noise @ basis.T + mean, np.float32)], names=["id", "vector"]
                )

    spark = get_spark("bench-scale-corpus")
    tasks = -(-n // ROWS_PER_TASK)
    (
        spark.range(tasks, numPartitions=tasks)
        .mapInArrow(generate, "id long, vector array<float>")
        .write.format("delta")
        .save(str(path))
    )
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=[1_000_000, 10_000_000],
        help="table sizes, smallest first; the peak ratios compare the first and the last",
    )
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--root", default="/tmp/anisotropy-bench-scale", help="corpora and outputs (kept)")
    parser.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS))
    args = parser.parse_args()
    results: dict[str, dict[int, dict]] = {job: {} for job in args.jobs}
    for rows in args.rows:
        root = pathlib.Path(args.root) / f"{rows}x{args.dim}"
        table = root / "corpus"
        if not (table / "_delta_log").is_dir():
            shutil.rmtree(table, ignore_errors=True)
            start = time.perf_counter()
            write_delta_corpus(table, rows, args.dim)
            print(f"corpus {rows:,} x {args.dim} float32 written in {time.perf_counter() - start:.0f} s", flush=True)
        for job in args.jobs:
            work = root / "work"
            r = results[job][rows] = peak_rss(job_command(job, table, work), root / f"{job}.log")
            print(
                f"{job:9s} {rows:>11,} x {args.dim}: {r['seconds']:8.1f} s  peak RSS jvm {r['jvm']:7.0f} MiB  "
                f"python driver {r['python_driver']:6.0f} MiB  python workers {r['python_workers']:6.0f} MiB "
                f"(PSS {r['python_workers_pss']:6.0f} MiB, at most {r['python_worker_count']:.0f} processes, "
                f"largest one {r['python_worker_largest']:5.0f} MiB)  "
                f"jvm live heap {r['jvm_live_heap']:6.0f} MiB",
                flush=True,
            )
            for output in ("applied", "nightly"):
                shutil.rmtree(work / output, ignore_errors=True)
    small, large = args.rows[0], args.rows[-1]
    for job, by_size in results.items() if len(args.rows) > 1 else ():
        print(
            f"{job:9s} peak ratio for {large / small:.0f}x the rows: "
            + "  ".join(
                f"{k} {by_size[large][k] / max(by_size[small][k], 1e-9):.2f}" for k in PEAKS + ("jvm_live_heap",)
            )
        )


if __name__ == "__main__":
    main()
