"""The candidate grid fitted from one moments state, its held-out evidence, and the decision that follows it.

**The grid** (:func:`candidate_grid`), every entry but cluster_recenter fitted from a moments state with one
``eigh`` (so the same grid can be refitted cheaply on the state minus some rows, :meth:`Moments.remove`):

* ``none``               — the raw vectors (the baseline, "raw"),
* ``center``             — v − μ,
* ``abtt D=j``           — ABTT of the top j directions, j = 1 … max(1, round(d/100)) (the textbook's starting
  point), plus the Marchenko–Pastur count (the upper end: a noise null, not evidence of an artefact),
* ``abtt [i, j]``        — ABTT of the artefact set (directions the artefact test flagged), when it is not a top-j,
* ``whitening k=…``      — whitening-k for a few k: the ``whitening_variance`` k, d/4 and d/2, capped at the rank,
* ``abtt+whitening …``   — ABTT of the artefact set (else the top max(1, round(d/100))) then whitening-k of the rest,
* ``cluster_recenter``   — when a fitted :class:`~anisotropy_core.cluster_recenter.ClusterRecenter` is given,
* ``published``          — (added by the caller) the transform the output currently carries.

**The evidence** (:func:`summarise`): per-query metric values (recall@k, nDCG@k) or pair cosines (Spearman ρ)
of every candidate are split by a hash of the query / pair id into a *selection* half (which candidate is best)
and a disjoint *report* half (how good it is). On the report half each candidate gets its means and a paired
bootstrap interval of its difference to raw and to the published transform.

**The decision** (:func:`decide`): the best candidate on the selection half is published only when the lower
bound of its Δ against raw exceeds ``min_gain`` and, when something is published, the lower bound of its Δ
against the published transform exceeds 0; otherwise the published transform is kept (nothing published yet:
``none``, the vectors unchanged). An explicitly configured method is refused (:func:`refuse_explicit`) when the
upper bound of its Δ against raw on some metric lies below −``max_quality_drop``.

Every metric is higher = better.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence, TypedDict

import numpy as np

from .bootstrap import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    Ids,
    interval,
    mean_draws,
    resample_indices,
    selection_half,
    spearman_draws,
    spearman_rows,
)
from .decision import whitening_k
from .diagnostics import centred_spectrum
from .methods import Method
from .moments import Moments
from .transforms import FittedTransform, choose_directions, fit_abtt, fit_center, fit_whitening

RAW, PUBLISHED = Method.NONE, "published"
ABTT_WHITENING = "abtt+whitening"  # the family of ABTT then whitening-k of the rest (a whitening fit)


@dataclass(frozen=True)
class Candidate:
    """One grid entry: ``name`` (unique, e.g. ``"abtt D=2"``), ``family`` (none, center, abtt, whitening,
    abtt+whitening, cluster_recenter), the 1-based ``directions`` ABTT removes, whitening's ``k``, and
    ``origin``: which rules proposed it (``d/100``, ``artefact``, ``marchenko_pastur``, ``recommendation``,
    ``variance``, ``d/4``, ``d/2``)."""

    name: str
    family: str
    directions: tuple[int, ...] = ()
    k: int | None = None
    origin: tuple[str, ...] = field(default=())


def _as_list(value) -> list[int]:
    """An int, a list of ints or None as a list of ints."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _abtt_name(directions: Sequence[int]) -> str:
    top = list(directions) == list(range(1, len(directions) + 1))
    return f"D={len(directions)}" if top else "[" + ", ".join(str(j) for j in directions) + "]"


