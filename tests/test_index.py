"""The corpus index: faiss core (numpy only), the Spark shard build and merge, the job's verification and swap, a
kill −9 during the index stage (subprocesses, :mod:`tests.index_with_faults`), and the query side."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import faiss
import numpy as np
import pytest
import yaml

from anisotropy_core import index as core
from anisotropy_core.artifact import load_artifact, save_artifact
from anisotropy_core.moments import Moments
from anisotropy_core.synthetic import cone
from anisotropy_core.transforms import fit_abtt

REPO = pathlib.Path(__file__).resolve().parent.parent
N, D = 600, 16
FACTORY = "IVF16,Flat"


def corpus(n: int = N, d: int = D, seed: int = 0) -> np.ndarray:
    return cone(n, d, offset=4.0, alpha=1.0, seed=seed)


def published(
    index_dir: pathlib.Path,
    X: np.ndarray,
    artifact_dir: pathlib.Path | None = None,
    factory: str = FACTORY,
    nprobe: int = 4,
) -> core.Searcher:
    """An index of ``X`` (corrected by the artifact at ``artifact_dir`` when given) built in this process and
    published under ``index_dir``."""
    artifact = load_artifact(str(artifact_dir)) if artifact_dir else None
    Z = artifact.transform.apply(X) if artifact else X
    index = core.train_index(factory, Z)
    core.add_vectors(index, np.arange(len(Z)), Z)
    manifest = core.build_manifest(
        index,
        factory,
        nprobe,
        [],
        core.to_bytes(index),
        None,
        artifact.transform_version if artifact else None,
        {"k": 10},
    )
    core.publish_index(str(index_dir), index, manifest, artifact)
    return core.Searcher.load(str(index_dir))


# ---------------------------------------------------------------- core (numpy + faiss, no Spark)


def test_default_nlist_is_four_root_n_as_a_power_of_two():
    assert core.default_nlist(1_000_000) == 4096  # 4·1000 = 4000 → 2^12
    assert core.default_nlist(10_000) == 512  # 400 → 2^9 (log2 400 = 8.64)
    assert core.default_nlist(3) == 2  # never more lists than vectors
    assert core.factory_for("IVF{nlist},PQ8", 10_000) == "IVF512,PQ8"


def test_shard_merge_equals_one_process_build():
    X = corpus()
    trained = core.train_index(FACTORY, X)
    payload = core.to_bytes(trained)
    shards = []
    for rows in np.array_split(np.arange(N), 4):
        shard = core.from_bytes(payload)
        core.add_vectors(shard, rows + 1000, X[rows])
        shards.append(core.to_bytes(shard))
    merged = core.merge_shards(core.from_bytes(payload), shards)
    single = core.from_bytes(payload)
    core.add_vectors(single, np.arange(N) + 1000, X)
    assert merged.ntotal == single.ntotal == N
    for nprobe in (1, 4, 16):
        a, b = (
            core.search_excluding(merged, X[:50], 10, np.arange(50) + 1000),
            core.search_excluding(single, X[:50], 10, np.arange(50) + 1000),
        )
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[0], b[0])
    assert not (a[1] == np.arange(50)[:, None] + 1000).any()  # the query's own row is excluded


def shard_files(X: np.ndarray, trained: faiss.Index, folder: pathlib.Path, parts: int = 4) -> list[str]:
    """``X`` (ids 1000 + row) added to copies of ``trained`` in ``parts`` row ranges, written as shard files."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for j, rows in enumerate(np.array_split(np.arange(len(X)), parts)):
        shard = core.from_bytes(core.to_bytes(trained))
        core.add_vectors(shard, rows + 1000, X[rows])
        files.append(str(folder / f"shard-{j}.faiss"))
        pathlib.Path(files[-1]).write_bytes(core.to_bytes(shard))
    return files


