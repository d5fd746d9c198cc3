"""BERT-flow (seed chapter 5): a Glow-style normalising flow trained by maximum likelihood, pure numpy.

The flow maps a centred embedding x (row vector, d long) to a latent z that should look like N(0, I):

    z = f(x − μ),   f = [ActNorm → Permute → AdditiveCoupling] × K → ActNorm

* **ActNorm** (Glow's learned per-dimension scale): y = x·exp(s) + b, log|det| = Σ_j s_j per vector.
  The first one is initialised from the data (s = −log std, b = 0), the others as the identity.
* **Permute**: a fixed permutation of the coordinates (reversal, then seeded random shuffles), log|det| = 0.
* **AdditiveCoupling**: split y = [a; b] (a: the first ⌊d/2⌋ coordinates), b ← b + m(a) with
  m(a) = tanh(a W₁ + c₁) W₂ + c₂ + a L  — a one-hidden-layer MLP plus a linear skip (the skip makes the
  shears a whitening needs reachable in few steps). Jacobian unit lower block-triangular: log|det| = 0.
  Initialised as the identity (W₂ = L = 0).

Training maximises the mean log-likelihood of a sample under the change-of-variables formula,

    mean_i log p(x_i) = mean_i [ −‖z_i‖²/2 ] + Σ_layers Σ_j s_j − (d/2) log 2π,

so the loss is ``nll = mean ‖z‖²/2 − Σ s`` (+ the constant). The log-det term is what stops the collapse
s → −∞ (seed: the scalar flow's L(s) = −s²r²/2 + d log s, optimum s = √d / r). Gradients are written by hand
(:meth:`Flow.backward`, checked against finite differences in the tests) and the parameters move by Adam.
The inverse is exact and closed-form: z → x runs the layers backwards using m in the forward direction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .methods import FlowSettings, Method
from .transforms import FittedTransform, check_input, register

LOG_2PI = math.log(2.0 * math.pi)


# --------------------------------------------------------------------------------------- textbook pieces


def change_of_variables_density(u: np.ndarray, inverse, inverse_derivative, base_density) -> np.ndarray:
    """1-D change of variables p_U(u) = p_Z(f⁻¹(u)) · |d f⁻¹/du| for scalar maps (seed ch. 5)."""
    u = np.asarray(u, dtype=np.float64)
    return base_density(inverse(u)) * np.abs(inverse_derivative(u))


def standard_normal_density(z: np.ndarray) -> np.ndarray:
    """φ(z) = exp(−z²/2)/√(2π), elementwise."""
    return np.exp(-0.5 * np.asarray(z, dtype=np.float64) ** 2) / math.sqrt(2.0 * math.pi)


def scalar_flow_objective(s: float, radius: float, d: int) -> float:
    """Seed ch. 5's one-parameter flow f⁻¹(u) = s·u on one point of norm r in d dimensions:
    L(s) = −s²r²/2 + d·log s (the log-likelihood without its constant)."""
    return -((s * radius) ** 2) / 2.0 + d * math.log(s)


def scalar_flow_optimum(radius: float, d: int) -> float:
    """argmax_s L(s) = √d / r: the point is mapped onto the Gaussian shell of radius √d."""
    return math.sqrt(d) / radius


def gaussian_shell(d: int) -> tuple[float, float]:
    """(√d, 1/√2): mean and first-order standard deviation of ‖z‖ for z ~ N(0, I_d)."""
    return math.sqrt(d), math.sqrt(0.5)


# -------------------------------------------------------------------------------------------- the flow


@dataclass
class FlowArchitecture:
    """Shape of the stack: dimension ``d``, ``couplings`` K, MLP width ``hidden``; split = ⌊d/2⌋."""

    d: int
    couplings: int = FlowSettings.couplings
    hidden: int = FlowSettings.hidden

    @property
    def split(self) -> int:
        return self.d // 2


def init_parameters(arch: FlowArchitecture, sample: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Initial parameters: first ActNorm from the centred ``sample`` (n, d) std, identity elsewhere.

    Names: ``actnorm{i}_log_scale`` / ``actnorm{i}_bias`` (d,) for i = 0..K; ``coupling{j}_W1`` (h, H),
    ``_c1`` (H,), ``_W2`` (H, d−h), ``_c2`` (d−h,), ``_L`` (h, d−h); ``permutations`` (K, d) as float64.
    """
    d, h, width, k = arch.d, arch.split, arch.hidden, arch.couplings
    if d < 2:
        raise ValueError(f"a coupling flow needs d >= 2, got d={d}")
    rng = np.random.default_rng(seed)
    std = np.asarray(sample, dtype=np.float64).std(axis=0)
    if not (std > 0).all():
        raise ValueError(
            f"coordinate {int(np.argmin(std > 0))} is constant in the training sample: "
            "its scale (and the flow's density) is undefined"
        )
    params = {}
    for i in range(k + 1):
        params[f"actnorm{i}_log_scale"] = -np.log(std) if i == 0 else np.zeros(d)
        params[f"actnorm{i}_bias"] = np.zeros(d)
    for j in range(k):
        params[f"coupling{j}_W1"] = rng.standard_normal((h, width)) / math.sqrt(h)
        params[f"coupling{j}_c1"] = np.zeros(width)
        params[f"coupling{j}_W2"] = np.zeros((width, d - h))
        params[f"coupling{j}_c2"] = np.zeros(d - h)
        params[f"coupling{j}_L"] = np.zeros((h, d - h))
    params["permutations"] = np.stack([np.arange(d)[::-1] if j == 0 else rng.permutation(d) for j in range(k)]).astype(
        np.float64
    )
    return params


