"""Property-based tests of gmlib.denoise's problem and Bayes denoiser (helpers from test_properties.py).

Valid random problems: the posterior is a probability vector, relabelling the components
permutes it and leaves the denoiser unchanged, and the Bayes denoiser is eq 10's
"shrinkage plus convex hull": f*(z) = (γ²/s) z + (ξ²/s) Σ β_k(z) m_k, so that
(f*(z) − (γ²/s) z)/(ξ²/s) lies in the convex hull of the means — also at γ = 0, for tiny ξ
and for queries far from the data. Invalid inputs: ValueError naming the argument.
"""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_properties import DTYPES, SETTINGS, Arg, _bad_key, _bad_positive_int, _negative, _negative_weights, \
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


# ============================================================================ heads, linear optimum, in-context, iterates
#
# Valid random inputs: two_head_bayes's heads summed by multi_head_attention on the noisy prompt
# are the Bayes denoiser (Thm 4.1) for random equal-norm problems (opposite means and γ = 0
# included); single_head_bayes is exact when γ = ξ (and refuses γ ≠ ξ > 0); multi_head_attention is
# the sum of its heads; linear_optimum is M₂(M₂ + ξ²I)⁻¹ (symmetric, eigenvalues in [0, 1));
# linear_gap and excess_risk are ≥ 0, excess_risk(bayes) = 0; in_context_denoise with
# in_context_params is the task's Bayes denoiser (Prop 4.4) and, for any params, the residual
# formula; iterate's steps are f applied; separation and the tanh map of Prop 4.3.

from gmlib import GaussianMixture, population_attention, softmax_attention  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


def _np(a):
    return np.asarray(a, np.float64)


@st.composite
def equal_norm_problems(draw, dtype=None, d=None, gamma=None, xi=None):
    """M = 2, d ∈ {2, 3}, ‖m₁‖ = ‖m₂‖ (opposite means with some probability)."""
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
    return dn.DenoisingProblem(np.array([p, 1 - p]).astype(dtype), (radius * np.stack([a, b])).astype(dtype),
                               dtype(gamma), dtype(xi))


def _scale(prob, z):
    return 1 + np.abs(_np(z)).max() + np.abs(_np(prob.means)).max()


@SETTINGS
@given(prob=equal_norm_problems(), z=arrays((4, 3), -4.0, 4.0))
def test_two_heads_sum_to_bayes(prob, z):
    """Thm 4.1 / Props C.3, C.5: T₁ + T₂ on μ_Z is f*; multi_head_attention is the sum of the heads."""
    z = z[:, :prob.dim].astype(prob.dtype)
    heads = dn.two_head_bayes(prob)
    assert len(heads) == 2 and all(m.shape == (prob.dim, prob.dim) for h in heads for m in h)
    assert all(np.all(np.isfinite(_np(m))) for h in heads for m in h)
    out = _np(dn.multi_head_attention(prob.noisy, z, heads))
    parts = sum(_np(population_attention(prob.noisy, z, U, V)) for U, V in heads)
    t = tol(prob.dtype)
    sc = _scale(prob, z)
    np.testing.assert_allclose(out, parts, atol=10 * t * sc)
    np.testing.assert_allclose(out, _np(prob.bayes(z)), atol=(1e3 if prob.dtype == np.float64 else 300) * t * sc)