def test_ondisk_merge_equals_memory_merge_and_one_process_build(tmp_path):
    X = corpus()
    trained = core.train_index(FACTORY, X)
    files = shard_files(X, trained, tmp_path / "shards")
    memory = core.merge_shards(core.from_bytes(core.to_bytes(trained)), (pathlib.Path(f).read_bytes() for f in files))
    ondisk = core.merge_shards_ondisk(core.from_bytes(core.to_bytes(trained)), files, str(tmp_path / "work.ivfdata"))
    single = core.from_bytes(core.to_bytes(trained))
    core.add_vectors(single, np.arange(N) + 1000, X)
    assert core.ivfdata_file(ondisk) == str(tmp_path / "work.ivfdata") and core.ivfdata_file(memory) is None
    assert ondisk.ntotal == memory.ntotal == single.ntotal == N
    for nprobe in (1, 4, 16):
        results = []
        for index in (ondisk, memory, single):
            core.set_nprobe(index, nprobe)
            results.append(core.search_excluding(index, X[:50], 10, np.arange(50) + 1000))
        for scores, ids in results[1:]:
            np.testing.assert_array_equal(results[0][1], ids)
            np.testing.assert_array_equal(results[0][0], scores)
    assert str(tmp_path).encode() not in core.to_bytes(ondisk)  # the bytes name the .ivfdata by its bare name
    assert core.ivfdata_file(ondisk) == str(tmp_path / "work.ivfdata")


def test_ondisk_index_publishes_loads_moves_and_is_hash_checked(tmp_path, monkeypatch):
    X = corpus()
    trained = core.train_index(FACTORY, X)
    files = shard_files(X, trained, tmp_path / "shards")
    ondisk = core.merge_shards_ondisk(core.from_bytes(core.to_bytes(trained)), files, str(tmp_path / "work.ivfdata"))
    manifest = core.build_manifest(ondisk, FACTORY, 4, [], core.to_bytes(ondisk), None, None, {"k": 10})
    assert manifest["format_version"] == core.ONDISK_FORMAT_VERSION
    assert manifest["ivfdata"]["bytes"] == (tmp_path / "work.ivfdata").stat().st_size
    version = core.publish_index(str(tmp_path / "index"), ondisk, manifest, None)
    folder = tmp_path / "index" / version
    assert sorted(p.name for p in folder.iterdir()) == [core.INDEX_FILE, core.IVFDATA_FILE, core.MANIFEST]
    memory = published(tmp_path / "memory", X)  # ids 0…N−1, the shards' are 1000 + row
    want = memory.search(X[:30], k=10)
    want = (want[0] + 1000, want[1])
    (tmp_path / "work.ivfdata").unlink()  # the build's file is not what is read
    shutil.move(str(tmp_path / "index"), str(tmp_path / "moved"))  # nor is the folder it was written to
    for uri in (str(tmp_path / "moved"), f"file://{tmp_path / 'moved'}"):
        searcher = core.Searcher.load(uri)
        assert core.ivfdata_file(searcher.index) == str(tmp_path / "moved" / version / core.IVFDATA_FILE)
        got = searcher.search(X[:30], k=10)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    with monkeypatch.context() as patch:  # as from an object store: a local copy
        patch.setattr(core.storage, "local_path", lambda path: None)
        searcher = core.Searcher.load(str(tmp_path / "moved"))
        copy = core.ivfdata_file(searcher.index)
        assert not copy.startswith(str(tmp_path)) and not os.path.exists(copy)  # mapped, its name removed
        np.testing.assert_array_equal(searcher.search(X[:30], k=10)[0], want[0])
    data = tmp_path / "moved" / version / core.IVFDATA_FILE
    payload = bytearray(data.read_bytes())
    payload[-1] ^= 1
    data.write_bytes(bytes(payload))
    with pytest.raises(core.IndexArtifactError, match="content hash mismatch of index.ivfdata"):
        core.Searcher.load(str(tmp_path / "moved"))
    data.write_bytes(bytes(payload[:-4]))
    with pytest.raises(core.IndexArtifactError, match="content hash mismatch of index.ivfdata"):
        core.Searcher.load(str(tmp_path / "moved"))
    data.unlink()
    with pytest.raises(core.IndexArtifactError, match="unreadable index.ivfdata"):
        core.Searcher.load(str(tmp_path / "moved"))


