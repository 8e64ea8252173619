"""gmlib.train: the finite-prompt model, the prompt samplers, the training loop and the sharded sweep."""

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

from gmlib import linear_attention, softmax_attention, train

ROOT = pathlib.Path(__file__).resolve().parents[1]


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


def test_apply_heads_rejects_bad_input():
    params = train.init_heads(jax.random.key(0), n_heads=2, dim=2, value_dim=3)
    toks, q = jnp.ones((4, 2)), jnp.ones((1, 2))
    with pytest.raises(ValueError, match="`kind`"):
        train.apply_heads(params, toks, q, kind="cosine")
    with pytest.raises(ValueError, match="residual"):
        train.apply_heads(params, toks, q, residual=True)
    with pytest.raises(ValueError, match=r"params\['U'\]"):
        train.apply_heads(params, jnp.ones((4, 3)), jnp.ones((1, 3)))
    with pytest.raises(ValueError, match="`params`"):
        train.apply_heads({"U": params["U"]}, toks, q)


def test_denoising_sampler_statistics():
    gamma, xi, radius = 0.5, 0.8, 2.0
    sample = train.denoising_task_sampler(gamma, xi, 3, radius=radius, weight_range=(0.3, 0.7), n_queries=400)
    b = sample(jax.random.key(0), 256, 100)
    means, weights = b.aux
    assert b.tokens.shape == (256, 100, 3) and b.queries.shape == (256, 400, 3) and b.targets.shape == (256, 400, 3)
    np.testing.assert_allclose(jnp.linalg.norm(means, axis=-1), radius, rtol=1e-12)  # equal norms
    assert float(weights[:, 0].min()) >= 0.3 and float(weights[:, 0].max()) <= 0.7
    noise = np.asarray(b.queries - b.targets)
    np.testing.assert_allclose(noise.var(), xi**2, rtol=0.02)
    # the clean targets sit around the task's means with spread gamma, in proportions pi_1
    d1 = jnp.linalg.norm(b.targets - means[:, None, 0], axis=-1)
    d2 = jnp.linalg.norm(b.targets - means[:, None, 1], axis=-1)
    first = d1 < d2
    frac = np.asarray(first.mean(axis=1))
    np.testing.assert_allclose(frac.mean(), weights[:, 0].mean(), atol=0.02)
    resid = np.where(first[..., None], b.targets - means[:, None, 0], b.targets - means[:, None, 1])
    np.testing.assert_allclose(resid.var(), gamma**2, rtol=0.05)


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
    with pytest.raises(ValueError, match="`p_pos`"):
        train.classification_prompt_sampler(mp, mn, cov, 1.0)


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
    params, hist = train.fit(loss, params, sampler, optax.adam(2e-2), jax.random.key(1), n_steps=1500,
                             batch_size=16, prompt_length=2000, record_every=500)
    VU = params["V"][0] @ params["U"][0]
    np.testing.assert_allclose(VU, A, atol=3e-2)
    assert hist["metric"].shape == (3,) and float(hist["metric"][-1]) < 1e-2 < float(hist["metric"][0])
    with pytest.raises(ValueError, match="`n_steps`"):
        train.fit(loss, params, sampler, optax.sgd(0.1), jax.random.key(1), n_steps=10, batch_size=2,
                  prompt_length=3, record_every=3)


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
        pred = jax.vmap(lambda t, q: train.apply_heads(p, t, q, residual=True))(b.tokens, b.queries)
        return jnp.mean((pred - b.targets) ** 2)

    run = train.training_run(loss, lambda k: train.init_heads(k, n_heads=2, dim=2, out_dim=2), sampler,
                             optax.adam(1e-2), n_steps=20, batch_size=4, prompt_length=16, record_every=1)
    params, losses = train.sharded_sweep(run, list(range(6)))
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
    """6 seeds over 4 simulated CPU devices (padded to 8) give the single-device result."""
    four, one = run_sweep(4), run_sweep(1)
    assert four["n_devices"] == 4 and one["n_devices"] == 1
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-10)
    np.testing.assert_allclose(four["U"], one["U"], rtol=1e-10)
    losses = np.asarray(one["losses"])
    assert losses.shape == (6, 20) and len({round(v, 8) for v in losses[:, 0]}) == 6  # seeds differ
