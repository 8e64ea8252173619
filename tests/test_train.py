"""gmlib.train and the in-context part of gmlib.denoise: the tempered family, the plug-in
estimator, the finite-prompt model, the prompt samplers, the training loops and the sweep.

Reference tests compare with independent numpy computations; property tests (hypothesis,
strategies from ``strategies.py``) check invariants on random valid inputs and that invalid
inputs get a ValueError naming the argument.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import DTYPES, SETTINGS, Arg, arrays, assert_rejects, asymmetric, bad_positive_int, \
    corrupt, floats, indefinite, tol

from gmlib import GaussianMixture, denoise, linear_attention, population_attention, softmax_attention, train

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ============================================================================ the tempered family (reference)

TEMPERED = [(1.0, 1.0, 2, 1.0), (1.0, 0.5, 2, 0.3), (1.0, 2.0, 3, 0.6), (0.0, 1.5, 2, 2.0), (0.7, 1.0, 5, 0.1)]


@pytest.mark.parametrize("gamma, xi, d, c", TEMPERED)
def test_tempered_family_on_a_finite_prompt(gamma, xi, d, c):
    """(1 - a - ac) z + a sum_i softmax_i(c z_i^T S^-1 z) z_i, in plain numpy, to 1e-10."""
    rng = np.random.default_rng(0)
    toks, q = 2.0 * rng.standard_normal((50, d)), 2.0 * rng.standard_normal((7, d))
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    weights = _softmax(c * (q @ toks.T) / s, axis=1)
    expected = (1 - a - a * c) * q + a * weights @ toks
    ic = denoise.in_context_params(gamma, xi, d, temperature=c)
    np.testing.assert_allclose(denoise.in_context_denoise(ic, toks, q), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("gamma, xi, d, c", TEMPERED)
def test_tempered_family_on_the_infinite_prompt(gamma, xi, d, c):
    """(1 - a) z + a sum_k softmax_k(log pi_k + c m_k^T S^-1 z) m_k against population_attention, to 1e-10;
    at c = 1 it is the Bayes denoiser of every equal-norm task (Prop 4.4)."""
    rng = np.random.default_rng(1)
    means = rng.standard_normal((2, d))
    means *= 2.5 / np.linalg.norm(means, axis=1, keepdims=True)
    weights = np.array([0.3, 0.7])
    prob = denoise.DenoisingProblem(weights, means, gamma, xi)
    q = 2.0 * rng.standard_normal((9, d))
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    beta = _softmax(np.log(weights) + c * (q @ means.T) / s, axis=1)
    expected = (1 - a) * q + a * beta @ means
    ic = denoise.in_context_params(gamma, xi, d, temperature=c)
    got = denoise.in_context_denoise(ic, prob.noisy, q)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
    # the same from the population operator itself: W_out (z + T_1(z), z + T_2(z))
    t1 = population_attention(prob.noisy, q, ic.U1, ic.V1)
    np.testing.assert_allclose(np.concatenate([q + t1, q], axis=1) @ np.asarray(ic.W_out).T, expected,
                               rtol=1e-10, atol=1e-10)
    if c == 1.0:
        np.testing.assert_allclose(got, prob.bayes(q), rtol=1e-10, atol=1e-10)


def test_tempered_family_rejects_bad_input():
    for bad in (0.0, -0.5, np.nan, np.inf, "hot", np.ones(2)):
        with pytest.raises(ValueError, match="`temperature`"):
            denoise.in_context_params(1.0, 1.0, 2, temperature=bad)
    for bad in (0, -1, 2.5, "2", None):
        with pytest.raises(ValueError, match="`dim`"):
            denoise.in_context_params(1.0, 1.0, bad)


# ============================================================================ the plug-in estimator (reference)


def _numpy_em(z, s, n_iter):
    """EM for two components of known covariance s I, from the start of denoise.estimate_task."""
    lam, vec = np.linalg.eigh(np.cov(z.T).reshape(z.shape[1], z.shape[1]))
    step = np.sqrt(lam[-1]) * vec[:, -1]
    means, w = np.stack([z.mean(0) + step, z.mean(0) - step]), np.array([0.5, 0.5])
    for _ in range(n_iter):
        r = _softmax(np.log(w) - ((z[:, None, :] - means) ** 2).sum(-1) / (2 * s), axis=1)
        w, means = r.mean(0), (r.T @ z) / r.sum(0)[:, None]
    return w, means


def _match(w, means, ref_means):
    """The labelling of (w, means) closest to ref_means (EM is defined up to swapping the labels)."""
    if np.linalg.norm(means - ref_means) > np.linalg.norm(means[::-1] - ref_means):
        return w[::-1], means[::-1]
    return w, means


@pytest.mark.parametrize("d, n_iter", [(2, 1), (2, 30), (4, 30)])
def test_estimate_task_is_em(d, n_iter):
    """The same iterates as an independent numpy EM, to 1e-10."""
    rng = np.random.default_rng(d)
    z = np.concatenate([rng.standard_normal((30, d)) + 2, rng.standard_normal((50, d)) * 1.2 - 1])
    task = denoise.estimate_task(z, 0.6, 0.8, n_iter=n_iter)
    w_ref, m_ref = _numpy_em(z, 0.6**2 + 0.8**2, n_iter)
    w, m = _match(np.asarray(task.weights), np.asarray(task.means), m_ref)
    np.testing.assert_allclose(m, m_ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(w, w_ref, rtol=1e-10, atol=1e-10)


def test_estimate_task_recovers_the_task_and_the_bayes_denoiser():
    """On a long prompt EM finds the means and the weight within a few standard errors, and the plug-in
    denoiser is close to the Bayes denoiser; on a short one it is worse (the error falls with L)."""
    gamma, xi, L = 1.0, 1.0, 20_000
    prob = denoise.DenoisingProblem([0.3, 0.7], [[3.0, 0.0], [0.0, 3.0]], gamma, xi)
    _, z = prob.sample(jax.random.key(0), L)
    task = denoise.estimate_task(z, gamma, xi)
    w, m = _match(np.asarray(task.weights), np.asarray(task.means), np.asarray(prob.means))
    se_w = np.sqrt(0.3 * 0.7 / L)
    assert abs(w[0] - 0.3) < 5 * se_w
    np.testing.assert_allclose(m, prob.means, atol=5 * np.sqrt(2 / (0.3 * L)))
    _, q = prob.sample(jax.random.key(1), 2000)
    err = lambda t: float(np.mean(np.sum((t.bayes(q) - prob.bayes(q)) ** 2, -1)))  # noqa: E731
    short = denoise.estimate_task(z[:50], gamma, xi)
    assert err(task) < 1e-3 < err(short)
    with pytest.raises(ValueError, match="`prompt`"):
        denoise.estimate_task(z[:1], gamma, xi)
    with pytest.raises(ValueError, match="`n_iter`"):
        denoise.estimate_task(z, gamma, xi, n_iter=0)


# ============================================================================ the model (reference)


def test_apply_heads_against_direct_sum():
    key = jax.random.key(0)
    params = train.init_heads(key, n_heads=3, dim=2, out_dim=4)
    toks = jax.random.normal(jax.random.key(1), (40, 2))
    q = jax.random.normal(jax.random.key(2), (5, 2))
    for kind, op in [("softmax", softmax_attention), ("linear", linear_attention)]:
        heads = [op(toks, q, params["U"][h], params["V"][h]) + q for h in range(3)]
        expected = np.concatenate([np.asarray(h) for h in heads], axis=1) @ np.asarray(params["W_out"]).T
        np.testing.assert_allclose(train.apply_heads(params, toks, q, kind=kind, residual=True), expected,
                                   rtol=1e-12)
    no_out = {"U": params["U"], "V": params["V"]}
    summed = sum(softmax_attention(toks, q, params["U"][h], params["V"][h]) for h in range(3))
    np.testing.assert_allclose(train.apply_heads(no_out, toks, q), summed, rtol=1e-12)


@pytest.mark.parametrize("kind", ["softmax", "linear"])
def test_apply_heads_masked_prompt_equals_the_unpadded_one(kind):
    """Padding a prompt of L tokens with garbage and masking it gives the output on the L tokens, under jit."""
    params = train.init_heads(jax.random.key(0), n_heads=2, dim=3, out_dim=3)
    toks = jax.random.normal(jax.random.key(1), (64, 3))
    q = jax.random.normal(jax.random.key(2), (5, 3))
    f = jax.jit(lambda t, L: train.apply_heads(params, t, q, kind=kind, residual=True, mask=jnp.arange(64) < L))
    for L in (1, 17, 64):
        padded = toks.at[L:].set(50.0)  # scores far above the real ones: any leak would show
        np.testing.assert_allclose(f(padded, L), train.apply_heads(params, toks[:L], q, kind=kind, residual=True),
                                   rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="`mask`"):
        train.apply_heads(params, toks, q, mask=jnp.ones(63, bool))


@pytest.mark.parametrize("kind, op", [("softmax", population_attention), ("linear", None)])
def test_apply_heads_on_the_infinite_prompt(kind, op):
    """A GaussianMixture prompt: W_out (z + T_h[mu](z))_h with the population operators; for linear attention
    T[mu](z) = V E[z' z'^T] U z, computed in numpy."""
    params = train.init_heads(jax.random.key(0), n_heads=2, dim=2, out_dim=2)
    mix = GaussianMixture.isotropic(jnp.array([0.4, 0.6]), jnp.array([[1.0, 0.0], [0.0, 2.0]]), 0.7)
    q = jax.random.normal(jax.random.key(2), (5, 2))
    heads = []
    for U, V in zip(params["U"], params["V"]):
        if op is not None:
            heads.append(np.asarray(op(mix, q, U, V)))
        else:
            m2 = 0.49 * np.eye(2) + np.asarray(mix.means).T @ np.diag([0.4, 0.6]) @ np.asarray(mix.means)
            heads.append(np.asarray(q) @ (np.asarray(V) @ m2 @ np.asarray(U)).T)
    expected = np.concatenate([h + np.asarray(q) for h in heads], axis=1) @ np.asarray(params["W_out"]).T
    np.testing.assert_allclose(train.apply_heads(params, mix, q, kind=kind, residual=True), expected,
                               rtol=1e-10, atol=1e-12)


def test_denoising_excess_against_numpy():
    """Each prompt's mean squared distance to its task's Bayes denoiser (eq 10), in numpy; masked; infinite."""
    gamma, xi, d = 0.8, 1.2, 2
    sample = train.denoising_task_sampler(gamma, xi, d, n_queries=3)
    b = sample(jax.random.key(0), 4, 30)
    ic = denoise.in_context_params(gamma, xi, d, temperature=0.5)
    params = {"U": jnp.stack([ic.U1, ic.U2]), "V": jnp.stack([ic.V1, ic.V2]), "W_out": ic.W_out}
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    means, weights = (np.asarray(x) for x in b.aux)
    for L, infinite in ((30, False), (12, False), (30, True)):
        expected = []
        for i in range(4):
            q, toks = np.asarray(b.queries[i]), np.asarray(b.tokens[i, :L])
            beta = _softmax(np.log(weights[i]) + (q @ means[i].T) / s - (means[i] ** 2).sum(1) / (2 * s), axis=1)
            bayes = (1 - a) * q + a * beta @ means[i]
            if infinite:
                pred = (1 - a) * q + a * _softmax(np.log(weights[i]) + 0.5 * q @ means[i].T / s, axis=1) @ means[i]
            else:
                pred = (1 - 1.5 * a) * q + a * _softmax(0.5 * q @ toks.T / s, axis=1) @ toks
            expected.append(np.mean(np.sum((pred - bayes) ** 2, -1)))
        batch = b._replace(mask=None if L == 30 else jnp.arange(30) < L)
        got = train.denoising_excess(params, batch, gamma, xi, infinite=infinite)
        np.testing.assert_allclose(got, expected, rtol=1e-10)


# ============================================================================ the samplers (reference)


def _weight_z_scores(batch):
    """Per prompt, (fraction of clean points at m_1 - pi_1) / its binomial standard error (gamma = 0:
    every clean point sits exactly on its component's mean)."""
    means, weights = (np.asarray(x) for x in batch.aux)
    pts = np.concatenate([np.asarray(batch.targets)], axis=1)
    at_first = np.linalg.norm(pts - means[:, None, 0], axis=-1) < np.linalg.norm(pts - means[:, None, 1], axis=-1)
    p = weights[:, 0]
    return (at_first.mean(1) - p) / np.sqrt(p * (1 - p) / pts.shape[1])


def test_denoising_sampler_mixture_weights_per_prompt():
    """Each prompt's share of points at m_1 matches its own pi_1 (|z| < 5 in all 200 prompts); the same check
    fails when the two weights are swapped (the per-prompt comparison can fail)."""
    sample = train.denoising_task_sampler(0.0, 0.5, 3, weight_range=(0.2, 0.4), n_queries=2000)
    b = sample(jax.random.key(0), 200, 1)
    z = _weight_z_scores(b)
    assert np.abs(z).max() < 5 and abs(z.mean()) < 5 / np.sqrt(len(z))
    means, weights = b.aux
    swapped = b._replace(aux=(means, weights[:, ::-1]))
    assert np.abs(_weight_z_scores(swapped)).min() > 5


def test_denoising_sampler_statistics():
    gamma, xi, radius = 0.5, 0.8, 2.0
    sample = train.denoising_task_sampler(gamma, xi, 3, radius=radius, weight_range=(0.3, 0.7), n_queries=400)
    b = sample(jax.random.key(0), 256, 100)
    means, weights = b.aux
    assert b.tokens.shape == (256, 100, 3) and b.queries.shape == (256, 400, 3) and b.targets.shape == (256, 400, 3)
    np.testing.assert_allclose(jnp.linalg.norm(means, axis=-1), radius, rtol=1e-12)  # equal norms
    noise = np.asarray(b.queries - b.targets)
    np.testing.assert_allclose(noise.var(), xi**2, rtol=0.02)
    # the prompt's tokens follow the same task as the queries: mean of the tokens = sum_k pi_k m_k per prompt
    task_mean = np.einsum("bk,bkd->bd", np.asarray(weights), np.asarray(means))
    se = np.sqrt((gamma**2 + xi**2 + radius**2) / 100)
    assert np.abs(np.asarray(b.tokens).mean(1) - task_mean).max() < 5 * se


def test_classification_sampler_statistics():
    mp, mn = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    cov = np.array([[1.0, 0.3], [0.3, 0.5]])
    sample = train.classification_prompt_sampler(mp, mn, cov, 0.6, n_queries=3)
    b = sample(jax.random.key(0), 512, 200)
    assert b.tokens.shape == (512, 200, 3) and b.queries.shape == (512, 3, 3) and b.targets.shape == (512, 3, 1)
    y = np.asarray(b.tokens[..., 2]).ravel()
    x = np.asarray(b.tokens[..., :2]).reshape(-1, 2)
    np.testing.assert_allclose((y > 0).mean(), 0.6, atol=0.01)
    np.testing.assert_allclose(x[y > 0].mean(0), mp, atol=0.01)
    np.testing.assert_allclose(np.cov(x[y < 0].T), cov, atol=0.02)
    assert np.all(np.asarray(b.queries[..., 2]) == 0)


# ============================================================================ training (reference)


def test_fit_reaches_known_optimum():
    """One linear-attention head on prompts of N(0, I) tokens, target A q: the optimum has V U = A.

    With L tokens, linear attention is V M U q with M the empirical second moment (about I).
    """
    A = jnp.array([[1.0, -0.5, 0.0], [0.3, 0.8, 0.2], [0.0, 0.4, -1.0]])

    def sampler(key, batch, L):
        kt, kq = jax.random.split(key)
        toks = jax.random.normal(kt, (batch, L, 3))
        q = jax.random.normal(kq, (batch, 4, 3))
        return train.Batch(toks, q, q @ A.T)

    def loss(params, b):
        pred = jax.vmap(lambda t, q: train.apply_heads(params, t, q, kind="linear"))(b.tokens, b.queries)
        return jnp.mean((pred - b.targets) ** 2)

    params = train.init_heads(jax.random.key(0), n_heads=1, dim=3, scale=0.5)
    result = train.fit(loss, params, sampler, optax.adam(optax.cosine_decay_schedule(2e-2, 1500)),
                       jax.random.key(1), n_steps=1500, batch_size=16, prompt_length=2000, record_every=500)
    VU = result.params["V"][0] @ result.params["U"][0]
    np.testing.assert_allclose(VU, A, atol=3e-2)
    assert result.steps.tolist() == [500, 1000, 1500]
    assert result.metric.shape == (3,) and float(result.metric[-1]) < 1e-2 < float(result.metric[0])


def test_training_run_length_masks_the_prompt():
    """A run with length = prompt_length (every token counts) is the run without a length; a shorter length
    changes the run, and the run from given params starts there."""
    sample = train.denoising_task_sampler(0.5, 1.0, 2)

    def loss(p, b):
        pred = jax.vmap(lambda t, q: train.apply_heads(p, t, q, residual=True, mask=b.mask))(b.tokens, b.queries)
        return jnp.mean((pred - b.targets) ** 2)

    init = lambda k: train.init_heads(k, n_heads=2, dim=2, out_dim=2)  # noqa: E731
    run = jax.jit(train.training_run(loss, init, sample, optax.adam(1e-2), n_steps=6, batch_size=4,
                                     prompt_length=16, record_every=2))
    key, p0 = jax.random.key(3), init(jax.random.key(9))
    full, masked, short = run(key, p0), run(key, p0, 16), run(key, p0, 5)
    np.testing.assert_allclose(full[1], masked[1], rtol=1e-12)
    assert full[1].shape == (3,) and not np.allclose(full[1], short[1])
    from_init = run(key)
    assert not np.allclose(from_init[1], full[1])


SWEEP_SCRIPT = textwrap.dedent(
    """
    import json
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import optax
    from gmlib import train

    sampler = train.denoising_task_sampler(0.5, 1.0, 2)

    def loss(p, b):
        pred = jax.vmap(lambda t, q: train.apply_heads(p, t, q, residual=True, mask=b.mask))(b.tokens, b.queries)
        return jnp.mean((pred - b.targets) ** 2)

    run = train.training_run(loss, lambda k: train.init_heads(k, n_heads=2, dim=2, out_dim=2), sampler,
                             optax.adam(1e-2), n_steps=20, batch_size=4, prompt_length=16, record_every=1)
    lengths = jnp.array([16, 8, 4, 16, 8, 4])
    params, losses = train.sharded_sweep(lambda k, L: run(k, length=L), list(range(6)), lengths)
    print(json.dumps({"n_devices": jax.device_count(), "losses": losses.tolist(), "U": params["U"].tolist()}))
    """
)


def run_sweep(n_devices):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={n_devices}")
    res = subprocess.run([sys.executable, "-c", SWEEP_SCRIPT], env=env, capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_sharded_sweep_matches_single_device():
    """6 runs (seeds and prompt lengths) over 4 simulated CPU devices (padded to 8) give the single-device
    result."""
    four, one = run_sweep(4), run_sweep(1)
    assert four["n_devices"] == 4 and one["n_devices"] == 1
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-10)
    np.testing.assert_allclose(four["U"], one["U"], rtol=1e-10)
    losses = np.asarray(one["losses"])
    assert losses.shape == (6, 20) and len({round(v, 8) for v in losses[:, 0]}) == 6  # seeds differ


# ============================================================================ properties: init_heads, apply_heads


OPT = optax.sgd(1e-2)
OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731
INT = OBJ(bad_positive_int)


def _np(a):
    return np.asarray(a, np.float64)


# ============================================================================ init_heads, apply_heads


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), n_heads=st.sampled_from([1, 3]), dim=st.sampled_from([1, 2]),
       value_dim=st.sampled_from([None, 2]), out_dim=st.sampled_from([None, 1, 3]), scale=floats(0.0, 3.0),
       dtype=st.sampled_from(DTYPES))
