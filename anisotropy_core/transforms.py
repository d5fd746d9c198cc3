"""Fitted corrections of an embedding cloud (seed chapters 3 and 6), pure numpy.

Every fit starts from a merged :class:`~anisotropy_core.moments.Moments` state (one streaming pass) and
one driver-side ``eigh`` of its *centred* covariance Σ (1/n normalisation). Row-vector convention:
vectors are rows, a batch is an (n, d) matrix, matrices act on the right.

* :class:`Center`        — z = v − μ.                                       (n, d) → (n, d)
* :class:`AllButTheTop`  — z = (v − μ) P,  P = I − UᵀU, U (D, d) a chosen set of principal directions of Σ
                           (the top D, or any set such as PC1 and PC3; :func:`choose_directions`)
                           (never of the uncentred second moment S = Σ + μμᵀ, whose top direction is
                           essentially μ and would waste the first removal on redoing the centring).
                                                                             (n, d) → (n, d)
* :class:`Whitening`     — z = (v − μ) W,  W = U_k Λ_k^{-1/2} (d, k), or the symmetric/ZCA
                           W = U_k Λ_k^{-1/2} U_kᵀ (d, d); optional shrinkage of Σ toward (tr Σ/d)·I,
                           a relative eigenvalue clamp, optional L2 normalisation of the output.
                                                                             (n, d) → (n, k) or (n, d)

A fitted transform is a small object with ``method`` (registry name), ``d_in``/``d_out``, ``apply(X)``,
``params()`` (JSON-serialisable scalars) and ``arrays()`` (name → float64 ndarray); :func:`from_parts`
rebuilds any registered type from those two dicts, which is all the artifact and Spark layers use.
New transform types (e.g. cluster-wise recentring) register themselves with :func:`register`.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence, Union

import numpy as np

from .diagnostics import covariance_spectrum, dual_spectrum, marchenko_pastur_edges
from .methods import Method, WhiteningSettings
from .moments import InvalidVectorsError, Moments

REGISTRY: dict[str, type["FittedTransform"]] = {}
# method → module that registers it
PLUGINS: dict[str, str] = {
    Method.CLUSTER_RECENTER: "anisotropy_core.cluster_recenter",
    Method.FLOW: "anisotropy_core.flow",
}

DEFAULT_EPS = WhiteningSettings.eps  # whitening clamp: eigenvalues below eps·λ₁ are raised to eps·λ₁
APPLY_BLOCK_ROWS = 256  # rows per block of apply: its float64 scratch (256 × d × 8 bytes) stays in the CPU cache


class TransformInputError(ValueError):
    """Input to ``apply`` has the wrong shape or a non-finite value; ``row`` is the bad row or None."""

    def __init__(self, message: str, row: int | None = None):
        super().__init__(message)
        self.row = row


class NonFiniteOutputError(ValueError):
    """A transformed row is non-finite or cannot be normalised; ``row`` is its index in the batch.

    ``template``: the message with a ``{row}`` field, so that :meth:`shifted` can restate it for a batch
    of which the failing rows were one block."""

    def __init__(self, template: str, row: int):
        super().__init__(template.format(row=row))
        self.template, self.row = template, row

    def shifted(self, offset: int) -> "NonFiniteOutputError":
        """The same error for the batch whose block starting at row ``offset`` raised it."""
        return NonFiniteOutputError(self.template, self.row + offset)


def register(cls: type["FittedTransform"]) -> type["FittedTransform"]:
    """Class decorator: make ``cls`` loadable by its ``method`` name via :func:`from_parts`."""
    REGISTRY[cls.method] = cls
    return cls


def from_parts(method: str, params: dict[str, Any], arrays: dict[str, np.ndarray]) -> "FittedTransform":
    """Rebuild a fitted transform from its ``method`` name, ``params()`` and ``arrays()``.

    Methods defined in other modules (``PLUGINS``) are imported on first use, so a query-side process
    that only imports :mod:`anisotropy_core.artifact` can still load them.
    """
    if method not in REGISTRY and method in PLUGINS:
        importlib.import_module(PLUGINS[method])
    if method not in REGISTRY:
        raise ValueError(f"unknown transform method {method!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[method].from_parts(params, arrays)


class FittedTransform:
    """Base of all fitted corrections. Subclasses set ``method`` and implement ``_map`` (centred → output)."""

    method: ClassVar[str] = ""

    def __init__(self, mean: np.ndarray):
        self.mean = np.asarray(mean, dtype=np.float64)  # (d_in,)

    @property
    def d_in(self) -> int:
        return int(self.mean.shape[0])

    @property
    def d_out(self) -> int:
        return self.d_in

    def params(self) -> dict[str, Any]:
        """JSON-serialisable scalar hyper-parameters and fit facts (D, k, which rule chose D, …)."""
        return {}

    def arrays(self) -> dict[str, np.ndarray]:
        """Every fitted array, float64; ``mean`` (d_in,) always included."""
        return {"mean": self.mean}

    @classmethod
    def from_parts(cls, params: dict[str, Any], arrays: dict[str, np.ndarray]) -> "FittedTransform":
        raise NotImplementedError

    def apply(self, vectors: np.ndarray, dtype: type = np.float64) -> np.ndarray:
        """Transform raw vectors (n, d_in) or one vector (d_in,) → (n, d_out) or (d_out,) of ``dtype``.

        float32 or float64 input; every value is computed in float64 (:func:`map_blocks`: blocks of
        ``APPLY_BLOCK_ROWS`` rows), then cast to ``dtype`` (float64, or float32 for a float32 table).
        Raises :class:`TransformInputError` on a dimension mismatch or a non-finite input value and
        :class:`NonFiniteOutputError` if an output row would be non-finite, in float64 or after the cast
        (never returns NaN/Inf).
        """
        x = np.asarray(vectors)
        single = x.ndim == 1
        out = map_blocks(
            x[None, :] if single else x,
            self.d_in,
            self.d_out,
            dtype,
            lambda rows, _start: self._map(np.subtract(rows, self.mean, out=rows)),
            self.method,
        )
        return out[0] if single else out

    def _map(self, centred: np.ndarray) -> np.ndarray:
        """(b, d_out) float64 output of the centred rows ``centred`` (b, d_in) float64, which it may overwrite
        (and return)."""
        raise NotImplementedError

    def linear_map(self) -> np.ndarray | None:
        """(d_in, d_out) float64 L with ``apply(v) = (v − mean) L`` for every v when the correction is affine
        (centring, ABTT, whitening without row normalisation, ABTT → PCA → ABTT); None when it is not (row
        normalisation, per-cluster maps, flows). The output moments of an affine correction follow from the
        input's without reading a row (:func:`anisotropy_core.output_facts.affine_output_moments`)."""
        return None


