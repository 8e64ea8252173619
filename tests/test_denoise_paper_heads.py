"""gmlib.denoise.paper_heads: the paper's heads as gmlib.Heads, evaluated by gmlib.apply_heads, against the
Bayes denoiser written in numpy (scipy densities, Gaussian conditioning) on the infinite prompt, and against
softmax attention written in numpy on a finite one; then properties of random valid inputs and the invalid
inputs (ValueError naming the argument).

two_head_bayes's heads summed on the noisy prompt are the Bayes denoiser (Thm 4.1, Props C.3, C.5), each
head being the population attention of its (U, V); single_head_bayes is exact when γ = ξ, or γ = 0 with a
normal to both means, and refuses otherwise (Props C.3, C.4).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import (
    SETTINGS,
    Arg,
    arrays,
    as_f64,
    assert_rejects,
    denoising_problems,
    equal_norm_problems,
    numpy_bayes,
    numpy_heads_on_tokens,
    query_scale,
    random_equal_norm_problem,
    tol,
)

import gmlib
from gmlib import population_attention
from gmlib import denoise as dn


# ----------------------------------------------------------------------------- two heads, one head


@pytest.mark.parametrize("seed", range(6))
def test_two_heads_equal_bayes_on_random_problems(seed):
    rng = np.random.default_rng(10 + seed)
    d = int(rng.integers(2, 6))
    for gamma, opposite in ((None, False), (None, True), (0.0, False), (0.0, True)):
        prob = random_equal_norm_problem(rng, d, gamma, opposite)
        z = rng.normal(size=(64, d)) * 4
        heads = dn.two_head_bayes(prob)
        assert isinstance(heads, gmlib.Heads) and heads.n_heads == 2 and heads.W_out is None and not heads.residual
        out = gmlib.apply_heads(heads, prob.noisy, z)
        # independent: the summed heads against the scipy posterior
        np.testing.assert_allclose(out, numpy_bayes(np.asarray(prob.weights), np.asarray(prob.means),
                                                    float(prob.gamma), float(prob.xi), z), atol=1e-10)


@pytest.mark.smoke
def test_two_heads_float32_jit_and_vmap():
    rng = np.random.default_rng(3)
    prob = random_equal_norm_problem(rng, 3, dtype=np.float32)
    heads = jax.jit(dn.two_head_bayes)(prob)
    assert heads.dtype == jnp.float32 and heads.U.shape == heads.V.shape == (2, 3, 3)
    z = rng.normal(size=(16, 3)).astype(np.float32)
    np.testing.assert_allclose(gmlib.apply_heads(heads, prob.noisy, z), prob.bayes(z), atol=2e-5)
    # vmap over a batch of problems (stacked pytrees)
    probs = [random_equal_norm_problem(rng, 3) for _ in range(4)]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *probs)
    z64 = rng.normal(size=(8, 3))
    outs = jax.vmap(lambda p: gmlib.apply_heads(dn.two_head_bayes(p), p.noisy, z64) - p.bayes(z64))(stacked)
    assert float(jnp.abs(outs).max()) < 1e-10


def test_two_heads_on_a_finite_prompt():
    """On L tokens the layer is the sum of the heads' softmax averages (numpy), and it tends to f* as L grows."""
    prob = dn.DenoisingProblem([0.3, 0.7], [[3.0, 0.0], [0.0, 3.0]], 1.0, 2.0)
    heads = dn.two_head_bayes(prob)
    z = np.array([[0.5, 0.5], [2.0, -1.0], [-1.0, 1.5]])
    tokens = prob.noisy.sample(key=jax.random.key(0), n_samples=500)[0]
    np.testing.assert_allclose(gmlib.apply_heads(heads, tokens, z),
                               numpy_heads_on_tokens(heads.U, heads.V, tokens, z).sum(0), atol=1e-12)
    target = np.asarray(prob.bayes(z))
    errs = []
    for L in (2**10, 2**14, 2**18):
        errs.append(np.mean([np.abs(gmlib.apply_heads(heads, prob.noisy.sample(key=jax.random.key(seed), n_samples=L)[0], z)
                                    - target).max() for seed in range(4)]))
    # 16x the tokens: the Monte Carlo rate L^{-1/2} gives 4x smaller (measured: 0.17, 0.055, 0.016)
    assert errs[2] < 0.02 and errs[1] < 0.4 * errs[0] and errs[2] < 0.4 * errs[1], errs