def test_init_heads(seed, n_heads, dim, value_dim, out_dim, scale, dtype):
    """Shapes (H, D, D), (H, D_v, D), (D_y, H D_v); dtype; finite; reproducible; U, V linear in ``scale``."""
    kw = dict(n_heads=n_heads, dim=dim, value_dim=value_dim, out_dim=out_dim, dtype=dtype)
    p = train.init_heads(jax.random.key(seed), scale=scale, **kw)
    p1 = train.init_heads(jax.random.key(seed), scale=1.0, **kw)
    dv = value_dim or dim
    want = {"U": (n_heads, dim, dim), "V": (n_heads, dv, dim)}
    if out_dim is not None:
        want["W_out"] = (out_dim, n_heads * dv)
    assert {k: v.shape for k, v in p.items()} == want
    assert all(v.dtype == dtype and np.all(np.isfinite(_np(v))) for v in p.values())
    for k in ("U", "V"):
        np.testing.assert_allclose(_np(p[k]), scale * _np(p1[k]), rtol=tol(dtype), atol=tol(dtype))
    if out_dim is not None:
        np.testing.assert_array_equal(_np(p["W_out"]), _np(p1["W_out"]))


@st.composite
def head_layers(draw):
    """(params, tokens, queries, kind, residual) of a valid apply_heads call."""
    dtype = draw(st.sampled_from(DTYPES))
    H, D, L = draw(st.sampled_from([(1, 2, 5), (3, 2, 8), (2, 3, 5)]))
    residual = draw(st.booleans())
    dv = D if residual else draw(st.sampled_from([1, D]))
    params = {"U": draw(arrays((H, D, D))).astype(dtype), "V": draw(arrays((H, dv, D))).astype(dtype)}
    if draw(st.booleans()):
        params["W_out"] = draw(arrays((2, H * dv))).astype(dtype)
    return (params, draw(arrays((L, D))).astype(dtype), draw(arrays((2, D))).astype(dtype),
            draw(st.sampled_from(["softmax", "linear"])), residual)


