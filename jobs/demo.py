"""The demo: the whole product on the bundled corpus, with the embedded default (local Spark + local Delta).

    anisotropy demo --conf conf/demo.yaml
    python -m jobs.demo --conf conf/demo.yaml

1. loads ``data/demo_corpus.parquet`` (real all-MiniLM-L6-v2 sentence embeddings, one layer) into a Delta table,
   once, and writes its labelled query set: every sentence is a query, its relevant documents are the other
   sentences of the same textbook chapter (:func:`chapter_queries`);
2. diagnoses it (the diagnosis job) with the evaluation block on: the candidate grid scored on held-out folds of
   those queries, each candidate with the 95 % interval of its Δ against raw;
3. runs the nightly twice with the same evaluation block, exactly as ``anisotropy nightly`` runs (run records in
   the config's ``runs_dir``): the first night publishes what the evidence supports and builds, verifies and swaps
   in the faiss index of that version; the second is a no-op;
4. diagnoses the published table (before / after), and writes the corpus report opening with what was applied,
   its Δ ± CI against raw and its neighbour overlap, and why the verdict, the evaluation and the nightly differ
   when they do;
5. prints the same, and ends with a search of one textbook sentence through the index (transform + faiss).
"""

from __future__ import annotations

import dataclasses
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from anisotropy_core import storage
from anisotropy_core.index import Searcher
from anisotropy_core.methods import Method
from anisotropy_spark.io import is_delta_table
from anisotropy_spark.publish import output_state
from anisotropy_spark.session import get_spark
from jobs import diagnose as diagnose_job
from jobs import nightly as nightly_job
from jobs.cli import run
from jobs.config import load, parse_args
from jobs.evaluation import evaluation_markdown
from jobs.index import search_printout
from jobs.nightly_config import NightlyConfig
from jobs.run_records import RunRecord, applied_summary, applied_text

COMPARED = [
    "n",
    "d",
    "offset_ratio",
    "anisotropy_A",
    "top1_var",
    "top10_var",
    "effective_rank",
    "mp_above_upper",
    "power_law_alpha",
]


@dataclasses.dataclass
class DemoConfig:
    """Settings of the demo (conf/demo.yaml); the jobs' own settings come from their config files."""

    corpus_parquet: str = "data/demo_corpus.parquet"
    layer: int = 3
    corpus_table: str = "out/demo/corpus"
    queries_table: str = "out/demo/chapter_queries"
    evaluation_k: int = 10
    diagnose_conf: str = "conf/diagnose.yaml"
    nightly_conf: str = "conf/nightly.yaml"
    index_dir: str = "out/nightly/index"
    search_id: int = 4003
    master: str | None = None


def load_corpus(spark: SparkSession, config: DemoConfig) -> None:
    """Write the bundled corpus's ``layer`` rows to the Delta ``corpus_table`` unless it already exists."""
    if is_delta_table(spark, config.corpus_table):
        print(f"corpus table {config.corpus_table} exists; reusing it")
        return
    rows = spark.read.parquet(config.corpus_parquet).where(F.col("layer") == config.layer)
    rows.write.format("delta").save(config.corpus_table)
    print(f"wrote {rows.count()} layer-{config.layer} sentence embeddings to {config.corpus_table}")


CHAPTER_HEADING = r"^Chapter [0-9]+:"


def with_chapters(corpus: DataFrame) -> DataFrame:
    """``corpus`` (one row per ``sentence_id``, with its ``sentence`` text) plus ``chapter``: the number of
    ``Chapter N:`` headings at or before the row in reading order (``sentence_id``); 0 before the first.

    The few heading ids are broadcast and counted per sentence (a range join), so no step needs the whole
    corpus in one partition, as a running count over a global window would."""
    headings = corpus.where(F.col("sentence").rlike(CHAPTER_HEADING)).select(F.col("sentence_id").alias("heading"))
    chapters = (
        corpus.select("sentence_id")
        .join(F.broadcast(headings), F.col("heading") <= F.col("sentence_id"), "left")
        .groupBy("sentence_id")
        .agg(F.count("heading").alias("chapter"))
    )
    return corpus.join(chapters, "sentence_id")


def chapter_queries(spark: SparkSession, config: DemoConfig) -> None:
    """Write the labelled query set of the demo: one query per corpus sentence (query_id = its row id, its
    own vector), relevant = the ids of every OTHER sentence of the same textbook chapter. The book's title
    line, alone before chapter 1 (chapter 0, :func:`with_chapters`), has no other sentence of its chapter and is
    not a query. The label says which chapter a sentence was printed in — a topical grouping by the author, not
    a judgement that two sentences answer each other.
    """
    labelled = with_chapters(spark.read.format("delta").load(config.corpus_table))
    members = labelled.groupBy("chapter").agg(F.collect_list("id").alias("members"))
    queries = (
        labelled.join(members, "chapter")
        .select(
            F.col("id").alias("query_id"),
            "vector",
            "chapter",
            F.filter("members", lambda m: m != F.col("id")).alias("relevant"),
        )
        .where(F.size("relevant") > 0)
    )
    queries.write.format("delta").mode("overwrite").save(config.queries_table)


