"""What the nightly gate needs to know about a would-be output, as one mergeable state gathered in the pass that
transforms every valid row (no output is written by that pass), and the output moments of an affine correction
from the input's moments state.

For an affine correction y = (v − c) L (centring, ABTT, whitening, ABTT → PCA → ABTT, their compositions) the
output's count, mean and centred co-moment follow exactly from the input state:
``n_y = n``, ``μ_y = (μ − c) L``, ``M_y = Lᵀ M L`` — no row is read for them. Only the measures built on unit vectors
(the offset ratio and the exact A, from Σ ŷ and Σ ‖y‖) need the rows; :class:`OutputFacts` gathers those sums in
the transforming pass, plus the full output moments for a correction that is not affine, the row count, and the
top-k lists of the neighbour-overlap check.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Callable, TypeVar

import numpy as np

from .evaluation import block_top_k, empty_top_k, merge_top_k, unit_rows
from .moments import Moments
from .transforms import FittedTransform


def affine_output_moments(
    state: Moments, transform: FittedTransform, sum_unit: np.ndarray, sum_norm: float
) -> Moments | None:
    """The moments of ``transform``'s output over the rows of ``state`` (d_in) when the transform is affine
    (:meth:`~anisotropy_core.transforms.FittedTransform.linear_map`), else None. ``sum_unit`` (d_out,) and
    ``sum_norm`` are the output rows' unit-vector and length sums, which the input state cannot give."""
    linear = transform.linear_map()
    if linear is None:
        return None
    comoment = linear.T @ state.comoment @ linear
    return Moments(
        n=state.n,
        sum_unit=np.asarray(sum_unit, dtype=np.float64),
        sum_norm=float(sum_norm),
        mean=(state.mean - transform.mean) @ linear,
        comoment=(comoment + comoment.T) / 2,
    )


@dataclasses.dataclass(frozen=True)
class OverlapQueries:
    """The neighbour-overlap check's sampled corpus rows as queries: ``raw`` (m, d) and ``corrected`` (m, d_out)
    unit rows, their top-``k`` lists scored in both spaces over the whole corpus, each row's own copy excluded."""

    raw: np.ndarray
    corrected: np.ndarray
    k: int

    @classmethod
    def of(cls, vectors: np.ndarray, transform: FittedTransform, k: int) -> "OverlapQueries":
        """The queries of the sampled raw ``vectors`` (m, d) under ``transform``."""
        return cls(unit_rows(vectors), unit_rows(transform.apply(vectors)), k)

    @property
    def size(self) -> int:
        return int(self.raw.shape[0])


_Gathered = TypeVar("_Gathered")


def _merge_gathered(
    name: str, mine: _Gathered | None, theirs: _Gathered | None, merge: Callable[[_Gathered, _Gathered], _Gathered]
) -> _Gathered | None:
    """Two partial facts' optional ``name`` merged: None when neither gathered it; both must, or neither."""
    if mine is None and theirs is None:
        return None
    if mine is None or theirs is None:
        raise ValueError(f"OutputFacts.merge: only one side gathered {name} (facts of differently set-up passes)")
    return merge(mine, theirs)