@SETTINGS
@given(prob=equal_norm_problems(gamma=0.0), z=arrays((4, 3), -4.0, 4.0), case=st.sampled_from(["balanced", "zero", "other"]))
def test_single_head_bayes(prob, z, case):
    """γ = ξ: one head U = I/s, V = I/2 is f* (Thm 4.1); γ = 0: exact when a normal to both means exists
    (d = 3 or opposite means), refused otherwise; γ ∉ {0, ξ}: refused (Prop C.4)."""
    dtype = np.dtype(prob.dtype).type
    gamma = {"balanced": prob.xi, "zero": dtype(0.0), "other": dtype(1.7) * prob.xi}[case]
    prob = dn.DenoisingProblem(prob.weights, prob.means, gamma, prob.xi)
    z = z[:, :prob.dim].astype(prob.dtype)
    m = _np(prob.means)
    collinear = 1 - (m[0] @ m[1]) ** 2 / ((m[0] @ m[0]) * (m[1] @ m[1])) < np.finfo(dtype).eps ** (2 / 3)
    if case == "other" or (case == "zero" and prob.dim == 2 and not collinear):
        with pytest.raises(ValueError, match="no single head"):
            dn.single_head_bayes(prob)
        return
    U, V = dn.single_head_bayes(prob)
    assert U.shape == V.shape == (prob.dim, prob.dim)
    out = _np(population_attention(prob.noisy, z, U, V))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, _np(prob.bayes(z)), atol=(1e3 if dtype == np.float64 else 300) * tol(dtype)
                               * _scale(prob, z))


@SETTINGS
@given(prompt=st.sampled_from([(16, 2), (5, 3)]), n_heads=st.sampled_from([1, 3]), dtype=st.sampled_from(DTYPES),
       data=st.data(), block=st.sampled_from([None, 4]))
def test_multi_head_attention_is_the_sum_of_heads(prompt, n_heads, dtype, data, block):
    """On tokens: the sum of softmax_attention over the heads (any block size); a head's order is irrelevant."""
    L, D = prompt
    toks = data.draw(arrays((L, D))).astype(dtype)
    q = data.draw(arrays((3, D))).astype(dtype)
    heads = [(data.draw(arrays((D, D))).astype(dtype), data.draw(arrays((2, D))).astype(dtype))
             for _ in range(n_heads)]
    out = _np(dn.multi_head_attention(toks, q, heads, block_size=block))
    assert out.shape == (3, 2) and np.all(np.isfinite(out))
    expected = sum(_np(softmax_attention(toks, q, U, V)) for U, V in heads)
    t = tol(dtype)
    sc = (1 + np.abs(_np(toks)).max() * 2 * 1.5 * D) * n_heads
    np.testing.assert_allclose(out, expected, atol=10 * t * sc)
    np.testing.assert_allclose(_np(dn.multi_head_attention(toks, q, heads[::-1], block_size=block)), out,
                               atol=10 * t * sc)


@SETTINGS
@given(prob=problems())
def test_linear_optimum_and_gap(prob):
    """A* = M₂(M₂ + ξ²I)⁻¹: symmetric, eigenvalues in [0, 1); linear_gap = ξ² tr A* − R* ≥ 0;
    the Bayes risk lies between its within-component part d γ²ξ²/s and min(d ξ², tr Cov X)."""
    t = tol(prob.dtype)
    A = _np(dn.linear_optimum(prob))
    w, m, g, x = _np(prob.weights), _np(prob.means), float(prob.gamma), float(prob.xi)
    d = prob.dim
    M2 = (w[:, None] * m).T @ m + g**2 * np.eye(d)
    assert A.shape == (d, d) and np.all(np.isfinite(A))
    sc = 1 + np.abs(M2).max() / x**2
    np.testing.assert_allclose(A, A.T, atol=10 * t * sc)
    np.testing.assert_allclose(A, M2 @ np.linalg.inv(M2 + x**2 * np.eye(d)), atol=100 * t * sc)
    eig = np.linalg.eigvalsh(0.5 * (A + A.T))
    assert eig.min() >= -10 * t * sc and eig.max() < 1 + 10 * t * sc
    bayes = float(prob.bayes_risk())
    gap = float(dn.linear_gap(prob))
    s = g**2 + x**2
    cov_x = M2 - np.outer(w @ m, w @ m)
    assert np.isfinite(bayes) and np.isfinite(gap)
    slack = 1e-6 * (1 + d * x**2)  # quadrature error of the Bayes risk (sharp gates: M = 3 uses Gauss–Hermite)
    assert d * g**2 * x**2 / s - slack - 100 * t <= bayes <= min(d * x**2, np.trace(cov_x)) + slack + 100 * t
    assert gap >= -slack - 1e3 * t * sc
    np.testing.assert_allclose(gap, x**2 * np.trace(A) - bayes, atol=1e3 * t * sc * (1 + d * x**2))
    # the affine optimum: the same shrinkage of Cov X, the intercept (I - A) E X, a gap between 0 and the linear one
    Aa, b = (_np(v) for v in dn.affine_optimum(prob))
    mean = w @ m
    np.testing.assert_allclose(Aa, (M2 - np.outer(mean, mean)) @ np.linalg.inv(M2 - np.outer(mean, mean) + x**2 * np.eye(d)),
                               atol=100 * t * sc)
    np.testing.assert_allclose(b, mean - Aa @ mean, atol=100 * t * sc * (1 + np.abs(mean).max()))
    affine = float(dn.affine_gap(prob))
    assert -slack - 1e3 * t * sc <= affine <= gap + slack + 1e3 * t * sc


