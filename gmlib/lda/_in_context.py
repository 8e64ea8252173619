r"""In-context LDA: a fresh pair of class means per prompt, read from labelled tokens (chapter 9)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from gmlib import _checks as C
from gmlib import _random
from gmlib.heads import Batch, Heads, apply_heads, init_heads
from gmlib.train import side_by_side


def task_sampler(dim: int, *, radius=1.5, n_queries: int = 1, dtype=None):
    r"""Prompts for in-context LDA: one fresh task per prompt.

    A task is a pair of class means :math:`(m_1, m_{-1})`, independent and uniform on the
    sphere of radius ``radius`` in :math:`\mathbb R^d`, d = ``dim``; the classes are equally
    likely and :math:`X \mid Y = c \sim \mathcal N(m_c, I_d)` (eq 4 with :math:`\Gamma = I`,
    :math:`\pi_+ = \tfrac12`). The prompt holds L labelled tokens :math:`(X_i, Y_i) \in \mathbb R^{d+1}`
    of the task, the queries are ``n_queries`` fresh points :math:`(x, 0)` of the same task and
    the targets their labels. With equal norms the task's Bayes score (eq 5) is
    :math:`f^\star_\tau(x) = (m_1 - m_{-1})^\top x`: no intercept, but a direction that only the
    prompt tells.

    Args:
        dim: d, a positive int.
        radius: the norm of the means, a positive number.
        n_queries: queries per prompt, a positive int.
        dtype: the floating dtype of every array drawn (default: JAX's default float).

    Returns:
        ``sample(key, batch_size, prompt_length) -> gmlib.Batch``: prompts (B, L, d+1),
        queries (B, Q, d+1), targets (B, Q, 1) in {-1, +1} and ``aux = (means,)``, the means
        (B, 2, d) (:math:`m_1` first) for :func:`task_metrics`. ``sample`` checks nothing
        (it runs inside training loops).

    Raises:
        ValueError: naming the argument, for a value outside the ranges above.

    Example:
        >>> sample = lda.task_sampler(2, n_queries=4)
        >>> batch = sample(jax.random.key(0), 32, 64)  # 32 prompts of 64 labelled tokens
        >>> batch.prompt.shape, batch.queries.shape
        ((32, 64, 3), (32, 4, 3))
    """
    dim = C.scalar(dim, "dim", low=0, integer=True)
    n_queries = C.scalar(n_queries, "n_queries", low=0, integer=True)
    radius = C.scalar(radius, "radius", low=0)
    dtype = C.check_float_dtype(dtype)

    def sample(key, batch_size: int, prompt_length: int) -> Batch:
        k_m, k_y, k_x = jax.random.split(key, 3)
        dirs = _random.normal(k_m, (batch_size, 2, dim), dtype)
        means = radius * dirs / jnp.linalg.norm(dirs, axis=-1, keepdims=True)
        n = prompt_length + n_queries
        y = jnp.where(_random.uniform(k_y, (batch_size, n), dtype) < 0.5, 1.0, -1.0).astype(dtype)
        x = jnp.where(y[..., None] > 0, means[:, :1], means[:, 1:]) + _random.normal(k_x, (batch_size, n, dim), dtype)
        prompt = jnp.concatenate([x[:, :prompt_length], y[:, :prompt_length, None]], axis=-1)
        queries = jnp.concatenate([x[:, prompt_length:], jnp.zeros((batch_size, n_queries, 1), dtype)], axis=-1)
        return Batch(prompt, queries, y[:, prompt_length:, None], (means,))

    return sample


def plug_in(prompt, queries, mask=None):
    r"""The plug-in LDA score of one prompt: the class means estimated from its tokens.

    With :math:`\hat m_c` the mean of the prompt's points of label c (0 for a class absent
    from the prompt) and the covariance :math:`I` and equal class weights of
    :func:`task_sampler` known, the score at a query :math:`(x, 0)` is eq 5 with the
    estimates, :math:`(\hat m_1 - \hat m_{-1})^\top x - \tfrac12(\|\hat m_1\|^2 - \|\hat m_{-1}\|^2)`.
    A predictor ``f(prompt, queries, mask)`` for :func:`task_metrics`; not an attention head,
    the reference for what L labelled tokens tell.

    Args:
        prompt: labelled tokens (L, d+1), the label last.
        queries: (Q, d+1).
        mask: ``None`` or booleans (L,): the tokens that count.

    Returns:
        array (Q, 1): the scores.
    """
    x, y = prompt[:, :-1], prompt[:, -1]
    keep = jnp.ones_like(y) if mask is None else mask.astype(y.dtype)

    def mean(c):
        w = keep * (y == c).astype(y.dtype)
        return (w @ x) / jnp.maximum(w.sum(), 1)

    m1, m0 = mean(1), mean(-1)
    return (queries[:, :-1] @ (m1 - m0) - 0.5 * (m1 @ m1 - m0 @ m0))[:, None]


def _metrics(scores, targets):
    """Each prompt's logistic risk and accuracy, from scores and labels (B, Q, 1)."""
    margin = (scores * targets)[..., 0]
    return jnp.mean(jax.nn.softplus(-margin), -1), jnp.mean(margin > 0, -1)


