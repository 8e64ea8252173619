r"""The one training loop of gmlib (:func:`optimize`), its result type and its chunked driver.

Every training in the book and the library goes through :func:`optimize`: an optax
optimizer on the gradient of a loss, either deterministic (``loss(params)``, e.g. a
population risk computed by quadrature) or stochastic (``loss(params, batch)`` on a fresh
``sample(key_t)`` at every step), as one compiled ``lax.scan`` run in chunks
(:func:`run_chunks`) with an optional progress bar.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gmlib import _checks as C

__all__ = ["TrainResult", "optimize", "run_chunks"]


class TrainResult(NamedTuple):
    """What a training run returns.

    Attributes:
        params: the final parameters (a pytree).
        steps: the recorded step numbers, shape (n_records,) (int).
        metric: the values recorded at those steps, stacked on a first axis of length
            n_records (``optimize``'s ``metric``, e.g. the population risk for
            :func:`gmlib.lda.gradient_descent`, or the mean training loss).
        trajectory: the parameters at those steps (each leaf with a leading axis of
            length n_records), or ``None`` when not recorded.
    """

    params: Any
    steps: np.ndarray
    metric: Any
    trajectory: Any = None


def run_chunks(block: Callable, state, *, n_records: int, chunk_records: int | None = None,
               progress: bool = False, desc: str | None = None):
    """Advance ``state`` by ``n_records`` records, in chunks, with an optional tqdm bar.

    ``block(state, k) -> (state, out)`` advances ``state`` by ``k`` records (typically a
    jitted ``lax.scan`` with ``k`` static) and returns their outputs, a pytree of arrays
    with a leading axis of length ``k``. The outputs of all chunks are concatenated.
    Between chunks the bar advances; a chunk is one device call, so the loop syncs with
    the host only between chunks.

    Args:
        block: the chunk function.
        state: the initial state (a pytree).
        n_records: the total number of records, a positive int.
        chunk_records: records per chunk; default all of them in one chunk, or about
            twenty chunks when ``progress`` is true (only the last one may be shorter, so
            at most two shapes compile).
        progress: show a tqdm bar.
        desc: the bar's label.

    Returns:
        ``(state, outs)``: the final state and the concatenated outputs.

    Raises:
        ValueError: naming ``n_records`` or ``chunk_records`` when not a positive int.

    Example:
        >>> def block(s, k):  # k records of one step each: the state doubles, the record is the state
        ...     return jax.lax.scan(lambda c, _: (2 * c, 2 * c), s, length=k)
        >>> state, records = run_chunks(block, 1.0, n_records=10, chunk_records=4)
        >>> float(state), records.shape
        (1024.0, (10,))
    """
    n_records = C.scalar(n_records, "n_records", low=0, integer=True)
    if chunk_records is None:
        chunk_records = n_records if not progress else max(1, n_records // 20)
    chunk_records = C.scalar(chunk_records, "chunk_records", low=0, integer=True)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_records, desc=desc)
    outs, done = [], 0
    while done < n_records:
        k = min(chunk_records, n_records - done)
        state, out = block(state, k)
        outs.append(out)
        done += k
        if bar is not None:
            bar.update(k)
    if bar is not None:
        bar.close()
    return state, jax.tree.map(lambda *a: jnp.concatenate(a), *outs)


def optimize(loss: Callable, params, optimizer, *, n_steps: int, record_every: int = 1, sample: Callable | None = None,
             key=None, metric: Callable | None = None, trajectory: bool = False, chunk_records: int | None = None,
             progress: bool = False, desc: str | None = None) -> TrainResult:
    r"""Train ``params`` with an optax optimizer: the one training loop of gmlib.

    Step t (t = 0, …, ``n_steps`` − 1) takes the gradient of ``loss(params)`` or, with
    ``sample``, of ``loss(params, sample(key_t))`` on a fresh draw, with
    ``key_t = jax.random.fold_in(key, t)``; ``optimizer`` (any
    ``optax.GradientTransformation``: ``optax.sgd(eta)`` is plain gradient descent)
    turns it into the update:

    .. math::

        \theta_{t+1} = \theta_t + \mathrm{update}\big(\nabla_\theta\, \ell(\theta_t, b_t)\big).

    After every ``record_every`` steps it records ``metric(params)`` (default: the mean
    of the losses of those steps) and, with ``trajectory``, the parameters. With a
    ``metric`` the start point is recorded too (step 0). The steps run on the device in
    one compiled ``lax.scan`` per chunk of ``chunk_records`` records, between which a
    tqdm bar advances when ``progress`` is true.

    Arrays held by ``loss``, ``sample`` and ``metric`` as a ``jax.tree_util.Partial``
    (``Partial(fn, problem)``) are passed to the compiled program as data, so calls that
    differ only in those arrays share one compilation; anything else they close over is
    part of the program (a new function object compiles anew). ``optimize`` can itself run
    under ``jax.vmap`` or ``jax.jit`` (no progress bar then): runs over seeds, start
    points or prompt lengths side by side (see :func:`gmlib.train.sweep`); write
    ``jax.jit(jax.vmap(run))`` so that the batched program is compiled once, not at every
    call. With a ``metric`` only the gradient of the loss is computed (its values are not
    recorded).

    Args:
        loss: ``loss(params) -> scalar``, or ``loss(params, batch) -> scalar`` with
            ``sample``; JAX-traceable.
        params: the start point, any pytree of floating arrays (e.g. a :class:`gmlib.Heads`).
        optimizer: an ``optax.GradientTransformation``. A line-search method whose state
            stores the value and gradient (``optax.lbfgs``, or a chain ending in
            ``optax.scale_by_zoom_linesearch``) works with a deterministic ``loss``: each
            step hands it ``value``, ``grad`` and ``value_fn=loss`` and reuses the value
            and gradient its line search computed at the accepted point
            (``optax.value_and_grad_from_state``), as optax's L-BFGS examples do.
        n_steps: the number of steps, a multiple of ``record_every``.
        record_every: steps between two records.
        sample: ``sample(key) -> batch``, a fresh batch per step, or ``None``.
        key: a ``jax.random`` key, needed with ``sample``.
        metric: ``metric(params) -> pytree``, JAX-traceable, or ``None``.
        trajectory: record the parameters too.
        chunk_records: records per compiled chunk (default: all at once, or about twenty
            chunks with ``progress``).
        progress: show a tqdm bar.
        desc: the bar's label.

    Returns:
        a :class:`TrainResult`: the final parameters, the recorded steps (``record_every``,
        ``2 record_every``, … ``n_steps``, preceded by 0 with a ``metric``), the records
        stacked along a first axis, and the parameters at those steps with ``trajectory``.

    Raises:
        ValueError: naming the argument: ``n_steps`` not a positive multiple of
            ``record_every``, ``sample`` without ``key``, a non-callable ``loss``.

    Example:
        >>> loss = lambda th: jnp.sum((th - 3.0) ** 2)  # its minimum at 3
        >>> out = optimize(loss, jnp.zeros(2), optax.sgd(0.1), n_steps=100, record_every=10, metric=loss)
        >>> out.steps[:3].tolist(), out.metric.shape, np.round(out.params, 6).tolist()
        ([0, 10, 20], (11,), [3.0, 3.0])
        >>> draw = lambda key: jax.random.normal(key, (32,)) + 3.0  # a fresh batch every step
        >>> out = optimize(lambda th, b: jnp.mean((th - b) ** 2), 0.0, optax.sgd(0.05), n_steps=500,
        ...                sample=draw, key=jax.random.key(0))
        >>> abs(float(out.params) - 3.0) < 0.1
        True
    """
    n_steps = C.scalar(n_steps, "n_steps", low=0, integer=True)
    record_every = C.scalar(record_every, "record_every", low=0, integer=True)
    if n_steps % record_every:  # no step dropped
        raise ValueError(f"`n_steps` must be a multiple of `record_every` = {record_every}; got {n_steps}")
    for name, fn in (("loss", loss), ("sample", sample), ("metric", metric)):
        if fn is not None and not callable(fn):
            raise ValueError(f"`{name}` must be a function; got {type(fn).__name__}")
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise ValueError(f"`optimizer` must be an optax.GradientTransformation; got {type(optimizer).__name__}")
    if sample is not None and key is None:
        raise ValueError("`key` must be a jax.random key when `sample` draws the batches; got None")
    dynamic, static = _partition((loss, sample, metric))
    with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats with int32 counts
        state = (params, optimizer.init(params), jnp.zeros((), jnp.int32))
    line_search = sample is None and _stores_value(state[1])
    spec = _Spec(static, optimizer, record_every, metric is not None, bool(trajectory), line_search)

    def block(state, k):
        with jax.numpy_dtype_promotion("standard"):
            return _block(state, dynamic, key, spec=spec, n_records=k)

    n_records = n_steps // record_every
    state, (records, traj) = run_chunks(block, state, n_records=n_records, chunk_records=chunk_records, progress=progress,
                                        desc=desc or "training")
    steps = np.arange(1, n_records + 1) * record_every
    if metric is not None:  # the start point too
        first = lambda a0, a: jnp.concatenate([jnp.asarray(a0)[None], a])  # noqa: E731
        records = jax.tree.map(first, metric(params), records)
        traj = jax.tree.map(first, params, traj) if trajectory else None
        steps = np.concatenate([[0], steps])
    return TrainResult(state[0], steps, records, traj if trajectory else None)


def _stores_value(opt_state) -> bool:
    """Whether an optimizer state holds the ``value`` and ``grad`` of a line search (optax.lbfgs and the like)."""
    try:
        get = optax.tree_utils.tree_get
        return get(opt_state, "value") is not None and get(opt_state, "grad") is not None
    except KeyError:  # several line searches: not one value to reuse
        return False


def _is_data(leaf) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def _partition(tree):
    """Split a pytree of functions into its array leaves (data for the program) and the rest (static, hashable)."""
    leaves, treedef = jax.tree.flatten(tree)
    data = [leaf if _is_data(leaf) else None for leaf in leaves]
    rest = tuple(None if _is_data(leaf) else _Static(leaf) for leaf in leaves)
    return data, (treedef, rest)


def _combine(data, static):
    treedef, rest = static
    return jax.tree.unflatten(treedef, [d if s is None else s.value for d, s in zip(data, rest)])


class _Static(NamedTuple):
    """A static leaf, compared by equality where it can be, else by identity."""

    value: Any

    def __eq__(self, other):
        if not isinstance(other, _Static):
            return NotImplemented
        try:
            return bool(self.value is other.value or self.value == other.value)
        except Exception:  # arrays-like objects whose == is elementwise
            return self.value is other.value

    def __hash__(self):
        try:
            return hash(self.value)
        except TypeError:
            return id(self.value)


class _Spec(NamedTuple):
    """What a chunk of training needs that is static (hashable: the jit cache keys on it)."""

    fns: Any
    optimizer: Any
    record_every: int
    has_metric: bool
    trajectory: bool
    line_search: bool = False


@partial(jax.jit, static_argnames=("spec", "n_records"))
def _block(state, data, key, *, spec, n_records):
    loss, sample, metric = _combine(data, spec.fns)
    opt = spec.optimizer

    def step(carry, t):
        params, opt_state = carry
        if spec.line_search:  # the line search's value and gradient at the accepted point, and the loss itself
            value, grads = optax.value_and_grad_from_state(loss)(params, state=opt_state)
            updates, opt_state = opt.update(grads, opt_state, params, value=value, grad=grads, value_fn=loss)
            return (optax.apply_updates(params, updates), opt_state), value
        args = () if sample is None else (sample(jax.random.fold_in(key, t)),)
        if spec.has_metric:  # the losses are not recorded: the gradient alone
            value, grads = None, jax.grad(loss)(params, *args)
        else:
            value, grads = jax.value_and_grad(loss)(params, *args)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    def record(carry, start):
        params, opt_state, _ = carry
        (params, opt_state), values = jax.lax.scan(step, (params, opt_state), start + jnp.arange(spec.record_every))
        out = metric(params) if spec.has_metric else values.mean()
        return (params, opt_state, start + spec.record_every), (out, params if spec.trajectory else None)

    params, opt_state, t0 = state
    starts = t0 + spec.record_every * jnp.arange(n_records, dtype=jnp.int32)
    state, outs = jax.lax.scan(record, state, starts)
    return state, outs
