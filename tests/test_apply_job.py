"""Fit + apply jobs end to end on Delta: values, versions, atomicity under failure, idempotence, diagnosis."""

import dataclasses
import json
import math
import os
import sys
import urllib.parse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import cloudpickle

from anisotropy_core import synthetic
from anisotropy_core.artifact import Artifact, ArtifactError, load_artifact
from anisotropy_core.transforms import Center
from anisotropy_spark.contract import check_batch
from anisotropy_spark.diagnostics import diagnose_dataframe
from anisotropy_spark.io import InvalidRowsError
from anisotropy_spark.output_files import file_count, scan_bytes
from anisotropy_spark.quarantine import find_duplicates, id_scan_conf
from anisotropy_spark.table_files import FileLayoutError
import jobs.apply as apply_job
from jobs.apply import ApplyConfig, latest_commit, run_apply
from jobs.apply import main as apply_main
from jobs.config import ConfigError, from_mapping
from jobs.fit import FitConfig, run_fit
from jobs.fit import main as fit_main

N, D = 600, 16
MARKER = 1000.0  # first coordinate of the appended rows that make the injected transform fail

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # FailingCenter must reach the workers


class FailingCenter(Center):
    """Centring that raises in whichever batch holds a marker row (one partition fails, the others write)."""

    method = "failing_center"

    def _map(self, centred):
        if (centred[:, 0] + self.mean[0] >= MARKER).any():
            raise RuntimeError("injected failure in one partition")
        return centred


def write_table(spark, path, matrix, start=0, mode="overwrite"):
    rows = [(start + i, f"doc{start + i}", len(row) + i % 7, [float(v) for v in row]) for i, row in enumerate(matrix)]
    (
        spark.createDataFrame(rows, "id long, title string, token_count int, vector array<double>")
        .repartition(3)
        .write.format("delta")
        .mode(mode)
        .save(path)
    )


def cone_corpus(spark, root, n, d, seed):
    """A synthetic cone (n, d) written as the Delta table ``root/corpus``; returns (root, data)."""
    data = synthetic.cone(n, d, offset=4.0, alpha=1.0, seed=seed)
    write_table(spark, str(root / "corpus"), data)
    return root, data


@pytest.fixture(scope="module")
def corpus(spark, tmp_path_factory):
    return cone_corpus(spark, tmp_path_factory.mktemp("apply"), N, D, seed=21)


def fitted(spark, root, method, **params):
    config = FitConfig(input=str(root / "corpus"), artifact=str(root / f"{method}-artifact"), method=method, **params)
    return run_fit(spark, config), config.artifact


def cli_args(**settings):
    return [part for key, value in settings.items() for part in ("--" + key.replace("_", "-"), str(value))]


