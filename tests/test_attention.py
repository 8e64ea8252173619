"""gmlib.attention against independent computations (numpy loops, Prop 2.1 in numpy, large-L Monte Carlo),
its invariants (hypothesis), its extreme parameters and its bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import settings
from hypothesis import strategies as st
from strategies import (
    SETTINGS,
    Arg,
    arrays,
    assert_rejects,
    bad_positive_int,
    corrupt,
    empty_rows,
    floats,
    population_args,
    prompts,
    relabel,
    singular_mixture,
    split_component,
    tol,
    unequal_mixture,
)

from gmlib import (
    GaussianMixture,
    gates,
    linear_attention,
    population_attention,
    population_linear_attention,
    softmax_attention,
)
from gmlib._pytree import unchecked

RNG = np.random.default_rng(0)


def numpy_softmax_attention(q, toks, U, V):
    """Direct loop over queries: scores, stable softmax, weighted sum of values."""
    out = []
    for z in np.asarray(q, np.float64):
        s = np.asarray(toks, np.float64) @ (np.asarray(U, np.float64) @ z)
        p = np.exp(s - s.max())
        out.append(np.asarray(V, np.float64) @ (p / p.sum() @ np.asarray(toks, np.float64)))
    return np.array(out)


def numpy_population(w, m, c, q, U, V, quad=0.5, expert=1.0):
    """Prop 2.1 in numpy float64, log weights taken exactly (no flush to zero): (gates, output).

    ``quad`` and ``expert`` are the factors of u^T Γ u in the logits and of Γ U z in the
    experts; a test sets them wrong to show that its tolerance would catch it.
    """
    w, m, c = (np.asarray(a, np.float64) for a in (w, m, c))
    u = np.asarray(q, np.float64) @ np.asarray(U, np.float64).T
    logits = np.log(w)[None, :] + u @ m.T + quad * np.einsum("nd,kde,ne->nk", u, c, u)
    a = np.exp(logits - logits.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    experts = m[None] + expert * np.einsum("kde,ne->nkd", c, u)
    return a, np.einsum("nk,nkd->nd", a, experts) @ np.asarray(V, np.float64).T


def population_of(mix, q, U, V, **factors):
    return numpy_population(mix.weights, mix.means, mix.covs, q, U, V, **factors)[1]


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-300)


# ---------------------------------------------------------------------------- finite prompts: references


@pytest.mark.smoke
def test_softmax_attention_matches_numpy_loop():
    toks = RNG.normal(size=(257, 3))
    q = RNG.normal(size=(7, 3))
    U, V = RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    expected = numpy_softmax_attention(q, toks, U, V)
    for block in (None, 1, 16, 100, 256, 257, 1000):
        np.testing.assert_allclose(softmax_attention(toks, q, U, V, block_size=block), expected,
                                   rtol=1e-10, atol=1e-12)


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
    expected = numpy_softmax_attention(q, toks, U, V)
    for block in (None, 32):
        out = softmax_attention(toks, q, U, V, block_size=block)
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    mix = GaussianMixture(np.array([0.5, 0.5], np.float32), np.eye(2, dtype=np.float32),
                          np.stack([np.eye(2, dtype=np.float32)] * 2))
    assert population_attention(mix, q, U, V).dtype == jnp.float32


@pytest.mark.smoke
def test_softmax_attention_grad_matches_finite_differences():
    toks = jnp.asarray(RNG.normal(size=(64, 2)))
    q = jnp.asarray(RNG.normal(size=(3, 2)))
    V = jnp.eye(2)

    def loss(U, block):
        return jnp.sum(softmax_attention(toks, q, U, V, block_size=block) ** 2)

    U = jnp.asarray(RNG.normal(size=(2, 2)))
    g_dense = jax.grad(loss)(U, None)
    np.testing.assert_allclose(jax.grad(loss)(U, 16), g_dense, rtol=1e-9, atol=1e-12)
    E = jnp.zeros((2, 2)).at[0, 1].set(1.0)
    fd = (loss(U + 1e-6 * E, None) - loss(U - 1e-6 * E, None)) / 2e-6
    np.testing.assert_allclose(g_dense[0, 1], fd, rtol=1e-6)


def test_softmax_attention_under_jit_and_vmap():
    toks, q = jnp.asarray(RNG.normal(size=(64, 2))), jnp.asarray(RNG.normal(size=(3, 2)))
    U, V = jnp.asarray(RNG.normal(size=(2, 2))), jnp.eye(2)
    jitted = jax.jit(lambda q: softmax_attention(toks, q, U, V, block_size=16))
    np.testing.assert_allclose(jitted(q), softmax_attention(toks, q, U, V), rtol=1e-12)
    batched = jax.vmap(lambda t: softmax_attention(t, q, U, V))(jnp.stack([toks, toks[::-1]]))
    np.testing.assert_allclose(batched[0], batched[1], rtol=1e-12)  # a prompt is a set: order is irrelevant


# ---------------------------------------------------------------------------- finite prompts: extremes


@pytest.mark.parametrize("block", [None, 7, 64])
@pytest.mark.parametrize("score", [1e2, 1e3, 1e4])
def test_softmax_attention_scores_up_to_1e4(score, block):
    """Scores of size `score` (gaps between tokens of the same order): finite and exact to ~1e-13."""
    toks = RNG.normal(size=(300, 3))
    q = RNG.normal(size=(5, 3))
    q *= np.sqrt(score) / np.linalg.norm(q, axis=1, keepdims=True)
    U, V = np.sqrt(score) * np.eye(3) / 2, RNG.normal(size=(2, 3))
    out = softmax_attention(toks, q, U, V, block_size=block)
    assert np.all(np.isfinite(out)) and rel_err(out, numpy_softmax_attention(q, toks, U, V)) < 1e-11


@pytest.mark.parametrize("block", [None, 7, 64])
@pytest.mark.parametrize("score", [1e2, 1e3, 1e4])
def test_softmax_attention_float32_error_is_eps_times_score(score, block):
    """float32: finite, relative error ~ eps32 * |score| (the rounding of the scores themselves)."""
    q = RNG.normal(size=(5, 3))
    q *= np.sqrt(score) / np.linalg.norm(q, axis=1, keepdims=True)
    f32 = [a.astype(np.float32) for a in (q, RNG.normal(size=(300, 3)), np.sqrt(score) * np.eye(3) / 2,
                                           RNG.normal(size=(2, 3)))]
    out32 = softmax_attention(f32[1], f32[0], *f32[2:], block_size=block)
    assert out32.dtype == jnp.float32 and np.all(np.isfinite(out32))
    assert rel_err(out32, numpy_softmax_attention(*f32)) < 2e-7 * score * 10


def test_softmax_attention_query_far_from_the_data():
    """A query 1e3 away: the attention picks (softly) the most aligned token, without overflow."""
    toks = RNG.normal(size=(200, 2))
    q = np.array([[1e3, 0.0], [0.0, -1e3], [7e2, 7e2]])
    out = softmax_attention(toks, q, np.eye(2), np.eye(2))
    np.testing.assert_allclose(out, numpy_softmax_attention(q, toks, np.eye(2), np.eye(2)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[0], toks[np.argmax(toks[:, 0])], atol=1e-6)  # essentially a hard max


def test_softmax_attention_tied_extreme_scores():
    """Two tokens tied at the maximum score 1e4 share the attention equally (no 0/0)."""
    toks = np.array([[100.0, 1.0], [100.0, -1.0], [0.0, 0.0]])
    for block in (None, 1, 2):
        out = softmax_attention(toks, np.array([[100.0, 0.0]]), np.eye(2), np.eye(2), block_size=block)
        np.testing.assert_allclose(out, [[100.0, 0.0]], atol=1e-12)


# ---------------------------------------------------------------------------- finite prompts: invariants


def _hull_check(out, tokens, V, t):
    """Each output coordinate lies between the smallest and the largest value V z_i."""
    vals = np.asarray(tokens, np.float64) @ np.asarray(V, np.float64).T  # (L, D_out)
    slack = t * (1 + np.abs(vals).max()) * 10
    assert np.all(out >= vals.min(axis=0) - slack) and np.all(out <= vals.max(axis=0) + slack)


@SETTINGS
@given(args=prompts(), block=st.sampled_from([None, 3, "auto"]))
def test_softmax_attention_lies_in_the_hull_of_the_values(args, block):
    out = np.asarray(softmax_attention(**args, block_size=block), np.float64)
    assert out.shape == (args["queries"].shape[0], args["V"].shape[0]) and np.all(np.isfinite(out))
    _hull_check(out, args["prompt"], args["V"], tol(args["prompt"].dtype))


@SETTINGS
@given(args=prompts(), block=st.sampled_from([3, "auto"]))
def test_blocked_equals_one_pass(args, block):
    t = tol(args["prompt"].dtype)
    scale = 1 + np.abs(args["prompt"] @ args["V"].T).max()
    np.testing.assert_allclose(softmax_attention(**args, block_size=block), softmax_attention(**args),
                               atol=10 * t * scale)


@SETTINGS
@given(args=prompts(), seed=st.integers(0, 1000))
def test_a_prompt_is_a_set(args, seed):
    """Reordering or duplicating the tokens changes nothing."""
    t = tol(args["prompt"].dtype)
    scale = 1 + np.abs(args["prompt"] @ args["V"].T).max()
    dense = np.asarray(softmax_attention(**args), np.float64)
    perm = np.random.default_rng(seed).permutation(args["prompt"].shape[0])
    twice = np.concatenate([args["prompt"][perm]] * 2)
    np.testing.assert_allclose(softmax_attention(**{**args, "prompt": twice}), dense, atol=10 * t * scale)


@SETTINGS
@given(args=prompts(), a=arrays((3,), -30.0, 30.0), b=floats(-30.0, 30.0), q0=floats(-2.0, 2.0))
def test_softmax_attention_constant_score_shift(args, a, b, q0):
    """Adding c(z) to every score of query z changes nothing.

    Realised through the public parametrisation: tokens get a constant coordinate 1,
    queries a coordinate q0, and U a last row (a, b) — so every token's score for query
    z gains c(z) = a·z + b q0 — while V ignores the new coordinate.
    """
    q, toks, U, V = (args[k] for k in ("queries", "prompt", "U", "V"))
    dtype, d = toks.dtype, toks.shape[1]
    U2 = np.zeros((d + 1, d + 1), dtype)
    U2[:d, :d], U2[d, :d], U2[d, d] = U, a[:d], b
    q2 = np.concatenate([q, np.full((q.shape[0], 1), q0, dtype)], axis=1)
    t2 = np.concatenate([toks, np.ones((toks.shape[0], 1), dtype)], axis=1)
    V2 = np.concatenate([V, np.zeros((V.shape[0], 1), dtype)], axis=1)
    base = np.asarray(softmax_attention(toks, q, U, V), np.float64)
    shifted = np.asarray(softmax_attention(t2, q2, U2, V2), np.float64)
    scale = 1 + np.abs(toks @ V.T).max()
    # float32: the shift (up to ~200) costs eps * |shift| in each score
    np.testing.assert_allclose(shifted, base, atol=(10 * tol(dtype) if dtype == np.float64 else 3e-3) * scale)


@SETTINGS
@given(args=prompts(), seed=st.integers(0, 1000))
def test_linear_attention_is_the_second_moment_map(args, seed):
    """V (1/L Σ z_i z_iᵀ) U z, whatever the order and multiplicity of the tokens."""
    q, toks, U, V = (np.asarray(args[k], np.float64) for k in ("queries", "prompt", "U", "V"))
    t = tol(args["prompt"].dtype)
    out = np.asarray(linear_attention(**args), np.float64)
    scale = 1 + np.abs(q).max() * np.abs(U).max() * np.abs(toks).max() ** 2 * np.abs(V).max() * 27
    np.testing.assert_allclose(out, q @ U.T @ (toks.T @ toks / len(toks)) @ V.T, atol=10 * t * scale)
    perm = np.random.default_rng(seed).permutation(len(toks))
    twice = np.concatenate([args["prompt"][perm]] * 2)
    np.testing.assert_allclose(linear_attention(**{**args, "prompt": twice}), out, atol=10 * t * scale)


# ---------------------------------------------------------------------------- population: references


@pytest.mark.smoke
@pytest.mark.parametrize("make", [unequal_mixture, singular_mixture])
def test_population_attention_closed_form(make):
    mix = make()
    q = RNG.normal(size=(6, 3))
    U, V = 0.6 * RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    np.testing.assert_allclose(population_attention(mix, q, U, V), population_of(mix, q, U, V),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make", [unequal_mixture, singular_mixture])
def test_population_attention_against_large_prompt(make):
    """Prop 2.1 against finite softmax attention on L = 2e6 sampled tokens, within 5 standard errors.

    The standard error of the self-normalised average sum_i w_i v_i / sum_i w_i (weights
    w_i = exp(z_i^T U z)) is the delta-method one, sqrt(sum_i w_i^2 (v_i - T)^2) / sum_i w_i,
    about 1e-3 here. The test also shows that this tolerance catches a wrong factor: the
    closed form with the 1/2 of u^T Γ u replaced by 1 or 1/4, or Γ U z by 2 Γ U z, lies
    outside it on both mixtures (a fixed 1.5e-2 let the first pass on the singular one).
    """
    mix = make()
    q = 0.5 * RNG.normal(size=(4, 3))
    U, V = 0.5 * RNG.normal(size=(3, 3)), np.eye(3)
    toks, _ = mix.sample(key=jax.random.key(1), n_samples=2_000_000)
    finite = np.asarray(softmax_attention(toks, q, U, V, block_size=1 << 16), np.float64)
    toks = np.asarray(toks)
    s = toks @ (U @ q.T)  # (L, n) scores
    w = np.exp(s - s.max(axis=0))
    vals = toks @ V.T
    se = np.stack([np.sqrt((w[:, j, None] ** 2 * (vals - finite[j]) ** 2).sum(0)) / w[:, j].sum()
                   for j in range(q.shape[0])])
    assert np.all(np.abs(finite - np.asarray(population_attention(mix, q, U, V))) <= 5 * se)
    for wrong in (dict(quad=1.0), dict(quad=0.25), dict(expert=2.0)):
        assert np.any(np.abs(finite - population_of(mix, q, U, V, **wrong)) > 5 * se), wrong


def test_gaussian_prompt_is_affine():
    m, cov = np.array([1.0, -2.0]), np.array([[0.7, 0.2], [0.2, 0.4]])
    q = RNG.normal(size=(5, 2))
    U, V = RNG.normal(size=(2, 2)), RNG.normal(size=(3, 2))
    np.testing.assert_allclose(population_attention(GaussianMixture([1.0], [m], [cov]), q, U, V),
                               (m + q @ U.T @ cov) @ V.T, rtol=1e-12)


def test_population_linear_attention_weighs_components_by_pi():
    mix = unequal_mixture()
    q = RNG.normal(size=(4, 3))
    U, V = RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    per_comp = [GaussianMixture([1.0], mix.means[k:k + 1], mix.covs[k:k + 1]) for k in range(3)]
    expected = sum(float(mix.weights[k]) * np.asarray(population_linear_attention(per_comp[k], q, U, V))
                   for k in range(3))
    np.testing.assert_allclose(population_linear_attention(mix, q, U, V), expected, rtol=1e-10)


def test_linear_attention_on_a_large_prompt_tends_to_the_population():
    mix = unequal_mixture()
    q = RNG.normal(size=(4, 3))
    U, V = RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    toks, _ = mix.sample(key=jax.random.key(2), n_samples=400_000)
    np.testing.assert_allclose(linear_attention(toks, q, U, V), population_linear_attention(mix, q, U, V), atol=5e-2)


def test_population_attention_grad_matches_finite_differences():
    mix = unequal_mixture()
    q, V = jnp.asarray(RNG.normal(size=(3, 3))), jnp.asarray(RNG.normal(size=(2, 3)))
    U = jnp.asarray(0.5 * RNG.normal(size=(3, 3)))
    f = jax.jit(lambda U: jnp.sum(jnp.sin(population_attention(mix, q, U, V))))
    g = jax.grad(f)(U)
    for i, j in [(0, 0), (1, 2), (2, 1)]:
        E = jnp.zeros((3, 3)).at[i, j].set(1.0)
        np.testing.assert_allclose(g[i, j], (f(U + 1e-6 * E) - f(U - 1e-6 * E)) / 2e-6, rtol=1e-6, atol=1e-9)


def test_population_attention_vmaps_over_mixtures():
    mix = unequal_mixture()
    q, U, V = RNG.normal(size=(3, 3)), RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    means = jnp.stack([mix.means, -mix.means])
    batch = jax.vmap(lambda m: population_attention(unchecked(GaussianMixture, mix.weights, m, mix.covs),
                                                    q, U, V))(means)
    np.testing.assert_allclose(batch[1], population_attention(GaussianMixture(mix.weights, -mix.means, mix.covs),
                                                              q, U, V), rtol=1e-12)


# ---------------------------------------------------------------------------- population: extremes


@pytest.mark.parametrize("norm_u", [1.0, 1e2, 1e3])
def test_population_attention_large_Uz(norm_u):
    """||U z|| up to 1e3 (gate logits up to ~1e6): finite, gates sum to one, relative error ~1e-12."""
    w, m = np.array([0.2, 0.5, 0.3]), RNG.normal(size=(3, 3))
    a = RNG.normal(size=(3, 3, 3))
    c = 0.2 * a @ np.swapaxes(a, -1, -2) + 0.05 * np.eye(3)
    mix = GaussianMixture(w, m, c)
    q = RNG.normal(size=(6, 3))
    U, V = norm_u * np.eye(3) / np.linalg.norm(q, axis=1).max(), RNG.normal(size=(2, 3))
    alpha, ref = numpy_population(w, m, c, q, U, V)
    out, g = population_attention(mix, q, U, V), gates(mix, q, U)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(g))
    np.testing.assert_allclose(np.asarray(g).sum(axis=1), 1.0, atol=1e-14)
    assert rel_err(out, ref) < 1e-11 and np.abs(np.asarray(g) - alpha).max() < 1e-9


def test_weights_down_to_1e_300():
    """A component of weight 1e-300 whose quadratic term makes it dominate: it must win the gate."""
    w = np.array([1e-300, 1.0])  # sums to one in float64
    m, c = np.zeros((2, 1)), np.array([[[2.0]], [[0.0]]])  # logit gap: -690.8 + u^2
    mix = GaussianMixture(w, m, c)
    q = np.array([[0.0], [20.0], [26.0], [27.0], [40.0]])  # u^2 = 0, 400, 676, 729, 1600
    alpha, ref = numpy_population(w, m, c, q, np.eye(1), np.eye(1))
    np.testing.assert_allclose(gates(mix, q, np.eye(1)), alpha, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(population_attention(mix, q, np.eye(1), np.eye(1)), ref, rtol=1e-10, atol=1e-300)
    assert float(gates(mix, q, np.eye(1))[-1, 0]) == pytest.approx(1.0)


def test_population_attention_nearly_singular_covariances():
    """Eigenvalues down to 1e-12 relative (and 0): relative error below 1e-12."""
    rot = np.linalg.qr(RNG.normal(size=(3, 3)))[0]
    covs = np.stack([rot @ np.diag([1.0, 1e-6, 1e-12]) @ rot.T, rot.T @ np.diag([2.0, 1e-10, 0.0]) @ rot])
    covs = 0.5 * (covs + np.swapaxes(covs, -1, -2))
    w, m = np.array([0.4, 0.6]), RNG.normal(size=(2, 3))
    q, U, V = RNG.normal(size=(4, 3)), RNG.normal(size=(3, 3)), RNG.normal(size=(2, 3))
    out = population_attention(GaussianMixture(w, m, covs), q, U, V)
    assert rel_err(out, numpy_population(w, m, covs, q, U, V)[1]) < 1e-12


def test_point_masses_and_vanishing_noise():
    """Γ = 0 (point masses) and ξ → 0: attention is a softmax over the means, and ξ² away from it."""
    w, m = np.array([0.3, 0.7]), np.array([[1.0, 0.0], [-1.0, 2.0]])
    mix = GaussianMixture(w, m, np.zeros((2, 2, 2)))
    q, U, V = RNG.normal(size=(5, 2)), 3 * RNG.normal(size=(2, 2)), np.eye(2)
    _, ref = numpy_population(w, m, np.zeros((2, 2, 2)), q, U, V)
    np.testing.assert_allclose(population_attention(mix, q, U, V), ref, rtol=1e-13, atol=1e-13)
    for xi in (1e-3, 1e-6, 1e-9):
        np.testing.assert_allclose(population_attention(mix.add_noise(xi), q, U, V), ref,
                                   atol=10 * xi**2 * np.abs(U).max() * 10)


# ---------------------------------------------------------------------------- population: invariants


@SETTINGS
@given(args=population_args(with_V=False))
def test_gates_are_probabilities(args):
    mix, q, U = args["mixture"], args["queries"], args["U"]
    t = tol(mix.dtype)
    g = np.asarray(gates(mix, q, U), np.float64)
    assert g.shape == (q.shape[0], mix.n_components) and np.all(np.isfinite(g))
    assert np.all(g >= 0) and np.all(g <= 1 + t)
    np.testing.assert_allclose(g.sum(axis=1), 1.0, atol=10 * t)
    assert np.all(g[:, np.asarray(mix.weights) == 0] == 0)


@SETTINGS
@given(args=population_args(with_V=False))
def test_gates_at_U_zero_are_the_weights(args):
    mix, q, U = args["mixture"], args["queries"], args["U"]
    g = gates(mix, q, np.zeros_like(U))
    np.testing.assert_allclose(g, np.broadcast_to(mix.weights, g.shape), atol=10 * tol(mix.dtype))


@SETTINGS
@given(args=population_args(with_V=False), seed=st.integers(0, 1000))
def test_gates_follow_the_components(args, seed):
    """Relabelling permutes the gates; splitting a component splits its gate."""
    mix, q, U = args["mixture"], args["queries"], args["U"]
    t = tol(mix.dtype)
    g = np.asarray(gates(mix, q, U), np.float64)
    perm = np.random.default_rng(seed).permutation(mix.n_components)
    np.testing.assert_allclose(gates(relabel(mix, perm), q, U), g[:, perm], atol=10 * t)
    k = int(np.random.default_rng(seed).integers(mix.n_components))
    halves = np.asarray(gates(split_component(mix, k), q, U), np.float64)
    merged = halves[:, :mix.n_components].copy()
    merged[:, k] += halves[:, -1]
    np.testing.assert_allclose(merged, g, atol=10 * t)


@SETTINGS
@given(args=population_args(), seed=st.integers(0, 1000))
def test_population_attention_depends_on_the_measure_only(args, seed):
    """Finite; relabelling and splitting a component change nothing."""
    mix, q, U, V = (args[k] for k in ("mixture", "queries", "U", "V"))
    t = tol(mix.dtype)
    out = np.asarray(population_attention(**args), np.float64)
    assert out.shape == (q.shape[0], V.shape[0]) and np.all(np.isfinite(out))
    u = np.asarray(q, np.float64) @ np.asarray(U, np.float64).T
    scale = (1 + np.abs(np.asarray(mix.means)).max() + np.abs(np.asarray(mix.covs)).max() * np.abs(u).max() * 3) * 3
    rng = np.random.default_rng(seed)
    np.testing.assert_allclose(population_attention(relabel(mix, rng.permutation(mix.n_components)), q, U, V), out,
                               atol=100 * t * scale)
    split = split_component(mix, int(rng.integers(mix.n_components)))
    np.testing.assert_allclose(population_attention(split, q, U, V), out, atol=100 * t * scale)


@SETTINGS
@given(args=population_args(), seed=st.integers(0, 1000))
def test_population_linear_attention_is_the_second_moment_map(args, seed):
    """V E[z' z'ᵀ] U z, whatever the labels and the splitting of the components."""
    mix, q, U, V = (args[k] for k in ("mixture", "queries", "U", "V"))
    t = tol(mix.dtype)
    out = np.asarray(population_linear_attention(**args), np.float64)
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    S = f(mix.second_moment())
    scale = 1 + np.abs(f(q)).max() * np.abs(f(U)).max() * np.abs(S).max() * np.abs(f(V)).max() * 27
    np.testing.assert_allclose(out, f(q) @ f(U).T @ S @ f(V).T, atol=10 * t * scale)
    perm = np.random.default_rng(seed).permutation(mix.n_components)
    np.testing.assert_allclose(population_linear_attention(relabel(mix, perm), q, U, V), out, atol=10 * t * scale)
    np.testing.assert_allclose(population_linear_attention(split_component(mix, 0), q, U, V), out,
                               atol=10 * t * scale)


@settings(SETTINGS, derandomize=True)  # Monte Carlo: the same examples in every run
@given(args=population_args(dtype=np.float64, mean_scale=1.5, cov_scale=0.5), seed=st.integers(0, 2**31 - 1))
def test_population_and_large_prompt_agree(args, seed):
    """Finite attention on L = 8192 tokens drawn from the mixture is within 6 standard errors of Prop 2.1."""
    mix, q, U, V = (args[k] for k in ("mixture", "queries", "U", "V"))
    U = 0.4 * U  # ||U z|| of order one: the importance weights keep a large effective sample size
    toks, _ = mix.sample(key=jax.random.key(seed), n_samples=8192)
    finite = np.asarray(softmax_attention(toks, q, U, V), np.float64)
    pop = np.asarray(population_attention(mix, q, U, V), np.float64)
    toks = np.asarray(toks, np.float64)
    w = np.exp(toks @ (U @ q.T) - (toks @ (U @ q.T)).max(axis=0))
    vals = toks @ V.T
    for j in range(q.shape[0]):
        wj = w[:, j]
        assume(wj.sum() ** 2 / (wj**2).sum() > 500)  # effective sample size
        se = np.sqrt((wj[:, None] ** 2 * (vals - finite[j]) ** 2).sum(axis=0)) / wj.sum()
        assert np.all(np.abs(finite[j] - pop[j]) <= 6 * se + 1e-9), (finite[j], pop[j], se)


# ---------------------------------------------------------------------------- bad input


def bad_block_size(_):
    return st.sampled_from(["Auto", "fast", 0, -3, 2.5, True])


PROMPT_SPEC = {
    "queries": Arg(fixed_axes=(1,)),
    "prompt": Arg(extra=(empty_rows,)),
    "U": Arg(fixed_axes=(0, 1)),
    "V": Arg(fixed_axes=(1,)),
}


@SETTINGS
@given(args=prompts(dtype=np.float64), data=st.data(), block=st.sampled_from([None, 2]))
def test_softmax_attention_rejects_invalid(args, data, block):
    spec = {**PROMPT_SPEC, "block_size": Arg(rank=False, finite=False, dtype=False,
                                             extra=(bad_positive_int, bad_block_size))}
    name, bad = data.draw(corrupt({**args, "block_size": block}, spec))
    assume(not (name == "block_size" and bad["block_size"] is None))  # None is the valid default
    assert_rejects(lambda: softmax_attention(**bad), name)


def test_block_size_message_lists_the_accepted_values():
    """block_size="Auto" used to get "must be a positive integer", naming neither None nor "auto"."""
    toks, q = np.ones((5, 2)), np.ones((3, 2))
    for bad in ("Auto", 0, 2.5):
        with pytest.raises(ValueError, match=r'`block_size` must be None, a positive int or "auto"'):
            softmax_attention(toks, q, np.eye(2), np.eye(2), block_size=bad)


@SETTINGS
@given(args=prompts(dtype=np.float64), data=st.data())
def test_linear_attention_rejects_invalid(args, data):
    name, bad = data.draw(corrupt(args, PROMPT_SPEC))
    assert_rejects(lambda: linear_attention(**bad), name)


@SETTINGS
@given(args=population_args(dtype=np.float64), data=st.data(),
       fn=st.sampled_from([gates, population_attention, population_linear_attention]))
def test_population_functions_reject_invalid(args, data, fn):
    if fn is gates:
        args.pop("V")
    # (an object that is not a GaussianMixture fails with Python's AttributeError: not checked)
    spec = {"queries": Arg(fixed_axes=(1,)), "U": Arg(fixed_axes=(0, 1))}
    if "V" in args:
        spec["V"] = Arg(fixed_axes=(1,))
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: fn(**bad), name)


def test_checks_are_skipped_under_jit():
    """Inside jit only shapes are checked: a NaN passes through (documented on the API page)."""
    toks, q = jnp.ones((5, 2)), jnp.ones((3, 2))
    out = jax.jit(lambda t: softmax_attention(t, q, jnp.eye(2), jnp.eye(2)))(toks.at[0, 0].set(jnp.nan))
    assert np.isnan(np.asarray(out)).any()
    with pytest.raises(ValueError, match="`queries`"):
        jax.jit(lambda t: softmax_attention(t, jnp.ones((3, 3)), jnp.eye(2), jnp.eye(2)))(toks)


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


def test_non_finite_inputs_are_named():
    """The result is checked by a flag from the compiled kernel; when it is not finite, the input is named."""
    toks, q = RNG.normal(size=(40, 2)), RNG.normal(size=(3, 2))
    U, V = np.eye(2), np.eye(2)
    np.testing.assert_allclose(softmax_attention(toks, q, U, V), numpy_softmax_attention(q, toks, U, V), rtol=1e-12)
    for name, bad in (("prompt", toks), ("queries", q), ("U", U), ("V", V)):
        args = dict(prompt=toks, queries=q, U=U, V=V)
        args[name] = np.where(np.arange(bad.size).reshape(bad.shape) == 1, np.inf, bad)
        assert_rejects(lambda: softmax_attention(**args), name)
        assert_rejects(lambda: linear_attention(**args), name)


def test_overflowing_scores_from_finite_inputs_are_returned_as_they_are():
    """float32 scores of 1e40 overflow (the documented limit): no input is blamed, the NaN comes back."""
    toks = np.array([[1e20, 0.0], [-1e20, 0.0]], np.float32)
    out = softmax_attention(toks, np.array([[1e20, 0.0]], np.float32), np.eye(2, dtype=np.float32),
                            np.eye(2, dtype=np.float32))
    assert not np.all(np.isfinite(np.asarray(out)))
