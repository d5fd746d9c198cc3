"""The seed's chapter-9 decision ("which fix, if any?") as one explicit, pure function. Plain numpy only.

The seed's decision tree lost its figure; this is the tree its chapters 1, 3, 6, 7 and 9 imply, written
down so it can be tested and so a nightly job can record *why* it corrected (or did not correct) a corpus.
Its one rule: **nothing is deleted or whitened without evidence** ("artefact evidence … before you are allowed
to delete anything"). The evidence :func:`recommend` can see is the per-direction artefact test with its
permutation null (:mod:`anisotropy_core.artefact_evidence`); the other route, a held-out evaluation that shows a
removal helps, runs outside it (:mod:`anisotropy_core.evaluation`). :func:`recommend` walks these branches in
order and stops at the first that fires:

1. **Mixture** ("the mean belongs to nobody", chapter 7, failure 2½; Cai et al.'s "globally anisotropic,
   locally isotropic"), whatever the global spectrum looks like. Per-cluster diagnostics are given and either
   a global centring would leave some cluster with an induced anisotropy ≥ ``induced_A_max`` (the seed's
   90/10 mixture: 0.448), or every cluster is flatter than the whole (``locally_isotropic``) while the whole
   has at least one eigenvalue above the Marchenko–Pastur edge → ``cluster_recenter`` with the clusters' ``k``.
   When the diagnostics carry the mixture null (``mixture_p``, :mod:`anisotropy_core.mixture_evidence`) its p
   must be ≤ ``artefact_alpha``: k-means splits one elongated population into offset, flatter clusters too.
   Checked first because a global ABTT on a mixture deletes the cluster label (chapter 7, failure one).
2. **Artefact directions** (chapter 3, Step B; chapter 7). Principal directions above the Marchenko–Pastur
   edge that the artefact test flags *significant* (maxT-adjusted p < ``artefact_alpha`` and |Pearson| or
   |Spearman| ≥ ``artefact_corr`` with a metadata column), less those a label significantly separates along
   (``protect_label_direction``) → ``abtt`` of exactly those directions (any set, e.g. PC1 and PC3). Never
   whitening: whitening rescales an artefact direction to unit variance, it does not remove it.
3. **Offset is real** (chapter 1/3: "just centre"). A is more than ``offset_sigmas`` isotropic standard
   deviations (1/√d) above its null — 0 for sign-symmetric data, the chapter-8 sign-structure null m²/s
   (``A_sign_null``) for non-negative data → ``center``.
4. Otherwise → ``none``.

A steep spectrum (``power_law_alpha ≥ steep_alpha``: chapter 1's wasted regime) or a few dominant directions
(``top1_var ≥ spike_top1`` with eigenvalues above the Marchenko–Pastur edge) prescribes nothing by itself: the
Marchenko–Pastur edge is a null for sampling noise, not evidence that a direction is an artefact, and d/100 is
"a starting point, not an answer". Branches 3 and 4 then add a reason naming the unverified candidates a
held-out evaluation should score (whitening-k, ABTT with D ∈ {1 … round(d/100), the MP count}); the numbers sit
in ``evidence`` (``candidate_D``, ``whitening_k``, ``rule_of_thumb_D``, ``mp_above_upper``).
``Recommendation.verified`` is True when nothing is deleted without evidence: ``none``, ``center``,
``cluster_recenter`` (they delete no direction) and ``abtt`` of significant artefact directions.

Guards applied after the branch (each adds a reason or warning, never silently):

* **The direction may be the answer** (chapter 7, failure one): when labels significantly separate along a
  direction — the spread of the per-label mean projections is ≥ ``label_separation`` standard deviations of
  that projection (√λ_j) with a permutation-adjusted p < ``artefact_alpha`` — warn; if it is also an artefact
  the warning says it is artefact and signal at once ("neither prescription is right").
* n < ``min_n_per_d``·d → warning that the spectrum (and any fit) is noisy; numerical rank < d → warning.

The inputs are typed: the moments' :class:`~anisotropy_core.diagnostics.Diagnosis`, the null A is measured from
(``A_sign_null``), the artefact evidence (:class:`ArtefactEvidence`: the per-direction test of
:func:`anisotropy_core.artefact_evidence.direction_test`, or the older u1-only form ``{"abs_corr", "label_means"}``,
read as direction 1) and the mixture evidence (:class:`MixtureEvidence`). Both evidence types are the JSON-ready
dicts their producers return and the reports carry, typed for what :func:`recommend` reads of them. A direction
without ``p_adjusted`` (no null was run) is reported, never evidence.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

import numpy as np

from .artefact_evidence import DEFAULT_ALPHA, DEFAULT_PERMUTATIONS
from .diagnostics import Diagnosis
from .methods import Method
from .transforms import choose_directions, max_abs_corr, rule_of_thumb_d


class ArtefactDirection(TypedDict, total=False):
    """One principal direction of the artefact test, as :func:`recommend` reads it: its 1-based ``index`` and
    ``eigenvalue``, |Pearson| / |Spearman| per metadata column (None: a constant column), the maxT-adjusted
    ``p_adjusted`` (absent or None: no null was run), and the labels' ``label_separation`` (SDs of the projection)
    with its ``label_p_adjusted``; :func:`~anisotropy_core.artefact_evidence.direction_test` also records the p per
    column (``p_adjusted_by_column``) and its own flags (``significant``, ``label_significant``)."""

    index: int
    eigenvalue: float
    abs_corr: dict[str, float | None]
    abs_spearman: dict[str, float | None]
    p_adjusted: float | None
    p_adjusted_by_column: dict[str, float | None]
    label_separation: float | None
    label_p_adjusted: float | None
    significant: bool
    label_significant: bool


class ArtefactEvidence(TypedDict, total=False):
    """The artefact test of :func:`anisotropy_core.artefact_evidence.direction_test`: ``directions`` and its
    permutation ``null`` (``label_column_given`` read here); or the older u1-only form: u1's ``abs_corr`` per
    column and ``label_means`` ({label: u1 mean projection})."""

    directions: list[ArtefactDirection]
    null: dict[str, Any]
    abs_corr: dict[str, float | None]
    label_means: dict[str, float]


class MixtureEvidence(TypedDict, total=False):
    """Per-cluster diagnostics (:func:`anisotropy_core.clustering.cluster_diagnostics`, or
    :func:`anisotropy_core.mixture_evidence.mixture_check`'s on a sample): ``clusters`` (one row per cluster,
    ``induced_A_global_centring`` read here), ``locally_isotropic`` and, with the mixture null, ``mixture_null`` and
    ``mixture_p`` (:class:`~anisotropy_core.cluster_diagnostics.ClusterTable` is the whole table)."""

    clusters: list[dict[str, Any]]
    locally_isotropic: bool
    mixture_null: dict[str, Any]
    mixture_p: float | None


@dataclass(frozen=True)
class DecisionThresholds:
    """Tunable cut-offs of :func:`recommend`, with the defaults the nightly job documents.

    * ``offset_sigmas`` (3.0): A above this many isotropic SDs (1/√d) means the offset is real.
    * ``steep_alpha`` (1.5): fitted power-law slope α at or above which the spectrum is "steep". The seed
      (chapter 1) calls a 1/k spectrum "remarkably healthy" (effective rank 84 % of d) and places the wasted
      regime at α ≈ 1.5–1.6 (erank 12.9 of 768 at α = 1.6, 152 at α = 1); 1.5 is the start of that regime.
      A steep spectrum names unverified candidates; it prescribes nothing by itself.
    * ``spike_top1`` (0.10): top-1 variance share at or above which one direction dominates the bulk (reported
      as an unverified ABTT candidate).
    * ``whitening_variance`` (0.95): variance share kept by the whitening-k candidate's k directions.
    * ``induced_A_max`` (0.2): induced anisotropy a global centring may leave inside one cluster.
    * ``label_separation`` (1.0): spread of per-label mean projections, in SDs of the projection.
    * ``artefact_corr`` (0.5): |Pearson| or |Spearman| of (projection, metadata column) a significant direction
      must reach to be an artefact (the effect size next to the p-value).
    * ``artefact_alpha`` (0.05): family-wise level of the artefact test's permutation null (maxT-adjusted p below
      it is significant), for metadata and label separation alike.
    * ``artefact_permutations`` (999): permutations of that null; the smallest p it can give is 1/(1 + count).
    * ``protect_label_direction`` (True): keep a direction labels significantly separate along out of an
      ``abtt`` set.
    * ``min_n_per_d`` (10.0): n below this multiple of d triggers a small-sample warning.
    * ``max_D`` (None): optional cap on the Marchenko–Pastur count reported in ``candidate_D`` (None = uncapped).
    """

    offset_sigmas: float = 3.0
    steep_alpha: float = 1.5
    spike_top1: float = 0.10
    whitening_variance: float = 0.95
    induced_A_max: float = 0.2
    label_separation: float = 1.0
    artefact_corr: float = 0.5
    artefact_alpha: float = DEFAULT_ALPHA
    artefact_permutations: int = DEFAULT_PERMUTATIONS
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
        if not 0 < self.artefact_alpha < 1:
            problems.append(f"artefact_alpha must be in (0, 1), got {self.artefact_alpha}")
        elif not 1.0 / (self.artefact_permutations + 1) < self.artefact_alpha:
            problems.append(
                f"artefact_permutations={self.artefact_permutations} cannot give a p-value below "
                f"artefact_alpha={self.artefact_alpha} (the smallest is 1/(1 + permutations))"
            )
        if self.max_D is not None and self.max_D < 0:
            problems.append(f"max_D must be >= 0, got {self.max_D}")
        return problems


@dataclass
class Recommendation:
    """What to apply and why. ``D`` and ``directions`` (abtt: how many / which 1-based principal directions
    are removed), ``k`` (whitening: kept directions; cluster_recenter: clusters) are None when not
    applicable. ``verified``: nothing is deleted without evidence (``none``, ``center``, ``cluster_recenter``
    delete no direction; ``abtt`` removes only directions the artefact test flagged significant); False unless
    :func:`recommend` (or a held-out evaluation) established it.
    ``evidence``: the numbers the branches looked at, including the unverified candidates' grid
    (``candidate_D``, ``whitening_k``, ``rule_of_thumb_D``, ``mp_above_upper``)."""

    method: str
    D: int | None = None
    directions: list[int] | None = None
    k: int | None = None
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    verified: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON types: ``method`` as its plain name (a :class:`~anisotropy_core.methods.Method`
        is a str subclass that only prints as one)."""
        return {**asdict(self), "method": str(self.method)}


