"""The demo's labelled query set: chapters counted from the ``Chapter N:`` headings in reading order."""

import re

import pyarrow.parquet as pq

from jobs.demo import CHAPTER_HEADING, DemoConfig, with_chapters


def test_with_chapters_counts_the_headings_at_or_before_each_sentence(spark):
    rows = [
        (5, "Chapter 2: Whitening"),
        (0, "A Title"),
        (3, "Another sentence."),
        (1, "Chapter 1: Geometry"),
        (6, "After chapter 2."),
        (2, "First sentence."),
        (4, "Not a heading: Chapter 3: inside a line."),
    ]
    corpus = spark.createDataFrame(rows, "sentence_id int, sentence string")
    chapters = {r["sentence_id"]: r["chapter"] for r in with_chapters(corpus).collect()}
    assert chapters == {0: 0, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2}


def test_with_chapters_matches_a_running_count_over_the_bundled_corpus(spark):
    """Against a plain Python running count in ``sentence_id`` order, over the demo's own layer of the corpus."""
    config = DemoConfig()
    table = pq.read_table(config.corpus_parquet, columns=["sentence_id", "sentence", "layer"]).to_pylist()
    layer = sorted((r["sentence_id"], r["sentence"]) for r in table if r["layer"] == config.layer)
    expected, chapter = {}, 0
    for sentence_id, sentence in layer:
        chapter += bool(re.search(CHAPTER_HEADING, sentence))
        expected[sentence_id] = chapter
    corpus = spark.createDataFrame(layer, "sentence_id int, sentence string").repartition(3)
    got = {r["sentence_id"]: r["chapter"] for r in with_chapters(corpus).collect()}
    assert got == expected
    assert len(got) == len(layer) > 1000 and max(got.values()) >= 9
