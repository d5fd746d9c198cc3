"""Nightly run records: every run (published, noop, rejected, failed, rolled back) as
``runs_dir/<run_id>.json`` (through :mod:`anisotropy_core.storage`, so any path or URI) and one appended row
of the Delta ``runs_table``: the recommendation, what was applied, counts, metrics, stage timings, and (with an
``evaluation:`` block) every candidate's scores, the chosen one, raw and the quality gate (``evaluation``)."""
from __future__ import annotations

import datetime
import json
import math
import uuid
from typing import Any

from pyspark.sql import SparkSession

from anisotropy_core import storage
from anisotropy_spark.publish import is_delta_conflict
from jobs.nightly_config import NightlyConfig, nightly_config_hash

RUNS_SCHEMA = ("run_id string, started_at timestamp, finished_at timestamp, status string, mode string, "
               "reason string, input_path string, input_version long, output_path string, output_version long, "
               "method_recommended string, method_applied string, transform_version string, evaluation string, "
               "record string")
APPEND_ATTEMPTS = 3


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def new_record(config: NightlyConfig) -> dict[str, Any]:
    """The JSON-ready record of a run that is starting."""
    return {"run_id": uuid.uuid4().hex, "started_at": now(), "status": "running", "mode": None, "reason": None,
            "config_hash": nightly_config_hash(config), "input": {"path": config.input, "version": None},
            "output": {"path": config.output}, "counts": {}, "recommendation": None, "applied": None, "stages": []}


def json_safe(value: Any) -> Any:
    """``value`` with every NaN/Inf float (an undefined metric) replaced by None, so the record is valid JSON."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_record(spark: SparkSession, config: NightlyConfig, rec: dict) -> None:
    """The run record as ``runs_dir/<run_id>.json`` and one appended row of the Delta ``runs_table``."""
    rec["finished_at"] = now()
    rec = json_safe(rec)
    text = json.dumps(rec, indent=2, sort_keys=True, default=str, allow_nan=False)
    storage.write_atomic(storage.join(config.runs_dir, f"{rec['run_id']}.json"), text)
    if not config.runs_table:
        return
    stamp = datetime.datetime.fromisoformat
    row = (rec["run_id"], stamp(rec["started_at"]), stamp(rec["finished_at"]), rec["status"], rec["mode"],
           rec["reason"], rec["input"]["path"], rec["input"]["version"], rec["output"]["path"],
           rec["output"].get("version"), (rec["recommendation"] or {}).get("method"),
           (rec["applied"] or {}).get("method"), (rec["applied"] or {}).get("transform_version"),
           json.dumps(rec["evaluation"], sort_keys=True) if rec.get("evaluation") else None, text)
    for attempt in range(APPEND_ATTEMPTS):   # blind appends conflict only while two runs create the table at once
        try:
            (spark.createDataFrame([row], RUNS_SCHEMA).write.format("delta").mode("append")
             .option("mergeSchema", "true").save(config.runs_table))
            return
        except Exception as exc:  # noqa: BLE001
            if attempt == APPEND_ATTEMPTS - 1 or not is_delta_conflict(exc):
                raise
