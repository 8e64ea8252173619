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
        >>> nodes.shape, round(float(weights.sum()), 12), round(float(weights @ nodes[:, 0] ** 2), 12)
        ((400, 2), 1.0, 1.0)
    """
    n_nodes = C.scalar(n_nodes, "n_nodes", low=1, high=_MAX_NODES, strict=False, integer=True)
    dim = C.scalar(dim, "dim", low=0, integer=True)
    dtype = C.check_float_dtype(dtype)
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
    return C.array(projection, "projection", ("k", "D"), dims={"D": mixture.dim}, dtype=mixture.dtype, min_rows=1)


def _values(fn, points, dtype):
    """``fn(points)`` as a floating array whose leading axis indexes the points."""
    values = jnp.asarray(fn(points))
    if values.ndim == 0 or values.shape[0] != points.shape[0]:
        raise ValueError(f"`fn` must map points (N, k) = {tuple(points.shape)} to values (N, ...); got {values.shape}")
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
        >>> mix = gmlib.GaussianMixture.isotropic([0.5, 0.5], [[-1.0, 0.0], [1.0, 0.0]], 0.3)
        >>> round(float(mixture_expectation(mix, lambda y: y[:, 0] ** 2)), 10)  # E[X_1^2] = 1 + 0.3^2
        1.09
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
        >>> mix = gmlib.GaussianMixture.isotropic([0.5, 0.5], [[-1.0, 0.0], [1.0, 0.0]], 0.3)
        >>> mean, stderr = monte_carlo_expectation(mix, lambda y: y[:, 0] ** 2, key=jax.random.key(0),
        ...                                        n_samples=10**5)
        >>> bool(abs(mean - 1.09) < 4 * stderr), bool(stderr < 0.01)
        (True, True)
    """
    A = _check_projection(mixture, projection)
    n_samples = C.scalar(n_samples, "n_samples", low=2, strict=False, integer=True)
    x, _ = mixture.sample(key=key, n_samples=n_samples)
    values = _values(fn, x @ A.T, mixture.dtype)
    return values.mean(axis=0), values.std(axis=0, ddof=1) / jnp.sqrt(jnp.asarray(n_samples, values.dtype))


# ----------------------------------------------------------------------------- a gated two-dimensional rule
# The quadrature of :func:`gmlib.lda.risk`: E[phi(Y; p)] for Y ~ N(mu, C) in R^2 where phi has a
# sigmoid gate sigma(s0 + y2), however steep, and a softplus kink where y1 + b + r sigma(s0 + y2) = 0,
# with derivatives of every order that stay smooth where C is singular (Stein's identity).

#: The rules cover |xi| <= _TAIL standard deviations (the Gaussian mass beyond is about 2e-19).
_TAIL = 9.0
#: The spacing of the rules far from a transition, in standard deviations, per unit of u.
_FAR = 2.0


def _graded_rule(center, width, n: int):
    r"""A rule for :math:`\mathbb E[g(\xi)]`, :math:`\xi \sim \mathcal N(0, 1)`, that resolves a transition.

    ``g`` may change over a length ``width`` around ``center`` (a sigmoid's step, a
    softplus's kink). The midpoint rule of ``n`` points in :math:`u` under the map
    :math:`\xi = c + \lambda\,\mathrm{asinh}\big(\tfrac{h}{\lambda}\sinh u\big)` with
    :math:`h = \min(\mathrm{width}, \lambda)`, :math:`\lambda = 2`: the nodes are
    :math:`h`-spaced (times the step in u) at the transition and :math:`\lambda`-spaced far
    from it, over :math:`|\xi| \le 9`; the weights are the Gaussian density times the
    map's derivative, normalised to sum to one. The integrand is analytic in a strip
    of the u-plane, so the error decays exponentially in ``n``. Broadcasts over
    ``center`` and ``width``; returns nodes and weights with a trailing axis of ``n``.
    """
    h = jnp.minimum(width, _FAR)[..., None]
    k = h / _FAR
    c = jnp.clip(center, -_TAIL, _TAIL)[..., None]
    lo = jnp.arcsinh(jnp.sinh((-_TAIL - c) / _FAR) / k)
    hi = jnp.arcsinh(jnp.sinh((_TAIL - c) / _FAR) / k)
    u = lo + (hi - lo) * (jnp.arange(n, dtype=c.dtype) + 0.5) / n
    ksinh = k * jnp.sinh(u)
    x = c + _FAR * jnp.arcsinh(ksinh)
    w = jnp.exp(-0.5 * x**2) * jnp.cosh(u) / jnp.sqrt(1 + ksinh**2)
    return x, w / w.sum(-1, keepdims=True)