def side_by_side(before: dict, after: dict) -> str:
    """Markdown table of the compared metrics before and after the correction."""

    def shown(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| metric | before | after |", "|---|---|---|"]
    lines += [f"| {k} | {shown(before[k])} | {shown(after[k])} |" for k in COMPARED]
    return "\n".join(lines)


def agreement(diagnosis: diagnose_job.DiagnosisReport, night: RunRecord) -> list[str]:
    """Whether the diagnosis's verdict, its held-out evaluation, the night's own verdict and what the night applied
    agree, and where they differ, why (each a line)."""
    verdict, night_verdict = diagnosis.recommendation, night.recommendation
    if night_verdict is None:
        raise RuntimeError(f"nightly run {night.run_id} made no recommendation ({night.status}: {night.reason})")
    chosen = (diagnosis.evaluation or {}).get("chosen")
    applied = applied_summary(night)
    applied_name = applied["candidate"] or applied["method"]
    if verdict.method == night_verdict.method == applied["method"] and chosen in (None, applied_name):
        return [f"the diagnosis verdict, the evaluation and the nightly agree: {applied_name}"]
    notes = [
        f"the diagnosis's label-free verdict is {verdict.method}"
        + (
            " (on significant artefact evidence)"
            if verdict.verified and verdict.method == Method.ABTT
            else " (it deletes and whitens nothing without evidence; the held-out evaluation decides)"
        )
    ]
    if night_verdict.method != verdict.method:
        notes.append(
            f"the night's own label-free verdict is {night_verdict.method}: "
            + "; ".join(night_verdict.reasons[:1])
            + " (the nightly's mixture check runs k-means with its "
            "own cluster_k on its sample, the diagnosis's per-cluster table with the diagnosis's cluster_k)"
        )
    if chosen is not None:
        notes.append(f"the diagnosis's held-out evaluation chose {chosen}")
    notes.append(f"the nightly applied {applied_name}, what the held-out intervals support: {applied['reason']}")
    if chosen is not None and chosen != applied_name:
        notes.append(
            "the nightly also scores the published transform and leaves out candidates below "
            "min_neighbour_overlap, so its choice can differ from the diagnosis's"
        )
    return notes


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_args(DemoConfig, argv, "Run the whole pipeline on the bundled demo corpus")
    spark = get_spark("anisotropy-demo", master=config.master)
    load_corpus(spark, config)
    chapter_queries(spark, config)
    evaluation = {"queries": config.queries_table, "exclude_self": True, "k": config.evaluation_k}

    diagnosis = load(
        diagnose_job.DiagnoseConfig, config.diagnose_conf, {"input": config.corpus_table, "evaluation": evaluation}
    )
    before = diagnose_job.run_diagnosis(spark, diagnosis)

    nightly = load(
        NightlyConfig,
        config.nightly_conf,
        {"input": config.corpus_table, "evaluation": evaluation, "index": {"index_dir": config.index_dir}},
    )
    nights = [nightly_job.run_recorded(spark, nightly)[0] for _ in (1, 2)]
    published = next((night for night in nights if night.status == "published"), nights[0])

    corrected = dataclasses.replace(
        diagnosis,
        input=nightly.output,
        vector_col=nightly.out_col,
        evaluation=None,
        output_dir=storage.join(diagnosis.output_dir, "corrected"),
    )
    after = diagnose_job.run_diagnosis(spark, corrected)
    applied = {"headline": applied_text(applied_summary(published)), "notes": agreement(before, published)}
    report = diagnose_job.write_outputs(spark, diagnosis, before, applied=applied)
    diagnose_job.write_outputs(spark, corrected, after, before=before)

    print(f"\n# What the demo applied\n\n**{applied['headline']}**\n")
    print("\n".join(f"- {note}" for note in applied["notes"]))
    print(f"\nreport: {storage.join(diagnosis.output_dir, 'report.html')}")
    print(
        "\n## The nightly's candidates, scored on held-out queries (same-chapter neighbours of every sentence)\n\n"
        + (
            evaluation_markdown(published.evaluation)
            if published.evaluation is not None
            else f"(none: nightly run {published.run_id} ran no evaluation)"
        )
    )
    print("\n" + report)
    print("\n## Before / after the published night\n\n" + side_by_side(before.metrics, after.metrics))
    for night, record in enumerate(nights, 1):
        print(
            f"\nnightly run {night}: {record.status} — {record.reason}; {nightly.output} is at Delta version "
            f"{output_state(spark, nightly.output).version}; run record "
            f"{storage.join(nightly.runs_dir, record.run_id + '.json')}"
        )
    index = published.index or {}
    print(
        f"\n## The corpus index: {index.get('status', 'not built')}"
        + (f" ({index['reason']})" if index.get("reason") else "")
        + "\n"
    )
    print(search_printout(spark, Searcher.load(config.index_dir), config.corpus_table, config.search_id))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
