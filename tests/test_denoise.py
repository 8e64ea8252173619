"""gmlib.denoise: against independent computations (numpy/scipy formulas, Monte Carlo, least squares),
then properties of random valid inputs, then the invalid inputs (ValueError naming the argument).

Properties: the posterior is a probability vector, relabelling the components permutes it and
leaves the denoiser unchanged, and the Bayes denoiser is eq 10's "shrinkage plus convex hull":
f*(z) = (γ²/s) z + (ξ²/s) Σ β_k(z) m_k, so that (f*(z) − (γ²/s) z)/(ξ²/s) lies in the convex
hull of the means — also at γ = 0, for tiny ξ and for queries far from the data. two_head_bayes's
heads summed by multi_head_attention on the noisy prompt are the Bayes denoiser (Thm 4.1);
single_head_bayes is exact when γ = ξ (and refuses γ ≠ ξ > 0); linear_optimum and affine_optimum
are the shrinkages of M₂ and Cov X; the gaps and excess_risk are ≥ 0; in_context_denoise with
in_context_params is the task's Bayes denoiser (Prop 4.4); iterate's steps are f applied.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import special, stats
from strategies import (
    DTYPES,
    SETTINGS,
    SHAPES,
    Arg,
    arrays,
    assert_rejects,
    bad_positive_int,
    corrupt,
    empty_rows,
    floats,
    negative,
    negative_weights,
    tol,
    unnormalised,
)

import gmlib
from gmlib import population_attention, softmax_attention
from gmlib import denoise as dn


def random_equal_norm_problem(rng, d, gamma=None, opposite=False, dtype=np.float64):
    r = rng.uniform(0.5, 3.0)
    m1 = rng.normal(size=d)
    m2 = -m1 if opposite else rng.normal(size=d)
    means = np.stack([m1 / np.linalg.norm(m1), m2 / np.linalg.norm(m2)]) * r
    p1 = rng.uniform(0.1, 0.9)
    gamma = rng.uniform(0.2, 2.0) if gamma is None else gamma
    xi = rng.uniform(0.3, 2.0)
    return dn.DenoisingProblem(np.array([p1, 1 - p1], dtype), means.astype(dtype), dtype(gamma), dtype(xi))


def numpy_bayes(weights, means, gamma, xi, z):
    """E[X | Z = z] by Bayes' rule with scipy densities and Gaussian conditioning per component."""
    d = means.shape[1]
    s = gamma**2 + xi**2
    logd = np.stack([np.log(w) + stats.multivariate_normal(m, s * np.eye(d)).logpdf(z)
                     for w, m in zip(weights, means)], -1)
    post = np.exp(logd - special.logsumexp(logd, axis=-1, keepdims=True))
    cond = [m + gamma**2 / s * (z - m) for m in means]  # E[X | Z, C = k]
    return sum(post[:, [k]] * cond[k] for k in range(len(weights)))


# ----------------------------------------------------------------------------- the Bayes denoiser


def test_bayes_matches_scipy_formula_any_means():
    rng = np.random.default_rng(0)
    weights = np.array([0.2, 0.5, 0.3])
    means = rng.normal(size=(3, 3)) * 2  # unequal norms, three components
    prob = dn.DenoisingProblem(weights, means, 0.8, 1.3)
    z = rng.normal(size=(40, 3)) * 3
    expected = numpy_bayes(weights, means, 0.8, 1.3, z)
    np.testing.assert_allclose(jax.jit(lambda p, q: p.bayes(q))(prob, z), expected, atol=1e-12)
    post = prob.posterior(z)
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
    x, _ = prob.clean.sample(jax.random.key(0), 400_000)
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


def test_degenerate_gamma_zero_is_posterior_barycenter():
    means = np.array([[0.0, 3.0], [0.0, -3.0]])
    prob = dn.DenoisingProblem([0.5, 0.5], means, 0.0, 2.0)
    z = np.random.default_rng(2).normal(size=(20, 2)) * 3
    c, delta = means.mean(0), (means[0] - means[1]) / 2
    expected = c + delta * np.tanh((z - c) @ delta / 4.0)[:, None]  # Prop 4.3's closed form
    np.testing.assert_allclose(prob.bayes(z), expected, atol=1e-13)
    assert float(dn.separation(prob)) == pytest.approx(1.5)


