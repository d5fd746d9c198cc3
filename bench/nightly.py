"""The nightly rebuild against the apply job and the I/O floor, side by side in one process (issue 46).

    .venv/bin/python -m bench.nightly [--rows 1000000 --dim 384 | --corpus DELTA] [--repeats 1] [--cli] [--record]

On a float32 (id, vector) Delta table (generated narrow-cone corpus, or ``--corpus``), with an ABTT D = 4 artifact
fitted from the table's moments (untimed), each round times, in one Spark session (``local[2]``):

* ``floor``       — a plain Delta read + write of the table (the I/O floor);
* ``apply``       — the apply job (:func:`jobs.apply.run_apply`) with that artifact: read, validate, transform, write;
* ``nightly``     — the nightly job from scratch (:func:`jobs.nightly.run_recorded`, ``--method abtt --abtt-D 4``, no
  evaluation block, so label-free: the neighbour-overlap check runs; ``min_neighbour_overlap: 0`` because the
  generated cone's neighbours are its noise, which ABTT is meant to change): a full rebuild, gate before commit;
* ``incremental`` — after ``--append-fraction`` (1 %) new rows are appended to the input (untimed), the nightly
  again: the transform reused, only the new rows transformed and merged.

One warm-up round (JIT, Python workers, file cache) precedes ``--repeats`` timed rounds; the best round of each is
reported with the ratios nightly / apply (target ≤ 1.5), nightly / floor, incremental / nightly (target ≤ 0.25),
each stage's seconds from the run record, and the peak resident memory per process kind (driver Python, JVM,
Python workers) during each timed call. ``--cli`` also times the two user commands, JVM start included:
``anisotropy apply`` against ``anisotropy nightly --method abtt --abtt-D 4`` (target ≤ 1.5). ``--record`` appends
the run to ``bench/results/nightly.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import yaml
from delta.tables import DeltaTable

from anisotropy_core.artifact import save_artifact
from anisotropy_core.methods import Method
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import fit
from anisotropy_spark.session import get_spark
from bench.common import PeakMemory, add_corpus_arguments, append_result, corpus, parquet_moments
from jobs import apply as apply_job
from jobs import nightly as nightly_job
from jobs.config import parse_args

ROOT = pathlib.Path(__file__).resolve().parent.parent
D = 4


def nightly_conf(work: pathlib.Path, source: str, output: str) -> pathlib.Path:
    """conf/nightly.yaml pointed at ``source``/``output`` and a scratch directory; method abtt, D = 4."""
    conf = yaml.safe_load((ROOT / "conf" / "nightly.yaml").read_text())
    conf.update(
        input=source,
        output=output,
        metadata_cols=[],
        method=Method.ABTT.value,
        abtt_D=D,
        min_neighbour_overlap=0.0,
        quarantine_path=str(work / "quarantine"),
        artifacts_dir=str(work / "transforms"),
        runs_dir=str(work / "runs"),
        runs_table=str(work / "runs_table"),
        index=None,
    )
    path = work / "nightly.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


def apply_conf(work: pathlib.Path, source: str, artifact: str, output: str) -> pathlib.Path:
    conf = yaml.safe_load((ROOT / "conf" / "apply.yaml").read_text())
    conf.update(input=source, artifact=artifact, output=output, quarantine_path=str(work / "apply_quarantine"))
    path = work / "apply.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_arguments(parser, rows=1_000_000, dim=384)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--append-fraction", type=float, default=0.01)
    parser.add_argument("--cli", action="store_true", help="also time the apply and nightly commands, JVM included")
    parser.add_argument("--record", action="store_true", help="append the run to bench/results/nightly.json")
    parser.add_argument("--tmp", default=None, help="directory for the generated tables (default: system temp)")
    args = parser.parse_args()
    spark = get_spark("bench-nightly", master="local[2]")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        work = pathlib.Path(tmp)
        found, X = corpus(args, work / "parquet", spark)
        source = str(work / "input")
        found.read(spark).write.format("delta").save(source)  # the nightly appends to its input
        state = Moments.of_batch(X) if X is not None else parquet_moments(found.files, args.dim)
        artifact = str(work / "artifact")
        save_artifact(artifact, fit(Method.ABTT, state, D=D), n=args.rows)
        extra = spark.read.format("delta").load(source).limit(max(1, int(args.rows * args.append_fraction)))
        extra = extra.selectExpr(f"id + {10 * args.rows} AS id", "vector").toArrow()  # new ids, untimed
        outputs = {name: str(work / name) for name in ("floor", "applied", "nightly_out")}
        conf = nightly_conf(work, source, outputs["nightly_out"])
        apply_config, _ = parse_args(
            apply_job.ApplyConfig, ["--conf", str(apply_conf(work, source, artifact, outputs["applied"]))], ""
        )
        night_config, _ = nightly_job.parse_cli(["--conf", str(conf)])

        def reset() -> None:
            for path in list(outputs.values()) + [str(work / d) for d in ("runs", "runs_table", "transforms")]:
                shutil.rmtree(path, ignore_errors=True)
            table = DeltaTable.forPath(spark, source)
            if table.history(1).first()["version"] > 0:
                table.restoreToVersion(0)

        def floor():
            spark.read.format("delta").load(source).write.format("delta").mode("overwrite").save(outputs["floor"])

        def night(expected_mode: str):
            record, code = nightly_job.run_recorded(spark, night_config)
            if code != 0 or record.mode != expected_mode:
                raise SystemExit(
                    f"nightly: exit {code}, mode {record.mode} (expected {expected_mode}): {record.reason}"
                )
            return record

        rounds = []
        for number in range(args.repeats + 1):
            reset()
            seconds, memory, stages = {}, {}, {}
            for name, call in (
                ("floor", floor),
                ("apply", lambda: apply_job.run_apply(spark, apply_config)),
                ("nightly", lambda: night("full")),
            ):
                with PeakMemory() as peak:
                    start = time.perf_counter()
                    answer = call()
                    seconds[name] = time.perf_counter() - start
                memory[name] = peak.peaks
                if name == "nightly":
                    stages["nightly"] = {s["name"]: s["seconds"] for s in answer.stages}
            spark.createDataFrame(extra).write.format("delta").mode("append").save(source)
            with PeakMemory() as peak:
                start = time.perf_counter()
                answer = night("incremental")
                seconds["incremental"] = time.perf_counter() - start
            memory["incremental"] = peak.peaks
            stages["incremental"] = {s["name"]: s["seconds"] for s in answer.stages}
            label = "warm-up" if number == 0 else f"round {number}"
            print(f"{label}: " + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items()), flush=True)
            if number:
                rounds.append({"seconds": seconds, "memory_mb": memory, "stages": stages})
        best = {name: min(r["seconds"][name] for r in rounds) for name in rounds[0]["seconds"]}
        ratios = {
            "nightly/apply": best["nightly"] / best["apply"],
            "nightly/floor": best["nightly"] / best["floor"],
            "apply/floor": best["apply"] / best["floor"],
            "incremental/nightly": best["incremental"] / best["nightly"],
        }
        summary = {"rows": args.rows, "dim": args.dim, "best": best, "ratios": ratios, "rounds": rounds}
        if args.cli:
            summary["cli"] = cli_times(work, conf, apply_conf(work, source, artifact, outputs["applied"]), reset)
            ratios["cli nightly/apply"] = summary["cli"]["nightly"] / summary["cli"]["apply"]
        report(summary)
        if args.record:
            record(summary)


def cli_times(work: pathlib.Path, conf: pathlib.Path, apply_yaml: pathlib.Path, reset) -> dict:
    """Wall seconds of ``anisotropy apply`` and ``anisotropy nightly --method abtt --abtt-D 4``, each one command
    with its own JVM, on fresh outputs (the input back at version 0)."""
    tool = str(pathlib.Path(sys.executable).parent / "anisotropy")
    times = {}
    for name, argv in (
        ("apply", [tool, "apply", "--conf", str(apply_yaml)]),
        ("nightly", [tool, "nightly", "--conf", str(conf), "--method", "abtt", "--abtt-D", str(D)]),
    ):
        reset()
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        times[name] = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return times


def report(summary: dict) -> None:
    best, ratios = summary["best"], summary["ratios"]
    print(f"nightly bench {summary['rows']:,} × {summary['dim']} float32, best of {len(summary['rounds'])} round(s)")
    for name, seconds in best.items():
        print(f"  {name:12s} {seconds:8.2f} s")
    targets = {"nightly/apply": 1.5, "incremental/nightly": 0.25, "cli nightly/apply": 1.5}
    for name, ratio in ratios.items():
        target = targets.get(name)
        verdict = "" if target is None else f"  target ≤ {target}: {'met' if ratio <= target else 'NOT met'}"
        print(f"  {name:20s} {ratio:5.2f}×{verdict}")
    best_round = min(summary["rounds"], key=lambda r: r["seconds"]["nightly"])
    print("  nightly stages (s): " + json.dumps(best_round["stages"]["nightly"]))
    print("  incremental stages (s): " + json.dumps(best_round["stages"]["incremental"]))
    print("  peak RSS MiB per process kind: " + json.dumps(best_round["memory_mb"]))
    if "cli" in summary:
        print("  commands (JVM start included): " + ", ".join(f"{k} {v:.2f} s" for k, v in summary["cli"].items()))


def record(summary: dict) -> None:
    """Append the run as a row of ``bench/results/nightly.json``."""
    best, ratios = summary["best"], summary["ratios"]
    best_round = min(summary["rounds"], key=lambda r: r["seconds"]["nightly"])
    figures = (
        f"floor {best['floor']:.2f} s, apply {best['apply']:.2f} s, nightly {best['nightly']:.2f} s, "
        f"incremental {best['incremental']:.2f} s; **nightly/apply {ratios['nightly/apply']:.2f}×** "
        f"({'met' if ratios['nightly/apply'] <= 1.5 else 'not met'}), nightly/floor {ratios['nightly/floor']:.2f}×, "
        f"**incremental/nightly {ratios['incremental/nightly']:.2f}×** "
        f"({'met' if ratios['incremental/nightly'] <= 0.25 else 'not met'})"
    )
    if "cli" in summary:
        figures += (
            f"; commands: apply {summary['cli']['apply']:.2f} s, nightly {summary['cli']['nightly']:.2f} s, "
            f"**{ratios['cli nightly/apply']:.2f}×** ({'met' if ratios['cli nightly/apply'] <= 1.5 else 'not met'})"
        )
    figures += (
        "; nightly stages "
        + ", ".join(f"{k} {v:.1f}" for k, v in best_round["stages"]["nightly"].items())
        + " s; peak RSS MiB "
        + json.dumps(best_round["memory_mb"]["nightly"])
    )
    append_result(
        "nightly.json",
        {
            "title": "Nightly rebuild (`bench.nightly`)",
            "order": 7,
            "intro": [
                "The nightly job (full rebuild from scratch, then an incremental night after 1 % of rows are "
                "appended) against the apply job and a plain Delta read + write, side by side in one process. "
                "Targets (issue 46): full rebuild ≤ 1.5× the apply job, incremental ≤ 0.25× the full rebuild, and "
                "the two commands (JVM start included) ≤ 1.5×. Measured on the shared 2-core development host: "
                "only ratios mean anything."
            ],
            "command": ".venv/bin/python -m bench.nightly --rows 1000000 --dim 384 --cli --record",
        },
        f"{summary['rows']:,} × {summary['dim']} float32",
        figures,
        f"best of {len(summary['rounds'])} round(s)",
    )


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
