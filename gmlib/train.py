r"""Training attention heads on finite prompts (chapter 7, beyond the paper).

Each training example is a *prompt* of L tokens drawn from a task, plus queries and
their targets. A model is one layer of H attention heads (softmax or linear), each
optionally residual, followed by an optional output map:

.. math::

    f_\theta(z) = W_{\mathrm{out}}
    \begin{pmatrix} r\,z + T_{U_1,V_1}[\mu_L](z) \\ \vdots \\ r\,z + T_{U_H,V_H}[\mu_L](z) \end{pmatrix},
    \qquad r \in \{0, 1\},

where :math:`T` is :func:`~gmlib.softmax_attention` or :func:`~gmlib.linear_attention` over
the L tokens of the prompt. Without an output map the heads are summed (multi-head
attention, NOTES §0). Parameters are a dict pytree ``{"U": (H, D, D), "V": (H, D_v, D)}``
plus ``"W_out": (D_y, H D_v)`` when there is an output map.

Training is plain optax on minibatches of prompts, in ``lax.scan`` chunks; sweeps over
seeds run under ``vmap`` and are sharded over every available device with
``jax.sharding`` (the same code on one CPU, several GPUs or a TPU slice).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gmlib import _checks as C
from gmlib.attention import linear_attention, softmax_attention
from gmlib.lda import LDAProblem

__all__ = [
    "Batch",
    "init_heads",
    "apply_heads",
    "denoising_task_sampler",
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
    """

    tokens: jax.Array
    queries: jax.Array
    targets: jax.Array
    aux: object = None


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
        scale: the scale of U and V.
        dtype: floating dtype (default: JAX's default float).

    Returns:
        a dict ``{"U", "V"}`` (and ``"W_out"`` with an output map).
    """
    n_heads = C.check_positive_int(n_heads, "n_heads")
    dim = C.check_positive_int(dim, "dim")
    value_dim = dim if value_dim is None else C.check_positive_int(value_dim, "value_dim")
    dtype = C.check_float_dtype(dtype)
    C.check_key(key)
    scale = C.as_float_array(scale, "scale", dtype)
    C.check_shape(scale, "scale", (), "() (a scalar)")
    C.check_finite(scale, "scale")
    if out_dim is not None:
        out_dim = C.check_positive_int(out_dim, "out_dim")
    ku, kv, kw = jax.random.split(key, 3)
    factor = scale / jnp.sqrt(jnp.asarray(dim, dtype))  # all in `dtype`: strict promotion
    params = {
        "U": factor * jax.random.normal(ku, (n_heads, dim, dim), dtype),
        "V": factor * jax.random.normal(kv, (n_heads, value_dim, dim), dtype),
    }
    if out_dim is not None:
        params["W_out"] = (jax.random.normal(kw, (out_dim, n_heads * value_dim), dtype)
                           / jnp.sqrt(jnp.asarray(n_heads * value_dim, dtype)))
    return params


def _check_params(params, dim: int, residual: bool):
    if not isinstance(params, dict) or "U" not in params or "V" not in params:
        raise ValueError("`params` must be a dict with keys 'U' (H, D, D) and 'V' (H, D_v, D); got "
                         f"{type(params).__name__}")
    U, V = C.as_float_array(params["U"], "params['U']"), C.as_float_array(params["V"], "params['V']")
    C.check_shape(U, "params['U']", (None, dim, dim), f"(H, D, D) with D = {dim}")
    if U.shape[0] == 0:
        raise ValueError("`params['U']` must hold at least one head; got shape " + str(tuple(U.shape)))
    C.check_shape(V, "params['V']", (U.shape[0], None, dim), f"(H, D_v, D) = ({U.shape[0]}, D_v, {dim})")
    if residual and V.shape[1] != dim:
        raise ValueError(f"a residual head needs D_v = D = {dim}; got `params['V']` of shape {tuple(V.shape)}")
    checked = {"U": U, "V": V}
    if "W_out" in params:
        checked["W_out"] = C.as_float_array(params["W_out"], "params['W_out']")
        C.check_shape(checked["W_out"], "params['W_out']", (None, U.shape[0] * V.shape[1]),
                      f"(D_y, H D_v) with H D_v = {U.shape[0] * V.shape[1]}")
    for name, val in checked.items():
        C.check_finite(val, f"params['{name}']")
    return checked


def apply_heads(params, tokens, queries, *, kind: str = "softmax", residual: bool = False, block_size=None):
    r"""One layer of attention heads over one finite prompt (the formula in the module docstring).

    Args:
        params: a dict from :func:`init_heads` (or built by hand).
        tokens: the prompt, (L, D).
        queries: (Q, D).
        kind: ``"softmax"`` or ``"linear"``.
        residual: add the query to each head's output (needs D_v = D).
        block_size: passed to :func:`~gmlib.softmax_attention`.

    Returns:
        array (Q, D_y), with D_y = D_v when there is no output map.

    Raises:
        ValueError: for an unknown ``kind`` or parameters whose shapes do not fit.

    Use ``jax.vmap`` over a batch of prompts (see :func:`fit`).
    """
    if kind not in _KINDS:
        raise ValueError(f"`kind` must be one of {_KINDS}; got {kind!r}")
    tokens = C.as_float_array(tokens, "tokens")
    C.check_shape(tokens, "tokens", (None, None), "(L, D)")
    params = _check_params(params, tokens.shape[1], residual)
    dtype = C.common_float_dtype(tokens, queries, *params.values())  # one dtype: strict promotion
    tokens = tokens.astype(dtype)
    queries = C.as_float_array(queries, "queries", dtype)
    params = {k: v.astype(dtype) for k, v in params.items()}
    heads = []
    for U, V in zip(params["U"], params["V"]):
        if kind == "softmax":
            out = softmax_attention(tokens, queries, U, V, block_size=block_size)
        else:
            out = linear_attention(tokens, queries, U, V)
        heads.append(out + queries if residual else out)
    if "W_out" in params:
        return jnp.concatenate(heads, axis=-1) @ params["W_out"].T
    return sum(heads)


# ----------------------------------------------------------------------------- prompt samplers


def denoising_task_sampler(gamma: float, xi: float, dim: int, *, radius: float = 3.0,
                           weight_range=(0.2, 0.8), n_queries: int = 1):
    r"""Prompts for in-context denoising (the setting of Prop 4.4), one fresh task per prompt.

    A task is :math:`\tau = (m_1, m_2, \pi_1)` with :math:`m_1, m_2` independent uniform on
    the sphere of radius ``radius`` (equal norms, as Prop 4.4 needs) and
    :math:`\pi_1` uniform on ``weight_range``. The prompt holds L noisy samples
    :math:`Z = X + \xi\varepsilon`, :math:`X \sim \sum_k \pi_k \mathcal N(m_k, \gamma^2 I)`;
    the queries are fresh noisy samples of the same task and the targets their clean
    :math:`X` (so the squared loss is the denoising risk).

    Returns:
        ``sample(key, batch_size, prompt_length) -> Batch`` with ``aux = (means (B, 2, d), weights (B, 2))``.
    """
    dim = C.check_positive_int(dim, "dim")
    n_queries = C.check_positive_int(n_queries, "n_queries")
    gamma, xi, radius = (_host_scalar(v, name) for v, name in ((gamma, "gamma"), (xi, "xi"), (radius, "radius")))
    if not gamma >= 0:
        raise ValueError(f"`gamma` must be finite and non-negative; got {gamma}")
    if not xi > 0:
        raise ValueError(f"`xi` must be finite and positive; got {xi}")
    if not radius > 0:
        raise ValueError(f"`radius` must be finite and positive; got {radius}")
    wr = C.as_float_array(weight_range, "weight_range", jnp.float64 if jax.config.jax_enable_x64 else None)
    C.check_shape(wr, "weight_range", (2,), "(2,) (low, high)")
    lo, hi = (float(v) for v in np.asarray(wr))
    if not 0 < lo <= hi < 1:
        raise ValueError(f"`weight_range` must satisfy 0 < low <= high < 1; got {weight_range}")

    def sample(key, batch_size: int, prompt_length: int) -> Batch:
        C.check_key(key)
        batch_size = C.check_positive_int(batch_size, "batch_size")
        prompt_length = C.check_positive_int(prompt_length, "prompt_length")
        k_m, k_p, k_x = jax.random.split(key, 3)
        dirs = jax.random.normal(k_m, (batch_size, 2, dim))
        means = radius * dirs / jnp.linalg.norm(dirs, axis=-1, keepdims=True)
        p1 = jax.random.uniform(k_p, (batch_size,), minval=lo, maxval=hi)
        weights = jnp.stack([p1, 1 - p1], axis=-1)
        n = prompt_length + n_queries
        k_c, k_g, k_e = jax.random.split(k_x, 3)
        labels = (jax.random.uniform(k_c, (batch_size, n)) > p1[:, None]).astype(jnp.int32)
        clean = jnp.take_along_axis(means, labels[..., None], axis=1) + gamma * jax.random.normal(
            k_g, (batch_size, n, dim))
        noisy = clean + xi * jax.random.normal(k_e, (batch_size, n, dim))
        return Batch(noisy[:, :prompt_length], noisy[:, prompt_length:], clean[:, prompt_length:],
                     (means, weights))

    return sample


def _host_scalar(value, name: str) -> float:
    """A finite real scalar as a Python float, or a ValueError naming it."""
    a = C.as_float_array(value, name, jnp.float64 if jax.config.jax_enable_x64 else None)
    C.check_shape(a, name, (), "() (a scalar)")
    C.check_finite(a, name)
    return float(a)


def classification_prompt_sampler(mean_pos, mean_neg, cov, p_pos: float, *, n_queries: int = 1):
    r"""Prompts of labelled tokens :math:`(X, Y)` for in-context LDA (chapter 7).

    :math:`Y = \pm 1` with :math:`P(Y = 1) = p_+`, :math:`X \mid Y = c \sim \mathcal N(m_c, \Gamma)`.
    Tokens are :math:`(X, Y) \in \mathbb R^{d+1}`, queries :math:`(x, 0)` and targets the labels
    :math:`y` (shape (B, Q, 1)). The task is the same for every prompt; the prompts differ.

    Returns:
        ``sample(key, batch_size, prompt_length) -> Batch``.
    """
    # the checks of LDAProblem (shapes, finite, cov symmetric positive definite, p_pos in (0, 1)), in float64
    f64 = jnp.float64 if jax.config.jax_enable_x64 else None
    task = LDAProblem(*(C.as_float_array(a, name, f64) for a, name in
                        ((mean_pos, "mean_pos"), (mean_neg, "mean_neg"), (cov, "cov"), (p_pos, "p_pos"))))
    mean_pos, mean_neg, cov = (np.asarray(a, dtype=np.float64) for a in (task.mean_pos, task.mean_neg, task.cov))
    p_pos = float(task.p_pos)
    d = mean_pos.shape[0]
    root = np.linalg.cholesky(cov)
    n_queries = C.check_positive_int(n_queries, "n_queries")

    def sample(key, batch_size: int, prompt_length: int) -> Batch:
        C.check_key(key)
        batch_size = C.check_positive_int(batch_size, "batch_size")
        prompt_length = C.check_positive_int(prompt_length, "prompt_length")
        dtype = C.common_float_dtype()
        k_y, k_x = jax.random.split(key)
        n = prompt_length + n_queries
        y = jnp.where(jax.random.uniform(k_y, (batch_size, n)) < p_pos, 1.0, -1.0).astype(dtype)
        centre = jnp.where(y[..., None] > 0, jnp.asarray(mean_pos, dtype), jnp.asarray(mean_neg, dtype))
        x = centre + jax.random.normal(k_x, (batch_size, n, d), dtype) @ jnp.asarray(root.T, dtype)
        tokens = jnp.concatenate([x[:, :prompt_length], y[:, :prompt_length, None]], axis=-1)
        queries = jnp.concatenate([x[:, prompt_length:], jnp.zeros((batch_size, n_queries, 1), dtype)], axis=-1)
        return Batch(tokens, queries, y[:, prompt_length:, None])

    return sample


# ----------------------------------------------------------------------------- training


def fit(loss: Callable, params, sampler: Callable, optimizer, key, *, n_steps: int, batch_size: int,
        prompt_length: int, record_every: int = 100, metric: Callable | None = None, progress: bool = False):
    r"""Minibatch training on fresh prompts: ``n_steps`` optax updates, in ``lax.scan`` chunks.

    Each step draws a fresh :class:`Batch` with ``sampler(key, batch_size, prompt_length)``
    and applies ``optimizer`` to the gradient of ``loss(params, batch)``. Between chunks
    of ``record_every`` steps it records ``metric(params)`` (default: the mean training
    loss of the chunk) and advances a tqdm bar when ``progress`` is true. The whole chunk
    is one compiled ``lax.scan``: no host synchronisation inside.

    Args:
        loss: ``loss(params, batch) -> scalar``, JAX-traceable.
        params: the initial parameters (any pytree).
        sampler: ``sampler(key, batch_size, prompt_length) -> Batch``.
        optimizer: an ``optax.GradientTransformation``.
        key: a ``jax.random`` key.
        n_steps: total number of steps, a multiple of ``record_every``.
        batch_size: prompts per step.
        prompt_length: L, tokens per prompt.
        record_every: steps per chunk.
        metric: ``metric(params) -> pytree`` recorded after each chunk, or ``None``.
        progress: show a tqdm progress bar.

    Returns:
        ``(params, history)``: the final parameters and a dict with ``"step"`` (n_chunks,)
        and ``"metric"`` (the recorded values stacked along a first axis).
    """
    n_steps, record_every, batch_size, prompt_length = _check_loop(n_steps, record_every, batch_size, prompt_length)
    C.check_key(key)
    _check_params_tree(params)
    params_spec = jax.tree_util.tree_map(_spec, params)
    _check_fns(loss, params_spec, sampler, optimizer, batch_size, prompt_length)
    if metric is not None:
        C.check_callable(metric, "metric")
        try:
            jax.eval_shape(metric, params_spec)
        except Exception as exc:
            raise ValueError(f"`metric` failed on the params: {type(exc).__name__}: {exc}") from None
    chunk = _make_chunk(loss, sampler, optimizer, batch_size, prompt_length, record_every)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(params)
    history, steps = [], []
    n_chunks = n_steps // record_every
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_steps, unit="step")
    for i in range(n_chunks):
        # optax mixes Python floats with int32 step counts (Adam's bias correction), which
        # the user's "strict" dtype promotion would reject: trace the chunk under the
        # standard rules (a scoped setting, restored on exit).
        with jax.numpy_dtype_promotion("standard"):
            params, opt_state, mean_loss = chunk(params, opt_state, jax.random.fold_in(key, i))
        history.append(mean_loss if metric is None else metric(params))
        steps.append((i + 1) * record_every)
        if bar is not None:
            bar.update(record_every)
    if bar is not None:
        bar.close()
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *history)
    return params, {"step": np.array(steps), "metric": stacked}


def _spec(a):
    a = jnp.asarray(a)
    return jax.ShapeDtypeStruct(a.shape, a.dtype)


def _check_loop(n_steps, record_every, batch_size, prompt_length):
    n_steps = C.check_positive_int(n_steps, "n_steps")
    record_every = C.check_positive_int(record_every, "record_every")
    batch_size = C.check_positive_int(batch_size, "batch_size")
    prompt_length = C.check_positive_int(prompt_length, "prompt_length")
    if n_steps % record_every:
        raise ValueError(f"`n_steps` must be a multiple of `record_every` = {record_every}; got {n_steps}")
    return n_steps, record_every, batch_size, prompt_length


def _check_params_tree(params, name: str = "params"):
    """A pytree of finite floating arrays (what optax and jax.grad need)."""
    leaves = jax.tree_util.tree_leaves(params)
    if not leaves:
        raise ValueError(f"`{name}` must be a pytree of floating arrays; got no leaves ({type(params).__name__})")
    for leaf in leaves:
        dt = getattr(leaf, "dtype", None)
        if dt is None or not jnp.issubdtype(dt, jnp.floating):
            raise ValueError(f"`{name}` must be a pytree of floating arrays; got a leaf of type "
                             f"{type(leaf).__name__} (dtype {dt})")
        if isinstance(leaf, (jax.Array, np.ndarray)):  # not the shapes of training_run's init
            C.check_finite(leaf, name)


def _check_fns(loss, params_spec, sampler, optimizer, batch_size, prompt_length):
    """Trace (no compute) one step's sampler and loss, so that a bad function is named before the loop compiles."""
    C.check_callable(loss, "loss")
    C.check_callable(sampler, "sampler")
    if not isinstance(optimizer, optax.GradientTransformation):
        raise ValueError(f"`optimizer` must be an optax.GradientTransformation; got {type(optimizer).__name__}")
    try:
        batch = jax.eval_shape(lambda k: sampler(k, batch_size, prompt_length), jax.random.key(0))
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"`sampler` failed on (key, batch_size, prompt_length): {type(exc).__name__}: {exc}") from None
    try:
        with jax.numpy_dtype_promotion("standard"):
            out = jax.eval_shape(loss, params_spec, batch)
    except Exception as exc:
        raise ValueError(f"`loss` failed on (params, batch): {type(exc).__name__}: {exc}") from None
    if not (hasattr(out, "shape") and out.shape == () and jnp.issubdtype(out.dtype, jnp.floating)):
        raise ValueError(f"`loss` must return a floating scalar; got {out}")


