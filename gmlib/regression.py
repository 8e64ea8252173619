r"""In-context linear regression with linear attention: the setting of von Oswald et al. (2023).

A prompt holds N tokens :math:`z_i = (x_i, y_i) \in \mathbb R^{d+1}` with :math:`y_i = w^\top x_i`,
a fresh :math:`w \sim \mathcal N(0, I_d)` per prompt, and the query token :math:`(x_q, 0)`; the
target is :math:`y_q = w^\top x_q` (the book's chapter 10). One step of gradient descent from
w = 0 on :math:`\frac1{2N}\sum_i (w^\top x_i - y_i)^2` predicts

.. math::

    \hat y = \frac\eta N \sum_{i=1}^N y_i\, x_i^\top x_q,

and so does one head of linear attention (:func:`gd_heads`): the moment
:math:`\frac1N\sum_i y_i x_i` is the one chapter 9's linear head reads for in-context LDA,
with labels ±1. :func:`lsa_heads` writes their trained layer (four matrices) as the same
:class:`gmlib.Heads`, :func:`train_lsa` trains it as their code does, and :func:`alignment`
holds two models against each other as they do.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from gmlib import _checks as C
from gmlib import _random
from gmlib._loop import TrainResult, optimize
from gmlib.heads import Batch, Heads, apply_heads
from gmlib.train import _ints

__all__ = ["regression_sampler", "gd_heads", "lsa_heads", "predict", "train_lsa", "Alignment", "alignment"]


def regression_sampler(dim: int, *, input_range=1.0, dtype=None):
    r"""Prompts of in-context linear regression, one fresh weight vector per prompt.

    Each prompt draws :math:`w \sim \mathcal N(0, I_d)` (d = ``dim``), then N + 1 inputs
    uniform on :math:`(-r/2, r/2)^d` with r = ``input_range``; the tokens are
    :math:`(x_i, w^\top x_i)`, the query :math:`(x_q, 0)`, the target :math:`w^\top x_q`. Their
    code's ``input_range = 1`` draws x on (−0.5, 0.5); their text says (−1, 1), r = 2, which
    multiplies every squared error by 4.

    Args:
        dim: d, a positive int.
        input_range: r > 0, the width of the inputs' interval.
        dtype: the floating dtype of the arrays drawn (default: JAX's default float).

    Returns:
        ``sample(key, batch_size, prompt_length) -> gmlib.Batch``: prompts (B, N, d + 1),
        queries (B, 1, d + 1), targets (B, 1, 1), ``aux`` the weights (B, d). ``sample``
        checks nothing (it runs inside training loops).

    Raises:
        ValueError: naming the argument, for a value outside the ranges above.

    Example:
        >>> sample = regression.regression_sampler(10)
        >>> batch = sample(jax.random.key(0), 4, 10)
        >>> batch.prompt.shape, batch.queries.shape, batch.targets.shape
        ((4, 10, 11), (4, 1, 11), (4, 1, 1))
    """
    dim = C.scalar(dim, "dim", low=0, integer=True)
    half = float(C.scalar(input_range, "input_range", low=0)) / 2
    dtype = C.check_float_dtype(dtype)

    def sample(key, batch_size: int, prompt_length: int) -> Batch:
        k_w, k_x = jax.random.split(key)
        w = _random.normal(k_w, (batch_size, dim), dtype)
        x = _random.uniform(k_x, (batch_size, prompt_length + 1, dim), dtype, -half, half)
        y = jnp.einsum("bnd,bd->bn", x, w)[..., None]
        tokens = jnp.concatenate([x, jnp.where(jnp.arange(prompt_length + 1)[:, None] < prompt_length, y, 0)], -1)
        return Batch(tokens[:, :-1], tokens[:, -1:], y[:, -1:], w)

    return sample


def gd_heads(dim: int, *, eta) -> Heads:
    r"""One step of gradient descent from w = 0, as one head of linear attention.

    With :math:`U = \eta \begin{pmatrix} I_d & 0 \\ 0 & 0\end{pmatrix}` and
    :math:`V = e_{d+1}^\top` (the y coordinate), linear attention
    (``gmlib.apply_heads(..., kind="linear")``, :math:`V\,\frac1N\sum_i z_i z_i^\top\, U z_q`)
    returns :math:`\frac\eta N \sum_i y_i\, x_i^\top x_q`: the prediction of
    :math:`w_1 = w_0 - \eta\nabla_w \frac1{2N}\sum_i (w^\top x_i - y_i)^2` at :math:`w_0 = 0`.

    Args:
        dim: d, a positive int (tokens have d + 1 coordinates).
        eta: the step size η.

    Returns:
        a :class:`gmlib.Heads` of one head, U (1, d + 1, d + 1), V (1, 1, d + 1).

    Example:
        >>> batch = regression.regression_sampler(3)(jax.random.key(0), 2, 5)
        >>> heads = regression.gd_heads(3, eta=2.0)
        >>> pred = regression.predict(heads, batch)
        >>> x, y = batch.prompt[..., :3], batch.prompt[..., 3]
        >>> bool(jnp.allclose(pred, 2.0 / 5 * jnp.einsum("bn,bnd,bd->b", y, x, batch.queries[:, 0, :3])[:, None]))
        True
    """
    dim = C.scalar(dim, "dim", low=0, integer=True)
    eta = jnp.asarray(C.scalar(eta, "eta"))
    U = eta * jnp.diag(jnp.arange(dim + 1) < dim).astype(eta.dtype)
    return Heads(U=U[None], V=jnp.eye(dim + 1, dtype=eta.dtype)[None, -1:])


def lsa_heads(params: dict, *, prompt_length: int) -> Heads:
    r"""Their linear self-attention layer, four matrices in their row convention, as a :class:`gmlib.Heads`.

    Their layer adds to each token row h the row :math:`\sum_j (h W_Q)\cdot(h_j W_K)\, h_j W_V P`
    over the N prompt tokens (sums, not means; the query is no key), and predicts
    :math:`-` the last coordinate of the query's row (its y slot holds 0, so the residual adds
    nothing there). In the book's convention this is one head of linear attention with

    .. math::

        U = N\, W_K W_Q^\top, \qquad V = P^\top W_V^\top, \qquad W_{\mathrm{out}} = -e_{d+1}^\top.

    Args:
        params: ``{"query": W_Q, "key": W_K, "value": W_V, "projection": P}``, each (D, D).
        prompt_length: N, a positive int (the mean of ``apply_heads`` is N times smaller
            than their sum).

    Returns:
        a :class:`gmlib.Heads` of one head, with an output map of shape (1, D).
    """
    n = C.scalar(prompt_length, "prompt_length", low=0, integer=True)
    q, k, v, p = (params[name] for name in ("query", "key", "value", "projection"))
    readout = -jnp.eye(q.shape[0], dtype=q.dtype)[-1:]
    return Heads(U=(n * k @ q.T)[None], V=(p.T @ v.T)[None], W_out=readout)


def predict(heads: Heads, batch: Batch) -> jax.Array:
    """Linear attention of ``heads`` at each prompt's query: shape (B, D_y) (vmapped ``gmlib.apply_heads``)."""
    return jax.vmap(lambda p, q: apply_heads(heads, p, q, kind="linear")[0])(batch.prompt, batch.queries)


