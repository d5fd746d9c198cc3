"""The corpus index: a faiss index of L2-normalised vectors (inner product = cosine), versioned like the transform
artifacts, behind a ``CURRENT`` pointer, and its query side (:class:`Searcher`). No Spark.

Layout of ``<index_dir>/``::

    CURRENT                       the name of the current version (one line), replaced atomically, only after
                                  the new version was written and read back
    <index_version>/index.faiss   faiss's own serialisation (faiss.serialize_index)
    <index_version>/index.ivfdata only for an index merged on disk (:func:`merge_shards_ondisk`): the inverted
                                  lists as faiss's ``OnDiskInvertedLists`` file, memory-mapped by the reader
    <index_version>/transform/    a copy of the transform artifact the vectors were corrected with (absent for an
                                  index of raw vectors): the query side can never drift from the index
    <index_version>/manifest.json {"format": "anisotropy-index", "format_version": 1, "factory", "nlist",
                                   "nprobe", "nprobe_curve": [{"nprobe", "recall"}…], "d", "n", "metric",
                                   "normalized": true, "built_from": {"path", "version"} | null,
                                   "transform_version" | null, "verification", "created_at",
                                   "content_sha256", "index_version"}
                                  (format_version 2, on disk, adds "ivfdata": {"file", "bytes", "sha256"})

``content_sha256`` covers every manifest field except ``created_at`` (and itself and ``index_version``) plus the
index bytes (and so, through ``ivfdata.sha256``, the ``.ivfdata`` file); ``index_version`` =
``index-<first 12 hex of the hash>``. Files are written through
:mod:`anisotropy_core.storage` (payload first, manifest last, then ``CURRENT``), so a reader following ``CURRENT``
finds a complete, hash-checked version or the previous one.

On-disk inverted lists: when the shards do not fit the driver's memory budget the shards are merged by faiss's
on-disk merge into an ``.ivfdata`` file (:func:`merge_shards_ondisk`). faiss records the file's NAME inside the
index; :func:`to_bytes` records the bare name ``index.ivfdata`` (never the build's temporary path) and the reader
(:func:`from_bytes` with ``ivfdata``) reads the index without its list data and maps the ``.ivfdata`` that lies
next to ``index.faiss`` in the version folder (read-only), so a version directory can be moved or copied (or
loaded from an object store, whose ``.ivfdata`` is first copied to a local temporary file) and still loads.
Readers of format_version 1 refuse a version 2 index instead of looking for ``index.ivfdata`` in their working
directory.

Query side::

    from anisotropy_core.index import Searcher
    searcher = Searcher.load("/indexes/corpus")        # CURRENT → index + its transform
    ids, scores = searcher.search(raw_queries, k=10)   # (m, d_in) raw → (m, k) int64 ids, (m, k) cosines
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import faiss
import numpy as np

from . import storage
from .artifact import Artifact, ArtifactError, load_artifact, save_artifact
from .evaluation import NO_ID, recall_at_k, unit_rows
from .transforms import FittedTransform

FORMAT = "anisotropy-index"
FORMAT_VERSION = 1
ONDISK_FORMAT_VERSION = 2  # an index whose inverted lists are the ``.ivfdata`` file next to it
CURRENT = "CURRENT"
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
IVFDATA_FILE = "index.ivfdata"
TRANSFORM_DIR = "transform"
METRIC = "inner_product"
DEFAULT_FACTORY = "IVF{nlist},Flat"
NPROBES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
HASHED_OUT = ("created_at", "content_sha256", "index_version")


class IndexArtifactError(ArtifactError):
    """The index is missing, corrupt, tampered with, or does not fit the queries (a config error, exit 2)."""


def default_nlist(n: int) -> int:
    """nlist ≈ 4·√n rounded to the nearest power of two (in log scale), at least 1 and at most ``n``."""
    if n < 1:
        raise ValueError(f"cannot size an index of {n} vectors")
    nlist = 2 ** round(math.log2(4 * math.sqrt(n)))
    return int(max(1, min(nlist, 2 ** int(math.log2(n)))))


def factory_for(factory: str, n: int) -> str:
    """``factory`` with ``{nlist}`` replaced by :func:`default_nlist` (n)."""
    return factory.replace("{nlist}", str(default_nlist(n))) if "{nlist}" in factory else factory


def unit_float32(vectors: np.ndarray) -> np.ndarray:
    """(m, d) rows scaled to unit length in float64, as a C-contiguous float32 matrix (what faiss takes)."""
    return np.ascontiguousarray(unit_rows(vectors), dtype=np.float32)


def integral_ids(ids: Any, where: str = "ids") -> np.ndarray:
    """``ids`` as (m,) int64; raises naming the first position that is null, fractional or not a number."""
    array = np.asarray(ids)
    if array.dtype.kind in "iu":
        return array.astype(np.int64)
    try:
        values = np.asarray(array, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: index ids must be integers, got {array.dtype}") from None
    bad = ~np.isfinite(values) | (values != np.round(values))
    if bad.any():
        first = int(np.argmax(bad))
        raise ValueError(f"{where}: index ids must be integers; row {first} holds {array[first].item()!r}")
    return values.astype(np.int64)


def train_index(factory: str, sample: np.ndarray) -> faiss.Index:
    """An empty faiss index of ``factory`` (``{nlist}`` filled from the sample size if present) trained on the
    unit rows of ``sample`` (m, d): the coarse quantizer, plus PQ/SQ codebooks where the string asks for them.
    Metric: inner product. Raises ValueError for a string faiss rejects or a sample too small to train."""
    sample = np.asarray(sample)
    if sample.ndim != 2 or sample.shape[0] < 1:
        raise ValueError(f"the training sample must be an (m, d) matrix with m >= 1, got shape {sample.shape}")
    factory = factory_for(factory, sample.shape[0])
    try:
        index = faiss.index_factory(sample.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise ValueError(
            f"faiss rejects the factory string {factory!r} at d = {sample.shape[1]}: "
            f"{str(exc).strip().splitlines()[-1]}"
        ) from None
    nlist = ivf_of(index).nlist if is_ivf(index) else 1
    if sample.shape[0] < nlist:
        raise ValueError(f"index {factory!r} has {nlist} lists but the training sample only {sample.shape[0]} rows")
    index.train(unit_float32(sample))
    return index


def is_ivf(index: faiss.Index) -> bool:
    try:
        faiss.extract_index_ivf(index)
    except RuntimeError:
        return False
    return True


def ivf_of(index: faiss.Index) -> faiss.IndexIVF:
    return faiss.extract_index_ivf(index)


def set_nprobe(index: faiss.Index, nprobe: int) -> None:
    """Probe ``nprobe`` inverted lists per query (no-op for an index without lists)."""
    if is_ivf(index):
        ivf_of(index).nprobe = int(nprobe)


def add_vectors(index: faiss.Index, ids: np.ndarray, vectors: np.ndarray) -> None:
    """``add_with_ids`` of the unit rows of ``vectors`` (m, d) with int64 ``ids`` (m,)."""
    index.add_with_ids(unit_float32(vectors), integral_ids(ids))


def ondisk_lists(index: faiss.Index) -> Any:
    """The ``faiss.OnDiskInvertedLists`` of ``index``, None when its inverted lists are in memory (or it has
    none)."""
    if not is_ivf(index):
        return None
    invlists = ivf_of(index).invlists
    lists = faiss.downcast_InvertedLists(invlists) if invlists is not None else None
    return lists if isinstance(lists, faiss.OnDiskInvertedLists) else None


def ivfdata_file(index: faiss.Index) -> str | None:
    """The local file holding the inverted lists of an index merged on disk; None for an in-memory index."""
    lists = ondisk_lists(index)
    return None if lists is None else str(lists.filename)


def to_bytes(index: faiss.Index) -> bytes:
    """faiss's own serialisation of ``index``. For on-disk inverted lists: the index without the list data, which
    names its ``.ivfdata`` file by the bare :data:`IVFDATA_FILE` (the file's place in a version folder), not by
    the path it has now, so the bytes do not depend on where the merge ran."""
    lists = ondisk_lists(index)
    if lists is None:
        return faiss.serialize_index(index).tobytes()
    where = lists.filename
    lists.filename = IVFDATA_FILE
    try:
        return faiss.serialize_index(index).tobytes()
    finally:
        lists.filename = where


def from_bytes(payload: bytes, ivfdata: str | None = None) -> faiss.Index:
    """The index :func:`to_bytes` wrote. ``ivfdata``: the local ``.ivfdata`` file of an index with on-disk
    inverted lists, memory-mapped read-only (the name recorded inside the index is not used)."""
    if ivfdata is None:
        return faiss.deserialize_index(np.frombuffer(payload, dtype=np.uint8))
    reader = faiss.VectorIOReader()
    faiss.copy_array_to_vector(np.frombuffer(payload, dtype=np.uint8), reader.data)
    index = faiss.read_index(reader, faiss.IO_FLAG_SKIP_IVF_DATA)
    lists = ondisk_lists(index)
    if lists is None:
        raise ValueError("the index has no on-disk inverted lists, but an .ivfdata file was given")
    lists.filename = os.path.abspath(ivfdata)
    lists.read_only = True
    lists.do_mmap()
    return index


def merge_shards(trained: faiss.Index, shards: Iterable[bytes]) -> faiss.Index:
    """One index holding every vector of ``shards`` (serialised copies of ``trained`` with vectors added), in the
    order given: faiss's ``IndexIVF.merge_from`` moves each shard's inverted lists onto ``trained`` (ids kept).
    Holds the merged index plus one shard at a time. ``trained`` must be empty; it is returned filled."""
    if trained.ntotal:
        raise ValueError("merge_shards needs the empty trained index")
    for payload in shards:
        shard = from_bytes(payload)
        if is_ivf(trained):
            ivf_of(trained).merge_from(ivf_of(shard), 0)
            trained.ntotal = ivf_of(trained).ntotal
        else:
            trained.merge_from(shard, 0)
    return trained


@contextlib.contextmanager
def _c_stdout_to_stderr() -> Iterator[None]:
    """Send what C code prints on stdout to stderr meanwhile (faiss's ``OnDiskInvertedLists`` printf()s a
    "resizing …" line; the jobs keep stdout for their JSON record)."""
    try:
        libc = ctypes.CDLL(None)
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, AttributeError, ValueError):
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


def merge_shards_ondisk(trained: faiss.Index, shard_files: Sequence[str], ivfdata: str) -> faiss.Index:
    """One index holding every vector of the shard files ``shard_files`` (local files of serialised copies of
    ``trained`` with vectors added), its inverted lists on disk in the new local file ``ivfdata``: faiss's
    on-disk merge, the recipe of ``faiss.contrib.ondisk.merge_ondisk`` — the shards are memory-mapped
    (``IO_FLAG_MMAP``, never loaded), ``OnDiskInvertedLists.merge_from_multiple`` writes each list's entries
    shard after shard (ids kept), and the lists replace the trained index's. The entries of each list are thus
    in the order of :func:`merge_shards`, so searches give the same ids and distances. Unlike ``merge_ondisk``
    the shards' mappings are released once merged (it leaks them to keep their lists alive), so deleting the
    shard files frees their disk space before the process ends. ``trained`` must be an empty IVF index
    (not IVFPQR, which faiss cannot put on disk); it is returned filled. Memory: the trained index and the
    list metadata, whatever the number of vectors."""
    if trained.ntotal:
        raise ValueError("merge_shards_ondisk needs the empty trained index")
    if not is_ivf(trained) or isinstance(ivf_of(trained), faiss.IndexIVFPQR):
        raise ValueError("only an IVF index (other than IVFPQR) can hold its inverted lists on disk")
    if os.path.exists(ivfdata):
        raise ValueError(f"{ivfdata} exists: the on-disk merge writes a new file")
    shards = [faiss.read_index(name, faiss.IO_FLAG_MMAP) for name in shard_files]
    sources = faiss.InvertedListsPtrVector()  # type: ignore[attr-defined]  # in the SWIG module, not its stubs
    for shard in shards:
        sources.push_back(ivf_of(shard).invlists)
    ivf = ivf_of(trained)
    lists = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, ivfdata)
    with _c_stdout_to_stderr():
        ntotal = lists.merge_from_multiple(sources.data(), sources.size(), False)
    ivf.replace_invlists(lists, True)
    lists.this.disown()  # type: ignore[attr-defined]  # owned by the index now (SWIG proxy attribute)
    ivf.ntotal = ntotal
    trained.ntotal = ntotal
    del sources, shards  # unmaps the shards
    return trained


def search_excluding(
    index: faiss.Index, queries: np.ndarray, k: int, exclude: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(scores (m, k), ids (m, k)) of the unit rows of ``queries``; ``exclude`` (m,): a query's own id is never
    returned (k + 1 are searched and the query's id dropped). Missing results: id ``NO_ID``, score −inf."""
    x = unit_float32(queries)
    extra = 0 if exclude is None else 1
    scores, ids = index.search(x, k + extra)
    if exclude is not None:
        keep = ids != np.asarray(exclude, dtype=np.int64)[:, None]
        order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
        scores, ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
        dropped = ~np.take_along_axis(keep, order, 1)
        ids[dropped], scores[dropped] = NO_ID, -np.inf
    ids = ids.astype(np.int64)
    scores = np.where(ids == NO_ID, -np.inf, scores).astype(np.float64)
    return scores, ids


def recall_against(found: np.ndarray, exact: np.ndarray) -> float:
    """recall@k of ``found`` (m, k) ids against the ``exact`` (m, k) top-k ids (``NO_ID`` entries ignored)."""
    relevant = [row[row != NO_ID] for row in exact]
    keep = [i for i, row in enumerate(relevant) if row.size]
    if not keep:
        raise ValueError("no exact neighbours to measure recall against")
    return recall_at_k(found[keep], [relevant[i] for i in keep])


def nprobe_curve(
    index: faiss.Index,
    queries: np.ndarray,
    exact: np.ndarray,
    k: int,
    exclude: np.ndarray | None = None,
    nprobes: Sequence[int] = NPROBES,
) -> list[dict]:
    """[{"nprobe", "recall"}…]: recall@k of ``index`` against the ``exact`` (m, k) ids for each nprobe of
    ``nprobes`` up to the index's nlist (one entry for an index without lists); stops once recall is 1."""
    limit = ivf_of(index).nlist if is_ivf(index) else 1
    curve = []
    for nprobe in [p for p in nprobes if p <= limit] or [limit]:
        set_nprobe(index, nprobe)
        curve.append(
            {"nprobe": int(nprobe), "recall": recall_against(search_excluding(index, queries, k, exclude)[1], exact)}
        )
        if curve[-1]["recall"] >= 1.0:
            break
    return curve


def pick_nprobe(curve: list[dict], target: float) -> int | None:
    """The smallest nprobe of ``curve`` whose recall reaches ``target``; None when none does."""
    reached = [point["nprobe"] for point in curve if point["recall"] >= target]
    return min(reached) if reached else None


def imbalance_factor(index: faiss.Index) -> float | None:
    """faiss's list-size imbalance of the inverted lists (1 = all lists equal; None without lists)."""
    lists = ivf_of(index).invlists if is_ivf(index) else None
    return None if lists is None else float(lists.imbalance_factor())


def index_quality(
    index: faiss.Index, queries: np.ndarray, exact: np.ndarray, k: int, nprobe: int, exclude: np.ndarray | None = None
) -> dict:
    """{"imbalance_factor", "recall@k", "search_seconds", "queries", "nprobe"}: the list-size imbalance, the recall
    against the ``exact`` ids in the index's own space and the wall time of searching ``queries`` (m, d) at
    ``nprobe``."""
    set_nprobe(index, nprobe)
    start = time.perf_counter()
    _, found = search_excluding(index, queries, k, exclude)
    seconds = time.perf_counter() - start
    return {
        "imbalance_factor": imbalance_factor(index),
        f"recall@{k}": recall_against(found, exact),
        "search_seconds": seconds,
        "queries": int(len(queries)),
        "nprobe": int(nprobe),
    }


def content_hash(manifest: dict, payload: bytes) -> str:
    """sha256 over the manifest's fields (all but :data:`HASHED_OUT`) and the index bytes."""
    digest = hashlib.sha256()
    digest.update(json.dumps({k: v for k, v in manifest.items() if k not in HASHED_OUT}, sort_keys=True).encode())
    digest.update(hashlib.sha256(payload).digest())
    return digest.hexdigest()


def build_manifest(
    index: faiss.Index,
    factory: str,
    nprobe: int,
    curve: list[dict],
    payload: bytes,
    built_from: dict | None,
    transform_version: str | None,
    verification: dict,
) -> dict:
    """The manifest of ``index`` (serialised as ``payload``); see the module docstring. An index merged on disk
    gets format_version 2 and the size and sha256 of its ``.ivfdata`` file (streamed, not loaded)."""
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "factory": factory,
        "nlist": int(ivf_of(index).nlist) if is_ivf(index) else None,
        "nprobe": int(nprobe),
        "nprobe_curve": curve,
        "d": int(index.d),
        "n": int(index.ntotal),
        "metric": METRIC,
        "normalized": True,
        "built_from": built_from,
        "transform_version": transform_version,
        "verification": verification,
    }
    data = ivfdata_file(index)
    if data is not None:
        manifest["format_version"] = ONDISK_FORMAT_VERSION
        manifest["ivfdata"] = {"file": IVFDATA_FILE, "bytes": storage.size(data), "sha256": storage.sha256(data)}
    sha = content_hash(manifest, payload)
    return {
        **manifest,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "content_sha256": sha,
        "index_version": f"index-{sha[:12]}",
    }


