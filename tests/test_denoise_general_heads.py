"""gmlib.denoise.general_heads: heads beyond the paper's assumptions (any norms, any covariance, M components),
as gmlib.Heads evaluated by gmlib.apply_heads, against the Bayes denoiser written in numpy (scipy densities,
Gaussian conditioning), finite prompts against softmax attention written in numpy, and the moved
constructions of chapter 8 (fewer_heads, small_score_head) against their formulas computed independently.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
from scipy.optimize import brentq
from strategies import numpy_heads_on_tokens, numpy_posterior_mean, random_cov

import gmlib
from gmlib import denoise as dn


def out_aug(heads, prob, z):
    return gmlib.apply_heads(heads, dn.augment(prob.noisy), dn.augment(jnp.asarray(z)))


# ----------------------------------------------------------------------------- the constant coordinate


def test_augment_arrays_and_mixtures():
    x = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(dn.augment(x), np.c_[x, np.ones(3)])
    mix = gmlib.GaussianMixture([0.3, 0.7], [[1.0, 2.0], [3.0, 4.0]], np.stack([np.eye(2), 2 * np.eye(2)]))
    aug = dn.augment(mix)
    np.testing.assert_array_equal(aug.means, [[1.0, 2.0, 1.0], [3.0, 4.0, 1.0]])
    expected = np.zeros((2, 3, 3))
    expected[:, :2, :2] = mix.covs
    np.testing.assert_array_equal(aug.covs, expected)


def test_constant_token_scores_gain_the_offsets():
    # the gates of a head (A, b) on augmented tokens: softmax(log pi_k + m_k^T (A z + b)), checked in numpy
    rng = np.random.default_rng(2)
    mix = gmlib.GaussianMixture([0.2, 0.3, 0.5], rng.normal(size=(3, 2)), np.stack([random_cov(rng, 2)] * 3))
    A, b = rng.normal(size=(2, 2)), rng.normal(size=2)
    U = np.zeros((3, 3))
    U[:2, :2], U[:2, 2], U[2] = A, b, rng.normal(size=3)  # the last row only shifts every logit alike
    z = rng.normal(size=(10, 2))
    logits = np.log(mix.weights) + (z @ A.T + b) @ np.asarray(mix.means).T
    expected = np.exp(logits - special.logsumexp(logits, axis=-1, keepdims=True))
    np.testing.assert_allclose(gmlib.gates(dn.augment(mix), dn.augment(z), U), expected, atol=1e-13)


@pytest.mark.parametrize("d", [2, 3, 5])
@pytest.mark.parametrize("case", ["unequal", "opposite", "collinear", "point_masses", "full_cov"])
def test_two_heads_with_constant_token_are_exact(d, case):
    rng = np.random.default_rng(d)
    m1 = rng.normal(size=d)
    m2 = {"opposite": -m1, "collinear": 2.5 * m1}.get(case, rng.normal(size=d) * 3)
    means = np.stack([m1, m2])
    kw = {"cov": random_cov(rng, d)} if case == "full_cov" else {"gamma": 0.0 if case == "point_masses" else 0.8}
    prob = dn.DenoisingProblem([0.35, 0.65], means, xi=1.3, **kw)
    heads = dn.two_head_bayes(prob, constant_token=True)
    assert heads.U.shape == heads.V.shape == (2, d + 1, d + 1) and heads.W_out is None and not heads.residual
    z = rng.normal(size=(64, d)) * 4
    full = out_aug(heads, prob, z)
    np.testing.assert_allclose(full[:, :d], prob.bayes(z), atol=1e-10)
    np.testing.assert_allclose(full[:, -1], 1.0, atol=1e-12)
    # the same heads built under jit
    jitted = jax.jit(dn.two_head_bayes, static_argnames="constant_token")(prob, constant_token=True)
    np.testing.assert_allclose(out_aug(jitted, prob, z)[:, :d], prob.bayes(z), atol=1e-10)


def test_two_heads_constant_token_float32():
    rng = np.random.default_rng(7)
    prob = dn.DenoisingProblem(np.float32([0.4, 0.6]), np.float32([[1.0, 0.5], [-2.0, 3.0]]), np.float32(0.6),
                               np.float32(1.1))
    heads = dn.two_head_bayes(prob, constant_token=True)
    assert heads.dtype == jnp.float32
    z = rng.normal(size=(32, 2)).astype(np.float32) * 2
    np.testing.assert_allclose(out_aug(heads, prob, z)[:, :2], prob.bayes(z), atol=2e-4)


def test_two_heads_on_finite_prompts_converge():
    # softmax attention over L sampled augmented tokens: the Monte Carlo error falls like L^{-1/2}
    prob = dn.DenoisingProblem([0.3, 0.7], [[4.0, 0.0], [0.0, 1.0]], 0.7, 1.0)
    heads = dn.two_head_bayes(prob, constant_token=True)
    z = np.array([[0.5, 0.5], [2.0, -1.0], [-1.0, 1.5]])
    target = np.asarray(prob.bayes(z))
    tokens = dn.augment(prob.noisy.sample(key=jax.random.key(0), n_samples=500)[0])  # the layer on tokens, against numpy
    np.testing.assert_allclose(gmlib.apply_heads(heads, tokens, dn.augment(z)),
                               numpy_heads_on_tokens(heads.U, heads.V, tokens, dn.augment(z)).sum(0), atol=1e-12)
    errs = []
    for L in (2**10, 2**14, 2**18):
        errs.append(np.mean([
            np.abs(gmlib.apply_heads(heads, dn.augment(prob.noisy.sample(key=jax.random.key(seed), n_samples=L)[0]),
                                     dn.augment(z))[:, :2] - target).max()
            for seed in range(4)]))
    # 16x the tokens: about 4x smaller for light-tailed weights; the tilted weights exp(u^T x) of these heads
    # have heavier tails (measured: 0.51, 0.18, 0.065), so ask for 2x
    assert errs[2] < 0.1, errs
    assert errs[1] < 0.5 * errs[0] and errs[2] < 0.5 * errs[1], errs


def test_unequal_norms_without_constant_token_point_to_it():
    prob = dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 2.0]], 1.0, 2.0)
    with pytest.raises(ValueError, match="constant_token=True"):
        dn.two_head_bayes(prob)
    full = dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 2.0]], xi=2.0, cov=np.diag([1.0, 2.0]))
    with pytest.raises(ValueError, match="constant_token=True"):
        dn.two_head_bayes(full)
    with pytest.raises(ValueError, match="M = 3"):
        dn.two_head_bayes(dn.DenoisingProblem([0.2, 0.3, 0.5], np.eye(3), 1.0, 2.0), constant_token=True)


def test_full_covariance_equal_precision_norms_without_constant_token():
    # two means with m^T S^{-1} m equal: d x d heads, no constant coordinate
    rng = np.random.default_rng(3)
    d = 3
    cov = random_cov(rng, d)
    S = cov + np.eye(d)
    root = np.linalg.cholesky(S)
    u = rng.normal(size=(2, d))
    means = (u / np.linalg.norm(u, axis=1, keepdims=True) * 2.0) @ root.T  # |S^{-1/2}-whitened| = 2
    prob = dn.DenoisingProblem([0.3, 0.7], means, xi=1.0, cov=cov)
    heads = dn.two_head_bayes(prob)
    assert heads.U.shape == (2, d, d)
    z = rng.normal(size=(40, d)) * 3
    np.testing.assert_allclose(gmlib.apply_heads(heads, prob.noisy, z), prob.bayes(z), atol=1e-10)


# ----------------------------------------------------------------------------- more components, skip connection


@pytest.mark.parametrize("d,M", [(3, 3), (4, 3), (5, 4), (6, 5), (6, 6), (3, 2), (4, 4)])
def test_multi_head_bayes_is_exact_with_the_fewest_heads(d, M):
    rng = np.random.default_rng(10 * d + M)
    prob = dn.DenoisingProblem(rng.dirichlet(np.ones(M) * 3), rng.normal(size=(M, d)) * 2, xi=1.1,
                               cov=random_cov(rng, d))
    r = min(M - 1, d)
    assert dn.heads_needed(prob, constant_token=True) == -(-d // (d - r))
    heads = dn.multi_head_bayes(prob, constant_token=True)
    assert heads.n_heads == dn.heads_needed(prob, constant_token=True) and heads.dim == d + 1
    z = rng.normal(size=(40, d)) * 3
    np.testing.assert_allclose(out_aug(heads, prob, z)[:, :d], prob.bayes(z), atol=1e-10)
    # more heads than needed: the same construction stays exact
    more = dn.multi_head_bayes(prob, constant_token=True, n_heads=heads.n_heads + 1)
    np.testing.assert_allclose(out_aug(more, prob, z)[:, :d], prob.bayes(z), atol=1e-10)
    with pytest.raises(ValueError, match="n_heads"):
        dn.multi_head_bayes(prob, constant_token=True, n_heads=max(heads.n_heads - 1, 0))


def test_heads_needed_limits():
    rng = np.random.default_rng(4)
    three = rng.normal(size=(3, 2)) * 2
    # three means in general position in d = 2: r = d, no matched-gate construction
    prob = dn.DenoisingProblem([0.2, 0.3, 0.5], three, 0.5, 1.0)
    assert dn.heads_needed(prob, constant_token=True) is None
    with pytest.raises(ValueError, match="skip_head_bayes"):
        dn.multi_head_bayes(prob, constant_token=True)
    # ... except at gamma = xi, where one head is exact (any norms, with the constant coordinate)
    balanced = dn.DenoisingProblem([0.2, 0.3, 0.5], three, 1.0, 1.0)
    assert dn.heads_needed(balanced, constant_token=True) == 1
    z = rng.normal(size=(30, 2)) * 3
    one = dn.multi_head_bayes(balanced, constant_token=True)
    np.testing.assert_allclose(out_aug(one, balanced, z)[:, :2], balanced.bayes(z), atol=1e-10)
    assert dn.heads_needed(balanced) is None  # unequal norms, no constant coordinate (the default)
    # three collinear means: the offsets -|m_k|^2 / (2s) are quadratic along the line, m_k^T b affine in m_k
    line = dn.DenoisingProblem([0.2, 0.3, 0.5], np.outer([-1.0, 0.5, 2.0], [1.0, 1.0]), 0.5, 1.0)
    assert dn.heads_needed(line, constant_token=True) is None
    with pytest.raises(ValueError, match="sphere"):
        dn.skip_head_bayes(line, constant_token=True)
    # more than d + 1 means of unequal norms: the offsets cannot come from the constant coordinate
    many = dn.DenoisingProblem(np.full(4, 0.25), rng.normal(size=(4, 2)) * 2, 1.0, 1.0)
    assert dn.heads_needed(many, constant_token=True) is None
    with pytest.raises(ValueError, match="offsets"):
        dn.skip_head_bayes(many, constant_token=True)


@pytest.mark.parametrize("constant", [True, False])
def test_skip_head_is_exact_for_many_components(constant):
    rng = np.random.default_rng(5)
    d, M = 2, 5
    angles = rng.uniform(0, 2 * np.pi, M)
    if constant:
        means = rng.normal(size=(3, d)) * 2  # affinely independent, unequal norms
        M = 3
    else:
        means = 2.5 * np.c_[np.cos(angles), np.sin(angles)]  # on a circle: equal norms, M > d + 1
    prob = dn.DenoisingProblem(rng.dirichlet(np.ones(M) * 3), means, 0.6, 1.2)
    heads = dn.skip_head_bayes(prob, constant_token=constant)
    D = d + 1 if constant else d
    # the layer: two residual heads, the second zero, and W_out = (I, B - I), so that it computes B z + T(z)
    assert heads.residual and heads.n_heads == 2 and heads.W_out.shape == (D, 2 * D)
    np.testing.assert_array_equal(heads.U[1], 0.0)
    np.testing.assert_array_equal(heads.V[1], 0.0)
    np.testing.assert_array_equal(heads.W_out[:, :D], np.eye(D))
    S = 0.36 * np.eye(d) + 1.44 * np.eye(d)
    B = np.eye(D)
    B[:d, :d] = (0.36 - 1.44) * np.linalg.inv(S)  # (Gamma - xi^2 I) S^-1, in numpy
    np.testing.assert_allclose(np.eye(D) + heads.W_out[:, D:], B, atol=1e-14)
    np.testing.assert_allclose(heads.U[0, :d, :d], np.linalg.inv(S), atol=1e-14)  # U = S^-1, V = xi^2 S^-1
    np.testing.assert_allclose(heads.V[0, :d, :d], 1.44 * np.linalg.inv(S), atol=1e-14)
    z = rng.normal(size=(40, d)) * 3
    q, mix = (dn.augment(z), dn.augment(prob.noisy)) if constant else (jnp.asarray(z), prob.noisy)
    out = gmlib.apply_heads(heads, mix, q)
    np.testing.assert_allclose(out, q @ B.T + gmlib.population_attention(mix, q, heads.U[0], heads.V[0]),
                               atol=1e-12)
    np.testing.assert_allclose(out[:, :d], prob.bayes(z), atol=1e-10)
    if constant:
        np.testing.assert_allclose(out[:, d], 1.0, atol=1e-12)


# ----------------------------------------------------------------------------- fewer heads (Proposition 8.3)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d", [2, 3, 4])
def test_fewer_heads_are_exact_where_the_condition_holds(d, dtype):
    """d means spanning a hyperplane (normal q), Gamma turned so that q^T S (Gamma - xi^2 I)^-1 Gamma q = 0:
    d - 1 heads with the Bayes gates (their score rows D U_j = D S^-1, their offsets) are exact, one fewer than
    heads_needed; the Bayes denoiser here is the scipy one."""
    rng = np.random.default_rng(40 + d)
    means = rng.normal(size=(d, d)) * 1.5
    _, _, vt = np.linalg.svd(means[:-1] - means[-1])
    q, p = vt[-1], vt[0]  # the normal of the means' span, and a direction in it
    rest = vt[1:-1]  # the other directions of the span (d - 2 of them)

    def turned(theta):
        u1, u2 = np.cos(theta) * q + np.sin(theta) * p, -np.sin(theta) * q + np.cos(theta) * p
        cov = 0.3 * np.outer(u1, u1) + 3.0 * np.outer(u2, u2)
        return cov + sum(2.0 * np.outer(u, u) for u in rest)

    def condition(cov):
        return q @ (cov + np.eye(d)) @ np.linalg.solve(cov - np.eye(d), cov) @ q

    theta = brentq(lambda t: condition(turned(t)), 0.0, np.pi / 2)
    weights = rng.dirichlet(3 * np.ones(d))
    prob = dn.DenoisingProblem(weights.astype(dtype), means.astype(dtype), xi=dtype(1.0), cov=turned(theta).astype(dtype))
    heads = dn.fewer_heads(prob)
    assert heads.U.shape == heads.V.shape == (d - 1, d + 1, d + 1) and heads.dtype == dtype
    if d > 2:
        assert dn.heads_needed(prob, constant_token=True) == d
    S_inv = np.linalg.inv(np.asarray(prob.S, np.float64))
    diffs = np.asarray(prob.means, np.float64)[:-1] - np.asarray(prob.means, np.float64)[-1]
    half = 0.5 * np.sum(np.asarray(prob.means, np.float64) @ S_inv * np.asarray(prob.means, np.float64), axis=1)
    t = 1e-10 if dtype == np.float64 else 2e-4
    for U in np.asarray(heads.U, np.float64):  # the Bayes gates: the posterior's slopes and offsets
        np.testing.assert_allclose(diffs @ U[:d, :d], diffs @ S_inv, atol=t * 10)
        np.testing.assert_allclose(diffs @ U[:d, d], half[-1] - half[:-1], atol=t * 10)
    z = rng.normal(size=(64, d)) * 3
    expected, _ = numpy_posterior_mean(weights, means, turned(theta), 1.0, z)
    out = np.asarray(out_aug(heads, prob, z.astype(dtype)), np.float64)
    np.testing.assert_allclose(out[:, :d], expected, atol=1e-10 if dtype == np.float64 else 1e-3)
    np.testing.assert_allclose(out[:, d], 1.0, atol=t)


def test_fewer_heads_rejects_problems_without_them():
    rng = np.random.default_rng(6)
    means = rng.normal(size=(3, 3)) * 2
    with pytest.raises(ValueError, match=r"q\^T S"):  # isotropic Gamma, gamma != xi: the condition fails
        dn.fewer_heads(dn.DenoisingProblem([0.3, 0.3, 0.4], means, 0.5, 1.0))
    with pytest.raises(ValueError, match="hyperplane"):  # two means in d = 3: r = 1
        dn.fewer_heads(dn.DenoisingProblem([0.5, 0.5], means[:2], xi=1.0, cov=random_cov(rng, 3)))
    with pytest.raises(ValueError, match="invertible"):  # Gamma = xi^2 I: R = 0
        dn.fewer_heads(dn.DenoisingProblem([0.3, 0.3, 0.4], means, 1.0, 1.0))
    line = np.outer([-1.0, 0.5, 2.0], [1.0, 1.0])  # three collinear means in d = 2: no offsets
    with pytest.raises(ValueError, match="sphere"):
        dn.fewer_heads(dn.DenoisingProblem([0.2, 0.3, 0.5], line, xi=1.0, cov=np.diag([0.3, 3.0])))


# ----------------------------------------------------------------------------- small scores (Proposition 8.5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_small_score_head_formula_and_limit(dtype):
    """U_eps = eps I, V_eps = (W/eps, -W m_bar/eps) with W = R Cov(Z)^-1 (numpy); its output tends to R z at rate
    eps, R = (Gamma - xi^2 I) S^-1."""
    rng = np.random.default_rng(8)
    weights, means, cov = np.array([0.3, 0.3, 0.4]), rng.normal(size=(3, 2)) * 2, random_cov(rng, 2)
    prob = dn.DenoisingProblem(weights.astype(dtype), means.astype(dtype), xi=dtype(1.2), cov=cov.astype(dtype))
    S = cov + 1.44 * np.eye(2)
    R = (cov - 1.44 * np.eye(2)) @ np.linalg.inv(S)
    m_bar = weights @ means
    cov_z = S + (means - m_bar).T @ (weights[:, None] * (means - m_bar))
    W = R @ np.linalg.inv(cov_z)
    t = 1e-12 if dtype == np.float64 else 1e-4
    z = rng.normal(size=(20, 2)) * 2
    errors = []
    for eps in (1e-1, 1e-2):
        head = dn.small_score_head(prob, eps)
        assert head.U.shape == head.V.shape == (1, 3, 3) and head.dtype == dtype and head.W_out is None
        U, V = np.zeros((3, 3)), np.zeros((3, 3))
        U[:2, :2], V[:2, :2], V[:2, 2] = eps * np.eye(2), W / eps, -W @ m_bar / eps
        np.testing.assert_allclose(np.asarray(head.U[0], np.float64), U, rtol=t * 10, atol=t)
        np.testing.assert_allclose(np.asarray(head.V[0], np.float64), V, rtol=t * 10, atol=t / eps)
        if dtype == np.float64:
            out = np.asarray(out_aug(head, prob, z))
            np.testing.assert_allclose(out[:, 2], 0.0, atol=1e-12)
            errors.append(np.abs(out[:, :2] - z @ R.T).max())
    if dtype == np.float64:
        assert errors[1] < 0.2 * errors[0] and errors[1] < 0.05, errors  # O(eps)


@pytest.mark.parametrize("d", [2, 3])
def test_small_score_head_beside_the_skip_head_comes_close(d):
    """Proposition 8.5: the attention head of skip_head_bayes and the small-score head, summed, have excess risk
    O(eps^2), for three components (no Bayes-gated construction with two heads)."""
    rng = np.random.default_rng(9 + d)
    prob = dn.DenoisingProblem([0.3, 0.3, 0.4], rng.normal(size=(3, d)) * 2, 0.5, 1.0)
    skip = dn.skip_head_bayes(prob, constant_token=True)
    eps = np.array([0.03, 0.01, 0.003])
    excess = []
    for e in eps:
        small = dn.small_score_head(prob, e)
        pair = gmlib.Heads(U=skip.U.at[1].set(small.U[0]), V=skip.V.at[1].set(small.V[0]))
        excess.append(float(prob.excess_risk(lambda q, pair=pair: out_aug(pair, prob, q)[:, :d], n_nodes=24)))
    slope = np.polyfit(np.log(eps), np.log(excess), 1)[0]
    assert 1.8 < slope < 2.2 and excess[-1] < 1e-3, (slope, excess)
    for bad in (0.0, -1.0, np.nan, "a", np.ones(2)):
        with pytest.raises(ValueError, match="`eps`"):
            dn.small_score_head(prob, bad)
