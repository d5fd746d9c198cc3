"""The one filesystem layer for artifacts, reports and run records: local paths and URIs alike.

Every path may be a local path or a URI: ``file://``, ``s3://`` (Hadoop's ``s3a://`` / ``s3n://`` are the
same objects and map to pyarrow's ``s3``), ``gs://`` / ``gcs://``, ``hdfs://``, resolved by
:func:`pyarrow.fs.FileSystem.from_uri` (credentials from the environment, as for any pyarrow client). It needs
no Spark session, so a serving process loads artifacts the same way the batch jobs write them.

Atomicity: :func:`write_atomic` writes a temporary name in the target's directory and then moves it onto the
target. On a local disk and on HDFS the move is an atomic rename. Object stores (S3, GCS) have no rename: the
move is a copy plus delete, and a single PUT of the finished object is what a reader sees, never a partial
one. Multi-file outputs therefore write their payload first and their manifest LAST, and readers verify the
content hash the manifest records (see :mod:`anisotropy_core.artifact`), so a reader either finds no manifest,
or a manifest whose hash matches the payload, or an error naming the mismatch.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import uuid

from pyarrow import fs as pafs

SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}


def split_scheme(path: str) -> tuple[str, str]:
    """(scheme, rest) of ``path``; scheme ``""`` for a plain local path."""
    scheme, sep, rest = path.partition("://")
    return (scheme.lower(), rest) if sep else ("", path)


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem holding ``path`` and the path within it."""
    scheme, rest = split_scheme(path)
    if not scheme:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    uri = f"{SCHEME_ALIASES.get(scheme, scheme)}://{rest}"
    return pafs.FileSystem.from_uri(uri)


def join(base: str, *parts: str) -> str:
    """``base`` / parts, keeping a URI's scheme (``os.path.join`` for local paths)."""
    scheme, _ = split_scheme(base)
    return posixpath.join(base, *parts) if scheme else os.path.join(base, *parts)


def same_location(left: str, right: str) -> bool:
    """True when two paths (or URIs) name the same location (by name: no filesystem is contacted)."""

    def key(path: str) -> tuple[str, str]:
        scheme, rest = split_scheme(path)
        if scheme in ("", "file"):
            return "file", os.path.abspath(rest if scheme else path)
        return SCHEME_ALIASES.get(scheme, scheme), rest.rstrip("/")

    return key(left) == key(right)


def exists(path: str) -> bool:
    filesystem, inner = resolve(path)
    return filesystem.get_file_info(inner).type != pafs.FileType.NotFound


def is_file(path: str) -> bool:
    filesystem, inner = resolve(path)
    return filesystem.get_file_info(inner).type == pafs.FileType.File


def list_files(folder: str) -> list[str]:
    """The paths (as ``join(folder, name)``) of the files directly in ``folder``, sorted; empty when ``folder``
    does not exist."""
    filesystem, inner = resolve(folder)
    found = filesystem.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    return sorted(join(folder, posixpath.basename(info.path)) for info in found if info.type == pafs.FileType.File)


def read_bytes(path: str) -> bytes:
    filesystem, inner = resolve(path)
    with filesystem.open_input_stream(inner) as stream:
        return stream.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def write_atomic(path: str, payload: bytes | str) -> None:
    """Write ``payload`` to ``path`` (directories created) through a temporary name moved onto it, so a
    reader sees the old content or the new, never a partial file (see the module docstring for object stores)."""
    filesystem, inner = resolve(path)
    folder = posixpath.dirname(inner) if "/" in inner else "."
    filesystem.create_dir(folder, recursive=True)
    temporary = posixpath.join(folder, f".tmp-{uuid.uuid4().hex}-{posixpath.basename(inner)}")
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    with filesystem.open_output_stream(temporary) as stream:
        stream.write(data)
    filesystem.move(temporary, inner)


def remove_tree(path: str) -> None:
    """Delete the directory ``path`` and everything under it; nothing happens when it does not exist."""
    filesystem, inner = resolve(path)
    if filesystem.get_file_info(inner).type != pafs.FileType.NotFound:
        filesystem.delete_dir(inner)


CHUNK = 8 << 20  # bytes per read when streaming a file (hashing, copying) instead of holding it in memory


def size(path: str) -> int:
    """The size in bytes of the file ``path``."""
    filesystem, inner = resolve(path)
    info = filesystem.get_file_info(inner)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"{path}: not a file")
    return int(info.size)


def local_path(path: str) -> str | None:
    """The operating-system path of ``path`` when it lies on the local filesystem (a plain path or ``file://``),
    else None (an object store or HDFS: copy it with :func:`download_file` to open it by name)."""
    filesystem, inner = resolve(path)
    return inner if isinstance(filesystem, pafs.LocalFileSystem) else None


def sha256(path: str) -> str:
    """Hex sha256 of the file ``path``, streamed in :data:`CHUNK` reads (memory does not grow with the file)."""
    digest = hashlib.sha256()
    filesystem, inner = resolve(path)
    with filesystem.open_input_stream(inner) as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _copy_stream(source: pafs.FileSystem, source_path: str, target: pafs.FileSystem, target_path: str) -> None:
    with source.open_input_stream(source_path) as reader, target.open_output_stream(target_path) as writer:
        while chunk := reader.read(CHUNK):
            writer.write(chunk)


def upload_file(local: str, path: str) -> None:
    """Copy the local file ``local`` to ``path`` (local path or URI) as :func:`write_atomic` writes: streamed to a
    temporary name in the target's directory, then moved onto ``path``."""
    filesystem, inner = resolve(path)
    folder = posixpath.dirname(inner) if "/" in inner else "."
    filesystem.create_dir(folder, recursive=True)
    temporary = posixpath.join(folder, f".tmp-{uuid.uuid4().hex}-{posixpath.basename(inner)}")
    _copy_stream(pafs.LocalFileSystem(), os.path.abspath(local), filesystem, temporary)
    filesystem.move(temporary, inner)


def download_file(path: str, local: str) -> None:
    """Copy the file ``path`` (local path or URI) to the local file ``local``, streamed."""
    filesystem, inner = resolve(path)
    os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
    _copy_stream(filesystem, inner, pafs.LocalFileSystem(), os.path.abspath(local))
