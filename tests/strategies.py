"""Hypothesis strategies and helpers shared by gmlib's property tests.

Two kinds of property, for every public entry point:

* **valid random inputs** (:func:`mixtures`, :func:`prompts`, :func:`population_args`, ...):
  the output is finite and satisfies the invariants of the mathematics;
* **invalid random inputs** (:func:`corrupt`: one argument of a valid call corrupted --
  wrong rank, a wrong or broadcastable size, NaN/inf, a non-real dtype, or a value the
  mathematics forbids, given by the ``extra`` strategies below): :func:`assert_rejects`
  checks for a ``ValueError`` whose message names the argument -- never another
  exception, a NaN, or a silent broadcast.

Shapes come from a few sizes (``SHAPES``) so that the jit cache is reused across examples.
Use: ``from strategies import SETTINGS, Arg, corrupt, assert_rejects, mixtures, ...``
(pytest puts ``tests/`` on the path).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gmlib import GaussianMixture

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])

#: The few shapes inputs are drawn from (a small set: compiled kernels are reused across
#: examples, and compiling dominates the run time). Mixtures: (M, D); heads: (n, D_out),
#: tied to the mixture's shape in population tests; prompts: (L, D).
SHAPES = dict(mixture=((1, 2), (2, 1), (3, 3)), head=((1, 2), (4, 1), (4, 2)), prompt=((5, 2), (16, 3), (16, 1)))
DTYPES = (np.float64, np.float32)


def tol(dtype) -> float:
    """Relative tolerance of an invariant that holds exactly in exact arithmetic."""
    return 1e-9 if np.dtype(dtype) == np.float64 else 2e-4


# ============================================================================ strategies of valid inputs


def floats(lo, hi, dtype=np.float64):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False,
                     width=32 if np.dtype(dtype) == np.float32 else 64)


def arrays(shape, lo=-2.0, hi=2.0, dtype=np.float64):
    return hnp.arrays(dtype, shape, elements=floats(lo, hi, dtype))


@st.composite
def mixtures(draw, d=None, m=None, dtype=None, definite=False, mean_scale=2.0, cov_scale=1.0):
    """A valid GaussianMixture: weights may hold zeros, covariances may be singular (unless ``definite``)."""
    dtype = dtype or draw(st.sampled_from(DTYPES))
    if d is None or m is None:
        m, d = draw(st.sampled_from(SHAPES["mixture"]))
    raw = draw(hnp.arrays(np.float64, (m,), elements=st.one_of(st.just(0.0), floats(1e-3, 1.0))))
    assume(raw.sum() > 0.1)
    weights = (raw / raw.sum()).astype(dtype)
    means = draw(arrays((m, d), -mean_scale, mean_scale))
    rank = draw(st.integers(1, d))
    a = draw(arrays((m, d, rank), -1.0, 1.0))
    covs = cov_scale * a @ np.swapaxes(a, -1, -2)
    if definite:
        covs = covs + 0.1 * cov_scale * np.eye(d)
    covs = 0.5 * (covs + np.swapaxes(covs, -1, -2))
    return GaussianMixture(weights, means.astype(dtype), covs.astype(dtype))


@st.composite
def heads(draw, d, dtype, u_scale=1.0, q_scale=2.0, n_dout=None):
    """(queries (n, D), U (D, D), V (D_out, D)) of ``dtype``."""
    n, d_out = n_dout or draw(st.sampled_from(SHAPES["head"]))
    return (draw(arrays((n, d), -q_scale, q_scale)).astype(dtype),
            draw(arrays((d, d), -u_scale, u_scale)).astype(dtype),
            draw(arrays((d_out, d), -1.5, 1.5)).astype(dtype))


@st.composite
def prompts(draw, dtype=None):
    """Keyword arguments of a valid softmax_attention / linear_attention call."""
    dtype = dtype or draw(st.sampled_from(DTYPES))
    L, d = draw(st.sampled_from(SHAPES["prompt"]))
    queries, U, V = draw(heads(d, dtype))
    return dict(queries=queries, prompt=draw(arrays((L, d))).astype(dtype), U=U, V=V)


@st.composite
def population_args(draw, dtype=None, with_V=True, **mix_kwargs):
    dtype = dtype or draw(st.sampled_from(DTYPES))
    mix = draw(mixtures(dtype=dtype, **mix_kwargs))
    n_dout = SHAPES["head"][SHAPES["mixture"].index((mix.n_components, mix.dim))]
    queries, U, V = draw(heads(mix.dim, dtype, n_dout=n_dout))
    args = dict(mixture=mix, queries=queries, U=U)
    if with_V:
        args["V"] = V
    return args


def keys():
    return st.integers(0, 2**31 - 1).map(jax.random.key)


# ============================================================================ denoising problems (gmlib.denoise)


def numpy_posterior_mean(weights, means, cov, xi, z):
    """E[X | Z = z] and P(C = k | Z = z) by Bayes' rule in numpy/scipy: the densities of N(m_k, S),
    S = cov + xi^2 I, and Gaussian conditioning within each component, E[X | Z, C = k] = m_k + cov S^-1 (z - m_k)."""
    from scipy import special, stats

    weights, means, cov, z = (np.asarray(a, np.float64) for a in (weights, means, cov, z))
    d = means.shape[1]
    S = cov + float(xi) ** 2 * np.eye(d)
    logd = np.stack([np.log(w) + stats.multivariate_normal(m, S).logpdf(z) for w, m in zip(weights, means)], -1)
    post = np.exp(logd - special.logsumexp(logd, axis=-1, keepdims=True)).reshape(len(z), len(weights))
    gain = cov @ np.linalg.inv(S)
    cond = [m + (z - m) @ gain.T for m in means]
    return sum(post[:, [k]] * cond[k] for k in range(len(weights))), post


def numpy_bayes(weights, means, gamma, xi, z):
    """E[X | Z = z] for Gamma = gamma^2 I (numpy_posterior_mean's first output)."""
    d = np.asarray(means).shape[1]
    return numpy_posterior_mean(weights, means, float(gamma) ** 2 * np.eye(d), xi, z)[0]


def random_cov(rng, d, scale=1.0):
    """A random positive definite (d, d) covariance."""
    a = rng.normal(size=(d, d)) * scale
    return a @ a.T / d + 0.1 * np.eye(d)


def random_equal_norm_problem(rng, d, gamma=None, opposite=False, dtype=np.float64):
    """Two components of equal norm in R^d (opposite means if asked), random weights and noise levels."""
    from gmlib.denoise import DenoisingProblem

    r = rng.uniform(0.5, 3.0)
    m1 = rng.normal(size=d)
    m2 = -m1 if opposite else rng.normal(size=d)
    means = np.stack([m1 / np.linalg.norm(m1), m2 / np.linalg.norm(m2)]) * r
    p1 = rng.uniform(0.1, 0.9)
    gamma = rng.uniform(0.2, 2.0) if gamma is None else gamma
    xi = rng.uniform(0.3, 2.0)
    return DenoisingProblem(np.array([p1, 1 - p1], dtype), means.astype(dtype), dtype(gamma), dtype(xi))


@st.composite
def denoising_problems(draw, dtype=None, gamma=None, xi=None):
    """A valid isotropic DenoisingProblem of a shape of SHAPES["mixture"] (distinct means, gamma = 0 possible)."""
    from gmlib.denoise import DenoisingProblem

    dtype = dtype or draw(st.sampled_from(DTYPES))
    m, d = draw(st.sampled_from(SHAPES["mixture"]))
    raw = draw(arrays((m,), 0.05, 1.0))
    weights = (raw / raw.sum()).astype(dtype)
    means = draw(arrays((m, d), -3.0, 3.0))
    if m > 1:
        gaps = np.linalg.norm(means[:, None] - means[None], axis=-1) + np.eye(m)
        assume(gaps.min() > 0.1)
    gamma = draw(st.one_of(st.just(0.0), floats(0.01, 2.0))) if gamma is None else gamma
    xi = draw(st.one_of(st.just(1e-6), floats(0.05, 2.0))) if xi is None else xi
    return DenoisingProblem(weights, means.astype(dtype), dtype(gamma), dtype(xi))


@st.composite
def equal_norm_problems(draw, dtype=None, d=None, gamma=None, xi=None):
    """M = 2, d in {2, 3}, ||m_1|| = ||m_2|| (opposite means with some probability)."""
    from gmlib.denoise import DenoisingProblem

    dtype = dtype or draw(st.sampled_from(DTYPES))
    d = d or draw(st.sampled_from([2, 3]))
    radius = draw(floats(0.3, 3.0))
    a, b = draw(arrays((d,), -1.0, 1.0)), draw(arrays((d,), -1.0, 1.0))
    assume(np.linalg.norm(a) > 0.2 and np.linalg.norm(b) > 0.2)
    a = a / np.linalg.norm(a)
    b = -a if draw(st.booleans()) else b / np.linalg.norm(b)
    assume(np.linalg.norm(a - b) > 0.2)
    p = draw(floats(0.05, 0.95))
    gamma = draw(st.one_of(st.just(0.0), floats(0.05, 2.0))) if gamma is None else gamma
    xi = draw(floats(0.3, 2.0)) if xi is None else xi
    return DenoisingProblem(np.array([p, 1 - p]).astype(dtype), (radius * np.stack([a, b])).astype(dtype),
                            dtype(gamma), dtype(xi))


def numpy_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def numpy_heads_on_tokens(U, V, tokens, z):
    """Softmax attention of each head over the tokens, in numpy: (H, Q, D_v), head h's rows
    V_h sum_i softmax_i(z_i^T U_h z) z_i."""
    U, V, tokens, z = (np.asarray(a, np.float64) for a in (U, V, tokens, z))
    out = []
    for Uh, Vh in zip(U, V):
        w = numpy_softmax(tokens @ Uh @ z.T, axis=0)  # (L, Q)
        out.append(w.T @ tokens @ Vh.T)
    return np.stack(out)


def numpy_affine_optimum(weights, means, gamma, xi):
    """Cov(X, Z) Cov(Z)^-1 and E X - A E Z, from the moments of the mixture written out in numpy."""
    mean = weights @ means
    cov = gamma**2 * np.eye(means.shape[1]) + (weights[:, None] * (means - mean)).T @ (means - mean)
    A = np.linalg.solve(cov + xi**2 * np.eye(len(mean)), cov).T  # Cov(X, Z) = Cov(X), Cov(Z) = Cov(X) + xi^2 I
    return A, mean - A @ mean


def numpy_em(z, s, n_iter):
    """EM for two components of known covariance s I, from the start of denoise.estimate_task."""
    lam, vec = np.linalg.eigh(np.cov(z.T).reshape(z.shape[1], z.shape[1]))
    step = np.sqrt(lam[-1]) * vec[:, -1]
    means, w = np.stack([z.mean(0) + step, z.mean(0) - step]), np.array([0.5, 0.5])
    for _ in range(n_iter):
        r = numpy_softmax(np.log(w) - ((z[:, None, :] - means) ** 2).sum(-1) / (2 * s), axis=1)
        w, means = r.mean(0), (r.T @ z) / r.sum(0)[:, None]
    return w, means


def match_labels(w, means, ref_means):
    """The labelling of two components (w, means) closest to ref_means (EM is defined up to swapping labels)."""
    if np.linalg.norm(means - ref_means) > np.linalg.norm(means[::-1] - ref_means):
        return w[::-1], means[::-1]
    return w, means


def weight_z_scores(batch):
    """Per prompt of a denoise.task_sampler batch with gamma = 0 (every clean point on its component's mean):
    (fraction of targets at m_1 - pi_1) / its binomial standard error."""
    means, weights = (np.asarray(x) for x in batch.aux)
    pts = np.asarray(batch.targets)
    at_first = np.linalg.norm(pts - means[:, None, 0], axis=-1) < np.linalg.norm(pts - means[:, None, 1], axis=-1)
    p = weights[:, 0]
    return (at_first.mean(1) - p) / np.sqrt(p * (1 - p) / pts.shape[1])


def as_f64(a):
    """A float64 numpy copy (for comparisons in numpy)."""
    return np.asarray(a, np.float64)


def query_scale(prob, z):
    """1 + the largest |entry| of the queries and the means: the scale of an absolute tolerance."""
    return 1 + np.abs(as_f64(z)).max() + np.abs(as_f64(prob.means)).max()


# ============================================================================ corrupting one argument


@dataclasses.dataclass(frozen=True)
class Arg:
    """How one array argument of an entry point may be corrupted.

    ``fixed_axes``: axes whose size other arguments prescribe (a wrong size there must be
    rejected; the other axes are free, e.g. the number of queries). ``extra``: strategies
    ``value -> bad value`` for what the mathematics forbids (negative weights, ...).
    """

    fixed_axes: tuple = ()
    rank: bool = True
    finite: bool = True
    dtype: bool = True
    extra: tuple = ()


def bad_rank(a, draw):
    a = np.asarray(a)
    how = draw(st.sampled_from(["lead", "trail", "flat"] if a.ndim >= 2 else
                               ["lead", "trail", "scalar"] if a.ndim == 1 else ["lead"]))
    if how == "lead":
        return a[None]  # a batch axis: must not be silently broadcast
    if how == "trail":
        return a[..., None]
    if how == "flat":
        return a.reshape(-1)
    return a[0]


def bad_size(a, axis, draw):
    a = np.asarray(a)
    size = a.shape[axis]
    choices = [size + 1] + ([1] if size != 1 else [])  # 1: broadcastable, must still be refused
    new = draw(st.sampled_from(choices))
    if new > size:
        extra = np.take(a, [0] * (new - size), axis=axis)
        return np.concatenate([a, extra], axis=axis)
    return np.take(a, [0], axis=axis)


def nonfinite(a, draw):
    a = np.array(a, dtype=np.asarray(a).dtype if np.issubdtype(np.asarray(a).dtype, np.floating) else np.float64)
    i = draw(st.integers(0, a.size - 1))
    a.reshape(-1)[i] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    return a


def bad_dtype(a, draw):
    a = np.asarray(a)
    kind = draw(st.sampled_from(["complex", "str", "object", "longdouble"]))
    if kind == "complex":
        return a.astype(np.complex128) + 1j
    if kind == "str":
        return a.astype(str)
    if kind == "longdouble" and np.dtype(np.longdouble).itemsize > 8:
        return a.astype(np.longdouble)
    return np.full(a.shape, None, dtype=object)


@st.composite
def corrupt(draw, args: dict, spec: dict[str, Arg]):
    """``(name, bad args)``: a copy of ``args`` with the argument ``name`` corrupted."""
    name = draw(st.sampled_from(sorted(spec)))
    arg, value = spec[name], args[name]
    ways = []
    if arg.rank:
        ways.append(lambda: bad_rank(value, draw))
    for axis in arg.fixed_axes:
        ways.append(lambda axis=axis: bad_size(value, axis, draw))
    if arg.finite and np.asarray(value).size:
        ways.append(lambda: nonfinite(value, draw))
    if arg.dtype:
        ways.append(lambda: bad_dtype(value, draw))
    for strategy in arg.extra:
        ways.append(lambda strategy=strategy: draw(strategy(value)))
    bad = draw(st.sampled_from(ways))()
    return name, {**args, name: bad}


def assert_rejects(call: Callable, name: str, *also: str):
    """``call()`` must raise ValueError naming `name` (or one of ``also``); any other exception fails the test."""
    try:
        out = call()
    except ValueError as exc:
        assert any(f"`{n}`" in str(exc) for n in (name, *also)), f"the error does not name `{name}`: {exc}"
        return
    raise AssertionError(f"invalid `{name}` was accepted; returned {out!r}")


# strategies for the special corruptions (each maps a valid value to an invalid one)
def bad_positive_int(_):
    return st.sampled_from([0, -1, -7, 2.5, 3.0, True, "4", None, np.float64(2.0)])


def bad_fn(_):
    return st.sampled_from([3.0, "fn", None, lambda y: jnp.sum(y), lambda y: y[:1]])


def negative_weights(w):
    w = np.asarray(w, np.float64)
    if w.size < 2:
        return st.just(np.array([-1.0]))
    return st.just(w + np.r_[-(w[0] + 0.5), w[0] + 0.5, np.zeros(w.size - 2)])  # still sums to one


def unnormalised(w):
    return st.sampled_from([0.5, 1.5, 1 + 1e-6, 0.0]).map(lambda c: np.asarray(w) * c)


def asymmetric(c):
    c = np.array(c)
    if c.shape[-1] < 2:
        return st.just(-c - 1.0)  # 1x1: negative instead
    c[..., 0, 1] += 0.1 * (1 + np.abs(c).max())
    return st.just(c)


def indefinite(c):
    c = np.array(c)
    return st.just(c - (np.abs(c).max() * c.shape[-1] + 0.5) * np.eye(c.shape[-1], dtype=c.dtype))


def empty_rows(a):
    return st.just(np.asarray(a)[:0])


def negative(x):
    return st.just(-np.abs(np.asarray(x)) - 0.5)


def relabel(mix, perm):
    """The same mixture with its components in the order ``perm``."""
    return GaussianMixture(mix.weights[perm], mix.means[perm], mix.covs[perm])


def split_component(mix, k):
    """The same measure with component k split into two halves (a different parametrisation)."""
    w = np.asarray(mix.weights, np.float64)
    w = np.concatenate([w, [w[k] / 2]])
    w[k] /= 2
    return GaussianMixture(w.astype(mix.dtype), np.concatenate([mix.means, mix.means[k:k + 1]]),
                           np.concatenate([mix.covs, mix.covs[k:k + 1]]))


# ============================================================================ fixed examples


def unequal_mixture(seed: int = 0):
    """Three components in 3-D with unequal, full covariances."""
    a = np.random.default_rng(seed).normal(size=(3, 3, 3))
    covs = 0.15 * a @ np.swapaxes(a, -1, -2) + 0.05 * np.eye(3)
    means = np.array([[1.0, 0.0, 0.5], [-1.0, 1.0, 0.0], [0.0, -1.0, -0.5]])
    return GaussianMixture([0.2, 0.5, 0.3], means, covs)


def singular_mixture():
    """Two components in 3-D whose last coordinate carries no noise (like LDA tokens)."""
    covs = np.zeros((2, 3, 3))
    covs[:, :2, :2] = [[[0.5, 0.1], [0.1, 0.3]], [[0.2, 0.0], [0.0, 0.6]]]
    means = np.array([[1.0, 0.5, 1.0], [-0.5, 0.0, -1.0]])
    return GaussianMixture([0.6, 0.4], means, covs)
