"""The moments pass and the apply pass without Spark's row → Arrow conversion: pyarrow reads a pinned table
version's Parquet data files inside Spark tasks (:meth:`TableFiles.fold` for a pass that folds the batches into
states, :meth:`TableFiles.map_batches` for one that maps them into a DataFrame Spark writes).

In Spark 4.0 every batch a ``mapInArrow`` function receives is rebuilt on the JVM element by element from rows
(Spark's ``ArrowFieldWriter.write``), which costs the JVM more CPU than the moments math costs Python
(docs/design.md). A pass that only folds batches in Python
needs no rows. Here Delta (or Spark's listing of a Parquet directory) still resolves the pinned version's files
(``DataFrame.inputFiles``), Spark runs the tasks (``parallelize``: its scheduling and retries) and the states still
merge by ``treeReduce``; only the reading is pyarrow's. A first small Spark job reads the files' footers and lists
their row groups (:meth:`TableFiles.row_groups`); the pass then runs one task per row group, the unit Spark's own
scan splits files into, which reads it in batches of Spark's own Arrow batch size. A task holds one row group's
column chunks at a time, as Spark's Parquet reader does: its memory depends on the writer's row group size (Spark
and Delta write ≤ 128 MB), not on the number of rows. One task per row group, each column chunk read whole, was
faster than one task per file or than streaming a row group through a small buffer (bench/RESULTS.md).

pyarrow reads the files' physical columns, so it is used only where they are exactly the version's rows and columns:

* before the pass (:func:`table_files`): a Delta or Parquet path; no deletion vectors or column mapping in the
  Delta table (``DeltaTable.detail``: deleted rows are still in the files, and mapped columns have other physical
  names); an array vector column (``VectorUDT`` is converted by Spark); pyarrow's filesystems open the first file
  (:func:`filesystem_of`: local, ``s3://`` and Hadoop's ``s3a://``, ``gs://``, ``hdfs://`` with libhdfs, with
  pyarrow's credentials from the environment, not Hadoop's ``fs.s3a.*``); and (:meth:`TableFiles.unreadable`)
  that file has every column the pass reads (a partition column is in none) in a type Spark converts to Arrow;
* before the batches are read (:meth:`TableFiles.row_groups`): the footers' row counts add up to the version's;
* after the pass (:func:`pyarrow_or_spark`): it read the version's row count, and no task met a file it could not
  read as the table's columns (:class:`FileLayoutError`: a column missing, a type that does not cast, an I/O error).

Otherwise Spark's scan reads the table; ``vector_reader: auto | spark | pyarrow`` chooses (``pyarrow`` raises
instead of falling back), and the caller records which reader ran and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark import RDD
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, FloatType, StructType

from anisotropy_core import storage

from .rows import one_row
from .worker_errors import WorkerError, raised_in_workers, worker_error

log = logging.getLogger("anisotropy.table_files")

READERS = ("auto", "spark", "pyarrow")
UNREADABLE_FEATURES = ("deletionVectors", "columnMapping")  # Delta features whose files are not the version's rows

T = TypeVar("T")


class FileLayoutError(WorkerError, RuntimeError):
    """pyarrow cannot read a data file as the table's columns, and why (``reason``). Raised in a task (a
    :class:`~.worker_errors.WorkerError`: the driver gets the class back) or on the driver; the pass falls back to
    Spark's scan."""

    fields = ("reason",)
    reason: str

    def __init__(self, reason: str):
        super().__init__(reason=reason)

    def message(self) -> str:
        return self.reason