def test_ondisk_merge_of_remote_shards_in_a_temporary_workspace(tmp_path, monkeypatch):
    """Shards and index_dir on an object store (here: every path treated as not local): the shards are copied
    into a temporary workspace, merged there and the copies removed; close() removes the workspace."""
    from anisotropy_spark import index_build

    X = corpus()
    trained = core.train_index(FACTORY, X)
    files = shard_files(X, trained, tmp_path / "shards")
    monkeypatch.setattr(index_build.storage, "local_path", lambda path: None)
    workspace = index_build.merge_workspace(str(tmp_path / "index"), "build")
    assert not workspace.startswith(str(tmp_path)) and not (tmp_path / "index").exists()
    merged = index_build.merge_on_disk(core.from_bytes(core.to_bytes(trained)), files, workspace)
    assert os.listdir(workspace) == [core.IVFDATA_FILE]  # the shard copies are gone
    memory = core.merge_shards(core.from_bytes(core.to_bytes(trained)), (pathlib.Path(f).read_bytes() for f in files))
    for index in (merged, memory):
        core.set_nprobe(index, 4)
    np.testing.assert_array_equal(
        core.search_excluding(merged, X[:50], 10)[1], core.search_excluding(memory, X[:50], 10)[1]
    )
    built = index_build.BuiltIndex(merged, FACTORY, {"mode": "on_disk"}, workspace)
    built.close()
    assert not os.path.exists(workspace) and built.workspace is None


def test_ondisk_merge_needs_an_ivf_index(tmp_path):
    X = corpus()
    flat = core.train_index("IDMap,Flat", X)
    with pytest.raises(ValueError, match="only an IVF index"):
        core.merge_shards_ondisk(flat, shard_files(X, flat, tmp_path / "shards"), str(tmp_path / "x.ivfdata"))


def test_nprobe_curve_and_pick():
    X = corpus()
    index = core.train_index(FACTORY, X)
    core.add_vectors(index, np.arange(N), X)
    flat = faiss.IndexFlatIP(D)
    flat.add(core.unit_float32(X))
    _, exact = flat.search(core.unit_float32(X[:40]), 11)
    exact = np.array([[i for i in row if i != q][:10] for q, row in enumerate(exact)])
    curve = core.nprobe_curve(index, X[:40], exact, 10, np.arange(40))
    recalls = [p["recall"] for p in curve]
    assert [p["nprobe"] for p in curve] == [1, 2, 4, 8, 16][: len(curve)]
    assert recalls == sorted(recalls) and recalls[-1] == pytest.approx(1.0)  # nprobe = nlist is exhaustive
    assert core.pick_nprobe(curve, 1.0) == curve[-1]["nprobe"]
    assert core.pick_nprobe(curve, 0.0) == 1
    assert core.pick_nprobe([{"nprobe": 1, "recall": 0.5}], 0.9) is None


def test_searcher_equals_manual_transform_and_search(tmp_path):
    X = corpus()
    save_artifact(str(tmp_path / "transform"), fit_abtt(Moments.of_batch(X), D=2), n=N)
    searcher = published(tmp_path / "index", X, tmp_path / "transform")
    raw = corpus(20, seed=5)
    ids, scores = searcher.search(raw, k=10)
    transform = load_artifact(str(tmp_path / "transform")).transform
    index = faiss.read_index(str(tmp_path / "index" / searcher.manifest["index_version"] / core.INDEX_FILE))
    faiss.extract_index_ivf(index).nprobe = 4
    want_scores, want_ids = index.search(core.unit_float32(transform.apply(raw)), 10)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-6)
    assert searcher.manifest["transform_version"] == load_artifact(str(tmp_path / "transform")).transform_version
    one_ids, _ = searcher.search(raw[0], k=10)  # one query as a (d,) vector
    np.testing.assert_array_equal(one_ids[0], ids[0])