def task_metrics(f, batch: Batch, *, lengths, kind: str = "softmax"):
    r"""Each prompt's logistic risk and accuracy at several prompt lengths, for heads, a predictor, or Bayes.

    For prompt b cut to its first L tokens and its queries :math:`(x_{b,q}, 0)` with labels
    :math:`y_{b,q}`, the risk is :math:`\frac1Q\sum_q \log(1 + e^{-y_{b,q} f(x_{b,q})})` and the
    accuracy the fraction of queries with :math:`y_{b,q} f(x_{b,q}) > 0`. ``f`` is a
    :class:`gmlib.Heads` with output dimension 1 (applied by ``gmlib.apply_heads``), a
    predictor ``f(prompt, queries, mask) -> (Q, 1)`` (:func:`plug_in`, or a trained network
    as a ``jax.tree_util.Partial``), or ``"bayes"``: each task's Bayes score
    :math:`(m_1 - m_{-1})^\top x - \tfrac12(\|m_1\|^2 - \|m_{-1}\|^2)`, the same at every L.
    Every predictor is scored on the same queries: differences between two are paired.

    Args:
        f: heads, a predictor, or ``"bayes"``.
        batch: a :class:`gmlib.Batch` of :func:`task_sampler`, prompts (B, L_max, d+1).
        lengths: prompt lengths, ints in [1, L_max], shape (n_lengths,).
        kind: ``"softmax"`` or ``"linear"`` (for :class:`gmlib.Heads`).

    Returns:
        ``(risk, accuracy)``: arrays (n_lengths, B).

    Raises:
        ValueError: naming ``f`` when it is none of the above, or what ``gmlib.apply_heads``
            raises (naming ``kind``, ...).

    Example:
        >>> tests = lda.task_sampler(2, n_queries=8)(jax.random.key(0), 512, 64)
        >>> risk, acc = lda.task_metrics(lda.plug_in, tests, lengths=[16, 64])
        >>> bayes_risk, _ = lda.task_metrics("bayes", tests, lengths=[16, 64])
        >>> risk.shape, bool((risk.mean(-1) > bayes_risk.mean(-1)).all())  # (lengths, prompts)
        ((2, 512), True)
    """
    if not (isinstance(f, Heads) or callable(f) or (isinstance(f, str) and f == "bayes")):
        raise ValueError(f'`f` must be a gmlib.Heads, a predictor f(prompt, queries, mask) or "bayes"; got {f!r}')
    lengths = jnp.asarray(lengths, jnp.int32)
    if isinstance(f, str):
        means = batch.aux[0]
        w = means[:, 0] - means[:, 1]
        b = -0.5 * (jnp.sum(means[:, 0] ** 2, -1) - jnp.sum(means[:, 1] ** 2, -1))
        scores = (jnp.einsum("bqd,bd->bq", batch.queries[..., :-1], w) + b[:, None])[..., None]
        risk, acc = _metrics(scores, batch.targets)
        return jnp.broadcast_to(risk, (len(lengths), *risk.shape)), jnp.broadcast_to(acc, (len(lengths), *acc.shape))
    if not isinstance(f, Heads) and not isinstance(f, jax.tree_util.Partial):
        f = jax.tree_util.Partial(f)
    return _by_length(f, batch, lengths, kind)