@SETTINGS
@given(prob=problems(dtype=np.float64), key=st.integers(0, 2**31 - 1), c=floats(-1.0, 1.0),
       n_nodes=st.sampled_from([4, 8]))
def test_excess_risk(prob, key, c, n_nodes):
    """excess_risk(f*) = 0 exactly, ≥ 0 for other maps, = E‖f − f*‖² which for f = f* + c is d c²;
    Monte Carlo: finite, non-negative, with a standard error, and 0 for f*. (Few nodes: the default
    40³ · M points per call are the unit tests' business.)"""
    zero, se = prob.excess_risk(prob.bayes, n_nodes=n_nodes, with_stderr=True)
    assert float(zero) == 0.0 and float(se) == 0.0
    shifted = prob.excess_risk(lambda z: prob.bayes(z) + c, n_nodes=n_nodes)
    np.testing.assert_allclose(float(shifted), prob.dim * c**2, rtol=1e-9, atol=1e-12)
    A = dn.linear_optimum(prob)
    lin = prob.excess_risk(lambda z: z @ A.T, n_nodes=8)
    assert np.isfinite(float(lin)) and float(lin) >= 0
    mc, mc_se = prob.excess_risk(lambda z: z @ A.T, method="monte_carlo", key=jax.random.key(key), n_samples=64,
                                   with_stderr=True)
    assert np.isfinite(float(mc)) and float(mc) >= 0 and np.isfinite(float(mc_se)) and float(mc_se) >= 0
    mc0, mc0_se = prob.excess_risk(prob.bayes, method="monte_carlo", key=jax.random.key(key), n_samples=64,
                                   with_stderr=True)
    assert float(mc0) == 0.0 and float(mc0_se) == 0.0


@SETTINGS
@given(prob=equal_norm_problems(), z=arrays((4, 3), -4.0, 4.0), finite=st.booleans(), seed=st.integers(0, 1000))
def test_in_context_denoise(prob, z, finite, seed):
    """Prop 4.4: with in_context_params(γ, ξ, d) the population output is the task's f*; on a finite prompt,
    and for any params, it is W_out [z + T₁(z); z + T₂(z)] with softmax attention over the tokens."""
    z = z[:, :prob.dim].astype(prob.dtype)
    t, sc = tol(prob.dtype), _scale(prob, z)
    params = dn.in_context_params(prob.gamma, prob.xi, prob.dim)
    assert isinstance(params, dn.InContextParams)
    out = _np(dn.in_context_denoise(params, prob.noisy, z))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, _np(prob.bayes(z)), atol=(1e3 if prob.dtype == np.float64 else 300) * t * sc)
    rng = np.random.default_rng(seed)
    toks = prob.noisy.sample(jax.random.key(seed), 16)[0]
    rand = dn.InContextParams(*(rng.normal(size=(prob.dim, prob.dim)).astype(prob.dtype) for _ in range(4)),
                              rng.normal(size=(3, 2 * prob.dim)).astype(prob.dtype))
    p = rand if finite else params
    got = _np(dn.in_context_denoise(p, toks, z))
    heads = [_np(z) + _np(softmax_attention(toks, z, U, V)) for U, V in ((p.U1, p.V1), (p.U2, p.V2))]
    expected = np.concatenate(heads, axis=1) @ _np(p.W_out).T
    np.testing.assert_allclose(got, expected, atol=100 * t * sc * (1 + np.abs(expected).max()))