def test_dimension_change_refuses_the_old_index(tmp_path):
    published(tmp_path / "index", corpus())
    with pytest.raises(
        core.IndexArtifactError,
        match=r"queries have dimension 32 but index index-[0-9a-f]{12} .* "
        r"built for dimension 16",
    ):
        core.Searcher.load(str(tmp_path / "index"), expected_dimension=32)
    searcher = core.Searcher.load(str(tmp_path / "index"), expected_dimension=D)
    with pytest.raises(core.IndexArtifactError, match="queries have dimension 32"):
        searcher.search(np.ones((2, 32)), k=5)


def test_tampered_or_missing_index_is_refused(tmp_path):
    with pytest.raises(core.IndexArtifactError, match="CURRENT not found"):
        core.Searcher.load(str(tmp_path / "nothing"))
    searcher = published(tmp_path / "index", corpus())
    manifest_path = tmp_path / "index" / searcher.manifest["index_version"] / core.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["nprobe"] = 16
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(core.IndexArtifactError, match="content hash mismatch"):
        core.Searcher.load(str(tmp_path / "index"))


def test_ids_must_be_integral():
    with pytest.raises(ValueError, match=r"row 1 holds 2\.5"):
        core.integral_ids(np.array([1.0, 2.5]), "id column 'id'")
    np.testing.assert_array_equal(core.integral_ids(np.array([1.0, 2.0])), [1, 2])
    with pytest.raises(ValueError, match="faiss rejects the factory string 'IVF16,PQ5'"):
        core.train_index("IVF16,PQ5", corpus())  # 16 dims do not split into 5 sub-vectors


# ---------------------------------------------------------------- Spark: shards, verification, swap, kill −9


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    """A small Delta table (id, vector array<float>) in 3 partitions, and its matrix."""
    path = str(tmp_path_factory.mktemp("index") / "corpus")
    X = corpus().astype(np.float32)
    rows = [(int(i), [float(v) for v in X[i]], f"sentence {i}") for i in range(N)]
    spark.createDataFrame(rows, "id long, vector array<float>, sentence string").repartition(3).write.format(
        "delta"
    ).save(path)
    return path, X.astype(np.float64)


def settings(index_dir, **extra):
    from jobs.index import IndexSettings

    return IndexSettings(index_dir=str(index_dir), factory=FACTORY, train_size=N, query_size=60, **extra)


def test_spark_shards_merge_equals_one_process_build(spark, table, tmp_path):
    from anisotropy_spark.index_build import add_in_tasks

    path, X = table
    df = spark.read.format("delta").load(path)
    trained = core.train_index(FACTORY, X)
    shard_paths = add_in_tasks(df, "vector", "id", D, trained, str(tmp_path / "shards"))
    assert len(shard_paths) == 3
    merged = core.merge_shards(
        core.from_bytes(core.to_bytes(trained)), (pathlib.Path(p).read_bytes() for p in shard_paths)
    )
    in_order = df.select("id", "vector").toArrow()  # partition order, as the shards were merged
    single = core.from_bytes(core.to_bytes(trained))
    core.add_vectors(
        single,
        in_order.column("id").to_numpy(),
        np.stack(in_order.column("vector").to_numpy(zero_copy_only=False)).astype(np.float64),
    )
    assert merged.ntotal == single.ntotal == N
    for nprobe in (1, 4):
        a, b = (
            core.search_excluding(merged, X[:60], 10, np.arange(60)),
            core.search_excluding(single, X[:60], 10, np.arange(60)),
        )
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[0], b[0])


