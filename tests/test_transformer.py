"""gmlib.transformer: standard attention networks (flax.nnx) on the book's prompts, and their reading as Heads.

The one-block network is compared with its Heads (heads_from_flax through ``Transformer.heads``),
the tempered start with ``denoise.in_context_heads``, masked prompts with unpadded ones, and a
network trained by ``denoise.train_in_context`` with the loss it should have lowered. Skipped
without flax (the lowest-versions environment has none: flax is an optional extra).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

nnx = pytest.importorskip("flax.nnx")

import gmlib  # noqa: E402
from gmlib import denoise, transformer  # noqa: E402
from gmlib.denoise import augment  # noqa: E402


def _prompt(L=12, Q=3, d=2, seed=0):
    sample = denoise.task_sampler(1.0, 1.0, d, n_queries=Q, dtype=jnp.float32)
    batch = sample(jax.random.key(seed), 1, L)
    return batch.prompt[0], batch.queries[0]


@pytest.mark.parametrize("use_bias", [False, True])
def test_one_block_is_its_heads(use_bias):
    """R (z + MHA(z; tokens)) + b_R, the network's prediction, is apply_heads of Transformer.heads()."""
    net = transformer.Transformer(2, n_heads=2, use_bias=use_bias, rngs=nnx.Rngs(1))
    if use_bias:  # flax starts biases at zero: make them count
        net.readout.bias[...] = jnp.array([0.3, -0.7], jnp.float32)
        net.attention[0].query.bias[...] = jnp.ones((2, 2), jnp.float32)
    tokens, queries = _prompt()
    lift = augment if use_bias else (lambda x: x)
    got = gmlib.apply_heads(net.heads(), lift(tokens), lift(queries))
    np.testing.assert_allclose(np.asarray(got), np.asarray(net(tokens, queries)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="one block"):
        transformer.Transformer(2, n_layers=2, rngs=nnx.Rngs(0)).heads()


@pytest.mark.parametrize("kw", [dict(n_layers=1), dict(n_layers=3), dict(n_layers=2, width=8, mlp=True, layer_norm=True)])
def test_masked_padding_is_ignored(kw):
    """A prompt padded with junk and masked gives the prediction of the unpadded prompt, at any depth."""
    net = transformer.Transformer(2, rngs=nnx.Rngs(0), **kw)
    tokens, queries = _prompt(L=10)
    padded = jnp.concatenate([tokens, 50 * jnp.ones((6, 2), jnp.float32)])
    mask = jnp.arange(16) < 10
    np.testing.assert_allclose(np.asarray(net(padded, queries, mask)), np.asarray(net(tokens, queries)),
                               rtol=1e-5, atol=1e-5)
    streams = net.streams(tokens, queries)
    assert len(streams) == kw["n_layers"] + 1 and streams[-1].shape == (13, kw.get("width", 2))


def test_tempered_start_is_the_tempered_head():
    """transformer.tempered predicts what denoise.in_context_heads at the same temperature does."""
    for gamma, xi, c, H in [(1.0, 1.0, 0.4, 1), (1.0, 0.5, 0.7, 2)]:
        net = transformer.tempered(gamma, xi, 3, temperature=c, n_heads=H, rngs=nnx.Rngs(0))
        tokens = 2 * jax.random.normal(jax.random.key(0), (20, 3), jnp.float32)
        queries = tokens[:5] + 0.3
        ref = gmlib.apply_heads(denoise.in_context_heads(gamma, xi, 3, temperature=c), tokens, queries)
        np.testing.assert_allclose(np.asarray(net(tokens, queries)), np.asarray(ref), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="`temperature`"):
        transformer.tempered(1.0, 1.0, 2, temperature=1.0, rngs=nnx.Rngs(0))  # readout 1 - a - ac = 0


def test_network_trains_in_context_and_scores_as_a_predictor():
    """A network trains through denoise.train_in_context; task_excess of its predictor equals that of its heads."""
    model = transformer.network(lambda rngs: transformer.Transformer(2, n_heads=1, rngs=rngs))
    out = denoise.train_in_context({"net": model}, 1.0, 1.0, 2, optimizer=optax.adam(1e-2), lengths=[32],
                                   seeds=[[0]], init_seeds=[0], n_steps=200, batch_size=8, n_queries=2)
    start, trained = model[1](0), jax.tree.map(lambda x: x[0, 0], out.params["net"])
    tests = denoise.task_sampler(1.0, 1.0, 2, n_queries=4, dtype=jnp.float32)(jax.random.key(5), 64, 32)
    before, after = (float(denoise.task_excess(transformer.predictor(model, p), tests, 1.0, 1.0).mean())
                     for p in (start, trained))
    assert after < 0.5 * before
    heads = transformer.restore(model, trained).heads()
    np.testing.assert_allclose(float(denoise.task_excess(heads, tests, 1.0, 1.0).mean()), after, rtol=1e-4)
    with pytest.raises(ValueError, match="`heads`"):
        denoise.task_excess(transformer.predictor(model, trained), tests, 1.0, 1.0, infinite=True)


def test_transformer_rejects_invalid():
    with pytest.raises(ValueError, match="`dim`"):
        transformer.Transformer(0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="`n_layers`"):
        transformer.Transformer(2, n_layers=0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="`make`"):
        transformer.network("not a function")