# iterate traces f on every call: under one jit per n_steps it compiles once per shape (validation: the
# eager calls of test_iterate_rejects_invalid)
_ITERATE_BAYES = {n: jax.jit(lambda p, z, n=n: dn.iterate(p.bayes, z, n)) for n in (1, 3)}
_ITERATE_TANH = {n: jax.jit(lambda lam, u0, n=n: dn.iterate(lambda v: jnp.tanh(lam**2 * v), u0, n)) for n in (1, 3)}


@SETTINGS
@given(prob=problems(), z=arrays((3, 3), -4.0, 4.0), n_steps=st.sampled_from([1, 3]),
       lam=floats(0.0, 3.0), u0=floats(-1.0, 1.0))
def test_iterate_applies_f(prob, z, n_steps, lam, u0):
    """The orbit starts at z₀ and each step is f of the previous one (for the Bayes denoiser and the tanh map)."""
    z = z[:, :prob.dim].astype(prob.dtype)
    t = tol(prob.dtype)
    traj = _np(_ITERATE_BAYES[n_steps](prob, z))
    assert traj.shape == (n_steps + 1,) + z.shape and np.all(np.isfinite(traj))
    np.testing.assert_array_equal(traj[0], _np(z))
    for k in range(n_steps):
        np.testing.assert_allclose(traj[k + 1], _np(prob.bayes(traj[k].astype(prob.dtype))),
                                   atol=10 * t * _scale(prob, z))
    u = _np(_ITERATE_TANH[n_steps](np.float64(lam), np.float64(u0)))
    assert u.shape == (n_steps + 1,)
    np.testing.assert_allclose(u[1:], np.tanh(lam**2 * u[:-1]), rtol=1e-12, atol=1e-300)


@SETTINGS
@given(prob=equal_norm_problems(dtype=np.float64, gamma=0.0), u=arrays((4,), -2.0, 2.0))
def test_separation_and_the_tanh_map(prob, u):
    """λ = ‖m₁ − m₂‖/(2ξ); with γ = 0 and π = (1/2, 1/2) one Bayes step maps c + uδ to c + tanh(λ²u)δ (Prop 4.3)."""
    prob = dn.DenoisingProblem([0.5, 0.5], prob.means, 0.0, prob.xi)
    m = _np(prob.means)
    lam = float(dn.separation(prob))
    assert np.isfinite(lam) and lam >= 0
    np.testing.assert_allclose(lam, np.linalg.norm(m[0] - m[1]) / (2 * float(prob.xi)), rtol=1e-12)
    c, delta = 0.5 * (m[0] + m[1]), 0.5 * (m[0] - m[1])
    out = _np(prob.bayes(c + u[:, None] * delta))
    np.testing.assert_allclose(out, c + np.tanh(lam**2 * u)[:, None] * delta, atol=1e-9 * (1 + np.abs(m).max()))


@SETTINGS
@given(lam=st.one_of(floats(0.0, 1.0), floats(1.0, 1.1), floats(1.0, 20.0)).map(np.float64)
       | hnp.arrays(np.float64, st.sampled_from([(3,), (2, 2)]), elements=floats(0.0, 5.0)))
def test_tanh_fixed_point(lam):
    """u = tanh(λ²u), u ∈ [0, 1]; u = 0 exactly for λ ≤ 1 and u > 0 for λ > 1; the shape of λ."""
    u = dn.tanh_fixed_point(lam)
    lam = np.asarray(lam)
    assert isinstance(u, np.ndarray) and u.shape == lam.shape and u.dtype == np.float64
    assert np.all((u >= 0) & (u <= 1))
    assert np.all(u[lam <= 1] == 0) and np.all(u[(lam > 1) & (lam**2 - 1 > 1e-12)] > 0)
    np.testing.assert_allclose(u, np.tanh(lam**2 * u), atol=1e-13)