def current_version(index_dir: str) -> str | None:
    """The version ``CURRENT`` names, None when there is no ``CURRENT``."""
    pointer = storage.join(index_dir, CURRENT)
    return storage.read_text(pointer).strip() if storage.is_file(pointer) else None


def save_index(index_dir: str, index: faiss.Index, manifest: dict, transform: Artifact | None) -> str:
    """Write the version directory of ``manifest`` (index bytes, the transform copy, manifest last) under
    ``index_dir`` WITHOUT touching ``CURRENT``; returns its path."""
    if (transform is None) != (manifest["transform_version"] is None):
        raise ValueError("the manifest's transform_version and the transform given disagree")
    data = ivfdata_file(index)
    if (data is None) != (manifest.get("ivfdata") is None):
        raise ValueError("the manifest's ivfdata and the index's inverted lists (in memory or on disk) disagree")
    folder = storage.join(index_dir, manifest["index_version"])
    if data is not None:  # streamed: the lists are never loaded
        storage.upload_file(data, storage.join(folder, manifest["ivfdata"]["file"]))
    storage.write_atomic(storage.join(folder, INDEX_FILE), to_bytes(index))
    if transform is not None:
        copied = save_artifact(
            storage.join(folder, TRANSFORM_DIR),
            transform.transform,
            transform.manifest["n"],
            transform.manifest["fitted_on"],
        )
        if copied["transform_version"] != transform.transform_version:
            raise ArtifactError(
                f"the copy of transform {transform.transform_version} hashes to {copied['transform_version']}"
            )
    storage.write_atomic(storage.join(folder, MANIFEST), json.dumps(manifest, indent=2, sort_keys=True))
    return folder


