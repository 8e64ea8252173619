r"""The Bayes-optimal in-context LDA classifier: the posterior log-odds given a labelled prompt (the book's).

In the tasks of :func:`gmlib.lda.task_sampler` the two class means are independent and
uniform on a sphere, so given the prompt's labels each has a von Mises–Fisher posterior and
the predictive log-odds of a query is a difference of log normalising constants of that
family, ``log_sphere_integral``. Not in the paper: the book's reference for what any
predictor can make of L labelled tokens, beside the plug-in :func:`gmlib.lda.plug_in`.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib._dtypes import common_float_dtype

__all__ = ["in_context_bayes"]

#: Gauss–Legendre nodes of ``log_sphere_integral`` (enough for every d and kappa; see its docstring).
_N_NODES = 64


def in_context_bayes(prompt, queries, mask=None, *, radius=1.5):
    r"""The Bayes-optimal in-context LDA score: the posterior log-odds of a query's label given the prompt.

    Let :math:`(x_i, y_i)` denote the rows of ``prompt`` (the label last; those ``mask``
    keeps), labelled draws of one task of :func:`gmlib.lda.task_sampler` (class means
    :math:`m_1, m_{-1}` independent and uniform on the sphere of radius r = ``radius`` in
    :math:`\mathbb R^d`, classes equally likely, :math:`X \mid Y = c \sim \mathcal N(m_c, I_d)`),
    and :math:`(x, 0)` a row of ``queries``. Given the labels the means are independent with
    :math:`p(m_c \mid \text{prompt}) \propto e^{m_c^\top S_c}` on the sphere,
    :math:`S_c = \sum_{i:\, y_i = c} x_i` (the factors :math:`e^{-\|m_c\|^2/2}` are constant
    there), so :math:`P(y \mid x, \text{prompt}) \propto \int e^{m_y^\top (S_y + x)}\, dm_y
    / \int e^{m_y^\top S_y}\, dm_y` and the score is

    .. math::

        \begin{aligned}
        f^\star(x) &= \log\frac{P(y = 1 \mid x, \text{prompt})}{P(y = -1 \mid x, \text{prompt})}\\
        &= \log\frac{A(r\|S_1 + x\|)}{A(r\|S_1\|)} - \log\frac{A(r\|S_{-1} + x\|)}{A(r\|S_{-1}\|)},\\
        A(\kappa) &= \int_0^\pi e^{\kappa\cos t} \sin^{d-2} t\, dt
        \end{aligned}

    (``log_sphere_integral``; :math:`A(\kappa) \propto \kappa^{1 - d/2} I_{d/2-1}(\kappa)`).
    It minimises the logistic risk :math:`\mathbb E \log(1 + e^{-Y f})` over all predictors of
    the prompt and the query; with no tokens it is 0, and as L grows it tends to the task's
    Bayes score :math:`(m_1 - m_{-1})^\top x`. Tokens whose label is neither 1 nor −1 count
    for no class (as in :func:`gmlib.lda.plug_in`).

    Args:
        prompt: labelled tokens, shape (L, d+1), the label last, L ≥ 0.
        queries: shape (Q, d+1) (the last coordinate is not read).
        mask: ``None`` or booleans (L,): the tokens that count.
        radius: r > 0, the norm of the class means (:func:`gmlib.lda.task_sampler`'s).

    Returns:
        array (Q, 1): the log-odds, in the dtype of ``prompt`` and ``queries``. Traceable
        (a predictor ``f(prompt, queries, mask)`` for :func:`gmlib.lda.task_metrics` with
        ``functools.partial`` for ``radius``).

    Raises:
        ValueError: naming ``prompt`` or ``queries`` (shape, finiteness), ``mask`` (not
            booleans of shape (L,)) or ``radius`` (not a number > 0).

    Example:
        >>> from functools import partial
        >>> tests = lda.task_sampler(2, n_queries=8)(jax.random.key(0), 64, 64)
        >>> risk, acc = lda.task_metrics(partial(lda.in_context_bayes, radius=1.5), tests, lengths=[16, 64])
        >>> risk.shape
        (2, 64)
        >>> float(lda.in_context_bayes(jnp.zeros((0, 3)), jnp.ones((1, 3)))[0, 0])  # no tokens: even odds
        0.0
    """
    prompt = C.array(prompt, "prompt", ("L", "D"))
    width = prompt.shape[1]
    if width < 2:
        raise ValueError(f"`prompt` must have shape (L, d+1) with d >= 1; got {tuple(prompt.shape)}")
    queries = C.array(queries, "queries", ("Q", "D"), dims={"D": width})
    dtype = common_float_dtype(prompt, queries)
    prompt, queries = prompt.astype(dtype), queries.astype(dtype)
    if mask is None:
        keep = jnp.ones(prompt.shape[0], bool)
    else:
        m = mask if isinstance(mask, jax.Array) else np.asarray(mask)
        if m.dtype != bool or m.shape != (prompt.shape[0],):
            raise ValueError(f"`mask` must be booleans of shape (L,) = ({prompt.shape[0]},); got dtype "
                             f"{m.dtype}, shape {tuple(m.shape)}")
        keep = jnp.asarray(m)
    radius = jnp.asarray(C.scalar(radius, "radius", low=0), dtype)
    return _log_odds(prompt, queries, keep, radius)


@jax.jit
def _log_odds(prompt, queries, keep, r):
    x, y = prompt[:, :-1], prompt[:, -1]
    q = queries[:, :-1]
    d = x.shape[1]

    def gain(c):  # log A(r|S + x|) - log A(r|S|) for each query
        w = (keep & (y == c)).astype(x.dtype)
        total = w @ x
        norm, moved = jnp.linalg.norm(total), jnp.linalg.norm(total + q, axis=-1)
        # r(|S + x| - |S|), without the cancellation of two large norms
        step = r * (2 * q @ total + jnp.sum(q**2, -1)) / jnp.maximum(moved + norm, jnp.finfo(x.dtype).tiny)
        return step + _log_a_scaled(r * moved, d) - _log_a_scaled(r * norm, d)

    return (gain(1) - gain(-1))[:, None]


def log_sphere_integral(kappa, dim: int):
    r"""The log of :math:`A(\kappa) = \int_0^\pi e^{\kappa \cos t} \sin^{d-2} t\, dt`, stable for any κ ≥ 0.

    Let :math:`\kappa` denote ``kappa`` and d ``dim``. :math:`A` is the integral of
    :math:`e^{\kappa u^\top e}` over the unit sphere of :math:`\mathbb R^d` divided by the
    area of :math:`S^{d-2}`: the von Mises–Fisher normalising constant,

    .. math::

        A(\kappa) = \sqrt\pi\, \Gamma\big(\tfrac{d-1}2\big) \big(\tfrac2\kappa\big)^{d/2-1} I_{d/2-1}(\kappa),
        \qquad A(0) = B\big(\tfrac12, \tfrac{d-1}2\big)

    (:math:`\pi I_0(\kappa)` in d = 2, :math:`2\sinh(\kappa)/\kappa` in d = 3). Computed as
    :math:`\kappa + \log \int_0^T e^{-2\kappa\sin^2(t/2)} \sin^{d-2}t\, dt` by 64-node
    Gauss–Legendre with a log-sum-exp, on :math:`T = \min(\pi, (\sqrt d + 25)/\sqrt\kappa)`,
    which holds the peak of width :math:`1/\sqrt\kappa` at t = 0 (beyond T the integrand
    is below :math:`e^{-2\kappa T^2/\pi^2} \le e^{-(\sqrt d + 25)^2/5}`, negligible): the
    value agrees with ``scipy.special.ive`` to 1e-13 relative in float64 and 3e-7 in
    float32 for d from 2 to 50 and κ from 0 to 1e6 (the tests check d = 2, 3, 5, 10).

    Args:
        kappa: κ ≥ 0, an array of any shape.
        dim: d ≥ 2, a static int.

    Returns:
        array of ``kappa``'s shape and (floating) dtype.

    Example:
        >>> from gmlib.lda._optimum import log_sphere_integral
        >>> round(float(log_sphere_integral(jnp.asarray(0.0), 3)), 6)  # log B(1/2, 1) = log 2
        0.693147
    """
    kappa = jnp.asarray(kappa)
    kappa = kappa.astype(common_float_dtype(kappa))
    return kappa + _log_a_scaled(kappa, int(dim))


@partial(jax.jit, static_argnums=1)
def _log_a_scaled(kappa, d):
    r"""log A(kappa) - kappa: see ``log_sphere_integral``."""
    dt = kappa.dtype
    x, w = (jnp.asarray(v, dt) for v in np.polynomial.legendre.leggauss(_N_NODES))
    safe = jnp.maximum(kappa, jnp.finfo(dt).tiny)
    top = jnp.minimum(jnp.asarray(math.pi, dt), (math.sqrt(d) + 25) / jnp.sqrt(safe))[..., None]
    t = 0.5 * top * (1 + x)
    logs = -2 * kappa[..., None] * jnp.sin(0.5 * t) ** 2 + jnp.log(0.5 * top * w)
    if d != 2:
        logs = logs + (d - 2) * jnp.log(jnp.sin(t))
    return jax.nn.logsumexp(logs, axis=-1)
