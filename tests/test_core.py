"""gmlib's core against independent computations: numpy loops, closed forms, large-L Monte Carlo."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gmlib
from gmlib import (
    GaussianMixture,
    gates,
    gauss_hermite,
    linear_attention,
    mixture_expectation,
    monte_carlo_expectation,
    population_attention,
    population_linear_attention,
    softmax_attention,
)

RNG = np.random.default_rng(0)


def unequal_mixture():
    """Three components in 3-D with unequal, full covariances."""
    a = RNG.normal(size=(3, 3, 3))
    covs = 0.15 * a @ np.swapaxes(a, -1, -2) + 0.05 * np.eye(3)
    means = np.array([[1.0, 0.0, 0.5], [-1.0, 1.0, 0.0], [0.0, -1.0, -0.5]])
    return GaussianMixture([0.2, 0.5, 0.3], means, covs)


def singular_mixture():
    """Two components in 3-D whose last coordinate carries no noise (like LDA tokens)."""
    covs = np.zeros((2, 3, 3))
    covs[:, :2, :2] = [[[0.5, 0.1], [0.1, 0.3]], [[0.2, 0.0], [0.0, 0.6]]]
    means = np.array([[1.0, 0.5, 1.0], [-0.5, 0.0, -1.0]])
    return GaussianMixture([0.6, 0.4], means, covs)


def numpy_softmax_attention(q, toks, U, V):
    """Direct loop over queries: scores, stable softmax, weighted sum of values."""
    out = []
    for z in np.asarray(q):
        s = np.asarray(toks) @ (np.asarray(U) @ z)
        p = np.exp(s - s.max())
        p /= p.sum()
        out.append(np.asarray(V) @ (p @ np.asarray(toks)))
    return np.array(out)


def numpy_population_attention(mix, q, U, V):
    """Prop 2.1 written out component by component in numpy."""
    w, m, c = (np.asarray(x) for x in (mix.weights, mix.means, mix.covs))
    out = []
    for z in np.asarray(q):
        u = np.asarray(U) @ z
        logits = np.array([np.log(w[k]) + m[k] @ u + 0.5 * u @ c[k] @ u for k in range(len(w))])
        a = np.exp(logits - logits.max())
        a /= a.sum()
        out.append(np.asarray(V) @ sum(a[k] * (m[k] + c[k] @ u) for k in range(len(w))))
    return np.array(out)


# ---------------------------------------------------------------------------- finite prompts


def test_softmax_attention_matches_numpy_loop():
    toks = RNG.normal(size=(257, 3))
    q = RNG.normal(size=(7, 3))
    U, V = RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    expected = numpy_softmax_attention(q, toks, U, V)
    np.testing.assert_allclose(softmax_attention(toks, q, U, V), expected, rtol=1e-10, atol=1e-12)
    for block in (1, 16, 100, 256, 257, 1000):
        np.testing.assert_allclose(softmax_attention(toks, q, U, V, block_size=block), expected,
                                   rtol=1e-10, atol=1e-12)


def test_softmax_attention_huge_scores_stay_finite():
    toks = RNG.normal(size=(300, 2))
    q = 50.0 * RNG.normal(size=(4, 2))
    U = 20.0 * np.eye(2)  # scores of order 1e4
    V = np.eye(2)
    expected = numpy_softmax_attention(q, toks, U, V)
    for block in (None, 64):
        out = softmax_attention(toks, q, U, V, block_size=block)
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, expected, rtol=1e-9, atol=1e-9)


def test_linear_attention_matches_numpy_loop():
    toks = RNG.normal(size=(50, 3))
    q = RNG.normal(size=(5, 3))
    U, V = RNG.normal(size=(3, 3)), RNG.normal(size=(4, 3))
    expected = np.array([sum((t @ U @ z) * (V @ t) for t in toks) / len(toks) for z in q])
    np.testing.assert_allclose(linear_attention(toks, q, U, V), expected, rtol=1e-10, atol=1e-12)


def test_float32_inputs_give_float32_outputs():
    toks = RNG.normal(size=(100, 2)).astype(np.float32)
    q = RNG.normal(size=(3, 2)).astype(np.float32)
    U, V = np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32)
    expected = numpy_softmax_attention(q.astype(np.float64), toks.astype(np.float64), U, V)
    for block in (None, 32):
        out = softmax_attention(toks, q, U, V, block_size=block)
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    mix = GaussianMixture(np.array([0.5, 0.5], np.float32), np.eye(2, dtype=np.float32),
                          np.stack([np.eye(2, dtype=np.float32)] * 2))
    assert population_attention(mix, q, U, V).dtype == jnp.float32


def test_finite_kernels_jit_vmap_grad():
    toks = jnp.asarray(RNG.normal(size=(64, 2)))
    q = jnp.asarray(RNG.normal(size=(3, 2)))
    V = jnp.eye(2)

    def loss(U, block):
        return jnp.sum(softmax_attention(toks, q, U, V, block_size=block) ** 2)

    U = jnp.asarray(RNG.normal(size=(2, 2)))
    g_dense = jax.grad(loss)(U, None)
    g_block = jax.grad(loss, argnums=0)(U, 16)
    np.testing.assert_allclose(g_block, g_dense, rtol=1e-9, atol=1e-12)
    eps = 1e-6
    E = jnp.zeros((2, 2)).at[0, 1].set(1.0)
    fd = (loss(U + eps * E, None) - loss(U - eps * E, None)) / (2 * eps)
    np.testing.assert_allclose(g_dense[0, 1], fd, rtol=1e-6)
    jitted = jax.jit(lambda q: softmax_attention(toks, q, U, V, block_size=16))
    np.testing.assert_allclose(jitted(q), softmax_attention(toks, q, U, V), rtol=1e-12)
    batched = jax.vmap(lambda t: softmax_attention(t, q, U, V))(jnp.stack([toks, toks[::-1]]))
    np.testing.assert_allclose(batched[0], batched[1], rtol=1e-12)  # a prompt is a set: order is irrelevant


# ---------------------------------------------------------------------------- population operator


@pytest.mark.parametrize("make", [unequal_mixture, singular_mixture])
def test_population_attention_closed_form(make):
    mix = make()
    q = RNG.normal(size=(6, 3))
    U, V = 0.6 * RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    expected = numpy_population_attention(mix, q, U, V)
    np.testing.assert_allclose(population_attention(mix, q, U, V), expected, rtol=1e-10, atol=1e-12)
    g = gates(mix, q, U)
    np.testing.assert_allclose(g.sum(axis=1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("make", [unequal_mixture, singular_mixture])
def test_population_attention_against_large_prompt(make):
    """Prop 2.1 against finite softmax attention on L = 2e6 sampled tokens."""
    mix = make()
    q = 0.5 * RNG.normal(size=(4, 3))
    U, V = 0.5 * RNG.normal(size=(3, 3)), np.eye(3)
    toks, _ = mix.sample(jax.random.key(1), 2_000_000)
    finite = softmax_attention(toks, q, U, V, block_size=1 << 16)
    pop = population_attention(mix, q, U, V)
    # Monte Carlo error ~ exp(u^T Γ u / 2) / sqrt(L); here about 1e-3. A wrong gate or a
    # missing Γ U z term is off by O(0.1).
    np.testing.assert_allclose(finite, pop, atol=1.5e-2)
    assert np.abs(np.asarray(finite) - np.asarray(pop)).max() < 1.5e-2


def test_gaussian_prompt_is_affine():
    m = np.array([1.0, -2.0])
    cov = np.array([[0.7, 0.2], [0.2, 0.4]])
    mix = GaussianMixture([1.0], [m], [cov])
    q = RNG.normal(size=(5, 2))
    U, V = RNG.normal(size=(2, 2)), RNG.normal(size=(3, 2))
    np.testing.assert_allclose(population_attention(mix, q, U, V), (m + q @ U.T @ cov) @ V.T, rtol=1e-12)


def test_population_attention_stable_for_large_Uz():
    mix = unequal_mixture()
    q = RNG.normal(size=(5, 3))
    U, V = 300.0 * np.eye(3), np.eye(3)  # ||U z|| in the hundreds, gate logits ~ 1e5
    out = population_attention(mix, q, U, V)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, numpy_population_attention(mix, q, U, V), rtol=1e-8, atol=1e-8)


def test_population_linear_attention_weighs_components_by_pi():
    mix = unequal_mixture()
    q = RNG.normal(size=(4, 3))
    U, V = RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    per_comp = [GaussianMixture([1.0], mix.means[k:k + 1], mix.covs[k:k + 1]) for k in range(3)]
    expected = sum(float(mix.weights[k]) * np.asarray(population_linear_attention(per_comp[k], q, U, V))
                   for k in range(3))
    np.testing.assert_allclose(population_linear_attention(mix, q, U, V), expected, rtol=1e-10)
    toks, _ = mix.sample(jax.random.key(2), 400_000)
    np.testing.assert_allclose(linear_attention(toks, q, U, V), expected, atol=5e-2)


def test_population_attention_grad_matches_finite_differences():
    mix = unequal_mixture()
    q = jnp.asarray(RNG.normal(size=(3, 3)))
    V = jnp.asarray(RNG.normal(size=(2, 3)))
    U = jnp.asarray(0.5 * RNG.normal(size=(3, 3)))
    f = jax.jit(lambda U: jnp.sum(jnp.sin(population_attention(mix, q, U, V))))
    g = jax.grad(f)(U)
    for i, j in [(0, 0), (1, 2), (2, 1)]:
        E = jnp.zeros((3, 3)).at[i, j].set(1.0)
        fd = (f(U + 1e-6 * E) - f(U - 1e-6 * E)) / 2e-6
        np.testing.assert_allclose(g[i, j], fd, rtol=1e-6, atol=1e-9)
    # vmap over a batch of mixtures (a pytree) works
    means = jnp.stack([mix.means, -mix.means])
    batch = jax.vmap(lambda m: population_attention(GaussianMixture.tree_unflatten(None, (mix.weights, m, mix.covs)),
                                                    q, U, V))(means)
    assert batch.shape == (2, 3, 2)


# ---------------------------------------------------------------------------- mixture methods


def test_sampling_statistics():
    mix = unequal_mixture()
    n = 400_000
    x, lab = mix.sample(jax.random.key(3), n)
    assert x.shape == (n, 3) and lab.shape == (n,)
    np.testing.assert_allclose(np.bincount(np.asarray(lab), minlength=3) / n, mix.weights, atol=5e-3)
    np.testing.assert_allclose(x.mean(axis=0), mix.mean(), atol=1e-2)
    np.testing.assert_allclose(np.cov(np.asarray(x).T), mix.covariance(), atol=2e-2)
    xs, _ = singular_mixture().sample(jax.random.key(4), 1000)
    assert set(np.unique(np.asarray(xs[:, 2]))) <= {1.0, -1.0}  # the noiseless coordinate stays exact


def test_log_prob_and_responsibilities_against_numpy():
    from scipy.stats import multivariate_normal

    mix = unequal_mixture()
    z = RNG.normal(size=(8, 3))
    dens = np.array([[float(mix.weights[k]) * multivariate_normal(mix.means[k], mix.covs[k]).pdf(p)
                      for k in range(3)] for p in z])
    np.testing.assert_allclose(mix.log_prob(z), np.log(dens.sum(1)), rtol=1e-10)
    np.testing.assert_allclose(mix.responsibilities(z), dens / dens.sum(1, keepdims=True), rtol=1e-9)
    far = 1e3 * np.ones((1, 3))
    r = mix.responsibilities(far)
    assert np.all(np.isfinite(r)) and abs(float(r.sum()) - 1) < 1e-12


def test_moments_and_noise():
    mix = unequal_mixture()
    w, m, c = (np.asarray(a) for a in (mix.weights, mix.means, mix.covs))
    np.testing.assert_allclose(mix.second_moment(), sum(w[k] * (c[k] + np.outer(m[k], m[k])) for k in range(3)))
    noisy = mix.add_noise(0.5)
    np.testing.assert_allclose(noisy.covs, c + 0.25 * np.eye(3))
    iso = GaussianMixture.isotropic([0.5, 0.5], [[0.0, 1.0], [2.0, 0.0]], [0.0, 2.0])
    np.testing.assert_allclose(iso.covs[1], 4 * np.eye(2))
    np.testing.assert_allclose(iso.covs[0], 0.0)


# ---------------------------------------------------------------------------- quadrature


def test_gauss_hermite_moments():
    nodes, weights = gauss_hermite(8, 2)
    assert nodes.shape == (64, 2) and abs(float(weights.sum()) - 1) < 1e-14
    # E[x^4 y^2] = 3 * 1 under N(0, I): exact for degree <= 15
    np.testing.assert_allclose(weights @ (nodes[:, 0] ** 4 * nodes[:, 1] ** 2), 3.0, rtol=1e-13)


def test_mixture_expectation_against_closed_form_and_monte_carlo():
    mix = unequal_mixture()
    A = RNG.normal(size=(2, 3))
    # E[(a1.x)(a2.x)] = a1^T E[x x^T] a2: exact for a polynomial of degree 2
    exact = A[0] @ np.asarray(mix.second_moment()) @ A[1]
    est = mixture_expectation(mix, lambda y: y[:, 0] * y[:, 1], projection=A, n_nodes=4)
    np.testing.assert_allclose(est, exact, rtol=1e-12)
    # a smooth non-polynomial function: quadrature against Monte Carlo within 5 standard errors
    fn = lambda y: jnp.tanh(y[:, 0]) * jnp.cos(y[:, 1])  # noqa: E731
    quad = mixture_expectation(mix, fn, projection=A, n_nodes=40)
    quad2 = mixture_expectation(mix, fn, projection=A, n_nodes=60)
    np.testing.assert_allclose(quad, quad2, atol=1e-10)
    mean, se = monte_carlo_expectation(mix, fn, jax.random.key(5), 400_000, projection=A)
    assert abs(float(mean - quad)) < 5 * float(se)
    full = mixture_expectation(singular_mixture(), lambda y: y[:, 2] ** 2 + y[:, 0], n_nodes=6)
    np.testing.assert_allclose(full, 1.0 + 0.6 * 1.0 + 0.4 * -0.5, rtol=1e-12)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(weights=[0.5, 0.6], means=[[0.0], [1.0]], covs=[[[1.0]], [[1.0]]]), "weights"),
        (dict(weights=[1.5, -0.5], means=[[0.0], [1.0]], covs=[[[1.0]], [[1.0]]]), "weights"),
        (dict(weights=[0.5, 0.5], means=[[0.0], [np.nan]], covs=[[[1.0]], [[1.0]]]), "means"),
        (dict(weights=[0.5, 0.5], means=[[0.0, 1.0]], covs=[[[1.0]], [[1.0]]]), "means"),
        (dict(weights=[0.5, 0.5], means=[[0.0], [1.0]], covs=[[1.0], [1.0]]), "covs"),
        (dict(weights=[0.5, 0.5], means=[[0.0, 0], [1.0, 0]], covs=[np.eye(2), [[1.0, 0.5], [0.0, 1.0]]]), "covs"),
        (dict(weights=[0.5, 0.5], means=[[0.0, 0], [1.0, 0]], covs=[np.eye(2), [[1.0, 2.0], [2.0, 1.0]]]), "covs"),
        (dict(weights=[1.0], means=[["a"]], covs=[[[1.0]]]), "means"),
    ],
)
def test_mixture_rejects_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        GaussianMixture(**kwargs)


def test_attention_rejects_bad_input():
    toks, q = np.ones((5, 2)), np.ones((3, 2))
    U, V = np.eye(2), np.eye(2)
    cases = [
        (lambda: softmax_attention(np.ones((0, 2)), q, U, V), "tokens"),
        (lambda: softmax_attention(toks, q, np.eye(3), V), "U"),
        (lambda: softmax_attention(toks, q, U, np.ones((2, 3))), "V"),
        (lambda: softmax_attention(toks, np.ones((3, 3)), U, V), "queries"),
        (lambda: softmax_attention(toks, np.ones(2), U, V), "queries"),
        (lambda: softmax_attention(toks, q, U, V, block_size=0), "block_size"),
        (lambda: softmax_attention(toks, q, U, V, block_size=2.5), "block_size"),
        (lambda: softmax_attention(toks * np.inf, q, U, V), "tokens"),
        (lambda: linear_attention(toks, q, U * np.nan, V), "U"),
        (lambda: population_attention("not a mixture", q, U, V), "mixture"),
        (lambda: population_attention(unequal_mixture(), q, U, V), "queries"),
        (lambda: gates(unequal_mixture(), np.ones((2, 3)), U), "U"),
        (lambda: GaussianMixture.isotropic([1.0], [[0.0]], -1.0), "std"),
        (lambda: gauss_hermite(0, 1), "n_nodes"),
        (lambda: singular_mixture().log_prob(np.zeros((1, 3))), "covs"),
        (lambda: unequal_mixture().sample(jax.random.key(0), 0), "n"),
        (lambda: mixture_expectation(unequal_mixture(), jnp.sum, projection=np.ones((2, 2))), "projection"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"`{name}`"):
            call()


def test_public_api_is_listed():
    for name in gmlib.__all__:
        assert hasattr(gmlib, name), name