def test_sample_draws_clean_points_and_independent_noise():
    prob = dn.DenoisingProblem([0.3, 0.7], [[3.0, 0.0], [0.0, -2.0]], 0.6, 1.5)
    n = 400_000
    x, z = prob.sample(jax.random.key(0), n)
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
    np.testing.assert_array_equal(prob.sample(jax.random.key(0), 5)[1], prob.sample(jax.random.key(0), 5)[1])
    np.testing.assert_allclose(np.cov(np.asarray(z).T), np.asarray(prob.noisy.covariance()), atol=0.04)
    # (a bad key or size is refused by jax.random itself; n = 0 gives empty draws)


# ----------------------------------------------------------------------------- head constructions


@pytest.mark.parametrize("seed", range(6))
def test_two_heads_equal_bayes_on_random_problems(seed):
    rng = np.random.default_rng(10 + seed)
    d = int(rng.integers(2, 6))
    for gamma, opposite in ((None, False), (None, True), (0.0, False), (0.0, True)):
        prob = random_equal_norm_problem(rng, d, gamma, opposite)
        z = rng.normal(size=(64, d)) * 4
        heads = dn.two_head_bayes(prob)
        out = dn.multi_head_attention(prob.noisy, z, heads)
        # independent: the population attention of each head is checked against the scipy posterior
        np.testing.assert_allclose(out, numpy_bayes(np.asarray(prob.weights), np.asarray(prob.means),
                                                    float(prob.gamma), float(prob.xi), z), atol=1e-10)


def test_two_heads_float32_jit_and_vmap():
    rng = np.random.default_rng(3)
    prob = random_equal_norm_problem(rng, 3, dtype=np.float32)
    heads = jax.jit(dn.two_head_bayes)(prob)
    assert heads[0][0].dtype == jnp.float32
    z = rng.normal(size=(16, 3)).astype(np.float32)
    np.testing.assert_allclose(dn.multi_head_attention(prob.noisy, z, heads), prob.bayes(z), atol=2e-5)
    # vmap over a batch of problems (stacked pytrees)
    probs = [random_equal_norm_problem(rng, 3) for _ in range(4)]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *probs)
    z64 = rng.normal(size=(8, 3))
    outs = jax.vmap(lambda p: dn.multi_head_attention(p.noisy, z64, dn.two_head_bayes(p)) - p.bayes(z64))(stacked)
    assert float(jnp.abs(outs).max()) < 1e-10


def test_single_head_cases_and_obstructions():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(32, 3)) * 3
    # gamma = xi
    prob = dn.DenoisingProblem([0.2, 0.8], [[2.0, 0.0, 0.0], [0.0, 0.0, 2.0]], 1.1, 1.1)
    U, V = dn.single_head_bayes(prob)
    np.testing.assert_allclose(gmlib.population_attention(prob.noisy, z, U, V), prob.bayes(z), atol=1e-12)
    # gamma = 0: opposite means (Prop C.3), and any means when d >= 3
    for means in ([[1.0, 2.0, 0.5], [-1.0, -2.0, -0.5]], [[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]]):
        prob = dn.DenoisingProblem([0.35, 0.65], means, 0.0, 0.8)
        U, V = dn.single_head_bayes(prob)
        expected = numpy_bayes(np.array([0.35, 0.65]), np.array(means), 0.0, 0.8, z)
        np.testing.assert_allclose(gmlib.population_attention(prob.noisy, z, U, V), expected, atol=1e-12)
    prob2 = dn.DenoisingProblem([0.5, 0.5], [[0.0, 3.0], [0.0, -3.0]], 0.0, 2.0)
    U, V = dn.single_head_bayes(prob2)
    np.testing.assert_allclose(gmlib.population_attention(prob2.noisy, z[:, :2], U, V), prob2.bayes(z[:, :2]),
                               atol=1e-12)
    with pytest.raises(ValueError, match="Prop C.4"):
        dn.single_head_bayes(dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], 1.0, 2.0))
    with pytest.raises(ValueError, match="Prop C.3"):
        dn.single_head_bayes(dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], 0.0, 2.0))


