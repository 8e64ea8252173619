"""gmlib.denoise.problem: DenoisingProblem against independent computations (scipy densities and Gaussian
conditioning, Tweedie's formula by autodiff, Monte Carlo, trapezoid grids), then properties of random valid
inputs, then invalid inputs (ValueError naming the argument).

Properties: the responsibilities are a probability vector, relabelling the components permutes them and
leaves the denoiser unchanged, and the Bayes denoiser is eq 10's "shrinkage plus convex hull":
f*(z) = (γ²/s) z + (ξ²/s) Σ β_k(z) m_k, so that (f*(z) − (γ²/s) z)/(ξ²/s) lies in the convex hull of the
means, also at γ = 0, for tiny ξ and for queries far from the data; excess_risk(f*) = 0 and
excess_risk(f* + c) = d c².
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    SETTINGS,
    Arg,
    arrays,
    assert_rejects,
    bad_positive_int,
    corrupt,
    denoising_problems,
    floats,
    negative,
    negative_weights,
    numpy_bayes,
    numpy_posterior_mean,
    random_cov,
    random_equal_norm_problem,
    tol,
    unnormalised,
)

import gmlib
from gmlib import denoise as dn


# ----------------------------------------------------------------------------- the Bayes denoiser


@pytest.mark.smoke
def test_bayes_matches_scipy_formula_any_means():
    rng = np.random.default_rng(0)
    weights = np.array([0.2, 0.5, 0.3])
    means = rng.normal(size=(3, 3)) * 2  # unequal norms, three components
    prob = dn.DenoisingProblem(weights, means, 0.8, 1.3)
    z = rng.normal(size=(40, 3)) * 3
    expected = numpy_bayes(weights, means, 0.8, 1.3, z)
    np.testing.assert_allclose(jax.jit(lambda p, q: p.bayes(q))(prob, z), expected, atol=1e-12)
    post = prob.responsibilities(z)
    np.testing.assert_allclose(post.sum(-1), 1.0, atol=1e-14)


def test_bayes_is_tweedie():
    rng = np.random.default_rng(1)
    prob = dn.DenoisingProblem([0.3, 0.7], rng.normal(size=(2, 2)) * 2, 0.5, 0.9)
    z = jnp.asarray(rng.normal(size=(10, 2)) * 2)
    score = jax.vmap(jax.grad(lambda q: prob.noisy.log_prob(q[None])[0]))(z)
    np.testing.assert_allclose(prob.bayes(z), z + 0.9**2 * score, atol=1e-12)


def test_bayes_matches_monte_carlo_conditional_mean():
    # E[X | Z = z] = E_X[X N(z; X, xi^2 I)] / E_X[N(z; X, xi^2 I)], estimated on batches of clean samples
    prob = dn.DenoisingProblem([0.4, 0.6], [[3.0, 0.0], [0.0, 3.0]], 1.0, 2.0)
    z = np.array([[1.0, 1.0], [3.0, -1.0], [-2.0, 4.0]])
    x, _ = prob.clean.sample(key=jax.random.key(0), n_samples=400_000)
    x = np.asarray(x).reshape(20, -1, 2)
    logw = -np.sum((z[None, :, None, :] - x[:, None, :, :]) ** 2, -1) / (2 * 2.0**2)  # (B, n_z, N)
    w = np.exp(logw - logw.max(-1, keepdims=True))
    est = np.einsum("bqn,bnd->bqd", w, x) / w.sum(-1)[..., None]  # (B, n_z, 2)
    mean, se = est.mean(0), est.std(0, ddof=1) / np.sqrt(est.shape[0])
    assert np.all(np.abs(mean - np.asarray(prob.bayes(z))) < 5 * se + 1e-3)


def test_bayes_limits_and_float32():
    means = np.array([[3.0, 0.0], [0.0, 3.0]])
    z = np.array([[1.0, -2.0], [4.0, 4.0]])
    high = dn.DenoisingProblem([0.3, 0.7], means, 1.0, 1e4).bayes(z)
    np.testing.assert_allclose(high, np.broadcast_to([0.3 * 3, 0.7 * 3], (2, 2)), atol=1e-6)
    low = dn.DenoisingProblem([0.3, 0.7], means, 1.0, 1e-5).bayes(z)
    np.testing.assert_allclose(low, z, atol=1e-8)
    p32 = dn.DenoisingProblem(np.float32([0.3, 0.7]), means.astype(np.float32), np.float32(1.0), np.float32(2.0))
    out = p32.bayes(z.astype(np.float32))
    assert out.dtype == jnp.float32
    p64 = dn.DenoisingProblem([0.3, 0.7], means, 1.0, 2.0)
    np.testing.assert_allclose(out, p64.bayes(z), atol=1e-5)


def test_sample_draws_clean_points_and_independent_noise():
    prob = dn.DenoisingProblem([0.3, 0.7], [[3.0, 0.0], [0.0, -2.0]], 0.6, 1.5)
    n = 400_000
    x, z = prob.sample(key=jax.random.key(0), n_samples=n)
    assert x.shape == z.shape == (n, 2) and x.dtype == z.dtype == jnp.float64
    x, eps = np.asarray(x), (np.asarray(z) - np.asarray(x)) / 1.5
    w, m = np.array([0.3, 0.7]), np.array([[3.0, 0.0], [0.0, -2.0]])
    mean = w @ m
    cov = 0.36 * np.eye(2) + (w[:, None] * m).T @ m - np.outer(mean, mean)
    se = np.sqrt(np.diag(cov) / n)
    assert np.all(np.abs(x.mean(0) - mean) < 5 * se)
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.03)
    # the noise: standard normal, independent of X (cross-covariance of order 1/sqrt(n))
    assert np.all(np.abs(eps.mean(0)) < 5 / np.sqrt(n))
    np.testing.assert_allclose(np.cov(eps.T), np.eye(2), atol=0.01)
    assert np.abs((x - mean).T @ eps / n).max() < 5 * np.sqrt(cov.max() / n)
    # the same key gives the same draws, the noisy points follow `noisy` (its mean and covariance)
    again = [prob.sample(key=jax.random.key(0), n_samples=5)[1] for _ in range(2)]
    np.testing.assert_array_equal(*again)
    np.testing.assert_allclose(np.cov(np.asarray(z).T), np.asarray(prob.noisy.covariance()), atol=0.04)


def test_full_covariance_three_components_match_eq10_in_numpy():
    rng = np.random.default_rng(0)
    d = 3
    weights = np.array([0.2, 0.5, 0.3])
    means = rng.normal(size=(3, d)) * np.array([[1.0], [2.0], [3.0]])  # unequal norms
    cov = random_cov(rng, d)
    prob = dn.DenoisingProblem(weights, means, xi=0.9, cov=cov)
    z = rng.normal(size=(60, d)) * 3
    expected, post = numpy_posterior_mean(weights, means, cov, 0.9, z)
    np.testing.assert_allclose(jax.jit(lambda p, q: p.bayes(q))(prob, z), expected, atol=1e-12)
    np.testing.assert_allclose(prob.responsibilities(z), post, atol=1e-12)
    # Tweedie: f*(z) = z + xi^2 grad log p_Z(z), the score by autodiff of the noisy mixture's density
    score = jax.vmap(jax.grad(lambda q: prob.noisy.log_prob(q[None])[0]))(jnp.asarray(z))
    np.testing.assert_allclose(prob.bayes(z), z + 0.9**2 * score, atol=1e-11)


def test_full_covariance_laws_and_properties():
    rng = np.random.default_rng(1)
    cov = random_cov(rng, 2)
    prob = dn.DenoisingProblem([0.4, 0.6], [[1.0, 0.0], [0.0, 2.0]], xi=0.5, cov=cov)
    assert prob.gamma is None and not prob.isotropic
    np.testing.assert_allclose(prob.S, cov + 0.25 * np.eye(2), atol=1e-15)
    np.testing.assert_allclose(prob.clean.covs, np.broadcast_to(cov, (2, 2, 2)), atol=1e-15)
    np.testing.assert_allclose(prob.noisy.covs, np.broadcast_to(cov + 0.25 * np.eye(2), (2, 2, 2)), atol=1e-15)
    with pytest.raises(ValueError, match="use `S`"):
        _ = prob.s
    iso = dn.DenoisingProblem([0.4, 0.6], [[1.0, 0.0], [0.0, 2.0]], 0.7, 0.5)
    assert iso.isotropic and iso.cov is None
    np.testing.assert_allclose(iso.covariance, 0.49 * np.eye(2), atol=1e-15)
    # a full covariance equal to gamma^2 I gives the isotropic denoiser
    same = dn.DenoisingProblem([0.4, 0.6], [[1.0, 0.0], [0.0, 2.0]], xi=0.5, cov=0.49 * np.eye(2))
    z = rng.normal(size=(20, 2)) * 2
    np.testing.assert_allclose(same.bayes(z), iso.bayes(z), atol=1e-13)
    # pytree: jit, vmap over problems, astype, and grad through the covariance
    f32 = prob.astype(jnp.float32)
    assert f32.cov.dtype == jnp.float32 and f32.gamma is None
    np.testing.assert_allclose(f32.bayes(z.astype(np.float32)), prob.bayes(z), atol=1e-4)
    g = jax.grad(lambda c: dn.DenoisingProblem(prob.weights, prob.means, xi=0.5, cov=c).bayes(z).sum())(prob.cov)
    eps = 1e-6
    bump = np.zeros((2, 2))
    bump[0, 1] = bump[1, 0] = eps
    fd = (float(dn.DenoisingProblem(prob.weights, prob.means, xi=0.5, cov=cov + bump).bayes(z).sum())
          - float(dn.DenoisingProblem(prob.weights, prob.means, xi=0.5, cov=cov - bump).bayes(z).sum())) / (2 * eps)
    np.testing.assert_allclose(g[0, 1] + g[1, 0], fd, rtol=1e-6)


def test_constructor_errors():
    w, m = [0.5, 0.5], [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(ValueError, match="`xi`"):
        dn.DenoisingProblem(w, m, 1.0)
    with pytest.raises(ValueError, match="exactly one of `gamma`.*both"):
        dn.DenoisingProblem(w, m, 1.0, 2.0, cov=np.eye(2))
    with pytest.raises(ValueError, match="exactly one of `gamma`.*neither"):
        dn.DenoisingProblem(w, m, xi=2.0)
    with pytest.raises(ValueError, match=r"`cov` must have shape \(d, d\) with d = 2; got \(3, 3\)"):
        dn.DenoisingProblem(w, m, xi=2.0, cov=np.eye(3))
    # the same messages as GaussianMixture's for its covariances
    for bad, what in (([[1.0, 0.5], [0.0, 1.0]], "symmetric"), ([[1.0, 0.0], [0.0, -0.1]], "positive semi-definite")):
        with pytest.raises(ValueError, match=what) as got:
            dn.DenoisingProblem(w, m, xi=2.0, cov=bad)
        with pytest.raises(ValueError, match=what) as ref:
            gmlib.GaussianMixture([1.0], m[:1], [bad])
        assert str(got.value).replace("`cov`", "") == str(ref.value).replace("`covs`", "")
    with pytest.raises(ValueError, match="`cov` must be finite"):
        dn.DenoisingProblem(w, m, xi=2.0, cov=[[np.nan, 0.0], [0.0, 1.0]])


# ----------------------------------------------------------------------------- risks


def test_excess_risk_quadrature_against_monte_carlo_and_a_trapezoid_grid():
    prob = dn.DenoisingProblem([0.4, 0.6], [[3.0, 0.0], [0.0, 3.0]], 1.0, 2.0)
    U = jnp.array([[0.3, -0.1], [0.2, 0.25]])
    V = jnp.array([[0.7, 0.1], [-0.2, 0.5]])

    def f(z):
        return gmlib.population_attention(prob.noisy, z, U, V)

    quad, se0 = prob.excess_risk(f, with_stderr=True)
    assert float(se0) == 0.0 and float(prob.excess_risk(f)) == float(quad)
    mc, se = prob.excess_risk(f, method="monte_carlo", key=jax.random.key(1), n_samples=200_000,
                              with_stderr=True)
    assert abs(float(quad) - float(mc)) < 4 * float(se)
    # independent deterministic rule: trapezoid on a fine grid in each component's standard coordinates
    x = np.linspace(-9, 9, 241)
    h = x[1] - x[0]
    gx, gy = np.meshgrid(x, x, indexing="ij")
    grid = np.stack([gx.ravel(), gy.ravel()], -1)
    phi = np.exp(-0.5 * np.sum(grid**2, -1)) / (2 * np.pi) * h * h
    total = 0.0
    for w, m in zip([0.4, 0.6], [[3.0, 0.0], [0.0, 3.0]]):
        pts = np.asarray(m) + np.sqrt(5.0) * grid
        err = np.asarray(f(pts)) - numpy_bayes(np.array([0.4, 0.6]), np.array([[3.0, 0.0], [0.0, 3.0]]), 1.0, 2.0, pts)
        total += w * np.sum(phi * np.sum(err**2, -1))
    assert abs(float(quad) - total) < 1e-10


def test_excess_risk_monte_carlo_in_high_dimension_and_errors():
    rng = np.random.default_rng(5)
    prob = random_equal_norm_problem(rng, 5)
    heads = dn.two_head_bayes(prob)
    val, se = prob.excess_risk(lambda z: gmlib.apply_heads(heads, prob.noisy, z), key=jax.random.key(0),
                               n_samples=1000, with_stderr=True)
    assert abs(float(val)) < 1e-18 and float(se) < 1e-18
    with pytest.raises(ValueError, match="key"):
        prob.excess_risk(lambda z: z)
    with pytest.raises(ValueError, match="method"):
        prob.excess_risk(lambda z: z, method="simpson")
    with pytest.raises(ValueError, match=r"\(n, d\)"):
        dn.DenoisingProblem([1.0], [[0.0, 0.0]], 1.0, 1.0).excess_risk(lambda z: z[:, :1])


@pytest.mark.smoke
def test_excess_risk_is_differentiable():
    prob = dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], 1.0, 2.0)

    def risk(theta):
        heads = gmlib.Heads(U=theta[::2], V=theta[1::2])  # theta = (U1, V1, U2, V2)
        return prob.excess_risk(lambda z: gmlib.apply_heads(heads, prob.noisy, z), n_nodes=20)

    theta = 0.3 * jnp.asarray(np.random.default_rng(6).normal(size=(4, 2, 2)))
    g = jax.jit(jax.grad(risk))(theta)
    direction = jnp.asarray(np.random.default_rng(7).normal(size=(4, 2, 2)))
    eps = 1e-6
    fd = (risk(theta + eps * direction) - risk(theta - eps * direction)) / (2 * eps)
    assert abs(float(jnp.sum(g * direction)) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))
    # at the construction the risk and its gradient vanish
    heads = dn.two_head_bayes(prob)
    star = jnp.stack([heads.U[0], heads.V[0], heads.U[1], heads.V[1]])
    assert float(risk(star)) < 1e-20
    assert float(jnp.abs(jax.grad(risk)(star)).max()) < 1e-9


@pytest.mark.parametrize("full", [False, True])
def test_bayes_risk_against_monte_carlo(full):
    rng = np.random.default_rng(9)
    for m in (1, 2, 3):
        means = rng.normal(size=(m, 4)) * 2
        if full:  # any within-component covariance
            a = rng.normal(size=(4, 4))
            prob = dn.DenoisingProblem(np.full(m, 1.0 / m), means, xi=1.0, cov=0.3 * a @ a.T + 0.1 * np.eye(4))
        else:
            prob = dn.DenoisingProblem(np.full(m, 1.0 / m), means, 0.6, 1.0)
        x, z = prob.sample(key=jax.random.key(m), n_samples=200_000)
        loss = np.sum((np.asarray(x) - np.asarray(prob.bayes(z))) ** 2, -1)
        assert abs(float(prob.bayes_risk()) - loss.mean()) < 5 * loss.std() / np.sqrt(loss.size)


# ----------------------------------------------------------------------------- pytree


def test_problem_is_a_pytree_under_jit():
    prob = dn.DenoisingProblem([0.5, 0.5], [[1.0, 0.0], [0.0, 1.0]], 1.0, 1.0)
    leaves, tree = jax.tree_util.tree_flatten(prob)
    assert len(leaves) == 4
    again = jax.tree_util.tree_unflatten(tree, leaves)
    z = jnp.ones((2, 2))
    np.testing.assert_allclose(jax.jit(lambda p: p.bayes(z))(again), prob.bayes(z))
    g = jax.grad(lambda xi: dn.DenoisingProblem(prob.weights, prob.means, prob.gamma, xi).bayes(z).sum())(1.0)
    assert np.isfinite(float(g))
    with pytest.raises(Exception):
        prob.xi = 2.0  # frozen


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_problem_built_inside_jit_and_vmap(dtype):
    """Built from Python or numpy scalars inside a jit (their dtype conversion is staged out) and
    under vmap over tasks, as the chapters build one per prompt: the same denoiser as outside."""
    means = np.array([[[1.0, 0.0], [0.0, 1.0]], [[2.0, 0.0], [0.0, -1.0]]], dtype)
    weights = np.array([[0.3, 0.7], [0.5, 0.5]], dtype)
    z = jnp.ones((3, 2), dtype)

    def bayes(w, m):
        return dn.DenoisingProblem(w, m, 0.5, np.float64(1.0)).bayes(z)

    got = jax.jit(jax.vmap(bayes))(weights, means)
    for b in range(2):
        np.testing.assert_allclose(got[b], bayes(weights[b], means[b]), rtol=tol(dtype))


# ============================================================================ properties of random valid inputs


@SETTINGS
@given(prob=denoising_problems(), z=arrays((4, 3), -6.0, 6.0), far=st.sampled_from([1.0, 1e3]), seed=st.integers(0, 100))
def test_bayes_is_shrinkage_plus_convex_hull(prob, z, far, seed):
    z = (far * z[:, :prob.dim]).astype(prob.dtype)
    t = tol(prob.dtype)
    beta = np.asarray(prob.responsibilities(z), np.float64)
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
    np.testing.assert_allclose(relabelled.responsibilities(z), beta[:, perm], atol=10 * t)
    np.testing.assert_allclose(relabelled.bayes(z), f, atol=100 * t * scale)


@SETTINGS
@given(prob=denoising_problems(dtype=np.float64), key=st.integers(0, 2**31 - 1), c=floats(-1.0, 1.0),
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


# ============================================================================ invalid inputs


def _equal_rows(means):
    m = np.array(means)
    if m.shape[0] < 2:
        return st.just(m[None])  # a batch axis instead
    m[1] = m[0]
    return st.just(m)


@SETTINGS
@given(prob=denoising_problems(dtype=np.float64), data=st.data())
def test_problem_rejects_invalid(prob, data):
    args = dict(weights=np.asarray(prob.weights), means=np.asarray(prob.means),
                gamma=np.float64(prob.gamma), xi=np.float64(prob.xi))

    def zero(x):
        return st.just(np.zeros_like(x))

    spec = {"weights": Arg(extra=(negative_weights, unnormalised)),
            "means": Arg(fixed_axes=(0,), extra=(_equal_rows,)),
            "gamma": Arg(extra=(negative,)), "xi": Arg(extra=(negative, zero))}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: dn.DenoisingProblem(**bad), name)


@SETTINGS
@given(prob=denoising_problems(dtype=np.float64), data=st.data(),
       method=st.sampled_from(["responsibilities", "bayes"]))
def test_denoiser_rejects_invalid_queries(prob, data, method):
    name, bad = data.draw(corrupt(dict(z=np.zeros((2, prob.dim))), {"z": Arg(fixed_axes=(1,))}))
    assert_rejects(lambda: getattr(prob, method)(bad["z"]), name)


OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731


def _bad_fn(_):  # callables of a wrong output shape (a non-callable fails with Python's TypeError)
    return st.sampled_from([lambda y: jnp.sum(y), lambda y: y[:1], lambda y: jnp.concatenate([y, y], axis=-1)])


@SETTINGS
@given(prob=denoising_problems(dtype=np.float64), data=st.data())
def test_excess_and_bayes_risk_reject_invalid(prob, data):
    method = data.draw(st.sampled_from(["quadrature", "monte_carlo", "bayes_risk"]))
    not_none = lambda v: bad_positive_int(v).filter(lambda c: c is not None)  # noqa: E731
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
        spec.update(n_samples=OBJ(bad_positive_int, too_few))
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: prob.excess_risk(**bad), name)
