"""The seed's chapter-9 decision ("which fix, if any?") as one explicit, pure function. Plain numpy only.

The seed's decision tree lost its figure; this is the tree its chapters 1, 3, 6, 7 and 9 imply, written
down so it can be tested and so a nightly job can record *why* it corrected (or did not correct) a corpus.
:func:`recommend` walks these branches in order and stops at the first that fires:

1. **Mixture** ("the mean belongs to nobody", chapter 7, failure 2½; Cai et al.'s "globally anisotropic,
   locally isotropic"). Per-cluster diagnostics are given, the corpus is globally anisotropic (branch 2 or
   3 would fire) and either every cluster is flatter than the whole (``locally_isotropic``) or a global
   centring would leave some cluster with an induced anisotropy ≥ ``induced_A_max``
   → ``cluster_recenter`` with the clusters' ``k``. Checked first because a global ABTT on a mixture
   deletes the cluster label (chapter 7, failure one).
2. **Steep spectrum** (chapter 1: effective rank collapses between α = 1 and α = 2; chapter 6: whitening
   is the closed form that flattens *and* reduces). ``power_law_alpha ≥ steep_alpha``
   → ``whitening`` with ``k`` = the fewest directions holding ``whitening_variance`` of the centred
   variance, at most min(d, n − 1) (the tail beyond it is estimation noise that 1/√λ would amplify).
3. **A few dominant directions** over a flat bulk (chapter 3). ``top1_var ≥ spike_top1`` and at least one
   eigenvalue above the Marchenko–Pastur edge → ``abtt`` with ``D`` measured by
   :func:`anisotropy_core.transforms.choose_d` (MP count capped at max(1, round(d/100)); d/100 when n ≤ d).
4. **Offset dominates** (chapter 1/3: "just centre"). A is more than ``offset_sigmas`` isotropic standard
   deviations (1/√d) above 0 → ``center``.
5. **Already isotropic** (chapter 7, failure six: a contrastive embedder) → ``none``.

Guards applied after the branch (each adds a reason or warning, never silently):

* **The direction may be the answer** (chapter 7, failure one): when labels separate along u1 — the spread
  of the per-label mean projections is ≥ ``label_separation`` standard deviations of the u1 projection
  (√λ₁) — warn; with ``protect_label_direction`` an ``abtt`` that would delete u1 is downgraded to
  ``center``. If u1 also correlates with a numeric column (|corr| ≥ ``artefact_corr``) the warning says it
  is artefact and signal at once ("neither prescription is right").
* An artefact correlation alone (|corr| ≥ ``artefact_corr``, e.g. token count) is recorded as a reason
  supporting removal of u1.
* n < ``min_n_per_d``·d → warning that the spectrum (and any fit) is noisy; numerical rank < d → warning.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from .transforms import choose_d

METHODS = ("none", "center", "abtt", "whitening", "cluster_recenter")


@dataclass(frozen=True)
class DecisionThresholds:
    """Tunable cut-offs of :func:`recommend`, with the defaults the nightly job documents.

    * ``offset_sigmas`` (3.0): A above this many isotropic SDs (1/√d) means the offset is real.
    * ``steep_alpha`` (1.0): fitted power-law slope α at or above which the spectrum is "steep".
    * ``spike_top1`` (0.10): top-1 variance share at or above which one direction dominates the bulk.
    * ``whitening_variance`` (0.95): variance share kept by whitening-k's k directions.
    * ``induced_A_max`` (0.2): induced anisotropy a global centring may leave inside one cluster.
    * ``label_separation`` (1.0): spread of per-label mean u1 projections, in SDs of the projection.
    * ``artefact_corr`` (0.5): |corr(u1 projection, metadata column)| that marks u1 as an artefact.
    * ``protect_label_direction`` (True): downgrade ``abtt`` to ``center`` when labels separate along u1.
    * ``min_n_per_d`` (10.0): n below this multiple of d triggers a small-sample warning.
    * ``max_D`` (None): cap on the measured ABTT D (None = max(1, round(d/100))).
    """

    offset_sigmas: float = 3.0
    steep_alpha: float = 1.0
    spike_top1: float = 0.10
    whitening_variance: float = 0.95
    induced_A_max: float = 0.2
    label_separation: float = 1.0
    artefact_corr: float = 0.5
    protect_label_direction: bool = True
    min_n_per_d: float = 10.0
    max_D: int | None = None

    def check(self) -> list[str]:
        """Impossible settings, as messages naming the key (empty when all is well)."""
        problems = []
        for key in ("offset_sigmas", "steep_alpha", "label_separation", "min_n_per_d"):
            if not getattr(self, key) >= 0:
                problems.append(f"{key} must be >= 0, got {getattr(self, key)}")
        for key in ("spike_top1", "induced_A_max", "artefact_corr"):
            if not 0 <= getattr(self, key) <= 1:
                problems.append(f"{key} must be in [0, 1], got {getattr(self, key)}")
        if not 0 < self.whitening_variance <= 1:
            problems.append(f"whitening_variance must be in (0, 1], got {self.whitening_variance}")
        if self.max_D is not None and self.max_D < 0:
            problems.append(f"max_D must be >= 0, got {self.max_D}")
        return problems


@dataclass
class Recommendation:
    """What to apply and why. ``D`` (abtt), ``k`` (whitening: kept directions; cluster_recenter: clusters)
    are None when not applicable. ``evidence``: the numbers the branches looked at."""

    method: str
    D: int | None = None
    k: int | None = None
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def whitening_k(spectrum: np.ndarray, n: int, variance: float) -> int:
    """Fewest leading directions of ``spectrum`` (d,) (descending) holding ``variance`` of the total,
    capped at min(d, n − 1) (the rank of n centred vectors), at least 1."""
    lam = np.clip(np.asarray(spectrum, dtype=np.float64), 0.0, None)
    share = np.cumsum(lam) / lam.sum()
    k = int(np.searchsorted(share, variance - 1e-12) + 1)
    return max(1, min(k, lam.shape[0], max(n - 1, 1)))


def label_spread(report: Mapping[str, Any], artefact: Mapping[str, Any] | None) -> float | None:
    """(max − min) of the per-label mean u1 projections over √λ₁ (the projection's SD), or None."""
    means = list((artefact or {}).get("label_means", {}).values())
    if len(means) < 2:
        return None
    sd = math.sqrt(float(np.asarray(report["spectrum"])[0]))
    return (max(means) - min(means)) / sd if sd > 0 else None


def max_artefact_corr(artefact: Mapping[str, Any] | None) -> tuple[str | None, float | None]:
    """(column, |corr|) of the metadata column most correlated with the u1 projection, or (None, None)."""
    known = {k: v for k, v in (artefact or {}).get("abs_corr", {}).items() if v is not None}
    if not known:
        return None, None
    name = max(known, key=known.get)
    return name, float(known[name])


def recommend(report: Mapping[str, Any], clusters: Mapping[str, Any] | None = None,
              artefact: Mapping[str, Any] | None = None,
              thresholds: DecisionThresholds = DecisionThresholds()) -> Recommendation:
    """The chapter-9 decision for one corpus.

    ``report``: :func:`anisotropy_core.diagnose` output (uses n, d, anisotropy_A, isotropic_sd, top1_var,
    erank_frac, spectrum (d,), mp_above_upper, power_law_alpha, numerical_rank).
    ``clusters``: optional :func:`anisotropy_core.clustering.cluster_diagnostics` output
    (``{"global", "clusters": [row...], "locally_isotropic"}``).
    ``artefact``: optional artefact test ``{"abs_corr": {col: |corr| | None}, "label_means": {label: mean}}``.
    Returns a :class:`Recommendation` (see the module docstring for the branches, in order).
    """
    t = thresholds
    n, d = int(report["n"]), int(report["d"])
    sigmas = float(report["anisotropy_A"]) / float(report["isotropic_sd"])
    alpha, top1 = float(report["power_law_alpha"]), float(report["top1_var"])
    above = int(report["mp_above_upper"])
    evidence = {"A_in_isotropic_sds": sigmas, "power_law_alpha": alpha, "top1_var": top1,
                "mp_above_upper": above, "erank_frac": float(report["erank_frac"])}
    steep = math.isfinite(alpha) and alpha >= t.steep_alpha
    spiky = top1 >= t.spike_top1 and above >= 1
    rec = _mixture(report, clusters, t, evidence) if (steep or spiky) else None
    if rec is None and steep:
        k = whitening_k(report["spectrum"], n, t.whitening_variance)
        rec = Recommendation("whitening", k=k, reasons=[
            f"steep spectrum: power-law slope α = {alpha:.2f} ≥ {t.steep_alpha} (effective rank "
            f"{report['effective_rank']:.2f} of {d}); whitening-k keeps the k = {k} directions holding "
            f"{t.whitening_variance:.0%} of the variance and equalises them"])
    if rec is None and spiky:
        D, rule = choose_d(np.asarray(report["spectrum"]), n, d, max_D=t.max_D)
        rec = Recommendation("abtt", D=D, reasons=[
            f"dominant directions over a flat bulk: top-1 share {top1:.3f} ≥ {t.spike_top1}, {above} "
            f"eigenvalue(s) above the Marchenko–Pastur edge; remove D = {D} (rule: {rule})"])
        evidence["D_rule"] = rule
    if rec is None and sigmas > t.offset_sigmas:
        rec = Recommendation("center", reasons=[
            f"the offset dominates: A = {report['anisotropy_A']:.4f} is {sigmas:.1f} isotropic SDs "
            f"(1/√d = {report['isotropic_sd']:.4f}) above 0 while the centred spectrum is not concentrated "
            f"(α = {alpha:.2f} < {t.steep_alpha}, top-1 share {top1:.3f})"])
    if rec is None:
        rec = Recommendation("none", reasons=[
            f"already isotropic: A is {sigmas:.1f} ≤ {t.offset_sigmas} isotropic SDs and the spectrum is flat "
            f"(α = {alpha:.2f}, top-1 share {top1:.3f}); correcting it would only add a fitted artefact and "
            "amplify noise (chapter 7, failure six: e.g. a contrastive embedder)"])
    rec.evidence = {**evidence, **rec.evidence}
    _artefact_guards(rec, report, artefact, t)
    _sample_warnings(rec, report, t)
    return rec


def _mixture(report: Mapping[str, Any], clusters: Mapping[str, Any] | None, t: DecisionThresholds,
             evidence: dict[str, Any]) -> Recommendation | None:
    """Branch 1: the cluster-wise recommendation, or None when the clusters do not show a mixture."""
    if not clusters or len(clusters.get("clusters", [])) < 2:
        return None
    rows = clusters["clusters"]
    induced = [r.get("induced_A_global_centring") for r in rows]
    worst = max((v for v in induced if v is not None), default=0.0)
    local = bool(clusters.get("locally_isotropic"))
    evidence.update(clusters_locally_isotropic=local, worst_induced_A=worst)
    if not (local or worst >= t.induced_A_max):
        return None
    why = ("globally anisotropic, locally isotropic: every cluster has a smaller top-1 share and a larger "
           "effective rank than the whole corpus" if local else
           f"a global mean would leave one cluster with induced anisotropy {worst:.3f} ≥ {t.induced_A_max}")
    return Recommendation("cluster_recenter", k=len(rows), reasons=[
        f"the corpus is a mixture of {len(rows)} clusters ({why}); subtract each cluster's own mean "
        "(chapter 7: the mean belongs to nobody)"])


def _artefact_guards(rec: Recommendation, report: Mapping[str, Any], artefact: Mapping[str, Any] | None,
                     t: DecisionThresholds) -> None:
    """The u1 artefact test: label separation (warn / protect) and metadata correlation (support)."""
    spread = label_spread(report, artefact)
    column, corr = max_artefact_corr(artefact)
    rec.evidence.update(label_separation=spread, artefact_column=column, artefact_abs_corr=corr)
    is_artefact = corr is not None and corr >= t.artefact_corr
    if spread is not None and spread >= t.label_separation:
        both = (f"; u1 also correlates with {column} (|corr| = {corr:.2f}): it is artefact and signal at once, "
                "so neither deleting nor keeping it is right — consider cluster-wise correction") if is_artefact else ""
        rec.warnings.append(
            f"the direction may be the answer: labels separate along u1 by {spread:.2f} SDs of its projection "
            f"(≥ {t.label_separation}); removing u1 would erase the label (chapter 7, failure one){both}")
        if rec.method == "abtt" and t.protect_label_direction:
            rec.reasons.append("abtt downgraded to center: protect_label_direction keeps u1 because it carries "
                               "the label")
            rec.method, rec.D = "center", None
    elif is_artefact:
        rec.reasons.append(f"u1 is an artefact: |corr(u1 projection, {column})| = {corr:.2f} ≥ {t.artefact_corr} "
                           "and no label separates along it, so removing it is justified")


def _sample_warnings(rec: Recommendation, report: Mapping[str, Any], t: DecisionThresholds) -> None:
    n, d = int(report["n"]), int(report["d"])
    if n < t.min_n_per_d * d:
        rec.warnings.append(f"n = {n} < {t.min_n_per_d:g}·d = {t.min_n_per_d * d:g}: the spectrum and any "
                            "fitted transform are noisy (n should be ≫ d)")
    if int(report["numerical_rank"]) < d:
        rec.warnings.append(f"rank collapse: only {report['numerical_rank']} of {d} eigenvalues are nonzero")