def whitening_k(spectrum: np.ndarray, n: int, variance: float) -> int:
    """Fewest leading directions of ``spectrum`` (d,) (descending) holding ``variance`` of the total,
    capped at min(d, n − 1) (the rank of n centred vectors), at least 1."""
    lam = np.clip(np.asarray(spectrum, dtype=np.float64), 0.0, None)
    share = np.cumsum(lam) / lam.sum()
    k = int(np.searchsorted(share, variance - 1e-12) + 1)
    return max(1, min(k, lam.shape[0], max(n - 1, 1)))


def candidate_d(n: int, d: int, artefact_count: int, mp_count: int) -> list[int]:
    """The ABTT grid a held-out evaluation scores: {1, 2, …, round(d/100)} ∪ {the artefact set's size, the
    Marchenko–Pastur count}, sorted, each in 1..min(d − 1, n − 1)."""
    limit = min(d - 1, n - 1)
    grid = set(range(1, rule_of_thumb_d(d) + 1)) | {artefact_count, mp_count}
    return sorted(D for D in grid if 1 <= D <= limit)


def artefact_directions(diagnosis: Diagnosis, artefact: ArtefactEvidence | None) -> list[ArtefactDirection]:
    """The per-direction artefact rows of ``artefact`` (see the module docstring), the u1-only form read as
    direction 1 (label separation from its per-label mean projections over √λ₁; no null, so no evidence)."""
    if not artefact:
        return []
    if "directions" in artefact:
        return list(artefact["directions"])
    means = list(artefact.get("label_means", {}).values())
    lam1 = float(np.asarray(diagnosis.spectrum)[0])
    spread = (max(means) - min(means)) / math.sqrt(lam1) if len(means) >= 2 and lam1 > 0 else None
    return [
        {"index": 1, "eigenvalue": lam1, "abs_corr": dict(artefact.get("abs_corr", {})), "label_separation": spread}
    ]