def test_spark_shards_merged_on_disk_equal_memory_merge_and_one_process_build(spark, table, tmp_path):
    from anisotropy_spark.index_build import add_in_tasks, merge_on_disk

    path, X = table
    df = spark.read.format("delta").load(path)
    trained = core.train_index(FACTORY, X)
    shard_paths = add_in_tasks(df, "vector", "id", D, trained, str(tmp_path / "shards"))
    memory = core.merge_shards(
        core.from_bytes(core.to_bytes(trained)), (pathlib.Path(p).read_bytes() for p in shard_paths)
    )
    (tmp_path / "work").mkdir()
    ondisk = merge_on_disk(core.from_bytes(core.to_bytes(trained)), shard_paths, str(tmp_path / "work"))
    assert core.ivfdata_file(ondisk) == str(tmp_path / "work" / core.IVFDATA_FILE)
    in_order = df.select("id", "vector").toArrow()
    single = core.from_bytes(core.to_bytes(trained))
    core.add_vectors(
        single,
        in_order.column("id").to_numpy(),
        np.stack(in_order.column("vector").to_numpy(zero_copy_only=False)).astype(np.float64),
    )
    assert ondisk.ntotal == memory.ntotal == single.ntotal == N
    for nprobe in (1, 4, 16):
        results = []
        for index in (ondisk, memory, single):
            core.set_nprobe(index, nprobe)
            results.append(core.search_excluding(index, X[:60], 10, np.arange(60)))
        for scores, ids in results[1:]:
            np.testing.assert_array_equal(results[0][1], ids)
            np.testing.assert_array_equal(results[0][0], scores)


@pytest.fixture(scope="module")
def first_index(spark, table, tmp_path_factory):
    """An index of the table built, verified and swapped in by the job's stage: (index_dir, its record)."""
    from jobs.index import index_stage

    path, _ = table
    index_dir = tmp_path_factory.mktemp("index") / "first"
    record = index_stage(spark, settings(index_dir), path, None, None)
    return index_dir, record


def copy_of(first_index, tmp_path) -> pathlib.Path:
    target = tmp_path / "index"
    shutil.copytree(first_index[0], target)
    return target


def test_stage_builds_verifies_and_swaps(spark, table, first_index):
    from anisotropy_spark.index_build import exact_ids

    path, X = table
    index_dir, record = first_index
    assert record["status"] == "published" and record["previous_version"] is None
    verification = record["verification"]
    assert verification["passed"] and verification["recall@10"] >= 0.9
    assert verification["nprobe"] == core.pick_nprobe(verification["nprobe_curve"], 0.9)
    searcher = core.Searcher.load(str(index_dir))
    manifest = searcher.manifest
    assert (manifest["n"], manifest["d"], manifest["nlist"], manifest["metric"]) == (N, D, 16, "inner_product")
    assert manifest["built_from"] == {"path": path, "version": 0} and manifest["transform_version"] is None
    assert manifest["nprobe_curve"] == verification["nprobe_curve"]
    assert not any((index_dir / "_shards").iterdir())  # the build's shards are removed
    # the recorded recall is the loaded index's against exact search, on the job's own (seeded) query sample
    from jobs.index import samples, valid_table

    _, queries = samples(valid_table(spark, path, None, settings(index_dir)), settings(index_dir))
    exact = exact_ids(spark.read.format("delta").load(path), "vector", "id", D, queries, 10, {"x": None})["x"]
    unit = core.unit_float32(X).astype(np.float64)
    cosines = core.unit_float32(queries.vectors).astype(np.float64) @ unit.T
    cosines[np.arange(len(queries.ids)), queries.ids] = -np.inf  # ids are row numbers; self excluded
    np.testing.assert_array_equal(np.sort(exact, axis=1), np.sort(np.argsort(-cosines, axis=1)[:, :10], axis=1))
    ids, _ = searcher.search(queries.vectors, k=11)
    found = np.array([[i for i in row if i != q][:10] for q, row in zip(queries.ids, ids)])
    assert core.recall_against(found, exact) == pytest.approx(verification["recall@10"])


def test_search_printout_names_the_nearest_rows(spark, table, first_index):
    from jobs.index import search_printout

    path, X = table
    searcher = core.Searcher.load(str(first_index[0]))
    text = search_printout(spark, searcher, path, query_id=7, k=3)
    ids, scores = searcher.search(X[7], k=4)
    hits = [(i, s) for i, s in zip(ids[0], scores[0]) if i != 7][:3]
    assert text.splitlines()[0] == "## Search: 'sentence 7' (id 7)"
    assert f"recall@10 against exact search {first_index[1]['verification']['recall@10']:.3f}" in text
    assert text.splitlines()[-3:] == [f"{r}. id {i}  cosine {s:.3f}  sentence {i}" for r, (i, s) in enumerate(hits, 1)]


