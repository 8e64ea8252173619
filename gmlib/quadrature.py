r"""Expectations over Gaussian mixtures: Gauss–Hermite quadrature, Monte Carlo as the fallback.

For :math:`X \sim \sum_k \pi_k \mathcal N(m_k, \Gamma_k)` and a smooth function
:math:`\varphi` of a few linear projections :math:`A X` (A of k rows),

.. math::

    \mathbb E[\varphi(A X)] = \sum_k \pi_k\, \mathbb E\big[\varphi(A m_k + R_k \xi)\big],
    \qquad R_k R_k^\top = A \Gamma_k A^\top,\ \xi \sim \mathcal N(0, I_k),

and each k-dimensional Gaussian expectation is a tensor Gauss–Hermite rule.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib.mixture import GaussianMixture, psd_sqrt

__all__ = ["gauss_hermite", "mixture_expectation", "monte_carlo_expectation"]


def gauss_hermite(n_nodes: int, dim: int = 1, dtype=None):
    r"""Tensor Gauss–Hermite rule for the standard Gaussian :math:`\mathcal N(0, I_{\mathrm{dim}})`.

    :math:`\mathbb E[f(\xi)] \approx \sum_j w_j f(x_j)`, exact for polynomials of
    degree at most :math:`2\,n_{\mathrm{nodes}} - 1` in each coordinate. Nodes come from
    ``numpy.polynomial.hermite_e.hermegauss`` (probabilists' Hermite polynomials).

    Args:
        n_nodes: nodes per coordinate, a positive int.
        dim: dimension, a positive int (the rule has ``n_nodes ** dim`` points).
        dtype: floating dtype of the result (default: JAX's default float).

    Returns:
        ``(nodes, weights)``: shapes (n_nodes**dim, dim) and (n_nodes**dim,),
        the weights positive and summing to one.
    """
    n_nodes = C.check_positive_int(n_nodes, "n_nodes")
    dim = C.check_positive_int(dim, "dim")
    if n_nodes**dim > 10**7:
        raise ValueError(f"`n_nodes` ** `dim` = {n_nodes}**{dim} points is too many (at most 1e7)")
    x, w = np.polynomial.hermite_e.hermegauss(n_nodes)
    w = w / w.sum()
    nodes = np.array(list(itertools.product(x, repeat=dim))).reshape(-1, dim)
    weights = np.prod(np.array(list(itertools.product(w, repeat=dim))).reshape(-1, dim), axis=1)
    dtype = dtype or C.common_float_dtype()
    return jnp.asarray(nodes, dtype), jnp.asarray(weights, dtype)


def _check_projection(mixture, projection):
    if not isinstance(mixture, GaussianMixture):
        raise ValueError(f"`mixture` must be a GaussianMixture; got {type(mixture).__name__}")
    if projection is None:
        return jnp.eye(mixture.dim, dtype=mixture.dtype)
    A = C.as_float_array(projection, "projection", mixture.dtype)
    C.check_shape(A, "projection", (None, mixture.dim), f"(k, D) with D = {mixture.dim}")
    C.check_finite(A, "projection")
    return A


def mixture_expectation(mixture, fn, projection=None, n_nodes: int = 20):
    r""":math:`\mathbb E[\varphi(A X)]` for :math:`X` drawn from ``mixture``, by Gauss–Hermite per component.

    Let :math:`\varphi` denote ``fn`` and :math:`A` denote ``projection`` (k, D);
    the formula is in the module docstring. Exact for polynomials of degree
    :math:`\le 2\,n_{\mathrm{nodes}}-1`, and spectrally accurate for smooth
    :math:`\varphi`. Differentiable in the parameters ``fn`` closes over. The
    square root of :math:`A\Gamma_k A^\top` is taken by an eigendecomposition, so
    derivatives *with respect to* ``projection`` or the covariances are not smooth
    where that matrix is singular (see PITFALLS: integrate over X itself there).

    Args:
        mixture: a :class:`GaussianMixture` on :math:`\mathbb R^D`.
        fn: a JAX-traceable callable mapping points (N, k) to values (N, ...).
        projection: ``None`` (integrate over X itself, k = D) or an array (k, D).
        n_nodes: nodes per coordinate (the rule has ``n_nodes ** k`` points per component).

    Returns:
        array of shape ``fn``'s trailing shape: the expectation.

    Example:
        >>> mixture_expectation(mix, lambda y: y[:, 0] ** 2)  # E[X_1^2]
    """
    A = _check_projection(mixture, projection)
    nodes, weights = gauss_hermite(n_nodes, A.shape[0], mixture.dtype)
    centers = mixture.means @ A.T  # (M, k)
    roots = psd_sqrt(A @ mixture.covs @ A.T)  # (M, k, k)
    points = centers[:, None, :] + jnp.einsum("kij,nj->kni", roots, nodes)  # (M, N, k)
    m, n = points.shape[:2]
    values = fn(points.reshape(m * n, -1))
    values = values.reshape((m, n) + values.shape[1:])
    per_component = jnp.tensordot(weights, values, axes=(0, 1))  # (M, ...)
    return jnp.tensordot(mixture.weights, per_component, axes=1)


def monte_carlo_expectation(mixture, fn, key, n_samples: int, projection=None):
    r"""Monte Carlo estimate of :math:`\mathbb E[\varphi(A X)]` with its standard error.

    The fallback when quadrature does not fit (many projections). Same arguments
    as :func:`mixture_expectation`, plus a ``jax.random`` key and the sample size.

    Returns:
        ``(mean, stderr)``: the sample mean and :math:`\hat\sigma/\sqrt{n}`, both of
        ``fn``'s trailing shape.
    """
    A = _check_projection(mixture, projection)
    n_samples = C.check_positive_int(n_samples, "n_samples")
    if n_samples < 2:
        raise ValueError("`n_samples` must be at least 2 to estimate a standard error")
    x, _ = mixture.sample(key, n_samples)
    values = fn(x @ A.T)
    return values.mean(axis=0), values.std(axis=0, ddof=1) / jnp.sqrt(jnp.asarray(n_samples, values.dtype))