@SETTINGS
@given(layer=head_layers(), seed=st.integers(0, 1000))
def test_apply_heads_formula_and_symmetries(layer, seed):
    """W_out [r z + T_h(z)]_h (or Σ_h); invariant to permuting or duplicating the tokens, and to permuting
    the heads together with W_out's column blocks."""
    params, toks, q, kind, residual = layer
    t = tol(toks.dtype)
    out = _np(train.apply_heads(params, toks, q, kind=kind, residual=residual))
    op = softmax_attention if kind == "softmax" else linear_attention
    heads = [_np(op(toks, q, U, V)) + (_np(q) if residual else 0) for U, V in zip(params["U"], params["V"])]
    expected = np.concatenate(heads, axis=1) @ _np(params["W_out"]).T if "W_out" in params else sum(heads)
    assert out.shape == expected.shape and np.all(np.isfinite(out))
    sc = 10 * t * (1 + np.abs(expected).max()) * 30
    np.testing.assert_allclose(out, expected, atol=sc)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(toks.shape[0])
    twice = np.concatenate([toks[perm]] * 2)
    np.testing.assert_allclose(_np(train.apply_heads(params, twice, q, kind=kind, residual=residual)), out, atol=sc)
    hp = rng.permutation(params["U"].shape[0])
    permuted = {"U": params["U"][hp], "V": params["V"][hp]}
    if "W_out" in params:
        dv = params["V"].shape[1]
        blocks = params["W_out"].reshape(params["W_out"].shape[0], -1, dv)
        permuted["W_out"] = blocks[:, hp].reshape(params["W_out"].shape)
    np.testing.assert_allclose(_np(train.apply_heads(permuted, toks, q, kind=kind, residual=residual)), out,
                               atol=sc)


