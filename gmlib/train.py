r"""Sweeps of training runs over prompt lengths and seeds, vectorised and sharded across devices.

A training run of :func:`gmlib.optimize` is a pure function of its key, so many runs can
be one compiled program: ``jax.vmap`` puts them side by side and ``jax.sharding`` spreads
them over every available device (the same code on one CPU, several GPUs or a TPU slice).
Runs on prompts of different lengths share that program too: draw every prompt at the
largest length :math:`L_{\max}` and let only its first :math:`L` tokens count,
``mask = jnp.arange(L_max) < length`` (the ``mask`` of :class:`gmlib.Batch` and
:func:`gmlib.apply_heads`). :func:`sweep` runs such a function over a grid of
(prompt length, seed) and returns its results indexed by grid position;
:func:`side_by_side` trains several models that way on the same prompts (the in-context
training of chapters 7 and 9, where :func:`schedule` gives the learning rate).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["schedule", "side_by_side", "sweep"]


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
        >>> sampler = denoise.task_sampler(1.0, 1.0, 2, n_queries=4)
        >>> heads0 = gmlib.init_heads(key=jax.random.key(0), n_heads=2, dim=2)
        >>> def loss(heads, batch):
        ...     pred = jax.vmap(gmlib.apply_heads, (None, 0, 0))(heads, batch.prompt, batch.queries)
        ...     return jnp.mean((pred - batch.targets) ** 2)  # (all 64 tokens count, for brevity)
        >>> def run(key, length):  # prompts drawn at 64 tokens, the first `length` count
        ...     draw = lambda k: sampler(k, 8, 64)
        ...     return gmlib.optimize(loss, heads0, optax.adam(1e-2), n_steps=10, sample=draw, key=key)
        >>> out = sweep(run, seeds=range(4), lengths=[16, 64])
        >>> out.params.U.shape  # (n_lengths, n_seeds, H, D, D)
        (2, 4, 2, 2, 2)
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
        >>> rate = schedule(n_steps=2000)
        >>> [float(rate(t)) for t in (0, 100, 1600, 1999)]  # start, peak, the last fifth
        [0.0, 0.02, 0.0002, 0.0002]
        >>> optimizer = optax.adam(rate)
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


def side_by_side(models, sample, loss, *, optimizer, lengths, seeds, init_seeds, n_steps: int, n_records: int = 1,
                 random: Callable | None = None, dtype=None):
    r"""Train several models side by side on the same prompts, for every (prompt length, seed).

    A model is ``(forward, start)``. ``forward`` is ``"softmax"`` or ``"linear"`` (the
    parameters are a :class:`gmlib.Heads`, applied by :func:`gmlib.apply_heads`) or a
    function ``forward(params, prompt, queries, mask) -> (Q, k)`` (e.g. a network of
    :func:`gmlib.transformer.network`); ``start`` is the parameters every seed starts from
    (their floating leaves cast to ``dtype``), a function ``start(init_seed) -> params``, or
    ``"random"``: ``random(init_seed)``. Run (i, j) starts from
    ``start(init_seeds[j])``, draws each step's prompts with ``sample(key, L_max)``,
    L_max = ``max(lengths)``, and lets their first ``lengths[i]`` tokens count (the batch's
    ``mask``). The models of a run see the same prompts: the run's loss is the sum of
    ``loss(predictions (B, Q, k), batch)`` over the models, so each model gets its own
    gradient, and an optimizer that updates every parameter on its own (Adam) trains each
    exactly as it would alone on those prompts. Every run is one :func:`gmlib.optimize`
    call and all of them one program of :func:`sweep`, over every device it finds.

    Args:
        models: ``{name: (forward, start)}``.
        sample: ``sample(key, prompt_length) -> gmlib.Batch`` (prompts, queries, targets).
        loss: ``loss(predictions, batch) -> scalar``, e.g. the squared error to ``batch.targets``.
        optimizer: an ``optax.GradientTransformation``.
        lengths: prompt lengths, positive ints, shape (n_lengths,).
        seeds: the key of each run: :func:`sweep`'s ``seeds``, (n_seeds,) or (n_lengths, n_seeds).
        init_seeds: the seed of each start, ints, shape (n_seeds,).
        n_steps: steps per run, a multiple of ``n_records``.
        n_records: parameters kept this many times, evenly spaced (the last at the end).
        random: ``random(init_seed) -> params``, the start called ``"random"``.
        dtype: the floating dtype of fixed starts (default: left as they are).

    Returns:
        the :class:`gmlib.TrainResult` of :func:`sweep`, leading axes (n_lengths, n_seeds):
        ``params[name]`` the final parameters, ``trajectory[name]`` the ``n_records`` copies
        (axis 2).

    Raises:
        ValueError: naming ``models`` (not a dict of pairs whose forward is a known string or
            callable), ``n_records``, ``init_seeds``, ``random`` (missing for a ``"random"``
            start), or what :func:`gmlib.optimize` and :func:`sweep` raise.

    Example:
        >>> sampler = denoise.task_sampler(1.0, 1.0, 2, n_queries=4)
        >>> h0 = denoise.in_context_heads(1.0, 1.0, 2)
        >>> out = side_by_side(
        ...     {"softmax": ("softmax", h0), "linear": ("linear", h0)},
        ...     lambda key, L: sampler(key, 16, L),
        ...     lambda pred, batch: jnp.mean((pred - batch.targets) ** 2),
        ...     optimizer=optax.adam(schedule(n_steps=20)), lengths=[16, 64],
        ...     seeds=[[0, 1], [2, 3]], init_seeds=[0, 1], n_steps=20)
        >>> out.params["softmax"].U.shape  # (n_lengths, n_seeds, H, D, D)
        (2, 2, 2, 2, 2)
    """
    from gmlib._loop import optimize
    from gmlib.heads import apply_heads

    if not isinstance(models, dict) or not models or any(
            not (isinstance(m, tuple) and len(m) == 2 and (callable(m[0]) or m[0] in ("softmax", "linear")))
            for m in models.values()):
        raise ValueError(f"`models` must be a non-empty dict of (forward, start) pairs, forward \"softmax\", "
                         f"\"linear\" or a function; got {models!r}")
    if not isinstance(n_records, (int, np.integer)) or n_records < 1 or n_steps % n_records:
        raise ValueError(f"`n_records` must be a positive int dividing n_steps = {n_steps}; got {n_records!r}")
    l_max = int(np.max(lengths))

    def forward(kind):
        if callable(kind):
            return kind
        return lambda params, prompt, queries, mask: apply_heads(params, prompt, queries, kind=kind, mask=mask)

    forwards = {name: forward(kind) for name, (kind, _) in models.items()}

    def total(params, batch):
        def predictions(name):
            one = lambda p, q: forwards[name](params[name], p, q, batch.mask)  # noqa: E731
            return jax.vmap(one)(batch.prompt, batch.queries)

        return sum(loss(predictions(name), batch) for name in models)

    def run(key, length, params):
        mask = jnp.arange(l_max, dtype=length.dtype) < length  # the first `length` tokens count
        return optimize(total, params, optimizer, n_steps=n_steps, record_every=n_steps // n_records,
                        trajectory=True, key=key, sample=lambda k: sample(k, l_max)._replace(mask=mask))

    def cast(x):
        return x.astype(dtype) if dtype is not None and jnp.issubdtype(jnp.result_type(x), jnp.floating) else x

    def start(seed):
        def one(st):
            if isinstance(st, str) and st == "random":
                if random is None:
                    raise ValueError('`random` must be given for a model whose start is "random"')
                return random(seed)
            return st(seed) if callable(st) else jax.tree.map(cast, st)

        return {name: one(st) for name, (_, st) in models.items()}

    init_seeds = _ints(init_seeds, "init_seeds", 1, 0, 2**32)
    starts = jax.tree.map(lambda *x: jnp.stack(x), *[start(int(s)) for s in init_seeds])
    return sweep(run, seeds=seeds, lengths=lengths, inputs=(starts,))


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
