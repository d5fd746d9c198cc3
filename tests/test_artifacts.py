"""Every unreadable artifact raises ArtifactError naming the path and the problem (issue 12, item 6)."""

import json

import numpy as np
import pytest

from anisotropy_core.artifact import ArtifactError, load_artifact, save_artifact
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import fit_abtt


@pytest.fixture
def artifact(tmp_path):
    X = np.random.default_rng(0).normal(size=(60, 5)) + 3.0
    path = tmp_path / "abtt"
    save_artifact(str(path), fit_abtt(Moments.of_batch(X), D=1), n=60)
    assert load_artifact(str(path)).transform.d_in == 5
    return path


def test_truncated_arrays_name_the_file(artifact):
    npz = artifact / "arrays.npz"
    npz.write_bytes(npz.read_bytes()[:100])
    with pytest.raises(ArtifactError, match=r"arrays\.npz: unreadable arrays \(BadZipFile"):
        load_artifact(str(artifact))


def test_deleted_arrays_name_the_file(artifact):
    (artifact / "arrays.npz").unlink()
    with pytest.raises(ArtifactError, match=r"abtt/arrays\.npz: unreadable arrays \(FileNotFoundError"):
        load_artifact(str(artifact))


def test_broken_manifest_json_names_the_file(artifact):
    manifest = artifact / "manifest.json"
    manifest.write_text(manifest.read_text()[:-20])
    with pytest.raises(ArtifactError, match=r"abtt/manifest\.json: unreadable manifest \(JSONDecodeError"):
        load_artifact(str(artifact))


def test_manifest_without_arrays_entry(artifact):
    manifest = artifact / "manifest.json"
    content = json.loads(manifest.read_text())
    del content["arrays"]
    manifest.write_text(json.dumps(content))
    with pytest.raises(ArtifactError, match="incomplete manifest or arrays"):
        load_artifact(str(artifact))


def test_edited_transform_version_says_what_differs(artifact):
    manifest = artifact / "manifest.json"
    content = json.loads(manifest.read_text())
    real = content["transform_version"]
    content["transform_version"] = "abtt-000000000000"
    manifest.write_text(json.dumps(content))
    with pytest.raises(ArtifactError) as info:
        load_artifact(str(artifact))
    message = str(info.value)
    assert "'abtt-000000000000' does not match the content" in message and f"expected {real}" in message
    assert "hash mismatch" not in message  # not the old message printing two identical hashes


def test_tampered_arrays_print_both_hashes(artifact):
    arrays = dict(np.load(artifact / "arrays.npz"))
    name = next(iter(arrays))
    arrays[name] = arrays[name] + 1e-6
    np.savez(artifact / "arrays.npz", **arrays)
    with pytest.raises(ArtifactError, match="content hash mismatch") as info:
        load_artifact(str(artifact))
    said, found = str(info.value).split("manifest says ")[1].split(", content is ")
    assert said != found
