"""One way to get a Delta-enabled SparkSession, embedded or on a cluster.

* Under ``spark-submit`` (a session already configured with Delta via ``--packages`` / ``--jars``)
  :func:`get_spark` just returns the active session: nothing is overridden.
* Embedded (plain ``python -m jobs.…``): it builds a ``local[*]`` session (or ``master``) with the Delta
  jars fetched by ``make setup`` into ``.jars/`` so no network is needed at run time. Its driver heap is
  sized from the machine (:func:`default_driver_memory`: a quarter of physical memory, 1–16 GiB) unless
  ``spark.driver.memory`` is given (``extra_conf``, ``--driver-memory`` in ``PYSPARK_SUBMIT_ARGS``).

Every session bounds the Arrow batches handed to Python workers by bytes as well as rows
(``spark.sql.execution.arrow.maxBytesPerBatch``, which Spark 4 applies to ``mapInArrow``), so a worker's
memory depends on the batch budget, never on the number of rows or, beyond the budget, on d. The budget,
:data:`ARROW_BATCH_BYTES` = 8 MiB (5,461 rows of 384 float32, where Spark's 10,000-row default makes 15 MB
batches), keeps the few batches each task has in flight (being filled by the JVM, in the worker, being copied
back into rows) closer to the size of a CPU's last-level cache, which makes the JVM → Python → JVM round trip
cheaper than with larger batches (docs/design.md, timings in bench/RESULTS.md).

An embedded session starts its JVMs with Arrow Java's two documented speed switches
(:data:`ARROW_JAVA_OPTIONS`), as Apache Iceberg's vectorized Spark reader also sets them: no bounds check on
each Arrow buffer access and no null check inside Arrow's ``get`` (Spark checks ``isNullAt`` before every read).
Spark's JVM ↔ Python transfer writes and reads every vector element through them, so the checks are paid per
element of every batch (docs/design.md). The Arrow data these JVMs handle comes from Spark itself and from this package's Python
workers; Arrow's documentation warns against reading untrusted Arrow data without bounds checks. Options the
caller passes in ``extra_conf`` come after them, so ``-Darrow.enable_unsafe_memory_access=false`` there turns
the check back on. Under spark-submit nothing is added: pass them in ``--driver-java-options`` and
``spark.executor.extraJavaOptions`` there.

An embedded session also starts its JVMs with :data:`JIT_JAVA_OPTIONS`: HotSpot keeps compiling hot methods with
profiling (its tier 3) however long the queue of its optimising compiler (C2) grows. By default, beyond 5 queued C2
compiles per compiler thread it compiles them at tier 2, which records no receiver types (``-XX:Tier3DelayOn``).
On a machine with few cores that queue is long while Spark starts, and C2 may then compile the loop in which Spark
copies every vector element from its columnar batches into rows (``ColumnarArray.getFloat``) with a virtual call
per element (``-XX:+PrintInlining``: ``ColumnVector::getFloat virtual call``); that JVM's scans into the Python
workers then stay slower for its whole life. With the option C2 always has the receiver-type profile, and a plain
Delta copy or a JVM's first query is not slower (docs/design.md, timings in bench/RESULTS.md). Options in
``extra_conf`` come after it, so ``-XX:Tier3DelayOn=5`` there restores HotSpot's default; under spark-submit it
is not added.

An embedded ``local`` session also reads a Delta table's log state in one partition per local core, at most
Delta's default of 50 (``spark.databricks.delta.snapshotPartitions``): on one machine, 50 tiny tasks before every
query of a table cost more than they parallelise.

Spark logs at WARN (no query-plan dumps), and Spark's console progress bar for long stages is
on only when stderr is a terminal. py4j's Python logger is held at WARN too (:func:`quiet_py4j`): at INFO its
``Closing down clientserver connection`` line, logged when the interpreter exits, would follow a job's error on
stderr, whose last line must name the problem.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import re
import sys
from typing import Iterator

from pyspark import TaskContext
from pyspark.sql import SparkSession

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
LOG_LEVEL = "WARN"
DELTA_MAVEN_COORDINATE = "io.delta:delta-spark_2.13:4.0.0"
DELTA_SNAPSHOT_PARTITIONS = 50  # Delta's own default, kept as the ceiling for a local session
ARROW_BATCH_BYTES = 8 << 20  # per Arrow batch sent to a Python worker (module docstring)
DRIVER_MEMORY_FRACTION = 0.25
DRIVER_MEMORY_MIN_MB, DRIVER_MEMORY_MAX_MB = 1024, 16384
ARROW_JAVA_OPTIONS = "-Darrow.enable_unsafe_memory_access=true -Darrow.enable_null_check_for_get=false"
JIT_JAVA_OPTIONS = "-XX:Tier3DelayOn=100000"  # never fall back to unprofiled tier-2 code (module docstring)
EMBEDDED_JAVA_OPTIONS = f"{ARROW_JAVA_OPTIONS} {JIT_JAVA_OPTIONS}"
JAVA_OPTIONS_KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
JAR_DIR = pathlib.Path(os.environ.get("ANISOTROPY_JAR_DIR", pathlib.Path(__file__).resolve().parent.parent / ".jars"))


def delta_jars() -> list[str]:
    """Paths of the locally cached Delta jars; raises with the fix if ``make setup`` has not run."""
    jars = sorted(str(p) for p in JAR_DIR.glob("delta-*.jar"))
    if len(jars) < 2:
        raise RuntimeError(
            f"Delta jars not found in {JAR_DIR}: run `make setup` (or pass "
            f"--packages {DELTA_MAVEN_COORDINATE} to spark-submit)"
        )
    return jars


def get_spark(
    app_name: str = "anisotropy", master: str | None = None, extra_conf: dict[str, str] | None = None
) -> SparkSession:
    """Return the active Delta-enabled session, or build an embedded one.

    ``master``: Spark master URL for an embedded session (default ``local[*]``); ignored under
    spark-submit (its ``--master`` decides) and when a session is already active. ``extra_conf``:
    additional Spark settings for a new session.
    """
    quiet_py4j()
    active = SparkSession.getActiveSession()
    if active is not None:
        active.sparkContext.setLogLevel(LOG_LEVEL)
        return active
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.extensions", DELTA_EXTENSION)
        .config("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
        .config("spark.sql.execution.arrow.maxBytesPerBatch", str(ARROW_BATCH_BYTES))
    )
    conf = dict(extra_conf or {})
    if not _launched_by_spark_submit():
        # embedded: Python workers run this interpreter (its numpy/pyarrow), the Delta jars come from .jars/;
        # under spark-submit its --master and --packages/--jars decide and are never overridden
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        master = master or os.environ.get("ANISOTROPY_SPARK_MASTER", "local[*]")
        builder = builder.master(master).config("spark.jars", ",".join(delta_jars()))
        partitions = snapshot_partitions(master)
        if partitions:
            builder = builder.config("spark.databricks.delta.snapshotPartitions", str(partitions))
        if not _driver_memory_given(extra_conf):
            builder = builder.config("spark.driver.memory", default_driver_memory())
        conf.update(embedded_java_options(extra_conf))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(LOG_LEVEL)
    return spark


def quiet_py4j() -> None:
    """Log py4j's records at WARN and above only (its INFO lines are connection bookkeeping)."""
    logging.getLogger("py4j").setLevel(logging.WARNING)