# ============================================================================ samplers


@SETTINGS
@given(gamma=st.one_of(st.just(0.0), floats(0.0, 2.0)), xi=floats(0.05, 2.0), dim=st.sampled_from([1, 2]),
       radius=floats(0.1, 5.0), lo=floats(0.05, 0.5), width=floats(0.0, 0.45), n_queries=st.sampled_from([1, 3]),
       seed=st.integers(0, 2**31 - 1), bl=st.sampled_from([(1, 4), (3, 2)]))
def test_denoising_task_sampler(gamma, xi, dim, radius, lo, width, n_queries, seed, bl):
    """Batch shapes; equal-norm means (‖m_k‖ = radius); weights in range summing to one; reproducible."""
    B, L = bl
    sample = train.denoising_task_sampler(gamma, xi, dim, radius=radius, weight_range=(lo, lo + width),
                                          n_queries=n_queries)
    b = sample(jax.random.key(seed), B, L)
    assert isinstance(b, train.Batch)
    means, weights = b.aux
    assert b.tokens.shape == (B, L, dim) and b.queries.shape == b.targets.shape == (B, n_queries, dim)
    assert means.shape == (B, 2, dim) and weights.shape == (B, 2)
    for a in (b.tokens, b.queries, b.targets, means, weights):
        assert np.all(np.isfinite(_np(a)))
    t = 1e-5 if means.dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(np.linalg.norm(_np(means), axis=-1), radius, rtol=t)
    w = _np(weights)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=t)
    assert np.all(w[:, 0] >= lo - t) and np.all(w[:, 0] <= lo + width + t)
    again = sample(jax.random.key(seed), B, L)
    for a, c in zip(jax.tree.leaves(b), jax.tree.leaves(again)):
        np.testing.assert_array_equal(_np(a), _np(c))