def test_failed_verification_leaves_current_on_the_old_index(spark, table, first_index, tmp_path):
    from jobs.index import index_stage

    path, _ = table
    index_dir = copy_of(first_index, tmp_path)
    old = core.current_version(str(index_dir))
    record = index_stage(spark, settings(index_dir, nprobe=1, min_index_recall=1.0), path, None, None)
    assert record["verification"]["recall@10"] < 1.0
    assert record["status"] == "refused"
    assert "below min_index_recall 1.0" in record["reason"] and old in record["reason"]
    assert core.current_version(str(index_dir)) == old
    assert core.Searcher.load(str(index_dir)).manifest["index_version"] == old


def test_quality_raw_against_corrected(spark, table, tmp_path):
    from jobs.index import index_stage

    path, X = table
    save_artifact(str(tmp_path / "transform"), fit_abtt(Moments.of_batch(X), D=1), n=N)
    corrected = str(tmp_path / "corrected")
    transform = load_artifact(str(tmp_path / "transform")).transform
    Z = transform.apply(X).astype(np.float32)
    spark.createDataFrame(
        [(int(i), [float(v) for v in Z[i]]) for i in range(N)], "id long, vector array<float>"
    ).write.format("delta").save(corrected)
    record = index_stage(
        spark, settings(tmp_path / "index"), corrected, None, str(tmp_path / "transform"), raw_table=(path, None)
    )
    assert record["status"] == "published"
    quality = record["quality"]
    for space in ("raw", "corrected"):
        assert quality[space]["imbalance_factor"] >= 1.0
        assert 0.0 <= quality[space]["recall@10"] <= 1.0 and quality[space]["search_seconds"] > 0
        assert quality[space]["nprobe"] == record["verification"]["nprobe"] and quality[space]["queries"] == 60
    searcher = core.Searcher.load(str(tmp_path / "index"))
    ids, _ = searcher.search(X[:5], k=1)
    np.testing.assert_array_equal(ids[:, 0], np.arange(5))  # a raw corpus vector finds its own row


def test_fractional_ids_are_a_config_error(spark, tmp_path):
    from anisotropy_spark.contract import SchemaError
    from jobs.index import index_stage

    path = str(tmp_path / "float_ids")
    spark.createDataFrame(
        [(0.5 + i, [1.0, float(i)]) for i in range(20)], "id double, vector array<float>"
    ).write.format("delta").save(path)
    with pytest.raises(SchemaError, match="'id' must hold integer ids"):
        index_stage(spark, settings(tmp_path / "index"), path, None, None)


def job_env() -> dict:
    import pyspark

    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_HOME=os.path.dirname(pyspark.__file__),
    )
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


