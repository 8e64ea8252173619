"""Gaussian mixtures: the prompts of the book.

A prompt in the infinite-prompt limit is a probability measure on R^D; here it
is a Gaussian mixture  mu = sum_k pi_k N(m_k, Gamma_k).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from gmlib import _checks as C
from gmlib import _random
from gmlib._dtypes import common_float_dtype
from gmlib._pytree import unchecked, validated_pytree

__all__ = ["GaussianMixture", "psd_sqrt"]


def psd_sqrt(mats):
    r"""The symmetric square root :math:`R = \Gamma^{1/2}` (so :math:`R R^\top = \Gamma`) of PSD ``mats``.

    Works for singular matrices (negative round-off eigenvalues are clipped to 0),
    so that sampling from a degenerate Gaussian is exact on its support.
    Differentiable to any order wherever :math:`\Gamma` is positive definite,
    including at repeated eigenvalues (:math:`\Gamma = \sigma^2 I`): the derivative
    :math:`\dot R` is the solution of the Sylvester equation
    :math:`R \dot R + \dot R R = \dot\Gamma`, never the derivative of the eigenvectors.

    Args:
        mats: array (..., D, D), symmetric positive semi-definite.

    Returns:
        array (..., D, D), the symmetric square root :math:`Q \Lambda^{1/2} Q^\top`.

    Raises:
        ValueError: naming ``mats``, if it is not a real array of square matrices, holds
            NaN or infinite values, or (on concrete inputs) is not symmetric positive
            semi-definite up to round-off.

    **Numerical limits.** :math:`\|R R^\top - \Gamma\| \lesssim 10\, D\, \varepsilon \|\Gamma\|`
    (:math:`\varepsilon` the dtype's machine epsilon). Eigenvalues below about
    :math:`\varepsilon \|\Gamma\|` are not resolved: their square roots (of order
    :math:`\sqrt{\varepsilon \|\Gamma\|}`) are noise. The derivative of :math:`R` is
    infinite where :math:`\Gamma` is singular (the square root of 0); there the part of
    :math:`\dot R` within the null space of :math:`\Gamma` is returned as 0.
    """
    mats = C.array(mats, "mats", psd=True)
    return _psd_sqrt(mats)


def _sym(a):
    return jnp.swapaxes(a, -1, -2)


@jax.custom_jvp
def _psd_sqrt(mats):
    """:func:`psd_sqrt` without the checks (for traced and internal use)."""
    lam, q = jnp.linalg.eigh(mats)
    return (q * jnp.sqrt(jnp.clip(lam, 0.0))[..., None, :]) @ _sym(q)


@_psd_sqrt.defjvp
def _psd_sqrt_jvp(primals, tangents):
    (mats,), (dmats,) = primals, tangents
    root = _psd_sqrt(mats)
    return root, _sylvester(root, 0.5 * (dmats + _sym(dmats)))


def _sylvester(root, rhs):
    r"""The :math:`X` with :math:`R X + X R = Y` for symmetric PSD :math:`R` (``root``), :math:`Y` = ``rhs``.

    Solved in the eigenbasis of :math:`R`, :math:`X_{ij} = Y_{ij} / (s_i + s_j)`; entries
    with :math:`s_i + s_j = 0` (the null space of a singular :math:`R`) are set to 0. As a
    ``custom_linear_solve``, its derivatives (of any order, in :math:`R` and :math:`Y`) come
    from the operator :math:`X \mapsto RX + XR` by implicit differentiation: no eigenvector
    is ever differentiated.
    """

    def solve(_, y):
        s, q = jnp.linalg.eigh(root)
        s = jnp.clip(s, 0.0)
        denom = s[..., :, None] + s[..., None, :]
        ok = denom > 0
        x = jnp.where(ok, (_sym(q) @ y @ q) / jnp.where(ok, denom, 1.0), 0.0)  # the double where
        return q @ x @ _sym(q)

    return jax.lax.custom_linear_solve(lambda x: root @ x + x @ root, rhs, solve, symmetric=True)


@validated_pytree
@dataclass(frozen=True, eq=False)
class GaussianMixture:
    r"""A Gaussian mixture :math:`\mu = \sum_{k=1}^M \pi_k \, \mathcal N(m_k, \Gamma_k)` on :math:`\mathbb R^D`.

    A frozen JAX pytree: it can be passed through ``jit``, ``vmap`` and ``grad``.

    **Numerical limits.** Weights down to 1e-300 are accepted and used exactly (below the
    smallest normal number, 2.2e-308 in float64, they are flushed to zero on CPU). The
    weights must sum to one within 1e-9 (float64) or 1e-5 (float32); symmetry and positive
    semi-definiteness are checked with a tolerance of 1e-10 (1e-5 in float32) relative to
    the largest entry, so a covariance that is PSD up to round-off is accepted.

    Args:
        weights: the mixing weights :math:`\pi`, shape (M,), non-negative, summing to one.
        means: the means :math:`m_k`, shape (M, D).
        covs: the covariances :math:`\Gamma_k`, shape (M, D, D), symmetric positive
            **semi**-definite (a singular covariance is allowed, e.g. a token
            coordinate that carries no noise).

    Raises:
        ValueError: naming the argument, for wrong shapes, non-finite values,
            negative weights or weights not summing to one, non-symmetric or
            indefinite covariances.

    Example:
        >>> mix = GaussianMixture.isotropic([0.5, 0.5], [[-1.0, 0.0], [1.0, 0.0]], 0.3)
        >>> points, labels = mix.sample(key=jax.random.key(0), n_samples=1000)
        >>> points.shape, labels.shape, np.round(mix.mean(), 6).tolist()
        ((1000, 2), (1000,), [0.0, 0.0])
    """

    weights: jax.Array
    means: jax.Array
    covs: jax.Array

    def __init__(self, weights, means, covs):
        dtype = common_float_dtype(weights, means, covs)
        weights = C.array(weights, "weights", ("M",), dtype=dtype)
        covs = C.array(covs, "covs", ("M", "D", "D"), dims={"M": weights.shape[0]}, dtype=dtype, psd=True)
        means = C.array(means, "means", ("M", "D"), dims=dict(zip("MD", covs.shape)), dtype=dtype)
        C.check_weights(weights)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "covs", covs)

    @classmethod
    def isotropic(cls, weights, means, std) -> "GaussianMixture":
        r"""The mixture :math:`\sum_k \pi_k \mathcal N(m_k, \sigma_k^2 I_D)`.

        Args:
            weights: shape (M,).
            means: shape (M, D).
            std: :math:`\sigma \ge 0`, a scalar or shape (M,) (one per component).

        Raises:
            ValueError: naming the argument, for a wrong shape, non-finite values, or the
                constraints of :class:`GaussianMixture`.
        """
        dtype = common_float_dtype(weights, means, std)
        means = C.array(means, "means", ("M", "D"), dtype=dtype)
        std = C.array(std, "std", ("M",) if jnp.ndim(std) else (), dims={"M": means.shape[0]}, dtype=dtype)
        m, d = means.shape
        var = jnp.broadcast_to(std**2, (m,))
        covs = var[:, None, None] * jnp.eye(d, dtype=dtype)
        return cls(weights, means, covs)

    @property
    def n_components(self) -> int:
        """M, the number of components."""
        return self.means.shape[0]

    @property
    def dim(self) -> int:
        """D, the dimension of the space."""
        return self.means.shape[1]

    @property
    def dtype(self):
        """The floating dtype of the parameters."""
        return self.means.dtype

    def mean(self):
        r""":math:`\mathbb E[X] = \sum_k \pi_k m_k`, shape (D,)."""
        return self.weights @ self.means

    def second_moment(self):
        r""":math:`\mathbb E[X X^\top] = \sum_k \pi_k (\Gamma_k + m_k m_k^\top)`, shape (D, D)."""
        outer = self.covs + self.means[:, :, None] * self.means[:, None, :]
        return jnp.tensordot(self.weights, outer, axes=1)

    def covariance(self):
        r""":math:`\operatorname{Cov}(X) = \mathbb E[XX^\top] - \mathbb E[X]\mathbb E[X]^\top`, shape (D, D)."""
        mu = self.mean()
        return self.second_moment() - jnp.outer(mu, mu)

    def add_noise(self, xi) -> "GaussianMixture":
        r"""The law of :math:`X + \xi \varepsilon` with :math:`\varepsilon \sim \mathcal N(0, I_D)` independent.

        Each component's covariance becomes :math:`\Gamma_k + \xi^2 I_D`.

        Raises:
            ValueError: naming ``xi`` unless it is a finite scalar.
        """
        xi = C.array(xi, "xi", (), dtype=self.dtype)
        noisy = self.covs + xi**2 * jnp.eye(self.dim, dtype=self.dtype)
        return unchecked(GaussianMixture, self.weights, self.means, noisy)

    def sample(self, *, key, n_samples: int):
        """Draw ``n_samples`` i.i.d. points and their component labels.

        Args:
            key: a ``jax.random`` key.
            n_samples: the number of points (a Python int).

        Returns:
            ``(points, labels)``: shapes (n_samples, D) and (n_samples,) (int32).

        Example:
            >>> mixture = GaussianMixture.isotropic([0.2, 0.8], [[-1.0, 0.0], [1.0, 0.0]], 0.3)
            >>> points, labels = mixture.sample(key=jax.random.key(0), n_samples=1000)
            >>> bool(abs(labels.mean() - 0.8) < 0.05)  # labels[i] = 1 for about 80 % of the points
            True
        """
        return _sample(self, key, n_samples)

    def _log_gaussians(self, z):
        """log N(z; m_k, Gamma_k) for every point and component, shape (n, M)."""
        chol = jnp.linalg.cholesky(self.covs)  # (M, D, D)
        diff = z[:, None, :] - self.means[None, :, :]  # (n, M, D)
        # the points as right-hand sides, one batch per component: (M, D, n), equal batch
        # dimensions (jax before 0.10 does not broadcast them)
        sol = jax.scipy.linalg.solve_triangular(chol, jnp.moveaxis(diff, 0, -1), lower=True)
        sol = jnp.moveaxis(sol, -1, 0)  # (n, M, D)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
        return -0.5 * (jnp.sum(sol**2, axis=-1) + logdet + self.dim * jnp.log(2 * jnp.pi))

    def log_prob(self, z):
        r"""The log-density :math:`\log \sum_k \pi_k \mathcal N(z; m_k, \Gamma_k)`, shape (n,).

        Needs positive-definite covariances (a singular Gaussian has no density).

        Raises:
            ValueError: naming ``z`` for a wrong shape or non-finite values, or ``covs``
                when a covariance is singular or numerically singular (condition number
                above :math:`1/(10 D \varepsilon)`, about 4.5e14 in float64 and 8e5 in
                float32 for D = 1: the Cholesky factor would be meaningless).

        **Numerical limits.** Computed in log space (Cholesky solve, ``logsumexp`` with the
        weights as factors): finite for points any finite distance away (checked at 1e4).
        The error grows like :math:`\kappa\,\varepsilon` times the Mahalanobis term for a
        covariance of condition number :math:`\kappa`.
        """
        C.check_psd(self.covs, "covs", definite=True)  # a singular component has no density (add_noise smooths it)
        return _log_prob(self, C.array(z, "z", ("n", "D"), dims={"D": self.dim}, dtype=self.dtype))

    def responsibilities(self, z):
        r"""Posterior component probabilities :math:`P(C = k \mid X = z)`, shape (n, M).

        Computed in log space, so points far from every component still get
        probabilities that sum to one. Needs positive-definite covariances.

        Raises:
            ValueError: as :meth:`log_prob`.

        **Numerical limits.** Weights below the smallest normal number (about 2.2e-308 in
        float64, 1.2e-38 in float32) are flushed to zero on CPU and count as absent components.
        """
        C.check_psd(self.covs, "covs", definite=True)
        return _responsibilities(self, C.array(z, "z", ("n", "D"), dims={"D": self.dim}, dtype=self.dtype))


@partial(jax.jit, static_argnums=2)
def _sample(mix: GaussianMixture, key, n: int):
    k_lab, k_eps = jax.random.split(key)
    labels = _random.categorical(k_lab, jnp.log(mix.weights), n)
    eps = _random.normal(k_eps, (n, mix.dim), mix.dtype)
    roots = _psd_sqrt(mix.covs)
    points = mix.means[labels] + jnp.einsum("nij,nj->ni", roots[labels], eps)
    return points, labels.astype(jnp.int32)


@jax.jit
def _log_prob(mix: GaussianMixture, z):
    return jax.nn.logsumexp(mix._log_gaussians(z), axis=-1, b=mix.weights[None, :])


@jax.jit
def _responsibilities(mix: GaussianMixture, z):
    return jax.nn.softmax(jnp.log(mix.weights)[None, :] + mix._log_gaussians(z), axis=-1)
