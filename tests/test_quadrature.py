"""gmlib.quadrature against closed forms, Monte Carlo and finite differences; its invariants and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import (
    DTYPES,
    SETTINGS,
    Arg,
    arrays,
    assert_rejects,
    bad_fn,
    bad_positive_int,
    corrupt,
    empty_rows,
    keys,
    mixtures,
    relabel,
    singular_mixture,
    tol,
    unequal_mixture,
)

from gmlib import GaussianMixture, gauss_hermite, mixture_expectation, monte_carlo_expectation
from gmlib._pytree import unchecked

RNG = np.random.default_rng(0)


def _double_factorial(k):
    return float(np.prod(np.arange(k, 0, -2))) if k > 0 else 1.0


# ---------------------------------------------------------------------------- Gauss-Hermite


@pytest.mark.smoke
def test_gauss_hermite_moments():
    nodes, weights = gauss_hermite(n_nodes=8, dim=2)
    assert nodes.shape == (64, 2) and abs(float(weights.sum()) - 1) < 1e-14
    # E[x^4 y^2] = 3 * 1 under N(0, I): exact for degree <= 15
    np.testing.assert_allclose(weights @ (nodes[:, 0] ** 4 * nodes[:, 1] ** 2), 3.0, rtol=1e-13)


def test_gauss_hermite_at_its_largest_rule():
    """n_nodes = 256 (the cap): finite, positive weights, exact Gaussian moments; 257 is refused."""
    x, w = (np.asarray(a) for a in gauss_hermite(n_nodes=256))
    x = x[:, 0]
    assert np.all(np.isfinite(x)) and np.all(w >= 0)
    np.testing.assert_allclose([w @ x**2, w @ x**4, w @ np.cos(x)], [1.0, 3.0, np.exp(-0.5)], rtol=1e-12)
    assert_rejects(lambda: gauss_hermite(n_nodes=257), "n_nodes")


@SETTINGS
@given(n_nodes=st.integers(1, 40), dim=st.sampled_from([1, 2, 3]), dtype=st.sampled_from([None, *DTYPES]))
def test_gauss_hermite_rule_is_exact_to_degree_2n_minus_1(n_nodes, dim, dtype):
    """Positive weights summing to one, symmetric nodes, exact Gaussian moments up to degree 2 n - 1."""
    assume(n_nodes**dim <= 20_000)
    nodes, weights = gauss_hermite(n_nodes=n_nodes, dim=dim, dtype=dtype)
    x, w = np.asarray(nodes, np.float64), np.asarray(weights, np.float64)
    assert x.shape == (n_nodes**dim, dim) and w.shape == (n_nodes**dim,)
    assert np.all(np.isfinite(x)) and np.all(w >= 0)
    t = 1e-12 if dtype in (None, np.float64) else 1e-5
    assert abs(w.sum() - 1) < 10 * t
    np.testing.assert_allclose(np.sort(x[:, 0]), np.sort(-x[:, 0]), atol=t * (1 + np.abs(x).max()))
    for deg in range(0, min(2 * n_nodes - 1, 12) + 1, 2):  # E[x^deg] = (deg - 1)!!
        np.testing.assert_allclose(w @ x[:, 0] ** deg, _double_factorial(deg - 1), rtol=1e3 * t)


# ---------------------------------------------------------------------------- expectations


def test_mixture_expectation_exact_for_a_quadratic():
    """E[(a1.x)(a2.x)] = a1^T E[x x^T] a2, exactly for a polynomial of degree 2."""
    mix = unequal_mixture()
    A = RNG.normal(size=(2, 3))
    est = mixture_expectation(mix, lambda y: y[:, 0] * y[:, 1], projection=A, n_nodes=4)
    np.testing.assert_allclose(est, A[0] @ np.asarray(mix.second_moment()) @ A[1], rtol=1e-12)


@pytest.mark.smoke
def test_mixture_expectation_against_monte_carlo():
    """A smooth non-polynomial function: converged quadrature within 5 standard errors of Monte Carlo."""
    mix = unequal_mixture()
    A = RNG.normal(size=(2, 3))
    fn = lambda y: jnp.tanh(y[:, 0]) * jnp.cos(y[:, 1])  # noqa: E731
    quad = mixture_expectation(mix, fn, projection=A, n_nodes=40)
    np.testing.assert_allclose(quad, mixture_expectation(mix, fn, projection=A, n_nodes=60), atol=1e-10)
    mean, se = monte_carlo_expectation(mix, fn, A, key=jax.random.key(5), n_samples=400_000)
    assert abs(float(mean - quad)) < 5 * float(se)


def test_mixture_expectation_on_a_singular_mixture():
    full = mixture_expectation(singular_mixture(), lambda y: y[:, 2] ** 2 + y[:, 0], n_nodes=6)
    np.testing.assert_allclose(full, 1.0 + 0.6 * 1.0 + 0.4 * -0.5, rtol=1e-12)


def test_mixture_expectation_nearly_singular():
    rot = np.linalg.qr(RNG.normal(size=(3, 3)))[0]
    covs = np.stack([rot @ np.diag([1.0, 1e-6, 1e-12]) @ rot.T, rot.T @ np.diag([2.0, 1e-10, 0.0]) @ rot])
    mix = GaussianMixture([0.4, 0.6], RNG.normal(size=(2, 3)), 0.5 * (covs + np.swapaxes(covs, -1, -2)))
    A = RNG.normal(size=(2, 3))
    np.testing.assert_allclose(mixture_expectation(mix, lambda y: y[:, 0] * y[:, 1], projection=A, n_nodes=3),
                               A[0] @ np.asarray(mix.second_moment()) @ A[1], rtol=1e-12)


def _isotropic(scale_cov, m=(0.3, -0.2)):
    return unchecked(GaussianMixture, jnp.ones(1), jnp.asarray([m]), scale_cov * jnp.eye(len(m))[None])


def test_derivative_in_the_covariance_at_sigma_identity():
    """d/dσ E‖X‖² at Γ = σ I in D = 2 is exactly 2 (tr Γ = 2σ); it was NaN (eigh at a repeated eigenvalue)."""
    f = lambda s: mixture_expectation(_isotropic(s), lambda y: jnp.sum(y**2, axis=1), n_nodes=3)  # noqa: E731
    np.testing.assert_allclose(jax.grad(f)(1.3), 2.0, rtol=1e-13)
    np.testing.assert_allclose(jax.grad(jax.grad(f))(1.3), 0.0, atol=1e-12)


def test_derivatives_at_sigma2_identity_match_the_closed_form():
    """E[cos X1 e^{0.3 X2}] under N(m, σ²I) = cos(m1) e^{-σ²/2} e^{0.3 m2 + 0.045 σ²}: first and
    second derivatives in σ exact (against the closed form) and against finite differences."""
    m = (0.3, -0.2)

    def f(s):
        return mixture_expectation(_isotropic(s**2, m), lambda y: jnp.cos(y[:, 0]) * jnp.exp(0.3 * y[:, 1]),
                                   n_nodes=24)

    def exact(s):
        return np.cos(m[0]) * np.exp(-(s**2) / 2 + 0.3 * m[1] + 0.045 * s**2)

    s, h = 0.7, 1e-4
    d1 = (exact(s + h) - exact(s - h)) / (2 * h)
    d2 = (exact(s + h) - 2 * exact(s) + exact(s - h)) / h**2
    a = -1 + 0.09  # exact(s) = c e^{a s^2 / 2}: exact' = a s exact, exact'' = (a + a^2 s^2) exact
    np.testing.assert_allclose(jax.grad(f)(s), a * s * exact(s), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(jax.grad(f))(s), (a + a**2 * s**2) * exact(s), rtol=1e-10)
    np.testing.assert_allclose([jax.grad(f)(s), jax.grad(jax.grad(f))(s)], [d1, d2], rtol=1e-6)


def test_gradient_in_the_full_covariance_matches_finite_differences():
    """∂E/∂Γ at Γ = 0.49 I, entry by entry along symmetric directions."""
    def f(c):
        mix = unchecked(GaussianMixture, jnp.ones(1), jnp.asarray([[0.3, -0.2]]), c[None])
        return mixture_expectation(mix, lambda y: jnp.cos(y[:, 0]) * jnp.exp(0.3 * y[:, 1]), n_nodes=20)

    c = 0.49 * jnp.eye(2)
    g = np.asarray(jax.grad(f)(c))
    assert np.all(np.isfinite(g)) and np.all(np.isfinite(np.asarray(jax.hessian(f)(c))))
    for i, j in [(0, 0), (1, 1), (0, 1)]:
        E = np.zeros((2, 2))
        E[i, j] = E[j, i] = 1e-6
        fd = (f(c + E) - f(c - E)) / 2e-6
        np.testing.assert_allclose(g[i, j] + g[j, i] if i != j else g[i, j], fd, rtol=1e-7)


# ---------------------------------------------------------------------------- invariants (hypothesis)


def _five(y):  # (a1.x)(a2.x), a1.x, a2.x, 1, tanh(a1.x): one call, five expectations
    return jnp.stack([y[:, 0] * y[:, 1], y[:, 0], y[:, 1], jnp.ones_like(y[:, 0]), jnp.tanh(y[:, 0])], -1)


@SETTINGS
@given(mix=mixtures(), a=arrays((2, 3)), n_nodes=st.sampled_from([2, 5]))
def test_mixture_expectation_exact_for_quadratics(mix, a, n_nodes):
    """E[aᵀX], E[(a₁ᵀX)(a₂ᵀX)] and E[1] exactly; a bounded fn stays in its range."""
    A = a[:, :mix.dim].astype(mix.dtype)
    f = lambda v: np.asarray(v, np.float64)  # noqa: E731
    t = tol(mix.dtype)
    S = f(mix.second_moment())
    scale = 1 + np.abs(A).max() ** 2 * np.abs(S).max() * 9
    est = f(mixture_expectation(mix, _five, projection=A, n_nodes=n_nodes))
    np.testing.assert_allclose(est[0], f(A[0]) @ S @ f(A[1]), atol=100 * t * scale)
    np.testing.assert_allclose(est[1:3], f(A) @ f(mix.mean()), atol=100 * t * scale)
    np.testing.assert_allclose(est[3], 1.0, atol=10 * t)
    assert -1 - t <= est[4] <= 1 + t


@SETTINGS
@given(mix=mixtures(), a=arrays((2, 3)), seed=st.integers(0, 100))
def test_mixture_expectation_ignores_the_labels(mix, a, seed):
    A = a[:, :mix.dim].astype(mix.dtype)
    scale = 1 + np.abs(A).max() ** 2 * np.abs(np.asarray(mix.second_moment())).max() * 9
    est = mixture_expectation(mix, _five, projection=A, n_nodes=3)
    perm = np.random.default_rng(seed).permutation(mix.n_components)
    np.testing.assert_allclose(mixture_expectation(relabel(mix, perm), _five, projection=A, n_nodes=3), est,
                               atol=100 * tol(mix.dtype) * scale)


@SETTINGS
@given(mix=mixtures(), a=arrays((2, 3)))
def test_mixture_expectation_of_an_indicator_is_a_probability(mix, a):
    A = a[:, :mix.dim].astype(mix.dtype)
    prob = float(mixture_expectation(mix, lambda y: y[:, 0] > 0, projection=A, n_nodes=3))
    assert -tol(mix.dtype) <= prob <= 1 + tol(mix.dtype)


@SETTINGS
@given(mix=mixtures(), a=arrays((1, 3)), key=keys())
def test_monte_carlo_expectation_within_its_error(mix, a, key):
    """E[aᵀX] within 6 true standard errors (plus round-off); the same key gives the same estimate.

    The true one, from the mixture's moments: a rare component may be missed by all 256 draws,
    and then the estimated standard error misses its variance too.
    """
    A = a[:, :mix.dim].astype(mix.dtype)
    mean, se = (float(v) for v in monte_carlo_expectation(mix, lambda y: y[:, 0], A, key=key, n_samples=256))
    assert np.isfinite(mean) and np.isfinite(se) and se >= 0
    a64, w, m, c = (np.asarray(v, np.float64) for v in (A[0], mix.weights, mix.means, mix.covs))
    exact = float(w @ (m @ a64))
    var = float(w @ (np.einsum("i,kij,j->k", a64, c, a64) + (m @ a64) ** 2)) - exact**2
    slack = 10 * tol(mix.dtype) * (1 + abs(exact) + np.abs(m).max() * np.abs(a64).max() * 3)
    assert abs(mean - exact) <= 6 * np.sqrt(max(var, 0.0) / 256) + slack
    assert float(monte_carlo_expectation(mix, lambda y: y[:, 0], A, key=key, n_samples=256)[0]) == mean


# ---------------------------------------------------------------------------- bad input


QUAD_INT = Arg(rank=False, finite=False, dtype=False, extra=(bad_positive_int,))


@SETTINGS
@given(data=st.data())
def test_gauss_hermite_rejects_invalid(data):
    def bad_dtype(_):
        return st.sampled_from([np.int32, "banana", np.complex64, bool])

    def too_many(_):
        return st.sampled_from([10**6, 257])

    spec = {"n_nodes": Arg(rank=False, finite=False, dtype=False, extra=(bad_positive_int, too_many)),
            "dim": QUAD_INT, "dtype": Arg(rank=False, finite=False, dtype=False, extra=(bad_dtype,))}
    name, bad = data.draw(corrupt(dict(n_nodes=5, dim=2, dtype=None), spec))
    assert_rejects(lambda: gauss_hermite(**bad), name)


# (not a GaussianMixture, a non-callable fn or a bad key fail in Python or jax.random: not checked)
EXPECTATION_SPEC = {
    "fn": Arg(rank=False, finite=False, dtype=False, extra=(lambda v: bad_fn(v).filter(callable),)),
    "projection": Arg(fixed_axes=(1,), extra=(empty_rows,)),
}


@SETTINGS
@given(mix=mixtures(dtype=np.float64), data=st.data())
def test_mixture_expectation_rejects_invalid(mix, data):
    args = dict(mixture=mix, fn=lambda y: y[:, 0], projection=np.ones((1, mix.dim)), n_nodes=3)
    name, bad = data.draw(corrupt(args, {**EXPECTATION_SPEC, "n_nodes": QUAD_INT}))
    assert_rejects(lambda: mixture_expectation(**bad), name)


@SETTINGS
@given(mix=mixtures(dtype=np.float64), data=st.data())
def test_monte_carlo_expectation_rejects_invalid(mix, data):
    def too_few(_):
        return st.just(1)

    args = dict(mixture=mix, fn=lambda y: y[:, 0], key=jax.random.key(0), n_samples=16,
                projection=np.ones((1, mix.dim)))
    spec = {**EXPECTATION_SPEC, "n_samples": Arg(rank=False, finite=False, dtype=False, extra=(bad_positive_int, too_few))}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: monte_carlo_expectation(**bad), name)


@pytest.mark.parametrize("n_samples", [1, 0])
def test_monte_carlo_needs_two_samples(n_samples):
    with pytest.raises(ValueError, match="`n_samples` must be an integer >= 2"):
        monte_carlo_expectation(unequal_mixture(), lambda y: y[:, 0], key=jax.random.key(0), n_samples=n_samples)


# ---------------------------------------------------------------------------- the gated rule of the LDA risk


def _poly(y, p):
    """y1^2 + y1 y2 + p0 y2: E = C11 + mu1^2 + C12 + mu1 mu2 + p0 mu2 under N(mu, C)."""
    return y[:, 0] ** 2 + y[:, 0] * y[:, 1] + p[0] * y[:, 1]


@pytest.mark.parametrize("cov", [[[1.5, 0.4], [0.4, 0.8]], [[1.0, 2.0], [2.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]]])
def test_gated_expectation_of_a_polynomial_and_its_derivatives(cov):
    """Exact moments at full-rank, rank-one and zero C; the Stein-identity derivatives in mu and in a
    symmetric dC are the closed form's (finite there, where the rule's square roots are not differentiable)."""
    from gmlib.quadrature import _gated_expectation

    mu, cov, p = jnp.array([0.3, -0.7]), jnp.array(cov), jnp.array([0.5, 0.2, 0.4])
    f = jax.jit(lambda mu, cov, p: _gated_expectation(_poly, 96, mu, cov, p))
    exact = lambda mu, cov, p: cov[0, 0] + mu[0] ** 2 + cov[0, 1] + mu[0] * mu[1] + p[0] * mu[1]  # noqa: E731
    np.testing.assert_allclose(f(mu, cov, p), exact(mu, cov, p), atol=1e-12)
    tangents = (jnp.array([0.2, -1.0]), jnp.array([[0.3, -0.5], [-0.5, 0.7]]), jnp.array([1.0, 0.0, 0.0]))
    _, got = jax.jvp(f, (mu, cov, p), tangents)
    _, want = jax.jvp(exact, (mu, cov, p), tangents)
    np.testing.assert_allclose(got, want, atol=1e-12)
    g_mu = jax.grad(f)(mu, cov, p)
    np.testing.assert_allclose(g_mu, [2 * mu[0] + mu[1], mu[0] + p[0]], atol=1e-12)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_gated_expectation_resolves_a_steep_gate():
    """E[sigmoid(s0 + Y2)] with sd(Y2) = 100 (a step 1/100 of the spread) and its mu-derivative, against
    scipy's adaptive quadrature split at the step; a plain 64-node Gauss-Hermite rule misses it by far more."""
    from scipy import integrate, stats
    from scipy.special import expit

    from gmlib.quadrature import _gated_expectation

    s0, m2, sd = 0.4, 30.0, 100.0
    gate = lambda y, p: jax.nn.sigmoid(p[2] + y[:, 1])  # noqa: E731
    mu, cov, p = jnp.array([0.0, m2]), jnp.array([[1.0, 0.0], [0.0, sd**2]]), jnp.array([0.0, 0.0, s0])
    f = jax.jit(lambda mu: _gated_expectation(gate, 96, mu, cov, p))
    step = -s0 - m2
    opts = dict(epsabs=1e-15, epsrel=1e-14, limit=400)
    pieces = ((m2 - 12 * sd, step), (step, m2 + 12 * sd))
    value = sum(integrate.quad(lambda t: expit(s0 + t) * stats.norm.pdf(t, m2, sd), a, b, **opts)[0] for a, b in pieces)
    slope = sum(integrate.quad(lambda t: expit(s0 + t) * (1 - expit(s0 + t)) * stats.norm.pdf(t, m2, sd), a, b,
                               **opts)[0] for a, b in pieces)
    assert abs(float(f(mu)) - value) < 1e-12
    assert abs(float(jax.grad(f)(mu)[1]) - slope) < 1e-12
    x, w = np.polynomial.hermite_e.hermegauss(64)
    assert abs((w / w.sum()) @ expit(s0 + m2 + sd * x) - value) > 1e-6
