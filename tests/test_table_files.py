"""The moments pass read by pyarrow from the data files (anisotropy_spark.table_files) against Spark's own scan."""

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import ArrayType, FloatType, StructField, StructType, YearMonthIntervalType

from anisotropy_spark.io import read_table
from anisotropy_spark.moments import arrow_batch_rows, checked_moments
from anisotropy_spark.row_sample import RowSample
from anisotropy_spark.session import session_conf
from anisotropy_spark.table_files import (
    FileLayoutError,
    TableFiles,
    _first_file_columns,
    file_batches,
    filesystem_of,
    table_files,
)
from jobs import diagnose as job

SCHEMA = "id long, vector array<float>, tokens double"


def rows(n, d=4, seed=0, offset=50.0, start=0):
    """``n`` valid rows of a narrow cone far from the origin (offset ≫ spread), float32-exact values."""
    X = (np.random.default_rng(seed).normal(size=(n, d)) + offset).astype(np.float32)
    return [(start + i, [float(x) for x in X[i]], float(i % 7)) for i in range(n)]


def bad_rows(start):
    """One row per contract violation, ids from ``start`` (one null id)."""
    return [
        (start, None, 1.0),
        (start + 1, [1.0, 2.0, 3.0], 1.0),
        (start + 2, [1.0, float("nan"), 0.0, 1.0], 1.0),
        (start + 3, [0.0, 0.0, 0.0, 0.0], 1.0),
        (None, [1.0, 1.0, 1.0, 1.0], 1.0),
    ]


def delta_table(spark, path, data, files=3, **options):
    spark.createDataFrame(data, SCHEMA).repartition(files).write.format("delta").options(**options).mode(
        "overwrite"
    ).save(str(path))
    return str(path)


def both_readers(spark, path, version=None, sample=None):
    """checked_moments of the table at ``path`` through pyarrow's files and through Spark, with the readers."""
    df, ref = read_table(spark, path, version)
    files, planned = table_files(spark, df, ref.path, ref.format, "vector", df.count())
    assert planned == "pyarrow" and files is not None
    return checked_moments(df, "vector", "id", 4, sample, files), checked_moments(df, "vector", "id", 4, sample)


def test_pyarrow_files_give_spark_scans_moments_tally_and_sample(spark, tmp_path):
    """Valid rows far from the origin and one row per contract violation, over 3 files: the same n, mean and
    centred co-moment (to float64 rounding: the batches split the rows differently), the same reasons and sample ids,
    and a sample of valid rows drawn from every file, fixed for a seed."""
    path = delta_table(spark, tmp_path / "t", rows(600) + bad_rows(1000))
    spec = RowSample(size=100, total=605, seed=2, columns=("tokens",))
    (state, tally, drawn, reader), (ref_state, ref_tally, _, ref_reader) = both_readers(spark, path, sample=spec)
    assert (reader, ref_reader) == ("pyarrow", "spark")
    assert state.n == ref_state.n == 600
    assert np.allclose(state.mean, ref_state.mean, rtol=1e-14, atol=0)
    assert np.allclose(state.comoment, ref_state.comoment, rtol=1e-9, atol=1e-9)
    X = np.array([r[1] for r in rows(600)], dtype=np.float64)
    assert np.allclose(state.comoment, (X - X.mean(0)).T @ (X - X.mean(0)), rtol=1e-9, atol=1e-9)
    assert (
        tally.counts
        == ref_tally.counts
        == {"null_vector": 1, "wrong_dimension:3": 1, "non_finite": 1, "zero_norm": 1, "null_id": 1}
    )
    assert sorted(tally.sample_ids(), key=str) == sorted(ref_tally.sample_ids(), key=str)
    valid = {tuple(r[1]) for r in rows(600)}
    drawn_rows = drawn.to_pylist()
    assert 100 <= len(drawn_rows) <= 200 and set(drawn.column_names) == {"vector", "tokens"}
    assert all(tuple(row["vector"]) in valid for row in drawn_rows)
    (_, _, again, _), _ = both_readers(spark, path, sample=spec)
    assert again.equals(drawn)