@st.composite
def lda_tasks(draw):
    d = draw(st.sampled_from([1, 2]))
    a = draw(arrays((d, d), -1.0, 1.0))
    cov = a @ a.T + 0.2 * np.eye(d)
    return dict(mean_pos=draw(arrays((d,))), mean_neg=draw(arrays((d,))), cov=0.5 * (cov + cov.T),
                p_pos=draw(floats(0.05, 0.95)))


@SETTINGS
@given(task=lda_tasks(), n_queries=st.sampled_from([1, 3]), seed=st.integers(0, 2**31 - 1),
       bl=st.sampled_from([(1, 4), (3, 2)]))
def test_classification_prompt_sampler(task, n_queries, seed, bl):
    """Tokens (x, y) with y = ±1, queries (x, 0), targets ±1 of shape (B, Q, 1); reproducible."""
    B, L = bl
    d = task["mean_pos"].shape[0]
    sample = train.classification_prompt_sampler(**task, n_queries=n_queries)
    b = sample(jax.random.key(seed), B, L)
    assert isinstance(b, train.Batch)
    assert b.tokens.shape == (B, L, d + 1) and b.queries.shape == (B, n_queries, d + 1)
    assert b.targets.shape == (B, n_queries, 1)
    for a in (b.tokens, b.queries, b.targets):
        assert np.all(np.isfinite(_np(a)))
    assert set(np.unique(_np(b.tokens[..., -1]))) <= {-1.0, 1.0}
    assert set(np.unique(_np(b.targets))) <= {-1.0, 1.0}
    assert np.all(_np(b.queries[..., -1]) == 0)
    again = sample(jax.random.key(seed), B, L)
    np.testing.assert_array_equal(_np(again.tokens), _np(b.tokens))


