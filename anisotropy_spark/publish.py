"""A Delta output table as a publishing target: its state from the commit history, one-commit publish and
restore with job metadata, and Delta's optimistic-concurrency conflicts recognised by type.

Every publish is ONE Delta commit (overwrite, or MERGE of new rows on the id column) whose ``userMetadata``
holds the caller's JSON metadata (at least ``run_id`` and a publish sequence number ``seq``); it is also an
idempotent write (``txnAppId`` = the application id, ``txnVersion`` = ``seq``), so of two concurrent
publishers exactly one commits and the other gets :class:`ConcurrentPublishError`.

Conflicts: delta-spark 4.0.0's wheel lacks the Python ``delta.exceptions`` module (delta-io/delta#4755,
fixed in later releases), so :func:`is_delta_conflict` checks the Java exception itself with py4j's
``is_instance_of`` against ``io.delta.exceptions.DeltaConcurrentModificationException`` — the base class of
ConcurrentAppend/ConcurrentTransaction/ConcurrentWrite/ConcurrentDelete*/MetadataChanged/ProtocolChanged —
walking the cause chain. No message text is matched.
"""

from __future__ import annotations

import dataclasses
import json

from delta.tables import DeltaTable
from py4j.java_gateway import is_instance_of
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .io import is_delta_table, latest_delta_version
from .session import session_conf

DELTA_CONFLICT_CLASS = "io.delta.exceptions.DeltaConcurrentModificationException"
APPEND_OPERATIONS = ("WRITE", "STREAMING UPDATE")
VACUUM_OPERATIONS = ("VACUUM START", "VACUUM END")  # commits that delete unreferenced files, never rows


class ConcurrentPublishError(RuntimeError):
    """Another run published to the output while this one was running; this run published nothing."""


def is_delta_conflict(exc: BaseException) -> bool:
    """True for :class:`ConcurrentPublishError` and for Delta's concurrent-modification exceptions (by their
    Java type, anywhere in the Python or Java cause chain)."""
    return delta_conflict_name(exc) is not None


def delta_conflict_name(exc: BaseException) -> str | None:
    """The type name of the concurrency conflict in ``exc``'s cause chain: Delta's Java exception (a subclass
    of ``DeltaConcurrentModificationException``, e.g. ``ConcurrentAppendException``) or
    ``ConcurrentPublishError``; None when there is none."""
    seen: BaseException | None = exc
    while seen is not None:
        origin = getattr(seen, "_origin", None) or getattr(seen, "java_exception", None)
        name = _java_conflict_name(origin) if origin is not None else None
        if name is not None:
            return name
        if isinstance(seen, ConcurrentPublishError):
            return type(seen).__name__
        seen = seen.__cause__ or seen.__context__
    return None


def _java_conflict_name(throwable) -> str | None:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    while throwable is not None:
        if is_instance_of(gateway, throwable, DELTA_CONFLICT_CLASS):
            return str(throwable.getClass().getSimpleName())
        throwable = throwable.getCause()
    return None


@dataclasses.dataclass(frozen=True)
class OutputState:
    """The output table as a publisher sees it: latest ``version`` (None: no table), the job metadata of the
    state that version shows (``meta``: the latest publish, or the publish a RESTORE went back to; None if
    unknown), and the highest publish sequence number ever committed (``max_seq``, -1 if none)."""

    version: int | None
    meta: dict | None
    max_seq: int

    @property
    def next_seq(self) -> int:
        return self.max_seq + 1


def parse_meta(text: str | None) -> dict | None:
    """A commit's ``userMetadata`` as a publish-metadata dict (one with a ``run_id``), else None."""
    try:
        meta = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return meta if isinstance(meta, dict) and ("run_id" in meta) else None


def state_meta(meta: dict | None) -> dict | None:
    """The publish metadata describing the table state a commit left: a RESTORE commit carries it as ``restored``."""
    if meta and "rollback_to" in meta:
        return meta.get("restored")
    return meta


def output_state(spark: SparkSession, path: str) -> OutputState:
    """Read the output's Delta history (userMetadata of every commit). The state's metadata is that of the latest
    commit that is not a VACUUM's (which changes no row); ``version`` is the latest commit, VACUUM included."""
    if not is_delta_table(spark, path):
        return OutputState(None, None, -1)
    rows = DeltaTable.forPath(spark, path).history().select("version", "operation", "userMetadata").collect()
    rows.sort(key=lambda r: r["version"], reverse=True)
    metas = [parse_meta(r["userMetadata"]) for r in rows]
    seqs = [m["seq"] for m in metas if m and isinstance(m.get("seq"), int)]
    content = [m for r, m in zip(rows, metas) if r["operation"] not in VACUUM_OPERATIONS]
    return OutputState(int(rows[0]["version"]), state_meta(content[0] if content else None), max(seqs, default=-1))