def test_single_head_cases_and_obstructions():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(32, 3)) * 3
    # gamma = xi
    prob = dn.DenoisingProblem([0.2, 0.8], [[2.0, 0.0, 0.0], [0.0, 0.0, 2.0]], 1.1, 1.1)
    head = dn.single_head_bayes(prob)
    assert isinstance(head, gmlib.Heads) and head.n_heads == 1
    np.testing.assert_allclose(head.U[0], np.eye(3) / (2 * 1.1**2), atol=1e-15)  # U = S^-1, V = I/2 (Thm 4.1)
    np.testing.assert_allclose(head.V[0], 0.5 * np.eye(3), atol=1e-15)
    np.testing.assert_allclose(gmlib.apply_heads(head, prob.noisy, z), prob.bayes(z), atol=1e-12)
    # gamma = 0: opposite means (Prop C.3), and any means when d >= 3
    for means in ([[1.0, 2.0, 0.5], [-1.0, -2.0, -0.5]], [[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]]):
        prob = dn.DenoisingProblem([0.35, 0.65], means, 0.0, 0.8)
        head = dn.single_head_bayes(prob)
        expected = numpy_bayes(np.array([0.35, 0.65]), np.array(means), 0.0, 0.8, z)
        np.testing.assert_allclose(gmlib.apply_heads(head, prob.noisy, z), expected, atol=1e-12)
    prob2 = dn.DenoisingProblem([0.5, 0.5], [[0.0, 3.0], [0.0, -3.0]], 0.0, 2.0)
    head = dn.single_head_bayes(prob2)
    np.testing.assert_allclose(gmlib.apply_heads(head, prob2.noisy, z[:, :2]), prob2.bayes(z[:, :2]), atol=1e-12)
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


# ============================================================================ properties of random valid inputs


@SETTINGS
@given(prob=equal_norm_problems(), z=arrays((4, 3), -4.0, 4.0))
def test_two_heads_sum_to_bayes(prob, z):
    """Thm 4.1 / Props C.3, C.5: T₁ + T₂ on μ_Z is f*; apply_heads sums the population attention of the heads."""
    z = z[:, :prob.dim].astype(prob.dtype)
    heads = dn.two_head_bayes(prob)
    assert heads.U.shape == heads.V.shape == (2, prob.dim, prob.dim) and heads.dtype == prob.dtype
    assert np.all(np.isfinite(as_f64(heads.U))) and np.all(np.isfinite(as_f64(heads.V)))
    out = as_f64(gmlib.apply_heads(heads, prob.noisy, z))
    parts = sum(as_f64(population_attention(prob.noisy, z, U, V)) for U, V in zip(heads.U, heads.V))
    t = tol(prob.dtype)
    sc = query_scale(prob, z)
    np.testing.assert_allclose(out, parts, atol=10 * t * sc)
    np.testing.assert_allclose(out, as_f64(prob.bayes(z)), atol=(1e3 if prob.dtype == np.float64 else 300) * t * sc)


@SETTINGS
@given(prob=equal_norm_problems(gamma=0.0), z=arrays((4, 3), -4.0, 4.0), case=st.sampled_from(["balanced", "zero", "other"]))
def test_single_head_bayes(prob, z, case):
    """γ = ξ: one head U = I/s, V = I/2 is f* (Thm 4.1); γ = 0: exact when a normal to both means exists
    (d = 3 or opposite means), refused otherwise; γ ∉ {0, ξ}: refused (Prop C.4)."""
    dtype = np.dtype(prob.dtype).type
    gamma = {"balanced": prob.xi, "zero": dtype(0.0), "other": dtype(1.7) * prob.xi}[case]
    prob = dn.DenoisingProblem(prob.weights, prob.means, gamma, prob.xi)
    z = z[:, :prob.dim].astype(prob.dtype)
    m = as_f64(prob.means)
    collinear = 1 - (m[0] @ m[1]) ** 2 / ((m[0] @ m[0]) * (m[1] @ m[1])) < np.finfo(dtype).eps ** (2 / 3)
    if case == "other" or (case == "zero" and prob.dim == 2 and not collinear):
        with pytest.raises(ValueError, match="no single head"):
            dn.single_head_bayes(prob)
        return
    head = dn.single_head_bayes(prob)
    assert head.U.shape == head.V.shape == (1, prob.dim, prob.dim)
    out = as_f64(gmlib.apply_heads(head, prob.noisy, z))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, as_f64(population_attention(prob.noisy, z, head.U[0], head.V[0])),
                               atol=10 * tol(dtype) * query_scale(prob, z))
    np.testing.assert_allclose(out, as_f64(prob.bayes(z)), atol=(1e3 if dtype == np.float64 else 300) * tol(dtype)
                               * query_scale(prob, z))


# ============================================================================ invalid inputs


OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731


@SETTINGS
@given(prob=denoising_problems(dtype=np.float64), data=st.data(),
       fn=st.sampled_from(["two_head_bayes", "single_head_bayes", "separation"]))
def test_constructions_reject_invalid(prob, data, fn):
    """M ≠ 2, d < 2 (two heads) or unequal norms: ValueError naming `problem`/`means`.

    (An object that is not a DenoisingProblem fails with Python's AttributeError: not checked.)"""
    m = as_f64(prob.means)
    norms = np.linalg.norm(m, axis=1)
    ok = prob.n_components == 2 and (fn == "separation" or (abs(norms[0] - norms[1]) < 1e-9 * max(norms.max(), 1)
                                                           and (prob.dim >= 2 or fn != "two_head_bayes")))
    assume(not ok)
    bad = prob
    assert_rejects(lambda: getattr(dn, fn)(bad), "problem", "means")