# ============================================================================ training loops


def _loss(params, batch):
    pred = jax.vmap(lambda tk, q: train.apply_heads(params, tk, q, kind="linear", residual=True))(batch.tokens,
                                                                                                   batch.queries)
    return jnp.mean((pred - batch.targets) ** 2)


SAMPLER = train.denoising_task_sampler(0.5, 1.0, 2)


def _sum_of_squares(params):  # one function object: fit's compiled records are reused across examples
    return jnp.sum(params["U"] ** 2)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), n_steps=st.sampled_from([1, 2]), n_heads=st.sampled_from([1, 2]),
       with_metric=st.booleans())
def test_fit_returns_finite_history(seed, n_steps, n_heads, with_metric):
    """n_steps records (record_every = 1) of finite losses or metrics, steps 1..n, the params' structure kept,
    the same key giving the same run. (The compiled chunk is cached per loss, sampler, optimizer and sizes,
    so the examples reuse a few compilations.)"""
    params = train.init_heads(jax.random.key(seed), n_heads=n_heads, dim=2)
    metric = _sum_of_squares if with_metric else None
    kw = dict(n_steps=n_steps, batch_size=2, prompt_length=4, record_every=1, metric=metric)
    out, steps, records, _ = train.fit(_loss, params, SAMPLER, OPT, jax.random.key(seed + 1), **kw)
    assert steps.tolist() == list(range(1, n_steps + 1))
    assert records.shape == (n_steps,) and np.all(np.isfinite(_np(records)))
    assert jax.tree.structure(out) == jax.tree.structure(params)
    assert all(a.shape == b.shape and np.all(np.isfinite(_np(a))) for a, b in zip(jax.tree.leaves(out),
                                                                                    jax.tree.leaves(params)))
    again = train.fit(_loss, params, SAMPLER, OPT, jax.random.key(seed + 1), **kw)
    np.testing.assert_array_equal(_np(again.metric), _np(records))


