"""Vacuum: delete the data files the nightly's Delta tables no longer reference, with Delta's own VACUUM.

    anisotropy vacuum --conf conf/nightly.yaml [--retain-hours H] [--allow-short-retention]
    python -m jobs.vacuum --conf conf/nightly.yaml --retain-hours 168

Which files: those of the ``output``, ``quarantine_path`` and ``runs_table`` tables (each one that exists) that no
version younger than the retention references: the files a full rebuild replaced, and the files a killed run
wrote but never committed. Delta's ``DeltaTable.vacuum`` deletes them; this job deletes nothing itself.

Retention: ``--retain-hours`` (default: each table's own ``delta.deletedFileRetentionDuration``, Delta's default
168 h). Below :data:`DEFAULT_RETENTION_HOURS` the job refuses (exit 2) unless ``--allow-short-retention`` is given,
because a shorter retention deletes files that a run in progress has written but not yet committed (its commit
would then name missing files) and the files of the versions a reader, an incremental run or ``--rollback-to``
still needs. With the flag Delta's retention check is switched off for these commands only. A table whose own
retention is longer than ``--retain-hours`` is refused by Delta itself (exit 2, Delta's reason).

Each VACUUM adds two commits (``VACUUM START``, ``VACUUM END``) to the table; the nightly does not count them as
a change of the output (:func:`anisotropy_spark.publish.output_state`), but a nightly publishing while a vacuum
commits loses its publish (exit 4; the next night publishes). Prints one JSON summary per table: the files and
bytes Delta deleted (from those commits' metrics).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from delta.tables import DeltaTable
from pyspark.errors import IllegalArgumentException
from pyspark.sql import SparkSession

from anisotropy_spark.io import is_delta_table
from anisotropy_spark.session import get_spark, session_conf
from jobs.cli import run
from jobs.config import ConfigError, parse_args
from jobs.nightly_config import NightlyConfig

log = logging.getLogger("anisotropy.vacuum")
DEFAULT_RETENTION_HOURS = 168.0  # Delta's default delta.deletedFileRetentionDuration (7 days)
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"


def check_retention(retain_hours: float | None, allow_short: bool) -> None:
    """Raise :class:`ConfigError` for a retention below :data:`DEFAULT_RETENTION_HOURS` without ``allow_short``."""
    if retain_hours is None:
        return
    if retain_hours < 0:
        raise ConfigError(f"--retain-hours must be >= 0, got {retain_hours:g}")
    if retain_hours < DEFAULT_RETENTION_HOURS and not allow_short:
        raise ConfigError(
            f"--retain-hours {retain_hours:g} is below Delta's default retention of {DEFAULT_RETENTION_HOURS:g} h: it "
            "would delete data files a run in progress has written but not committed yet (corrupting its commit) and "
            "the files of versions readers, incremental runs and --rollback-to still use; pass "
            "--allow-short-retention only when no job writes or reads these tables"
        )


def vacuum_table(spark: SparkSession, path: str, retain_hours: float | None, allow_short: bool) -> dict:
    """VACUUM the Delta table ``path`` (Delta's retention check on unless ``allow_short``); returns {path,
    status (vacuumed | skipped), files_deleted, bytes_deleted} (None where Delta logged no metrics)."""
    if not is_delta_table(spark, path):
        return {"path": path, "status": "skipped", "reason": "not a Delta table"}
    table = DeltaTable.forPath(spark, path)
    settings = {RETENTION_CHECK: "false"} if allow_short else {}
    try:
        with session_conf(spark, settings):
            table.vacuum(retain_hours)
    except IllegalArgumentException as exc:  # Delta's retention check: shorter than the table's own retention
        raise ConfigError(
            f"{path}: Delta refused --retain-hours {retain_hours:g}: {str(exc).strip().splitlines()[0]}"
        ) from None
    metrics = {
        r["operation"]: r["operationMetrics"] or {}
        for r in table.history(2).select("operation", "operationMetrics").collect()
    }
    deleted = metrics.get("VACUUM END", {}).get("numDeletedFiles")
    size = metrics.get("VACUUM START", {}).get("sizeOfDataToDelete")
    return {
        "path": path,
        "status": "vacuumed",
        "retain_hours": retain_hours,
        "files_deleted": None if deleted is None else int(deleted),
        "bytes_deleted": None if size is None else int(size),
    }


def run_vacuum(
    spark: SparkSession, config: NightlyConfig, retain_hours: float | None, allow_short: bool = False
) -> list[dict]:
    """:func:`vacuum_table` of the nightly's output, quarantine and runs tables (those configured)."""
    check_retention(retain_hours, allow_short)
    paths = [p for p in (config.output, config.quarantine_path, config.runs_table) if p]
    return [vacuum_table(spark, path, retain_hours, allow_short) for path in paths]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--retain-hours",
        type=float,
        default=None,
        metavar="H",
        help="keep unreferenced files younger than H hours (default: each table's own retention, 168)",
    )
    flags.add_argument(
        "--allow-short-retention",
        action="store_true",
        help=f"allow --retain-hours below {DEFAULT_RETENTION_HOURS:g} (no job may use the tables)",
    )
    config, args = parse_args(
        NightlyConfig, argv, "VACUUM the nightly's Delta tables (output, quarantine, runs)", flags
    )
    check_retention(args.retain_hours, args.allow_short_retention)
    spark = get_spark("anisotropy-vacuum", master=config.master)
    for summary in run_vacuum(spark, config, args.retain_hours, args.allow_short_retention):
        log.info("%s: %s", summary["path"], summary["status"])
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