def test_constructions_reject_bad_problems():
    with pytest.raises(ValueError, match="equal norms"):
        dn.two_head_bayes(dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 2.0]], 1.0, 2.0))
    with pytest.raises(ValueError, match="M = 2"):
        dn.two_head_bayes(dn.DenoisingProblem([0.2, 0.3, 0.5], [[1.0, 0], [0, 1.0], [-1.0, 0]], 1.0, 2.0))
    with pytest.raises(ValueError, match="d >= 2"):
        dn.two_head_bayes(dn.DenoisingProblem([0.5, 0.5], [[1.0], [-1.0]], 1.0, 2.0))


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
    val, se = prob.excess_risk(lambda z: dn.multi_head_attention(prob.noisy, z, heads), key=jax.random.key(0),
                               n_samples=1000, with_stderr=True)
    assert abs(float(val)) < 1e-18 and float(se) < 1e-18
    with pytest.raises(ValueError, match="key"):
        prob.excess_risk(lambda z: z)
    with pytest.raises(ValueError, match="method"):
        prob.excess_risk(lambda z: z, method="simpson")
    with pytest.raises(ValueError, match=r"\(n, d\)"):
        dn.DenoisingProblem([1.0], [[0.0, 0.0]], 1.0, 1.0).excess_risk(lambda z: z[:, :1])


def test_excess_risk_is_differentiable():
    prob = dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], 1.0, 2.0)

    def risk(theta):
        heads = [(theta[0], theta[1]), (theta[2], theta[3])]
        return prob.excess_risk(lambda z: dn.multi_head_attention(prob.noisy, z, heads), n_nodes=20)

    theta = 0.3 * jnp.asarray(np.random.default_rng(6).normal(size=(4, 2, 2)))
    g = jax.jit(jax.grad(risk))(theta)
    direction = jnp.asarray(np.random.default_rng(7).normal(size=(4, 2, 2)))
    eps = 1e-6
    fd = (risk(theta + eps * direction) - risk(theta - eps * direction)) / (2 * eps)
    assert abs(float(jnp.sum(g * direction)) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))
    # at the construction the risk and its gradient vanish
    (U1, V1), (U2, V2) = dn.two_head_bayes(prob)
    star = jnp.stack([U1, V1, U2, V2])
    assert float(risk(star)) < 1e-20
    assert float(jnp.abs(jax.grad(risk)(star)).max()) < 1e-9


def test_linear_optimum_is_least_squares():
    rng = np.random.default_rng(8)
    weights = np.array([0.25, 0.75])
    means = rng.normal(size=(2, 3)) * 2
    prob = dn.DenoisingProblem(weights, means, 0.7, 1.2)
    x, _ = prob.clean.sample(jax.random.key(2), 400_000)
    z = np.asarray(x) + 1.2 * np.asarray(jax.random.normal(jax.random.key(3), x.shape))
    coef, *_ = np.linalg.lstsq(z, np.asarray(x), rcond=None)  # x ≈ z @ coef, so A = coef.T
    np.testing.assert_allclose(dn.linear_optimum(prob), coef.T, atol=0.01)
    # closed form of the gap against the quadrature excess risk of z -> A* z, and against Monte Carlo
    A = dn.linear_optimum(prob)
    gap = float(dn.linear_gap(prob))
    quad = prob.excess_risk(lambda q: q @ A.T)
    assert abs(gap - float(quad)) < 1e-9
    loss = np.sum((np.asarray(x) - z @ np.asarray(A).T) ** 2, -1) - np.sum((np.asarray(x) - np.asarray(prob.bayes(z))) ** 2, -1)
    assert abs(loss.mean() - gap) < 5 * loss.std() / np.sqrt(loss.size)
    assert gap > 0


