"""Index job: build, verify and atomically swap in the faiss index of a (corrected) embedding table.

    anisotropy index --conf conf/index.yaml [--input PATH] [--input-version V] [--artifact DIR|null] ...
    python -m jobs.index --conf conf/index.yaml ...

Reads ``input`` pinned to one Delta version (every row must be valid: the contract check of the other jobs, with
``on_invalid: error``), trains the ``factory`` index on a driver sample, adds the rows in Spark tasks and merges
the shards (:mod:`anisotropy_spark.index_build`), then measures recall@k against the exact top-k of
``query_size`` sampled rows for nprobe 1, 2, 4, … The version is written under ``index_dir`` and ``CURRENT``
moves to it only when recall at the chosen nprobe reaches ``min_index_recall``; otherwise ``CURRENT`` keeps the
previous index, the summary says why and the job exits 3. With labelled ``queries`` (raw query vectors and
their relevant corpus ids, as the evaluation block's), the verification also measures nDCG@k of the index at
that nprobe (the queries transformed by the artifact, as :class:`anisotropy_core.index.Searcher` does) and of
exact search over the same corrected rows, and refuses the swap when the index's is below exact's by more than
``max_ndcg_drop``. The shards are merged in memory up to ``merge_memory_mb`` MiB, on disk beyond
(:mod:`anisotropy_spark.index_build`). ``artifact``: the transform the table was corrected
with (copied into the index, applied to raw queries by :class:`anisotropy_core.index.Searcher`); null for an
index of raw vectors. ``quality_input`` (with an artifact): the raw table the corrected one came from; the
summary's ``quality`` then holds imbalance, recall and search time of raw against corrected vectors at the same
factory and nprobe (two more builds).

In the nightly: :func:`index_stage` (after publish) builds from the published table and version.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from anisotropy_core import index as core
from anisotropy_core.artifact import Artifact, load_artifact
from anisotropy_spark.contract import SchemaError
from anisotropy_spark.evaluation import QuerySet, read_queries, require_integral
from anisotropy_spark.index_build import (
    MergeBudgetError,
    Sample,
    build_index,
    draw,
    exact_ids,
    exact_ids_and_labelled,
    space_quality,
    verify_index,
    verify_ndcg,
)
from anisotropy_spark.io import as_vector_array, read_table, validate
from anisotropy_spark.session import get_spark
from jobs.cli import EXIT, run
from jobs.config import ConfigError, parse_args
from jobs.index_settings import IndexSettings, LabelledQueries

log = logging.getLogger("anisotropy.index")


NDCG_NOT_MEASURED = "not measured (no labelled queries)"


@dataclasses.dataclass(kw_only=True)
class IndexConfig(IndexSettings):
    """Settings of the index job (conf/index.yaml)."""

    input: str
    input_version: int | None = None
    artifact: str | None = None
    quality_input: str | None = None
    quality_input_version: int | None = None
    master: str | None = None

    def check(self) -> list[str]:
        problems = super().check()
        if self.quality_input and not self.artifact:
            problems.append("quality_input compares raw with corrected vectors: it needs an artifact")
        return problems


@dataclasses.dataclass(frozen=True)
class Table:
    """The valid rows of a pinned table version: ``rows``, their ``total`` count and ``dimension``."""

    rows: DataFrame
    ref: dict
    total: int
    dimension: int


def valid_table(
    spark: SparkSession, path: str, version: int | None, settings: IndexSettings, dimension: int | None = None
) -> Table:
    """The rows of ``path`` at ``version`` after the input contract (every row valid, ids unique, else an error)."""
    df, ref = read_table(spark, path, version)
    df = as_vector_array(df, settings.vector_col)
    try:
        require_integral(df, settings.id_col, "id")
    except ValueError as exc:  # the index keys its vectors by int64 ids
        raise SchemaError(f"{path}: {exc}") from None
    checked = validate(df, settings.vector_col, settings.id_col, dimension or settings.dimension, on_invalid="error")
    return Table(checked.valid, {"path": ref.path, "version": ref.version}, checked.valid.count(), checked.dimension)


def samples(table: Table, settings: IndexSettings) -> tuple[Sample, Sample]:
    """(training sample, queries): one driver sample of max(train_size, query_size) rows; the queries are a
    uniform ``query_size`` subset of it."""
    drawn = draw(
        table.rows,
        settings.vector_col,
        settings.id_col,
        table.dimension,
        max(settings.train_size, settings.query_size),
        settings.seed,
        table.total,
    )
    pick = np.sort(np.random.default_rng(settings.seed).permutation(len(drawn.ids))[: settings.query_size])
    return drawn, Sample(drawn.vectors[pick], drawn.ids[pick])


def labelled_queries(spark: SparkSession, queries: LabelledQueries, dimension: int) -> QuerySet:
    """The labelled queries (raw vectors of ``dimension``); a table that cannot serve is a config error."""
    try:
        return read_queries(spark, queries.path, queries.id_col, queries.vector_col, queries.relevant_col, dimension)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"index queries {queries.path}: {exc}") from exc


def index_stage(
    spark: SparkSession,
    settings: IndexSettings,
    path: str,
    version: int | None,
    artifact_path: str | None,
    raw_table: tuple[str, int | None] | None = None,
) -> dict:
    """Build the index of ``path`` at ``version`` (the nightly's ``index`` stage after publish: the published table
    and version, and the artifact it was corrected with), verify it and move ``CURRENT`` to it when it passes.
    ``raw_table`` (path, version): the raw table the corrected one came from, for the raw-against-corrected
    measures (ignored without an artifact: raw and corrected are then one space). Returns the run record:
    ``status`` ``published`` or ``refused`` (with ``reason``, every failed check; ``CURRENT`` unchanged), the index
    version, the previous one, how the shards were merged (``merge``), the verification (recall, and ``ndcg``:
    the labelled queries' nDCG@k of the index and of exact search, or :data:`NDCG_NOT_MEASURED`; ``passed``: both
    checks) and, with ``raw_table``, ``quality``."""
    started = time.perf_counter()
    artifact: Artifact | None = load_artifact(artifact_path) if artifact_path else None
    table = valid_table(spark, path, version, settings)
    if artifact is not None and artifact.transform.d_out != table.dimension:
        raise core.IndexArtifactError(
            f"{path} holds vectors of dimension {table.dimension} but transform "
            f"{artifact.transform_version} outputs dimension {artifact.transform.d_out}: "
            f"the table was not corrected with this artifact"
        )
    transform = artifact.transform if artifact is not None else None
    labelled = None
    if settings.queries is not None:
        labelled = labelled_queries(spark, settings.queries, transform.d_in if transform else table.dimension)
    previous = core.current_version(settings.index_dir)
    train, queries = samples(table, settings)
    try:
        built = build_index(
            table.rows,
            settings.vector_col,
            settings.id_col,
            table.dimension,
            settings.factory,
            settings.index_dir,
            train,
            table.total,
            merge_memory_mb=settings.merge_memory_mb,
        )
    except MergeBudgetError as exc:
        raise ConfigError(f"index: {exc}") from exc
    try:
        return verify_and_swap(
            spark,
            settings,
            table,
            artifact,
            labelled,
            built.index,
            built.factory,
            built.merge,
            previous,
            queries,
            raw_table,
            started,
        )
    finally:
        built.close()


def verify_and_swap(
    spark: SparkSession,
    settings: IndexSettings,
    table: Table,
    artifact: Artifact | None,
    labelled: QuerySet | None,
    index,
    factory: str,
    merge: dict,
    previous: str | None,
    queries: Sample,
    raw_table: tuple[str, int | None] | None,
    started: float,
) -> dict:
    """The verification and swap of :func:`index_stage` for the built ``index``."""
    transform = artifact.transform if artifact is not None else None
    k = settings.k
    if labelled is None:
        exact = exact_ids(
            table.rows, settings.vector_col, settings.id_col, table.dimension, queries, k, {"index": None}
        )["index"]
    else:  # one pass: the sampled rows and the labelled queries (in the corrected space)
        assert settings.queries is not None
        exact, labelled_exact = exact_ids_and_labelled(
            table.rows,
            settings.vector_col,
            settings.id_col,
            table.dimension,
            queries,
            k,
            transform.apply(labelled.vectors) if transform is not None else labelled.vectors,
            labelled.ids,
            settings.queries.exclude_self,
        )
    verification = verify_index(index, queries, exact, k, settings.min_index_recall, settings.nprobe)
    reasons = []
    if not verification["passed"]:
        reasons.append(
            f"recall@{k} {verification[f'recall@{k}']:.4f} at nprobe {verification['nprobe']} is below "
            f"min_index_recall {settings.min_index_recall}"
        )
    if labelled is None:
        verification["ndcg"] = NDCG_NOT_MEASURED
    else:
        assert settings.queries is not None
        ndcg = verify_ndcg(
            index,
            transform,
            labelled.vectors,
            labelled.ids,
            labelled.relevant,
            labelled_exact,
            k,
            verification["nprobe"],
            settings.max_ndcg_drop,
            settings.queries.exclude_self,
        )
        verification["ndcg"] = {**ndcg, "queries_path": settings.queries.path}
        if not ndcg["passed"]:
            reasons.append(
                f"nDCG@{k} of the index {ndcg['index']:.4f} at nprobe {ndcg['nprobe']} is "
                f"{ndcg['drop']:.4f} below exact search's {ndcg['exact']:.4f}, more than max_ndcg_drop "
                f"{settings.max_ndcg_drop}"
            )
    verification["recall_passed"] = verification["passed"]
    verification["passed"] = not reasons
    transform_version = artifact.transform_version if artifact else None
    record = {
        "index_dir": settings.index_dir,
        "previous_version": previous,
        "factory": factory,
        "n": int(index.ntotal),
        "d": int(index.d),
        "built_from": table.ref,
        "merge": merge,
        "transform_version": transform_version,
        "verification": verification,
    }
    if raw_table is not None and artifact is not None:
        raw = valid_table(spark, raw_table[0], raw_table[1], settings, artifact.transform.d_in)
        raw_train, raw_queries = samples(raw, settings)
        record["quality"] = space_quality(
            raw.rows,
            settings.vector_col,
            settings.id_col,
            raw.dimension,
            factory,
            verification["nprobe"],
            artifact.transform,
            settings.index_dir,
            raw_train,
            raw_queries,
            raw.total,
            k,
            settings.merge_memory_mb,
        )
    if reasons:
        reason = "; ".join(reasons) + f"; CURRENT stays on {previous}"
        return {**record, "status": "refused", "reason": reason, "seconds": time.perf_counter() - started}
    manifest = core.build_manifest(
        index,
        factory,
        verification["nprobe"],
        verification["nprobe_curve"],
        core.to_bytes(index),
        table.ref,
        transform_version,
        verification,
    )
    version_name = core.publish_index(settings.index_dir, index, manifest, artifact)
    return {**record, "status": "published", "index_version": version_name, "seconds": time.perf_counter() - started}


def run_index(spark: SparkSession, config: IndexConfig) -> dict:
    """Run the index job; returns its record (see :func:`index_stage`)."""
    quality = (config.quality_input, config.quality_input_version) if config.quality_input else None
    return index_stage(spark, config, config.input, config.input_version, config.artifact, quality)


def search_printout(
    spark: SparkSession,
    searcher: core.Searcher,
    corpus_table: str,
    query_id: int,
    k: int = 5,
    id_col: str = "id",
    vector_col: str = "vector",
    text_col: str = "sentence",
) -> str:
    """The demo's last lines: the raw vector of the corpus row ``query_id`` of ``corpus_table`` searched through
    ``searcher`` (transform + index), its ``k`` nearest rows by id, score and text, and the index's recall against
    exact search (from its manifest's verification; with its nDCG against exact search's when measured)."""
    corpus = spark.read.format("delta").load(corpus_table)
    row = corpus.where(F.col(id_col) == query_id).select(text_col, vector_col).first()
    if row is None:
        raise ConfigError(f"{corpus_table}: no row with {id_col} = {query_id}")
    ids, scores = searcher.search(np.asarray(row[vector_col], dtype=np.float64), k + 1)
    hits = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i != query_id][:k]
    texts = {
        r[id_col]: r[text_col]
        for r in corpus.where(F.col(id_col).isin([i for i, _ in hits])).select(id_col, text_col).collect()
    }
    manifest = searcher.manifest
    check = manifest["verification"]
    recall = check[f"recall@{check['k']}"]
    ndcg = check.get("ndcg")
    measured = (
        (
            f"; nDCG@{ndcg['k']} {ndcg['index']:.3f} against exact search's {ndcg['exact']:.3f} on "
            f"{ndcg['queries']} labelled queries"
        )
        if isinstance(ndcg, dict)
        else ""
    )
    lines = [
        f"## Search: {row[text_col]!r} (id {query_id})",
        "",
        f"index {manifest['index_version']} ({manifest['factory']}, nprobe {manifest['nprobe']}, "
        f"{manifest['n']} vectors; transform {manifest['transform_version']}): recall@{check['k']} against "
        f"exact search {recall:.3f} on {check['queries']} queries{measured}",
        "",
    ]
    lines += [f"{rank}. id {i}  cosine {s:.3f}  {texts.get(i, '')}" for rank, (i, s) in enumerate(hits, 1)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_args(IndexConfig, argv, "Build, verify and swap in the faiss index of an embedding table")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = get_spark("anisotropy-index", master=config.master)
    record = run_index(spark, config)
    print(json.dumps(record, default=str))
    if record["status"] == "refused":
        log.error("index refused: %s (exit %d)", record["reason"], EXIT["gate_rejected"])
        return EXIT["gate_rejected"]
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