@dataclasses.dataclass(frozen=True)
class OutputFacts:
    """Mergeable facts of a would-be output (d_out-dimensional rows):

    * ``rows`` — output rows,
    * ``sum_unit`` (d_out,), ``sum_norm`` — sums of the output rows' unit vectors and lengths (as written, i.e.
      after the cast to the output's element type),
    * ``moments`` — the output rows' full :class:`Moments`, gathered only for a correction that is not affine
      (None otherwise: :func:`affine_output_moments` gives them),
    * ``raw_top``, ``corrected_top`` — the neighbour-overlap queries' partial top-k lists (scores (m, k), row keys
      (m, k)) in the raw and corrected spaces, or None without the check. A row key is the row's integer id, or
      its place in the pass (:func:`anisotropy_core.row_keys.row_ids` of its partition and index), the same in both
      spaces.
    """

    rows: int
    sum_unit: np.ndarray
    sum_norm: float
    moments: Moments | None = None
    raw_top: tuple[np.ndarray, np.ndarray] | None = None
    corrected_top: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def empty(cls, d_out: int, full_moments: bool, overlap: OverlapQueries | None = None) -> "OutputFacts":
        """The identity of :meth:`merge`."""
        tops = (
            (None, None)
            if overlap is None
            else (empty_top_k(overlap.size, overlap.k), empty_top_k(overlap.size, overlap.k))
        )
        return cls(0, np.zeros(d_out), 0.0, Moments.empty(d_out) if full_moments else None, *tops)

    def add(
        self,
        raw: np.ndarray,
        output: np.ndarray,
        keys: np.ndarray,
        overlap: OverlapQueries | None = None,
        own: np.ndarray | None = None,
    ) -> "OutputFacts":
        """These facts with one batch added: the valid rows' ``raw`` (B, d) vectors, their ``output`` (B, d_out) as
        written, ``keys`` (B,) int64 row keys and, with ``overlap``, ``own`` (B,) int64: the index of the query each
        row is the corpus copy of (−1 for none), which that query never retrieves."""
        if not output.shape[0]:
            return self
        values = np.asarray(output, dtype=np.float64)
        norms = np.sqrt(np.einsum("ij,ij->i", values, values))
        facts = dataclasses.replace(
            self,
            rows=self.rows + output.shape[0],
            sum_unit=self.sum_unit + (1.0 / norms) @ values,
            sum_norm=self.sum_norm + float(norms.sum()),
            moments=None if self.moments is None else self.moments.merge(Moments.of_batch(values)),
        )
        if overlap is None:
            return facts
        if own is None:
            raise ValueError("OutputFacts.add: the overlap check needs own, each row's query index")
        if facts.raw_top is None or facts.corrected_top is None:
            raise ValueError("OutputFacts.add: these facts hold no top-k lists (made without the overlap queries)")
        query_keys = np.full(overlap.size, -2, dtype=np.int64)  # a key no row has: nothing excluded
        mine = np.flatnonzero(own >= 0)
        query_keys[own[mine]] = keys[mine]
        return dataclasses.replace(
            facts,
            raw_top=merge_top_k(facts.raw_top, block_top_k(overlap.raw, raw, keys, overlap.k, query_keys)),
            corrected_top=merge_top_k(
                facts.corrected_top, block_top_k(overlap.corrected, values, keys, overlap.k, query_keys)
            ),
        )

    def merge(self, other: "OutputFacts") -> "OutputFacts":
        """Facts of both sets of rows (associative; the top-k lists merge exactly, ties by smaller key)."""
        return OutputFacts(
            rows=self.rows + other.rows,
            sum_unit=self.sum_unit + other.sum_unit,
            sum_norm=self.sum_norm + other.sum_norm,
            moments=_merge_gathered("moments", self.moments, other.moments, Moments.merge),
            raw_top=_merge_gathered("raw_top", self.raw_top, other.raw_top, merge_top_k),
            corrected_top=_merge_gathered("corrected_top", self.corrected_top, other.corrected_top, merge_top_k),
        )

    def output_moments(self, state: Moments, transform: FittedTransform) -> Moments:
        """The output's moments: the gathered ones, or those of the affine ``transform`` over the rows of the input
        ``state`` (:func:`affine_output_moments`) with the gathered unit-vector and length sums."""
        if self.moments is not None:
            return self.moments
        found = affine_output_moments(state, transform, self.sum_unit, self.sum_norm)
        if found is None:
            raise ValueError(f"{transform.method}: not affine, and the pass gathered no output moments")
        return found

    def to_bytes(self) -> bytes:
        """A compact wire form (``numpy.savez``, no pickle), for the state rows of a Spark pass."""
        arrays = {"rows": np.array([self.rows]), "sum_unit": self.sum_unit, "sum_norm": np.array([self.sum_norm])}
        if self.moments is not None:
            arrays["moments"] = np.frombuffer(self.moments.to_bytes(), dtype=np.float64)
        for name, top in (("raw_top", self.raw_top), ("corrected_top", self.corrected_top)):
            if top is not None:
                arrays[f"{name}_scores"], arrays[f"{name}_keys"] = top
        buffer = io.BytesIO()
        np.savez(buffer, allow_pickle=False, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, payload: bytes) -> "OutputFacts":
        with np.load(io.BytesIO(payload), allow_pickle=False) as found:
            tops = [
                (found[f"{name}_scores"], found[f"{name}_keys"]) if f"{name}_scores" in found else None
                for name in ("raw_top", "corrected_top")
            ]
            return cls(
                int(found["rows"][0]),
                found["sum_unit"],
                float(found["sum_norm"][0]),
                Moments.from_bytes(found["moments"].tobytes()) if "moments" in found else None,
                *tops,
            )