def numpy_affine_optimum(weights, means, gamma, xi):
    """Cov(X, Z) Cov(Z)^-1 and E X - A E Z, from the moments of the mixture written out in numpy."""
    mean = weights @ means
    cov = gamma**2 * np.eye(means.shape[1]) + (weights[:, None] * (means - mean)).T @ (means - mean)
    A = np.linalg.solve(cov + xi**2 * np.eye(len(mean)), cov).T  # Cov(X, Z) = Cov(X), Cov(Z) = Cov(X) + xi^2 I
    return A, mean - A @ mean


@pytest.mark.parametrize("m, d", [(2, 2), (3, 3)])
def test_affine_optimum_is_least_squares_with_an_intercept(m, d):
    rng = np.random.default_rng(20 + m)
    weights = rng.dirichlet(np.ones(m))
    means = rng.normal(size=(m, d)) * 2 + 1.0  # unequal norms, E X far from 0
    prob = dn.DenoisingProblem(weights, means, 0.7, 1.2)
    A, b = dn.affine_optimum(prob)
    assert A.shape == (d, d) and b.shape == (d,)
    A_np, b_np = numpy_affine_optimum(weights, means, 0.7, 1.2)
    np.testing.assert_allclose(A, A_np, atol=1e-12)
    np.testing.assert_allclose(b, b_np, atol=1e-12)
    x, z = prob.sample(jax.random.key(m), 400_000)
    x, z = np.asarray(x), np.asarray(z)
    design = np.concatenate([z, np.ones((len(z), 1))], axis=1)
    coef, *_ = np.linalg.lstsq(design, x, rcond=None)  # x ≈ z @ A.T + b
    np.testing.assert_allclose(A, coef[:d].T, atol=0.01)
    np.testing.assert_allclose(b, coef[d], atol=0.02)
    # the gap: closed form against the quadrature excess risk of z -> Az + b and the sample risk difference
    gap = float(dn.affine_gap(prob, n_nodes=4001 if m == 2 else 200))  # fine rules: the M = 3 gates are steep
    assert abs(gap - float(prob.excess_risk(lambda q: q @ A.T + b, n_nodes=80 if d == 2 else 90))) < 1e-8
    loss = np.sum((x - z @ np.asarray(A).T - np.asarray(b)) ** 2, -1) - np.sum((x - np.asarray(prob.bayes(z))) ** 2, -1)
    assert abs(loss.mean() - gap) < 5 * loss.std() / np.sqrt(loss.size)
    # the intercept helps: the affine gap is below the linear one, by xi^2 (tr A_lin - tr A_aff) > 0
    lin = float(dn.linear_gap(prob, n_nodes=4001 if m == 2 else 200))
    assert 0 < gap < lin
    np.testing.assert_allclose(lin - gap, 1.44 * (np.trace(dn.linear_optimum(prob)) - np.trace(A_np)), rtol=1e-9)