@dataclass(frozen=True)
class TableFiles:
    """The Parquet data files of a pinned table version, for pyarrow: ``uris`` (sorted, as Spark lists them),
    ``rows``: the version's row count, ``schema``: the table's Spark schema, ``first_columns``: the columns of the
    first file, ``required``: raise instead of falling back to Spark's scan (``vector_reader: pyarrow``)."""

    uris: tuple[str, ...]
    rows: int
    schema: StructType
    first_columns: frozenset[str]
    required: bool = False

    def arrow_schema(self, columns: list[str]) -> pa.Schema:
        """The Arrow schema Spark would hand a Python worker for ``columns`` of the table."""
        return to_arrow_schema(StructType([self.schema[c] for c in columns]))

    def item_bytes(self, vector_col: str) -> int:
        """Bytes per element of the array column ``vector_col``: 4 for ``array<float>``, else 8."""
        data_type = self.schema[vector_col].dataType
        return 4 if isinstance(data_type, ArrayType) and isinstance(data_type.elementType, FloatType) else 8

    def unreadable(self, columns: list[str]) -> str | None:
        """Why pyarrow cannot read ``columns`` from these files (some is not in the first file, or has a type
        Spark does not convert to Arrow), or None."""
        missing = [c for c in columns if c not in self.first_columns]
        if missing:
            return f"column(s) {missing} not in the data files (partition columns?)"
        try:
            self.arrow_schema(columns)
        except Exception as exc:  # pyspark raises its own error classes for types Arrow cannot hold
            return f"column type without an Arrow form: {exc}"
        return None

    def row_groups(self, spark: SparkSession) -> list[tuple[str, int]]:
        """Every (file URI, row group index) of the files, in file order: their footers read in one Spark job (at
        most one task per core); :class:`FileLayoutError` in a task for a file pyarrow cannot open, and on the
        driver when the footers' row counts do not add up to the version's ``rows``."""

        @raised_in_workers
        def groups_of(uris: Iterable[str]) -> Iterator[tuple[str, int, int]]:
            for uri in uris:
                try:
                    filesystem, path = filesystem_of(uri)
                    with pq.ParquetFile(path, filesystem=filesystem) as parquet:
                        counts = [parquet.metadata.row_group(group).num_rows for group in range(parquet.num_row_groups)]
                except (OSError, pa.ArrowException) as exc:
                    raise FileLayoutError(f"pyarrow could not read the footer of {uri}: {exc}") from exc
                yield from ((uri, group, rows) for group, rows in enumerate(counts))

        slices = max(1, min(len(self.uris), spark.sparkContext.defaultParallelism))
        groups = spark.sparkContext.parallelize(self.uris, slices).mapPartitions(groups_of).collect()
        held = sum(rows for _, _, rows in groups)
        if held != self.rows:
            raise FileLayoutError(held_rows_message(held, self.rows))
        return [(uri, group) for uri, group, _ in groups]

    def fold(
        self,
        spark: SparkSession,
        columns: list[str],
        batch_rows: int,
        fold_batches: Callable[[Iterator[pa.RecordBatch]], T],
    ) -> RDD:
        """An RDD of one ``fold_batches(batches)`` per row group (:meth:`row_groups`; one task each, its partition
        index the row group's place in file order): its ``columns`` as Arrow batches of at most ``batch_rows`` rows,
        cast to the table's types. Files without a row group give one task that folds no batch."""
        schema = self.arrow_schema(columns)
        units = self.row_groups(spark)

        @raised_in_workers
        def task(entries: Iterable[tuple[str, int]]) -> Iterator[T]:
            yield fold_batches(
                batch for uri, group in entries for batch in file_batches(uri, group, schema, batch_rows)
            )

        return spark.sparkContext.parallelize(units, max(1, len(units))).mapPartitions(task)

    def map_batches(
        self,
        spark: SparkSession,
        batch_rows: int,
        transform_batches: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
        schema: StructType,
    ) -> DataFrame:
        """A DataFrame of ``schema``: ``transform_batches(batches)`` of each row group (:meth:`row_groups`; one task
        each) with all the table's columns as Arrow batches of at most ``batch_rows`` rows, cast to the table's
        types: what ``df.mapInArrow(transform_batches, schema)`` gives over Spark's scan of the table, without the JVM
        rebuilding every input batch from rows. Lazy but for the footer job of :meth:`row_groups`."""
        arrow = self.arrow_schema(self.schema.names)
        units = self.row_groups(spark)

        @raised_in_workers
        def task(indices: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for index in (i for batch in indices for i in batch.column(0).to_pylist()):
                uri, group = units[index]
                yield from transform_batches(file_batches(uri, group, arrow, batch_rows))

        return spark.range(0, len(units), 1, max(1, len(units))).mapInArrow(task, schema)


def held_rows_message(held: int, rows: int) -> str:
    return f"the data files hold {held} rows, the table version {rows}"


def table_files(
    spark: SparkSession,
    df: DataFrame,
    path: str,
    table_format: str,
    vector_col: str,
    rows: int | None,
    reader: str = "auto",
) -> tuple[TableFiles | None, str]:
    """(the data files of ``df``, the table at ``path`` (``table_format`` delta|parquet) read at a pinned version
    with ``rows`` rows (None: counted here, when the files are usable), or None; the reader the moments pass will
    use: ``"pyarrow"`` or ``"spark"`` with the reason). ``reader``: ``auto``, ``spark`` or ``pyarrow`` (raises
    :class:`FileLayoutError` when unusable)."""
    if reader not in READERS:
        raise ValueError(f"vector_reader must be one of {READERS}, got {reader!r}")
    if reader == "spark":
        return None, "spark (vector_reader: spark)"
    why_not = _why_not_pyarrow(spark, df, path, table_format, vector_col)
    if why_not is None:
        uris = tuple(sorted(df.inputFiles()))
        why_not, first_columns = _first_file_columns(uris)
    if why_not is not None:
        if reader == "pyarrow":
            raise FileLayoutError(f"vector_reader: pyarrow cannot read {path}: {why_not}")
        return None, f"spark ({why_not})"
    return TableFiles(
        uris, df.count() if rows is None else rows, df.schema, first_columns, required=reader == "pyarrow"
    ), "pyarrow"


def _why_not_pyarrow(spark: SparkSession, df: DataFrame, path: str, table_format: str, vector_col: str) -> str | None:
    """Why the table's files are not its rows and columns as pyarrow would read them, or None (module docstring)."""
    if table_format not in ("delta", "parquet"):
        return f"a {table_format} table"
    if not isinstance(df.schema[vector_col].dataType, ArrayType):
        return f"vector column {vector_col!r} is {df.schema[vector_col].dataType.simpleString()}, not an array"
    if table_format == "delta":
        from delta.tables import DeltaTable

        detail = one_row(DeltaTable.forPath(spark, path).detail().select("tableFeatures", "properties"))
        found = [f for f in UNREADABLE_FEATURES if f in (detail["tableFeatures"] or [])]
        mode = (detail["properties"] or {}).get("delta.columnMapping.mode", "none")
        if found or mode != "none":
            return f"Delta table with {', '.join(found) or 'column mapping'}"
    return None


def filesystem_of(uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem and path for a data file URI as Spark lists it: ``file:/…`` (percent-encoded), or any
    ``scheme://`` URI through :func:`anisotropy_core.storage.resolve` (Hadoop's ``s3a://`` is pyarrow's ``s3``)."""
    return storage.resolve(uri) if "://" in uri else pafs.FileSystem.from_uri(uri)


def _first_file_columns(uris: tuple[str, ...]) -> tuple[str | None, frozenset[str]]:
    """(None, the first file's column names) when pyarrow opens it; else (why not, empty)."""
    if not uris:
        return "no data files", frozenset()
    try:
        filesystem, path = filesystem_of(uris[0])
        return None, frozenset(pq.read_schema(path, filesystem=filesystem).names)
    except (OSError, pa.ArrowException, ValueError) as exc:
        return f"pyarrow cannot open {uris[0]}: {exc}", frozenset()


def file_batches(uri: str, row_group: int, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The ``schema`` columns of row group ``row_group`` of the Parquet file ``uri`` in batches of at most
    ``batch_rows`` rows, cast to ``schema``'s types; :class:`FileLayoutError` naming the file when it lacks a
    column, a type does not cast or it cannot be read."""
    try:
        filesystem, path = filesystem_of(uri)
        with pq.ParquetFile(path, filesystem=filesystem) as parquet:
            missing = [name for name in schema.names if name not in parquet.schema_arrow.names]
            if missing:
                raise FileLayoutError(f"{uri} has no column(s) {missing}")
            for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=[row_group], columns=schema.names):
                target = pa.schema([schema.field(name) for name in batch.schema.names])
                yield batch if batch.schema.types == target.types else batch.cast(target)
    except (OSError, pa.ArrowException) as exc:
        raise FileLayoutError(f"pyarrow could not read {uri} as the table's columns: {exc}") from exc


def pyarrow_or_spark(
    files: TableFiles,
    columns: list[str],
    read_files: Callable[[TableFiles], T],
    read_spark: Callable[[], T],
    rows_of: Callable[[T], int],
) -> tuple[T, str]:
    """(``read_files(files)``, ``"pyarrow"``) when ``files`` can serve ``columns`` and the pass read
    ``files.rows`` rows; else (``read_spark()``, ``"spark (<why>)"``). With ``files.required`` the why raises
    :class:`FileLayoutError` instead."""
    why_not = files.unreadable(columns)
    if why_not is None:
        try:
            result = read_files(files)
            read = rows_of(result)
            if read == files.rows:
                return result, "pyarrow"
            why_not = held_rows_message(read, files.rows)
        except Exception as exc:  # on the driver (the footers' row counts) or a task's, wrapped by Spark
            found = worker_error(exc)
            if not isinstance(found, FileLayoutError):
                raise
            why_not = found.reason
    if files.required:
        raise FileLayoutError(f"vector_reader: pyarrow: {why_not}")
    log.warning("the pass reads through Spark's scan instead of pyarrow: %s", why_not)
    return read_spark(), f"spark ({why_not})"