class Flow:
    """The stack of :func:`init_parameters`; ``forward`` x → z (data → Gaussian), ``inverse`` z → x."""

    def __init__(self, arch: FlowArchitecture, params: dict[str, np.ndarray]):
        self.arch = arch
        self.params = params
        perms = np.asarray(params["permutations"])
        self.perms = perms.astype(np.int64)
        if (
            perms.shape != (arch.couplings, arch.d)
            or not np.array_equal(self.perms, perms)
            or any(not np.array_equal(np.sort(p), np.arange(arch.d)) for p in self.perms)
        ):
            raise ValueError(f"permutations must be {arch.couplings} permutations of range({arch.d})")

    def log_det(self) -> float:
        """log|det ∂z/∂x| (the same for every x): the ActNorm scales; couplings and permutations add 0."""
        return float(sum(self.params[f"actnorm{i}_log_scale"].sum() for i in range(self.arch.couplings + 1)))

    def _actnorm(self, i: int, x: np.ndarray) -> np.ndarray:
        p = self.params
        return x * np.exp(p[f"actnorm{i}_log_scale"]) + p[f"actnorm{i}_bias"]

    def _shift(self, j: int, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """m(a) (B, d−h) and the hidden activation tanh(a W₁ + c₁) (B, H)."""
        p = self.params
        hidden = np.tanh(a @ p[f"coupling{j}_W1"] + p[f"coupling{j}_c1"])
        return hidden @ p[f"coupling{j}_W2"] + p[f"coupling{j}_c2"] + a @ p[f"coupling{j}_L"], hidden

    def forward(self, x: np.ndarray, keep: bool = False):
        """x (B, d) centred → z (B, d). With ``keep`` also returns the per-layer inputs for :meth:`backward`."""
        h = self.arch.split
        tape: list[Any] = []  # per coupling: its input (B, d), then (permuted activations, hidden); last: z's input
        y = x
        for j in range(self.arch.couplings):
            tape.append(y)
            y = self._actnorm(j, y)[:, self.perms[j]]
            shift, hidden = self._shift(j, y[:, :h])
            tape.append((y, hidden))
            y = np.concatenate([y[:, :h], y[:, h:] + shift], axis=1)
        tape.append(y)
        z = self._actnorm(self.arch.couplings, y)
        return (z, tape) if keep else z

    def inverse(self, z: np.ndarray) -> np.ndarray:
        """z (B, d) → x (B, d) exactly: each coupling subtracts m(a) (m run forwards), then un-permute, un-scale."""
        p, h, k = self.params, self.arch.split, self.arch.couplings
        y = (z - p[f"actnorm{k}_bias"]) * np.exp(-p[f"actnorm{k}_log_scale"])
        for j in reversed(range(k)):
            shift, _ = self._shift(j, y[:, :h])
            y = np.concatenate([y[:, :h], y[:, h:] - shift], axis=1)
            unpermuted = np.empty_like(y)
            unpermuted[:, self.perms[j]] = y
            y = (unpermuted - p[f"actnorm{j}_bias"]) * np.exp(-p[f"actnorm{j}_log_scale"])
        return y

    def nll(self, x: np.ndarray) -> float:
        """Mean negative log-likelihood (nats per vector) of centred ``x`` (B, d) under the flow."""
        z = self.forward(x)
        return float(0.5 * (z * z).sum(axis=1).mean() - self.log_det() + 0.5 * self.arch.d * LOG_2PI)

    def backward(self, x: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """(nll, gradients of nll w.r.t. every trainable parameter) for centred ``x`` (B, d), by hand."""
        p, h, k = self.params, self.arch.split, self.arch.couplings
        z, tape = self.forward(x, keep=True)
        batch = x.shape[0]
        grads: dict[str, np.ndarray] = {}
        g = z / batch  # ∂(mean ‖z‖²/2)/∂z
        y = tape.pop()
        scale = np.exp(p[f"actnorm{k}_log_scale"])
        grads[f"actnorm{k}_log_scale"] = (g * y * scale).sum(axis=0) - 1.0  # −1: the log-det term
        grads[f"actnorm{k}_bias"] = g.sum(axis=0)
        g = g * scale
        for j in reversed(range(k)):
            y, hidden = tape.pop()
            a = y[:, :h]
            g_shift = g[:, h:]  # ∂/∂m(a) = ∂/∂b_out
            grads[f"coupling{j}_W2"] = hidden.T @ g_shift
            grads[f"coupling{j}_c2"] = g_shift.sum(axis=0)
            grads[f"coupling{j}_L"] = a.T @ g_shift
            g_pre = (g_shift @ p[f"coupling{j}_W2"].T) * (1.0 - hidden**2)
            grads[f"coupling{j}_W1"] = a.T @ g_pre
            grads[f"coupling{j}_c1"] = g_pre.sum(axis=0)
            g_a = g[:, :h] + g_pre @ p[f"coupling{j}_W1"].T + g_shift @ p[f"coupling{j}_L"].T
            g = np.concatenate([g_a, g_shift], axis=1)
            unpermuted = np.empty_like(g)
            unpermuted[:, self.perms[j]] = g  # through the permutation
            g = unpermuted
            before = tape.pop()
            scale = np.exp(p[f"actnorm{j}_log_scale"])
            grads[f"actnorm{j}_log_scale"] = (g * before * scale).sum(axis=0) - 1.0
            grads[f"actnorm{j}_bias"] = g.sum(axis=0)
            g = g * scale
        loss = float(0.5 * (z * z).sum(axis=1).mean() - self.log_det() + 0.5 * self.arch.d * LOG_2PI)
        return loss, grads


@dataclass
class TrainingLog:
    """What training did: ``steps``, ``batch_size``, ``learning_rate``, nll (nats/vector) at start and end
    on the whole sample, and the sample size ``n``."""

    n: int
    steps: int
    batch_size: int
    learning_rate: float
    initial_nll: float
    final_nll: float


def train_flow(
    sample: np.ndarray,
    couplings: int = FlowSettings.couplings,
    hidden: int = FlowSettings.hidden,
    steps: int = FlowSettings.steps,
    batch_size: int = FlowSettings.batch_size,
    learning_rate: float = FlowSettings.learning_rate,
    seed: int = FlowSettings.seed,
) -> tuple[Flow, np.ndarray, TrainingLog]:
    """Fit a flow to ``sample`` (n, d) raw vectors by maximum likelihood with Adam (β = 0.9, 0.999), the step
    size following a cosine schedule from ``learning_rate`` down to 0 (the last steps settle instead of
    jittering around the optimum at full step size).

    Returns (flow on centred inputs, mean μ (d,), log). Mini-batches are drawn with a seeded generator, so
    the same sample, settings and seed give the same flow.
    """
    x = np.asarray(sample, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"the training sample must be an (n, d) matrix, got shape {x.shape}")
    n, d = check_input(x, x.shape[1]).shape
    if n < 2:
        raise ValueError(f"training a flow needs at least 2 vectors, got n={n}")
    for name, value in (("couplings", couplings), ("hidden", hidden), ("steps", steps), ("batch_size", batch_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
    mean = x.mean(axis=0)
    centred = x - mean
    arch = FlowArchitecture(d, couplings, hidden)
    flow = Flow(arch, init_parameters(arch, centred, seed))
    initial = flow.nll(centred)
    rng = np.random.default_rng(seed + 1)
    first: dict[str, np.ndarray] = {}  # Adam's moment estimates per parameter
    second: dict[str, np.ndarray] = {}
    for step in range(1, steps + 1):
        batch = centred[rng.choice(n, size=min(batch_size, n), replace=False)]
        _, grads = flow.backward(batch)
        decay = 0.5 * (1.0 + math.cos(math.pi * (step - 1) / steps))  # cosine schedule
        step_size = decay * learning_rate * math.sqrt(1 - 0.999**step) / (1 - 0.9**step)  # bias-corrected
        for name, grad in grads.items():
            first[name] = 0.9 * first.get(name, 0.0) + 0.1 * grad
            second[name] = 0.999 * second.get(name, 0.0) + 0.001 * grad * grad
            flow.params[name] = flow.params[name] - step_size * first[name] / (np.sqrt(second[name]) + 1e-8)
    final = flow.nll(centred)
    if not math.isfinite(final):
        raise ValueError("flow training diverged (non-finite likelihood); lower learning_rate")
    return flow, mean, TrainingLog(n, steps, min(batch_size, n), learning_rate, initial, final)


# ----------------------------------------------------------------------------------- fitted transform


@register
class FlowTransform(FittedTransform):
    """z = f(v − μ) with a trained :class:`Flow`; ``inverse`` maps z back to raw vectors exactly.

    Artifact: every parameter array (and the permutations, as float64) in the npz; the architecture
    (couplings, hidden, split) and the training facts (sample size, steps, batch, learning rate, seed,
    nll before/after) in the manifest params.
    """

    method = Method.FLOW

    def __init__(self, mean, flow: Flow, training: dict | None = None):
        super().__init__(mean)
        self.flow = flow
        self.training = dict(training or {})

    def params(self):
        return {
            "couplings": self.flow.arch.couplings,
            "hidden": self.flow.arch.hidden,
            "split": self.flow.arch.split,
            **self.training,
        }

    def arrays(self):
        return {"mean": self.mean, **self.flow.params}

    @classmethod
    def from_parts(cls, params, arrays):
        d = int(arrays["mean"].shape[0])
        arch = FlowArchitecture(d, int(params["couplings"]), int(params["hidden"]))
        if arch.split != params.get("split", arch.split):
            raise ValueError(f"flow artifact split {params['split']} does not match d={d}")
        weights = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items() if k != "mean"}
        training = {k: v for k, v in params.items() if k not in ("couplings", "hidden", "split")}
        return cls(arrays["mean"], Flow(arch, weights), training)

    def _map(self, centred):
        return self.flow.forward(centred)

    def inverse(self, latent: np.ndarray) -> np.ndarray:
        """Raw vectors (n, d) whose transform is ``latent`` (n, d): f⁻¹(z) + μ."""
        z = check_input(np.atleast_2d(np.asarray(latent, dtype=np.float64)), self.d_in)
        return self.flow.inverse(z) + self.mean


def fit_flow(
    sample: np.ndarray,
    couplings: int = FlowSettings.couplings,
    hidden: int = FlowSettings.hidden,
    steps: int = FlowSettings.steps,
    batch_size: int = FlowSettings.batch_size,
    learning_rate: float = FlowSettings.learning_rate,
    seed: int = FlowSettings.seed,
) -> FlowTransform:
    """Train a flow on the raw ``sample`` (n, d) (see :func:`train_flow`) and wrap it as a fitted transform."""
    flow, mean, log = train_flow(sample, couplings, hidden, steps, batch_size, learning_rate, seed)
    return FlowTransform(
        mean,
        flow,
        {
            "sample_size": log.n,
            "steps": log.steps,
            "batch_size": log.batch_size,
            "learning_rate": log.learning_rate,
            "seed": int(seed),
            "initial_nll": log.initial_nll,
            "final_nll": log.final_nll,
        },
    )