def test_affine_gap_in_the_figure_2_setting_and_special_cases():
    prob = dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], 1.0, 2.0)
    # the values the issue quotes (0.126 against 1.642), now from the independent numpy optimum
    A, b = numpy_affine_optimum(np.array([0.5, 0.5]), np.array([[3.0, 0.0], [0.0, 3.0]]), 1.0, 2.0)
    assert float(dn.affine_gap(prob)) == pytest.approx(float(prob.excess_risk(lambda q: q @ A.T + b)), abs=1e-9)
    assert float(dn.affine_gap(prob)) == pytest.approx(0.126, abs=5e-4)
    assert float(dn.linear_gap(prob)) == pytest.approx(1.642, abs=5e-4)
    # one component: the Bayes denoiser is affine, (gamma^2/s) z + (xi^2/s) m, and the gap vanishes
    one = dn.DenoisingProblem([1.0], [[2.0, -1.0]], 0.8, 1.5)
    A1, b1 = dn.affine_optimum(one)
    s = 0.8**2 + 1.5**2
    np.testing.assert_allclose(A1, 0.8**2 / s * np.eye(2), atol=1e-14)
    np.testing.assert_allclose(b1, 1.5**2 / s * np.array([2.0, -1.0]), atol=1e-14)
    assert abs(float(dn.affine_gap(one))) < 1e-12
    # E X = 0 (opposite means, balanced): the intercept is 0 and the two gaps coincide
    sym = dn.DenoisingProblem([0.5, 0.5], [[2.0, 1.0], [-2.0, -1.0]], 1.0, 1.0)
    A2, b2 = dn.affine_optimum(sym)
    np.testing.assert_allclose(b2, 0.0, atol=1e-14)
    np.testing.assert_allclose(A2, dn.linear_optimum(sym), atol=1e-14)
    assert float(dn.affine_gap(sym)) == pytest.approx(float(dn.linear_gap(sym)), abs=1e-14)
    # float32 follows the problem's dtype
    p32 = dn.DenoisingProblem(np.float32([0.5, 0.5]), np.float32([[3.0, 0.0], [0.0, 3.0]]), np.float32(1.0),
                              np.float32(2.0))
    A32, b32 = dn.affine_optimum(p32)
    assert A32.dtype == b32.dtype == jnp.float32
    np.testing.assert_allclose(A32, A, atol=1e-5)


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
        x, z = prob.sample(jax.random.key(m), 200_000)
        loss = np.sum((np.asarray(x) - np.asarray(prob.bayes(z))) ** 2, -1)
        assert abs(float(prob.bayes_risk()) - loss.mean()) < 5 * loss.std() / np.sqrt(loss.size)


def test_gaps_with_a_full_covariance_match_the_quadrature_excess_risk():
    cov = np.array([[1.0, 0.6], [0.6, 0.5]])
    prob = dn.DenoisingProblem([0.3, 0.7], [[3.0, 0.0], [-1.0, 2.0]], xi=1.5, cov=cov)
    A, b = dn.affine_optimum(prob)
    mean = np.array([0.3, 0.7]) @ np.array([[3.0, 0.0], [-1.0, 2.0]])
    spread = np.cov(np.array([[3.0, 0.0], [-1.0, 2.0]]).T, aweights=[0.3, 0.7], bias=True)
    cov_x = cov + spread  # Cov X = Gamma + the spread of the means
    A_full = np.linalg.solve(cov_x + 2.25 * np.eye(2), cov_x).T
    np.testing.assert_allclose(A, A_full, atol=1e-12)
    np.testing.assert_allclose(b, mean - A_full @ mean, atol=1e-12)
    for gap, f in ((dn.affine_gap(prob), lambda q: q @ A.T + b),
                   (dn.linear_gap(prob), lambda q: q @ dn.linear_optimum(prob).T)):
        assert abs(float(gap) - float(prob.excess_risk(f, n_nodes=120))) < 1e-9


# ----------------------------------------------------------------------------- in context


def test_in_context_population_equals_bayes_for_random_tasks():
    rng = np.random.default_rng(11)
    params = dn.in_context_params(0.7, 1.3, 3)
    z = rng.normal(size=(50, 3)) * 3
    for _ in range(5):
        prob = random_equal_norm_problem(rng, 3)
        prob = dn.DenoisingProblem(prob.weights, prob.means, 0.7, 1.3)
        out = dn.in_context_denoise(params, prob.noisy, z)
        expected = numpy_bayes(np.asarray(prob.weights), np.asarray(prob.means), 0.7, 1.3, z)
        np.testing.assert_allclose(out, expected, atol=1e-10)