def is_artefact(direction: ArtefactDirection, t: DecisionThresholds) -> bool:
    """True when the artefact test flags the direction: adjusted p < ``artefact_alpha`` and |Pearson| or
    |Spearman| with some column ≥ ``artefact_corr``. A row without ``p_adjusted`` (no null) is never evidence."""
    p = direction.get("p_adjusted")
    return p is not None and p < t.artefact_alpha and max_abs_corr(direction)[1] >= t.artefact_corr


def carries_label(direction: ArtefactDirection, t: DecisionThresholds) -> bool:
    """True when labels significantly separate along the direction: by at least ``label_separation`` SDs with
    an adjusted p < ``artefact_alpha`` (a separation without a null is never enough)."""
    spread, p = direction.get("label_separation"), direction.get("label_p_adjusted")
    return spread is not None and p is not None and p < t.artefact_alpha and spread >= t.label_separation


def recommend(
    diagnosis: Diagnosis,
    clusters: MixtureEvidence | None = None,
    artefact: ArtefactEvidence | None = None,
    thresholds: DecisionThresholds = DecisionThresholds(),
    *,
    A_sign_null: float = 0.0,
) -> Recommendation:
    """The chapter-9 decision for one corpus.

    ``diagnosis``: :func:`anisotropy_core.diagnose` of the corpus (uses n, d, anisotropy_A, isotropic_sd,
    top1_var, erank_frac, spectrum (d,), mp_above_upper, power_law_alpha, numerical_rank). ``clusters``: optional
    mixture evidence. ``artefact``: optional artefact evidence (per-direction or u1-only form, see the module
    docstring). ``A_sign_null``: the A the offset is measured from (0 for sign-symmetric data; the chapter-8
    sign-structure null m²/s for non-negative data). Returns a :class:`Recommendation` (see the module docstring
    for the branches, in order).
    """
    t, report = thresholds, diagnosis
    n, d = int(report.n), int(report.d)
    null = float(A_sign_null or 0.0)
    sigmas = (float(report.anisotropy_A) - null) / float(report.isotropic_sd)
    alpha, top1 = float(report.power_law_alpha), float(report.top1_var)
    above = int(report.mp_above_upper)
    rows = artefact_directions(report, artefact)
    flagged = [r for r in rows if is_artefact(r, t)]
    protected = sorted(int(r["index"]) for r in flagged if carries_label(r, t)) if t.protect_label_direction else []
    removable, rule = choose_directions(
        report.spectrum,
        n,
        d,
        "artefact",
        artefact_directions=[r for r in flagged if int(r["index"]) not in protected],
        artefact_corr=t.artefact_corr,
    )
    mp_count = min(above, t.max_D) if t.max_D is not None else above
    k = whitening_k(report.spectrum, n, t.whitening_variance)
    evidence = {
        "A_in_isotropic_sds": sigmas,
        "A_null": null,
        "power_law_alpha": alpha,
        "top1_var": top1,
        "mp_above_upper": above,
        "erank_frac": float(report.erank_frac),
        "artefact_directions": removable,
        "rule_of_thumb_D": rule_of_thumb_d(d),
        "candidate_D": candidate_d(n, d, len(removable), mp_count),
        "whitening_k": k,
    }
    steep = math.isfinite(alpha) and alpha >= t.steep_alpha
    spiky = top1 >= t.spike_top1 and above >= 1
    concentrated = steep or spiky or above >= 1
    rec = _mixture(clusters, t, evidence, above)
    if rec is None and removable:
        rec = Recommendation(
            Method.ABTT,
            D=len(removable),
            directions=removable,
            reasons=[_artefact_reason(rows, j, t, artefact) for j in removable]
            + [
                f"ABTT removes exactly principal direction(s) {removable} (rule: {rule}); whitening would only "
                "rescale them to unit variance and keep the artefact"
            ],
        )
        if steep:
            rec.reasons.append(
                f"the spectrum is also steep (α = {alpha:.2f} ≥ {t.steep_alpha}): ABTT of these "
                f"directions then whitening-k (k = {k}) is a candidate to score on held-out queries"
            )
        evidence["D_rule"] = rule
    if rec is None:
        rec = _center_or_none(report, t, sigmas, null, alpha, top1, concentrated)
        if concentrated:
            rec.reasons.append(_candidates_reason(t, evidence, steep, spiky))
    if protected:
        rec.reasons.append(
            f"protect_label_direction keeps principal direction(s) {protected} although the artefact "
            "test flags them, because labels significantly separate along them"
        )
    rec.evidence = {**evidence, **rec.evidence}
    rec.verified = rec.method in (Method.NONE, Method.CENTER, Method.CLUSTER_RECENTER) or (
        rec.method == Method.ABTT and set(rec.directions or []) <= set(removable)
    )
    rec.reasons += _not_evidence_reasons(rows, t)
    _label_guards(rec, rows, t)
    _sample_warnings(rec, report, t)
    return rec