def _make_step(loss, sampler, optimizer, batch_size, prompt_length):
    def step(carry, key):
        params, opt_state = carry
        batch = sampler(key, batch_size, prompt_length)
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    return step


def _make_chunk(loss, sampler, optimizer, batch_size, prompt_length, n_steps):
    """The compiled chunk of ``n_steps`` updates.

    The functions and sizes are static arguments of one module-level ``jax.jit``, so JAX's
    own compilation cache serves repeated fits with the same functions and sizes (the usual
    ``jit`` semantics: a function is traced again only when a new function object comes).
    """
    static = dict(loss=loss, sampler=sampler, optimizer=optimizer, batch_size=batch_size,
                  prompt_length=prompt_length, n_steps=n_steps)
    try:
        hash(tuple(static.values()))
    except TypeError:  # an unhashable loss, sampler or optimizer: a fresh jit of its own
        return jax.jit(lambda params, opt_state, key: _chunk.__wrapped__(params, opt_state, key, **static))
    return lambda params, opt_state, key: _chunk(params, opt_state, key, **static)


@functools.partial(jax.jit, static_argnames=("loss", "sampler", "optimizer", "batch_size", "prompt_length", "n_steps"))
def _chunk(params, opt_state, key, *, loss, sampler, optimizer, batch_size, prompt_length, n_steps):
    step = _make_step(loss, sampler, optimizer, batch_size, prompt_length)
    (params, opt_state), values = jax.lax.scan(step, (params, opt_state), jax.random.split(key, n_steps))
    return params, opt_state, values.mean()


