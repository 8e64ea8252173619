r"""Training attention heads on finite prompts (chapter 7, beyond the paper).

Each training example is a *prompt* of L tokens drawn from a task, plus queries and
their targets. A model is one layer of H attention heads (softmax or linear), each
optionally residual, followed by an optional output map:

.. math::

    f_\theta(z) = W_{\mathrm{out}}
    \begin{pmatrix} r\,z + T_{U_1,V_1}[\mu_L](z) \\ \vdots \\ r\,z + T_{U_H,V_H}[\mu_L](z) \end{pmatrix},
    \qquad r \in \{0, 1\},

where :math:`T` is :func:`~gmlib.softmax_attention` or :func:`~gmlib.linear_attention` over
the L tokens of the prompt (or :func:`~gmlib.population_attention` on an infinite prompt).
Without an output map the heads are summed (multi-head attention, the paper's §2).
Parameters are a dict pytree ``{"U": (H, D, D), "V": (H, D_v, D)}`` plus
``"W_out": (D_y, H D_v)`` when there is an output map.

Training is plain optax on minibatches of fresh prompts, in ``lax.scan`` chunks driven by
:func:`gmlib.run_chunks`. Prompts of different lengths can share one compiled program:
draw them at the largest length and mask the rest (:attr:`Batch.mask`, the ``length``
argument of the runs of :func:`training_run`). Sweeps over seeds run under ``vmap`` and
are sharded over every available device with ``jax.sharding`` (the same code on one CPU,
several GPUs or a TPU slice).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gmlib import _checks as C
from gmlib import _random
from gmlib._loop import TrainResult, run_chunks
from gmlib.attention import linear_attention, population_attention, population_linear_attention, softmax_attention
from gmlib.denoise import DenoisingProblem
from gmlib.lda import LDAProblem
from gmlib.mixture import GaussianMixture

__all__ = [
    "Batch",
    "init_heads",
    "apply_heads",
    "denoising_task_sampler",
    "denoising_excess",
    "classification_prompt_sampler",
    "fit",
    "training_run",
    "sharded_sweep",
]

_KINDS = ("softmax", "linear")


class Batch(NamedTuple):
    """A minibatch of prompts (a pytree).

    Attributes:
        tokens: (B, L, D), the prompts.
        queries: (B, Q, D), the queries of each prompt.
        targets: (B, Q, D_y), what the model should predict at each query.
        aux: a task-dependent pytree (e.g. each task's means and weights), or ``None``.
        mask: ``None`` (every token counts) or a boolean (L,): the tokens that count in
            every prompt of the batch (the others are padding).
    """

    tokens: jax.Array
    queries: jax.Array
    targets: jax.Array
    aux: object = None
    mask: jax.Array | None = None


def init_heads(key, *, n_heads: int, dim: int, value_dim: int | None = None, out_dim: int | None = None,
               scale: float = 1.0, dtype=None):
    r"""Random parameters for :func:`apply_heads`: i.i.d. Gaussian entries.

    :math:`U_h` and :math:`V_h` have entries :math:`\mathcal N(0, \mathrm{scale}^2/D)`; the output
    map (when ``out_dim`` is given) :math:`\mathcal N(0, 1/(H D_v))`.

    Args:
        key: a ``jax.random`` key.
        n_heads: H ≥ 1.
        dim: the token dimension D.
        value_dim: D_v (default D).
        out_dim: D_y, or ``None`` for no output map (the heads are summed).
        scale: the scale of U and V, a finite number.
        dtype: floating dtype (default: JAX's default float).

    Returns:
        a dict ``{"U", "V"}`` (and ``"W_out"`` with an output map).
    """
    n_heads = C.scalar(n_heads, "n_heads", low=0, integer=True)
    dim = C.scalar(dim, "dim", low=0, integer=True)
    value_dim = dim if value_dim is None else C.scalar(value_dim, "value_dim", low=0, integer=True)
    out_dim = None if out_dim is None else C.scalar(out_dim, "out_dim", low=0, integer=True)
    dtype = C.check_float_dtype(dtype)
    scale = C.scalar(scale, "scale")
    ku, kv, kw = jax.random.split(key, 3)
    factor = jnp.asarray(scale / np.sqrt(dim), dtype)  # in `dtype`: strict promotion
    params = {
        "U": factor * _random.normal(ku, (n_heads, dim, dim), dtype),
        "V": factor * _random.normal(kv, (n_heads, value_dim, dim), dtype),
    }
    if out_dim is not None:
        params["W_out"] = (_random.normal(kw, (out_dim, n_heads * value_dim), dtype)
                           * jnp.asarray(1 / np.sqrt(n_heads * value_dim), dtype))
    return params


def _check_params(params, dim: int, residual: bool, dtype):
    U = C.array(params["U"], "params['U']", (None, dim, dim), dtype=dtype, desc=f"(H, D, D) with D = {dim}",
                min_rows=1)  # no heads would sum to a silent 0
    V = C.array(params["V"], "params['V']", (U.shape[0], None, dim), dtype=dtype,
                desc=f"(H, D_v, D) = ({U.shape[0]}, D_v, {dim})")
    if residual and V.shape[1] != dim:
        raise ValueError(f"a residual head needs D_v = D = {dim}; got `params['V']` of shape {tuple(V.shape)}")
    checked = {"U": U, "V": V}
    if "W_out" in params:
        hv = U.shape[0] * V.shape[1]
        checked["W_out"] = C.array(params["W_out"], "params['W_out']", (None, hv), dtype=dtype,
                                   desc=f"(D_y, H D_v) with H D_v = {hv}")
    return checked


def apply_heads(params, tokens, queries, *, kind: str = "softmax", residual: bool = False, block_size=None,
                mask=None):
    r"""One layer of attention heads over one prompt (the formula in the module docstring).

    Args:
        params: a dict from :func:`init_heads` (or built by hand).
        tokens: the prompt: tokens (L, D), or a :class:`~gmlib.GaussianMixture` for the
            infinite prompt (:func:`~gmlib.population_attention`,
            :func:`~gmlib.population_linear_attention`).
        queries: (Q, D).
        kind: ``"softmax"`` or ``"linear"``.
        residual: add the query to each head's output (needs D_v = D).
        block_size: passed to :func:`~gmlib.softmax_attention`.
        mask: ``None``, or a boolean (L,) marking the tokens that count (the others are
            padding: a score of :math:`-\infty` for softmax attention, left out of the
            average of linear attention). A prompt of length L padded to L' > L with the
            mask ``jnp.arange(L') < L`` gives the same output as the L tokens alone.

    Returns:
        array (Q, D_y), with D_y = D_v when there is no output map.

    Raises:
        ValueError: for an unknown ``kind``, parameters whose shapes do not fit, or a
            mask that does not fit the prompt.

    Use ``jax.vmap`` over a batch of prompts (see :func:`fit`).
    """
    C.check_choice(kind, "kind", _KINDS)
    population = isinstance(tokens, GaussianMixture)
    if not population:
        tokens = C.array(tokens, "tokens", (None, None), desc="(L, D), or a GaussianMixture")
    dim = tokens.dim if population else tokens.shape[1]
    leaves = params.values() if isinstance(params, dict) else ()
    dtype = C.common_float_dtype(tokens.means if population else tokens, queries, *leaves)
    if not population:
        tokens = tokens.astype(dtype)
    params = _check_params(params, dim, residual, dtype)
    queries = C.array(queries, "queries", (None, dim), dtype=dtype, desc=f"(Q, D) with D = {dim}")
    mask = None if mask is None else jnp.asarray(mask)
    if mask is not None and (population or mask.shape != tokens.shape[:1] or mask.dtype != jnp.bool_):
        raise ValueError(f"`mask` must be a boolean array (L,) for a finite prompt of L tokens; got {mask.dtype} "
                         f"of shape {tuple(mask.shape)} for `tokens` {'(a GaussianMixture)' if population else ''}")
    heads = []
    for U, V in zip(params["U"], params["V"]):
        if population:
            op = population_attention if kind == "softmax" else population_linear_attention
            out = op(tokens, queries, U, V).astype(dtype)
        elif mask is not None:
            out = _masked_attention(tokens, queries, U, V, mask, kind)
        elif kind == "softmax":
            out = softmax_attention(tokens, queries, U, V, block_size=block_size)
        else:
            out = linear_attention(tokens, queries, U, V)
        heads.append(out + queries if residual else out)
    if "W_out" in params:
        return jnp.concatenate(heads, axis=-1) @ params["W_out"].T
    return sum(heads)


def _masked_attention(tokens, queries, U, V, mask, kind):
    """Softmax or linear attention over the tokens where ``mask`` holds (the formulas of gmlib.attention)."""
    scores = (queries @ U.T) @ tokens.T  # (Q, L): z_i^T U z
    if kind == "softmax":
        weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    else:
        weights = jnp.where(mask, scores, 0) / mask.sum().astype(scores.dtype)
    return weights @ (tokens @ V.T)


# ----------------------------------------------------------------------------- prompt samplers


def denoising_task_sampler(gamma: float, xi: float, dim: int, *, radius: float = 3.0,
                           weight_range=(0.2, 0.8), n_queries: int = 1, dtype=None):
    r"""Prompts for in-context denoising (the setting of Prop 4.4), one fresh task per prompt.

    A task is :math:`\tau = (m_1, m_2, \pi_1)` with :math:`m_1, m_2` independent uniform on
    the sphere of radius ``radius`` (equal norms, as Prop 4.4 needs) and
    :math:`\pi_1` uniform on ``weight_range``. The prompt holds L noisy samples
    :math:`Z = X + \xi\varepsilon`, :math:`X \sim \sum_k \pi_k \mathcal N(m_k, \gamma^2 I)`;
    the queries are fresh noisy samples of the same task and the targets their clean
    :math:`X` (so the squared loss is the denoising risk).

    ``dtype`` (default: JAX's default float) is the floating dtype of every array drawn;
    float32 halves the cost of training on a CPU.

    Returns:
        ``sample(key, batch_size, prompt_length) -> Batch`` with ``aux = (means (B, 2, d), weights (B, 2))``.
    """
    dim = C.scalar(dim, "dim", low=0, integer=True)
    n_queries = C.scalar(n_queries, "n_queries", low=0, integer=True)
    gamma = C.scalar(gamma, "gamma", low=0, strict=False)
    xi = C.scalar(xi, "xi", low=0)
    radius = C.scalar(radius, "radius", low=0)
    dtype = C.check_float_dtype(dtype)
    wr = C.array(weight_range, "weight_range", (2,), dtype=np.float64, desc="(2,) (low, high)")
    lo, hi = (float(v) for v in np.asarray(wr))
    if not 0 < lo <= hi < 1:
        raise ValueError(f"`weight_range` must satisfy 0 < low <= high < 1; got {weight_range}")

    def sample(key, batch_size: int, prompt_length: int) -> Batch:
        k_m, k_p, k_x = jax.random.split(key, 3)
        dirs = _random.normal(k_m, (batch_size, 2, dim), dtype)
        means = radius * dirs / jnp.linalg.norm(dirs, axis=-1, keepdims=True)
        p1 = jax.random.uniform(k_p, (batch_size,), dtype, minval=lo, maxval=hi)
        weights = jnp.stack([p1, 1 - p1], axis=-1)
        n = prompt_length + n_queries
        k_c, k_g, k_e = jax.random.split(k_x, 3)
        labels = (_random.uniform(k_c, (batch_size, n), dtype) > p1[:, None]).astype(jnp.int32)
        clean = jnp.take_along_axis(means, labels[..., None], axis=1) + gamma * _random.normal(
            k_g, (batch_size, n, dim), dtype)
        noisy = clean + xi * _random.normal(k_e, (batch_size, n, dim), dtype)
        return Batch(noisy[:, :prompt_length], noisy[:, prompt_length:], clean[:, prompt_length:],
                     (means, weights))

    return sample


def denoising_excess(params, batch: Batch, gamma, xi, *, kind: str = "softmax", infinite: bool = False):
    r"""Each prompt's excess risk over its task's Bayes denoiser, for a residual model.

    For prompt b with task :math:`\tau_b` (``batch.aux`` of :func:`denoising_task_sampler`)
    and queries :math:`z_{b,1..Q}`, the value is
    :math:`\frac1Q \sum_q \|f[\mu](z_{b,q}) - \mathbb E[X \mid Z = z_{b,q}, \tau_b]\|^2`,
    with :math:`f` = :func:`apply_heads` (``residual=True``) and :math:`\mu` the prompt's
    tokens (under ``batch.mask``), or with ``infinite=True`` the task's noisy law
    :math:`\mu_Z^{\tau_b}` itself (:math:`L = \infty`, exact in the prompt). Averaged over
    prompts, the first is the excess risk at the prompt length L and the second at
    :math:`L = \infty`: their difference is what finite prompts cost.

    Args:
        params: parameters of :func:`apply_heads`.
        batch: a :class:`Batch` of :func:`denoising_task_sampler`.
        gamma, xi: the noise levels of the tasks.
        kind: ``"softmax"`` or ``"linear"``.
        infinite: evaluate on the infinite prompts.

    Returns:
        array (B,): the excess of each prompt (its mean over prompts estimates the excess
        risk; its standard deviation over :math:`\sqrt B` is the Monte Carlo error).
    """
    means, weights = batch.aux

    def one(tokens, queries, m, w):
        problem = DenoisingProblem(w, m, gamma, xi)
        prompt = problem.noisy if infinite else tokens
        pred = apply_heads(params, prompt, queries, kind=kind, residual=True,
                           mask=None if infinite else batch.mask)
        return jnp.mean(jnp.sum((pred - problem.bayes(queries)) ** 2, -1))

    return jax.vmap(one)(batch.tokens, batch.queries, means, weights)


def classification_prompt_sampler(mean_pos, mean_neg, cov, p_pos: float, *, n_queries: int = 1):
    r"""Prompts of labelled tokens :math:`(X, Y)` for LDA on finite prompts (chapter 7).

    :math:`Y = \pm 1` with :math:`P(Y = 1) = p_+`, :math:`X \mid Y = c \sim \mathcal N(m_c, \Gamma)`.
    Tokens are :math:`(X, Y) \in \mathbb R^{d+1}`, queries :math:`(x, 0)` and targets the labels
    :math:`y` (shape (B, Q, 1)). The task is the same for every prompt; the prompts differ.

    Returns:
        ``sample(key, batch_size, prompt_length) -> Batch``.
    """
    # the checks of LDAProblem (shapes, finite, cov symmetric positive definite, p_pos in (0, 1)), in float64
    task = LDAProblem(*(C.array(a, name, dtype=np.float64) for a, name in
                        ((mean_pos, "mean_pos"), (mean_neg, "mean_neg"), (cov, "cov"), (p_pos, "p_pos"))))
    mean_pos, mean_neg, cov = (np.asarray(a, dtype=np.float64) for a in (task.mean_pos, task.mean_neg, task.cov))
    p_pos, dtype = float(task.p_pos), task.dtype  # JAX's default float (the task was made in float64)
    d = mean_pos.shape[0]
    root = np.linalg.cholesky(cov)
    n_queries = C.scalar(n_queries, "n_queries", low=0, integer=True)

    def sample(key, batch_size: int, prompt_length: int) -> Batch:
        k_y, k_x = jax.random.split(key)
        n = prompt_length + n_queries
        y = jnp.where(_random.uniform(k_y, (batch_size, n)) < p_pos, 1.0, -1.0).astype(dtype)
        centre = jnp.where(y[..., None] > 0, jnp.asarray(mean_pos, dtype), jnp.asarray(mean_neg, dtype))
        x = centre + _random.normal(k_x, (batch_size, n, d), dtype) @ jnp.asarray(root.T, dtype)
        tokens = jnp.concatenate([x[:, :prompt_length], y[:, :prompt_length, None]], axis=-1)
        queries = jnp.concatenate([x[:, prompt_length:], jnp.zeros((batch_size, n_queries, 1), dtype)], axis=-1)
        return Batch(tokens, queries, y[:, prompt_length:, None])

    return sample


# ----------------------------------------------------------------------------- training


@dataclasses.dataclass(frozen=True)
class _ParamsOnly:
    """``fit``'s ``metric(params)`` in the ``metric(params, mask)`` form of the shared step (hashable)."""

    fn: Callable

    def __call__(self, params, mask):
        return self.fn(params)


def fit(loss: Callable, params, sampler: Callable, optimizer, key, *, n_steps: int, batch_size: int,
        prompt_length: int, record_every: int = 100, metric: Callable | None = None,
        progress: bool = False) -> TrainResult:
    r"""Minibatch training on fresh prompts: ``n_steps`` optax updates, in ``lax.scan`` chunks.

    Each step draws a fresh :class:`Batch` with ``sampler(key, batch_size, prompt_length)``
    and applies ``optimizer`` (any ``optax`` transformation, learning-rate schedules
    included) to the gradient of ``loss(params, batch)``. After every ``record_every``
    steps it records ``metric(params)`` (default: the mean training loss of those steps).
    The records are computed on the device inside one compiled ``lax.scan``; the chunks of
    records are driven by :func:`gmlib.run_chunks` (with a tqdm bar when ``progress``).

    Args:
        loss: ``loss(params, batch) -> scalar``, JAX-traceable.
        params: the initial parameters (any pytree).
        sampler: ``sampler(key, batch_size, prompt_length) -> Batch``.
        optimizer: an ``optax.GradientTransformation``.
        key: a ``jax.random`` key.
        n_steps: total number of steps, a multiple of ``record_every``.
        batch_size: prompts per step.
        prompt_length: L, tokens per prompt.
        record_every: steps between records.
        metric: ``metric(params) -> pytree``, JAX-traceable, or ``None``.
        progress: show a tqdm progress bar.

    Returns:
        a :class:`gmlib.TrainResult`: the final parameters, the recorded step numbers
        (``record_every``, ``2 record_every``, ...) and the records stacked along a first axis.
    """
    n_steps, record_every, batch_size, prompt_length = _check_loop(n_steps, record_every, batch_size, prompt_length)
    if metric is not None:
        metric = _ParamsOnly(metric)
    spec = _Spec(loss, sampler, optimizer, batch_size, prompt_length, record_every, metric)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(params)

    def block(state, k):
        # optax mixes Python floats with int32 step counts (Adam's bias correction), which
        # the user's "strict" dtype promotion would reject: trace under the standard rules
        with jax.numpy_dtype_promotion("standard"):
            return _fit_block(state, key, spec=spec, n_records=k)

    (params, _, _), records = run_chunks(block, (params, opt_state, jnp.int32(0)), n_records=n_steps // record_every,
                                         progress=progress, desc="training")
    return TrainResult(params, np.arange(1, n_steps // record_every + 1) * record_every, records)


class _Spec(NamedTuple):
    """What one training record needs, all static (hashable: JAX's jit cache keys on it)."""

    loss: Callable
    sampler: Callable
    optimizer: optax.GradientTransformation
    batch_size: int
    prompt_length: int
    record_every: int
    metric: Callable | None


def _record(spec: _Spec, carry, key, mask):
    """``record_every`` optax steps on fresh batches, then the record (metric, or mean loss)."""

    def step(carry, key):
        params, opt_state = carry
        batch = spec.sampler(key, spec.batch_size, spec.prompt_length)
        if mask is not None:
            batch = batch._replace(mask=mask)
        value, grads = jax.value_and_grad(spec.loss)(params, batch)
        updates, opt_state = spec.optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    carry, values = jax.lax.scan(step, carry, jax.random.split(key, spec.record_every))
    return carry, (values.mean() if spec.metric is None else spec.metric(carry[0], mask))


@functools.partial(jax.jit, static_argnames=("spec", "n_records"))
def _fit_block(state, key, *, spec, n_records):
    params, opt_state, start = state
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(start + jnp.arange(n_records))
    (params, opt_state), out = jax.lax.scan(lambda c, k: _record(spec, c, k, None), (params, opt_state), keys)
    return (params, opt_state, start + n_records), out


def _check_loop(n_steps, record_every, batch_size, prompt_length):
    n_steps, record_every = C.check_steps(n_steps, record_every)
    batch_size, prompt_length = (C.scalar(v, name, low=0, integer=True) for v, name in
                                 ((batch_size, "batch_size"), (prompt_length, "prompt_length")))
    return n_steps, record_every, batch_size, prompt_length


def training_run(loss: Callable, init: Callable, sampler: Callable, optimizer, *, n_steps: int,
                 batch_size: int, prompt_length: int, record_every: int = 100, metric: Callable | None = None):
    r"""A whole training run as one pure function, for :func:`sharded_sweep` and ``vmap``.

    The same updates as :func:`fit` (fresh prompts at every step, optax updates), with no
    host interaction, so that runs can be ``vmap``-ed over seeds, start points and prompt
    lengths and sharded over devices, all in one compiled program.

    Args:
        loss, sampler, optimizer, n_steps, batch_size, prompt_length, record_every: as in
            :func:`fit`.
        init: ``init(key) -> params``, the start point when the run is given none.
        metric: ``metric(params, mask) -> pytree`` recorded every ``record_every`` steps
            (``mask`` is the run's token mask, or ``None``), or ``None`` for the mean
            training loss.

    Returns:
        ``run(key, params=None, length=None) -> (params, records)``: start from ``params``
        (default ``init`` of a key split from ``key``); with ``length`` (an int, traced or
        not, at most ``prompt_length``) every prompt is drawn with ``prompt_length`` tokens of
        which only the first ``length`` count (:attr:`Batch.mask`), so runs of different
        lengths share one program. ``records`` has a first axis of ``n_steps // record_every``.
    """
    n_steps, record_every, batch_size, prompt_length = _check_loop(n_steps, record_every, batch_size, prompt_length)
    spec = _Spec(loss, sampler, optimizer, batch_size, prompt_length, record_every, metric)

    def run(key, params=None, length=None):
        k_init, k_train = jax.random.split(key)
        mask = None if length is None else jnp.arange(prompt_length) < length
        with jax.numpy_dtype_promotion("standard"):  # see fit
            params = init(k_init) if params is None else params
            carry = (params, optimizer.init(params))
            keys = jax.random.split(k_train, n_steps // record_every)
            (params, _), records = jax.lax.scan(lambda c, k: _record(spec, c, k, mask), carry, keys)
        return params, records

    return run


# ----------------------------------------------------------------------------- sweeps across devices


def sharded_sweep(fn: Callable, seeds, *inputs, devices=None):
    r"""Run ``fn(key, *inputs_i)`` for every seed, vectorised with ``vmap`` and sharded across devices.

    The seeds (and the matching rows of ``inputs``) are split evenly over a one-axis device
    mesh (``jax.sharding.Mesh`` named ``"seeds"``); each device runs its share under
    ``vmap``. The same code runs on one CPU, several GPUs or a TPU slice; the result does
    not depend on the number of devices (a test checks it on 4 simulated CPU devices).
    Seeds are padded to a multiple of the device count and the padding is dropped from
    the result.

    Args:
        fn: ``fn(key, *inputs_i) -> pytree of arrays``, JAX-traceable (e.g. a run of
            :func:`training_run`; Python-side progress bars do not belong inside).
        seeds: a sequence of ints, one per run.
        inputs: pytrees of arrays whose leaves have a first axis of ``len(seeds)``: run i
            gets their rows i (e.g. each run's start point and prompt length).
        devices: the devices to use (default: all of ``jax.devices()``).

    Returns:
        the pytree of results stacked along a first axis of length ``len(seeds)``.
    """
    seeds = np.asarray(seeds)
    if seeds.ndim != 1 or seeds.size == 0 or not np.issubdtype(seeds.dtype, np.integer):
        raise ValueError(f"`seeds` must be a non-empty 1-D sequence of ints; got {seeds!r}")
    if seeds.min() < 0 or seeds.max() >= 2**32:  # the keys are built from uint32 seeds: no silent wrap-around
        raise ValueError(f"`seeds` must lie in [0, 2**32); got {seeds!r}")
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("`devices` must be a non-empty sequence of jax devices; got none")
    n_pad = (-len(seeds)) % len(devices)
    pad = lambda a: jnp.concatenate([jnp.asarray(a), jnp.repeat(jnp.asarray(a)[-1:], n_pad, axis=0)])  # noqa: E731
    mesh = jax.sharding.Mesh(np.array(devices), ("seeds",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seeds"))
    seeds_dev = jax.device_put(pad(seeds.astype(np.uint32)), sharding)
    inputs_dev = jax.device_put(jax.tree_util.tree_map(pad, inputs), sharding)
    out = _sweep_jit(fn, sharding)(seeds_dev, inputs_dev)
    return jax.tree_util.tree_map(lambda a: a[: len(seeds)], out)


def _sweep_jit(fn, sharding):
    """The compiled sweep: ``fn`` is a static argument of one module-level ``jax.jit`` (JAX's cache)."""
    try:
        hash(fn)
    except TypeError:  # an unhashable fn: a fresh jit of its own
        return jax.jit(lambda seeds, inputs: _sweep.__wrapped__(fn, seeds, inputs), out_shardings=sharding)
    return lambda seeds, inputs: _sweep(fn, seeds, inputs)


@functools.partial(jax.jit, static_argnums=0)
def _sweep(fn, seeds, inputs):
    # the seeds arrive sharded over the mesh; GSPMD partitions the vmapped runs accordingly
    return jax.vmap(lambda s, inp: fn(jax.random.key(s), *inp))(seeds, inputs)