def test_abtt_fit_apply_idempotent_and_diagnosed(spark, corpus, capsys):
    root, data = corpus
    manifest, artifact = fitted(spark, root, "abtt")
    # issue 43: without D the textbook's starting point max(1, round(d/100)) = 1, recorded unverified
    assert manifest["params"] == {"D": 1, "d_rule": "rule_of_thumb_d/100 (unverified)", "directions": [1]}
    assert manifest["fitted_on"] == {"path": str(root / "corpus"), "format": "delta", "version": 0}
    config = ApplyConfig(input=str(root / "corpus"), artifact=artifact, output=str(root / "abtt-out"))
    first = run_apply(spark, config)
    assert first["status"] == "written" and first["output_version"] == 0
    out = spark.read.format("delta").load(config.output)
    assert out.columns == ["id", "title", "token_count", "vector", "transform_version"]
    rows = out.orderBy("id").collect()
    assert len(rows) == N and {r["transform_version"] for r in rows} == {manifest["transform_version"]}
    assert rows[5]["title"] == "doc5" and rows[5]["token_count"] == D + 5
    expected = load_artifact(artifact).transform.apply(data)
    assert np.allclose(np.array([r["vector"] for r in rows]), expected, rtol=1e-12, atol=1e-12)

    before = diagnose_dataframe(spark.read.format("delta").load(config.input), "vector", D)
    after = diagnose_dataframe(out, "vector", D)
    floor = -1.0 / (N - 1)  # A of a centred cloud with equal norms
    assert before["anisotropy_A"] > 0.8
    assert floor <= after["anisotropy_A"] < floor + 1e-4
    removed = manifest["params"]["D"]  # the top-D directions removed
    assert after["spectrum"][-1] < 1e-20 * before["spectrum"][0] + 1e-12
    assert np.allclose(after["spectrum"][: D - removed], before["spectrum"][removed:], rtol=1e-9)

    again = run_apply(spark, config)  # same input version + transform: skipped
    assert again["status"] == "skipped" and latest_commit(spark, config.output)[0] == 0
    assert (
        apply_main(
            ["--conf", "conf/apply.yaml"]
            + cli_args(  # the CLI, same decision
                input=config.input, artifact=artifact, output=config.output, on_invalid="error"
            )
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["status"] == "skipped"
    forced = run_apply(spark, dataclasses.replace(config, force=True))
    assert forced["output_version"] == 1
    assert spark.read.format("delta").load(config.output).count() == N  # overwrite: never duplicated


def test_whitening_output_is_white_in_k_dims(spark, corpus, capsys):
    root, _ = corpus
    artifact = str(root / "whitening-artifact")
    assert (
        fit_main(
            ["--conf", "conf/fit.yaml"]
            + cli_args(input=root / "corpus", artifact=artifact, method="whitening", k=6, on_invalid="error")
        )
        == 0
    )
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["d_out"] == 6 and manifest["params"]["k"] == 6 and manifest["params"]["clamped"] == 0
    config = ApplyConfig(
        input=str(root / "corpus"), artifact=artifact, output=str(root / "white-out"), output_col="white"
    )
    run_apply(spark, config)
    out = spark.read.format("delta").load(config.output)
    assert out.columns == ["id", "title", "token_count", "vector", "white", "transform_version"]
    report = diagnose_dataframe(out, "white", 6)
    assert np.allclose(report["spectrum"], 1.0, atol=1e-9)
    assert report["top1_var"] == pytest.approx(1 / 6, abs=1e-9)
    assert np.allclose(report["mean"], 0.0, atol=1e-9)


def test_failed_run_leaves_previous_version_unchanged(spark, corpus, tmp_path):
    root, data = corpus
    source = str(tmp_path / "source")
    write_table(spark, source, data)
    good = Artifact(Center(data.mean(axis=0)), {"transform_version": "center-good", "n": N, "fitted_on": None})
    config = ApplyConfig(input=source, artifact="(injected)", output=str(tmp_path / "out"))
    assert run_apply(spark, config, artifact=good)["output_version"] == 0
    snapshot = sorted(tuple(r["vector"]) for r in spark.read.format("delta").load(config.output).collect())

    marker = data[:5].copy()
    marker[:, 0] = MARKER
    write_table(spark, source, marker, start=N, mode="append")  # input version 1
    bad = Artifact(FailingCenter(data.mean(axis=0)), {"transform_version": "failing-1", "n": N, "fitted_on": None})
    with pytest.raises(Exception, match="injected failure"):
        run_apply(spark, config, artifact=bad)
    assert latest_commit(spark, config.output)[0] == 0
    now = spark.read.format("delta").load(config.output)
    assert now.count() == N and {r["transform_version"] for r in now.select("transform_version").collect()} == {
        "center-good"
    }
    assert sorted(tuple(r["vector"]) for r in now.collect()) == snapshot


def test_invalid_rows_and_dimension_mismatch(spark, corpus, tmp_path):
    root, data = corpus
    _, artifact = fitted(spark, root, "center")
    broken = str(tmp_path / "broken")
    bad = data[:20].copy()
    bad[3, 2] = np.nan
    write_table(spark, broken, bad)
    config = ApplyConfig(input=broken, artifact=artifact, output=str(tmp_path / "o"))
    with pytest.raises(InvalidRowsError, match=r"non_finite.*\[3\]"):
        run_apply(spark, config)
    assert latest_commit(spark, config.output) is None
    narrow = str(tmp_path / "narrow")
    write_table(spark, narrow, data[:20, :8])
    with pytest.raises(ArtifactError, match="dimension 8 but transform center-"):
        run_apply(spark, dataclasses.replace(config, input=narrow))


def test_check_batch_names_the_length_of_a_batch_with_no_vector_of_the_dimension():
    """``foreign_length``: the first non-null vector's length when no non-null vector of the batch has the expected
    dimension; None when one has it, or when every vector is null."""

    def batch(vectors):
        return pa.RecordBatch.from_arrays(
            [pa.array(range(len(vectors)), pa.int64()), pa.array(vectors, pa.list_(pa.float32()))], ["id", "vector"]
        )

    assert check_batch(batch([None, [1.0, 2.0], [1.0, 2.0, 3.0]]), "vector", "id", 4).foreign_length == 2
    assert check_batch(batch([[1.0, 2.0], [1.0, 2.0, 3.0, 4.0]]), "vector", "id", 4).foreign_length is None
    assert check_batch(batch([None, None]), "vector", "id", 4).foreign_length is None
    assert check_batch(batch([[1.0, 2.0, 3.0, 4.0]]), "vector", "id", 4).foreign_length is None


def test_a_table_of_another_dimension_is_refused_and_a_stray_first_row_quarantined(spark, corpus, tmp_path):
    """The dimension is checked inside the one pass, on each partition's first Arrow batch: a table of another
    dimension fails it with ArtifactError and nothing committed (with on_invalid: quarantine too), while one row of
    another length is quarantined like any invalid row, even when it is the table's first row."""
    root, data = corpus
    _, artifact = fitted(spark, root, "center")
    narrow = str(tmp_path / "narrow")
    write_table(spark, narrow, data[:20, :8])
    config = ApplyConfig(
        input=narrow,
        artifact=artifact,
        output=str(tmp_path / "o"),
        on_invalid="quarantine",
        quarantine_path=str(tmp_path / "q"),
    )
    with pytest.raises(
        ArtifactError,
        match=f"^input vectors have dimension 8 but transform center-[0-9a-f]{{12}} was fitted on dimension {D}$",
    ):
        run_apply(spark, config)
    assert latest_commit(spark, config.output) is None
    stray = str(tmp_path / "stray")
    rows = [(0, [1.0, 2.0])] + [(i, [float(v) for v in data[i]]) for i in range(1, 20)]
    spark.createDataFrame(rows, "id long, vector array<double>").coalesce(1).write.format("delta").save(stray)
    assert spark.read.format("delta").load(stray).first()["id"] == 0
    summary = run_apply(spark, dataclasses.replace(config, input=stray))
    assert summary["status"] == "written" and summary["invalid_by_reason"] == {"wrong_dimension:2": 1}
    out = spark.read.format("delta").load(config.output)
    assert sorted(r["id"] for r in out.collect()) == list(range(1, 20))


def float32_table(spark, path, matrix, bad_rows=()):
    """Delta table ``id long, vector array<float>`` of ``matrix``; the ids in ``bad_rows`` get a NaN vector."""
    rows = [
        (i, [float("nan")] * len(row) if i in bad_rows else [float(v) for v in row]) for i, row in enumerate(matrix)
    ]
    spark.createDataFrame(rows, "id long, vector array<float>").repartition(2).write.format("delta").save(path)
    return path


@pytest.mark.parametrize("output_dtype, element", [("same", "float"), ("float64", "double"), ("float32", "float")])
def test_output_dtype_and_one_pass_quarantine(spark, corpus, tmp_path, output_dtype, element):
    """array<float> in → array<float> out by default; the key overrides; quarantined rows counted in one apply."""
    root, data = corpus
    _, artifact = fitted(spark, root, "center")
    source = float32_table(spark, str(tmp_path / "f32"), data[:50], bad_rows={4, 9})
    config = ApplyConfig(
        input=source,
        artifact=artifact,
        output=str(tmp_path / "o"),
        output_dtype=output_dtype,
        on_invalid="quarantine",
        quarantine_path=str(tmp_path / "q"),
    )
    summary = run_apply(spark, config)
    assert summary["invalid_rows"] == 2 and summary["invalid_by_reason"] == {"non_finite": 2}
    out = spark.read.format("delta").load(config.output)
    assert out.schema["vector"].dataType.simpleString() == f"array<{element}>"
    assert out.schema["vector"].dataType.containsNull is True  # the published type is the input's, nullable
    got = {r["id"]: np.array(r["vector"]) for r in out.collect()}
    assert sorted(got) == [i for i in range(50) if i not in (4, 9)]
    want = data[:50].astype(np.float32).astype(np.float64) - load_artifact(artifact).transform.mean
    tolerance = 1e-12 if element == "double" else 1e-6
    for i, vector in got.items():
        expected = want[i].astype(np.float32) if element == "float" else want[i]
        np.testing.assert_allclose(vector, expected, rtol=tolerance, atol=tolerance)
    quarantined = spark.read.format("delta").load(str(tmp_path / "q"))
    assert sorted(r["id"] for r in quarantined.collect()) == [4, 9]


def test_float32_overflow_after_cast_is_refused(spark, corpus, tmp_path):
    root, data = corpus
    huge = Artifact(Center(np.full(D, -1e39)), {"transform_version": "center-huge", "n": N, "fitted_on": None})
    source = float32_table(spark, str(tmp_path / "f32"), data[:10])
    config = ApplyConfig(input=source, artifact="unused", output=str(tmp_path / "o"), output_dtype="float32")
    with pytest.raises(Exception, match="non-finite output value after the cast to float32"):
        run_apply(spark, config, artifact=huge)
    assert latest_commit(spark, config.output) is None


def test_duplicate_ids_quarantined_or_refused_before_writing(spark, corpus, tmp_path):
    """Issue 12: every copy of a repeated id leaves the output (reason duplicate_id), counted exactly; a copy whose
    vector is invalid keeps its own reason; with on_invalid: error nothing is written and sample ids are named."""
    root, data = corpus
    _, artifact = fitted(spark, root, "center")
    rows = [(i, [float(v) for v in data[i]]) for i in range(30)]
    rows += [(7, [float(v) for v in data[40]]), (11, [float(v) for v in data[41]]), (11, [float("nan")] * D)]
    source = str(tmp_path / "dups")
    spark.createDataFrame(rows, "id long, vector array<double>").repartition(2).write.format("delta").save(source)
    strict = ApplyConfig(input=source, artifact=artifact, output=str(tmp_path / "o"))
    with pytest.raises(InvalidRowsError, match=r"'duplicate_id': 4.*sample id values: \[7, 11\]"):
        run_apply(spark, strict)
    assert latest_commit(spark, strict.output) is None
    lenient = dataclasses.replace(strict, on_invalid="quarantine", quarantine_path=str(tmp_path / "q"))
    summary = run_apply(spark, lenient)
    assert summary["invalid_by_reason"] == {"duplicate_id": 4, "non_finite": 1}
    published = sorted(r["id"] for r in spark.read.format("delta").load(lenient.output).collect())
    assert published == [i for i in range(30) if i not in (7, 11)]
    quarantined = sorted(
        (r["id"], r["invalid_reason"]) for r in spark.read.format("delta").load(lenient.quarantine_path).collect()
    )
    assert quarantined == [(7, "duplicate_id")] * 2 + [(11, "duplicate_id")] * 2 + [(11, "non_finite")]


def test_id_aggregate_shuffles_one_partition_per_local_core(spark):
    """The duplicate-id aggregate reads 2 GiB splits; in a local session it shuffles the ids into one partition per
    core, elsewhere into the session's own number; afterwards the session's setting is back."""
    splits = {"spark.sql.files.maxPartitionBytes": str(2 << 30)}
    assert id_scan_conf("local[2]") == {**splits, "spark.sql.shuffle.partitions": "2"}
    assert id_scan_conf("spark://host:7077") == splits
    before = spark.conf.get("spark.sql.shuffle.partitions")
    ids = spark.createDataFrame([(i % 5,) for i in range(12)], "id long")
    assert find_duplicates(ids, "id").tally.counts == {"duplicate_id": 12}
    assert spark.conf.get("spark.sql.shuffle.partitions") == before


def test_duplicate_ids_beyond_the_ceiling_mean_the_table_is_not_keyed(spark, monkeypatch):
    """More duplicated ids than the driver keeps (MAX_DUPLICATE_IDS, patched to 3 here) is refused with their exact
    number of ids and rows; at the ceiling they are all returned, with every copy counted."""
    import anisotropy_spark.quarantine as quarantine

    monkeypatch.setattr(quarantine, "MAX_DUPLICATE_IDS", 3)
    ids = spark.createDataFrame([(i % 4,) for i in range(10)] + [(None,), (None,), (99,)], "id long")
    with pytest.raises(
        InvalidRowsError,
        match=r"^4 ids of column 'id' occur more than once \(10 rows\): "
        r"the table is not keyed by 'id'$",
    ):
        find_duplicates(ids, "id")
    at_ceiling = find_duplicates(ids.where("id < 3 or id is null"), "id")
    assert at_ceiling.tally.counts == {"duplicate_id": 8}
    assert sorted(r["id"] for r in at_ceiling.ids.collect()) == [0, 1, 2]


def test_quarantine_is_idempotent_and_stamped(spark, tmp_path):
    """Issue 12: a row that stays invalid is quarantined once, with the run id and input version of the run that
    first saw it; a new invalid row is added; an older quarantine table without the new columns gains them."""
    from anisotropy_spark.io import validate

    quarantine = str(tmp_path / "q")
    spark.createDataFrame(
        [(-9, None, "null_vector")], "id long, vector array<double>, invalid_reason string"
    ).write.format("delta").save(quarantine)  # written by an earlier release
    good = [(i, [float(i), 1.0, 2.0 * i]) for i in range(20)]
    night1 = spark.createDataFrame(good + [(-1, None), (-2, [1.0])], "id long, vector array<double>")
    for run_id, version in (("r1", 0), ("r2", 1)):
        checked = validate(night1, "vector", "id", 3, "quarantine", quarantine, run_id=run_id, input_version=version)
        assert checked.invalid_by_reason == {"null_vector": 1, "wrong_dimension:1": 1}
    night3 = night1.unionByName(spark.createDataFrame([(-3, [float("inf"), 0.0, 0.0])], night1.schema))
    validate(night3, "vector", "id", 3, "quarantine", quarantine, run_id="r3", input_version=2)
    rows = sorted(
        (r["id"], r["run_id"], r["input_version"]) for r in spark.read.format("delta").load(quarantine).collect()
    )
    assert rows == [(-9, None, None), (-3, "r3", 2), (-2, "r1", 0), (-1, "r1", 0)]


def published(spark, path):
    return {
        r["id"]: (r["title"], r["token_count"], tuple(r["vector"]))
        for r in spark.read.format("delta").load(path).collect()
    }


def test_pyarrow_reader_publishes_what_sparks_scan_does(spark, corpus, tmp_path):
    """``vector_reader: auto`` reads the pinned files with pyarrow (one task per row group) and publishes exactly
    the table, quarantine and counts that Spark's scan gives (``vector_reader: spark``)."""
    root, data = corpus
    _, artifact = fitted(spark, root, "abtt")
    bad = data[:40].copy()
    bad[5, 1] = np.inf
    source = str(tmp_path / "source")
    write_table(spark, source, bad)
    write_table(spark, source, data[:3], start=7, mode="append")  # ids 7, 8, 9 repeated: duplicate_id × 6
    results = {}
    for reader in ("auto", "spark"):
        config = ApplyConfig(
            input=source,
            artifact=artifact,
            output=str(tmp_path / f"o-{reader}"),
            on_invalid="quarantine",
            quarantine_path=str(tmp_path / f"q-{reader}"),
            vector_reader=reader,
        )
        summary = run_apply(spark, config)
        quarantined = sorted(
            (r["id"], r["invalid_reason"]) for r in spark.read.format("delta").load(config.quarantine_path).collect()
        )
        results[reader] = (summary, published(spark, config.output), quarantined)
    (auto, out_auto, q_auto), (plain, out_spark, q_spark) = results["auto"], results["spark"]
    assert auto["reader"] == "pyarrow" and plain["reader"] == "spark (vector_reader: spark)"
    assert auto["invalid_by_reason"] == plain["invalid_by_reason"] == {"duplicate_id": 6, "non_finite": 1}
    assert sorted(out_auto) == [i for i in range(40) if i not in (5, 7, 8, 9)]
    assert out_auto == out_spark and q_auto == q_spark


def test_files_pyarrow_cannot_serve_are_written_through_sparks_scan(spark, corpus, tmp_path, monkeypatch):
    """A data file that is not the table's columns fails the pyarrow write with nothing committed, and the job
    writes once through Spark's scan (version 0), saying why; ``vector_reader: pyarrow`` raises instead. Footers
    that do not add up to the version's row count are refused before any write."""
    root, data = corpus
    _, artifact = fitted(spark, root, "center")
    source = str(tmp_path / "source")
    write_table(spark, source, data[:30])
    stray = tmp_path / "stray.parquet"  # listed with the table's files: no title column
    pq.write_table(pa.table({"id": [999], "vector": pa.array([[0.0] * D], pa.list_(pa.float64()))}), stray)
    listed = apply_job.table_files

    def with_stray(*args):
        files, planned = listed(*args)
        return dataclasses.replace(files, uris=files.uris + (stray.as_uri(),), rows=files.rows + 1), planned

    monkeypatch.setattr(apply_job, "table_files", with_stray)
    config = ApplyConfig(input=source, artifact=artifact, output=str(tmp_path / "o"))
    summary = run_apply(spark, config)
    assert summary["output_version"] == 0 and summary["reader"].startswith("spark (")
    assert "stray.parquet has no column(s) ['title', 'token_count']" in summary["reader"]
    assert sorted(published(spark, config.output)) == list(range(30))
    with pytest.raises(FileLayoutError, match="has no column"):
        run_apply(spark, dataclasses.replace(config, output=str(tmp_path / "o2"), vector_reader="pyarrow"))
    assert latest_commit(spark, str(tmp_path / "o2")) is None

    def miscounted(*args):
        files, planned = listed(*args)
        return dataclasses.replace(files, rows=files.rows + 1), planned

    monkeypatch.setattr(apply_job, "table_files", miscounted)
    summary = run_apply(spark, dataclasses.replace(config, output=str(tmp_path / "o3")))
    assert summary["reader"] == "spark (the data files hold 30 rows, the table version 31)"
    assert summary["output_version"] == 0 and sorted(published(spark, str(tmp_path / "o3"))) == list(range(30))


def test_output_is_coalesced_to_the_target_file_size(spark, corpus, tmp_path):
    """A 40-file input is written as ceil(input bytes / target_file_mb) files (the pinned version's data files,
    as Delta's log sizes them), the same rows and values as one file per input row group."""
    root, data = corpus
    _, artifact = fitted(spark, root, "abtt")
    source = str(tmp_path / "source")
    rows = [(i, f"doc{i}", i % 7, [float(v) for v in row]) for i, row in enumerate(data)]
    (
        spark.createDataFrame(rows, "id long, title string, token_count int, vector array<double>")
        .repartition(40)
        .write.format("delta")
        .save(source)
    )
    files = spark.read.format("delta").load(source).inputFiles()
    size = sum(os.path.getsize(urllib.parse.urlparse(f).path) for f in files)
    assert len(files) == 40 and scan_bytes(spark.read.format("delta").option("versionAsOf", 0).load(source)) == size
    outputs = {}
    for name, target_mb in (("per_row_group", 1e-6), ("coalesced", 0.02)):
        config = ApplyConfig(input=source, artifact=artifact, output=str(tmp_path / name), target_file_mb=target_mb)
        summary = run_apply(spark, config)
        assert summary["reader"] == "pyarrow" and summary["output_files"] == file_count(size, target_mb)
        written = spark.read.format("delta").load(config.output)
        outputs[name] = (len(written.inputFiles()), {r["id"]: r["vector"] for r in written.collect()})
    expected = math.ceil(size / (0.02 * 2**20))
    assert 1 < expected < 10 and outputs["coalesced"][0] == expected and outputs["per_row_group"][0] == 40
    assert outputs["coalesced"][1] == outputs["per_row_group"][1] and sorted(outputs["coalesced"][1]) == list(range(N))


def test_target_file_mb_is_checked():
    with pytest.raises(ConfigError, match="target_file_mb must be > 0, got 0"):
        from_mapping(ApplyConfig, {"input": "a", "artifact": "b", "output": "c", "target_file_mb": 0})