def test_in_context_finite_prompt_converges():
    prob = dn.DenoisingProblem([0.3, 0.7], [[0.0, 2.0], [2.0, 0.0]], 0.5, 1.0)
    params = dn.in_context_params(0.5, 1.0, 2)
    z = np.array([[0.5, 0.5], [1.0, -1.0]])
    tokens, _ = prob.noisy.sample(jax.random.key(0), 200_000)
    out = dn.in_context_denoise(params, tokens, z, block_size=50_000)
    np.testing.assert_allclose(out, prob.bayes(z), atol=0.03)
    # manual: the residual heads and the output map, written out
    t = np.asarray(tokens)
    scores = t @ (z / 1.25).T
    w = np.exp(scores - scores.max(0))
    head = (w.T @ t) / w.sum(0)[:, None] * 0.8
    np.testing.assert_allclose(out, (z + head) - 1.6 * z, atol=1e-10)


# ----------------------------------------------------------------------------- iterated denoiser


def test_iterate_and_fixed_point():
    traj = dn.iterate(lambda u: jnp.tanh(2.0 * u), jnp.array([0.3, -0.8]), 5)
    manual = [np.array([0.3, -0.8])]
    for _ in range(5):
        manual.append(np.tanh(2.0 * manual[-1]))
    np.testing.assert_allclose(traj, np.stack(manual), atol=1e-15)
    lams = np.array([0.5, 1.0, 1.05, 1.2, 1.5, 2.0, 3.0, 6.0])
    u = dn.tanh_fixed_point(lams)
    long = np.asarray(dn.iterate(lambda v: jnp.tanh(jnp.asarray(lams) ** 2 * v), jnp.ones(len(lams)), 20_000)[-1])
    np.testing.assert_allclose(u[lams != 1.0], long[lams != 1.0], atol=1e-12)
    assert u[0] == 0.0 and u[1] == 0.0 and np.all(u[2:] > 0) and np.all(u < 1 + 1e-15)
    np.testing.assert_allclose(np.tanh(lams**2 * u), u, atol=1e-15)


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

SHAPES = SHAPES["mixture"]  # (M, d)


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

    spec = {"weights": Arg(extra=(negative_weights, unnormalised)),
            "means": Arg(fixed_axes=(0,), extra=(_equal_rows,)),
            "gamma": Arg(extra=(negative,)), "xi": Arg(extra=(negative, zero))}
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
    # gamma and xi are host scalars (C.scalar): any real dtype, float128 included, is fine.
    scalar = Arg(dtype=False, extra=(negative,))
    spec = {"gamma": scalar, "xi": scalar,
            "dim": Arg(rank=False, finite=False, dtype=False, extra=(bad_positive_int,))}
    name, bad = data.draw(corrupt(dict(gamma=np.float64(0.5), xi=np.float64(1.0), dim=2), spec))
    assert_rejects(lambda: dn.in_context_params(**bad), name)


# ---------------------------------------------------------------------------- heads, optima, in context, iterates


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


# ============================================================================ invalid inputs


OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data(),
       fn=st.sampled_from(["two_head_bayes", "single_head_bayes", "separation"]))
def test_constructions_reject_invalid(prob, data, fn):
    """M ≠ 2, d < 2 (two heads) or unequal norms: ValueError naming `problem`/`means`.

    (An object that is not a DenoisingProblem fails with Python's AttributeError: not checked.)"""
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
    fn = data.draw(st.sampled_from(["linear_gap", "affine_gap"]))  # the optima take only `problem`
    args = dict(problem=prob, n_nodes=20)
    spec = {"n_nodes": OBJ(lambda v: bad_positive_int(v).filter(lambda c: c is not None))}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: getattr(dn, fn)(**bad), name)


def _bad_fn(_):  # callables of a wrong output shape (a non-callable fails with Python's TypeError)
    return st.sampled_from([lambda y: jnp.sum(y), lambda y: y[:1], lambda y: jnp.concatenate([y, y], axis=-1)])


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
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