def train_lsa(sample, *, seeds, n_steps: int, batch_size: int, prompt_length: int, learning_rate=1e-3,
              clip=1e-3, init_scale=0.002) -> TrainResult:
    r"""Their linear self-attention layer trained as their code trains it, one run per seed.

    Each step draws ``batch_size`` fresh prompts of ``sample`` and takes a step of
    ``optax.adamw(learning_rate, b2=0.98, weight_decay=0)`` on the gradient clipped to global
    norm ``clip``, of their loss :math:`\frac12 \mathbb E(\hat y - y_q)^2`. The four
    matrices start truncated normal of variance ``init_scale`` / D (haiku's
    ``VarianceScaling(init_scale)``, fan-in). Through :func:`gmlib.optimize`.

    Args:
        sample: a sampler of :func:`regression_sampler`.
        seeds: ints, one run each.
        n_steps: steps per run, a positive int.
        batch_size: prompts per step, a positive int.
        prompt_length: N, a positive int.
        learning_rate, clip, init_scale: as above, their values by default.

    Returns:
        a :class:`gmlib.TrainResult` over seeds: ``params`` the dicts of :func:`lsa_heads`
        with leading axis n_seeds, ``metric`` the mean loss of each run's steps.
    """
    for name, value in (("n_steps", n_steps), ("batch_size", batch_size), ("prompt_length", prompt_length)):
        C.scalar(value, name, low=0, integer=True)
    keys = jax.vmap(jax.random.key)(jnp.asarray(_ints(seeds, "seeds", 1, 0, 2**32), jnp.uint32))
    probe = sample(jax.random.key(0), 1, 1)
    return _train(keys, sample, probe.prompt.shape[-1], probe.prompt.dtype, int(n_steps), int(batch_size),
                  int(prompt_length), float(learning_rate), float(clip), float(init_scale))


