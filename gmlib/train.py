r"""Sweeps of training runs over prompt lengths and seeds, vectorised and sharded across devices.

A training run of :func:`gmlib.optimize` is a pure function of its key, so many runs can
be one compiled program: ``jax.vmap`` puts them side by side and ``jax.sharding`` spreads
them over every available device (the same code on one CPU, several GPUs or a TPU slice).
Runs on prompts of different lengths share that program too: draw every prompt at the
largest length :math:`L_{\max}` and let only its first :math:`L` tokens count,
``mask = jnp.arange(L_max) < length`` (the ``mask`` of :class:`gmlib.Batch` and
:func:`gmlib.apply_heads`). :func:`sweep` runs such a function over a grid of
(prompt length, seed) and returns its results indexed by grid position.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["schedule", "sweep"]


def sweep(fn: Callable, *, seeds, lengths=None, inputs=(), devices=None):
    r"""Run ``fn`` for every (prompt length, seed), vectorised with ``vmap`` and sharded across devices.

    Let :math:`L_i` denote ``lengths[i]`` and :math:`s_j` ``seeds[j]``. The run at grid
    position (i, j) is ``fn(key, L_i, *rows_j)`` with ``key = jax.random.key(s_j)``
    (``fn(key, *rows_j)`` without ``lengths``), where ``rows_j`` are the rows j of
    ``inputs``. With a 1-D ``seeds`` the runs of one seed share their key across lengths
    (common random numbers: drawn at the largest length and masked, their prompts are
    nested); a 2-D ``seeds`` (n_lengths, n_seeds) gives each run a seed of its own.

    The runs, flattened length-major and padded to a multiple of the device count, are
    split evenly over a one-axis device mesh; each device runs its share under ``vmap``,
    in one compiled program (``L_i`` arrives as a traced int32, so every length shares it).
    The result does not depend on the number of devices (a test checks it on 4 simulated
    CPU devices). A new ``fn`` object (a fresh lambda) compiles anew; the same one is reused.

    Args:
        fn: ``fn(key, length, *inputs) -> pytree of arrays`` (``fn(key, *inputs)`` without
            ``lengths``), JAX-traceable: e.g. a :func:`gmlib.optimize` run with
            ``progress=False``.
        seeds: ints in [0, 2**32), shape (n_seeds,), or (n_lengths, n_seeds) for one seed
            per run.
        lengths: ``None``, or the prompt lengths, positive ints, shape (n_lengths,).
        inputs: a tuple of pytrees whose leaves have a first axis of n_seeds (e.g. each
            seed's start point): run (i, j) gets their rows j.
        devices: the devices to use (default: all of ``jax.devices()``).

    Returns:
        the pytree of ``fn``'s results, each leaf with leading axes (n_lengths, n_seeds),
        or (n_seeds,) without ``lengths``: ``out[i, j]`` is the run of ``lengths[i]`` and
        ``seeds[j]``.

    Raises:
        ValueError: naming the argument: ``fn`` not callable; ``seeds`` or ``lengths`` empty,
            not integers, out of range or of the wrong shape; an ``inputs`` leaf without a
            first axis of n_seeds; no ``devices``.

    Example:
        >>> def run(key, length):  # prompts drawn at 256 tokens, the first `length` count
        ...     mask = jnp.arange(256) < length
        ...     draw = lambda k: sampler(k, batch_size=32, prompt_length=256)._replace(mask=mask)
        ...     return gmlib.optimize(loss, heads0, optax.adam(1e-2), n_steps=1000, sample=draw, key=key)
        >>> out = train.sweep(run, seeds=range(4), lengths=[16, 64, 256])
        >>> out.params.U.shape  # (n_lengths, n_seeds, H, D, D)
        (3, 4, 2, 2, 2)
    """
    if not callable(fn):
        raise ValueError(f"`fn` must be a function; got {type(fn).__name__}")
    grid = () if lengths is None else (len(_ints(lengths, "lengths", 1, 1, 2**31)),)
    seeds = _ints(seeds, "seeds", 1 + bool(grid), 0, 2**32, rows=grid[0] if grid else None)
    n_seeds = seeds.shape[-1]
    if not isinstance(inputs, (tuple, list)) or any(jnp.ndim(a) == 0 or jnp.shape(a)[0] != n_seeds
                                                    for a in jax.tree.leaves(inputs)):
        raise ValueError(f"`inputs` must be a tuple of pytrees of arrays with a first axis of n_seeds = {n_seeds}; "
                         f"got a {type(inputs).__name__} of shapes {jax.tree.map(jnp.shape, inputs)}")
    inputs = jax.tree.map(jnp.asarray, tuple(inputs))
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("`devices` must be a non-empty sequence of jax devices; got none")
    # the runs, flattened length-major: run r = i * n_seeds + j
    seeds = np.broadcast_to(seeds, (*grid, n_seeds)).reshape(-1).astype(np.uint32)
    rows = np.tile(np.arange(n_seeds), grid[0] if grid else 1)
    n_runs = seeds.size
    pad = np.concatenate([np.arange(n_runs), np.full((-n_runs) % len(devices), n_runs - 1)])
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("runs",)),
                                          jax.sharding.PartitionSpec("runs"))
    put = functools.partial(jax.device_put, device=sharding)
    length = None if lengths is None else put(np.repeat(np.asarray(lengths, np.int32), n_seeds)[pad])
    out = _compiled(fn)(put(seeds[pad]), length, jax.tree.map(lambda a: put(a[rows[pad]]), inputs))
    return jax.tree.map(lambda a: a[:n_runs].reshape(*grid, n_seeds, *a.shape[1:]), out)


def schedule(*, n_steps: int, peak=2e-2, final=2e-4):
    r"""The learning rate of the book's finite-prompt training (chapters 7 and 9): warm-up, cosine, constant.

    With :math:`N` = ``n_steps``: a linear warm-up from 0 to ``peak`` over the first
    :math:`\lfloor N/20 \rfloor` steps (5 %), a cosine decay to ``final`` at step
    :math:`\lfloor 4N/5 \rfloor` (80 %), then ``final`` until the end, so that the last fifth
    of a run trains at a small, constant rate.

    Args:
        n_steps: N, the steps of the run, an int ≥ 20.
        peak: the largest rate, a positive number.
        final: the rate of the last fifth, a positive number.

    Returns:
        an optax schedule (``step -> rate``), e.g. for ``optax.adam(train.schedule(n_steps=2000))``.

    Raises:
        ValueError: naming ``n_steps``, ``peak`` or ``final`` when out of range.

    Example:
        >>> optimizer = optax.adam(train.schedule(n_steps=2000))
    """
    import optax

    if not isinstance(n_steps, (int, np.integer)) or n_steps < 20:
        raise ValueError(f"`n_steps` must be an int >= 20 (5 % of it warms up); got {n_steps!r}")
    for name, value in (("peak", peak), ("final", final)):
        if not (np.isscalar(value) and np.isfinite(value) and value > 0):
            raise ValueError(f"`{name}` must be a positive number; got {value!r}")
    end = 4 * int(n_steps) // 5
    warmup = optax.warmup_cosine_decay_schedule(0.0, peak, int(n_steps) // 20, end, final)
    return optax.join_schedules([warmup, optax.constant_schedule(final)], [end])


def _ints(x, name: str, max_ndim: int, low: int, high: int, rows=None) -> np.ndarray:
    """``x`` as a non-empty numpy int array of at most ``max_ndim`` axes (two: ``rows`` rows), entries in [low, high)"""
    try:
        a = np.asarray(x)
    except ValueError:  # a ragged list
        a = np.asarray(None)
    if not (1 <= a.ndim <= max_ndim and a.size and np.issubdtype(a.dtype, np.integer)) \
            or a.min() < low or a.max() >= high or (a.ndim == 2 and a.shape[0] != rows):
        raise ValueError(f"`{name}` must be a non-empty array of ints in [{low}, {high}) with at most {max_ndim} "
                         f"axes{f' (two: n_lengths = {rows} rows)' if max_ndim == 2 else ''}; got {x!r}")
    return a


def _compiled(fn):
    """The compiled sweep of ``fn``: the module-level jit (cached on ``fn``), or a jit of its own if unhashable."""
    try:
        hash(fn)
    except TypeError:
        return jax.jit(functools.partial(_runs.__wrapped__, fn))
    return functools.partial(_runs, fn)


@functools.partial(jax.jit, static_argnums=0)
def _runs(fn, seeds, lengths, inputs):
    # the arguments arrive sharded over the mesh; GSPMD partitions the vmapped runs accordingly
    def one(seed, length, rows):
        key = jax.random.key(seed)
        return fn(key, *rows) if length is None else fn(key, length, *rows)

    return jax.vmap(one)(seeds, lengths, inputs)