def meta_at(spark: SparkSession, path: str, version: int) -> dict | None:
    """The publish metadata describing the table state at ``version``; KeyError if there is no such version."""
    row = DeltaTable.forPath(spark, path).history().where(F.col("version") == version).select("userMetadata").first()
    if row is None:
        raise KeyError(f"{path} has no version {version}")
    return state_meta(parse_meta(row["userMetadata"]))


def only_appends(spark: SparkSession, path: str, after: int, upto: int) -> bool:
    """True when every commit of the Delta table ``path`` in (after, upto] only appended rows (or was a VACUUM's)."""
    rows = (
        DeltaTable.forPath(spark, path)
        .history()
        .where((F.col("version") > after) & (F.col("version") <= upto))
        .select("version", "operation", "operationParameters")
        .collect()
    )
    if len(rows) != upto - after:
        return False  # history truncated (log retention): cannot prove append-only
    return all(
        r["operation"] in VACUUM_OPERATIONS
        or r["operation"] in APPEND_OPERATIONS
        and (r["operationParameters"] or {}).get("mode", r["operationParameters"].get("outputMode")) == "Append"
        for r in rows
    )


@dataclasses.dataclass(frozen=True)
class PublishTarget:
    """Where and as whom to publish: the output ``path``, the ``id_col`` a MERGE matches on, and the
    ``app_id`` of the idempotent-write transaction."""

    path: str
    id_col: str
    app_id: str


def publish(
    spark: SparkSession,
    target: PublishTarget,
    candidate: DataFrame | None,
    new_rows: DataFrame | None,
    meta: dict,
    start_version: int | None,
) -> int:
    """Commit the output once (overwrite ``candidate``, or MERGE ``new_rows`` on id: ``candidate`` is then unused and
    may be None); returns the new version.

    Raises :class:`ConcurrentPublishError` when the output moved since ``start_version``, when Delta reports a
    concurrent-modification conflict, or when Delta skipped the idempotent write because a concurrent run
    already committed this sequence number (``meta["seq"]``).
    """
    before = output_state(spark, target.path)
    if before.version != start_version:
        raise ConcurrentPublishError(
            f"{target.path} moved from version {start_version} to {before.version} "
            "while this run was computing; nothing published"
        )
    text = json.dumps(meta, sort_keys=True, default=str)
    try:
        if new_rows is None:
            if candidate is None:
                raise ValueError("publish: neither a candidate to overwrite the output with nor new rows to merge")
            (
                candidate.write.format("delta")
                .mode("overwrite")
                .option("overwriteSchema", "true")
                .option("txnAppId", target.app_id)
                .option("txnVersion", meta["seq"])
                .option("userMetadata", text)
                .save(target.path)
            )
        else:
            with session_conf(
                spark,
                {
                    "spark.databricks.delta.commitInfo.userMetadata": text,
                    "spark.databricks.delta.write.txnAppId": target.app_id,
                    "spark.databricks.delta.write.txnVersion": str(meta["seq"]),
                },
            ):
                (
                    DeltaTable.forPath(spark, target.path)
                    .alias("t")
                    .merge(new_rows.alias("s"), f"t.`{target.id_col}` = s.`{target.id_col}`")
                    .whenNotMatchedInsertAll()
                    .execute()
                )
    except Exception as exc:  # noqa: BLE001 — only Delta's concurrency conflicts are translated
        conflict = delta_conflict_name(exc)
        if conflict is not None:
            raise ConcurrentPublishError(
                f"{conflict}: a concurrent run committed to {target.path} first; the output "
                f"is at version {output_state(spark, target.path).version}, "
                "this run published nothing"
            ) from exc
        raise
    after = output_state(spark, target.path)
    if after.version is None or not after.meta or after.meta.get("run_id") != meta["run_id"]:
        raise ConcurrentPublishError(
            f"publish sequence {meta['seq']} was already committed to {target.path} by "
            f"run {after.meta and after.meta.get('run_id')} (version {after.version}); "
            "Delta skipped this write"
        )
    return int(after.version)


def restore(spark: SparkSession, path: str, version: int, meta: dict) -> int:
    """RESTORE ``path`` to ``version`` as one commit whose userMetadata is ``meta``; returns the new version."""
    with session_conf(spark, {"spark.databricks.delta.commitInfo.userMetadata": json.dumps(meta, default=str)}):
        DeltaTable.forPath(spark, path).restoreToVersion(version)
    return latest_delta_version(spark, path)
