"""The moments pass without Spark's row → Arrow conversion: pyarrow reads a pinned table version's Parquet data
files inside Spark tasks.

In Spark 4.0 every batch a ``mapInArrow`` function receives is rebuilt on the JVM element by element from rows
(JFR of the diagnose scan: 70 % of the JVM's samples in ``ArrowFieldWriter.write``); at 1,000,000 × 384 float32 on
2 cores that costs 7–10 JVM CPU-s per pass, more than the moments math. A pass that only folds batches in Python
needs no rows. Here Delta (or Spark's listing of a Parquet directory) still resolves the pinned version's files
(``DataFrame.inputFiles``), Spark runs one task per file (``parallelize`` over the file list: its scheduling and
retries) and the states still merge by ``treeReduce``; only the reading is pyarrow's, each task streaming its file's
row groups through a :data:`READ_BUFFER_BYTES` buffer in batches of Spark's own Arrow batch size, so a task's memory
is bounded by the batch and the buffer, not by the file.

pyarrow reads the files' physical columns, so it is used only where they are exactly the version's rows and columns:

* before the pass (:func:`table_files`): a Delta or Parquet path; no deletion vectors or column mapping in the Delta
  table (``DESCRIBE DETAIL``: deleted rows are still in the files, and mapped columns have other physical names); an
  array vector column (``VectorUDT`` is converted by Spark); pyarrow's own filesystems open the first file
  (``file:`` and local paths, ``s3://``, ``gs://``, ``hdfs://`` with libhdfs; not Hadoop's ``s3a://``); and
  (:meth:`TableFiles.unreadable`) that file has every column the pass reads (a partition column is in none);
* after it (:func:`pyarrow_or_spark`): it read the version's row count, and no task met a file it could not read
  as the table's columns (:class:`FileLayoutError`: a column missing, a type that does not cast, an I/O error).

Otherwise Spark's scan reads the table; ``vector_reader: auto | spark | pyarrow`` chooses (``pyarrow`` raises
instead of falling back), and the caller records which reader ran and why.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark import RDD
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType

log = logging.getLogger("anisotropy.table_files")

READERS = ("auto", "spark", "pyarrow")
READ_BUFFER_BYTES = 8 << 20      # pyarrow's read buffer per open file: row groups stream through it
UNREADABLE_FEATURES = ("deletionVectors", "columnMapping")   # Delta features whose files are not the version's rows

T = TypeVar("T")


class FileLayoutError(RuntimeError):
    """pyarrow cannot read a data file as the table's columns (raised in a task; the pass falls back to Spark)."""


@dataclass(frozen=True)
class TableFiles:
    """The Parquet data files of a pinned table version, for pyarrow: ``uris`` (sorted, as Spark lists them),
    ``rows``: the version's row count, ``schema``: the table's Arrow schema, ``first_columns``: the columns of the
    first file, ``required``: raise instead of falling back to Spark's scan (``vector_reader: pyarrow``)."""

    uris: tuple[str, ...]
    rows: int
    schema: pa.Schema
    first_columns: frozenset[str]
    required: bool = False

    def unreadable(self, columns: list[str]) -> str | None:
        """Why pyarrow cannot read ``columns`` from these files (some is not in the first file), or None."""
        missing = [c for c in columns if c not in self.first_columns]
        return f"column(s) {missing} not in the data files (partition columns?)" if missing else None

    def fold(self, spark: SparkSession, columns: list[str], batch_rows: int,
             fold: Callable[[Iterator[pa.RecordBatch]], T]) -> RDD:
        """An RDD of one ``fold(batches)`` per file (its partition index is the file's index in ``uris``): the
        file's ``columns`` as Arrow batches of at most ``batch_rows`` rows, cast to the table's types."""
        schema = pa.schema([self.schema.field(c) for c in columns])

        def task(entries: Iterator[str]) -> Iterator[T]:
            for uri in entries:
                yield fold(file_batches(uri, schema, batch_rows))

        return spark.sparkContext.parallelize(self.uris, len(self.uris)).mapPartitions(task)


