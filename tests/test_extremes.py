"""Extreme parameters: huge scores and ||U z||, tiny weights, nearly singular covariances, far queries.

Each output is compared with an independent float64 computation written here in numpy,
in log space (a stable softmax over the exact logits), so the reference itself does not
overflow. The limits that remain are documented in the functions' "Numerical limits"
paragraphs (book/api.md renders them).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gmlib import (
    GaussianMixture,
    gates,
    gauss_hermite,
    mixture_expectation,
    population_attention,
    psd_sqrt,
    softmax_attention,
)

RNG = np.random.default_rng(7)


def ref_softmax_attention(q, toks, U, V):
    q, toks, U, V = (np.asarray(a, np.float64) for a in (q, toks, U, V))
    s = (q @ U.T) @ toks.T  # (n, L)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ toks @ V.T


def ref_population(w, m, c, q, U, V):
    """Prop 2.1 in numpy float64; log weights taken exactly with np.log (no flush to zero)."""
    u = np.asarray(q, np.float64) @ np.asarray(U, np.float64).T
    logits = np.log(w)[None, :] + u @ m.T + 0.5 * np.einsum("nd,kde,ne->nk", u, c, u)
    a = np.exp(logits - logits.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    experts = m[None] + np.einsum("kde,ne->nkd", c, u)
    return a, np.einsum("nk,nkd->nd", a, experts) @ np.asarray(V, np.float64).T


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-300)


# ---------------------------------------------------------------------------- finite prompts


@pytest.mark.parametrize("block", [None, 7, 64])
@pytest.mark.parametrize("score", [1e2, 1e3, 1e4])
def test_softmax_attention_scores_up_to_1e4(score, block):
    """Scores of size `score` (gaps between tokens of the same order): finite and exact to ~1e-13."""
    toks = RNG.normal(size=(300, 3))
    q = RNG.normal(size=(5, 3))
    q *= np.sqrt(score) / np.linalg.norm(q, axis=1, keepdims=True)
    U, V = np.sqrt(score) * np.eye(3) / 2, RNG.normal(size=(2, 3))
    ref = ref_softmax_attention(q, toks, U, V)
    out = softmax_attention(toks, q, U, V, block_size=block)
    assert np.all(np.isfinite(out))
    assert rel_err(out, ref) < 1e-11
    # float32: finite, and relative error ~ eps32 * |score| (the rounding of the scores themselves)
    f32 = [a.astype(np.float32) for a in (q, toks, U, V)]
    out32 = softmax_attention(f32[1], f32[0], *f32[2:], block_size=block)
    assert out32.dtype == jnp.float32 and np.all(np.isfinite(out32))
    assert rel_err(out32, ref_softmax_attention(*f32, )) < 2e-7 * score * 10


def test_softmax_attention_query_far_from_the_data():
    """A query 1e3 away: the attention picks (softly) the most aligned token, without overflow."""
    toks = RNG.normal(size=(200, 2))
    q = np.array([[1e3, 0.0], [0.0, -1e3], [7e2, 7e2]])
    U, V = np.eye(2), np.eye(2)
    out = softmax_attention(toks, q, U, V)
    np.testing.assert_allclose(out, ref_softmax_attention(q, toks, U, V), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[0], toks[np.argmax(toks[:, 0])], atol=1e-6)  # essentially a hard max


def test_softmax_attention_tied_extreme_scores():
    """Two tokens tied at the maximum score 1e4 share the attention equally (no 0/0)."""
    toks = np.array([[100.0, 1.0], [100.0, -1.0], [0.0, 0.0]])
    q = np.array([[100.0, 0.0]])
    for block in (None, 1, 2):
        out = softmax_attention(toks, q, np.eye(2), np.eye(2), block_size=block)
        np.testing.assert_allclose(out, [[100.0, 0.0]], atol=1e-12)


# ---------------------------------------------------------------------------- infinite prompts


@pytest.mark.parametrize("norm_u", [1.0, 1e2, 1e3])
def test_population_attention_large_Uz(norm_u):
    """||U z|| up to 1e3 (gate logits up to ~1e6): finite, gates sum to one, relative error ~1e-12."""
    w = np.array([0.2, 0.5, 0.3])
    m = RNG.normal(size=(3, 3))
    a = RNG.normal(size=(3, 3, 3))
    c = 0.2 * a @ np.swapaxes(a, -1, -2) + 0.05 * np.eye(3)
    mix = GaussianMixture(w, m, c)
    q = RNG.normal(size=(6, 3))
    U = norm_u * np.eye(3) / np.linalg.norm(q, axis=1).max()
    V = RNG.normal(size=(2, 3))
    alpha, ref = ref_population(w, m, c, q, U, V)
    out = population_attention(mix, q, U, V)
    g = gates(mix, q, U)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(g))
    np.testing.assert_allclose(np.asarray(g).sum(axis=1), 1.0, atol=1e-14)
    assert rel_err(out, ref) < 1e-11
    assert np.abs(np.asarray(g) - alpha).max() < 1e-9


def test_weights_down_to_1e_300():
    """A component of weight 1e-300 whose quadratic term makes it dominate: it must win the gate."""
    w = np.array([1e-300, 1.0])  # sums to one in float64
    m = np.zeros((2, 1))
    c = np.array([[[2.0]], [[0.0]]])  # logit gap: log(1e-300) + 0.5 * 2 * u^2 - 0 = -690.8 + u^2
    mix = GaussianMixture(w, m, c)
    q = np.array([[0.0], [20.0], [26.0], [27.0], [40.0]])  # u^2 = 0, 400, 676, 729, 1600
    U, V = np.eye(1), np.eye(1)
    alpha, ref = ref_population(w, m, c, q, U, V)
    np.testing.assert_allclose(gates(mix, q, U), alpha, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(population_attention(mix, q, U, V), ref, rtol=1e-10, atol=1e-300)
    assert float(gates(mix, q, U)[-1, 0]) == pytest.approx(1.0)
    # densities: the tiny component is responsible only where its density beats 1e300
    pd = GaussianMixture(w, np.array([[0.0], [0.0]]), np.array([[[1.0]], [[1e-4]]]))
    z = np.array([[0.0], [1.0], [40.0]])
    lp = np.asarray(pd.log_prob(z))
    comp = np.stack([np.log(w[k]) - 0.5 * (z[:, 0] ** 2 / pd.covs[k, 0, 0] + np.log(2 * np.pi * pd.covs[k, 0, 0]))
                     for k in range(2)], -1)
    top = comp.max(axis=1, keepdims=True)
    np.testing.assert_allclose(lp, (top + np.log(np.exp(comp - top).sum(axis=1, keepdims=True)))[:, 0], rtol=1e-12)
    r = np.asarray(pd.responsibilities(z))
    np.testing.assert_allclose(r, np.exp(comp - top) / np.exp(comp - top).sum(axis=1, keepdims=True), atol=1e-12)
    assert r[-1, 0] == pytest.approx(1.0)


def test_nearly_singular_covariances():
    """Eigenvalues down to 1e-12 relative: attention, psd_sqrt, quadrature, sampling and densities stay accurate."""
    rot = np.linalg.qr(RNG.normal(size=(3, 3)))[0]
    covs = np.stack([rot @ np.diag([1.0, 1e-6, 1e-12]) @ rot.T, rot.T @ np.diag([2.0, 1e-10, 0.0]) @ rot])
    covs = 0.5 * (covs + np.swapaxes(covs, -1, -2))
    w, m = np.array([0.4, 0.6]), RNG.normal(size=(2, 3))
    mix = GaussianMixture(w, m, covs)
    q, U, V = RNG.normal(size=(4, 3)), RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    _, ref = ref_population(w, m, covs, q, U, V)
    assert rel_err(population_attention(mix, q, U, V), ref) < 1e-12
    r = np.asarray(psd_sqrt(covs))
    assert np.abs(r @ np.swapaxes(r, -1, -2) - covs).max() < 1e-14
    A = RNG.normal(size=(2, 3))
    exact = A[0] @ np.asarray(mix.second_moment()) @ A[1]
    np.testing.assert_allclose(mixture_expectation(mix, lambda y: y[:, 0] * y[:, 1], projection=A, n_nodes=3),
                               exact, rtol=1e-12)
    x, _ = mix.sample(jax.random.key(0), 1000)
    assert np.all(np.isfinite(x))
    # log_prob: fine at condition number 1e12, refused (ValueError, not NaN) at 1e-16 relative
    pd = GaussianMixture([1.0], m[:1], covs[:1])
    z = m[:1] + 1e-7 * RNG.normal(size=(3, 3))
    d = z - m[0]
    _, logdet = np.linalg.slogdet(covs[0])
    ref_lp = -0.5 * (np.einsum("nd,de,ne->n", d, np.linalg.inv(covs[0]), d) + logdet + 3 * np.log(2 * np.pi))
    np.testing.assert_allclose(pd.log_prob(z), ref_lp, rtol=1e-3)
    singular = GaussianMixture([1.0], m[:1], (rot @ np.diag([1.0, 1.0, 1e-17]) @ rot.T)[None])
    with pytest.raises(ValueError, match="`covs`"):
        singular.log_prob(z)


def test_point_masses_and_vanishing_noise():
    """Γ = 0 (point masses, the γ = 0 limit) and ξ → 0: attention is a softmax over the means."""
    w, m = np.array([0.3, 0.7]), np.array([[1.0, 0.0], [-1.0, 2.0]])
    mix = GaussianMixture(w, m, np.zeros((2, 2, 2)))
    q, U, V = RNG.normal(size=(5, 2)), 3 * RNG.normal(size=(2, 2)), np.eye(2)
    _, ref = ref_population(w, m, np.zeros((2, 2, 2)), q, U, V)
    np.testing.assert_allclose(population_attention(mix, q, U, V), ref, rtol=1e-13, atol=1e-13)
    for xi in (1e-3, 1e-6, 1e-9):
        noisy = mix.add_noise(xi)
        np.testing.assert_allclose(population_attention(noisy, q, U, V), ref, atol=10 * xi**2 * np.abs(U).max() * 10)
        r = np.asarray(noisy.responsibilities(m + 0.5 * xi))
        assert np.all(np.isfinite(r)) and np.allclose(r.sum(axis=1), 1.0)
        np.testing.assert_allclose(r, np.eye(2), atol=1e-12)  # each mean belongs to its own component
    x, lab = mix.sample(jax.random.key(1), 100)
    np.testing.assert_array_equal(np.asarray(x), m[np.asarray(lab)])  # exact on the support


def test_far_queries_on_densities():
    """Points 1e4 away: finite log-density (about -5e7) and responsibilities summing to one."""
    mix = GaussianMixture([0.5, 0.5], [[0.0, 0.0], [1.0, 0.0]], [np.eye(2), 0.5 * np.eye(2)])
    z = np.array([[1e4, 0.0], [-1e4, 1e4]])
    lp = np.asarray(mix.log_prob(z))
    assert np.all(np.isfinite(lp)) and np.all(lp < -1e7)
    r = np.asarray(mix.responsibilities(z))
    assert np.all(np.isfinite(r)) and np.allclose(r.sum(axis=1), 1.0)
    np.testing.assert_allclose(r[:, 0], 1.0)  # the wider component wins far away


def test_gauss_hermite_at_its_largest_rule():
    """n_nodes = 256 (the cap): finite, positive weights, exact Gaussian moments; 257 is refused."""
    x, w = (np.asarray(a) for a in gauss_hermite(256))
    x = x[:, 0]
    assert np.all(np.isfinite(x)) and np.all(w >= 0)
    np.testing.assert_allclose([w @ x**2, w @ x**4, w @ np.cos(x)], [1.0, 3.0, np.exp(-0.5)], rtol=1e-12)
    with pytest.raises(ValueError, match="`n_nodes`"):
        gauss_hermite(257)


# ---------------------------------------------------------------------------- documented precision


def test_documented_precision_bounds():
    """Re-measure tests/precision_report.py's table: every error within its bound, every bound in book/api.md."""
    import pathlib

    import precision_report

    api = (pathlib.Path(__file__).resolve().parents[1] / "book" / "api.md").read_text()
    # The table is measured on CPU. On GPU/TPU, float32 matrix products default to reduced
    # (TF32/bfloat16-pass) precision, which the book documents; the bounds hold there at "highest".
    precision = "default" if jax.default_backend() == "cpu" else "highest"
    with jax.default_matmul_precision(precision):
        rows = precision_report.measure()
    for kernel, setting, e64, e32, b64, b32 in rows:
        assert np.isfinite(e64) and np.isfinite(e32)
        assert e64 <= b64, f"{kernel} ({setting}): float64 error {e64:.2e} above the documented {b64:.0e}"
        assert e32 <= b32, f"{kernel} ({setting}): float32 error {e32:.2e} above the documented {b32:.0e}"
        assert f"| {setting} |" in api and f"{b64:.0e} / {b32:.0e}" in api, \
            f"book/api.md does not document {kernel} ({setting}): run tests/precision_report.py"
