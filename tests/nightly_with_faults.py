"""The nightly job with injected faults: a TEST-ONLY entry point (``python tests/nightly_with_faults.py`` or
``spark-submit tests/nightly_with_faults.py``, same flags as ``jobs/nightly.py``). Production code has no fault
hooks: this script wraps stages of :data:`jobs.nightly_stages.STAGES`, chosen by environment variables:

``FAIL_TASK_ONCE=DIR`` — the first attempt of partition 0 of the output pass (the full rebuild's one pass before
its write, in the ``diagnose_output`` stage, read through Spark's scan here) writes ``DIR/failed-once`` and raises
(Spark must retry it; since issue 46 the gate reads no rows: it decides on that pass's facts); ``FAIL_AFTER_STAGE=NAME`` — ``os._exit(137)`` right after stage NAME (a kill);
``PUBLISH_BARRIER=DIR:N`` — wait before publishing until N runs have reached that point (forces a race).
"""

import logging
import os
import sys
import time
import uuid
from typing import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
from pyspark import TaskContext  # noqa: E402
from pyspark.sql import DataFrame  # noqa: E402

from jobs import cli, nightly, nightly_stages  # noqa: E402

BARRIER_SECONDS = 300


def fail_task_once(df: DataFrame, marker_dir: str) -> DataFrame:
    """``df`` unchanged, except that the first attempt of partition 0 writes a marker and raises in the task."""

    def passthrough(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            with open(os.path.join(marker_dir, "failed-once"), "a", encoding="utf-8") as handle:
                handle.write(f"stage {ctx.stageId()} partition 0 attempt 0\n")
            raise RuntimeError("FAIL_TASK_ONCE: injected failure of the first task attempt")
        yield from batches

    return df.mapInArrow(passthrough, df.schema)


def failing_output_pass(stage, marker_dir):
    def run(ctx, info):
        table = ctx.table
        source, files = table.input_df, table.files
        table.input_df, table.files = fail_task_once(source, marker_dir), None
        try:
            stage(ctx, info)
        finally:
            table.input_df, table.files = source, files

    return run


def killed_after(stage, name):
    def run(ctx, info):
        stage(ctx, info)
        logging.getLogger("anisotropy.nightly").error("FAIL_AFTER_STAGE=%s: simulating a kill (exit 137)", name)
        logging.shutdown()
        os._exit(137)

    return run


def behind_barrier(stage, spec):
    folder, count = spec.rsplit(":", 1)

    def run(ctx, info):
        with open(os.path.join(folder, uuid.uuid4().hex), "w", encoding="utf-8"):
            pass
        deadline = time.time() + BARRIER_SECONDS
        while len(os.listdir(folder)) < int(count) and time.time() < deadline:
            time.sleep(0.2)
        stage(ctx, info)

    return run


def with_faults(stages):
    wrapped = []
    for name, stage in stages:
        if name == "diagnose_output" and os.environ.get("FAIL_TASK_ONCE"):
            stage = failing_output_pass(stage, os.environ["FAIL_TASK_ONCE"])
        if name == "publish" and os.environ.get("PUBLISH_BARRIER"):
            stage = behind_barrier(stage, os.environ["PUBLISH_BARRIER"])
        if name == os.environ.get("FAIL_AFTER_STAGE"):
            stage = killed_after(stage, name)
        wrapped.append((name, stage))
    return tuple(wrapped)


if __name__ == "__main__":
    nightly_stages.STAGES = with_faults(nightly_stages.STAGES)
    sys.exit(cli.run(nightly.main))
