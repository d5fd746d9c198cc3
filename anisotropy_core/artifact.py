"""Versioned transform artifacts: a directory with ``arrays.npz`` + ``manifest.json``. numpy, and pyarrow for the
files (:mod:`.storage`: local paths and object stores).

Layout of ``<path>/``::

    arrays.npz      every fitted float64 array, np.savez (loaded with allow_pickle=False: no code runs)
    manifest.json   {"format": "anisotropy-transform", "format_version": 1,
                     "method", "params", "d_in", "d_out", "n",
                     "arrays": {name: {"shape": [...], "dtype": "float64"}},
                     "fitted_on": {"path", "format", "version"} | null,
                     "created_at" (UTC ISO-8601), "content_sha256", "transform_version"}

``content_sha256`` covers the method, params, dimensions, n, fitted_on and every array's name, shape,
dtype and bytes (not ``created_at``), so refitting the same numbers gives the same hash.
``transform_version`` = ``<method>-<first 12 hex of the hash>``: the value written to every output row.

Query side (a serving process with no Spark)::

    from anisotropy_core.artifact import load_artifact
    transform = load_artifact("/models/abtt-v1").transform
    z = transform.apply(query_vectors)          # (m, d_in) → (m, d_out), identical to the batch job
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
from dataclasses import dataclass
import zipfile
from typing import Any

import numpy as np

from . import storage
from .transforms import FittedTransform, from_parts

FORMAT = "anisotropy-transform"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ARRAYS = "arrays.npz"


class ArtifactError(ValueError):
    """The artifact is missing, corrupt, tampered with, or does not fit the input."""


@dataclass(frozen=True)
class Artifact:
    """A loaded artifact: the fitted ``transform`` and its ``manifest`` dict."""

    transform: FittedTransform
    manifest: dict[str, Any]

    @property
    def transform_version(self) -> str:
        return self.manifest["transform_version"]

    def dimension_mismatch(self, d: int) -> "ArtifactError | None":
        """The :class:`ArtifactError` of input vectors of dimension ``d``, None when they fit this transform."""
        if d == self.transform.d_in:
            return None
        return ArtifactError(
            f"input vectors have dimension {d} but transform {self.transform_version} was fitted "
            f"on dimension {self.transform.d_in}"
        )

    def check_dimension(self, d: int) -> None:
        """Raise :class:`ArtifactError` unless input vectors of dimension ``d`` fit this transform."""
        mismatch = self.dimension_mismatch(d)
        if mismatch is not None:
            raise mismatch


def content_hash(transform: FittedTransform, n: int, fitted_on: dict | None) -> str:
    """sha256 over the canonical description and array bytes of a fitted transform."""
    digest = hashlib.sha256()
    head = {
        "method": transform.method,
        "params": transform.params(),
        "d_in": transform.d_in,
        "d_out": transform.d_out,
        "n": int(n),
        "fitted_on": fitted_on,
    }
    digest.update(json.dumps(head, sort_keys=True).encode())
    for name, array in sorted(transform.arrays().items()):
        array = np.ascontiguousarray(array, dtype=np.float64)
        digest.update(f"{name}:{array.shape}:float64".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def build_manifest(transform: FittedTransform, n: int, fitted_on: dict | None = None) -> dict[str, Any]:
    """The manifest for ``transform`` fitted on ``n`` vectors of the table ``fitted_on``."""
    sha = content_hash(transform, n, fitted_on)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "method": transform.method,
        "params": transform.params(),
        "d_in": transform.d_in,
        "d_out": transform.d_out,
        "n": int(n),
        "arrays": {k: {"shape": list(np.shape(v)), "dtype": "float64"} for k, v in transform.arrays().items()},
        "fitted_on": fitted_on,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "content_sha256": sha,
        "transform_version": f"{transform.method}-{sha[:12]}",
    }


def save_artifact(path: str, transform: FittedTransform, n: int, fitted_on: dict | None = None) -> dict:
    """Write the artifact directory at ``path`` (a local path or URI, see :mod:`anisotropy_core.storage`;
    created; existing files replaced) and return its manifest.

    Files are written to temporaries and moved into place, manifest last, and loading verifies the content
    hash, so a reader never uses a manifest with arrays from another fit (also on object stores).
    """
    manifest = build_manifest(transform, n, fitted_on)
    buffer = io.BytesIO()
    arrays = {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in transform.arrays().items()}
    # numpy's stub lists allow_pickle: bool beside **kwds, and mypy checks a **dict against it (numpy < 2.1 has no
    # such keyword, so it is not passed)
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    storage.write_atomic(storage.join(path, ARRAYS), buffer.getvalue())
    storage.write_atomic(storage.join(path, MANIFEST), json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def load_artifact(path: str, expected_dimension: int | None = None) -> Artifact:
    """Load and verify an artifact: format, array shapes, content hash and (optionally) input dimension.
    Anything unreadable (missing file, broken JSON, truncated npz, tampered content) raises
    :class:`ArtifactError` naming ``path`` and the problem."""
    manifest_path = storage.join(path, MANIFEST)
    if not storage.is_file(manifest_path):
        raise ArtifactError(f"no transform artifact at {path}: {MANIFEST} not found")
    try:
        manifest = json.loads(storage.read_text(manifest_path))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{manifest_path}: unreadable manifest ({type(exc).__name__}: {exc})") from exc
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != FORMAT
        or manifest.get("format_version") != FORMAT_VERSION
    ):
        raise ArtifactError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} artifact")
    arrays_path = storage.join(path, ARRAYS)
    try:
        with np.load(io.BytesIO(storage.read_bytes(arrays_path)), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ArtifactError(f"{arrays_path}: unreadable arrays ({type(exc).__name__}: {exc})") from exc
    try:
        declared = {k: tuple(v["shape"]) for k, v in manifest["arrays"].items()}
        actual = {k: tuple(v.shape) for k, v in arrays.items()}
        if declared != actual:
            raise ArtifactError(f"{path}: arrays {actual} do not match the manifest {declared}")
        transform = from_parts(manifest["method"], manifest["params"], arrays)
        sha = content_hash(transform, manifest["n"], manifest["fitted_on"])
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"{path}: incomplete manifest or arrays (missing {exc})") from exc
    if sha != manifest.get("content_sha256"):
        raise ArtifactError(
            f"{path}: content hash mismatch (artifact modified or corrupt); "
            f"manifest says {manifest.get('content_sha256')}, content is {sha}"
        )
    if manifest.get("transform_version") != f"{transform.method}-{sha[:12]}":
        raise ArtifactError(
            f"{path}: transform_version {manifest.get('transform_version')!r} does not match the "
            f"content (expected {transform.method}-{sha[:12]}; the manifest was edited)"
        )
    if (transform.d_in, transform.d_out) != (manifest.get("d_in"), manifest.get("d_out")):
        raise ArtifactError(f"{path}: transform dimensions do not match the manifest")
    artifact = Artifact(transform, manifest)
    if expected_dimension is not None:
        artifact.check_dimension(expected_dimension)
    return artifact