def _center_or_none(
    report: Diagnosis, t: DecisionThresholds, sigmas: float, null: float, alpha: float, top1: float, concentrated: bool
) -> Recommendation:
    """Branches 3 and 4: centring when the offset is real, else nothing; both delete no direction."""
    if sigmas > t.offset_sigmas:
        return Recommendation(
            Method.CENTER,
            reasons=[
                f"the offset dominates: A = {report.anisotropy_A:.4f} is {sigmas:.1f} isotropic SDs "
                f"(1/√d = {report.isotropic_sd:.4f}) above its null {null:.4f}; centring subtracts the mean and "
                "deletes no direction (chapter 1/3: just centre)"
            ],
        )
    if concentrated:
        return Recommendation(
            Method.NONE,
            reasons=[
                f"no verified correction: A is {sigmas:.1f} ≤ {t.offset_sigmas} isotropic SDs above its null "
                f"{null:.4f} and no direction is a verified artefact (α = {alpha:.2f}, top-1 share {top1:.3f})"
            ],
        )
    return Recommendation(
        Method.NONE,
        reasons=[
            f"already isotropic: A is {sigmas:.1f} ≤ {t.offset_sigmas} isotropic SDs above its null {null:.4f} and "
            f"the spectrum is flat (α = {alpha:.2f}, top-1 share {top1:.3f}); correcting it would only add a "
            "fitted artefact and amplify noise (chapter 7, failure six: e.g. a contrastive embedder)"
        ],
    )