@partial(jax.jit, static_argnames="kind")
def _by_length(f, batch, lengths, kind):
    positions = jnp.arange(batch.prompt.shape[1], dtype=lengths.dtype)

    def at(length):
        mask = positions < length
        if isinstance(f, Heads):
            one = lambda p, q: apply_heads(f, p, q, kind=kind, mask=mask)  # noqa: E731
        else:
            one = lambda p, q: f(p, q, mask)  # noqa: E731
        return _metrics(jax.vmap(one)(batch.prompt, batch.queries), batch.targets)

    return jax.vmap(at)(lengths)


def _logistic(predictions, batch):
    return jnp.mean(jax.nn.softplus(-predictions * batch.targets))


def train_in_context(models, dim: int, *, optimizer, lengths, seeds, init_seeds, n_steps: int, batch_size: int,
                     radius=1.5, n_queries: int = 1, n_heads: int = 1, n_records: int = 1, init_scale=0.5,
                     dtype=jnp.float32):
    r"""Train classifiers side by side on the same in-context LDA prompts, for every (length, seed).

    Each model ``name: (kind, start)`` of ``models`` is a layer of ``n_heads`` heads on the
    labelled tokens, summed, with one output coordinate, the score (``kind`` ``"softmax"`` or
    ``"linear"``; ``start`` ``"random"``: :func:`gmlib.init_heads` with ``value_dim=1``, scale
    ``init_scale`` and key ``jax.random.key(init_seeds[j])`` for seed j, or a
    :class:`gmlib.Heads`), or any network: ``kind`` its forward pass
    ``kind(params, prompt, queries, mask) -> (Q, 1)`` and ``start`` a function
    ``start(init_seed) -> params`` (e.g. :func:`gmlib.transformer.network`). Each minimises
    the logistic loss :math:`\frac1{BQ}\sum_{b,q}\log(1 + e^{-y_{b,q} f(x_{b,q})})` on fresh
    prompts of :func:`task_sampler` (``batch_size`` prompts of ``n_queries`` queries per step),
    the runs those of :func:`gmlib.train.side_by_side` (the same prompts for every model).

    Args:
        models: ``{name: (kind, start)}``: heads, or a network's forward pass and start.
        dim: d (the tokens have d + 1 coordinates).
        optimizer: an ``optax.GradientTransformation``.
        lengths: prompt lengths, positive ints, shape (n_lengths,).
        seeds: the key of each run, :func:`gmlib.train.sweep`'s ``seeds``.
        init_seeds: the key of each seed's random start, ints, shape (n_seeds,).
        n_steps: steps per run, a multiple of ``n_records``.
        batch_size: prompts per step.
        radius: the norm of the means (:func:`task_sampler`).
        n_queries: queries per prompt.
        n_heads: heads of the random starts.
        n_records: parameters kept this many times, evenly spaced (the last at the end).
        init_scale: the scale of the random starts.
        dtype: the floating dtype of training.

    Returns:
        the :class:`gmlib.TrainResult` of :func:`gmlib.train.side_by_side`, leading axes
        (n_lengths, n_seeds).

    Raises:
        ValueError: what :func:`task_sampler`, :func:`gmlib.init_heads` and
            :func:`gmlib.train.side_by_side` raise, naming the argument.

    Example:
        >>> out = lda.train_in_context({"softmax": ("softmax", "random")}, 2,
        ...     optimizer=optax.adam(1e-2), lengths=[16, 64], seeds=[[0, 1], [2, 3]],
        ...     init_seeds=[0, 1], n_steps=20, batch_size=16, n_queries=4)
        >>> out.params["softmax"].U.shape  # (n_lengths, n_seeds, H, d + 1, d + 1)
        (2, 2, 1, 3, 3)
    """
    sampler = task_sampler(dim, radius=radius, n_queries=n_queries, dtype=dtype)

    def random(seed):
        return init_heads(key=jax.random.key(seed), n_heads=n_heads, dim=dim + 1, value_dim=1, scale=init_scale,
                          dtype=dtype)

    return side_by_side(models,
                        lambda key, length: sampler(key, batch_size, length), _logistic,
                        optimizer=optimizer, lengths=lengths, seeds=seeds, init_seeds=init_seeds, n_steps=n_steps,
                        n_records=n_records, random=random, dtype=dtype)
