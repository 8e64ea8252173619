"""gmlib.dn.in_context: the residual two-head layer of Prop 4.4 (in_context_heads) evaluated by
gmlib.apply_heads, against the task's Bayes denoiser in numpy on the infinite prompt and against its formula
written in numpy on finite prompts, at several temperatures; the plug-in estimator against an independent
numpy EM; the prompt sampler's statistics; each prompt's excess against numpy; then properties of random
valid inputs and invalid inputs (ValueError naming the argument).
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
    as_f64,
    assert_rejects,
    bad_positive_int,
    corrupt,
    equal_norm_problems,
    floats,
    match_labels,
    negative,
    numpy_bayes,
    numpy_em,
    numpy_heads_on_tokens,
    numpy_softmax,
    query_scale,
    random_equal_norm_problem,
    tol,
    weight_z_scores,
)

import gmlib
from gmlib import denoise as dn
from gmlib import population_attention


# ============================================================================ the tempered family (reference)


TEMPERED = [(1.0, 1.0, 2, 1.0), (1.0, 0.5, 2, 0.3), (1.0, 2.0, 3, 0.6), (0.0, 1.5, 2, 2.0), (0.7, 1.0, 5, 0.1)]


@pytest.mark.parametrize("gamma, xi, d, c", TEMPERED)
def test_tempered_family_on_a_finite_prompt(gamma, xi, d, c):
    """(1 - a - ac) z + a sum_i softmax_i(c z_i^T S^-1 z) z_i, in plain numpy, to 1e-10."""
    rng = np.random.default_rng(0)
    toks, q = 2.0 * rng.standard_normal((50, d)), 2.0 * rng.standard_normal((7, d))
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    weights = numpy_softmax(c * (q @ toks.T) / s, axis=1)
    expected = (1 - a - a * c) * q + a * weights @ toks
    heads = dn.in_context_heads(gamma, xi, d, temperature=c)
    np.testing.assert_allclose(gmlib.apply_heads(heads, toks, q), expected, rtol=1e-10, atol=1e-10)
    # the parameters of the docstring: U = (c S^-1, 0), V = (a I, 0), W_out = (I, -a(1 + c) I), residual heads
    assert heads.residual and heads.n_heads == 2 and heads.W_out.shape == (d, 2 * d)
    np.testing.assert_allclose(heads.U, np.stack([c * np.eye(d) / s, np.zeros((d, d))]), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(heads.V, np.stack([a * np.eye(d), np.zeros((d, d))]), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(heads.W_out, np.concatenate([np.eye(d), -a * (1 + c) * np.eye(d)], axis=1),
                               rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("gamma, xi, d, c", TEMPERED)
def test_tempered_family_on_the_infinite_prompt(gamma, xi, d, c):
    """(1 - a) z + a sum_k softmax_k(log pi_k + c m_k^T S^-1 z) m_k against population_attention, to 1e-10;
    at c = 1 it is the Bayes denoiser of every equal-norm task (Prop 4.4)."""
    rng = np.random.default_rng(1)
    means = rng.standard_normal((2, d))
    means *= 2.5 / np.linalg.norm(means, axis=1, keepdims=True)
    weights = np.array([0.3, 0.7])
    prob = dn.DenoisingProblem(weights, means, gamma, xi)
    q = 2.0 * rng.standard_normal((9, d))
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    beta = numpy_softmax(np.log(weights) + c * (q @ means.T) / s, axis=1)
    expected = (1 - a) * q + a * beta @ means
    heads = dn.in_context_heads(gamma, xi, d, temperature=c)
    got = gmlib.apply_heads(heads, prob.noisy, q)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
    # the same from the population operator itself: W_out (z + T_1(z), z + T_2(z))
    t1 = population_attention(prob.noisy, q, heads.U[0], heads.V[0])
    np.testing.assert_allclose(np.concatenate([q + t1, q], axis=1) @ np.asarray(heads.W_out).T, expected,
                               rtol=1e-10, atol=1e-10)
    if c == 1.0:
        np.testing.assert_allclose(got, prob.bayes(q), rtol=1e-10, atol=1e-10)


def test_tempered_family_rejects_bad_input():
    for bad in (0.0, -0.5, np.nan, np.inf, "hot", np.ones(2)):
        with pytest.raises(ValueError, match="`temperature`"):
            dn.in_context_heads(1.0, 1.0, 2, temperature=bad)
    for bad in (0, -1, 2.5, "2", None):
        with pytest.raises(ValueError, match="`dim`"):
            dn.in_context_heads(1.0, 1.0, bad)


def test_in_context_population_equals_bayes_for_random_tasks():
    rng = np.random.default_rng(11)
    heads = dn.in_context_heads(0.7, 1.3, 3)
    z = rng.normal(size=(50, 3)) * 3
    for _ in range(5):
        prob = random_equal_norm_problem(rng, 3)
        prob = dn.DenoisingProblem(prob.weights, prob.means, 0.7, 1.3)
        out = gmlib.apply_heads(heads, prob.noisy, z)
        expected = numpy_bayes(np.asarray(prob.weights), np.asarray(prob.means), 0.7, 1.3, z)
        np.testing.assert_allclose(out, expected, atol=1e-10)


def test_in_context_finite_prompt_converges():
    prob = dn.DenoisingProblem([0.3, 0.7], [[0.0, 2.0], [2.0, 0.0]], 0.5, 1.0)
    heads = dn.in_context_heads(0.5, 1.0, 2)
    z = np.array([[0.5, 0.5], [1.0, -1.0]])
    tokens, _ = prob.noisy.sample(key=jax.random.key(0), n_samples=200_000)
    out = gmlib.apply_heads(heads, tokens, z, block_size=50_000)
    np.testing.assert_allclose(out, prob.bayes(z), atol=0.03)
    # manual: the residual heads and the output map, written out
    t = np.asarray(tokens)
    scores = t @ (z / 1.25).T
    w = np.exp(scores - scores.max(0))
    head = (w.T @ t) / w.sum(0)[:, None] * 0.8
    np.testing.assert_allclose(out, (z + head) - 1.6 * z, atol=1e-10)


# ============================================================================ the plug-in estimator (reference)


@pytest.mark.parametrize("d, n_iter", [(2, 1), (2, 30), (4, 30)])
def test_estimate_task_is_em(d, n_iter):
    """The same iterates as an independent numpy EM, to 1e-10."""
    rng = np.random.default_rng(d)
    z = np.concatenate([rng.standard_normal((30, d)) + 2, rng.standard_normal((50, d)) * 1.2 - 1])
    task = dn.estimate_task(z, 0.6, 0.8, n_iter=n_iter)
    w_ref, m_ref = numpy_em(z, 0.6**2 + 0.8**2, n_iter)
    w, m = match_labels(np.asarray(task.weights), np.asarray(task.means), m_ref)
    np.testing.assert_allclose(m, m_ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(w, w_ref, rtol=1e-10, atol=1e-10)


def test_estimate_task_recovers_the_task_and_the_bayes_denoiser():
    """On a long prompt EM finds the means and the weight within a few standard errors, and the plug-in
    denoiser is close to the Bayes denoiser; on a short one it is worse (the error falls with L)."""
    gamma, xi, L = 1.0, 1.0, 20_000
    prob = dn.DenoisingProblem([0.3, 0.7], [[3.0, 0.0], [0.0, 3.0]], gamma, xi)
    _, z = prob.sample(key=jax.random.key(0), n_samples=L)
    task = dn.estimate_task(z, gamma, xi)
    w, m = match_labels(np.asarray(task.weights), np.asarray(task.means), np.asarray(prob.means))
    se_w = np.sqrt(0.3 * 0.7 / L)
    assert abs(w[0] - 0.3) < 5 * se_w
    np.testing.assert_allclose(m, prob.means, atol=5 * np.sqrt(2 / (0.3 * L)))
    _, q = prob.sample(key=jax.random.key(1), n_samples=2000)
    err = lambda t: float(np.mean(np.sum((t.bayes(q) - prob.bayes(q)) ** 2, -1)))  # noqa: E731
    short = dn.estimate_task(z[:50], gamma, xi)
    assert err(task) < 1e-3 < err(short)
    with pytest.raises(ValueError, match="`prompt`"):
        dn.estimate_task(z[:1], gamma, xi)
    with pytest.raises(ValueError, match="`n_iter`"):
        dn.estimate_task(z, gamma, xi, n_iter=0)


def test_finite_prompt_errors_against_numpy():
    """The heads' errors (at queries and at the means) and the plug-in's, recomputed in numpy from the same draws."""
    gamma, xi = 0.8, 1.2
    prob = dn.DenoisingProblem([0.3, 0.7], [[0.0, 2.0], [2.0, 0.0]], gamma, xi)
    heads = dn.in_context_heads(gamma, xi, 2)
    key, L, Q = jax.random.key(5), 300, 40
    attn, at_means, plug = jax.jit(lambda k: dn.finite_prompt_errors(heads, prob, key=k, prompt_length=L,
                                                                     n_queries=Q))(key)
    assert attn.shape == (Q,) and at_means.shape == (2,) and plug.shape == (Q,)
    k_tok, k_q = jax.random.split(key)
    tokens = np.asarray(prob.noisy.sample(key=k_tok, n_samples=L)[0])
    z = np.concatenate([np.asarray(prob.noisy.sample(key=k_q, n_samples=Q)[0]), np.asarray(prob.means)])
    target = numpy_bayes([0.3, 0.7], prob.means, gamma, xi, z)
    a, s = xi**2 / (gamma**2 + xi**2), gamma**2 + xi**2
    head = numpy_heads_on_tokens(np.eye(2)[None] / s, a * np.eye(2)[None], tokens, z)[0]
    sq = np.sum(((1 - 2 * a) * z + head - target) ** 2, -1)  # W_out (z + head, z) = z + head - 2a z
    np.testing.assert_allclose(attn, sq[:Q], rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(at_means, sq[Q:], rtol=1e-9, atol=1e-14)
    w, m = numpy_em(tokens, s, 50)
    plug_np = numpy_bayes(w, m, gamma, xi, z[:Q])
    np.testing.assert_allclose(plug, np.sum((plug_np - target[:Q]) ** 2, -1), rtol=1e-6, atol=1e-12)


# ============================================================================ prompts of random tasks (reference)


def test_task_excess_against_numpy():
    """Each prompt's mean squared distance to its task's Bayes denoiser (eq 10), in numpy; masked; infinite."""
    gamma, xi, d = 0.8, 1.2, 2
    sample = dn.task_sampler(gamma, xi, d, n_queries=3)
    b = sample(jax.random.key(0), 4, 30)
    heads = dn.in_context_heads(gamma, xi, d, temperature=0.5)
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    means, weights = (np.asarray(x) for x in b.aux)
    for L, infinite in ((30, False), (12, False), (30, True)):
        expected = []
        for i in range(4):
            q, toks = np.asarray(b.queries[i]), np.asarray(b.prompt[i, :L])
            beta = numpy_softmax(np.log(weights[i]) + (q @ means[i].T) / s - (means[i] ** 2).sum(1) / (2 * s), axis=1)
            bayes = (1 - a) * q + a * beta @ means[i]
            if infinite:
                pred = (1 - a) * q + a * numpy_softmax(np.log(weights[i]) + 0.5 * q @ means[i].T / s, axis=1) @ means[i]
            else:
                pred = (1 - 1.5 * a) * q + a * numpy_softmax(0.5 * q @ toks.T / s, axis=1) @ toks
            expected.append(np.mean(np.sum((pred - bayes) ** 2, -1)))
        batch = b._replace(mask=None if L == 30 else jnp.arange(30) < L)
        got = dn.task_excess(heads, batch, gamma, xi, infinite=infinite)
        np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_task_sampler_mixture_weights_per_prompt():
    """Each prompt's share of points at m_1 matches its own pi_1 (|z| < 5 in all 200 prompts); the same check
    fails when the two weights are swapped (the per-prompt comparison can fail)."""
    sample = dn.task_sampler(0.0, 0.5, 3, weight_range=(0.2, 0.4), n_queries=2000)
    b = sample(jax.random.key(0), 200, 1)
    z = weight_z_scores(b)
    assert np.abs(z).max() < 5 and abs(z.mean()) < 5 / np.sqrt(len(z))
    means, weights = b.aux
    swapped = b._replace(aux=(means, weights[:, ::-1]))
    assert np.abs(weight_z_scores(swapped)).min() > 5


def test_task_sampler_statistics():
    gamma, xi, radius = 0.5, 0.8, 2.0
    sample = dn.task_sampler(gamma, xi, 3, radius=radius, weight_range=(0.3, 0.7), n_queries=400)
    b = sample(jax.random.key(0), 256, 100)
    means, weights = b.aux
    assert b.prompt.shape == (256, 100, 3) and b.queries.shape == (256, 400, 3) and b.targets.shape == (256, 400, 3)
    np.testing.assert_allclose(jnp.linalg.norm(means, axis=-1), radius, rtol=1e-12)  # equal norms
    noise = np.asarray(b.queries - b.targets)
    np.testing.assert_allclose(noise.var(), xi**2, rtol=0.02)
    # the prompt's tokens follow the same task as the queries: mean of the tokens = sum_k pi_k m_k per prompt
    task_mean = np.einsum("bk,bkd->bd", np.asarray(weights), np.asarray(means))
    se = np.sqrt((gamma**2 + xi**2 + radius**2) / 100)
    assert np.abs(np.asarray(b.prompt).mean(1) - task_mean).max() < 5 * se


# ============================================================================ properties of random valid inputs


@SETTINGS
@given(gamma=st.one_of(st.just(0.0), floats(0.0, 3.0)), xi=st.one_of(st.just(1e-8), floats(1e-3, 3.0)),
       dim=st.sampled_from([1, 2, 3]))
def test_in_context_heads(gamma, xi, dim):
    p = dn.in_context_heads(gamma, xi, dim)
    for leaf in jax.tree.leaves(p):
        assert np.all(np.isfinite(np.asarray(leaf)))
    a = xi**2 / (gamma**2 + xi**2)
    np.testing.assert_allclose(np.asarray(p.V[0]), a * np.eye(dim), rtol=1e-12)


@SETTINGS
@given(prob=equal_norm_problems(), z=arrays((4, 3), -4.0, 4.0), c=floats(0.1, 3.0), seed=st.integers(0, 1000))
def test_in_context_heads_on_infinite_and_finite_prompts(prob, z, c, seed):
    """Prop 4.4: with in_context_heads(γ, ξ, d) the population output is the task's f*; on a finite prompt, at any
    temperature c, it is (1 - a - ac) z + a Σ_i softmax_i(c z_i^T z / s) z_i, written in numpy."""
    z = z[:, :prob.dim].astype(prob.dtype)
    t, sc = tol(prob.dtype), query_scale(prob, z)
    heads = dn.in_context_heads(prob.gamma, prob.xi, prob.dim)
    assert isinstance(heads, gmlib.Heads) and heads.dtype == prob.dtype
    out = as_f64(gmlib.apply_heads(heads, prob.noisy, z))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, as_f64(prob.bayes(z)), atol=(1e3 if prob.dtype == np.float64 else 300) * t * sc)
    toks = prob.noisy.sample(key=jax.random.key(seed), n_samples=16)[0]
    s = float(prob.gamma) ** 2 + float(prob.xi) ** 2
    a, eye = float(prob.xi) ** 2 / s, np.eye(prob.dim)[None]
    got = as_f64(gmlib.apply_heads(dn.in_context_heads(prob.gamma, prob.xi, prob.dim, temperature=c), toks, z))
    expected = (1 - a - a * c) * as_f64(z) + numpy_heads_on_tokens(c * eye / s, a * eye, toks, z)[0]
    np.testing.assert_allclose(got, expected, atol=100 * t * sc * (1 + np.abs(expected).max()))


@SETTINGS
@given(gamma=st.one_of(st.just(0.0), floats(0.0, 2.0)), xi=floats(0.05, 2.0), dim=st.sampled_from([1, 2]),
       radius=floats(0.1, 5.0), lo=floats(0.05, 0.5), width=floats(0.0, 0.45), n_queries=st.sampled_from([1, 3]),
       seed=st.integers(0, 2**31 - 1), bl=st.sampled_from([(1, 4), (3, 2)]))
def test_task_sampler(gamma, xi, dim, radius, lo, width, n_queries, seed, bl):
    """Batch shapes; equal-norm means (‖m_k‖ = radius); weights in range summing to one; reproducible."""
    B, L = bl
    sample = dn.task_sampler(gamma, xi, dim, radius=radius, weight_range=(lo, lo + width),
                                          n_queries=n_queries)
    b = sample(jax.random.key(seed), B, L)
    assert isinstance(b, gmlib.Batch)
    means, weights = b.aux
    assert b.prompt.shape == (B, L, dim) and b.queries.shape == b.targets.shape == (B, n_queries, dim)
    assert means.shape == (B, 2, dim) and weights.shape == (B, 2)
    for a in (b.prompt, b.queries, b.targets, means, weights):
        assert np.all(np.isfinite(as_f64(a)))
    t = 1e-5 if means.dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(np.linalg.norm(as_f64(means), axis=-1), radius, rtol=t)
    w = as_f64(weights)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=t)
    assert np.all(w[:, 0] >= lo - t) and np.all(w[:, 0] <= lo + width + t)
    again = sample(jax.random.key(seed), B, L)
    for a, c in zip(jax.tree.leaves(b), jax.tree.leaves(again)):
        np.testing.assert_array_equal(as_f64(a), as_f64(c))


# ============================================================================ invalid inputs


OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731


INT = OBJ(bad_positive_int)


def _bad_scalar(_):
    return st.sampled_from([np.nan, np.inf, -1.0, np.ones(2), "1", None, 1j])


@SETTINGS
@given(data=st.data())
def test_in_context_heads_rejects_invalid(data):
    # gamma and xi are host scalars (C.scalar): any real dtype, float128 included, is fine.
    scalar = Arg(dtype=False, extra=(negative,))
    spec = {"gamma": scalar, "xi": scalar,
            "dim": Arg(rank=False, finite=False, dtype=False, extra=(bad_positive_int,))}
    name, bad = data.draw(corrupt(dict(gamma=np.float64(0.5), xi=np.float64(1.0), dim=2), spec))
    assert_rejects(lambda: dn.in_context_heads(**bad), name)


@SETTINGS
@given(data=st.data())
def test_task_sampler_rejects_invalid(data):
    def bad_range(_):
        return st.sampled_from([(0.0, 0.5), (0.6, 0.4), (0.2, 1.0), (0.1, 0.2, 0.3), (np.nan, 0.5), ("a", "b"),
                                0.5, None])

    # the returned sample(key, batch_size, prompt_length) checks nothing: its sizes are static shapes
    args = dict(gamma=0.5, xi=1.0, dim=2, radius=3.0, weight_range=(0.2, 0.8), n_queries=1)
    spec = {"gamma": OBJ(lambda _: st.sampled_from([np.nan, np.inf, -1.0, np.ones(2), "1", None])),
            "xi": OBJ(_bad_scalar, lambda _: st.just(0.0)), "dim": INT, "radius": OBJ(_bad_scalar),
            "weight_range": OBJ(bad_range), "n_queries": INT}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: dn.task_sampler(**bad), name)


# ============================================================================ finite prompts (chapter 7)


def _test_batch(gamma=1.0, xi=0.5, d=2, n_prompts=16, length=32):
    return dn.task_sampler(gamma, xi, d, n_queries=3)(jax.random.key(7), n_prompts, length)


def test_excess_by_length_is_task_excess_on_the_first_tokens():
    batch = _test_batch()
    heads = dn.in_context_heads(1.0, 0.5, 2, temperature=0.7)
    at_L, at_inf = dn.excess_by_length(heads, batch, 1.0, 0.5, lengths=[4, 32])
    assert at_L.shape == (2, 16) and at_inf.shape == (16,)
    cut = batch._replace(prompt=batch.prompt[:, :4])  # the first 4 tokens, no mask
    np.testing.assert_allclose(at_L[0], dn.task_excess(heads, cut, 1.0, 0.5), rtol=1e-10)
    np.testing.assert_allclose(at_L[1], dn.task_excess(heads, batch, 1.0, 0.5), rtol=1e-10)
    np.testing.assert_allclose(at_inf, dn.task_excess(heads, batch, 1.0, 0.5, infinite=True), rtol=1e-10)


@pytest.mark.parametrize("corrected", [True, False])
def test_tempered_excess_is_each_head_scored(corrected):
    gamma, xi, d = 1.0, 2.0, 2
    batch = _test_batch(gamma, xi, d)
    temps = [0.5, 1.0, 1.5]
    at_L, at_inf = dn.tempered_excess(batch, gamma, xi, temperatures=temps, lengths=[8, 32], corrected=corrected)
    assert at_L.shape == (3, 2, 16) and at_inf.shape == (3, 16)
    a = xi**2 / (gamma**2 + xi**2)
    for t, c in enumerate(temps):
        heads = dn.in_context_heads(gamma, xi, d, temperature=c)
        factor = 1 + c if corrected else 2.0  # the output map (I, -a(1 + c) I) or (I, -2a I), in numpy
        w_out = np.concatenate([np.eye(d), -a * factor * np.eye(d)], axis=1)
        heads = gmlib.Heads(heads.U, heads.V, jnp.asarray(w_out), True)
        want_L, want_inf = dn.excess_by_length(heads, batch, gamma, xi, lengths=[8, 32])
        np.testing.assert_allclose(at_L[t], want_L, rtol=1e-10)
        np.testing.assert_allclose(at_inf[t], want_inf, rtol=1e-10, atol=1e-24)
    assert np.all(at_inf[1] < 1e-20)  # c = 1 is Prop 4.4 either way: exact on the infinite prompt


def test_plug_in_excess_against_a_loop():
    gamma, xi = 1.0, 0.5
    batch = _test_batch(gamma, xi, n_prompts=4)
    got = dn.plug_in_excess(batch, gamma, xi, length=20)
    for b in range(4):
        truth = dn.DenoisingProblem(batch.aux[1][b], batch.aux[0][b], gamma, xi)
        guess = dn.estimate_task(batch.prompt[b, :20], gamma, xi)
        q = batch.queries[b]
        want = np.mean(np.sum((np.asarray(guess.bayes(q)) - np.asarray(truth.bayes(q))) ** 2, -1))
        np.testing.assert_allclose(got[b], want, rtol=1e-8)


def test_train_in_context_trains_each_model_as_alone():
    """Side by side on the same prompts, with Adam, a model ends where it ends alone."""
    import optax

    kw = dict(optimizer=optax.adam(1e-2), lengths=[4, 8], seeds=[[0, 1], [2, 3]], init_seeds=[5, 6],
              n_steps=20, batch_size=4, n_queries=2, n_records=2)
    start = dn.in_context_heads(1.0, 1.0, 2)
    both = dn.train_in_context({"soft": ("softmax", "random"), "lin": ("linear", start)}, 1.0, 1.0, 2, **kw)
    alone = dn.train_in_context({"soft": ("softmax", "random")}, 1.0, 1.0, 2, **kw)
    assert both.params["soft"].U.shape == (2, 2, 2, 2, 2)
    assert both.trajectory["lin"].U.shape == (2, 2, 2, 2, 2, 2)  # (lengths, seeds, records, H, d, d)
    assert both.params["soft"].U.dtype == jnp.float32
    np.testing.assert_allclose(both.params["soft"].U, alone.params["soft"].U, rtol=1e-5, atol=1e-6)
    assert not np.allclose(both.params["lin"].U, start.U)  # the linear model trained too


def test_trained_excess_scores_each_run_at_its_length():
    """Each run equals excess_by_length on the masked prompts, for heads and for a predictor."""
    import optax
    from jax.tree_util import Partial

    from gmlib import apply_heads

    kw = dict(optimizer=optax.adam(1e-2), lengths=[4, 8], seeds=[[0, 1], [2, 3]], init_seeds=[5, 6],
              n_steps=10, batch_size=4, n_queries=2)

    def forward(heads, prompt, queries, mask):  # a "network": the heads themselves, scaled
        return 0.9 * apply_heads(heads, prompt, queries, kind="softmax", mask=mask)

    start = dn.in_context_heads(1.0, 1.0, 2, temperature=0.5)
    models = {"soft": ("softmax", "random"), "lin": ("linear", start), "net": (forward, lambda seed: start)}
    out = dn.train_in_context(models, 1.0, 1.0, 2, **kw)
    tests = dn.task_sampler(1.0, 1.0, 2, n_queries=3)(jax.random.key(9), 16, 10)
    got = dn.trained_excess(models, out.params, tests, 1.0, 1.0, lengths=[4, 8])
    for name, (kind, _) in models.items():
        assert got[name].shape == (2, 2)
        for i, length in enumerate([4, 8]):
            for j in range(2):
                run = jax.tree.map(lambda x: x[i, j].astype(jnp.float64), out.params[name])
                f, k = (run, kind) if isinstance(kind, str) else (Partial(forward, run), "softmax")
                want = dn.excess_by_length(f, tests, 1.0, 1.0, lengths=[length], kind=k)[0].mean()
                np.testing.assert_allclose(got[name][i, j], want, rtol=1e-10)
    # in float32: the same values to float32 accuracy
    low = dn.trained_excess(models, out.params, tests, 1.0, 1.0, lengths=[4, 8], dtype=jnp.float32)
    np.testing.assert_allclose(low["soft"], got["soft"], rtol=1e-4)
    with pytest.raises(ValueError, match="lengths"):
        dn.trained_excess(models, out.params, tests, 1.0, 1.0, lengths=[4, 11])
    with pytest.raises(ValueError, match="lengths"):
        dn.trained_excess(models, out.params, tests, 1.0, 1.0, lengths=[4])
    with pytest.raises(ValueError, match="models"):
        dn.trained_excess({"other": ("softmax", "random")}, out.params, tests, 1.0, 1.0, lengths=[4, 8])
