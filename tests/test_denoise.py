"""gmlib.denoise against independent computations (numpy/scipy formulas, Monte Carlo, least squares)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

import gmlib
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
    with pytest.raises(ValueError, match="key"):
        prob.sample(0, 10)
    with pytest.raises(ValueError, match="`n`"):
        prob.sample(jax.random.key(0), 0)


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
    with pytest.raises(ValueError, match="problem"):
        dn.two_head_bayes("not a problem")


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
    with pytest.raises(ValueError, match="problem"):
        dn.affine_optimum("not a problem")
    # float32 follows the problem's dtype
    p32 = dn.DenoisingProblem(np.float32([0.5, 0.5]), np.float32([[3.0, 0.0], [0.0, 3.0]]), np.float32(1.0),
                              np.float32(2.0))
    A32, b32 = dn.affine_optimum(p32)
    assert A32.dtype == b32.dtype == jnp.float32
    np.testing.assert_allclose(A32, A, atol=1e-5)


def test_bayes_risk_against_monte_carlo():
    rng = np.random.default_rng(9)
    for m in (1, 2, 3):
        prob = dn.DenoisingProblem(np.full(m, 1.0 / m), rng.normal(size=(m, 4)) * 2, 0.6, 1.0)
        x, _ = prob.clean.sample(jax.random.key(m), 200_000)
        z = x + jax.random.normal(jax.random.key(10 + m), x.shape)
        loss = np.sum((np.asarray(x) - np.asarray(prob.bayes(z))) ** 2, -1)
        assert abs(float(prob.bayes_risk()) - loss.mean()) < 5 * loss.std() / np.sqrt(loss.size)


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


def test_in_context_params_validation():
    with pytest.raises(ValueError, match="xi"):
        dn.in_context_params(1.0, 0.0, 2)
    with pytest.raises(ValueError, match="gamma"):
        dn.in_context_params(-1.0, 1.0, 2)
    with pytest.raises(ValueError, match="dim"):
        dn.in_context_params(1.0, 1.0, 0)


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
    with pytest.raises(ValueError, match="lam"):
        dn.tanh_fixed_point(-1.0)
    with pytest.raises(ValueError, match="n_steps"):
        dn.iterate(jnp.tanh, jnp.zeros(2), 0)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(weights=[0.5, 0.6]), "weights"),
        (dict(weights=[1.0, 0.0]), "weights"),
        (dict(weights=[1.5, -0.5]), "weights"),
        (dict(means=[[1.0, 0.0], [1.0, 0.0]]), "distinct"),
        (dict(means=[[np.nan, 0.0], [1.0, 0.0]]), "means"),
        (dict(means=[1.0, 0.0]), "means"),
        (dict(gamma=-0.1), "gamma"),
        (dict(gamma=np.inf), "gamma"),
        (dict(xi=0.0), "xi"),
        (dict(xi=-1.0), "xi"),
        (dict(xi=[1.0, 2.0]), "xi"),
    ],
)
def test_problem_validation(kwargs, match):
    args = dict(weights=[0.5, 0.5], means=[[1.0, 0.0], [0.0, 1.0]], gamma=1.0, xi=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        dn.DenoisingProblem(**args)


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