def table_files(spark: SparkSession, df: DataFrame, path: str, table_format: str, vector_col: str, rows: int | None,
                reader: str = "auto") -> tuple[TableFiles | None, str]:
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
    schema = to_arrow_schema(df.schema)
    return TableFiles(uris, df.count() if rows is None else rows, schema, first_columns,
                      required=reader == "pyarrow"), "pyarrow"


def _why_not_pyarrow(spark: SparkSession, df: DataFrame, path: str, table_format: str, vector_col: str) -> str | None:
    """Why the table's files are not its rows and columns as pyarrow would read them, or None (module docstring)."""
    if table_format not in ("delta", "parquet"):
        return f"a {table_format} table"
    if not isinstance(df.schema[vector_col].dataType, ArrayType):
        return f"vector column {vector_col!r} is {df.schema[vector_col].dataType.simpleString()}, not an array"
    if table_format == "delta":
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").select("tableFeatures", "properties").first()
        found = [f for f in UNREADABLE_FEATURES if f in (detail["tableFeatures"] or [])]
        mode = (detail["properties"] or {}).get("delta.columnMapping.mode", "none")
        if found or mode != "none":
            return f"Delta table with {', '.join(found) or 'column mapping'}"
    return None


def _first_file_columns(uris: tuple[str, ...]) -> tuple[str | None, frozenset[str]]:
    """(None, the first file's column names) when pyarrow opens it; else (why not, empty)."""
    if not uris:
        return "no data files", frozenset()
    try:
        filesystem, path = pafs.FileSystem.from_uri(uris[0])
        return None, frozenset(pq.read_schema(path, filesystem=filesystem).names)
    except (OSError, pa.ArrowException, ValueError) as exc:
        return f"pyarrow cannot open {uris[0]}: {exc}", frozenset()


def file_batches(uri: str, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The ``schema`` columns of the Parquet file ``uri`` in batches of at most ``batch_rows`` rows, streamed
    (:data:`READ_BUFFER_BYTES`) and cast to ``schema``'s types; :class:`FileLayoutError` naming the file when it
    lacks a column, a type does not cast or it cannot be read."""
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
        parquet = pq.ParquetFile(path, filesystem=filesystem, buffer_size=READ_BUFFER_BYTES)
        missing = [name for name in schema.names if name not in parquet.schema_arrow.names]
        if missing:
            raise FileLayoutError(f"{uri} has no column(s) {missing}")
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=schema.names):
            target = pa.schema([schema.field(name) for name in batch.schema.names])
            yield batch if batch.schema.types == target.types else batch.cast(target)
    except (OSError, pa.ArrowException) as exc:
        raise FileLayoutError(f"pyarrow could not read {uri} as the table's columns: {exc}") from exc


_WORKER_LAYOUT_ERROR = re.compile(r"FileLayoutError: (.*)")


def layout_error_from_worker(exc: Exception) -> str | None:
    """The message of the :class:`FileLayoutError` a Python task raised inside ``exc`` (a Spark error), or None."""
    found = _WORKER_LAYOUT_ERROR.search(str(exc))
    return found.group(1).strip() if found else None


def pyarrow_or_spark(files: TableFiles, columns: list[str], read_files: Callable[[TableFiles], T],
                     read_spark: Callable[[], T], rows_of: Callable[[T], int]) -> tuple[T, str]:
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
            why_not = f"the data files hold {read} rows, the table version {files.rows}"
        except Exception as exc:          # a Spark job error wrapping the task's FileLayoutError
            why_not = layout_error_from_worker(exc)
            if why_not is None:
                raise
    if files.required:
        raise FileLayoutError(f"vector_reader: pyarrow: {why_not}")
    log.warning("moments pass reads through Spark instead of pyarrow: %s", why_not)
    return read_spark(), f"spark ({why_not})"
