"""gmlib.regression: von Oswald et al.'s setting, each piece against an independent computation
(a gradient step taken by jax.grad, their layer's forward pass written in their row
convention, sensitivities by finite differences)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gmlib
from gmlib import regression


def _batch(dim=3, n=6, L=5, r=1.0, key=0):
    return regression.regression_sampler(dim, input_range=r)(jax.random.key(key), n, L)


def test_sampler_draws_linear_targets():
    batch = _batch(dim=4, n=50, L=7, r=1.0)
    x, y, w = batch.prompt[..., :4], batch.prompt[..., 4], batch.aux
    np.testing.assert_allclose(y, jnp.einsum("bnd,bd->bn", x, w), rtol=1e-12)
    assert float(jnp.abs(x).max()) < 0.5 and float(jnp.abs(x).max()) > 0.45
    assert np.all(batch.queries[..., -1] == 0)
    np.testing.assert_allclose(batch.targets[:, 0, 0], jnp.einsum("bd,bd->b", batch.queries[:, 0, :4], w), rtol=1e-12)


def test_gd_heads_is_one_gradient_step_from_zero():
    batch = _batch()
    eta = 1.7
    pred = regression.predict(regression.gd_heads(3, eta=eta), batch)[:, 0]
    for p in range(6):
        x, y = batch.prompt[p, :, :3], batch.prompt[p, :, 3]
        loss = lambda w: 0.5 * jnp.mean((x @ w - y) ** 2)  # noqa: E731
        w1 = -eta * jax.grad(loss)(jnp.zeros(3))
        np.testing.assert_allclose(pred[p], w1 @ batch.queries[p, 0, :3], rtol=1e-12)


def _their_forward(params, tokens):
    """Their layer (row convention, sums): h_q + sum_j (h_q W_Q . h_j W_K) h_j W_V P, read as minus the last entry."""
    h = np.asarray(tokens)  # (N + 1, D), the query last
    q, k, v = h @ params["query"], h[:-1] @ params["key"], h[:-1] @ params["value"]
    out = h[-1] + (q[-1] @ k.T) @ v @ params["projection"]
    return -out[-1]


def test_lsa_heads_is_their_layer():
    rng = np.random.default_rng(0)
    params = {n: rng.normal(size=(4, 4)) for n in ("query", "key", "value", "projection")}
    batch = _batch(n=3, L=5)
    heads = regression.lsa_heads(jax.tree.map(jnp.asarray, params), prompt_length=5)
    pred = regression.predict(heads, batch)[:, 0]
    for p in range(3):
        tokens = np.concatenate([batch.prompt[p], batch.queries[p]])
        np.testing.assert_allclose(pred[p], _their_forward(params, tokens), rtol=1e-10)


def test_the_stated_input_range_multiplies_the_loss_by_four():
    """Inputs on (-1, 1) instead of (-0.5, 0.5): the same draws doubled, every squared error times 4."""
    narrow, wide = (_batch(dim=5, n=500, L=5, r=r, key=1) for r in (1.0, 2.0))
    np.testing.assert_allclose(wide.prompt, 2 * narrow.prompt, rtol=1e-12)

    def best(batch):
        base = regression.predict(regression.gd_heads(5, eta=1.0), batch)[:, 0]
        y = batch.targets[:, 0, 0]
        eta = jnp.sum(base * y) / jnp.sum(base**2)
        return float(eta), float(0.5 * jnp.mean((eta * base - y) ** 2))

    (eta1, loss1), (eta2, loss2) = best(narrow), best(wide)
    assert loss2 / loss1 == pytest.approx(4.0, rel=1e-10)
    assert eta2 / eta1 == pytest.approx(0.25, rel=1e-10)


def test_alignment_against_finite_differences():
    batch = _batch(n=5)
    a, b = regression.gd_heads(3, eta=1.0), regression.gd_heads(3, eta=3.0)
    same = regression.alignment(a, a, batch)
    assert float(same.cosine) == pytest.approx(1.0, abs=1e-6)
    assert float(same.sensitivity_distance) == 0 and float(same.prediction_distance) == 0
    out = regression.alignment(a, b, batch)
    eps, grads = 1e-6, []
    for p in range(5):  # the sensitivity of a, by central differences in x_q
        g = []
        for i in range(3):
            shift = np.zeros(4)
            shift[i] = eps
            plus, minus = (regression.predict(a, batch._replace(queries=batch.queries.at[p, 0].add(s)))[p, 0]
                           for s in (shift, -shift))
            g.append((plus - minus) / (2 * eps))
        grads.append(g)
    grads = np.array(grads)
    # b = 3 a: parallel sensitivities, twice a's norm apart, predictions twice a's apart
    assert float(out.cosine) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(out.sensitivity_distance, np.mean(2 * np.linalg.norm(grads, axis=-1)), rtol=1e-6)
    pa = regression.predict(a, batch)[:, 0]
    np.testing.assert_allclose(out.prediction_distance, np.mean(2 * np.abs(pa)), rtol=1e-10)
    with pytest.raises(ValueError, match="`heads_b`"):  # two outputs
        regression.alignment(a, gmlib.Heads(U=a.U, V=jnp.ones((1, 2, 4))), batch)


def test_training_starts_small_and_learns_the_gradient_step():
    sample = regression.regression_sampler(3)
    runs = regression.train_lsa(sample, seeds=[0, 1], n_steps=400, batch_size=256, prompt_length=5,
                                learning_rate=1e-2, clip=1.0)
    assert runs.params["query"].shape == (2, 4, 4)
    test = sample(jax.random.key(9), 2000, 5)
    zero = 0.5 * float(jnp.mean(test.targets**2))  # predicting 0
    for s in range(2):
        heads = regression.lsa_heads(jax.tree.map(lambda a: a[s], runs.params), prompt_length=5)
        loss = 0.5 * float(jnp.mean((regression.predict(heads, test) - test.targets[:, 0]) ** 2))
        assert loss < 0.8 * zero
    start = regression.train_lsa(sample, seeds=[0], n_steps=1, batch_size=8, prompt_length=5, learning_rate=0.0)
    leaf = np.asarray(start.params["key"])
    assert 0.5 * np.sqrt(0.002 / 4) < leaf.std() < 1.5 * np.sqrt(0.002 / 4)  # haiku's VarianceScaling(0.002)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="`dim`"):
        regression.regression_sampler(0)
    with pytest.raises(ValueError, match="`input_range`"):
        regression.regression_sampler(2, input_range=0.0)
    with pytest.raises(ValueError, match="`eta`"):
        regression.gd_heads(2, eta=float("nan"))
    with pytest.raises(ValueError, match="`batch_size`"):
        regression.train_lsa(regression.regression_sampler(2), seeds=[0], n_steps=1, batch_size=0, prompt_length=3)