@SETTINGS
@given(prob=equal_norm_problems(dtype=np.float64), data=st.data(), finite=st.booleans())
def test_multi_head_attention_rejects_invalid(prob, data, finite):
    heads = [tuple(np.asarray(m) for m in h) for h in dn.two_head_bayes(prob)]
    prompt = np.asarray(prob.noisy.sample(jax.random.key(0), 8)[0]) if finite else prob.noisy

    def bad_heads(h):  # (a non-sequence, or entries that are not pairs, fail in Python's unpacking)
        return st.sampled_from([[], [(h[0][0][:1], h[0][1])], [(h[0][0], h[0][1][:, :1])],
                                [(np.full_like(h[0][0], np.nan), h[0][1])], [(h[0][0], h[0][1].astype(complex))]])

    args = dict(prompt=prompt, queries=np.zeros((2, prob.dim)), heads=heads)
    spec = {"queries": Arg(fixed_axes=(1,)), "heads": OBJ(bad_heads),
            "prompt": Arg(extra=(empty_rows,)) if finite else OBJ(lambda _: st.sampled_from([None, "mu", 3.0]))}
    name, bad = data.draw(corrupt(args, spec))
    # the heads and the prompt are checked by the attention functions, under their names
    also = {"heads": ("U", "V"), "prompt": ("tokens", "mixture")}.get(name, ())
    assert_rejects(lambda: dn.multi_head_attention(**bad), name, *also)


@SETTINGS
@given(prob=equal_norm_problems(dtype=np.float64), data=st.data(), finite=st.booleans())
def test_in_context_denoise_rejects_invalid(prob, data, finite):
    d = prob.dim
    params = dn.in_context_params(prob.gamma, prob.xi, d)
    prompt = np.asarray(prob.noisy.sample(jax.random.key(0), 8)[0]) if finite else prob.noisy
    leaves = {f"params.{k}": np.asarray(v) for k, v in zip(dn.InContextParams._fields, params)}
    if data.draw(st.booleans()):
        spec = {k: Arg(fixed_axes=(1,) if k.endswith("W_out") else (0, 1)) for k in leaves}
        name, bad = data.draw(corrupt(leaves, spec))
        p = dn.InContextParams(*(bad[f"params.{k}"] for k in dn.InContextParams._fields))
        assert_rejects(lambda: dn.in_context_denoise(p, prompt, np.zeros((2, d))), name)
    else:
        spec = {"queries": Arg(fixed_axes=(1,)),
                "prompt": Arg(extra=(empty_rows,)) if finite else OBJ(lambda _: st.sampled_from([None, "mu"]))}
        name, bad = data.draw(corrupt(dict(prompt=prompt, queries=np.zeros((2, d))), spec))
        # an empty prompt is refused by softmax_attention, naming its `tokens`
        assert_rejects(lambda: dn.in_context_denoise(params, **bad), name, *(("tokens",) if name == "prompt" else ()))


@SETTINGS
@given(data=st.data(), shape=st.sampled_from([(2, 2), (3,)]))
def test_iterate_rejects_invalid(data, shape):
    # (an f that changes the shape or dtype is refused by lax.scan: not checked again)
    spec = {"z0": Arg(rank=False, dtype=True), "n_steps": OBJ(bad_positive_int)}
    name, bad = data.draw(corrupt(dict(f=jnp.tanh, z0=np.full(shape, 0.5), n_steps=3), spec))
    assert_rejects(lambda: dn.iterate(**bad), name)


@SETTINGS
@given(data=st.data(), lam=st.sampled_from([np.float64(1.5), np.array([0.5, 2.0])]))
def test_tanh_fixed_point_rejects_invalid(data, lam):
    # (a float128 lam is merely rounded to float64: a host function, not refused; a ragged list
    # is refused by numpy's own ValueError, "inhomogeneous shape")
    def not_real(_):
        return st.sampled_from(["2", None, [1.0, "a"], 1j, np.array([1.0 + 1j]), np.array(["1.5"])])

    spec = {"lam": Arg(rank=False, dtype=False, extra=(negative, not_real))}
    name, bad = data.draw(corrupt(dict(lam=lam), spec))
    assert_rejects(lambda: dn.tanh_fixed_point(**bad), name)
