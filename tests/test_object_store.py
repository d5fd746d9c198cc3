"""Artifacts, reports and run records on an S3-compatible object store (issue 11, item 1): moto's S3 server on
localhost, reached through the one filesystem layer (``anisotropy_core.storage``, pyarrow.fs) by ``s3a://`` and
``s3://`` URIs exactly as on a cluster (endpoint and credentials from the standard AWS environment variables)."""

import numpy as np
import pytest
from moto.server import ThreadedMotoServer
from pyarrow import fs

from anisotropy_core import storage
from anisotropy_core.artifact import ArtifactError, load_artifact, save_artifact
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import fit_abtt

BUCKET = "embeddings"


@pytest.fixture(scope="module")
def s3():
    """A bucket on a local moto S3 server; yields a pyarrow filesystem on it for inspecting what was written."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as env:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        }.items():
            env.setenv(key, value)
        filesystem = fs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", allow_bucket_creation=True)
        filesystem.create_dir(BUCKET)
        yield filesystem
    server.stop()


def fitted_abtt():
    X = np.random.default_rng(0).normal(size=(60, 5)) + 3.0
    return fit_abtt(Moments.of_batch(X), D=1), X


def keys_under(s3, prefix: str) -> list[str]:
    return sorted(
        info.path
        for info in s3.get_file_info(fs.FileSelector(f"{BUCKET}/{prefix}", recursive=True))
        if info.type == fs.FileType.File
    )


def test_artifact_round_trip_on_s3a_leaves_only_payload_and_manifest(s3):
    transform, X = fitted_abtt()
    uri = f"s3a://{BUCKET}/transforms/abtt"
    saved = save_artifact(uri, transform, n=60)
    loaded = load_artifact(uri, expected_dimension=5)
    assert loaded.manifest["transform_version"] == saved["transform_version"]
    np.testing.assert_allclose(loaded.transform.apply(X), transform.apply(X), rtol=0, atol=0)
    # the atomic writes left no temporary objects behind: exactly the payload and the manifest
    assert keys_under(s3, "transforms/abtt") == [
        f"{BUCKET}/transforms/abtt/arrays.npz",
        f"{BUCKET}/transforms/abtt/manifest.json",
    ]


def test_truncated_object_on_s3_is_refused_naming_the_uri(s3):
    transform, _ = fitted_abtt()
    uri = f"s3a://{BUCKET}/transforms/truncated"
    save_artifact(uri, transform, n=60)
    payload = storage.read_bytes(f"{uri}/arrays.npz")
    with s3.open_output_stream(f"{BUCKET}/transforms/truncated/arrays.npz") as out:
        out.write(payload[:100])
    with pytest.raises(ArtifactError, match=rf"{uri}/arrays\.npz: unreadable arrays \(BadZipFile"):
        load_artifact(uri)


def test_reports_and_run_records_overwrite_in_place_through_s3_uris(s3):
    record = f"s3://{BUCKET}/runs/run-1.json"
    assert not storage.exists(record)
    storage.write_atomic(record, '{"status": "running"}')
    storage.write_atomic(record, '{"status": "published"}')
    assert storage.read_text(record) == '{"status": "published"}'
    assert keys_under(s3, "runs") == [f"{BUCKET}/runs/run-1.json"]
    storage.write_atomic(f"s3a://{BUCKET}/reports/spectrum.png", b"\x89PNG\r\n")
    assert storage.read_bytes(f"s3://{BUCKET}/reports/spectrum.png") == b"\x89PNG\r\n"
