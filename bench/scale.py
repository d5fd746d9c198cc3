"""Peak resident memory of a job at two table sizes: it must stay flat in n (memory bounded by design).

    .venv/bin/python -m bench.memory [--rows 100000 400000] [--dim 384] [--job diagnose|apply] [--tmp DIR]

For each size it writes a float32 Parquet corpus, runs the job as a subprocess with the embedded default
session (no Spark flags), and samples every 0.2 s the RSS of the process tree: the driver JVM (``java``),
the Python driver (the job process) and the executor Python workers (every other python process, summed).
Prints one line per size with the peaks and the ratio of the larger size's peaks to the smaller's.
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

import psutil

from anisotropy_core.artifact import save_artifact
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import fit
from bench.common import write_parquet_corpus

SAMPLE_SECONDS = 0.2


def peak_rss(command: list[str]) -> dict[str, float]:
    """Run ``command``; return peak RSS in MiB of {"jvm", "python_driver", "python_workers"} and seconds."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver = psutil.Process(process.pid)
    peaks = {"jvm": 0.0, "python_driver": 0.0, "python_workers": 0.0}
    start = time.perf_counter()
    while process.poll() is None:
        try:
            children = driver.children(recursive=True)
            current = {"jvm": 0.0, "python_driver": driver.memory_info().rss, "python_workers": 0.0}
            for child in children:
                kind = "jvm" if "java" in child.name() else "python_workers"
                current[kind] += child.memory_info().rss
        except psutil.Error:
            pass
        else:
            peaks = {k: max(peaks[k], current[k] / (1 << 20)) for k in peaks}
        time.sleep(SAMPLE_SECONDS)
    if process.returncode:
        raise RuntimeError(f"{' '.join(command)} exited {process.returncode}")
    return {**peaks, "seconds": time.perf_counter() - start}


def job_command(job: str, corpus: pathlib.Path, root: pathlib.Path, rows: int, dim: int) -> list[str]:
    base = [sys.executable, "-m", f"jobs.{job}", "--input", str(corpus)]
    if job == "diagnose":
        return base + ["--metadata-cols", "[]", "--clusters", "null", "--on-invalid", "error",
                       "--metrics-table", "null", "--output-dir", str(root / "report")]
    X = Moments.of_batch(write_parquet_corpus(root / "fit", 2000, dim, files=1))
    save_artifact(str(root / "artifact"), fit("center", X), n=2000)
    return base + ["--artifact", str(root / "artifact"), "--output", str(root / "out"), "--on-invalid", "error"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs=2, default=[100_000, 400_000])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--job", choices=["diagnose", "apply"], default="diagnose")
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    results = {}
    for rows in args.rows:
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            root = pathlib.Path(tmp)
            write_parquet_corpus(root / "corpus", rows, args.dim)
            results[rows] = peak_rss(job_command(args.job, root / "corpus", root, rows, args.dim))
        r = results[rows]
        print(f"{args.job} {rows:>10,} x {args.dim}: peak RSS jvm {r['jvm']:7.0f} MiB  python driver "
              f"{r['python_driver']:6.0f} MiB  python workers {r['python_workers']:6.0f} MiB  ({r['seconds']:.1f} s)")
    small, large = (results[n] for n in args.rows)
    print(f"ratio of peaks for {args.rows[1] / args.rows[0]:.0f}x the rows: " + "  ".join(
        f"{k} {large[k] / max(small[k], 1e-9):.2f}" for k in ("jvm", "python_driver", "python_workers")))


if __name__ == "__main__":
    main()