def embedded_java_options(extra_conf: dict[str, str] | None) -> dict[str, str]:
    """Driver and executor JVM options of an embedded session: :data:`EMBEDDED_JAVA_OPTIONS` (Arrow's and the
    JIT's), then the caller's own for the same key in ``extra_conf``."""
    given = extra_conf or {}
    return {key: " ".join(filter(None, [EMBEDDED_JAVA_OPTIONS, given.get(key)])) for key in JAVA_OPTIONS_KEYS}


def conf_int(spark: SparkSession, key: str, default: int) -> int:
    """The session conf ``key`` as an int, ``default`` when it is unset."""
    value = spark.conf.get(key, None)
    return default if value is None else int(value)


def task_partition() -> int:
    """The partition index of the Spark task running this code (in a task's Python worker only)."""
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("task_partition() outside a Spark task")
    return context.partitionId()


def local_cores(master: str | None) -> int | None:
    """Worker threads of a ``local``, ``local[N]``, ``local[*]`` or ``local[N, F]`` master URL (``*``: this
    machine's CPUs); None for any other master, or none."""
    if master is None:
        return None
    if master == "local":
        return 1
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master)
    if match is None:
        return None
    return (os.cpu_count() or 1) if match.group(1) == "*" else int(match.group(1))


def snapshot_partitions(master: str) -> int | None:
    """Partitions for a Delta table's log state in a session on ``master``: one per local core, at most Delta's
    default of 50 (sized for clusters: 50 tasks on every query of a table); None (Delta's own) off ``local``."""
    cores = local_cores(master)
    return None if cores is None else min(cores, DELTA_SNAPSHOT_PARTITIONS)


def default_driver_memory() -> str:
    """Driver heap for an embedded session: ``DRIVER_MEMORY_FRACTION`` of physical memory, clamped to
    [1, 16] GiB (the driver only merges d×d states and samples; the rows stay in the tasks)."""
    physical_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    size = int(physical_mb * DRIVER_MEMORY_FRACTION)
    return f"{min(max(size, DRIVER_MEMORY_MIN_MB), DRIVER_MEMORY_MAX_MB)}m"


def _driver_memory_given(extra_conf: dict[str, str] | None) -> bool:
    """True when the caller set the driver heap: ``extra_conf`` or ``--driver-memory`` / ``--conf
    spark.driver.memory`` in ``PYSPARK_SUBMIT_ARGS``."""
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    return (
        "spark.driver.memory" in (extra_conf or {})
        or "--driver-memory" in submit_args
        or "spark.driver.memory" in submit_args
    )


def _launched_by_spark_submit() -> bool:
    """True when a JVM gateway was started by spark-submit (it sets PYSPARK_GATEWAY_PORT)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


@contextlib.contextmanager
def session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """Set session confs for the queries or the one Delta commit run inside the block (userMetadata, idempotent-DML
    txn ids, schema auto-merge, split sizes); afterwards each key gets back the value it had (or is unset)."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)