def training_run(loss: Callable, init: Callable, sampler: Callable, optimizer, *, n_steps: int,
                 batch_size: int, prompt_length: int, record_every: int = 100):
    r"""A whole training run as one pure function of a key, for :func:`sharded_sweep`.

    The same updates as :func:`fit` (fresh prompts at every step, optax updates), but the
    initialisation is drawn inside (``init(key) -> params``) and the loop is a nested
    ``lax.scan`` with no host interaction, so the run can be ``vmap``-ed over seeds and
    sharded over devices.

    Returns:
        ``run(key) -> (params, losses)``, ``losses`` of shape (n_steps // record_every,):
        the mean training loss of each chunk of ``record_every`` steps.
    """
    n_steps, record_every, batch_size, prompt_length = _check_loop(n_steps, record_every, batch_size, prompt_length)
    C.check_callable(init, "init")
    try:
        with jax.numpy_dtype_promotion("standard"):
            params_spec = jax.eval_shape(init, jax.random.key(0))
    except Exception as exc:
        raise ValueError(f"`init` failed on a key: {type(exc).__name__}: {exc}") from None
    _check_params_tree(params_spec, "init")
    _check_fns(loss, params_spec, sampler, optimizer, batch_size, prompt_length)
    step = _make_step(loss, sampler, optimizer, batch_size, prompt_length)

    def run(key):
        C.check_key(key)
        k_init, k_train = jax.random.split(key)
        with jax.numpy_dtype_promotion("standard"):  # see fit
            params = init(k_init)
            carry = (params, optimizer.init(params))

            def chunk(carry, key):
                carry, values = jax.lax.scan(step, carry, jax.random.split(key, record_every))
                return carry, values.mean()

            (params, _), losses = jax.lax.scan(chunk, carry, jax.random.split(k_train, n_steps // record_every))
        return params, losses

    return run


# ----------------------------------------------------------------------------- sweeps across devices


def sharded_sweep(fn: Callable, seeds, *, devices=None):
    r"""Run ``fn(key)`` for every seed, vectorised with ``vmap`` and sharded across devices.

    The seeds are split evenly over a one-axis device mesh (``jax.sharding.Mesh``
    named ``"seeds"``); each device runs its share under ``vmap``. The same code runs on
    one CPU, several GPUs or a TPU slice; the result does not depend on the number of
    devices (a test checks it on 4 simulated CPU devices). Seeds are padded to a multiple
    of the device count and the padding is dropped from the result.

    Args:
        fn: ``fn(key) -> pytree of arrays``, JAX-traceable (e.g. a whole training run
            written with ``lax.scan``; Python-side progress bars do not belong inside).
        seeds: a sequence of ints.
        devices: the devices to use (default: all of ``jax.devices()``).

    Returns:
        the pytree of results stacked along a first axis of length ``len(seeds)``.
    """
    C.check_callable(fn, "fn")
    try:
        seeds = np.asarray(seeds)
    except Exception:
        raise ValueError(f"`seeds` must be a non-empty 1-D sequence of ints; got {type(seeds).__name__}") from None
    if seeds.ndim != 1 or seeds.size == 0 or not np.issubdtype(seeds.dtype, np.integer):
        raise ValueError(f"`seeds` must be a non-empty 1-D sequence of ints; got {seeds!r}")
    if seeds.min() < 0 or seeds.max() >= 2**32:  # the keys are built from uint32 seeds: no silent wrap-around
        raise ValueError(f"`seeds` must lie in [0, 2**32); got {seeds!r}")
    try:
        devices = list(jax.devices() if devices is None else devices)
    except TypeError:
        raise ValueError(f"`devices` must be a sequence of jax devices; got {type(devices).__name__}") from None
    if not devices or not all(isinstance(dev, jax.Device) for dev in devices):
        raise ValueError(f"`devices` must be a non-empty sequence of jax devices; got {devices!r}")
    n_dev = len(devices)
    padded = np.concatenate([seeds, np.repeat(seeds[-1:], (-len(seeds)) % n_dev)])
    mesh = jax.sharding.Mesh(np.array(devices), ("seeds",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seeds"))
    seeds_dev = jax.device_put(jnp.asarray(padded, dtype=jnp.uint32), sharding)
    out = _sweep_jit(fn, sharding)(seeds_dev)
    return jax.tree_util.tree_map(lambda a: a[: len(seeds)], out)


def _sweep_jit(fn, sharding):
    """The compiled sweep: ``fn`` is a static argument of one module-level ``jax.jit`` (JAX's cache)."""
    try:
        hash(fn)
    except TypeError:  # an unhashable fn: a fresh jit of its own
        return jax.jit(lambda seeds: _sweep.__wrapped__(fn, seeds), out_shardings=sharding)
    return lambda seeds: _sweep(fn, seeds)


@functools.partial(jax.jit, static_argnums=0)
def _sweep(fn, seeds):
    # the seeds arrive sharded over the mesh; GSPMD partitions the vmapped runs accordingly
    return jax.vmap(lambda s: fn(jax.random.key(s)))(seeds)