# (rows (b, d_in) float64, which it may overwrite; the block's first row) → (b, d_out) float64
BlockFn = Callable[[np.ndarray, int], np.ndarray]


def map_blocks(x: np.ndarray, d_in: int, d_out: int, dtype: type, block: BlockFn, method: str) -> np.ndarray:
    """(n, d_out) ``dtype`` array of ``block`` applied to ``x`` (n, d_in) in blocks of ``APPLY_BLOCK_ROWS``
    rows. Each block is copied into one reused float64 scratch array (float32 → float64 is exact) that
    ``block`` may overwrite, so the float64 work stays in the CPU cache and no batch-sized or per-block
    float64 array is allocated: the extra float64 memory is one (``APPLY_BLOCK_ROWS``, d_in) array, whatever n
    is (timings: bench/RESULTS.md).

    Checks each input block (:func:`check_input`) and each output block after the cast to ``dtype``;
    errors name the row of ``x`` (a block's :class:`NonFiniteOutputError` is shifted to it).
    """
    out: np.ndarray = np.empty((check_shape(x, d_in).shape[0], d_out), dtype)
    scratch = np.empty((min(x.shape[0], APPLY_BLOCK_ROWS), d_in), np.float64)
    for start in range(0, x.shape[0], APPLY_BLOCK_ROWS):
        rows = scratch[: min(APPLY_BLOCK_ROWS, x.shape[0] - start)]
        np.copyto(rows, x[start : start + rows.shape[0]])
        check_input(rows, d_in, start)
        try:
            mapped = block(rows, start)
        except NonFiniteOutputError as exc:
            raise exc.shifted(start) from None
        target = out[start : start + rows.shape[0]]
        with np.errstate(over="ignore"):  # an overflowing cast is reported just below
            target[...] = mapped
        if not np.isfinite(target).all():
            row = int(np.argmax(~np.isfinite(target).all(axis=1)))
            if np.isfinite(mapped[row]).all():  # finite in float64: the cast to dtype overflowed
                raise NonFiniteOutputError(
                    f"{method}: row {{row}}: non-finite output value after the cast to {np.dtype(dtype).name}",
                    start + row,
                )
            raise NonFiniteOutputError(f"{method}: transformed row {{row}} is not finite", start + row)
    return out