@pytest.mark.parametrize("kill_at", ["merge", "ondisk_merge", "pointer"])
def test_kill_during_the_index_stage_leaves_a_readable_current_index(table, first_index, tmp_path, kill_at):
    path, X = table
    index_dir = copy_of(first_index, tmp_path)
    old = core.Searcher.load(str(index_dir))
    conf = tmp_path / "index.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "input": path,
                "index_dir": str(index_dir),
                "factory": "IVF8,Flat",
                "train_size": N,
                "query_size": 60,
                "artifact": None,
                "master": "local[2]",
                "merge_memory_mb": 0 if kill_at == "ondisk_merge" else 4096,
            }
        )
    )
    process = subprocess.run(
        [sys.executable, "tests/index_with_faults.py", "--conf", str(conf)],
        cwd=REPO,
        env=dict(job_env(), KILL_AT=kill_at),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert process.returncode == -9, process.stdout[-2000:] + process.stderr[-4000:]
    searcher = core.Searcher.load(str(index_dir))
    assert searcher.manifest["index_version"] == old.manifest["index_version"]
    ids, _ = searcher.search(X[:3], k=1)
    np.testing.assert_array_equal(ids[:, 0], np.arange(3))
    versions = {p.name for p in index_dir.iterdir() if p.name.startswith("index-")}
    if kill_at == "pointer":  # the new version was complete and read back; only the pointer did not move
        (new,) = versions - {old.manifest["index_version"]}
        assert core.Searcher.open(str(index_dir), new).manifest["nlist"] == 8
    else:
        assert versions == {old.manifest["index_version"]}
    if kill_at == "ondisk_merge":  # the killed build's workspace is left (documented as deletable), never read
        assert [f.name for build in (index_dir / "_merge").iterdir() for f in build.iterdir()] == [core.IVFDATA_FILE]


def test_stage_merges_on_disk_beyond_merge_memory_mb(spark, table, first_index, tmp_path):
    from jobs.index import index_stage

    path, X = table
    index_dir = tmp_path / "index"
    record = index_stage(spark, settings(index_dir, merge_memory_mb=0), path, None, None)  # every shard is over 0
    assert record["status"] == "published"
    assert (
        record["merge"]["mode"] == "on_disk" and record["merge"]["shards"] == 3 and record["merge"]["shard_bytes"] > 0
    )
    assert first_index[1]["merge"]["mode"] == "memory"
    folder = index_dir / record["index_version"]
    assert sorted(p.name for p in folder.iterdir()) == [core.INDEX_FILE, core.IVFDATA_FILE, core.MANIFEST]
    assert not any((index_dir / "_merge").iterdir()) and not any((index_dir / "_shards").iterdir())
    searcher = core.Searcher.load(str(index_dir))
    memory = core.Searcher.load(str(first_index[0]))
    assert searcher.manifest["ivfdata"]["file"] == core.IVFDATA_FILE
    assert (searcher.manifest["nprobe"], searcher.manifest["nprobe_curve"]) == (
        memory.manifest["nprobe"],
        memory.manifest["nprobe_curve"],
    )  # same sample, same trained index
    for nprobe in (None, 1, 16):
        got, want = searcher.search(X[:60], k=10, nprobe=nprobe), memory.search(X[:60], k=10, nprobe=nprobe)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_stage_refuses_a_budget_it_cannot_merge_on_disk(spark, table, tmp_path):
    from jobs.config import ConfigError
    from jobs.index import IndexSettings, index_stage

    path, _ = table
    flat = IndexSettings(
        index_dir=str(tmp_path / "index"), factory="IDMap,Flat", train_size=N, query_size=60, merge_memory_mb=0
    )
    with pytest.raises(ConfigError, match="only an IVF index .* can be merged on disk: raise merge_memory_mb"):
        index_stage(spark, flat, path, None, None)
    assert core.current_version(str(tmp_path / "index")) is None
    assert not any((tmp_path / "index" / "_shards").iterdir())


def labelled(spark, folder: pathlib.Path, Z: np.ndarray, raw_queries: np.ndarray, transform=None) -> str:
    """A labelled-queries table of ``raw_queries`` (ids 5000 + row) whose relevant ids are each query's exact
    top-10 among the rows of ``Z`` (the indexed space; ``transform`` maps the raw queries into it)."""
    q = transform.apply(raw_queries) if transform is not None else raw_queries
    cosines = core.unit_float32(q).astype(np.float64) @ core.unit_float32(Z).astype(np.float64).T
    relevant = np.argsort(-cosines, axis=1, kind="stable")[:, :10]
    path = str(folder / "queries")
    spark.createDataFrame(
        [
            (5000 + i, [float(v) for v in raw_queries[i]], [int(r) for r in relevant[i]])
            for i in range(len(raw_queries))
        ],
        "query_id long, vector array<double>, relevant array<long>",
    ).write.format("delta").save(path)
    return path


def test_ndcg_verification_accepts_an_index_as_good_as_exact_search(spark, table, tmp_path):
    from anisotropy_core.evaluation import ndcg_at_k
    from jobs.index import LabelledQueries, index_stage

    path, X = table
    save_artifact(str(tmp_path / "transform"), fit_abtt(Moments.of_batch(X), D=1), n=N)
    transform = load_artifact(str(tmp_path / "transform")).transform
    Z = transform.apply(X).astype(np.float32)
    corrected = str(tmp_path / "corrected")
    spark.createDataFrame(
        [(int(i), [float(v) for v in Z[i]]) for i in range(N)], "id long, vector array<float>"
    ).write.format("delta").save(corrected)
    raw_queries = corpus(40, seed=7)
    queries = LabelledQueries(path=labelled(spark, tmp_path, Z.astype(np.float64), raw_queries, transform))
    record = index_stage(
        spark, settings(tmp_path / "index", nprobe=16, queries=queries), corrected, None, str(tmp_path / "transform")
    )
    assert record["status"] == "published", record.get("reason")
    ndcg = record["verification"]["ndcg"]
    assert ndcg["queries"] == 40 and ndcg["k"] == 10 and ndcg["nprobe"] == 16 and ndcg["queries_path"] == queries.path
    assert ndcg["exact"] == pytest.approx(1.0)  # the labels are exact search's top-10
    assert ndcg["drop"] == pytest.approx(ndcg["exact"] - ndcg["index"]) and ndcg["drop"] <= 0.02 and ndcg["passed"]
    searcher = core.Searcher.load(str(tmp_path / "index"))
    assert searcher.manifest["verification"]["ndcg"] == ndcg  # in the manifest as in the run record
    relevant = [
        np.asarray(r)
        for r in spark.read.format("delta")
        .load(queries.path)
        .orderBy("query_id")
        .select("relevant")
        .toArrow()
        .column("relevant")
        .to_pylist()
    ]
    ids, _ = searcher.search(raw_queries, k=10)  # the raw queries through the artifact's transform
    assert ndcg["index"] == pytest.approx(ndcg_at_k(ids, relevant))


def test_ndcg_verification_refuses_a_poor_index(spark, table, first_index, tmp_path):
    from jobs.index import NDCG_NOT_MEASURED, LabelledQueries, index_stage

    path, X = table
    assert first_index[1]["verification"]["ndcg"] == NDCG_NOT_MEASURED == "not measured (no labelled queries)"
    assert core.Searcher.load(str(first_index[0])).manifest["verification"]["ndcg"] == NDCG_NOT_MEASURED
    index_dir = copy_of(first_index, tmp_path)
    old = core.current_version(str(index_dir))
    queries = LabelledQueries(path=labelled(spark, tmp_path, X, corpus(40, seed=7)))
    record = index_stage(
        spark, settings(index_dir, nprobe=1, min_index_recall=0.0, max_ndcg_drop=0.0, queries=queries), path, None, None
    )
    verification = record["verification"]
    assert verification["recall_passed"] and not verification["passed"]  # recall passes, nDCG does not
    assert verification["ndcg"]["drop"] > 0.0 and not verification["ndcg"]["passed"]
    assert record["status"] == "refused"
    assert "below exact search's" in record["reason"] and "more than max_ndcg_drop 0.0" in record["reason"]
    assert "min_index_recall" not in record["reason"] and old in record["reason"]
    assert core.current_version(str(index_dir)) == old


def test_labelled_queries_of_the_evaluation_block():
    from jobs.config import EvaluationConfig, load
    from jobs.index import IndexConfig, LabelledQueries

    assert LabelledQueries.of_evaluation(None) is None
    assert LabelledQueries.of_evaluation(EvaluationConfig(pairs="p")) is None
    assert LabelledQueries.of_evaluation(
        EvaluationConfig(queries="q", query_id_col="qid", exclude_self=True)
    ) == LabelledQueries(path="q", id_col="qid", exclude_self=True)
    config = load(IndexConfig, str(REPO / "conf" / "index.yaml"), {"queries": {"path": "q"}, "merge_memory_mb": 1})
    assert (config.queries, config.merge_memory_mb, config.max_ndcg_drop) == (LabelledQueries(path="q"), 1.0, 0.02)
    from jobs.config import ConfigError

    with pytest.raises(ConfigError, match="merge_memory_mb must be >= 0"):
        load(IndexConfig, str(REPO / "conf" / "index.yaml"), {"merge_memory_mb": -1})
