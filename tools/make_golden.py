"""Reference IsoScores from the `isoscore` package (module ``IsoScore``, needs torch) → a test fixture.

Run once with ``make golden``: it installs requirements-extras.txt (torch, isoscore) into .venv-extras/,
kept out of the project's venv, then runs ``tools/make_golden.py tests/fixtures/isoscore_golden.json``.

Every cloud is regenerated from its generator name, keyword arguments and seed by
``anisotropy_core.synthetic`` (pure numpy), so the test recomputes the same cloud without torch and compares
``anisotropy_core.isotropy_measures.isoscore`` with the stored reference value.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from anisotropy_core import synthetic  # noqa: E402

# (name, generator, keyword arguments) — seeds are part of the keyword arguments
CLOUDS = [
    ("isotropic", "power_law", {"n": 2000, "d": 32, "alpha": 0.0, "seed": 11}),
    ("power_law_alpha1", "power_law", {"n": 1000, "d": 64, "alpha": 1.0, "seed": 12}),
    ("power_law_alpha2", "power_law", {"n": 1000, "d": 48, "alpha": 2.0, "seed": 13}),
    ("cone", "cone", {"n": 500, "d": 16, "offset": 5.0, "spread": 1.0, "alpha": 0.5, "seed": 14}),
    ("pencil", "pencil", {"n": 800, "d": 24, "length": 10.0, "seed": 15}),
    ("mixture", "mixture", {"n": 600, "d": 20, "proportions": [0.5, 0.3, 0.2], "separation": 6.0, "seed": 16}),
    ("low_rank_4_of_20", "low_rank", {"n": 300, "d": 20, "k": 4, "seed": 17}),
    ("fewer_points_than_dims", "power_law", {"n": 50, "d": 100, "alpha": 0.5, "seed": 18}),
]


def make_cloud(generator: str, kwargs: dict) -> np.ndarray:
    """(n, d) float64 cloud of a CLOUDS entry; ``low_rank`` is isotropic Gaussian in k of d coordinates."""
    if generator == "low_rank":
        rng = np.random.default_rng(kwargs["seed"])
        x = np.zeros((kwargs["n"], kwargs["d"]))
        x[:, : kwargs["k"]] = rng.normal(size=(kwargs["n"], kwargs["k"]))
        return x
    args = dict(kwargs)
    if generator == "mixture":
        args["proportions"] = tuple(args["proportions"])
        return getattr(synthetic, generator)(**args)[0]
    return getattr(synthetic, generator)(**args)


def main(out_path: str) -> None:
    import torch
    from IsoScore.IsoScore import IsoScore

    from importlib.metadata import version

    entries = []
    for name, generator, kwargs in CLOUDS:
        value = float(IsoScore(make_cloud(generator, kwargs)))
        entries.append({"name": name, "generator": generator, "kwargs": kwargs, "isoscore": value})
        print(f"{name:28s} {value:.12f}")
    payload = {
        "reference": f"isoscore {version('isoscore')} (IsoScore.IsoScore.IsoScore), torch {torch.__version__}",
        "clouds": entries,
    }
    out = pathlib.Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "tests" / "fixtures" / "isoscore_golden.json"))