# ---------------------------------------------------------------------------- invalid inputs


def _not_a_problem(_):
    return st.sampled_from([None, "problem", GaussianMixture([1.0], [[0.0]], [[[1.0]]]), (0.5, 0.5)])


OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data(),
       fn=st.sampled_from(["two_head_bayes", "single_head_bayes", "separation"]))
def test_constructions_reject_invalid(prob, data, fn):
    """Not a DenoisingProblem, M ≠ 2, d < 2 (two heads) or unequal norms: ValueError naming `problem`/`means`."""
    if data.draw(st.booleans()):
        bad = data.draw(_not_a_problem(None))
    else:
        m = _np(prob.means)
        norms = np.linalg.norm(m, axis=1)
        ok = prob.n_components == 2 and (fn == "separation" or (abs(norms[0] - norms[1]) < 1e-9 * max(norms.max(), 1)
                                                               and (prob.dim >= 2 or fn != "two_head_bayes")))
        assume(not ok)
        bad = prob
    assert_rejects(lambda: getattr(dn, fn)(bad), "problem", "means")


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_linear_optimum_and_gap_reject_invalid(prob, data):
    fn = data.draw(st.sampled_from(["linear_optimum", "linear_gap", "affine_optimum", "affine_gap"]))
    args, spec = dict(problem=prob), {"problem": OBJ(_not_a_problem)}
    if fn.endswith("_gap"):
        args["n_nodes"], spec["n_nodes"] = 20, OBJ(lambda v: _bad_positive_int(v).filter(lambda c: c is not None))
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: getattr(dn, fn)(**bad), name)


def _bad_fn(_):
    return st.sampled_from([3.0, "fn", None, lambda y: jnp.sum(y), lambda y: y[:1],
                            lambda y: jnp.concatenate([y, y], axis=-1)])


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_excess_and_bayes_risk_reject_invalid(prob, data):
    method = data.draw(st.sampled_from(["quadrature", "monte_carlo", "bayes_risk"]))
    not_none = lambda v: _bad_positive_int(v).filter(lambda c: c is not None)  # noqa: E731
    if method == "bayes_risk":
        name, bad = data.draw(corrupt(dict(n_nodes=20), {"n_nodes": OBJ(not_none)}))
        assert_rejects(lambda: prob.bayes_risk(**bad), name)
        return
    args = dict(f=prob.bayes, method=method)
    spec = {"f": OBJ(_bad_fn), "method": OBJ(lambda _: st.sampled_from(["simpson", None, "", 1]))}
    if method == "quadrature":
        args["n_nodes"], spec["n_nodes"] = 4, OBJ(not_none)
    else:
        def too_few(_):
            return st.just(1)

        args.update(key=jax.random.key(0), n_samples=16)
        spec.update(key=OBJ(_bad_key), n_samples=OBJ(_bad_positive_int, too_few))
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: prob.excess_risk(**bad), name)


@SETTINGS
@given(prob=equal_norm_problems(dtype=np.float64), data=st.data(), finite=st.booleans())
def test_multi_head_attention_rejects_invalid(prob, data, finite):
    heads = [tuple(np.asarray(m) for m in h) for h in dn.two_head_bayes(prob)]
    prompt = np.asarray(prob.noisy.sample(jax.random.key(0), 8)[0]) if finite else prob.noisy

    def bad_heads(h):
        return st.sampled_from([[], [h[0][0]], [(h[0][0],)], [(h[0][0], h[0][1], h[0][1])], None, 3.0,
                                [(h[0][0][:1], h[0][1])], [(h[0][0], h[0][1][:, :1])],
                                [(np.full_like(h[0][0], np.nan), h[0][1])], [(h[0][0], h[0][1].astype(complex))]])

    args = dict(prompt=prompt, queries=np.zeros((2, prob.dim)), heads=heads)
    spec = {"queries": Arg(fixed_axes=(1,)), "heads": OBJ(bad_heads),
            "prompt": Arg(extra=(_empty_rows,)) if finite else OBJ(lambda _: st.sampled_from([None, "mu", 3.0]))}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: dn.multi_head_attention(**bad), name)