def test_pinned_version_reads_that_versions_files(spark, tmp_path):
    """Time travel: version 0 (200 rows) after an overwrite with 300 others: pyarrow reads version 0's files only."""
    path = delta_table(spark, tmp_path / "t", rows(200, seed=1))
    delta_table(spark, path, rows(300, seed=2, start=5000))
    (state, tally, _, reader), (ref_state, _, _, _) = both_readers(spark, path, version=0)
    assert reader == "pyarrow" and state.n == ref_state.n == 200 and tally.total == 0
    assert np.allclose(state.mean, ref_state.mean, rtol=1e-14, atol=0)


def test_parquet_directory_row_groups_and_batches_of_sparks_size(spark, tmp_path):
    """A Parquet directory (pyarrow-written, float32, 3 row groups per file) is read by pyarrow too, one task per
    row group; batches have at most Spark's ``maxRecordsPerBatch`` rows and, by bytes, at most ``maxBytesPerBatch``
    of vector data."""
    folder = tmp_path / "p"
    folder.mkdir()
    for part in range(2):
        block = rows(50, seed=part, start=100 * part)
        pq.write_table(
            pa.table(
                {
                    "id": [r[0] for r in block],
                    "vector": pa.array([r[1] for r in block], pa.list_(pa.float32())),
                    "tokens": [r[2] for r in block],
                }
            ),
            folder / f"part-{part}.parquet",
            row_group_size=20,
        )
    df, ref = read_table(spark, str(folder))
    files, planned = table_files(spark, df, ref.path, ref.format, "vector", df.count())
    state, tally, _, reader = checked_moments(df, "vector", "id", 4, files=files)
    assert (planned, reader, state.n, tally.total) == ("pyarrow", "pyarrow", 100, 0)
    assert files.row_groups(spark) == [(uri, group) for uri in files.uris for group in range(3)]
    X = np.array([r[1] for part in range(2) for r in rows(50, seed=part)], dtype=np.float64)
    assert np.allclose(state.comoment, (X - X.mean(0)).T @ (X - X.mean(0)), rtol=1e-9, atol=1e-9)
    schema = pa.schema([pa.field("vector", pa.list_(pa.float32())), pa.field("id", pa.int64())])
    sizes = [batch.num_rows for batch in file_batches(files.uris[0], 2, schema, 8)]
    assert sizes == [8, 2]  # the last row group: rows 40–49
    with session_conf(
        spark,
        {
            "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
            "spark.sql.execution.arrow.maxBytesPerBatch": str(32 << 20),
        },
    ):
        assert arrow_batch_rows(spark, 384, 4) == 10_000  # maxRecordsPerBatch
        assert arrow_batch_rows(spark, 1_048_576, 4) == 8  # 32 MiB / 4 MiB per float32 vector
    assert arrow_batch_rows(spark, 384, 4) == (8 << 20) // (384 * 4) == 5461  # the session's 8 MiB budget


def test_deletion_vectors_and_column_mapping_read_through_spark(spark, tmp_path):
    """Files that are not the version's rows (deleted rows still in them) or columns (mapped physical names):
    ``auto`` reads through Spark and says why; ``pyarrow`` refuses; ``spark`` is Spark's scan."""
    deleted = delta_table(spark, tmp_path / "dv", rows(100), **{"delta.enableDeletionVectors": "true"})
    spark.sql(f"DELETE FROM delta.`{deleted}` WHERE id < 10")
    mapped = delta_table(
        spark,
        tmp_path / "cm",
        rows(100),
        **{"delta.columnMapping.mode": "name", "delta.minReaderVersion": "2", "delta.minWriterVersion": "5"},
    )
    for path, why in [(deleted, "deletionVectors"), (mapped, "column")]:
        df, ref = read_table(spark, path)
        files, planned = table_files(spark, df, ref.path, ref.format, "vector", df.count())
        assert files is None and planned.startswith("spark (") and why in planned
        with pytest.raises(FileLayoutError, match=why):
            table_files(spark, df, ref.path, ref.format, "vector", df.count(), reader="pyarrow")
    df, ref = read_table(spark, deleted)
    assert table_files(spark, df, ref.path, ref.format, "vector", 90, "spark") == (None, "spark (vector_reader: spark)")
    assert checked_moments(df, "vector", "id", 4)[0].n == 90


