"""How many data files a write of a table's corrected rows makes: about ``ceil(input bytes / target)``, as Delta's
optimize-write aims at, but without its shuffle.

A pass that reads one row group per task (:mod:`anisotropy_spark.table_files`) would write one file per input row
group: a 200-file input gives 200 small output files. The jobs coalesce the write to :func:`file_count` partitions
(``DataFrame.coalesce``: partitions merged in place, each write task reading several input partitions one after
the other; no row moves between executors, the vectors are never shuffled; fewer partitions stay as they are).
The write then runs in that many tasks: with the 256 MiB default a 30 GiB table is written by 120 tasks of about
256 MiB of input each.
"""

from __future__ import annotations

import math

from pyspark.sql import DataFrame

MIB = 1 << 20


def scan_bytes(df: DataFrame) -> int:
    """Bytes of the data files the table read ``df`` scans (``df`` straight from the reader: no filter or
    projection), as its plan's statistics state them without opening a file: for Delta, the sizes of the pinned
    version's data files recorded in its log; for Parquet, the listed files' lengths."""
    return int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())


def file_count(input_bytes: int, target_file_mb: float) -> int:
    """``ceil(input_bytes / target_file_mb MiB)``, at least 1."""
    return max(1, math.ceil(input_bytes / (target_file_mb * MIB)))
