"""The demo: the whole product on the bundled corpus, with the embedded default (local Spark + local Delta).

    anisotropy demo --conf conf/demo.yaml [--method abtt|whitening|center|cluster_recenter|abtt_pca_abtt|flow]
    python -m jobs.demo --conf conf/demo.yaml ...

1. loads ``data/demo_corpus.parquet`` (real all-MiniLM-L6-v2 sentence embeddings, one layer) into a
   Delta table, once;
2. diagnoses it (the diagnosis job's report, printed) with a labelled retrieval evaluation: every sentence is a
   query, its relevant documents are the other sentences of the same textbook chapter (:func:`chapter_queries`),
   and each candidate correction is scored by recall@10 / nDCG@10 — the before/after table is printed;
3. fits the configured correction and writes the corrected Delta table (the fit and apply jobs);
4. diagnoses the corrected table and prints before/after side by side;
5. runs the nightly rebuild twice on the same corpus version: the first publishes, the second is a no-op.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from anisotropy_core import storage
from anisotropy_spark.io import is_delta_table
from anisotropy_spark.publish import output_state
from anisotropy_spark.session import get_spark
from jobs import apply as apply_job
from jobs import diagnose as diagnose_job
from jobs import fit as fit_job
from jobs import nightly as nightly_job
from jobs.cli import run
from jobs.config import load, parse_args
from jobs.evaluation import evaluation_markdown
from jobs.nightly_config import NightlyConfig

COMPARED = ["n", "d", "offset_ratio", "anisotropy_A", "top1_var", "top10_var", "effective_rank",
            "mp_above_upper", "power_law_alpha"]


@dataclasses.dataclass
class DemoConfig:
    """Settings of the demo (conf/demo.yaml); the jobs' own settings come from their config files."""

    corpus_parquet: str = "data/demo_corpus.parquet"
    layer: int = 3
    corpus_table: str = "out/demo/corpus"
    corrected_table: str = "out/demo/corrected"
    queries_table: str = "out/demo/chapter_queries"
    evaluation_k: int = 10
    diagnose_conf: str = "conf/diagnose.yaml"
    fit_conf: str = "conf/fit.yaml"
    apply_conf: str = "conf/apply.yaml"
    nightly_conf: str = "conf/nightly.yaml"
    method: Literal["center", "abtt", "whitening", "cluster_recenter", "abtt_pca_abtt", "flow"] = "abtt"
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
    chapters = (corpus.select("sentence_id")
                .join(F.broadcast(headings), F.col("heading") <= F.col("sentence_id"), "left")
                .groupBy("sentence_id").agg(F.count("heading").alias("chapter")))
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
    queries = (labelled.join(members, "chapter")
               .select(F.col("id").alias("query_id"), "vector", "chapter",
                       F.filter("members", lambda m: m != F.col("id")).alias("relevant"))
               .where(F.size("relevant") > 0))
    queries.write.format("delta").mode("overwrite").save(config.queries_table)


def side_by_side(before: dict, after: dict) -> str:
    """Markdown table of the compared metrics before and after the correction."""
    def shown(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| metric | before | after |", "|---|---|---|"]
    lines += [f"| {k} | {shown(before[k])} | {shown(after[k])} |" for k in COMPARED]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_args(DemoConfig, argv, "Run the whole pipeline on the bundled demo corpus")
    spark = get_spark("anisotropy-demo", master=config.master)
    load_corpus(spark, config)

    chapter_queries(spark, config)
    diagnosis = load(diagnose_job.DiagnoseConfig, config.diagnose_conf, {
        "input": config.corpus_table,
        "evaluation": {"queries": config.queries_table, "exclude_self": True, "k": config.evaluation_k}})
    before = diagnose_job.run_diagnosis(spark, diagnosis)
    print(diagnose_job.write_outputs(spark, diagnosis, before))
    print("\n## Retrieval before / after each candidate: same-chapter neighbours of every sentence "
          f"(recall@{config.evaluation_k}, nDCG@{config.evaluation_k}; 'none' = raw vectors)\n\n"
          + evaluation_markdown(before["evaluation"]))

    fit = load(fit_job.FitConfig, config.fit_conf, {"input": config.corpus_table, "method": config.method})
    manifest = fit_job.run_fit(spark, fit)
    print(f"fitted {manifest['method']} {manifest['params']} → artifact {fit.artifact} "
          f"(transform_version {manifest['transform_version']})")

    apply = load(apply_job.ApplyConfig, config.apply_conf,
                 {"input": config.corpus_table, "artifact": fit.artifact, "output": config.corrected_table})
    applied = apply_job.run_apply(spark, apply)
    print(f"apply: {applied['status']} → {config.corrected_table} (Delta version {applied['output_version']})")

    corrected = dataclasses.replace(diagnosis, input=config.corrected_table, evaluation=None,
                                    output_dir=storage.join(diagnosis.output_dir, "corrected"))
    after = diagnose_job.run_diagnosis(spark, corrected)
    diagnose_job.write_outputs(spark, corrected, after, before=before)
    print(f"\n## Before / after {manifest['method']}\n\n" + side_by_side(before["metrics"], after["metrics"]))

    nightly = load(NightlyConfig, config.nightly_conf, {"input": config.corpus_table})
    for night in (1, 2):
        record = nightly_job.run_nightly(spark, nightly)
        what = (f"recommended {record['recommendation']['method']}, applied {record['applied']['method']}"
                if record["applied"] else "nothing to do: the output already holds this input version and config")
        print(f"\nnightly run {night}: {record['status']} — {what}; {nightly.output} is at Delta version "
              f"{output_state(spark, nightly.output).version}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