@partial(jax.jit, static_argnums=tuple(range(1, 10)))
@partial(jax.vmap, in_axes=(0,) + (None,) * 9)
def _train(key, sample, D, dtype, n_steps, batch_size, length, lr, clip, init_scale):
    k_p, k_t = jax.random.split(key)
    std = math.sqrt(init_scale / D) / 0.87962566103423978  # haiku: the truncated normal's std is this x 0.88
    names = ("query", "key", "value", "projection")
    start = {n: std * jax.random.truncated_normal(k, -2.0, 2.0, (D, D), dtype)
             for n, k in zip(names, jax.random.split(k_p, 4))}

    def loss(params, batch):
        return 0.5 * jnp.mean((predict(lsa_heads(params, prompt_length=length), batch) - batch.targets[:, 0]) ** 2)

    optimizer = optax.chain(optax.clip_by_global_norm(clip), optax.adamw(lr, b2=0.98, weight_decay=0.0))
    return optimize(loss, start, optimizer, n_steps=n_steps, record_every=n_steps,
                    sample=lambda k: sample(k, batch_size, length), key=k_t)


class Alignment(NamedTuple):
    """Two models held against each other on a batch, as von Oswald et al. measure it (their ``analyse``).

    Attributes:
        cosine: the mean cosine similarity of the sensitivities :math:`\\partial\\hat y/\\partial x_q`.
        sensitivity_distance: the mean Euclidean distance between the sensitivities.
        prediction_distance: the mean :math:`|\\hat y_a - \\hat y_b|`.
    """

    cosine: jax.Array
    sensitivity_distance: jax.Array
    prediction_distance: jax.Array


def alignment(heads_a: Heads, heads_b: Heads, batch: Batch) -> Alignment:
    r"""How alike two single-output layers of linear attention predict, query by query.

    The sensitivity of a model at a prompt is the gradient of its prediction in the query's
    input :math:`x_q` (the query token's first d coordinates). Their code adds :math:`10^{-8}`
    to each norm of the cosine; so does this.

    Args:
        heads_a, heads_b: layers with one output (``out_dim`` 1), evaluated by :func:`predict`.
        batch: prompts of :func:`regression_sampler`.

    Returns:
        an :class:`Alignment` of three scalars.

    Raises:
        ValueError: naming ``heads_a`` or ``heads_b``, for a layer of more than one output.
    """
    for name, heads in (("heads_a", heads_a), ("heads_b", heads_b)):
        if heads.out_dim != 1:
            raise ValueError(f"`{name}` must have one output (out_dim 1); got {heads.out_dim}")
    return _alignment(heads_a, heads_b, batch)


@jax.jit
def _alignment(heads_a, heads_b, batch):
    def one(heads, prompt, query):
        f = lambda x: apply_heads(heads, prompt, jnp.concatenate([x, query[0, -1:]])[None], kind="linear")[0, 0]  # noqa: E731
        return jax.value_and_grad(f)(query[0, :-1])

    (ya, ga), (yb, gb) = (jax.vmap(one, (None, 0, 0))(h, batch.prompt, batch.queries) for h in (heads_a, heads_b))
    norm = lambda g: jnp.linalg.norm(g, axis=-1) + 1e-8  # noqa: E731
    cosine = jnp.sum(ga * gb, -1) / (norm(ga) * norm(gb))
    return Alignment(cosine.mean(), jnp.linalg.norm(ga - gb, axis=-1).mean(), jnp.abs(ya - yb).mean())
