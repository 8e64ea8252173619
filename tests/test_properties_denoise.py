"""Property-based tests of gmlib.denoise's problem and Bayes denoiser (helpers from test_properties.py).

Valid random problems: the posterior is a probability vector, relabelling the components
permutes it and leaves the denoiser unchanged, and the Bayes denoiser is eq 10's
"shrinkage plus convex hull": f*(z) = (γ²/s) z + (ξ²/s) Σ β_k(z) m_k, so that
(f*(z) − (γ²/s) z)/(ξ²/s) lies in the convex hull of the means — also at γ = 0, for tiny ξ
and for queries far from the data. Invalid inputs: ValueError naming the argument.
"""

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st
from test_properties import DTYPES, SETTINGS, Arg, _bad_positive_int, _negative, _negative_weights, \
    _unnormalised, arrays, assert_rejects, corrupt, floats, tol

from gmlib import denoise as dn

SHAPES = ((1, 2), (2, 1), (3, 3))  # (M, d)


@st.composite
def problems(draw, dtype=None, gamma=None, xi=None):
    dtype = dtype or draw(st.sampled_from(DTYPES))
    m, d = draw(st.sampled_from(SHAPES))
    raw = draw(arrays((m,), 0.05, 1.0))
    weights = (raw / raw.sum()).astype(dtype)
    means = draw(arrays((m, d), -3.0, 3.0))
    if m > 1:
        gaps = np.linalg.norm(means[:, None] - means[None], axis=-1) + np.eye(m)
        assume(gaps.min() > 0.1)
    gamma = draw(st.one_of(st.just(0.0), floats(0.01, 2.0))) if gamma is None else gamma
    xi = draw(st.one_of(st.just(1e-6), floats(0.05, 2.0))) if xi is None else xi
    return dn.DenoisingProblem(weights, means.astype(dtype), dtype(gamma), dtype(xi))


@SETTINGS
@given(prob=problems(), z=arrays((4, 3), -6.0, 6.0), far=st.sampled_from([1.0, 1e3]), seed=st.integers(0, 100))
def test_bayes_is_shrinkage_plus_convex_hull(prob, z, far, seed):
    z = (far * z[:, :prob.dim]).astype(prob.dtype)
    t = tol(prob.dtype)
    beta = np.asarray(prob.posterior(z), np.float64)
    f = np.asarray(prob.bayes(z), np.float64)
    assert np.all(np.isfinite(beta)) and np.all(np.isfinite(f))
    assert np.all(beta >= 0) and np.allclose(beta.sum(axis=1), 1.0, atol=10 * t)
    g2, x2 = float(prob.gamma) ** 2, float(prob.xi) ** 2
    s = g2 + x2
    means = np.asarray(prob.means, np.float64)
    scale = 1 + np.abs(z).max() + np.abs(means).max()
    np.testing.assert_allclose(f, g2 / s * np.asarray(z, np.float64) + x2 / s * beta @ means, atol=100 * t * scale)
    hull = (f - g2 / s * np.asarray(z, np.float64)) / (x2 / s)  # eq 10: a point of conv{m_k}
    slack = 100 * t * scale * s / x2
    assert np.all(hull >= means.min(axis=0) - slack) and np.all(hull <= means.max(axis=0) + slack)
    perm = np.random.default_rng(seed).permutation(prob.n_components)
    relabelled = dn.DenoisingProblem(prob.weights[perm], prob.means[perm], prob.gamma, prob.xi)
    np.testing.assert_allclose(relabelled.posterior(z), beta[:, perm], atol=10 * t)
    np.testing.assert_allclose(relabelled.bayes(z), f, atol=100 * t * scale)


@SETTINGS
@given(gamma=st.one_of(st.just(0.0), floats(0.0, 3.0)), xi=st.one_of(st.just(1e-8), floats(1e-3, 3.0)),
       dim=st.sampled_from([1, 2, 3]))
def test_in_context_params(gamma, xi, dim):
    p = dn.in_context_params(gamma, xi, dim)
    for leaf in p:
        assert np.all(np.isfinite(np.asarray(leaf)))
    a = xi**2 / (gamma**2 + xi**2)
    np.testing.assert_allclose(np.asarray(p[1]), a * np.eye(dim), rtol=1e-12)


def _equal_rows(means):
    m = np.array(means)
    if m.shape[0] < 2:
        return st.just(m[None])  # a batch axis instead
    m[1] = m[0]
    return st.just(m)


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_problem_rejects_invalid(prob, data):
    args = dict(weights=np.asarray(prob.weights), means=np.asarray(prob.means),
                gamma=np.float64(prob.gamma), xi=np.float64(prob.xi))

    def zero(x):
        return st.just(np.zeros_like(x))

    spec = {"weights": Arg(extra=(_negative_weights, _unnormalised)),
            "means": Arg(fixed_axes=(0,), extra=(_equal_rows,)),
            "gamma": Arg(extra=(_negative,)), "xi": Arg(extra=(_negative, zero))}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: dn.DenoisingProblem(**bad), name)


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data(), method=st.sampled_from(["posterior", "bayes"]))
def test_denoiser_rejects_invalid_queries(prob, data, method):
    name, bad = data.draw(corrupt(dict(z=np.zeros((2, prob.dim))), {"z": Arg(fixed_axes=(1,))}))
    assert_rejects(lambda: getattr(prob, method)(bad["z"]), name)


@SETTINGS
@given(data=st.data())
def test_in_context_params_rejects_invalid(data):
    spec = {"gamma": Arg(extra=(_negative,)), "xi": Arg(extra=(_negative,)),
            "dim": Arg(rank=False, finite=False, dtype=False, extra=(_bad_positive_int,))}
    name, bad = data.draw(corrupt(dict(gamma=np.float64(0.5), xi=np.float64(1.0), dim=2), spec))
    assert_rejects(lambda: dn.in_context_params(**bad), name)