def candidate_grid(
    state: Moments,
    artefact: Iterable[int] = (),
    extra_D: Iterable[int] = (),
    extra_k: Iterable[int] = (),
    whitening_variance: float = 0.95,
    min_n: int | None = None,
    cluster_recenter: bool = False,
) -> list[Candidate]:
    """The grid of the module docstring for ``state`` (d dimensions, n rows).

    ``artefact``: directions the artefact test flagged; ``extra_D``: further ABTT entries (an int D = the top D,
    a list = that set of directions) and ``extra_k`` further whitening k (e.g. the recommendation's); ``min_n``: the
    fewest rows any fit of the grid will see (a fold's state), which caps D at min(d − 1, min_n − 1) and k at
    min(d, min_n − 1) (never more directions than the data spans).
    """
    n, d = state.n, state.d
    rows = min(n, min_n or n)
    limit_D, limit_k = min(d - 1, rows - 1), min(d, rows - 1)
    lam, _ = centred_spectrum(state)
    abtt: dict[tuple[int, ...], list[str]] = {}

    def add(directions: Sequence[int], origin: str) -> None:
        key = tuple(sorted(set(int(j) for j in directions)))
        if key and len(key) <= limit_D and key[-1] <= d:
            abtt.setdefault(key, []).append(origin)

    thumb = max(1, round(d / 100))
    for j in range(1, thumb + 1):
        add(range(1, j + 1), "d/100")
    artefact = sorted(set(_as_list(list(artefact))))
    add(artefact, "artefact")
    for item in extra_D:
        add(_as_list(item) if isinstance(item, (list, tuple)) else range(1, int(item) + 1), "recommendation")
    mp, _ = choose_directions(lam, n, d, "marchenko_pastur")
    add(mp, "marchenko_pastur")
    grid = [Candidate(RAW, Method.NONE), Candidate(Method.CENTER, Method.CENTER)]
    grid += [
        Candidate(f"abtt {_abtt_name(key)}", Method.ABTT, key, None, tuple(origin))
        for key, origin in sorted(abtt.items(), key=lambda item: (len(item[0]), item[0]))
    ]
    ks: dict[int, list[str]] = {}
    for k, origin in [(whitening_k(lam, rows, whitening_variance), "variance"), (d // 4, "d/4"), (d // 2, "d/2")] + [
        (k, "recommendation") for k in _as_list(list(extra_k))
    ]:
        if limit_k >= 1:
            ks.setdefault(max(1, min(int(k), limit_k)), []).append(origin)
    grid += [Candidate(f"whitening k={k}", Method.WHITENING, (), k, tuple(origin)) for k, origin in sorted(ks.items())]
    removed = tuple(artefact) if artefact and len(artefact) <= limit_D else tuple(range(1, min(thumb, limit_D) + 1))
    rest = min(d - len(removed), limit_k - len(removed))
    if removed and rest >= 1:
        k = max(1, min(whitening_k(np.delete(lam, [j - 1 for j in removed]), rows, whitening_variance), rest))
        grid.append(
            Candidate(
                f"abtt+whitening {_abtt_name(removed)} k={k}",
                ABTT_WHITENING,
                removed,
                k,
                ("artefact",) if artefact and removed == tuple(artefact) else ("d/100",),
            )
        )
    if cluster_recenter:
        grid.append(Candidate(Method.CLUSTER_RECENTER, Method.CLUSTER_RECENTER))
    return grid


def fit_candidate(
    state: Moments, candidate: Candidate, cluster_recenter: FittedTransform | None = None
) -> FittedTransform | None:
    """``candidate`` fitted from ``state`` (None for raw); cluster_recenter is the given fit (k-means is not a
    moments fit, so it is the same transform whatever rows the state holds)."""
    if candidate.family == Method.NONE:
        return None
    if candidate.family == Method.CENTER:
        return fit_center(state)
    if candidate.family == Method.ABTT:
        return fit_abtt(state, directions=list(candidate.directions))
    if candidate.family == Method.WHITENING:
        return fit_whitening(state, k=candidate.k)
    if candidate.family == ABTT_WHITENING:
        return fit_whitening(state, k=candidate.k, exclude=list(candidate.directions))
    if candidate.family == Method.CLUSTER_RECENTER:
        if cluster_recenter is None:
            raise ValueError("the cluster_recenter candidate needs a fitted ClusterRecenter")
        return cluster_recenter
    raise ValueError(f"unknown candidate family {candidate.family!r}")


def fit_grid(
    state: Moments, grid: Sequence[Candidate], cluster_recenter: FittedTransform | None = None
) -> dict[str, FittedTransform | None]:
    """{name: transform} of every grid entry fitted from ``state``, in grid order."""
    return {c.name: fit_candidate(state, c, cluster_recenter) for c in grid}


class CandidateIntervals(TypedDict):
    """One candidate's differences with their intervals: {metric: {"mean", "low", "high"}} against raw, and
    against the published transform (None when there is none)."""

    delta_vs_raw: dict[str, dict[str, float]]
    delta_vs_published: dict[str, dict[str, float]] | None


@dataclass
class Evidence:
    """What :func:`summarise` measured: per candidate the ``selection`` and ``report`` half means
    ({name: {metric: value}}) and the ``intervals`` ({name: {"delta_vs_raw": {metric: {mean, low, high}},
    "delta_vs_published": {…} | None}}), plus the half sizes ``sizes`` ({"queries_selection", …})."""

    selection: dict[str, dict[str, float]]
    report: dict[str, dict[str, float]]
    intervals: dict[str, CandidateIntervals]
    sizes: dict[str, int]


def summarise(
    names: Sequence[str],
    query_metrics: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    query_ids: np.ndarray | None = None,
    pair_cosines: Mapping[str, np.ndarray] | None = None,
    gold: np.ndarray | None = None,
    pair_keys: Sequence | None = None,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    split: bool = True,
) -> Evidence:
    """Selection / report split and paired bootstrap (module docstring) for candidates ``names`` (must include
    ``none``; ``published`` gets compared against when present).

    ``query_metrics``: {name: {metric: (m,) per-query values}} for the queries ``query_ids`` (m,);
    ``pair_cosines``: {name: (p,) cosine per pair} with the pairs' ``gold`` (p,) scores and ``pair_keys`` (p,)
    (what the pair split hashes). Raises ValueError when a half would hold fewer than 2 queries or 3 pairs.
    ``split=False`` (nothing is selected, one candidate is judged): both "halves" are every query / pair.
    """
    names = list(names)
    if RAW not in names:
        raise ValueError("the evidence needs the raw candidate 'none' as its baseline")
    selection: dict[str, dict[str, float]] = {name: {} for name in names}
    report: dict[str, dict[str, float]] = {name: {} for name in names}
    draws: dict[str, np.ndarray] = {}  # metric → (resamples, C) statistic per resample
    sizes: dict[str, int] = {}
    if query_metrics is not None:
        if query_ids is None:
            raise ValueError("query_metrics need their query_ids")
        half = _halves(query_ids, seed, split, 2, "queries")
        sizes.update(queries_selection=int(half.sum()), queries_report=int((~half).sum()))
        index = resample_indices(int((~half).sum()), resamples, seed)
        for metric in query_metrics[names[0]]:
            values = np.stack([np.asarray(query_metrics[name][metric], dtype=np.float64) for name in names])
            chosen_from = half if half.any() else ~half
            for c, name in enumerate(names):
                selection[name][metric] = float(values[c, chosen_from].mean())
                report[name][metric] = float(values[c, ~half].mean())
            draws[metric] = mean_draws(values[:, ~half], index)
    if pair_cosines is not None:
        if pair_keys is None or gold is None:
            raise ValueError("pair_cosines need their pair_keys and gold scores")
        half = _halves(pair_keys, seed, split, 3, "pairs")
        sizes.update(pairs_selection=int(half.sum()), pairs_report=int((~half).sum()))
        cosines = np.stack([np.asarray(pair_cosines[name], dtype=np.float64) for name in names])
        gold = np.asarray(gold, dtype=np.float64)
        for part, target in ((half if half.any() else ~half, selection), (~half, report)):
            rho = spearman_rows(cosines[:, part], np.broadcast_to(gold[part], cosines[:, part].shape))
            for c, name in enumerate(names):
                target[name]["spearman"] = float(rho[c])
        draws["spearman"] = spearman_draws(
            cosines[:, ~half], gold[~half], resample_indices(int((~half).sum()), resamples, seed)
        )
    raw = names.index(RAW)
    published = names.index(PUBLISHED) if PUBLISHED in names else None
    intervals: dict[str, CandidateIntervals] = {}
    for c, name in enumerate(names):

        def against(base: int) -> dict[str, dict[str, float]]:
            return {
                metric: interval(
                    report[name][metric] - report[names[base]][metric], stat[:, c] - stat[:, base], confidence
                )
                for metric, stat in draws.items()
            }

        intervals[name] = {
            "delta_vs_raw": against(raw),
            "delta_vs_published": against(published) if published is not None else None,
        }
    return Evidence(selection, report, intervals, sizes)


def _halves(ids: Ids, seed: int, split: bool, least: int, what: str) -> np.ndarray:
    """(m,) True = selection half; without ``split`` a mask whose "report half" (~mask) is every id."""
    if not split:
        if len(ids) < least:
            raise ValueError(f"the evaluation needs at least {least} {what}, got {len(ids)}")
        return np.zeros(len(ids), dtype=bool)
    half = selection_half(ids, seed)
    if half.sum() < least or (~half).sum() < least:
        raise ValueError(
            f"the evaluation splits its {what} by id into a selection half and a report half; "
            f"{half.shape[0]} {what} gave {int(half.sum())} and {int((~half).sum())}: at least "
            f"{least} are needed in each"
        )
    return half


def interval_text(delta: Mapping[str, float]) -> str:
    """``+0.0040 [-0.0020, +0.0100]``: a difference and its interval."""
    return f"{delta['mean']:+.4f} [{delta['low']:+.4f}, {delta['high']:+.4f}]"


def best_candidate(selection: Mapping[str, Mapping[str, float]], metric: str, excluded: Iterable[str] = ()) -> str:
    """The candidate (``published`` and ``excluded`` left out) with the highest selection-half ``metric``; ties
    (and undefined values) go to the earlier, simpler one in grid order."""
    left_out = {PUBLISHED, *excluded} - {RAW}
    names = [name for name in selection if name not in left_out]
    missing = [name for name in names if metric not in selection[name]]
    if missing:
        raise ValueError(f"metric {metric!r} was not measured for candidate(s) {missing}")
    score = {name: selection[name][metric] if np.isfinite(selection[name][metric]) else -np.inf for name in names}
    return max(names, key=lambda name: (score[name], -names.index(name)))


def decide(
    evidence: Evidence, metric: str, min_gain: float, published: bool, excluded: Mapping[str, str] | None = None
) -> tuple[str, str, str]:
    """(action ``publish`` | ``keep``, candidate, reason) for ``method: auto`` (module docstring). ``published``:
    whether the output already carries a transform (then ``keep`` names ``published``, else ``none``);
    ``excluded``: {candidate: why} candidates a gate would refuse whatever their scores (left out of the choice,
    named in the reason)."""
    excluded = dict(excluded or {})
    best = best_candidate(evidence.selection, metric, excluded)
    kept = PUBLISHED if published else RAW
    keep = "kept the published transform" if published else "published none (the vectors unchanged)"
    left_out = f" (left out: {'; '.join(f'{name}: {why}' for name, why in excluded.items())})" if excluded else ""
    if best == RAW:
        return "keep", kept, f"{keep}: no candidate beats raw on {metric} on the selection half{left_out}"
    vs_raw = evidence.intervals[best]["delta_vs_raw"][metric]
    said = f"best candidate {best} Δ {metric} vs raw {interval_text(vs_raw)}"
    if not vs_raw["low"] > min_gain:
        return "keep", kept, f"{keep}: {said} does not exceed min_gain {min_gain:g}{left_out}"
    said += f" exceeds min_gain {min_gain:g}"
    if published:
        against_published = evidence.intervals[best]["delta_vs_published"]
        if against_published is None:
            raise ValueError("published is set but the evidence holds no published candidate")
        vs_published = against_published[metric]
        if not vs_published["low"] > 0:
            return (
                "keep",
                kept,
                (
                    f"{keep}: {said}, but Δ vs the published transform {interval_text(vs_published)} "
                    f"does not exceed 0{left_out}"
                ),
            )
        said += f" and Δ vs the published transform {interval_text(vs_published)} exceeds 0"
    return "publish", best, f"published {best}: {said}{left_out}"


def refuse_explicit(intervals: CandidateIntervals, max_quality_drop: float) -> tuple[bool, str]:
    """(passes, reason) for an explicitly configured method scored as one candidate: refused when, on some
    metric, the upper bound of its Δ against raw lies below −``max_quality_drop`` (its interval says it is
    worse than raw by more than that)."""
    if not max_quality_drop >= 0:
        raise ValueError(f"max_quality_drop must be >= 0, got {max_quality_drop}")
    worse = {metric: delta for metric, delta in intervals["delta_vs_raw"].items() if delta["high"] < -max_quality_drop}
    if worse:
        metric = min(worse, key=lambda key: worse[key]["high"])
        return False, (
            f"quality gate: {metric} Δ vs raw {interval_text(worse[metric])} is below "
            f"-max_quality_drop {max_quality_drop:g} (the interval says it is worse than raw)"
        )
    shown = ", ".join(f"{metric} {interval_text(delta)}" for metric, delta in intervals["delta_vs_raw"].items())
    return True, (
        f"quality gate passed: no interval of Δ vs raw lies below -max_quality_drop {max_quality_drop:g} ({shown})"
    )


def query_drift(state: Moments, queries: np.ndarray, directions: int) -> list[dict]:
    """Seed chapter 7, failure two: how far the real queries' mean sits from the corpus mean along each of the
    top ``directions`` principal directions, in that direction's standard deviations:
    ``[{"index": j, "drift_sd": |⟨μ_q − μ_c, u_j⟩| / √λ_j}…]`` for (m, d) raw ``queries``. Above 1 the
    queries live where the corpus does not: a direction "removed as an artefact" may be where they differ."""
    lam, vectors = centred_spectrum(state)
    shift = np.asarray(queries, dtype=np.float64).mean(axis=0) - state.mean
    count = min(int(directions), state.d)
    return [
        {"index": j + 1, "drift_sd": float(abs(shift @ vectors[:, j]) / np.sqrt(lam[j])) if lam[j] > 0 else None}
        for j in range(count)
    ]