GEMM_COLUMN_TILE = 8  # products of a batch with a fitted matrix run with a multiple of this many columns


def tiled_columns(matrix: np.ndarray) -> np.ndarray:
    """(d, k) ``matrix`` with zero columns appended up to a multiple of :data:`GEMM_COLUMN_TILE`: ``rows @ it`` then
    runs as a GEMM of whole column tiles, whose result for a row does not depend on where the row sits in ``rows``
    (numpy's matrix-vector path for k = 1 and OpenBLAS's edge kernels for other k do, in the last bits). So a row
    maps to the same float64 bits whichever batch, block or reader it comes in; the zero columns add exact
    zeros and are sliced off (or, for a projector, contribute nothing)."""
    width = -(-matrix.shape[1] // GEMM_COLUMN_TILE) * GEMM_COLUMN_TILE
    return np.pad(matrix, ((0, 0), (0, width - matrix.shape[1])))


def check_shape(x: np.ndarray, d: int) -> np.ndarray:
    """Return ``x`` if it is an (n, d) matrix; otherwise raise :class:`TransformInputError`."""
    if x.ndim != 2 or x.shape[1] != d:
        raise TransformInputError(
            f"input has shape {x.shape} but the transform was fitted on dimension {d}: "
            "apply it only to vectors from the same embedding model"
        )
    return x


def check_input(x: np.ndarray, d: int, first_row: int = 0) -> np.ndarray:
    """Return ``x`` if it is an (n, d) finite matrix; otherwise raise naming the first bad row/column
    (rows numbered from ``first_row``: ``x`` may be one block of a batch)."""
    finite = np.isfinite(check_shape(x, d))
    if not finite.all():
        row, col = (int(i) for i in np.argwhere(~finite)[0])
        raise TransformInputError(f"non-finite input value at row {first_row + row}, column {col}", first_row + row)
    return x


@register
class Center(FittedTransform):
    """z = v − μ (the offset fix: removes the rank-one spike μμᵀ from S = Σ + μμᵀ)."""

    method = Method.CENTER

    @classmethod
    def from_parts(cls, params, arrays):
        return cls(arrays["mean"])

    def _map(self, centred):
        return centred

    def linear_map(self):
        return np.eye(self.d_in)


@register
class AllButTheTop(FittedTransform):
    """Centre, then project out U (D, d), D chosen principal directions of the centred covariance.

    ``eigenvalues`` (d,) is the full centred spectrum (descending), kept for reporting;
    ``d_rule`` names the rule that chose the directions and ``directions`` their 1-based principal-component
    indices (any set, e.g. [1, 3]; default the top D) (see :func:`choose_directions`).
    """

    method = Method.ABTT

    def __init__(self, mean, components, eigenvalues, d_rule="explicit", directions=None):
        super().__init__(mean)
        self.components = np.asarray(components, dtype=np.float64).reshape(-1, self.d_in)  # (D, d)
        self.eigenvalues = np.asarray(eigenvalues, dtype=np.float64)  # (d,)
        self.d_rule = d_rule
        self.directions = [int(j) for j in directions] if directions is not None else list(range(1, self.D + 1))
        self._tiled = tiled_columns(self.components.T)  # (d, ⌈D⌉₈)

    @property
    def D(self) -> int:
        return int(self.components.shape[0])

    def params(self):
        return {"D": self.D, "d_rule": self.d_rule, "directions": self.directions}

    def arrays(self):
        return {"mean": self.mean, "components": self.components, "eigenvalues": self.eigenvalues}

    @classmethod
    def from_parts(cls, params, arrays):
        return cls(
            arrays["mean"],
            arrays["components"],
            arrays["eigenvalues"],
            params.get("d_rule", "explicit"),
            params.get("directions"),
        )

    def projector(self) -> np.ndarray:
        """(d, d) symmetric idempotent P = I − UᵀU."""
        return np.eye(self.d_in) - self.components.T @ self.components

    def _map(self, centred):
        centred -= (centred @ self._tiled) @ self._tiled.T
        return centred

    def linear_map(self):
        return self.projector()

    def query_side(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The "no re-index" identity (seed chapter 3): score RAW documents with a transformed query.

        For raw queries (m, d) returns (q′ (m, d), offset (m,)) with q′ = P(q − μ) and offset = μ·q′, so
        that for raw documents V (n, d): ``V @ q′.T − offset`` equals ``abtt(V) @ abtt(q).T`` exactly,
        because P is symmetric and idempotent: (v−μ)ᵀP P(q−μ) = vᵀP(q−μ) − μᵀP(q−μ). The offset is one
        number per query, so a raw dot-product index ranks documents identically without it.
        (This holds for dot products; ABTT cosines also need the transformed document norms.)
        """
        q_prime = np.atleast_2d(self.apply(queries))
        return q_prime, q_prime @ self.mean


@register
class Whitening(FittedTransform):
    """z = (v − μ) W with W (d, d_out); see the module docstring for the ZCA and normalised variants.

    ``eigenvalues`` (d,) are those of the (shrunk) covariance before clamping, descending;
    ``clamped`` counts kept eigenvalues that were raised to the clamp floor eps·λ₁.
    """

    method = Method.WHITENING

    def __init__(
        self, mean, matrix, eigenvalues, k, shrinkage=0.0, eps=DEFAULT_EPS, zca=False, normalize=False, clamped=0
    ):
        super().__init__(mean)
        self.matrix = np.asarray(matrix, dtype=np.float64)  # (d, d_out)
        self._tiled = tiled_columns(self.matrix)  # (d, ⌈d_out⌉₈)
        self.eigenvalues = np.asarray(eigenvalues, dtype=np.float64)
        self.k, self.shrinkage, self.eps = int(k), float(shrinkage), float(eps)
        self.zca, self.normalize, self.clamped = bool(zca), bool(normalize), int(clamped)

    @property
    def d_out(self) -> int:
        return int(self.matrix.shape[1])

    def params(self):
        return {
            "k": self.k,
            "shrinkage": self.shrinkage,
            "eps": self.eps,
            "zca": self.zca,
            "normalize": self.normalize,
            "clamped": self.clamped,
        }

    def arrays(self):
        return {"mean": self.mean, "matrix": self.matrix, "eigenvalues": self.eigenvalues}

    @classmethod
    def from_parts(cls, params, arrays):
        return cls(arrays["mean"], arrays["matrix"], arrays["eigenvalues"], **params)

    def _map(self, centred):
        z = (centred @ self._tiled)[:, : self.d_out]
        if not self.normalize:
            return z
        norms = np.linalg.norm(z, axis=1, keepdims=True)
        zero = norms[:, 0] == 0
        if zero.any():
            row = int(np.argmax(zero))
            raise NonFiniteOutputError(
                "whitening: row {row} equals the fitted mean, so it cannot be L2-normalised", row
            )
        return z / norms

    def linear_map(self):
        return None if self.normalize else self.matrix.copy()


@register
class AbttPcaAbtt(FittedTransform):
    """ABTT → PCA-k → ABTT (seed ch. 3): z = c M − (c M U₂ᵀ) U₂ with c = v − μ and M = P₁ B (d, k), where
    P₁ = I − U₁ᵀU₁ removes ``first_components`` U₁ (D₁, d), B = ``basis`` (d, k) are the top-k principal
    directions of the ABTT output and U₂ = ``second_components`` (D₂, k) the top-D₂ directions REFITTED on
    the PCA-k output. (n, d) → (n, k). ``eigenvalues`` (d,) and ``reduced_eigenvalues`` (k,) are the input
    and PCA-k spectra, kept for reporting.
    """

    method = Method.ABTT_PCA_ABTT

    def __init__(
        self,
        mean,
        first_components,
        basis,
        second_components,
        eigenvalues,
        reduced_eigenvalues,
        d_rule="explicit",
        d2_rule="explicit",
    ):
        super().__init__(mean)
        self.first_components = np.asarray(first_components, dtype=np.float64).reshape(-1, self.d_in)
        self.basis = np.asarray(basis, dtype=np.float64)  # (d, k)
        self.second_components = np.asarray(second_components, dtype=np.float64).reshape(-1, self.d_out)
        self.eigenvalues = np.asarray(eigenvalues, dtype=np.float64)
        self.reduced_eigenvalues = np.asarray(reduced_eigenvalues, dtype=np.float64)
        self.d_rule, self.d2_rule = d_rule, d2_rule
        self.matrix = self.basis - self.first_components.T @ (self.first_components @ self.basis)  # P₁ B

    @property
    def d_out(self) -> int:
        return int(self.basis.shape[1])

    def params(self):
        return {
            "D": int(self.first_components.shape[0]),
            "k": self.d_out,
            "D2": int(self.second_components.shape[0]),
            "d_rule": self.d_rule,
            "d2_rule": self.d2_rule,
        }

    def arrays(self):
        return {
            "mean": self.mean,
            "first_components": self.first_components,
            "basis": self.basis,
            "second_components": self.second_components,
            "eigenvalues": self.eigenvalues,
            "reduced_eigenvalues": self.reduced_eigenvalues,
        }

    @classmethod
    def from_parts(cls, params, arrays):
        return cls(
            arrays["mean"],
            arrays["first_components"],
            arrays["basis"],
            arrays["second_components"],
            arrays["eigenvalues"],
            arrays["reduced_eigenvalues"],
            params.get("d_rule", "explicit"),
            params.get("d2_rule", "explicit"),
        )

    def _map(self, centred):
        reduced = centred @ self.matrix
        return reduced - (reduced @ self.second_components.T) @ self.second_components

    def linear_map(self):
        return self.matrix - (self.matrix @ self.second_components.T) @ self.second_components


# ---------------------------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class Principal:
    """What every fit needs from the data: ``n`` vectors of dimension ``d``, their ``mean`` (d,), the centred
    covariance spectrum ``eigenvalues`` (d,) descending (zeros past the rank) and sign-canonical principal
    directions ``vectors`` (d, r) — r = d on the d × d route, r = the rank on the n < d Gram route."""

    n: int
    d: int
    mean: np.ndarray
    eigenvalues: np.ndarray
    vectors: np.ndarray


FitData = Union[Moments, np.ndarray]  # a merged moments state, or raw rows (n, d) (the n < d route)


def principal(data: FitData, matrix: np.ndarray | None = None, require_spread: bool = True) -> Principal:
    """Mean and centred spectrum of ``data`` — optionally of ``data @ matrix`` for a (d, k) ``matrix``.

    ``data`` is a :class:`Moments` state (covariance MᵀΣM: no second pass over the data) or raw rows
    (n, d); rows with n < d take the Gram/dual route (:func:`~anisotropy_core.diagnostics.dual_spectrum`,
    never a d × d matrix), otherwise their moments. ``require_spread``: raise when the spectrum is all zero.
    """
    if isinstance(data, Moments):
        if data.n < 2:
            raise InvalidVectorsError(f"fitting a correction needs at least 2 vectors, got n={data.n} valid rows")
        if not math.isfinite(float(np.abs(data.comoment).max())):
            raise ValueError("the moments state holds non-finite values")
        cov, mean = data.covariance(), data.mean
        if matrix is not None:
            cov, mean = matrix.T @ cov @ matrix, mean @ matrix
        lam, vecs = covariance_spectrum(cov)
        result = Principal(data.n, int(mean.shape[0]), mean, lam, vecs)
    else:
        rows = check_input(np.asarray(data, dtype=np.float64), np.shape(data)[-1])
        if matrix is not None:
            rows = rows @ matrix
        n, d = rows.shape
        if n >= d or n < 2:
            return principal(Moments.of_batch(rows), require_spread=require_spread)
        mean = rows.mean(axis=0)
        lam, vecs = dual_spectrum(rows - mean)
        result = Principal(n, d, mean, np.concatenate([lam, np.zeros(d - lam.shape[0])]), vecs)
    if require_spread and not result.eigenvalues.sum() > 0:
        raise InvalidVectorsError(
            f"all {result.n} valid vectors are identical (zero spread): the covariance is "
            "zero and no correction is defined"
        )
    return result


def fit_center(data: FitData) -> Center:
    """Center from a moments state or rows: the (d,) mean."""
    return Center(principal(data).mean)


DIRECTION_RULES = ("explicit", "marchenko_pastur", "artefact", "rule_of_thumb")
RULE_OF_THUMB = "rule_of_thumb_d/100 (unverified)"  # the d_rule a fit records when no evidence chose D


def rule_of_thumb_d(d: int) -> int:
    """The textbook's starting point for ABTT, max(1, round(d/100)) (Mu & Viswanath; "a starting point, not an
    answer"): the default D when neither D nor evidence-backed directions are given."""
    return max(1, round(d / 100))


def choose_directions(
    eigenvalues: np.ndarray,
    n: int,
    d: int,
    rule: str = "rule_of_thumb",
    D: int | None = None,
    indices: list[int] | None = None,
    max_D: int | None = None,
    artefact_directions: Sequence[Mapping[str, Any]] | None = None,
    artefact_corr: float = 0.5,
) -> tuple[list[int], str]:
    """Which principal directions ABTT removes: (sorted 1-based indices, the rule that chose them).

    ``eigenvalues``: (d,) centred covariance spectrum, descending. ``rule``:

    * ``"explicit"`` — ``indices`` (any set, e.g. [1, 3]) or the top ``D``. At most min(d − 1, n − 1)
      directions (the rank of the centred data), each index in 1..d.
    * ``"rule_of_thumb"`` (default) — the top max(1, round(d/100)) (:func:`rule_of_thumb_d`), at most
      ``max_D``; recorded as ``RULE_OF_THUMB`` ("rule_of_thumb_d/100 (unverified)"): nothing showed that these
      directions are artefacts.
    * ``"marchenko_pastur"`` — the directions above the Marchenko–Pastur upper edge σ²(1+√(d/n))² of an
      isotropic cloud with the same total variance (σ² = tr Σ / d): how many directions are more than sampling
      noise — a diagnostic and the upper end of the candidate grid, not evidence that they are artefacts.
      Uncapped unless ``max_D`` is given (``"marchenko_pastur_capped"`` when the cap bit). Zero above the edge
      gives none. For n ≤ d the null is uninformative and the rule of thumb is used.
    * ``"artefact"`` — the directions above the MP edge whose |Pearson| or |Spearman| with any metadata column
      reaches ``artefact_corr`` (seed chapter 3, Step B). ``artefact_directions``: the rows the artefact test
      flagged significant (:mod:`anisotropy_core.artefact_evidence`), ``[{"index", "abs_corr": {col: |corr|}}…]``.
    """
    if rule not in DIRECTION_RULES:
        raise ValueError(f"unknown direction rule {rule!r}; choose one of {list(DIRECTION_RULES)}")
    if max_D is not None and max_D < 0:
        raise ValueError(f"max_D must be >= 0, got {max_D}")
    limit = min(d - 1, max(n - 1, 0))
    lam = np.asarray(eigenvalues, dtype=np.float64)
    _, upper = marchenko_pastur_edges(n, d, variance=float(lam.sum()) / d)
    above = int((lam > upper).sum())
    if rule == "explicit":
        chosen = (
            sorted(set(int(j) for j in indices))
            if indices is not None
            else (list(range(1, int(D) + 1)) if D is not None else None)
        )
        if chosen is None:
            raise ValueError("direction rule 'explicit' needs D or a list of indices")
        if D is not None and (D < 0 or D >= d) or len(chosen) > limit or any(not 1 <= j <= d for j in chosen):
            raise ValueError(
                f"explicit directions {chosen if indices is not None else f'D={D}'} must be at most "
                f"min(d-1, n-1) = {limit} indices in 1..{d} (D={D} must satisfy 0 <= D < d={d} "
                f"and D <= n-1={n - 1})"
            )
        return chosen, "explicit"
    if rule == "rule_of_thumb" or (rule == "marchenko_pastur" and n <= d):
        count = min(rule_of_thumb_d(d), limit, max_D if max_D is not None else d)
        return list(range(1, count + 1)), RULE_OF_THUMB
    if rule == "artefact":
        return sorted(
            int(row["index"])
            for row in artefact_directions or []
            if int(row["index"]) <= above and max_abs_corr(row)[1] >= artefact_corr
        ), "artefact"
    capped = max_D is not None and above > max_D
    count = min(above if max_D is None else min(above, max_D), limit)
    return list(range(1, count + 1)), "marchenko_pastur_capped" if capped else "marchenko_pastur"


def max_abs_corr(direction: Mapping[str, Any]) -> tuple[str | None, float]:
    """(column, |corr|) of the metadata column most correlated with one direction's projection, the larger of
    |Pearson| (``abs_corr``) and |Spearman| (``abs_spearman``, when present) per column; (None, 0.0) when no
    column has a defined correlation. ``direction``: ``{"abs_corr": {column: |corr| | None}, …}``."""
    known: dict[str, float] = {}
    for key in ("abs_corr", "abs_spearman"):
        for column, value in (direction.get(key) or {}).items():
            if value is not None:
                known[column] = max(known.get(column, 0.0), float(value))
    if not known:
        return None, 0.0
    name = max(known, key=lambda column: known[column])
    return name, known[name]


def choose_d(
    eigenvalues: np.ndarray, n: int, d: int, D: int | None = None, max_D: int | None = None
) -> tuple[int, str]:
    """How many top directions to remove, and the rule: ``D`` given → ``"explicit"``, else the rule of thumb
    max(1, round(d/100)) at most ``max_D``, recorded unverified (:func:`choose_directions`)."""
    chosen, rule = choose_directions(
        eigenvalues, n, d, "explicit" if D is not None else "rule_of_thumb", D=D, max_D=max_D
    )
    return len(chosen), rule


def fit_abtt(
    data: FitData,
    D: int | None = None,
    max_D: int | None = None,
    directions: list[int] | None = None,
    rule: str | None = None,
    artefact_directions: Sequence[Mapping[str, Any]] | None = None,
    artefact_corr: float = 0.5,
) -> AllButTheTop:
    """All-but-the-Top from the CENTRED covariance of ``data`` (moments, or rows: n < d → Gram route).

    The removed set comes from :func:`choose_directions`: ``rule`` defaults to ``"explicit"`` when ``D`` or
    ``directions`` (1-based indices, any set) is given, else ``"rule_of_thumb"``: the top max(1, round(d/100))
    (at most ``max_D``), recorded as ``d_rule`` "rule_of_thumb_d/100 (unverified)". The Marchenko–Pastur count
    is a diagnostic (``rule="marchenko_pastur"``), never the default.
    """
    p = principal(data)  # (d,), (d, r) columns, sign-canonical
    rule = rule or ("explicit" if D is not None or directions is not None else "rule_of_thumb")
    chosen, used = choose_directions(
        p.eigenvalues,
        p.n,
        p.d,
        rule,
        D=D,
        indices=directions,
        max_D=max_D,
        artefact_directions=artefact_directions,
        artefact_corr=artefact_corr,
    )
    return AllButTheTop(p.mean, p.vectors[:, [j - 1 for j in chosen]].T, p.eigenvalues, used, chosen)


def fit_whitening(
    data: FitData,
    k: int | None = None,
    shrinkage: float = 0.0,
    eps: float = DEFAULT_EPS,
    zca: bool = False,
    normalize: bool = False,
    exclude: list[int] | None = None,
) -> Whitening:
    """Whitening-k from ``data``: W = U_k Λ_k^{-1/2} (d, k), or ZCA U_k Λ_k^{-1/2} U_kᵀ (d, d).

    ``k``: kept directions (default min(d, r) − len(exclude), r below); ``shrinkage`` α ∈ [0, 1]:
    Σ ← (1−α)Σ + α(tr Σ/d)I (same eigenvectors, eigenvalues (1−α)λ + α tr Σ/d); ``eps`` > 0: eigenvalues below eps·λ₁ are clamped to eps·λ₁
    (1/√0 would be an inf; the clamped count is reported as ``clamped``). With n < d and no shrinkage the data
    span only r ≤ n − 1 directions, from rows (the Gram route knows only those) or from a moments state alike:
    k defaults to r − len(exclude) and a larger k is refused (the seed's "whitening-k with k < n"; chapter 6: a
    clamped null direction would scale a held-out vector's component there by 1/√(eps·λ₁)). Shrinkage > 0 makes
    the shrunk covariance full rank, so all d directions may be kept. ``exclude``: 1-based principal directions
    dropped before the k are kept — ABTT of those directions then whitening, in one matrix (ABTT's projector
    commutes with Σ, so Σ's other eigenpairs are unchanged).
    """
    if not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"shrinkage must be in [0, 1], got {shrinkage}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    p = principal(data)
    d = p.d
    dropped = sorted(set(int(j) for j in exclude or []))
    if any(not 1 <= j <= p.vectors.shape[1] for j in dropped):
        raise ValueError(f"exclude={dropped} must hold indices in 1..{p.vectors.shape[1]}")
    spanned = (p.vectors.shape[1] if shrinkage else min(p.vectors.shape[1], p.n - 1)) - len(dropped)
    k = min(d - len(dropped), spanned) if k is None else int(k)
    if not 1 <= k <= d - len(dropped):
        raise ValueError(f"k={k} must satisfy 1 <= k <= d - len(exclude) = {d - len(dropped)}")
    if k > spanned:
        raise ValueError(
            f"k={k} exceeds the {spanned} directions that n={p.n} vectors span in "
            f"d={d}{' (after exclude)' if dropped else ''}: with n < d use k <= {spanned}"
        )
    lam = p.eigenvalues
    if shrinkage:
        lam = (1.0 - shrinkage) * lam + shrinkage * lam.sum() / d
    vectors = np.delete(p.vectors, [j - 1 for j in dropped], axis=1)
    kept_lam = np.delete(lam, [j - 1 for j in dropped])
    floor = eps * lam[0]
    kept = np.maximum(kept_lam[:k], floor)
    clamped = int((kept_lam[:k] < floor).sum())
    matrix = vectors[:, :k] / np.sqrt(kept)  # (d, k) == U_k diag(λ^-1/2)
    if zca:
        matrix = matrix @ vectors[:, :k].T  # (d, d)
    return Whitening(p.mean, matrix, lam, k, shrinkage, eps, zca, normalize, clamped)


def fit_abtt_pca_abtt(
    data: FitData, D: int | None = None, k: int | None = None, D2: int | None = None, max_D: int | None = None
) -> "AbttPcaAbtt":
    """Seed ch. 3, "Does it compose?": ABTT (D), PCA down to k, then ABTT REFITTED on the reduced output (D2).

    Every step is fitted from the previous step's output covariance (MᵀΣM from the same moments state, or
    the mapped rows), so it is one pass over the data. D and D2 default to :func:`choose_d` on their own
    spectra (the rule of thumb, recorded unverified); k defaults to ⌈d/3⌉ (the seed's 768 → 256).
    """
    first = fit_abtt(data, D, max_D)
    p = principal(data)
    k = -(-p.d // 3) if k is None else int(k)
    rank = p.vectors.shape[1] - first.D if p.vectors.shape[1] < p.d else p.d - first.D
    if not 1 <= k <= rank:
        raise ValueError(
            f"k={k} must satisfy 1 <= k <= {rank} (d={p.d} minus the D={first.D} removed"
            + (f", and the rank the n={p.n} vectors span)" if p.vectors.shape[1] < p.d else ")")
        )
    projector = first.projector()
    basis = principal(data, projector).vectors[:, :k]  # (d, k) PCA of the ABTT output
    reduced = principal(data, projector @ basis)  # (k,) spectrum of the PCA-k output
    chosen, rule = choose_d(reduced.eigenvalues, reduced.n, k, D2, max_D)
    return AbttPcaAbtt(
        p.mean,
        first.components,
        basis,
        reduced.vectors[:, :chosen].T,
        p.eigenvalues,
        reduced.eigenvalues,
        first.d_rule,
        rule,
    )


FITTERS: dict[str, Callable[..., FittedTransform]] = {
    Method.CENTER: fit_center,
    Method.ABTT: fit_abtt,
    Method.WHITENING: fit_whitening,
    Method.ABTT_PCA_ABTT: fit_abtt_pca_abtt,
}


def fit(method: str, data: FitData, **params) -> FittedTransform:
    """Dispatch to ``fit_<method>`` (``center``, ``abtt``, ``whitening``, ``abtt_pca_abtt``) with its params."""
    if method not in FITTERS:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(FITTERS)}")
    return FITTERS[method](data, **params)