def _runs(record_every):
    run = train.training_run(_loss, lambda k: train.init_heads(k, n_heads=1, dim=2), SAMPLER, OPT, n_steps=2,
                             batch_size=2, prompt_length=4, record_every=record_every)
    return run, jax.jit(run)


#: one run per record_every: the sweep's compilation is cached per (run, seed count)
RUNS = {r: _runs(r) for r in (1, 2)}


@SETTINGS
@given(seeds=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=3), record_every=st.sampled_from([1, 2]))
def test_training_run_and_sharded_sweep_equal_a_python_loop(seeds, record_every):
    """training_run's losses have shape (n_steps // record_every,) and are finite; sharded_sweep over this
    process's devices equals run(key(seed)) seed by seed."""
    run, loop = RUNS[record_every]
    params, losses = train.sharded_sweep(run, seeds)
    assert losses.shape == (len(seeds), 2 // record_every) and np.all(np.isfinite(_np(losses)))
    assert params["U"].shape == (len(seeds), 1, 2, 2)
    for i, s in enumerate(seeds):
        p1, l1 = loop(jax.random.key(np.uint32(s)))
        np.testing.assert_allclose(_np(losses[i]), _np(l1), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(_np(params["U"][i]), _np(p1["U"]), rtol=1e-10, atol=1e-12)


# ============================================================================ invalid inputs


def _bad_dtype_arg(_):
    return st.sampled_from([np.int32, "banana", np.complex64, bool])


def _not_none(strategy):
    return lambda v: strategy(v).filter(lambda c: c is not None)


@SETTINGS
@given(data=st.data())
def test_init_heads_rejects_invalid(data):
    def bad_scale(_):
        return st.sampled_from([np.nan, np.inf, np.ones(2), "1", None])

    args = dict(key=jax.random.key(0), n_heads=2, dim=2, value_dim=None, out_dim=3, scale=1.0, dtype=None)
    # a bad key is refused by jax.random itself (a TypeError naming the key data)
    spec = {"n_heads": INT, "dim": INT, "value_dim": OBJ(_not_none(bad_positive_int)),
            "out_dim": OBJ(_not_none(bad_positive_int)), "scale": OBJ(bad_scale), "dtype": OBJ(_bad_dtype_arg)}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: train.init_heads(**bad), name)


def test_apply_heads_needs_a_head():
    """No heads would sum to a silent 0 (a residual model would return its queries)."""
    empty = {"U": np.zeros((0, 2, 2)), "V": np.zeros((0, 2, 2))}
    with pytest.raises(ValueError, match=r"`params\['U'\]` must hold at least 1 row"):
        train.apply_heads(empty, np.ones((3, 2)), np.ones((1, 2)), residual=True)


@SETTINGS
@given(layer=head_layers(), data=st.data())
def test_apply_heads_rejects_invalid(layer, data):
    params, toks, q, kind, residual = layer
    toks, q = toks.astype(np.float64), q.astype(np.float64)
    what = data.draw(st.sampled_from(["leaf", "other"]))
    call = dict(kind=kind, residual=residual)
    if what == "leaf":
        leaves = {f"params['{k}']": np.asarray(v) for k, v in params.items()}
        spec = {"params['U']": Arg(fixed_axes=(1, 2)), "params['V']": Arg(fixed_axes=(0, 2)),
                "params['W_out']": Arg(fixed_axes=(1,))}
        name, bad = data.draw(corrupt(leaves, {k: v for k, v in spec.items() if k in leaves}))
        p = {k[8:-2]: v for k, v in bad.items()}
        # a wrong D_v for a residual head is refused by name too ("a residual head needs D_v = D")
        assert_rejects(lambda: train.apply_heads(p, toks, q, **call), name, "params['V']", "params['U']")
        return

    def bad_kind(_):
        return st.sampled_from(["cosine", None, 1, "Softmax"])

    def empty(a):
        return st.just(np.asarray(a)[:0])

    args = dict(tokens=toks, queries=q, kind=kind)
    spec = {"tokens": Arg(extra=(empty,)), "queries": Arg(fixed_axes=(1,)), "kind": OBJ(bad_kind)}
    name, bad = data.draw(corrupt(args, spec))
    # tokens of a wrong width disagree with params['U'] (D is read from the tokens)
    also = ("params['U']",) if name == "tokens" else ()
    assert_rejects(lambda: train.apply_heads(params, **bad, residual=residual), name, *also)


def _bad_scalar(_):
    return st.sampled_from([np.nan, np.inf, -1.0, np.ones(2), "1", None, 1j])


@SETTINGS
@given(data=st.data())
def test_denoising_task_sampler_rejects_invalid(data):
    def bad_range(_):
        return st.sampled_from([(0.0, 0.5), (0.6, 0.4), (0.2, 1.0), (0.1, 0.2, 0.3), (np.nan, 0.5), ("a", "b"),
                                0.5, None])

    # the returned sample(key, batch_size, prompt_length) checks nothing: fit and training_run check the sizes
    args = dict(gamma=0.5, xi=1.0, dim=2, radius=3.0, weight_range=(0.2, 0.8), n_queries=1)
    spec = {"gamma": OBJ(lambda _: st.sampled_from([np.nan, np.inf, -1.0, np.ones(2), "1", None])),
            "xi": OBJ(_bad_scalar, lambda _: st.just(0.0)), "dim": INT, "radius": OBJ(_bad_scalar),
            "weight_range": OBJ(bad_range), "n_queries": INT}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: train.denoising_task_sampler(**bad), name)