def _gated_rule(mu, cov, p, n_nodes: int):
    r"""Points (N, 2) and weights (N,) for :math:`\mathbb E[\varphi(Y)]`, :math:`Y \sim \mathcal N(\mu, C)`.

    With ``p`` = (b, r, s0, ...): the gate :math:`\sigma(s_0 + y_2)` steps at :math:`y_2 = -s_0`
    over a length 1, the softplus kinks where :math:`y_1 + b + r\sigma(s_0 + y_2) = 0`. Write
    :math:`y_2 = \mu_2 + \sigma_2\xi_2` and, given it, :math:`y_1 = \mu_1 + a\xi_2 + e\xi_1`
    (:math:`a = C_{12}/\sigma_2`, :math:`e^2 = C_{11} - a^2`, the conditional law); integrate
    :math:`\xi_2` with ``n_nodes`` points graded at the gate's step (width
    :math:`1/\sigma_2`) and, at each of them, :math:`\xi_1` with ``n_nodes // 2`` points
    graded at the kink (width :math:`1/e`). Rank-deficient C (:math:`\sigma_2 = 0` or
    :math:`e = 0`) needs no special case: the rule along a null direction is any rule.
    """
    b, r, s0 = p[0], p[1], p[2]
    sd2 = jnp.sqrt(jnp.maximum(cov[1, 1], 0.0))
    pos2 = sd2 > 0
    safe2 = jnp.where(pos2, sd2, 1.0)
    a = jnp.where(pos2, cov[0, 1] / safe2, 0.0)
    e = jnp.sqrt(jnp.maximum(cov[0, 0] - a**2, 0.0))
    pos1 = e > 0
    safe1 = jnp.where(pos1, e, 1.0)
    big = jnp.asarray(2 * _TAIL, mu.dtype)  # a transition this far out: no grading needed
    x2, w2 = _graded_rule(jnp.where(pos2, (-s0 - mu[1]) / safe2, 0.0), jnp.where(pos2, 1 / safe2, big), n_nodes)
    y2 = mu[1] + sd2 * x2
    offset = mu[0] + a * x2 + b + r * jax.nn.sigmoid(s0 + y2)  # y1 - e xi1 + b + r sigma: the kink at -offset / e
    x1, w1 = _graded_rule(jnp.where(pos1, -offset / safe1, 0.0), jnp.where(pos1, 1 / safe1, big), max(n_nodes // 2, 1))
    y1 = (mu[0] + a * x2)[:, None] + e * x1
    points = jnp.stack([y1, jnp.broadcast_to(y2[:, None], y1.shape)], axis=-1).reshape(-1, 2)
    return points, (w2[:, None] * w1).reshape(-1)


def _gated_expectation(fn, n_nodes, mu, cov, p):
    r""":math:`\mathbb E[\varphi(Y; p)]`, :math:`Y \sim \mathcal N(\mu, C)` in :math:`\mathbb R^2`, by :func:`_gated_rule`.

    ``fn(y, p)`` maps points (N, 2) to a pytree of arrays with leading axis N. The
    rule's nodes depend on :math:`(\mu, C, p)` through square roots and divisions that
    are singular where C is; the derivatives are therefore not taken through the rule
    but given by the heat-equation (Stein) identity

    .. math::

        d\,\mathbb E[\varphi] = \mathbb E[\nabla_y\varphi]\cdot d\mu
            + \tfrac12 \langle \mathbb E[\nabla_y^2\varphi], dC\rangle
            + \mathbb E[\nabla_p \varphi]\cdot dp,

    whose right side is again such an expectation (of derivatives of
    :math:`\varphi`, with the same transitions), computed by this same function:
    derivatives of every order are smooth in :math:`(\mu, C)`, including at singular C.
    """
    points, weights = _gated_rule(mu, cov, p, n_nodes)
    return jax.tree.map(lambda v: jnp.tensordot(weights, v, axes=1), fn(points, p))


_gated_expectation = jax.custom_jvp(_gated_expectation, nondiff_argnums=(0, 1))


def _pointwise_derivatives(fn):
    """The pointwise (gradient, Hessian) in y and gradient in p of ``fn``, as a new ``fn``."""

    def point(y, p):
        return fn(y[None, :], p)

    def dfn(y, p):
        gy = jax.vmap(jax.jacfwd(point, 0), (0, None))(y, p)
        hy = jax.vmap(jax.jacfwd(jax.jacfwd(point, 0), 0), (0, None))(y, p)
        gp = jax.vmap(jax.jacfwd(point, 1), (0, None))(y, p)
        drop = lambda t: jax.tree.map(lambda a: a[:, 0], t)  # noqa: E731  (point adds an axis of size 1)
        return drop(gy), drop(hy), drop(gp)

    return dfn


@_gated_expectation.defjvp
def _gated_expectation_jvp(fn, n_nodes, primals, tangents):
    mu, cov, p = primals
    dmu, dcov, dp = tangents
    value = _gated_expectation(fn, n_nodes, mu, cov, p)
    gy, hy, gp = _gated_expectation(_pointwise_derivatives(fn), n_nodes, mu, cov, p)
    # The tangent is an explicit contraction of primal coefficients with the tangents:
    # linear (so reverse mode can transpose it) and never differentiated through the rule.
    tangent = jax.tree.map(
        lambda a, h, g: a @ dmu + 0.5 * jnp.tensordot(h, dcov, axes=2) + g @ dp, gy, hy, gp
    )
    return value, tangent


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
