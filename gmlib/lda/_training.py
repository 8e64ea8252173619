r"""Training the head θ: population gradient descent and online SGD (paper §3.3, Figures 1, 4, 5).

Both go through :func:`gmlib.optimize`. The problem travels as data inside
``jax.tree_util.Partial`` objects whose functions compare by value (frozen dataclasses
holding the static sizes), so calls that differ only in the problem or the start point
share one compilation (keep the ``optimizer`` object to share it across calls too).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.tree_util import Partial

from gmlib import _checks as C
from gmlib._loop import TrainResult, optimize
from gmlib.lda._problem import _cast, _check_theta, _sample
from gmlib.lda._risk import DEFAULT_NODES, _predict, _risk_jit


@dataclass(frozen=True)
class _Risk:
    """``risk(problem, theta)`` with ``n_nodes`` nodes: the loss of gradient descent and the recorded metric."""

    n_nodes: int

    def __call__(self, problem, theta):
        return _risk_jit(problem, theta, self.n_nodes)


@dataclass(frozen=True)
class _Draw:
    """``batch_size`` fresh pairs (x, y) of ``problem``."""

    batch_size: int

    def __call__(self, problem, key):
        return _sample(problem, key, self.batch_size)


def _logistic_loss(problem, theta, batch):
    x, y = batch
    return jnp.mean(jax.nn.softplus(-y * _predict(problem, theta, x)))


def gradient_descent(problem, theta0, optimizer, *, n_steps: int, record_every: int = 1,
                     n_nodes: int = DEFAULT_NODES, chunk_records: int | None = None,
                     progress: bool = False) -> TrainResult:
    r"""Population gradient descent on :func:`risk`: :math:`\theta_{t+1} = \theta_t - \eta\,\nabla\mathcal R(\theta_t)`.

    The exact population gradient (:func:`risk`) fed to an optax optimizer
    (``optax.sgd(eta)`` is plain gradient descent, the discretized gradient flow of
    Thms 3.5–3.6 and Figure 1), through :func:`gmlib.optimize`. The risk and the
    parameters are recorded every ``record_every`` steps and at step 0. Calls that differ
    only in ``problem`` or ``theta0`` (same shapes and dtype, the same ``optimizer``
    object) share one compilation.

    Args:
        problem: an :class:`LDAProblem`.
        theta0: the initial :class:`HeadParams`.
        optimizer: an ``optax.GradientTransformation``.
        n_steps: number of steps, a multiple of ``record_every``.
        record_every: steps between two records.
        n_nodes: quadrature points (see :func:`risk`).
        chunk_records: records per compiled chunk (default: all at once, or about
            twenty chunks with ``progress``).
        progress: show a tqdm bar.

    Returns:
        a :class:`gmlib.TrainResult` with ``n_steps // record_every + 1`` records:
        ``metric`` holds the population risk, ``trajectory`` the :class:`HeadParams`.

    Raises:
        ValueError: naming the argument, for bad shapes or non-positive counts.

    Example:
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> theta0 = lda.HeadParams.normal(2, key=jax.random.key(0))
        >>> out = lda.gradient_descent(c1, theta0, optax.sgd(0.1), n_steps=200, record_every=100)
        >>> out.metric.shape, bool(out.metric[-1] < out.metric[0])  # the risk at steps 0, 100, 200
        ((3,), True)
    """
    problem, theta0 = _cast(problem, _check_theta(problem, theta0, "theta0"))
    risk = Partial(_Risk(C.scalar(n_nodes, "n_nodes", low=0, integer=True)), problem)
    return optimize(risk, theta0, optimizer, n_steps=n_steps, record_every=record_every, metric=risk,
                    trajectory=True, chunk_records=chunk_records, progress=progress, desc="gradient descent")


def sgd(problem, theta0, optimizer, *, key, n_steps: int, batch_size: int = 1, record_every: int = 1,
        n_nodes: int = DEFAULT_NODES, chunk_records: int | None = None, progress: bool = False) -> TrainResult:
    r"""Stochastic gradient descent on fresh minibatches of :math:`(X, Y)` (online SGD, Figures 4–5).

    At step t, ``batch_size`` new pairs are drawn from ``problem`` with the key
    ``fold_in(key, t)`` and the optimizer gets the gradient of their mean logistic loss
    :math:`\frac1B\sum_i \log(1 + e^{-y_i f_\theta(x_i)})`, an unbiased estimate of
    :math:`\nabla\mathcal R(\theta)`. The *population* risk is recorded by quadrature
    (:func:`risk`) every ``record_every`` steps and at step 0, as in
    :func:`gradient_descent` (and with the same sharing of compilations).

    Args:
        problem: an :class:`LDAProblem`.
        theta0: the initial :class:`HeadParams`.
        optimizer: an ``optax.GradientTransformation`` (``optax.sgd(1e-2)`` in the paper).
        key: a ``jax.random`` key (the only source of randomness).
        n_steps: number of steps, a multiple of ``record_every``.
        batch_size: pairs per step (1: the online SGD of the paper).
        record_every, n_nodes, chunk_records, progress: as in :func:`gradient_descent`.

    Returns:
        a :class:`gmlib.TrainResult`, as :func:`gradient_descent`.

    Raises:
        ValueError: as :func:`gradient_descent`, and for a bad ``batch_size``.

    Example:
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> theta0 = lda.HeadParams.normal(2, key=jax.random.key(0))
        >>> out = lda.sgd(c1, theta0, optax.sgd(1e-2), key=jax.random.key(0), n_steps=1000, record_every=500)
        >>> out.metric.shape
        (3,)
    """
    problem, theta0 = _cast(problem, _check_theta(problem, theta0, "theta0"))
    draw = _Draw(C.scalar(batch_size, "batch_size", low=0, integer=True))
    risk = Partial(_Risk(C.scalar(n_nodes, "n_nodes", low=0, integer=True)), problem)
    return optimize(Partial(_logistic_loss, problem), theta0, optimizer, n_steps=n_steps, record_every=record_every,
                    sample=Partial(draw, problem), key=key, metric=risk, trajectory=True,
                    chunk_records=chunk_records, progress=progress, desc="SGD")
