"""The seed's chapter-9 decision ("which fix, if any?") as one explicit, pure function. Plain numpy only.

The seed's decision tree lost its figure; this is the tree its chapters 1, 3, 6, 7 and 9 imply, written
down so it can be tested and so a nightly job can record *why* it corrected (or did not correct) a corpus.
:func:`recommend` walks these branches in order and stops at the first that fires:

1. **Mixture** ("the mean belongs to nobody", chapter 7, failure 2½; Cai et al.'s "globally anisotropic,
   locally isotropic"). Per-cluster diagnostics are given, the corpus is globally anisotropic (branch 2, 3
   or 4 would fire) and either every cluster is flatter than the whole (``locally_isotropic``) or a global
   centring would leave some cluster with an induced anisotropy ≥ ``induced_A_max``
   → ``cluster_recenter`` with the clusters' ``k``. Checked first because a global ABTT on a mixture
   deletes the cluster label (chapter 7, failure one).
2. **Artefact directions** (chapter 3, Step B; chapter 7). Principal directions above the Marchenko–Pastur
   edge whose projection correlates with a metadata column (|corr| ≥ ``artefact_corr``) and that no label
   separates along → ``abtt`` of exactly those directions (any set, e.g. PC1 and PC3). Never whitening:
   whitening rescales an artefact direction to unit variance, it does not remove it. When the spectrum is
   also steep, the reason says that ABTT then whitening-k is the candidate to score next.
3. **Steep spectrum** (chapter 1: effective rank collapses between α = 1 and α = 2; chapter 6: whitening
   is the closed form that flattens *and* reduces). ``power_law_alpha ≥ steep_alpha`` (α fitted over the
   signal range only, see :func:`anisotropy_core.diagnostics.signal_range`) and no artefact direction
   → ``whitening`` with ``k`` = the fewest directions holding ``whitening_variance`` of the centred
   variance, at most min(d, n − 1) (the tail beyond it is estimation noise that 1/√λ would amplify).
4. **A few dominant directions** over a flat bulk (chapter 3). ``top1_var ≥ spike_top1`` and at least one
   eigenvalue above the Marchenko–Pastur edge → ``abtt`` of the directions above the edge
   (:func:`anisotropy_core.transforms.choose_directions`, rule ``marchenko_pastur``, uncapped unless
   ``max_D``; d/100 when n ≤ d).
5. **Offset dominates** (chapter 1/3: "just centre"). A is more than ``offset_sigmas`` isotropic standard
   deviations (1/√d) above its null — 0 for sign-symmetric data, the chapter-8 sign-structure null
   (``A_sign_null``: 1/π dense, q/2 sparse) for non-negative data → ``center``.
6. **Already isotropic** (chapter 7, failure six: a contrastive embedder) → ``none``.

Guards applied after the branch (each adds a reason or warning, never silently):

* **The direction may be the answer** (chapter 7, failure one): when labels separate along a direction —
  the spread of the per-label mean projections is ≥ ``label_separation`` standard deviations of that
  projection (√λ_j) — warn; with ``protect_label_direction`` such a direction is dropped from an ``abtt``
  removal set (an empty set downgrades ``abtt`` to ``center``). If it also correlates with a numeric column
  the warning says it is artefact and signal at once ("neither prescription is right").
* n < ``min_n_per_d``·d → warning that the spectrum (and any fit) is noisy; numerical rank < d → warning.

``artefact`` is the per-direction test (``{"directions": [{"index", "eigenvalue", "abs_corr",
"label_separation"}…]}``); the older u1-only form (``{"abs_corr", "label_means"}``) is read as direction 1.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from .transforms import choose_directions, max_abs_corr

METHODS = ("none", "center", "abtt", "whitening", "cluster_recenter")


@dataclass(frozen=True)
class DecisionThresholds:
    """Tunable cut-offs of :func:`recommend`, with the defaults the nightly job documents.

    * ``offset_sigmas`` (3.0): A above this many isotropic SDs (1/√d) means the offset is real.
    * ``steep_alpha`` (1.5): fitted power-law slope α at or above which the spectrum is "steep". The seed
      (chapter 1) calls a 1/k spectrum "remarkably healthy" (effective rank 84 % of d) and places the wasted
      regime at α ≈ 1.5–1.6 (erank 12.9 of 768 at α = 1.6, 152 at α = 1); 1.5 is the start of that regime.
    * ``spike_top1`` (0.10): top-1 variance share at or above which one direction dominates the bulk.
    * ``whitening_variance`` (0.95): variance share kept by whitening-k's k directions.
    * ``induced_A_max`` (0.2): induced anisotropy a global centring may leave inside one cluster.
    * ``label_separation`` (1.0): spread of per-label mean u1 projections, in SDs of the projection.
    * ``artefact_corr`` (0.5): |corr(projection, metadata column)| that marks a direction as an artefact.
    * ``protect_label_direction`` (True): keep a direction labels separate along out of an ``abtt`` set.
    * ``min_n_per_d`` (10.0): n below this multiple of d triggers a small-sample warning.
    * ``max_D`` (None): optional cap on the Marchenko–Pastur count of removed directions (None = uncapped).
    """

    offset_sigmas: float = 3.0
    steep_alpha: float = 1.5
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
    """What to apply and why. ``D`` and ``directions`` (abtt: how many / which 1-based principal directions
    are removed), ``k`` (whitening: kept directions; cluster_recenter: clusters) are None when not
    applicable. ``evidence``: the numbers the branches looked at."""

    method: str
    D: int | None = None
    directions: list[int] | None = None
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


def artefact_directions(report: Mapping[str, Any], artefact: Mapping[str, Any] | None) -> list[dict]:
    """The per-direction artefact rows of ``artefact`` (see the module docstring), the u1-only form read as
    direction 1 (label separation from its per-label mean projections over √λ₁)."""
    if not artefact:
        return []
    if "directions" in artefact:
        return list(artefact["directions"])
    means = list(artefact.get("label_means", {}).values())
    lam1 = float(np.asarray(report["spectrum"])[0])
    spread = (max(means) - min(means)) / math.sqrt(lam1) if len(means) >= 2 and lam1 > 0 else None
    return [{"index": 1, "eigenvalue": lam1, "abs_corr": dict(artefact.get("abs_corr", {})),
             "label_separation": spread}]


def carries_label(direction: Mapping[str, Any], t: DecisionThresholds) -> bool:
    """True when labels separate along the direction by at least ``label_separation`` SDs."""
    spread = direction.get("label_separation")
    return spread is not None and spread >= t.label_separation


def recommend(report: Mapping[str, Any], clusters: Mapping[str, Any] | None = None,
              artefact: Mapping[str, Any] | None = None,
              thresholds: DecisionThresholds = DecisionThresholds()) -> Recommendation:
    """The chapter-9 decision for one corpus.

    ``report``: :func:`anisotropy_core.diagnose` output (uses n, d, anisotropy_A, isotropic_sd, top1_var,
    erank_frac, spectrum (d,), mp_above_upper, power_law_alpha, numerical_rank, and ``A_sign_null`` when
    present). ``clusters``: optional :func:`anisotropy_core.clustering.cluster_diagnostics` output
    (``{"global", "clusters": [row...], "locally_isotropic"}``). ``artefact``: optional artefact test
    (per-direction or u1-only form, see the module docstring).
    Returns a :class:`Recommendation` (see the module docstring for the branches, in order).
    """
    t = thresholds
    n, d = int(report["n"]), int(report["d"])
    null = float(report.get("A_sign_null") or 0.0)
    sigmas = (float(report["anisotropy_A"]) - null) / float(report["isotropic_sd"])
    alpha, top1 = float(report["power_law_alpha"]), float(report["top1_var"])
    above = int(report["mp_above_upper"])
    rows = artefact_directions(report, artefact)
    removable, rule = choose_directions(report["spectrum"], n, d, "artefact", artefact_directions=[
        r for r in rows if not carries_label(r, t)], artefact_corr=t.artefact_corr)
    evidence = {"A_in_isotropic_sds": sigmas, "A_null": null, "power_law_alpha": alpha, "top1_var": top1,
                "mp_above_upper": above, "erank_frac": float(report["erank_frac"]),
                "artefact_directions": removable}
    steep = math.isfinite(alpha) and alpha >= t.steep_alpha
    spiky = top1 >= t.spike_top1 and above >= 1
    rec = _mixture(report, clusters, t, evidence) if (steep or spiky or removable) else None
    if rec is None and removable:
        rec = Recommendation("abtt", D=len(removable), directions=removable, reasons=[
            _artefact_reason(rows, j, t) for j in removable] + [
            f"ABTT removes exactly principal direction(s) {removable} (rule: {rule}); whitening would only "
            "rescale them to unit variance and keep the artefact"])
        if steep:
            rec.reasons.append(f"the spectrum is also steep (α = {alpha:.2f} ≥ {t.steep_alpha}): ABTT of these "
                               "directions then whitening-k is the candidate to score next")
        evidence["D_rule"] = rule
    if rec is None and steep:
        k = whitening_k(report["spectrum"], n, t.whitening_variance)
        rec = Recommendation("whitening", k=k, reasons=[
            f"steep spectrum: power-law slope α = {alpha:.2f} ≥ {t.steep_alpha} over the signal range (effective "
            f"rank {report['effective_rank']:.2f} of {d}) and no artefact direction; whitening-k keeps the k = {k} "
            f"directions holding {t.whitening_variance:.0%} of the variance and rescales each to unit variance"])
    if rec is None and spiky:
        chosen, rule = choose_directions(report["spectrum"], n, d, "marchenko_pastur", max_D=t.max_D)
        rec = Recommendation("abtt", D=len(chosen), directions=chosen, reasons=[
            f"dominant directions over a flat bulk: top-1 share {top1:.3f} ≥ {t.spike_top1}, {above} "
            f"eigenvalue(s) above the Marchenko–Pastur edge; ABTT removes principal direction(s) {chosen} "
            f"(rule: {rule})"])
        evidence["D_rule"] = rule
    if rec is None and sigmas > t.offset_sigmas:
        rec = Recommendation("center", reasons=[
            f"the offset dominates: A = {report['anisotropy_A']:.4f} is {sigmas:.1f} isotropic SDs "
            f"(1/√d = {report['isotropic_sd']:.4f}) above its null {null:.4f} while the centred spectrum is not "
            f"concentrated (α = {alpha:.2f} < {t.steep_alpha}, top-1 share {top1:.3f}); centring subtracts the mean"])
    if rec is None:
        rec = Recommendation("none", reasons=[
            f"already isotropic: A is {sigmas:.1f} ≤ {t.offset_sigmas} isotropic SDs above its null {null:.4f} and "
            f"the spectrum is flat (α = {alpha:.2f}, top-1 share {top1:.3f}); correcting it would only add a "
            "fitted artefact and amplify noise (chapter 7, failure six: e.g. a contrastive embedder)"])
    rec.evidence = {**evidence, **rec.evidence}
    _label_guards(rec, rows, t)
    _sample_warnings(rec, report, t)
    return rec


def _artefact_reason(rows: list[dict], index: int, t: DecisionThresholds) -> str:
    row = next(r for r in rows if int(r["index"]) == index)
    column, corr = max_abs_corr(row)
    return (f"u{index} is an artefact: |corr(u{index} projection, {column})| = {corr:.2f} ≥ {t.artefact_corr}, "
            "it is above the Marchenko–Pastur edge and no label separates along it")


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


def _label_guards(rec: Recommendation, rows: list[dict], t: DecisionThresholds) -> None:
    """Warn about every direction labels separate along; keep those out of an ``abtt`` removal set."""
    labelled = [r for r in rows if carries_label(r, t)]
    u1 = next((r for r in rows if int(r["index"]) == 1), None)
    column, corr = max_abs_corr(u1) if u1 else (None, 0.0)
    rec.evidence.update(label_separation=u1.get("label_separation") if u1 else None, artefact_column=column,
                        artefact_abs_corr=corr if column else None)
    for row in labelled:
        j = int(row["index"])
        column, corr = max_abs_corr(row)
        both = (f"; u{j} also correlates with {column} (|corr| = {corr:.2f}): it is artefact and signal at once, "
                "so neither deleting nor keeping it is right — consider cluster-wise correction"
                ) if corr >= t.artefact_corr else ""
        rec.warnings.append(
            f"the direction may be the answer: labels separate along u{j} by {row['label_separation']:.2f} SDs of "
            f"its projection (≥ {t.label_separation}); removing u{j} would erase the label (chapter 7, failure "
            f"one){both}")
    protected = {int(r["index"]) for r in labelled}
    if rec.method == "abtt" and t.protect_label_direction and protected & set(rec.directions):
        kept = [j for j in rec.directions if j not in protected]
        rec.reasons.append(f"protect_label_direction keeps principal direction(s) {sorted(protected)} because "
                           "labels separate along them" + ("; abtt downgraded to center" if not kept else ""))
        rec.method, rec.directions, rec.D = ("abtt", kept, len(kept)) if kept else ("center", None, None)


def _sample_warnings(rec: Recommendation, report: Mapping[str, Any], t: DecisionThresholds) -> None:
    n, d = int(report["n"]), int(report["d"])
    if n < t.min_n_per_d * d:
        rec.warnings.append(f"n = {n} < {t.min_n_per_d:g}·d = {t.min_n_per_d * d:g}: the spectrum and any "
                            "fitted transform are noisy (n should be ≫ d)")
    if int(report["numerical_rank"]) < d:
        rec.warnings.append(f"rank collapse: only {report['numerical_rank']} of {d} eigenvalues are nonzero")
