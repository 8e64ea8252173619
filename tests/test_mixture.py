"""gmlib.mixture: GaussianMixture and psd_sqrt against numpy and scipy, their invariants, their bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    SETTINGS,
    SHAPES,
    Arg,
    arrays,
    assert_rejects,
    asymmetric,
    corrupt,
    floats,
    indefinite,
    keys,
    mixtures,
    negative_weights,
    relabel,
    singular_mixture,
    tol,
    unequal_mixture,
    unnormalised,
)

from gmlib import GaussianMixture, psd_sqrt
from gmlib._pytree import unchecked

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------- against numpy and scipy


def test_sampling_statistics():
    mix = unequal_mixture()
    n = 400_000
    x, lab = mix.sample(key=jax.random.key(3), n_samples=n)
    assert x.shape == (n, 3) and lab.shape == (n,)
    np.testing.assert_allclose(np.bincount(np.asarray(lab), minlength=3) / n, mix.weights, atol=5e-3)
    np.testing.assert_allclose(x.mean(axis=0), mix.mean(), atol=1e-2)
    np.testing.assert_allclose(np.cov(np.asarray(x).T), mix.covariance(), atol=2e-2)


def test_sampling_is_exact_on_a_singular_support():
    xs, _ = singular_mixture().sample(key=jax.random.key(4), n_samples=1000)
    assert set(np.unique(np.asarray(xs[:, 2]))) <= {1.0, -1.0}  # the noiseless coordinate stays exact
    point = GaussianMixture([0.3, 0.7], [[1.0, 0.0], [-1.0, 2.0]], np.zeros((2, 2, 2)))
    x, lab = point.sample(key=jax.random.key(1), n_samples=100)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(point.means)[np.asarray(lab)])


@pytest.mark.smoke
def test_log_prob_against_scipy():
    from scipy.stats import multivariate_normal

    mix = unequal_mixture()
    z = RNG.normal(size=(8, 3))
    dens = np.array([[float(mix.weights[k]) * multivariate_normal(mix.means[k], mix.covs[k]).pdf(p)
                      for k in range(3)] for p in z])
    np.testing.assert_allclose(mix.log_prob(z), np.log(dens.sum(1)), rtol=1e-10)
    np.testing.assert_allclose(mix.responsibilities(z), dens / dens.sum(1, keepdims=True), rtol=1e-9)


def test_densities_far_away():
    """Points 1e3 and 1e4 away: finite log-density and responsibilities summing to one."""
    far = 1e3 * np.ones((1, 3))
    r = unequal_mixture().responsibilities(far)
    assert np.all(np.isfinite(r)) and abs(float(r.sum()) - 1) < 1e-12
    mix = GaussianMixture([0.5, 0.5], [[0.0, 0.0], [1.0, 0.0]], [np.eye(2), 0.5 * np.eye(2)])
    z = np.array([[1e4, 0.0], [-1e4, 1e4]])
    lp = np.asarray(mix.log_prob(z))
    assert np.all(np.isfinite(lp)) and np.all(lp < -1e7)
    np.testing.assert_allclose(mix.responsibilities(z)[:, 0], 1.0)  # the wider component wins far away


def test_density_of_a_weight_1e_300():
    """The tiny component is responsible only where its density beats 1e300."""
    w = np.array([1e-300, 1.0])
    pd = GaussianMixture(w, np.array([[0.0], [0.0]]), np.array([[[1.0]], [[1e-4]]]))
    z = np.array([[0.0], [1.0], [40.0]])
    comp = np.stack([np.log(w[k]) - 0.5 * (z[:, 0] ** 2 / pd.covs[k, 0, 0] + np.log(2 * np.pi * pd.covs[k, 0, 0]))
                     for k in range(2)], -1)
    top = comp.max(axis=1, keepdims=True)
    np.testing.assert_allclose(pd.log_prob(z), (top + np.log(np.exp(comp - top).sum(1, keepdims=True)))[:, 0],
                               rtol=1e-12)
    r = np.asarray(pd.responsibilities(z))
    np.testing.assert_allclose(r, np.exp(comp - top) / np.exp(comp - top).sum(axis=1, keepdims=True), atol=1e-12)
    assert r[-1, 0] == pytest.approx(1.0)


def test_log_prob_nearly_singular():
    """Condition number 1e12: log_prob accurate; 1e17: refused (ValueError naming covs, not NaN)."""
    rot = np.linalg.qr(RNG.normal(size=(3, 3)))[0]
    cov = rot @ np.diag([1.0, 1e-6, 1e-12]) @ rot.T
    cov = 0.5 * (cov + cov.T)
    m = RNG.normal(size=(1, 3))
    z = m + 1e-7 * RNG.normal(size=(3, 3))
    d = z - m[0]
    _, logdet = np.linalg.slogdet(cov)
    ref = -0.5 * (np.einsum("nd,de,ne->n", d, np.linalg.inv(cov), d) + logdet + 3 * np.log(2 * np.pi))
    np.testing.assert_allclose(GaussianMixture([1.0], m, cov[None]).log_prob(z), ref, rtol=1e-3)
    singular = GaussianMixture([1.0], m, (rot @ np.diag([1.0, 1.0, 1e-17]) @ rot.T)[None])
    assert_rejects(lambda: singular.log_prob(z), "covs")


def test_second_moment_formula():
    mix = unequal_mixture()
    w, m, c = (np.asarray(a) for a in (mix.weights, mix.means, mix.covs))
    np.testing.assert_allclose(mix.second_moment(), sum(w[k] * (c[k] + np.outer(m[k], m[k])) for k in range(3)))


def test_add_noise_adds_xi_squared():
    mix = unequal_mixture()
    np.testing.assert_allclose(mix.add_noise(0.5).covs, np.asarray(mix.covs) + 0.25 * np.eye(3))


def test_astype_casts_every_parameter():
    mix = unequal_mixture()
    f32 = mix.astype(jnp.float32)
    assert all(a.dtype == jnp.float32 for a in (f32.weights, f32.means, f32.covs))
    np.testing.assert_allclose(f32.covs, mix.covs, rtol=1e-6)
    assert mix.astype(jnp.float64) is mix  # nothing to cast: the same object


def test_unchecked_skips_validation_and_keeps_the_fields():
    mix = unchecked(GaussianMixture, jnp.ones(1), jnp.zeros((1, 2)), -jnp.eye(2)[None])  # not PSD: not checked
    assert mix.dim == 2 and float(mix.covs[0, 0, 0]) == -1.0
    with pytest.raises(ValueError):  # zip(..., strict=True)
        unchecked(GaussianMixture, jnp.ones(1), jnp.zeros((1, 2)))  # a field missing


# ---------------------------------------------------------------------------- invariants (hypothesis)


@SETTINGS
@given(mix=mixtures())
def test_moments_are_consistent(mix):
    """E[XXᵀ] = Cov + E[X]E[X]ᵀ, finite, and the covariance is PSD."""
    t = tol(mix.dtype)
    mean, second, cov = (np.asarray(f(), np.float64) for f in (mix.mean, mix.second_moment, mix.covariance))
    assert all(np.all(np.isfinite(a)) for a in (mean, second, cov))
    scale = 1 + np.abs(second).max()
    np.testing.assert_allclose(second, cov + np.outer(mean, mean), atol=t * scale)
    assert np.linalg.eigvalsh(cov).min() >= -10 * t * scale


@SETTINGS
@given(mix=mixtures(), perm_seed=st.integers(0, 100))
def test_moments_ignore_the_labels(mix, perm_seed):
    t = tol(mix.dtype)
    perm = np.random.default_rng(perm_seed).permutation(mix.n_components)
    scale = 1 + np.abs(np.asarray(mix.second_moment())).max()
    np.testing.assert_allclose(relabel(mix, perm).second_moment(), mix.second_moment(), atol=t * scale)
    np.testing.assert_allclose(relabel(mix, perm).mean(), mix.mean(), atol=t * scale)


@SETTINGS
@given(mix=mixtures(definite=True), z=arrays((4, 3), -5.0, 5.0))
def test_responsibilities_are_probabilities(mix, z):
    z = z[:, :mix.dim].astype(mix.dtype)
    t = tol(mix.dtype)
    r = np.asarray(mix.responsibilities(z), np.float64)
    assert np.all(np.isfinite(r)) and np.all(r >= 0) and np.all(r <= 1 + t)
    np.testing.assert_allclose(r.sum(axis=1), 1.0, atol=10 * t)
    assert np.all(r[:, np.asarray(mix.weights) == 0] == 0)  # a weightless component is never responsible


@SETTINGS
@given(mix=mixtures(definite=True), z=arrays((4, 3), -5.0, 5.0), perm_seed=st.integers(0, 100))
def test_densities_ignore_the_labels(mix, z, perm_seed):
    """Relabelling keeps log_prob and permutes the responsibilities."""
    z = z[:, :mix.dim].astype(mix.dtype)
    t = tol(mix.dtype)
    perm = np.random.default_rng(perm_seed).permutation(mix.n_components)
    lp = np.asarray(mix.log_prob(z), np.float64)
    assert np.all(np.isfinite(lp))
    np.testing.assert_allclose(relabel(mix, perm).log_prob(z), lp, rtol=10 * t, atol=10 * t)
    np.testing.assert_allclose(relabel(mix, perm).responsibilities(z), np.asarray(mix.responsibilities(z))[:, perm],
                               atol=10 * t)


@SETTINGS
@given(mix=mixtures(), key=keys(), n=st.just(5))
def test_samples_are_valid_and_reproducible(mix, key, n):
    """Finite samples, labels of weighted components only; the same key gives the same draw."""
    x, lab = mix.sample(key=key, n_samples=n)
    assert x.shape == (n, mix.dim) and lab.shape == (n,) and x.dtype == mix.dtype
    assert np.all(np.isfinite(np.asarray(x)))
    lab = np.asarray(lab)
    assert np.all((lab >= 0) & (lab < mix.n_components)) and np.all(np.asarray(mix.weights)[lab] > 0)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(mix.sample(key=key, n_samples=n)[0]))


@SETTINGS
@given(mix=mixtures(), xi=floats(0.0, 3.0))
def test_add_noise_property(mix, xi):
    np.testing.assert_allclose(mix.add_noise(xi).covs, np.asarray(mix.covs) + np.float64(xi) ** 2 * np.eye(mix.dim),
                               rtol=tol(mix.dtype), atol=tol(mix.dtype))


@SETTINGS
@given(md=st.sampled_from(SHAPES["mixture"]), data=st.data())
def test_isotropic_is_sigma_squared_identity(md, data):
    m, d = md
    means = data.draw(arrays((m, d)))
    std = data.draw(st.one_of(floats(0.0, 3.0), arrays((m,), 0.0, 3.0)))
    mix = GaussianMixture.isotropic(np.full(m, 1.0 / m), means, std)
    var = np.broadcast_to(np.asarray(std, np.float64) ** 2, (m,))
    np.testing.assert_allclose(mix.covs, var[:, None, None] * np.eye(d), rtol=1e-12, atol=1e-300)  # FTZ


@SETTINGS
@given(mix=mixtures())
def test_psd_sqrt_squares_back(mix):
    r = np.asarray(psd_sqrt(mix.covs), np.float64)
    c = np.asarray(mix.covs, np.float64)
    assert np.all(np.isfinite(r))
    np.testing.assert_allclose(r, np.swapaxes(r, -1, -2), atol=10 * tol(mix.dtype) * (1 + np.abs(c).max()))
    np.testing.assert_allclose(r @ np.swapaxes(r, -1, -2), c, atol=100 * tol(mix.dtype) * (1 + np.abs(c).max()))


def test_psd_sqrt_nearly_singular():
    """Eigenvalues down to 1e-12 relative (and 0): R Rᵀ = Γ to 1e-14."""
    rot = np.linalg.qr(RNG.normal(size=(3, 3)))[0]
    covs = np.stack([rot @ np.diag([1.0, 1e-6, 1e-12]) @ rot.T, rot.T @ np.diag([2.0, 1e-10, 0.0]) @ rot])
    covs = 0.5 * (covs + np.swapaxes(covs, -1, -2))
    r = np.asarray(psd_sqrt(covs))
    assert np.abs(r @ np.swapaxes(r, -1, -2) - covs).max() < 1e-14


# ---------------------------------------------------------------------------- derivatives of psd_sqrt


def _fd_jacobian(f, x, h=1e-6):
    x = np.asarray(x, np.float64)
    cols = []
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        cols.append((np.asarray(f(x + e)) - np.asarray(f(x - e))) / (2 * h))
    return np.stack(cols, axis=-1).reshape(np.shape(f(x)) + x.shape)


@pytest.mark.smoke
@pytest.mark.parametrize("cov", [0.49 * np.eye(3), np.diag([2.0, 2.0, 0.5]), None], ids=["sigma2-I", "pair", "full"])
def test_psd_sqrt_derivative_at_repeated_eigenvalues(cov):
    """The Jacobian of the square root is finite and matches finite differences, σ²I included.

    (Through ``eigh`` it was NaN at any repeated eigenvalue.) Finite differences run along
    symmetric directions, the only ones a covariance can move in.
    """
    if cov is None:
        a = RNG.normal(size=(3, 3))
        cov = a @ a.T + 0.1 * np.eye(3)

    def sym_sqrt(c):
        return psd_sqrt(0.5 * (c + np.swapaxes(c, -1, -2)))

    jac = np.asarray(jax.jacfwd(lambda c: psd_sqrt(0.5 * (c + c.T)))(jnp.asarray(cov)))
    assert np.all(np.isfinite(jac))
    np.testing.assert_allclose(jac, _fd_jacobian(sym_sqrt, cov), atol=1e-8)
    # the derivative of sqrt(s) I along I: d/ds sqrt(s) = 1 / (2 sqrt(s)), exactly
    if np.allclose(cov, cov[0, 0] * np.eye(3)):
        d = jax.jvp(psd_sqrt, (jnp.asarray(cov),), (jnp.eye(3),))[1]
        np.testing.assert_allclose(d, np.eye(3) / (2 * np.sqrt(cov[0, 0])), rtol=1e-13)


def test_psd_sqrt_second_derivative_at_sigma2_identity():
    """d²/ds² of the square root of (s I + sB) ... along a direction: finite and equal to finite differences."""
    b = RNG.normal(size=(2, 2))
    b = b + b.T

    def f(s):
        return jnp.sum(jnp.sin(psd_sqrt(s * jnp.eye(2) + 0.0 * b)) * b)

    h = 1e-4
    fd2 = (f(1.3 + h) - 2 * f(1.3) + f(1.3 - h)) / h**2
    g2 = jax.grad(jax.grad(f))(1.3)
    assert np.isfinite(g2)
    np.testing.assert_allclose(g2, fd2, rtol=1e-5)


# ---------------------------------------------------------------------------- bad input


MIXTURE_SPEC = {
    "weights": Arg(extra=(negative_weights, unnormalised)),
    "means": Arg(fixed_axes=(0, 1)),
    "covs": Arg(fixed_axes=(0, 1, 2), extra=(asymmetric, indefinite)),
}


@SETTINGS
@given(mix=mixtures(dtype=np.float64), data=st.data())
def test_mixture_rejects_invalid(mix, data):
    """One argument corrupted (means of the wrong D included): the error names it."""
    args = dict(weights=np.asarray(mix.weights), means=np.asarray(mix.means), covs=np.asarray(mix.covs))
    name, bad = data.draw(corrupt(args, MIXTURE_SPEC))
    assert_rejects(lambda: GaussianMixture(**bad), name)


def test_means_of_the_wrong_dimension_are_named():
    """Means in 2-D with covariances in 3-D: the message names `means` (it used to name only `covs`)."""
    with pytest.raises(ValueError, match=r"`means` must have shape \(M, D\) with M = 2, D = 3; got \(2, 2\)"):
        GaussianMixture([0.5, 0.5], np.zeros((2, 2)), np.stack([np.eye(3)] * 2))


@SETTINGS
@given(mix=mixtures(dtype=np.float64, definite=True), data=st.data())
def test_density_methods_reject_invalid(mix, data):
    method = data.draw(st.sampled_from(["log_prob", "responsibilities"]))
    name, bad = data.draw(corrupt(dict(z=np.zeros((2, mix.dim))), {"z": Arg(fixed_axes=(1,))}))
    assert_rejects(lambda: getattr(mix, method)(bad["z"]), name)


@SETTINGS
@given(mix=mixtures(dtype=np.float64), data=st.data())
def test_add_noise_rejects_invalid(mix, data):
    name, bad = data.draw(corrupt(dict(xi=np.float64(0.5)), {"xi": Arg()}))
    assert_rejects(lambda: mix.add_noise(bad["xi"]), name)


@SETTINGS
@given(mix=mixtures(dtype=np.float64), data=st.data())
def test_isotropic_rejects_invalid(mix, data):
    def more_axes(a):  # a scalar std is legitimate, so only extra axes are wrong
        return st.sampled_from([np.asarray(a)[None], np.asarray(a)[..., None]])

    # (a negative std gives the same covariance std^2 I: not refused)
    spec = {"std": Arg(rank=False, fixed_axes=(0,), extra=(more_axes,)), "means": Arg(fixed_axes=(0,))}
    args = dict(weights=np.asarray(mix.weights), means=np.asarray(mix.means), std=np.full(mix.n_components, 0.5))
    name, bad = data.draw(corrupt(args, spec))
    # a wrong number of means disagrees with the weights and the per-component std too
    also = ("std", "weights") if name == "means" and np.asarray(bad["means"]).ndim == 2 else ()
    assert_rejects(lambda: GaussianMixture.isotropic(**bad), name, *also)


@SETTINGS
@given(mix=mixtures(dtype=np.float64), data=st.data())
def test_psd_sqrt_rejects_invalid(mix, data):
    def flat(a):  # fewer than two axes (a leading batch axis is legitimate: (..., D, D))
        return st.sampled_from([np.asarray(a).reshape(-1), np.asarray(a)[0, 0]])

    spec = {"mats": Arg(fixed_axes=(2,), rank=False, extra=(asymmetric, indefinite, flat))}
    name, bad = data.draw(corrupt(dict(mats=np.asarray(mix.covs)), spec))
    assert_rejects(lambda: psd_sqrt(bad["mats"]), name)