def _candidates_reason(t: DecisionThresholds, evidence: dict, steep: bool, spiky: bool) -> str:
    """The unverified candidates a concentrated spectrum suggests, stated as candidates, never applied."""
    alpha, top1, above = evidence["power_law_alpha"], evidence["top1_var"], evidence["mp_above_upper"]
    thumb = evidence["rule_of_thumb_D"]
    shape = (
        f"steep spectrum (α = {alpha:.2f} ≥ {t.steep_alpha})"
        if steep
        else f"dominant directions (top-1 share {top1:.3f} ≥ {t.spike_top1})"
        if spiky
        else f"{above} eigenvalue(s) above the Marchenko–Pastur edge"
    )
    return (
        f"{shape}: whitening-k (k = {evidence['whitening_k']}) and ABTT D ∈ {{1..{thumb}}} (rule of thumb "
        f'd/100, "a starting point, not an answer"; grid {evidence["candidate_D"]} up to the Marchenko–Pastur '
        f"count {above}) are candidates to score on held-out queries; unverified, not applied: the "
        "Marchenko–Pastur edge is a null for sampling noise, not evidence that a direction is an artefact"
    )


def _artefact_reason(
    rows: list[ArtefactDirection], index: int, t: DecisionThresholds, artefact: ArtefactEvidence | None
) -> str:
    row = next(r for r in rows if int(r["index"]) == index)
    column, corr = max_abs_corr(row)
    label_given = bool((artefact or {}).get("null", {}).get("label_column_given")) or any(
        r.get("label_separation") is not None for r in rows
    )
    label = (
        "no label significantly separates along it"
        if label_given
        else "no label column was given, so whether it also carries signal is unchecked"
    )
    return (
        f"u{index} is an artefact: |corr(u{index} projection, {column})| = {corr:.2f} ≥ {t.artefact_corr} "
        f"with permutation-adjusted p = {row['p_adjusted']:.3g} < {t.artefact_alpha}, it is above the "
        f"Marchenko–Pastur edge and {label}"
    )


