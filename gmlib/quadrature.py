r"""Expectations over Gaussian mixtures: Gauss–Hermite quadrature, Monte Carlo as the fallback.

For :math:`X \sim \sum_k \pi_k \mathcal N(m_k, \Gamma_k)` and a smooth function
:math:`\varphi` of a few linear projections :math:`A X` (A of k rows),

.. math::

    \mathbb E[\varphi(A X)] = \sum_k \pi_k\, \mathbb E\big[\varphi(A m_k + R_k \xi)\big],
    \qquad R_k R_k^\top = A \Gamma_k A^\top,\ \xi \sim \mathcal N(0, I_k),

and each k-dimensional Gaussian expectation is a tensor Gauss–Hermite rule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib.mixture import _psd_sqrt

__all__ = ["gauss_hermite", "mixture_expectation", "monte_carlo_expectation"]


def gauss_hermite(*, n_nodes: int, dim: int = 1, dtype=None):
    r"""Tensor Gauss–Hermite rule for the standard Gaussian :math:`\mathcal N(0, I_{\mathrm{dim}})`.

    :math:`\mathbb E[f(\xi)] \approx \sum_j w_j f(x_j)`, exact for polynomials of
    degree at most :math:`2\,n_{\mathrm{nodes}} - 1` in each coordinate. Nodes come from
    ``numpy.polynomial.hermite_e.hermegauss`` (probabilists' Hermite polynomials).

    **Numerical limits.** At most 256 nodes per coordinate (numpy's weights overflow
    beyond about 370 nodes) and 1e7 points in all. In float32 the smallest weights of a
    large rule underflow to 0 (harmless: their nodes are far in the tails).

    Args:
        n_nodes: nodes per coordinate, a positive int.
        dim: dimension, a positive int (the rule has ``n_nodes ** dim`` points).
        dtype: floating dtype of the result (default: JAX's default float).

    Returns:
        ``(nodes, weights)``: shapes (n_nodes**dim, dim) and (n_nodes**dim,),
        the weights positive and summing to one.

    Raises:
        ValueError: naming ``n_nodes`` or ``dim`` when not a positive int (or above the
            limits below), ``dtype`` when not a floating dtype.

    Example:
        >>> nodes, weights = gauss_hermite(n_nodes=20, dim=2)  # 400 points
    """
    n_nodes = C.scalar(n_nodes, "n_nodes", low=1, high=_MAX_NODES, strict=False, integer=True)
    dim = C.scalar(dim, "dim", low=0, integer=True)
    dtype = C.check_float_dtype(dtype, "dtype")
    if n_nodes**dim > 10**7:
        raise ValueError(f"`n_nodes` ** `dim` = {n_nodes}**{dim} points is too many (at most 1e7)")
    x, w = np.polynomial.hermite_e.hermegauss(n_nodes)
    w = w / w.sum()
    grids = np.meshgrid(*([x] * dim), indexing="ij")  # the order of itertools.product
    nodes = np.stack([g.reshape(-1) for g in grids], axis=-1)
    weights = np.prod(np.stack([g.reshape(-1) for g in np.meshgrid(*([w] * dim), indexing="ij")], axis=-1), axis=1)
    return jnp.asarray(nodes, dtype), jnp.asarray(weights, dtype)


#: The largest ``n_nodes`` :func:`gauss_hermite` accepts (numpy's rule is finite and accurate up to it;
#: its weights overflow beyond about 370 nodes).
_MAX_NODES = 256


def _check_projection(mixture, projection):
    if projection is None:
        return jnp.eye(mixture.dim, dtype=mixture.dtype)
    return C.array(projection, "projection", (None, mixture.dim), dtype=mixture.dtype,
                   desc=f"(k, D) with D = {mixture.dim}", min_rows=1)


def _values(fn, points, dtype):
    """``fn(points)`` as a floating array whose leading axis indexes the points."""
    values = jnp.asarray(fn(points))
    if values.ndim == 0 or values.shape[0] != points.shape[0]:
        raise ValueError(f"`fn` must map points of shape (N, k) = {tuple(points.shape)} to values of shape "
                         f"(N, ...) with N = {points.shape[0]}; got shape {tuple(values.shape)}")
    if not jnp.issubdtype(values.dtype, jnp.floating):  # indicators, counts: averaged as floats
        values = values.astype(dtype)
    return values


def mixture_expectation(mixture, fn, projection=None, *, n_nodes: int = 20):
    r""":math:`\mathbb E[\varphi(A X)]` for :math:`X` drawn from ``mixture``, by Gauss–Hermite per component.

    Let :math:`\varphi` denote ``fn`` and :math:`A` denote ``projection`` (k, D);
    the formula is in the module docstring. Exact for polynomials of degree
    :math:`\le 2\,n_{\mathrm{nodes}}-1`, and spectrally accurate for smooth
    :math:`\varphi`. Differentiable in the parameters ``fn`` closes over, and in the
    mixture and ``projection``: the square root of :math:`A\Gamma_k A^\top` is
    :func:`~gmlib.psd_sqrt`, whose derivatives are exact wherever that matrix is positive
    definite, repeated eigenvalues included (:math:`\Gamma_k = \sigma^2 I`). Where it is
    singular (a rank-deficient ``projection``, a singular covariance) the derivative of
    the square root is infinite and the result's derivatives are not reliable: integrate
    over X itself there (``projection=None``) or use Stein's lemma.

    **Numerical limits.** Round-off is a few :math:`\varepsilon` relative; the error is
    otherwise the quadrature's truncation, of order 1e-6 with 20 nodes on a smooth
    two-dimensional integrand (see "Precision and numerical limits"). Raise ``n_nodes``
    for integrands that vary on scales smaller than the components' spread, and use
    :func:`monte_carlo_expectation` beyond three or four projections.

    Args:
        mixture: a :class:`GaussianMixture` on :math:`\mathbb R^D`.
        fn: a JAX-traceable callable mapping points (N, k) to values (N, ...).
        projection: ``None`` (integrate over X itself, k = D) or an array (k, D).
        n_nodes: nodes per coordinate (the rule has ``n_nodes ** k`` points per component).

    Returns:
        array of shape ``fn``'s trailing shape: the expectation.

    Raises:
        ValueError: naming ``projection`` (wrong shape, no rows, non-finite), ``fn``
            (its values do not have the points as leading axis) or ``n_nodes``.

    Example:
        >>> mixture_expectation(mix, lambda y: y[:, 0] ** 2)  # E[X_1^2]
    """
    A = _check_projection(mixture, projection)
    nodes, weights = gauss_hermite(n_nodes=n_nodes, dim=A.shape[0], dtype=mixture.dtype)
    centers = mixture.means @ A.T  # (M, k)
    roots = _psd_sqrt(A @ mixture.covs @ A.T)  # (M, k, k)
    points = centers[:, None, :] + jnp.einsum("kij,nj->kni", roots, nodes)  # (M, N, k)
    m, n = points.shape[:2]
    values = _values(fn, points.reshape(m * n, -1), mixture.dtype)
    weights = weights.astype(values.dtype)
    values = values.reshape((m, n) + values.shape[1:])
    per_component = jnp.tensordot(weights, values, axes=(0, 1))  # (M, ...)
    return jnp.tensordot(mixture.weights.astype(values.dtype), per_component, axes=1)


def monte_carlo_expectation(mixture, fn, projection=None, *, key, n_samples: int):
    r"""Monte Carlo estimate of :math:`\mathbb E[\varphi(A X)]` with its standard error.

    The fallback when quadrature does not fit (many projections). Same arguments
    as :func:`mixture_expectation`, plus a ``jax.random`` key and the sample size
    (both keyword-only).

    **Numerical limits.** The error is statistical: within a few ``stderr`` with high
    probability when :math:`\varphi(AX)` has a finite variance. Non-floating values (an
    indicator) are averaged as floats of the mixture's dtype.

    Returns:
        ``(mean, stderr)``: the sample mean and :math:`\hat\sigma/\sqrt{n}`, both of
        ``fn``'s trailing shape.

    Raises:
        ValueError: as :func:`mixture_expectation`, and naming ``key`` (not one
            ``jax.random`` key) or ``n_samples`` (not an int >= 2).

    Example:
        >>> mean, stderr = monte_carlo_expectation(mix, lambda y: y[:, 0] ** 2, key=key, n_samples=10**5)
    """
    A = _check_projection(mixture, projection)
    n_samples = C.scalar(n_samples, "n_samples", low=2, strict=False, integer=True)
    x, _ = mixture.sample(key=key, n_samples=n_samples)
    values = _values(fn, x @ A.T, mixture.dtype)
    return values.mean(axis=0), values.std(axis=0, ddof=1) / jnp.sqrt(jnp.asarray(n_samples, values.dtype))


# ----------------------------------------------------------------------------- a rule for sharp one-dimensional gates


def _trapezoid(n_points: int, dtype, *, half_width: float = 12.0):
    r"""The trapezoid rule for :math:`\mathbb E[\varphi(\xi)]`, :math:`\xi \sim \mathcal N(0, 1)`.

    ``n_points`` equally spaced nodes :math:`x_j` on [−``half_width``, ``half_width``] with
    weights :math:`w_j \propto e^{-x_j^2/2}` normalised to sum to one, so that
    :math:`\mathbb E[\varphi(\xi)] \approx \sum_j w_j \varphi(x_j)`. For an analytic
    integrand it converges geometrically in ``n_points`` (where Gauss–Hermite struggles with
    a sharp logistic gate): :meth:`gmlib.denoise.DenoisingProblem.bayes_risk` (M = 2) uses it.
    The caller checks ``n_points`` (a positive int).

    Returns:
        ``(nodes, weights)``: arrays (n_points, 1) and (n_points,) of ``dtype``, in the
        layout of :func:`gauss_hermite` with ``dim=1``.
    """
    x = np.linspace(-half_width, half_width, n_points)
    w = np.exp(-0.5 * x**2)
    return jnp.asarray(x[:, None], dtype), jnp.asarray(w / w.sum(), dtype)
