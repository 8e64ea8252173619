r"""The denoising problem of Section 4 of the paper: :class:`DenoisingProblem`.

The model (eq 9): :math:`X \sim \sum_k \pi_k \mathcal N(m_k, \Gamma)` and
:math:`Z = X + \xi\varepsilon` with :math:`\varepsilon \sim \mathcal N(0, I_d)`
independent of :math:`X`; :math:`S = \Gamma + \xi^2 I_d` (:math:`s I_d` with
:math:`s = \gamma^2 + \xi^2` when :math:`\Gamma = \gamma^2 I_d`, the paper's setting). The
class holds the laws of :math:`X` and :math:`Z`, the posterior responsibilities, the Bayes
denoiser (eq 10), the excess risk :math:`\mathbb E\|f(Z) - f^\star(Z)\|^2` of any map and
the Bayes risk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib import _random
from gmlib._dtypes import common_float_dtype
from gmlib._pytree import unchecked, validated_pytree
from gmlib.mixture import GaussianMixture, psd_sqrt
from gmlib.quadrature import _trapezoid, gauss_hermite, mixture_expectation, monte_carlo_expectation

__all__ = ["DenoisingProblem"]

#: Gauss–Hermite nodes per coordinate used by default, by dimension of the integral.
_DEFAULT_NODES = {1: 200, 2: 80, 3: 40}


# ----------------------------------------------------------------------------- helpers


def _dtype_of(*args):
    """The widest floating dtype among the arguments that carry a dtype (Python scalars follow)."""
    typed = [a for a in args if hasattr(a, "dtype")]
    return common_float_dtype(*typed) if typed else common_float_dtype()


def _tol(dtype):
    """Relative tolerance for value checks (equal norms, gamma = xi, distinct means)."""
    return 1e-5 if jnp.finfo(dtype).bits <= 32 else 1e-9


# ----------------------------------------------------------------------------- the problem


@validated_pytree
@dataclass(frozen=True, eq=False)
class DenoisingProblem:
    r"""Denoising :math:`X \sim \sum_k \pi_k \mathcal N(m_k, \Gamma)` from :math:`Z = X + \xi\,\varepsilon`.

    Let :math:`\pi` denote ``weights`` (M,), :math:`m_k` the rows of ``means`` (M, d),
    :math:`\Gamma` the shared within-component covariance, given either as ``gamma``
    (:math:`\Gamma = \gamma^2 I_d`, the paper's setting; 0 allowed: point masses,
    Remark 4.2) or as ``cov`` (any (d, d) positive semi-definite matrix), and
    :math:`\xi` ``xi`` (the noise level); write :math:`S = \Gamma + \xi^2 I_d`. Any number
    of components and any means (the head constructions say what they need).
    A frozen JAX pytree: pass it through ``jit``, ``vmap`` and ``grad``. For a
    full-covariance problem the field ``gamma`` is ``None`` (and ``cov`` is ``None`` for
    an isotropic one).

    Args:
        weights: :math:`\pi`, shape (M,), positive, summing to one.
        means: :math:`m_k`, shape (M, d), pairwise distinct.
        gamma: :math:`\gamma \ge 0`, a scalar (isotropic :math:`\Gamma = \gamma^2 I_d`).
        xi: :math:`\xi > 0`, a scalar (required).
        cov: :math:`\Gamma`, shape (d, d), symmetric positive semi-definite (keyword only;
            exactly one of ``gamma`` and ``cov``).

    Raises:
        ValueError: naming the argument, for wrong shapes, non-finite values,
            non-positive weights or weights not summing to one, equal means,
            ``gamma < 0``, ``xi <= 0`` or missing, both or neither of ``gamma`` and ``cov``,
            and (as :class:`~gmlib.GaussianMixture`) a non-symmetric or indefinite ``cov``.

    Example:
        >>> prob = DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)
        >>> np.round(prob.bayes(jnp.zeros((1, 2))), 6).tolist()  # E[X | Z = 0]: 1/5 of the way to each mean
        [[1.2, 1.2]]
        >>> full = DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 1.0]], xi=2.0,
        ...                         cov=[[1.0, 0.5], [0.5, 2.0]])
        >>> full.isotropic, prob.isotropic
        (False, True)
    """

    weights: jax.Array
    means: jax.Array
    gamma: jax.Array | None
    xi: jax.Array
    cov: jax.Array | None = None

    def __init__(self, weights, means, gamma=None, xi=None, *, cov=None):
        if (gamma is None) == (cov is None):
            raise ValueError(f"give exactly one of `gamma` and `cov`; got {('neither', 'both')[cov is not None]}")
        dtype = _dtype_of(weights, means, xi, gamma if cov is None else cov)
        weights = C.array(weights, "weights", ("M",), dtype=dtype)
        m = weights.shape[0]
        means = C.array(means, "means", ("M", "d"), dims={"M": m}, dtype=dtype)
        d = means.shape[1]
        xi = C.array(xi, "xi", (), dtype=dtype, low=0)
        if cov is None:
            gamma = C.array(gamma, "gamma", (), dtype=dtype, low=0, strict=False)
        else:
            cov = C.array(cov, "cov", ("d", "d"), dims={"d": d}, dtype=dtype, psd=True)
        C.check_weights(weights, positive=True)  # every component present
        if C.is_concrete(means) and len(np.unique(np.asarray(means), axis=0)) < m:
            raise ValueError(f"`means` must be pairwise distinct; got equal rows in {np.asarray(means)}")
        for name, value in (("weights", weights), ("means", means), ("gamma", gamma), ("xi", xi), ("cov", cov)):
            object.__setattr__(self, name, value)

    def astype(self, dtype) -> DenoisingProblem:
        """The same problem with every parameter cast to ``dtype``."""
        return jax.tree_util.tree_map(lambda x: x.astype(dtype), self)

    @property
    def n_components(self) -> int:
        """M, the number of components."""
        return self.means.shape[0]

    @property
    def dim(self) -> int:
        """d, the dimension."""
        return self.means.shape[1]

    @property
    def dtype(self):
        """The floating dtype of the parameters."""
        return self.means.dtype

    @property
    def isotropic(self) -> bool:
        r"""Whether :math:`\Gamma = \gamma^2 I_d` (given as ``gamma``) rather than a full ``cov``."""
        return self.cov is None

    @property
    def s(self):
        r""":math:`s = \gamma^2 + \xi^2`, the variance of each noisy component (:math:`S = s I_d`); isotropic problems only."""
        if self.cov is not None:
            raise ValueError("`s` needs an isotropic problem (given `gamma`); this one has a full `cov`: use `S`")
        return self.gamma**2 + self.xi**2

    @property
    def covariance(self):
        r""":math:`\Gamma`, the within-component covariance, shape (d, d)."""
        if self.cov is None:
            return self.gamma**2 * jnp.eye(self.dim, dtype=self.dtype)
        return self.cov

    @property
    def S(self):
        r""":math:`S = \Gamma + \xi^2 I_d`, the covariance of each noisy component, shape (d, d)."""
        return self.covariance + self.xi**2 * jnp.eye(self.dim, dtype=self.dtype)

    def _mixture(self, cov) -> GaussianMixture:
        covs = jnp.broadcast_to(cov, (self.n_components, self.dim, self.dim))
        return unchecked(GaussianMixture, self.weights, self.means, covs)

    @property
    def clean(self) -> GaussianMixture:
        r"""The law of :math:`X`: :math:`\sum_k \pi_k \mathcal N(m_k, \Gamma)` (singular when :math:`\Gamma` is)."""
        return self._mixture(self.covariance)

    @property
    def noisy(self) -> GaussianMixture:
        r"""The law of :math:`Z`: :math:`\sum_k \pi_k \mathcal N(m_k, S)`, the prompt :math:`\mu_Z`."""
        return self._mixture(self.S)

    def _queries(self, z, name="z"):
        dtype = common_float_dtype(self.means, z)
        prob = self if dtype == self.dtype else self.astype(dtype)
        z = C.array(z, name, ("n", "d"), dims={"d": self.dim}, dtype=dtype)
        return prob, z

    def responsibilities(self, z):
        r"""The posterior probabilities of the components, :math:`\beta_k(z) = P(C = k \mid Z = z)`, shape (n, M).

        .. math::

            \beta_k(z) = \operatorname{softmax}_k\Big(\log \pi_k + m_k^\top S^{-1} z
            - \tfrac12 m_k^\top S^{-1} m_k\Big)

        (eq 10; :math:`S^{-1} = I_d / s` in the isotropic case), computed in log space
        (stable far from every component); the name is
        :meth:`~gmlib.GaussianMixture.responsibilities`'s, which gives the same
        probabilities for :attr:`noisy`.

        Args:
            z: queries, shape (n, d).

        Returns:
            array (n, M): each row non-negative, summing to one.

        Raises:
            ValueError: naming ``z`` for a wrong shape or non-finite values.

        Example:
            >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
            >>> np.round(prob.responsibilities(jnp.zeros((1, 2))), 6).tolist()  # P(C = k | Z = 0)
            [[0.5, 0.5]]
        """
        prob, z = self._queries(z)
        return _responsibilities(prob, z)

    def bayes(self, z):
        r"""The Bayes denoiser :math:`f^\star(z) = \mathbb E[X \mid Z = z]` (eq 10), shape (n, d).

        .. math::

            f^\star(z) = \Gamma S^{-1} z + \xi^2 S^{-1} \sum_k \beta_k(z)\, m_k

        (:math:`\frac{\gamma^2}{s} z + \frac{\xi^2}{s} \sum_k \beta_k(z) m_k` when
        :math:`\Gamma = \gamma^2 I_d`), with the posterior weights :math:`\beta_k` of :meth:`responsibilities`; any means,
        any number of components. Tweedie's formula gives the same map:
        :math:`f^\star(z) = z + \xi^2 \nabla \log p_Z(z)`.

        Args:
            z: queries, shape (n, d).

        Returns:
            array (n, d).

        Raises:
            ValueError: naming ``z`` for a wrong shape or non-finite values.

        Example:
            >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
            >>> np.round(prob.bayes(jnp.zeros((1, 2))), 6).tolist()  # E[X | Z = 0]
            [[1.2, 1.2]]
        """
        prob, z = self._queries(z)
        return _bayes(prob, z)

    def sample(self, *, key, n_samples: int):
        r"""Draw ``n_samples`` clean points :math:`X` and their noisy observations :math:`Z = X + \xi\varepsilon`.

        Args:
            key: a ``jax.random`` key.
            n_samples: the number of pairs, a non-negative int (checked by ``jax.random``).

        Returns:
            ``(x, z)``, both of shape (n, d): :math:`X` drawn from :attr:`clean` and
            :math:`Z = X + \xi\varepsilon` with :math:`\varepsilon \sim \mathcal N(0, I_d)`
            independent of :math:`X` (so :math:`Z` follows :attr:`noisy`).

        Example:
            >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
            >>> x, z = prob.sample(key=jax.random.key(0), n_samples=1000)
            >>> x.shape, z.shape
            ((1000, 2), (1000, 2))
        """
        k_x, k_eps = jax.random.split(key)
        x, _ = self.clean.sample(key=k_x, n_samples=n_samples)
        return x, x + self.xi * _random.normal(k_eps, x.shape, self.dtype)

    def excess_risk(self, f: Callable, *, method: str = "auto", n_nodes: int | None = None,
                    key=None, n_samples: int = 200_000, with_stderr: bool = False):
        r"""The excess risk :math:`\mathcal R(f) - \mathcal R(f^\star) = \mathbb E\,\|f(Z) - f^\star(Z)\|^2`.

        Let :math:`f` denote ``f``, a JAX-traceable map from queries (n, d) to
        predictions (n, d). The identity holds because :math:`f^\star` is the
        conditional mean (Prop C.6). The expectation over the noisy mixture
        :attr:`noisy` is :func:`~gmlib.mixture_expectation` (``"quadrature"``, the
        default when d ≤ 3) or :func:`~gmlib.monte_carlo_expectation`
        (``"monte_carlo"``, the default when d > 3; needs ``key``).

        Quadrature is deterministic and differentiable in whatever ``f`` closes over;
        with the default nodes (200, 80, 40 per coordinate for d = 1, 2, 3) it is
        accurate to about 1e-10 when :math:`f - f^\star` is smooth on the scale of the
        noisy components (moderate gate slopes, e.g. Figure 2's problem); raise
        ``n_nodes`` for very sharp gates.

        Args:
            f: a map from queries (n, d) to predictions (n, d).
            method: ``"auto"``, ``"quadrature"`` or ``"monte_carlo"``.
            n_nodes: Gauss–Hermite nodes per coordinate (quadrature).
            key, n_samples: the ``jax.random`` key and sample size (Monte Carlo).
            with_stderr: also return the standard error.

        Returns:
            a scalar; with ``with_stderr=True``, ``(value, stderr)``, the standard error
            being the Monte Carlo one, and exactly 0 for quadrature (whose error is
            deterministic).

        Raises:
            ValueError: for an unknown ``method``, a missing ``key`` with Monte Carlo,
                or an ``f`` whose output shape is not (n, d); and what
                :func:`~gmlib.mixture_expectation` / :func:`~gmlib.monte_carlo_expectation`
                raise (naming ``n_nodes``, ``n_samples``).

        Example:
            >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
            >>> A = denoise.linear_optimum(prob)
            >>> round(float(prob.excess_risk(lambda z: z @ A.T)), 6)  # = denoise.linear_gap(prob)
            1.641524
        """
        C.check_choice(method, "method", ("auto", "quadrature", "monte_carlo"))
        if method == "auto":
            method = "quadrature" if self.dim <= 3 else "monte_carlo"
        sq_error = _squared_error(self, f)
        if method == "quadrature":
            n_nodes = _DEFAULT_NODES.get(self.dim, 8) if n_nodes is None else n_nodes
            value = mixture_expectation(self.noisy, sq_error, n_nodes=n_nodes)
            stderr = jnp.zeros((), value.dtype)
        elif key is None:
            raise ValueError("`key` is required for the Monte Carlo excess risk (d > 3 or method='monte_carlo')")
        else:
            value, stderr = monte_carlo_expectation(self.noisy, sq_error, key=key, n_samples=n_samples)
        return (value, stderr) if with_stderr else value

    def bayes_risk(self, *, n_nodes: int | None = None):
        r"""The Bayes risk :math:`\mathcal R(f^\star) = \mathbb E\,\|X - f^\star(Z)\|^2`, a scalar.

        The posterior covariance of :math:`X` given :math:`Z` is the within-component
        part :math:`\Gamma - \Gamma S^{-1}\Gamma = \xi^2 \Gamma S^{-1}` plus the spread of
        the experts' means :math:`e_k = \xi^2 S^{-1} m_k`, so

        .. math::

            \mathcal R(f^\star) = \xi^2 \operatorname{tr}(\Gamma S^{-1}) +
            \mathbb E\Big[\sum_k \beta_k(Z) \|e_k\|^2 - \Big\|\sum_k \beta_k(Z) e_k\Big\|^2\Big]

        (:math:`d\gamma^2\xi^2/s + a^2\,\mathbb E[\dots m_k \dots]` when :math:`\Gamma = \gamma^2 I_d`).
        The posterior weights depend on :math:`Z` only through the M − 1 projections
        :math:`(S^{-1}(m_k - m_M))^\top Z`, so the expectation is an integral of dimension M − 1
        in each component, whatever d (nothing to integrate for M = 1). For M = 2 it is
        a trapezoid rule with ``n_nodes`` (default 4001) points on [−12, 12] standard
        deviations, accurate to about 1e-13 for gate slopes
        :math:`\|m_1 - m_2\|/\sqrt s` up to about 100 (the trapezoid rule converges
        geometrically for the analytic, Gaussian-weighted integrand, where Gauss–Hermite
        struggles with sharp logistic gates); for M = 3, 4 a tensor Gauss–Hermite rule
        (default 64 and 28 nodes per coordinate: accurate for moderate slopes only).

        Args:
            n_nodes: the number of points (M = 2) or nodes per coordinate (M = 3, 4).

        Returns:
            a scalar.

        Raises:
            ValueError: for M > 4, or naming ``n_nodes`` when it is not a positive int.

        Example:
            >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
            >>> round(float(prob.bayes_risk()), 4)
            2.9901
        """
        m = self.n_components
        k = m - 1
        if n_nodes is not None:
            n_nodes = C.scalar(n_nodes, "n_nodes", low=0, integer=True)
        if m > 4:
            raise ValueError(f"`bayes_risk` integrates over M - 1 <= 3 projections; got M = {m} components")
        if k == 0:
            return _within_variance(self)  # one component: nothing to integrate
        if k == 1:
            nodes, w = _trapezoid(4001 if n_nodes is None else n_nodes, self.dtype)
        else:
            nodes, w = gauss_hermite(n_nodes={2: 64, 3: 28}[k] if n_nodes is None else n_nodes, dim=k, dtype=self.dtype)
        return _bayes_risk(self, nodes, w)


def _precision_means(prob):
    """The rows :math:`(S^{-1} m_k)^\top`, shape (M, d), by a Cholesky solve (S is positive definite)."""
    if prob.cov is None:
        return prob.means / prob.s
    return jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(prob.S), prob.means.T).T


def _logits(prob, z):
    pm = _precision_means(prob)
    half_norms = 0.5 * jnp.sum(pm * prob.means, axis=-1)
    return jnp.log(prob.weights)[None, :] + z @ pm.T - half_norms[None, :]


@jax.jit
def _responsibilities(prob, z):
    return jax.nn.softmax(_logits(prob, z), axis=-1)


@jax.jit
def _bayes(prob, z):
    beta = jax.nn.softmax(_logits(prob, z), axis=-1)
    if prob.cov is None:
        s = prob.s
        return (prob.gamma**2 / s) * z + (prob.xi**2 / s) * (beta @ prob.means)
    # Gamma S^{-1} z + xi^2 S^{-1} sum_k beta_k m_k = z - xi^2 S^{-1} (z - sum_k beta_k m_k), rows
    factor = jax.scipy.linalg.cho_factor(prob.S)
    return z - prob.xi**2 * jax.scipy.linalg.cho_solve(factor, (z - beta @ prob.means).T).T


def _squared_error(prob, f):
    def sq_error(z):
        out = f(z)
        if out.shape != z.shape:
            raise ValueError(f"`f` must map queries (n, d) to predictions (n, d) = {z.shape}; got {out.shape}")
        return jnp.sum((out - _bayes(prob, z)) ** 2, axis=-1)

    return sq_error


@jax.jit
def _within_variance(prob):
    # tr(Gamma - Gamma S^-1 Gamma) = xi^2 tr(S^-1 Gamma)
    return prob.xi**2 * jnp.trace(jnp.linalg.solve(prob.S, prob.covariance))


@jax.jit
def _bayes_risk(prob, nodes, w):
    # the logit differences l_k - l_M depend on t = D z, D the (M-1, d) rows (S^-1 (m_k - m_M))^T;
    # under component j, t ~ N(D m_j, D S D^T)
    pm = _precision_means(prob)  # rows (S^-1 m_k)^T
    diffs = pm[:-1] - pm[-1]  # (k, d)
    root = psd_sqrt(diffs @ prob.S @ diffs.T)  # (k, k)
    t = (prob.means @ diffs.T)[:, None, :] + nodes @ root.T  # (M, N, k)
    h = jnp.sum(pm * prob.means, axis=-1)
    const = jnp.log(prob.weights[:-1]) - jnp.log(prob.weights[-1]) - 0.5 * (h[:-1] - h[-1])
    logits = jnp.concatenate([t + const, jnp.zeros(t.shape[:-1] + (1,), t.dtype)], axis=-1)
    beta = jax.nn.softmax(logits, axis=-1)  # (M, N, M)
    experts = prob.xi**2 * pm  # e_k = xi^2 S^-1 m_k
    spread = beta @ jnp.sum(experts**2, axis=-1) - jnp.sum((beta @ experts) ** 2, axis=-1)  # (M, N)
    return _within_variance(prob) + prob.weights @ (spread @ w)