def _not_evidence_reasons(rows: list[ArtefactDirection], t: DecisionThresholds) -> list[str]:
    """Directions whose |corr| reaches ``artefact_corr`` but that the test does not support: said, not used."""
    out = []
    for row in rows:
        column, corr = max_abs_corr(row)
        if corr < t.artefact_corr or is_artefact(row, t):
            continue
        p = row.get("p_adjusted")
        why = (
            "no permutation null was run for it"
            if p is None
            else f"its permutation-adjusted p = {p:.3g} ≥ {t.artefact_alpha} (could be chance at this sample size)"
        )
        out.append(f"u{row['index']} has |corr| = {corr:.2f} with {column} but {why}: not evidence, nothing removed")
    return out


def _mixture(
    clusters: MixtureEvidence | None, t: DecisionThresholds, evidence: dict[str, Any], above: int
) -> Recommendation | None:
    """Branch 1: the cluster-wise recommendation, or None when the clusters do not show a mixture."""
    if not clusters or len(clusters.get("clusters", [])) < 2:
        return None
    rows = clusters["clusters"]
    induced = [r.get("induced_A_global_centring") for r in rows]
    worst = max((v for v in induced if v is not None), default=0.0)
    local = bool(clusters.get("locally_isotropic")) and above >= 1
    p = clusters.get("mixture_p")
    evidence.update(
        clusters_locally_isotropic=bool(clusters.get("locally_isotropic")), worst_induced_A=worst, mixture_p=p
    )
    if not (local or worst >= t.induced_A_max):
        return None
    if p is not None and p > t.artefact_alpha:
        evidence["mixture_unverified"] = (
            f"k-means finds no more structure than in one Gaussian population of the "
            f"same shape (mixture null p = {p:.2f} > {t.artefact_alpha})"
        )
        return None
    why = "; ".join(
        [
            "globally anisotropic, locally isotropic: every cluster has a smaller top-1 share and a "
            "larger effective rank than the whole corpus"
        ]
        * local
        + [f"a global mean would leave one cluster with induced anisotropy {worst:.3f} ≥ {t.induced_A_max}"]
        * (worst >= t.induced_A_max)
    )
    return Recommendation(
        Method.CLUSTER_RECENTER,
        k=len(rows),
        reasons=[
            f"the corpus is a mixture of {len(rows)} clusters ({why}); subtract each cluster's own mean "
            "(chapter 7: the mean belongs to nobody); it deletes no direction"
        ],
    )


def _label_guards(rec: Recommendation, rows: list[ArtefactDirection], t: DecisionThresholds) -> None:
    """Warn about every direction labels significantly separate along."""
    u1 = next((r for r in rows if int(r["index"]) == 1), None)
    column, corr = max_abs_corr(u1) if u1 else (None, 0.0)
    rec.evidence.update(
        label_separation=u1.get("label_separation") if u1 else None,
        artefact_column=column,
        artefact_abs_corr=corr if column else None,
    )
    for row in (r for r in rows if carries_label(r, t)):
        j = int(row["index"])
        column, corr = max_abs_corr(row)
        both = (
            (
                f"; u{j} also correlates with {column} (|corr| = {corr:.2f}): it is artefact and signal at once, "
                "so neither deleting nor keeping it is right — consider cluster-wise correction"
            )
            if is_artefact(row, t)
            else ""
        )
        rec.warnings.append(
            f"the direction may be the answer: labels separate along u{j} by {row['label_separation']:.2f} SDs of "
            f"its projection (≥ {t.label_separation}, permutation-adjusted p = {row['label_p_adjusted']:.3g}); "
            f"removing u{j} would erase the label (chapter 7, failure one){both}"
        )


def _sample_warnings(rec: Recommendation, report: Diagnosis, t: DecisionThresholds) -> None:
    n, d = int(report.n), int(report.d)
    if n < t.min_n_per_d * d:
        rec.warnings.append(
            f"n = {n} < {t.min_n_per_d:g}·d = {t.min_n_per_d * d:g}: the spectrum and any "
            "fitted transform are noisy (n should be ≫ d)"
        )
    if int(report.numerical_rank) < d:
        rec.warnings.append(f"rank collapse: only {report.numerical_rank} of {d} eigenvalues are nonzero")