def _empty_rows(a):
    return st.just(np.asarray(a)[:0])


@SETTINGS
@given(prob=equal_norm_problems(dtype=np.float64), data=st.data(), finite=st.booleans())
def test_in_context_denoise_rejects_invalid(prob, data, finite):
    d = prob.dim
    params = dn.in_context_params(prob.gamma, prob.xi, d)
    prompt = np.asarray(prob.noisy.sample(jax.random.key(0), 8)[0]) if finite else prob.noisy
    leaves = {f"params.{k}": np.asarray(v) for k, v in zip(dn.InContextParams._fields, params)}
    what = data.draw(st.sampled_from(["params", "leaf", "other"]))
    if what == "params":
        bad = data.draw(st.sampled_from([tuple(params), None, {"U1": params.U1}, "params"]))
        assert_rejects(lambda: dn.in_context_denoise(bad, prompt, np.zeros((2, d))), "params")
    elif what == "leaf":
        spec = {k: Arg(fixed_axes=(1,) if k.endswith("W_out") else (0, 1)) for k in leaves}
        name, bad = data.draw(corrupt(leaves, spec))
        p = dn.InContextParams(*(bad[f"params.{k}"] for k in dn.InContextParams._fields))
        assert_rejects(lambda: dn.in_context_denoise(p, prompt, np.zeros((2, d))), name)
    else:
        spec = {"queries": Arg(fixed_axes=(1,)),
                "prompt": Arg(extra=(_empty_rows,)) if finite else OBJ(lambda _: st.sampled_from([None, "mu"]))}
        name, bad = data.draw(corrupt(dict(prompt=prompt, queries=np.zeros((2, d))), spec))
        assert_rejects(lambda: dn.in_context_denoise(params, **bad), name)


@SETTINGS
@given(data=st.data(), shape=st.sampled_from([(2, 2), (3,)]))
def test_iterate_rejects_invalid(data, shape):
    spec = {"f": OBJ(_bad_fn), "z0": Arg(rank=False, dtype=True), "n_steps": OBJ(_bad_positive_int)}
    name, bad = data.draw(corrupt(dict(f=jnp.tanh, z0=np.full(shape, 0.5), n_steps=3), spec))
    assert_rejects(lambda: dn.iterate(**bad), name)


@SETTINGS
@given(data=st.data(), lam=st.sampled_from([np.float64(1.5), np.array([0.5, 2.0])]))
def test_tanh_fixed_point_rejects_invalid(data, lam):
    def not_real(_):  # (a float128 lam is merely rounded to float64: a host function, not refused)
        return st.sampled_from(["2", None, [1.0, "a"], 1j, np.array([1.0 + 1j]), np.array(["1.5"]), [[1.0], [1.0, 2.0]]])

    spec = {"lam": Arg(rank=False, dtype=False, extra=(_negative, not_real))}
    name, bad = data.draw(corrupt(dict(lam=lam), spec))
    assert_rejects(lambda: dn.tanh_fixed_point(**bad), name)


def test_public_entry_points_are_all_covered():
    """A new public name in gmlib.denoise must get property tests here (a valid-input and an invalid-input test)."""
    covered = {"DenoisingProblem", "two_head_bayes", "single_head_bayes", "multi_head_attention", "linear_optimum",
               "linear_gap", "affine_optimum", "affine_gap", "InContextParams", "in_context_params", "in_context_denoise", "iterate", "separation",
               "tanh_fixed_point"}
    missing = set(dn.__all__) - covered
    assert not missing, f"gmlib.denoise.{sorted(missing)} has no property tests: add them here, then list the name"