def test_files_that_do_not_hold_the_tables_rows_or_columns_fall_back_to_spark(spark, tmp_path):
    """Checked after the pass: a row count other than the version's, or a file without a column the pass reads
    (raised in the task, named there), falls back to Spark's scan with the reason, or raises with ``required``."""
    path = delta_table(spark, tmp_path / "t", rows(120))
    df, ref = read_table(spark, path)
    files, _ = table_files(spark, df, ref.path, ref.format, "vector", 120)
    miscounted = dataclasses.replace(files, rows=121)
    state, _, _, reader = checked_moments(df, "vector", "id", 4, files=miscounted)
    assert state.n == 120 and reader == "spark (the data files hold 120 rows, the table version 121)"
    with pytest.raises(FileLayoutError, match="hold 120 rows"):
        checked_moments(df, "vector", "id", 4, files=dataclasses.replace(miscounted, required=True))
    stray = tmp_path / "stray.parquet"  # a data file without the tokens column, listed with the others
    pq.write_table(pa.table({"id": [1], "vector": pa.array([[1.0, 2.0, 3.0, 4.0]], pa.list_(pa.float32()))}), stray)
    broken = dataclasses.replace(files, uris=files.uris + (stray.as_uri(),), rows=121)
    spec = RowSample(size=10, total=121, columns=("tokens",))
    state, _, _, reader = checked_moments(df, "vector", "id", 4, spec, broken)
    assert state.n == 120 and reader.startswith("spark (") and "stray.parquet has no column(s) ['tokens']" in reader
    garbage = tmp_path / "garbage.parquet"  # not Parquet at all: its footer cannot be read
    garbage.write_bytes(b"not a parquet file")
    state, _, _, reader = checked_moments(
        df, "vector", "id", 4, files=dataclasses.replace(files, uris=files.uris + (garbage.as_uri(),))
    )
    assert state.n == 120 and "could not read the footer of " + garbage.as_uri() in reader
    assert "not in the data files" in files.unreadable(["vector", "part_col"])


def test_filesystems_and_types_pyarrow_cannot_read_fall_back(spark):
    why, columns = _first_file_columns(("wasbs://container@account/table/part-0.parquet",))
    assert why.startswith("pyarrow cannot open wasbs://container@account/table/part-0.parquet") and not columns
    assert filesystem_of("file:/tmp/a%20b/part-0.parquet")[1] == "/tmp/a b/part-0.parquet"
    assert _first_file_columns(())[0] == "no data files"
    files = TableFiles(
        (),
        0,
        StructType([StructField("vector", ArrayType(FloatType())), StructField("months", YearMonthIntervalType())]),
        frozenset({"vector", "months"}),
    )
    assert files.unreadable(["vector"]) is None and files.item_bytes("vector") == 4
    assert files.unreadable(["vector", "months"]).startswith("column type without an Arrow form")


def test_job_records_the_reader_and_matches_sparks_diagnosis(spark, tmp_path):
    """``vector_reader`` auto (pyarrow) and spark give the same diagnosis; the moments stage says which ran."""
    path = delta_table(spark, tmp_path / "t", rows(400, d=4, offset=3.0) + bad_rows(2000))
    reports = {}
    for reader in ("auto", "spark"):
        out = tmp_path / reader
        assert (
            job.main(
                [
                    "--input",
                    path,
                    "--output-dir",
                    str(out),
                    "--metrics-table",
                    "null",
                    "--metadata-cols",
                    "[tokens]",
                    "--vector-reader",
                    reader,
                    "--on-invalid",
                    "quarantine",
                    "--quarantine-path",
                    str(tmp_path / f"q-{reader}"),
                    "--cluster-k",
                    "null",
                ]
            )
            == 0
        )
        reports[reader] = json.loads((out / "report.json").read_text())
    moments = {
        reader: next(s for s in report["stages"] if s["name"] == "moments") for reader, report in reports.items()
    }
    assert moments["auto"]["reader"] == "pyarrow" and moments["spark"]["reader"] == "spark (vector_reader: spark)"
    a, b = reports["auto"], reports["spark"]
    assert a["invalid_by_reason"] == b["invalid_by_reason"] and a["metrics"]["n"] == b["metrics"]["n"] == 400
    for key in ("anisotropy_A", "top1_var", "effective_rank", "offset_ratio"):
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], rel=1e-9)
    assert np.allclose(a["spectrum"], b["spectrum"], rtol=1e-9, atol=1e-12)