@SETTINGS
@given(task=lda_tasks(), data=st.data())
def test_classification_prompt_sampler_rejects_invalid(task, data):
    spec = {"mean_pos": Arg(), "mean_neg": Arg(fixed_axes=(0,)),
            "cov": Arg(fixed_axes=(0, 1), extra=(asymmetric, indefinite)),
            "p_pos": Arg(extra=(lambda _: st.sampled_from([0.0, 1.0, -0.5, 2.0]),)), "n_queries": INT}
    name, bad = data.draw(corrupt({**task, "p_pos": np.float64(task["p_pos"]), "n_queries": 2}, spec))
    also = ("mean_neg", "cov") if name == "mean_pos" else ()  # the dimension d is read from mean_pos
    assert_rejects(lambda: train.classification_prompt_sampler(**bad), name, *also)


@SETTINGS
@given(data=st.data())
def test_fit_rejects_invalid(data):
    params = train.init_heads(jax.random.key(0), n_heads=1, dim=2)

    def not_a_divisor(_):
        return st.just(3)

    args = dict(loss=_loss, params=params, sampler=SAMPLER, optimizer=OPT, key=jax.random.key(0), n_steps=4,
                batch_size=2, prompt_length=3, record_every=2, metric=lambda p: jnp.sum(p["U"]))
    # the sizes only: a bad loss, sampler, metric, optimizer, key or params fails in JAX or optax
    # with their own errors (nothing runs silently wrong), so fit does not dry-run them
    spec = {"n_steps": INT, "batch_size": INT, "prompt_length": INT,
            "record_every": OBJ(bad_positive_int, not_a_divisor)}
    name, bad = data.draw(corrupt(args, spec))
    also = ("n_steps",) if name == "record_every" else ("record_every",) if name == "n_steps" else ()
    assert_rejects(lambda: train.fit(**bad), name, *also)


@SETTINGS
@given(data=st.data())
def test_training_run_rejects_invalid(data):
    init = lambda k: train.init_heads(k, n_heads=1, dim=2)  # noqa: E731
    args = dict(loss=_loss, init=init, sampler=SAMPLER, optimizer=OPT, n_steps=2, batch_size=2,
                prompt_length=3, record_every=1)
    spec = {"n_steps": INT, "batch_size": INT, "prompt_length": INT,
            "record_every": OBJ(bad_positive_int, lambda _: st.just(4))}
    name, bad = data.draw(corrupt(args, spec))
    also = ("n_steps",) if name == "record_every" else ()
    assert_rejects(lambda: train.training_run(**bad), name, *also)


@SETTINGS
@given(data=st.data())
def test_sharded_sweep_rejects_invalid(data):
    def bad_seeds(_):
        return st.sampled_from([[], [1.5, 2.0], [[1, 2]], 3, [-1, 2], [2**32], ["a"], [True, False], None])

    args = dict(fn=lambda k: jax.random.normal(k, ()), seeds=[0, 1], devices=None)
    spec = {"seeds": OBJ(bad_seeds), "devices": OBJ(lambda _: st.just([]))}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: train.sharded_sweep(**bad), name)


def test_public_entry_points_are_all_covered():
    """Every name of gmlib.train.__all__ (and the in-context part of gmlib.denoise) is called in this file."""
    source = pathlib.Path(__file__).read_text()
    names = [f"train.{n}" for n in train.__all__] + [f"denoise.{n}" for n in ("in_context_params", "estimate_task")]
    missing = [n for n in names if n + "(" not in source]
    assert not missing, f"{missing} are not tested here"
