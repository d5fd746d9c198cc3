"""Nightly rebuild: read → validate → diagnose → decide → fit (or reuse) → apply → diagnose output → gate →
publish, one command. The stages are :mod:`jobs.nightly_stages`; this module runs them and records the run.

    anisotropy nightly --conf conf/nightly.yaml [--key-name VALUE ...] [--rollback-to VERSION]
    python -m jobs.nightly --conf conf/nightly.yaml
    spark-submit --jars "$(ls .jars/*.jar | paste -sd,)" jobs/nightly.py --conf conf/nightly.yaml

Modules: settings :mod:`jobs.nightly_config`; fit-or-reuse :mod:`jobs.fit_or_reuse`; gate :mod:`jobs.gate`;
run records :mod:`jobs.run_records`; Delta state, publish and conflicts :mod:`anisotropy_spark.publish`.
Every run writes its record (:mod:`jobs.run_records`) before its first stage (status ``started``) and when it
ends; an earlier run that never ended is marked ``killed`` then. A run the gate refuses marks the fit it saved
``rejected`` (:func:`jobs.nightly_stages.reject_fit`).
Exit codes: 0 published / no-op / kept / rolled back; 2 config error; 3 gate rejected; 4 lost a concurrent
publish; 5 invalid input rows (``on_invalid: error``); 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import SparkSession

from anisotropy_spark.publish import meta_at, output_state, restore
from anisotropy_spark.session import get_spark
from jobs import nightly_stages
from jobs.cli import EXIT, classify, describe, run
from jobs.config import ConfigError, parse_args
from jobs.gate import GateError
from jobs.nightly_config import NightlyConfig
from jobs.nightly_stages import NightlyContext
from jobs.run_records import RunRecord, new_record, start_record, write_record
from jobs.stage_log import timed_stage

log = logging.getLogger("anisotropy.nightly")


def run_nightly(spark: SparkSession, config: NightlyConfig, ctx: NightlyContext | None = None) -> RunRecord:
    """Run every stage of :data:`jobs.nightly_stages.STAGES` on one context; returns the run record (status
    ``published`` or ``noop``). Raises what a stage raises (the record says how far the run got)."""
    ctx = ctx or NightlyContext(spark, config, new_record(config))
    stages = nightly_stages.STAGES
    with ctx.cleanup:
        try:
            for position, (name, stage) in enumerate(stages, 1):
                with timed_stage(log, ctx.record.stages, name, f"{position}/{len(stages)}") as info:
                    stage(ctx, info)
                if ctx.finished:
                    log.info("no-op: %s", ctx.record.reason)
                    break
        except GateError as exc:
            nightly_stages.reject_fit(ctx, str(exc))
            raise
    return ctx.record


def rollback(spark: SparkSession, config: NightlyConfig, version: int, ctx: NightlyContext) -> RunRecord:
    """RESTORE the output to ``version`` (one commit recording the rollback and the restored publish)."""
    rec, state = ctx.record, output_state(spark, config.output)
    if state.version is None:
        raise ConfigError(f"--rollback-to: {config.output} is not a Delta table")
    if not 0 <= version < state.version:
        raise ConfigError(f"--rollback-to {version}: must be an earlier version, 0..{state.version - 1}")
    meta = {
        "rollback_to": version,
        "run_id": rec.run_id,
        "restored": meta_at(spark, config.output, version),
        "from_version": state.version,
    }
    with timed_stage(log, rec.stages, "rollback"):
        new_version = restore(spark, config.output, version, meta)
    rec.status, rec.mode = "rolled_back", "rollback"
    rec.reason = f"restored version {version} (was {state.version}) as version {new_version}"
    rec.output.previous_version, rec.output.version = state.version, new_version
    return rec


def parse_cli(argv: list[str] | None) -> tuple[NightlyConfig, int | None]:
    """``--rollback-to VERSION`` plus the config flags of :func:`jobs.config.parse_args`."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--rollback-to", type=int, default=None, metavar="VERSION")
    known, rest = pre.parse_known_args(argv)
    config, _ = parse_args(
        NightlyConfig,
        rest,
        "Nightly rebuild of the corrected embedding table (--rollback-to VERSION restores an earlier output version)",
    )
    return config, known.rollback_to


def run_recorded(spark: SparkSession, config: NightlyConfig, rollback_to: int | None = None) -> tuple[RunRecord, int]:
    """One nightly run (or a rollback) with its run records, as ``anisotropy nightly`` runs it: a ``started`` record
    first, the final record at the end (also of a refused or failed run). Returns (the record, the exit code);
    an unexpected error is re-raised after its ``failed`` record is written."""
    ctx = NightlyContext(spark, config, new_record(config))
    start_record(spark, config, ctx.record)
    try:
        record = (
            rollback(spark, config, rollback_to, ctx) if rollback_to is not None else run_nightly(spark, config, ctx)
        )
        status = record.status
    except Exception as exc:  # noqa: BLE001 — classified, recorded; anything unexpected re-raised after recording
        classified = classify(exc)
        if classified is None:
            ctx.record.status, ctx.record.reason = "failed", f"{type(exc).__name__}: {exc}"
            write_record(spark, config, ctx.record)
            raise
        status = classified
        ctx.record.reason = describe(exc)
    ctx.record.status = status
    write_record(spark, config, ctx.record)
    (log.info if EXIT[status] == 0 else log.error)("nightly %s: %s", status, ctx.record.reason or "")
    return ctx.record, EXIT[status]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        config, rollback_to = parse_cli(argv)
    except ConfigError as exc:
        log.error("config error: %s", exc)
        return EXIT["config_error"]
    spark = get_spark("anisotropy-nightly", master=config.master)
    record, code = run_recorded(spark, config, rollback_to)
    data = record.to_json()
    print(json.dumps({k: data[k] for k in ("run_id", "status", "mode", "reason", "input", "output")}, default=str))
    return code


if __name__ == "__main__":
    sys.exit(run(main))
