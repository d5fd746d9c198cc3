"""The filesystem layer (local paths and file:// URIs) and Delta detection by Delta itself."""

import json

import numpy as np
import pytest

from anisotropy_core import storage
from anisotropy_core.artifact import ArtifactError, load_artifact, save_artifact
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import fit_abtt
from anisotropy_spark.io import is_delta_table, read_table


def test_paths_and_uris_name_the_same_files(tmp_path):
    uri = f"file://{tmp_path}/a/b.json"
    storage.write_atomic(uri, '{"x": 1}')
    assert json.loads((tmp_path / "a" / "b.json").read_text()) == {"x": 1}
    assert storage.read_text(str(tmp_path / "a" / "b.json")) == '{"x": 1}'
    assert (
        storage.is_file(uri) and storage.exists(f"file://{tmp_path}/a") and not storage.is_file(f"file://{tmp_path}/a")
    )
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["b.json"]  # no temporary left behind
    assert storage.join("s3a://bucket/models", "v1", "manifest.json") == "s3a://bucket/models/v1/manifest.json"
    assert storage.same_location(str(tmp_path / "t"), f"file://{tmp_path}/t/")
    assert storage.same_location("s3a://bucket/t", "s3://bucket/t") and not storage.same_location(
        "s3://b/t", "gs://b/t"
    )


def test_artifact_round_trip_and_hash_check_through_a_file_uri(tmp_path):
    x = np.random.default_rng(0).normal(size=(200, 6)) + 3.0
    transform = fit_abtt(Moments.of_batch(x), D=1)
    uri = f"file://{tmp_path}/abtt-v1"
    manifest = save_artifact(uri, transform, 200)
    loaded = load_artifact(uri)
    assert loaded.transform_version == manifest["transform_version"]
    assert np.array_equal(loaded.transform.apply(x), transform.apply(x))
    arrays = dict(np.load(tmp_path / "abtt-v1" / "arrays.npz"))
    arrays["components"][0, 0] += 1e-9
    np.savez(tmp_path / "abtt-v1" / "arrays.npz", **arrays)
    with pytest.raises(ArtifactError, match="hash mismatch"):
        load_artifact(uri)


def test_delta_table_without_suffix_at_a_file_uri_is_read_as_delta_pinned(spark, tmp_path):
    uri = f"file://{tmp_path}/embeddings"
    df = spark.createDataFrame([(1, [1.0, 2.0])], "id long, vector array<double>")
    df.write.format("delta").save(uri)
    df.write.format("delta").mode("append").save(uri)
    assert is_delta_table(spark, uri) and is_delta_table(spark, str(tmp_path / "embeddings"))
    rows, ref = read_table(spark, uri)
    assert (ref.format, ref.version) == ("delta", 1) and rows.count() == 2
    first, ref0 = read_table(spark, uri, 0)
    assert ref0.version == 0 and first.count() == 1
    df.write.parquet(str(tmp_path / "plain"))
    assert not is_delta_table(spark, f"file://{tmp_path}/plain")
    assert read_table(spark, f"file://{tmp_path}/plain")[1].format == "parquet"
