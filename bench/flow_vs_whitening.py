"""BERT-flow against whitening on the demo corpus (seed ch. 6: "the closed form does about as well").

    .venv/bin/python -m bench.flow_vs_whitening [--layer 3] [--steps 300] [--couplings 4] [--hidden 32]

Reads one layer of ``data/demo_corpus.parquet`` (real all-MiniLM-L6-v2 sentence vectors), splits it 80/20
with a fixed seed, fits whitening (closed form) and flow (trained on the 80 %) and prints, for the raw, the
whitened and the flowed vectors, on the fitted 80 % and on the held-out 20 %: average cosine A, effective
rank, IsoScore, uniformity, the largest |covariance − I| entry, and the fit time. Pure numpy, no Spark.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from anisotropy_core.diagnostics import diagnose
from anisotropy_core.flow import fit_flow
from anisotropy_core.isotropy_measures import isoscore, uniformity
from anisotropy_core.moments import Moments
from anisotropy_core.transforms import fit_whitening


def measures(vectors: np.ndarray) -> dict:
    report = diagnose(vectors)
    cov = np.cov(vectors.T, bias=True)
    return {
        "A": report["anisotropy_A"],
        "erank": report["effective_rank"],
        "isoscore": isoscore(vectors),
        "uniformity": uniformity(vectors)["uniformity"],
        "max|cov-I|": float(np.abs(cov - np.eye(len(cov))).max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="data/demo_corpus.parquet")
    parser.add_argument("--layer", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--couplings", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=32)
    args = parser.parse_args()
    table = pq.read_table(args.corpus)
    table = table.filter(pc.equal(table["layer"], args.layer))
    x = np.stack(table["vector"].to_numpy(zero_copy_only=False)).astype(np.float64)
    order = np.random.default_rng(0).permutation(len(x))
    cut = int(0.8 * len(x))
    fit_rows, held_out = x[order[:cut]], x[order[cut:]]
    print(f"layer {args.layer}: n = {len(x)} (fit {len(fit_rows)}, held out {len(held_out)}), d = {x.shape[1]}")

    start = time.perf_counter()
    whitening = fit_whitening(Moments.of_batch(fit_rows))
    white_time = time.perf_counter() - start
    start = time.perf_counter()
    flow = fit_flow(fit_rows, couplings=args.couplings, hidden=args.hidden, steps=args.steps)
    flow_time = time.perf_counter() - start
    print(
        f"whitening fit {white_time:.2f} s; flow fit {flow_time:.2f} s ({args.steps} steps, {args.couplings} "
        f"couplings, hidden {args.hidden}; nll {flow.training['initial_nll']:.1f} → {flow.training['final_nll']:.1f})"
    )

    header = f"{'':>22}" + "".join(f"{k:>12}" for k in ("A", "erank", "isoscore", "uniformity", "max|cov-I|"))
    print(header)
    for split, rows in (("fit", fit_rows), ("held-out", held_out)):
        for name, vectors in (("raw", rows), ("whitening", whitening.apply(rows)), ("flow", flow.apply(rows))):
            values = measures(vectors)
            print(f"{split + ' ' + name:>22}" + "".join(f"{v:12.4f}" for v in values.values()))


if __name__ == "__main__":
    main()