def publish_index(index_dir: str, index: faiss.Index, manifest: dict, transform: Artifact | None) -> str:
    """Save the version (:func:`save_index`), read it back through :meth:`Searcher.open` (hash, dimensions,
    transform), and only then point ``CURRENT`` at it. Returns the version. A failure before the pointer moves
    leaves the previous version current."""
    save_index(index_dir, index, manifest, transform)
    Searcher.open(index_dir, manifest["index_version"])
    storage.write_atomic(storage.join(index_dir, CURRENT), manifest["index_version"] + "\n")
    return manifest["index_version"]


@dataclass
class Searcher:
    """A loaded index version: the faiss ``index`` (d = the transform's output dimension), its ``manifest`` and the
    ``transform`` applied to raw queries (None for an index of raw vectors)."""

    index: faiss.Index
    manifest: dict
    transform: FittedTransform | None
    location: str

    @property
    def dimension(self) -> int:
        """The dimension of the raw queries :meth:`search` takes."""
        return self.transform.d_in if self.transform is not None else int(self.index.d)

    @classmethod
    def load(cls, index_uri: str, expected_dimension: int | None = None) -> "Searcher":
        """The version ``CURRENT`` names under ``index_uri`` (local path or URI), hash-checked. ``expected_dimension``:
        the raw query dimension the caller has; another raises :class:`IndexArtifactError` naming both."""
        version = current_version(index_uri)
        if version is None:
            raise IndexArtifactError(f"no index at {index_uri}: {CURRENT} not found")
        return cls.open(index_uri, version, expected_dimension)

    @classmethod
    def open(cls, index_uri: str, version: str, expected_dimension: int | None = None) -> "Searcher":
        """The version ``version`` under ``index_uri``, hash-checked (current or not)."""
        folder = storage.join(index_uri, version)
        manifest_path = storage.join(folder, MANIFEST)
        if not storage.is_file(manifest_path):
            raise IndexArtifactError(f"{folder}: {MANIFEST} not found (index version {version} is incomplete)")
        try:
            manifest = json.loads(storage.read_text(manifest_path))
            payload = storage.read_bytes(storage.join(folder, INDEX_FILE))
        except (OSError, ValueError) as exc:
            raise IndexArtifactError(f"{folder}: unreadable index ({type(exc).__name__}: {exc})") from exc
        if (
            not isinstance(manifest, dict)
            or manifest.get("format") != FORMAT
            or manifest.get("format_version") not in (FORMAT_VERSION, ONDISK_FORMAT_VERSION)
            or (manifest.get("format_version") == ONDISK_FORMAT_VERSION) != isinstance(manifest.get("ivfdata"), dict)
        ):
            raise IndexArtifactError(f"{folder}: not a {FORMAT} v{FORMAT_VERSION} or v{ONDISK_FORMAT_VERSION} index")
        sha = content_hash(manifest, payload)
        if sha != manifest.get("content_sha256") or manifest.get("index_version") != f"index-{sha[:12]}":
            raise IndexArtifactError(
                f"{folder}: content hash mismatch (index modified or corrupt); manifest says "
                f"{manifest.get('content_sha256')}, content is {sha}"
            )
        with _local_ivfdata(folder, manifest.get("ivfdata")) as data:
            try:
                index = from_bytes(payload, data)
            except (RuntimeError, ValueError) as exc:
                raise IndexArtifactError(f"{folder}: faiss cannot read the index ({exc})") from exc
        if (index.d, index.ntotal) != (manifest["d"], manifest["n"]):
            raise IndexArtifactError(
                f"{folder}: the index holds {index.ntotal} × {index.d}, the manifest says "
                f"{manifest['n']} × {manifest['d']}"
            )
        transform = None
        if manifest["transform_version"] is not None:
            artifact = load_artifact(storage.join(folder, TRANSFORM_DIR))
            if artifact.transform_version != manifest["transform_version"]:
                raise IndexArtifactError(
                    f"{folder}: transform {artifact.transform_version} is not the "
                    f"{manifest['transform_version']} the index was built with"
                )
            transform = artifact.transform
            if transform.d_out != index.d:
                raise IndexArtifactError(
                    f"{folder}: transform outputs dimension {transform.d_out}, the index holds dimension {index.d}"
                )
        set_nprobe(index, manifest["nprobe"])
        searcher = cls(index, manifest, transform, folder)
        if expected_dimension is not None:
            searcher.check_dimension(expected_dimension)
        return searcher

    def check_dimension(self, d: int) -> None:
        """Raise :class:`IndexArtifactError` unless raw queries of dimension ``d`` fit this index."""
        if d != self.dimension:
            raise IndexArtifactError(
                f"queries have dimension {d} but index {self.manifest['index_version']} at {self.location} was "
                f"built for dimension {self.dimension} (built from {self.manifest['built_from']}); rebuild the index "
                f"for the new dimension"
            )

    def search(self, raw_queries: np.ndarray, k: int = 10, nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids (m, k) int64, scores (m, k) float64 cosines) of raw queries (m, d_in) (one query: (d_in,)): the
        transform, then L2-normalisation, then the index at ``nprobe`` (default: the manifest's). Missing
        results (fewer than k vectors reachable): id −1, score −inf."""
        queries = np.atleast_2d(np.asarray(raw_queries, dtype=np.float64))
        self.check_dimension(queries.shape[1])
        return search_raw(self.index, self.transform, queries, k, self.manifest["nprobe"] if nprobe is None else nprobe)


def search_raw(
    index: faiss.Index,
    transform: FittedTransform | None,
    raw_queries: np.ndarray,
    k: int,
    nprobe: int,
    exclude: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """What :meth:`Searcher.search` does with raw queries (m, d_in): ``transform`` (None: none), then
    L2-normalisation, then ``index`` at ``nprobe`` (``exclude``: see :func:`search_excluding`). Returns
    (ids (m, k), scores (m, k)). The index job's nDCG verification searches through this same function."""
    queries = np.atleast_2d(np.asarray(raw_queries, dtype=np.float64))
    if not np.isfinite(queries).all():
        raise ValueError(f"query row {int(np.argmin(np.isfinite(queries).all(axis=1)))} is not finite")
    z = transform.apply(queries) if transform is not None else queries
    set_nprobe(index, nprobe)
    scores, ids = search_excluding(index, z, k, exclude)
    return ids, scores


@contextlib.contextmanager
def _local_ivfdata(folder: str, entry: dict | None) -> Iterator[str | None]:
    """The local ``.ivfdata`` file of a version (None for an in-memory index) after its size and sha256 were
    checked against the manifest's ``entry``: the file itself on a local filesystem; from an object store, a copy
    in a temporary file removed on exit (a mapping made meanwhile keeps its data: POSIX unlinks a mapped file's
    name only)."""
    if entry is None:
        yield None
        return
    name = entry.get("file")
    if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
        raise IndexArtifactError(f"{folder}: bad ivfdata file name {name!r}")
    path = storage.join(folder, name)
    local = storage.local_path(path)
    copy = None
    try:
        try:
            if local is None:
                handle, copy = tempfile.mkstemp(prefix="anisotropy-index-", suffix=".ivfdata")
                os.close(handle)
                storage.download_file(path, copy)
                local = copy
            size, sha = storage.size(local), storage.sha256(local)
        except OSError as exc:
            raise IndexArtifactError(f"{folder}: unreadable {name} ({type(exc).__name__}: {exc})") from exc
        if (size, sha) != (entry.get("bytes"), entry.get("sha256")):
            raise IndexArtifactError(
                f"{folder}: content hash mismatch of {name} (modified or corrupt); manifest says "
                f"{entry.get('bytes')} bytes, sha256 {entry.get('sha256')}; the file has "
                f"{size} bytes, sha256 {sha}"
            )
        yield local
    finally:
        if copy is not None:
            os.unlink(copy)
