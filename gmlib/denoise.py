r"""Denoising a Gaussian mixture with softmax attention (Section 4 of the paper).

The model (eq 9): :math:`X \sim \sum_k \pi_k \mathcal N(m_k, \gamma^2 I_d)` and
:math:`Z = X + \varepsilon` with :math:`\varepsilon \sim \mathcal N(0, \xi^2 I_d)`
independent of :math:`X`; write :math:`s = \gamma^2 + \xi^2` (so :math:`S = s I_d`)
and :math:`a = \xi^2 / s`. The Bayes denoiser for the squared loss (eq 10) is the
softmax-gated affine map

.. math::

    f^\star(z) = \mathbb E[X \mid Z = z] = (1 - a)\, z + a \sum_k \beta_k(z)\, m_k,
    \qquad \beta_k(z) = \operatorname{softmax}_k\Big(\log \pi_k + \frac{m_k^\top z}{s}
    - \frac{\|m_k\|^2}{2 s}\Big) = P(C = k \mid Z = z).

Softmax attention on the noisy prompt :math:`\mu_Z` has the same shape (Prop 2.1),
but one head cannot weigh the two terms differently (Prop C.4): two heads can
(Prop C.5, Prop C.3), and the residual two-head architecture of Prop 4.4 does it
for every task at once, reading the task from the prompt.

What lives here:

- :class:`DenoisingProblem`: the problem, its Bayes denoiser (eq 10), its excess
  risk :math:`\mathbb E\|f(Z) - f^\star(Z)\|^2` and Bayes risk;
- :func:`two_head_bayes`, :func:`single_head_bayes`: exact attention heads;
  :func:`multi_head_attention`: the sum of heads;
- :func:`linear_optimum`, :func:`linear_gap`: the best linear denoiser (the best any
  network of linear-attention layers can do) and its excess risk (Prop C.6);
  :func:`affine_optimum`, :func:`affine_gap`: the same with an intercept;
- :func:`in_context_params`, :func:`in_context_denoise`: Prop 4.4 and its tempered
  family; :func:`estimate_task`: the plug-in in-context denoiser (EM on the prompt);
- :func:`iterate`, :func:`separation`, :func:`tanh_fixed_point`: the iterated
  denoiser of Prop 4.3.

Everything except :func:`tanh_fixed_point` (a scipy root solver on the host) and
the value-dependent checks works under ``jit``, ``vmap`` and ``grad``, in float32
and float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib import _random
from gmlib._pytree import unchecked, validated_pytree
from gmlib.attention import population_attention, softmax_attention
from gmlib.mixture import GaussianMixture, psd_sqrt
from gmlib.quadrature import gauss_hermite, mixture_expectation, monte_carlo_expectation

__all__ = [
    "DenoisingProblem",
    "two_head_bayes",
    "single_head_bayes",
    "augment",
    "multi_head_bayes",
    "heads_needed",
    "skip_head_bayes",
    "multi_head_attention",
    "linear_optimum",
    "linear_gap",
    "affine_optimum",
    "affine_gap",
    "InContextParams",
    "in_context_params",
    "in_context_denoise",
    "estimate_task",
    "iterate",
    "separation",
    "tanh_fixed_point",
]

#: Gauss–Hermite nodes per coordinate used by default, by dimension of the integral.
_DEFAULT_NODES = {1: 200, 2: 80, 3: 40}


# ----------------------------------------------------------------------------- helpers


def _dtype_of(*args):
    """The widest floating dtype among the arguments that carry a dtype (Python scalars follow)."""
    typed = [a for a in args if hasattr(a, "dtype")]
    return C.common_float_dtype(*typed) if typed else C.common_float_dtype()


def _tol(dtype):
    """Relative tolerance for value checks (equal norms, gamma = xi, distinct means)."""
    return 1e-5 if jnp.finfo(dtype).bits <= 32 else 1e-9


def _unit_orthogonal(basis):
    r"""A unit vector orthogonal to the orthonormal columns of ``basis`` (d, r), r < d.

    Takes the canonical vector :math:`e_j` least covered by the span and removes its
    projection; deterministic and traceable.
    """
    d = basis.shape[0]
    j = jnp.argmin(jnp.sum(basis**2, axis=1))
    e_j = jnp.eye(d, dtype=basis.dtype)[j]
    v = e_j - basis @ (basis.T @ e_j)
    return v / jnp.linalg.norm(v)


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
        >>> prob.bayes(jnp.zeros((1, 2)))  # E[X | Z = 0]
        >>> full = DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 1.0]], xi=2.0,
        ...                         cov=[[1.0, 0.5], [0.5, 2.0]])
    """

    weights: jax.Array
    means: jax.Array
    gamma: jax.Array | None
    xi: jax.Array
    cov: jax.Array | None = None

    def __init__(self, weights, means, gamma=None, xi=None, *, cov=None):
        if (gamma is None) == (cov is None):
            raise ValueError("exactly one of `gamma` (Gamma = gamma^2 I) and `cov` (a (d, d) matrix) must be "
                             f"given; got {'both' if gamma is not None else 'neither'}")
        dtype = _dtype_of(weights, means, xi, gamma if cov is None else cov)
        weights = C.array(weights, "weights", (None,), dtype=dtype, desc="(M,)")
        m = weights.shape[0]
        means = C.array(means, "means", (m, None), dtype=dtype, desc=f"(M, d) with M = {m}")
        d = means.shape[1]
        xi = C.array(xi, "xi", (), dtype=dtype, desc="() (a scalar)", low=0,
                     why=" (no noise, nothing to denoise)")
        if cov is None:
            gamma = C.array(gamma, "gamma", (), dtype=dtype, desc="() (a scalar)", low=0, strict=False,
                            why=" (a standard deviation)")
        else:
            cov = C.array(cov, "cov", (d, d), dtype=dtype, desc=f"(d, d) = ({d}, {d})")
            C.check_psd(cov, "cov")
        C.check_weights(weights, positive=True)  # every component present
        if C.is_concrete(means) and len(np.unique(np.asarray(means), axis=0)) < m:
            raise ValueError(f"`means` must be pairwise distinct; got equal rows in {np.asarray(means)}")
        for name, value in (("weights", weights), ("means", means), ("gamma", gamma), ("xi", xi), ("cov", cov)):
            object.__setattr__(self, name, value)

    def astype(self, dtype) -> "DenoisingProblem":
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
            raise ValueError("`s` is defined for an isotropic problem (given `gamma`); this one has a full "
                             "covariance `cov`: use `S`")
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
        dtype = C.common_float_dtype(self.means, z)
        prob = self if dtype == self.dtype else self.astype(dtype)
        z = C.array(z, name, (None, self.dim), dtype=dtype, desc=f"(n, d) with d = {self.dim}")
        return prob, z

    def posterior(self, z):
        r"""The posterior component probabilities :math:`\beta_k(z) = P(C = k \mid Z = z)`, shape (n, M).

        .. math::

            \beta_k(z) = \operatorname{softmax}_k\Big(\log \pi_k + m_k^\top S^{-1} z
            - \tfrac12 m_k^\top S^{-1} m_k\Big)

        (eq 10; :math:`S^{-1} = I_d / s` in the isotropic case), computed in log space
        (stable far from every component).

        Args:
            z: queries, shape (n, d).
        """
        prob, z = self._queries(z)
        return _posterior(prob, z)

    def bayes(self, z):
        r"""The Bayes denoiser :math:`f^\star(z) = \mathbb E[X \mid Z = z]` (eq 10), shape (n, d).

        .. math::

            f^\star(z) = \Gamma S^{-1} z + \xi^2 S^{-1} \sum_k \beta_k(z)\, m_k

        (:math:`\frac{\gamma^2}{s} z + \frac{\xi^2}{s} \sum_k \beta_k(z) m_k` when
        :math:`\Gamma = \gamma^2 I_d`), with the posterior weights :math:`\beta_k` of :meth:`posterior`; any means,
        any number of components. Tweedie's formula gives the same map:
        :math:`f^\star(z) = z + \xi^2 \nabla \log p_Z(z)`.

        Args:
            z: queries, shape (n, d).

        Returns:
            array (n, d).
        """
        prob, z = self._queries(z)
        return _bayes(prob, z)

    def sample(self, key, n: int):
        r"""Draw ``n`` clean points :math:`X` and their noisy observations :math:`Z = X + \xi\varepsilon`.

        Args:
            key: a ``jax.random`` key.
            n: the number of pairs, a positive int.

        Returns:
            ``(x, z)``, both of shape (n, d): :math:`X` drawn from :attr:`clean` and
            :math:`Z = X + \xi\varepsilon` with :math:`\varepsilon \sim \mathcal N(0, I_d)`
            independent of :math:`X` (so :math:`Z` follows :attr:`noisy`).

        Example:
            >>> x, z = prob.sample(jax.random.key(0), 1000)
        """
        k_x, k_eps = jax.random.split(key)
        x, _ = self.clean.sample(k_x, n)
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
            >>> A = linear_optimum(prob)
            >>> gap = prob.excess_risk(lambda z: z @ A.T)
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
            value, stderr = monte_carlo_expectation(self.noisy, sq_error, key, n_samples)
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

        Raises:
            ValueError: for M > 4.
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
            x = np.linspace(-12.0, 12.0, 4001 if n_nodes is None else n_nodes)
            w = np.exp(-0.5 * x**2)
            nodes, w = jnp.asarray(x[:, None], self.dtype), jnp.asarray(w / w.sum(), self.dtype)
        else:
            nodes, w = gauss_hermite({2: 64, 3: 28}[k] if n_nodes is None else n_nodes, k, self.dtype)
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
def _posterior(prob, z):
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


# ----------------------------------------------------------------------------- constructions


def _check_pair(problem, what: str, need_dim2: bool = True, general: bool = False):
    """Two components (and d >= 2); unless ``general``, isotropic and of equal norm: what the head constructions need."""
    if problem.n_components != 2:
        raise ValueError(f"`problem` must have M = 2 components for {what}; got M = {problem.n_components}")
    if need_dim2 and problem.dim < 2:
        raise ValueError(f"`problem` must have dimension d >= 2 for {what}; got d = {problem.dim}")
    if not general and not problem.isotropic:
        raise ValueError(f"`problem` must be isotropic (given `gamma`) for {what}; for a full covariance use "
                         "two_head_bayes, multi_head_bayes or skip_head_bayes")
    if not general and C.is_concrete(problem.means):
        r1, r2 = np.linalg.norm(np.asarray(problem.means, dtype=np.float64), axis=-1)
        if abs(r1 - r2) > _tol(problem.dtype) * max(r1, r2, 1.0):
            raise ValueError(
                f"`means` must have equal norms for {what} (the offsets -||m_k||^2/(2s) of the "
                f"posterior cannot come from dot-product scores); got ||m_1|| = {r1:.6g}, ||m_2|| = {r2:.6g}. "
                "Tokens with a constant coordinate produce them: two_head_bayes(problem, constant_token=True)"
            )


def two_head_bayes(problem: DenoisingProblem, constant_token: bool = False):
    r"""Two softmax heads whose sum on the noisy prompt is the Bayes denoiser (Thm 4.1).

    With ``constant_token=True`` the heads are (d + 1) × (d + 1) and act on tokens and
    queries that carry a constant coordinate 1 (:func:`augment`): then any two distinct
    means (any norms, collinear or not), any weights and any covariance (``gamma`` or
    ``cov``) are allowed, and the first d coordinates of the summed heads on
    ``augment(problem.noisy)`` are :math:`f^\star` (the last is 1). The construction is
    :func:`multi_head_bayes`'s with two heads; its derivation is in chapter 8 of the book.
    The rest of this docstring is the ``constant_token=False`` case (the paper's).

    Let :math:`a = \xi^2/s`, :math:`\Delta = m_1 - m_2`. For two components of equal
    norm in d ≥ 2 the returned heads satisfy, for every query z,

    .. math::

        T_{U_1,V_1}[\mu_Z](z) + T_{U_2,V_2}[\mu_Z](z) = f^\star(z).

    - Non-collinear means (Prop C.5): :math:`V_1 m_1 = a m_1`, :math:`V_1 m_2 = 0`,
      :math:`V_2 m_1 = 0`, :math:`V_2 m_2 = a m_2`, both :math:`a/2` times the identity
      on :math:`\operatorname{span}(m_1, m_2)^\perp`;
      :math:`U_1 = c I + c'\, m_2 \Delta^\top / \langle m_2, \Delta\rangle`,
      :math:`U_2 = c I + c'\, m_1 \Delta^\top / \langle m_1, \Delta\rangle`, with
      :math:`c = \gamma^2/(\xi^2 s)`, :math:`c' = (\xi^2 - \gamma^2)/(\xi^2 s)`.
    - Opposite means :math:`m_1 = -m_2 = m` (Prop C.5, second part): with
      :math:`e = m/\|m\|`, a unit :math:`n \perp e`, :math:`P = e e^\top`, :math:`Q = I - P`:
      :math:`U_{1,2} = (I \pm n e^\top)/s`, :math:`V_{1,2} = A \pm B`,
      :math:`A = (\xi^2 P + \gamma^2 Q)/(2s)`, :math:`B = (\gamma^2 - \xi^2)\, e n^\top/(2s)`.

    :math:`\gamma = 0` (point masses, Prop C.3) is the special case :math:`c = 0`,
    :math:`c' = 1/\xi^2`. The opposite-means formula is used when
    :math:`\sin^2\angle(m_1, m_2)` is below :math:`\epsilon^{2/3}` (ε the machine
    epsilon), where the first formula's 2 × 2 Gram inverse loses accuracy. Traceable:
    the choice is a ``jnp.where``.

    Args:
        problem: a :class:`DenoisingProblem` with M = 2, d ≥ 2 and
            :math:`\|m_1\| = \|m_2\|` (any weights, any :math:`\gamma \ge 0`).

    A full-covariance problem without the constant coordinate gets
    :func:`multi_head_bayes`'s construction, which needs equal :math:`S^{-1}`-norms
    :math:`m_1^\top S^{-1} m_1 = m_2^\top S^{-1} m_2`.

    Args:
        problem: a :class:`DenoisingProblem` with M = 2, d ≥ 2 and (without the constant
            coordinate) :math:`\|m_1\| = \|m_2\|` (any weights, any :math:`\gamma \ge 0`).
        constant_token: act on tokens augmented with a constant coordinate (any norms).

    Returns:
        ``[(U1, V1), (U2, V2)]``, each matrix of shape (d, d), or (d + 1, d + 1) with
        ``constant_token=True``.

    Raises:
        ValueError: if M ≠ 2, d < 2, or (without the constant coordinate) the norms
            differ; the message says that ``constant_token=True`` handles unequal norms.

    Example:
        >>> heads = two_head_bayes(prob)
        >>> multi_head_attention(prob.noisy, z, heads)  # equals prob.bayes(z)
        >>> heads = two_head_bayes(prob, constant_token=True)
        >>> multi_head_attention(augment(prob.noisy), augment(z), heads)[:, :-1]  # too
    """
    general = bool(constant_token) or not problem.isotropic  # multi_head_bayes's construction, two heads
    _check_pair(problem, "the two-head construction" + (" (multi_head_bayes handles more)" if general else ""),
                general=general)
    if general:
        return multi_head_bayes(problem, constant_token=bool(constant_token), n_heads=2)
    (U1, V1), (U2, V2) = _two_heads(problem)
    return [(U1, V1), (U2, V2)]


@jax.jit
def _two_heads(p):
    dtype = p.dtype
    d = p.dim
    eye = jnp.eye(d, dtype=dtype)
    g2, x2 = p.gamma**2, p.xi**2
    s = g2 + x2
    a = x2 / s
    m1, m2 = p.means[0], p.means[1]
    delta = m1 - m2
    # -- non-collinear means (Prop C.5): dual basis of (m1, m2) in their span
    G = jnp.stack([m1, m2], axis=1)  # (d, 2)
    K = G.T @ G
    sin2 = jnp.linalg.det(K) / (K[0, 0] * K[1, 1])
    eps = jnp.finfo(dtype).eps
    opposite = sin2 < eps ** (2.0 / 3.0)
    K_safe = jnp.where(opposite, jnp.eye(2, dtype=dtype), K)  # the "double where": no NaN in any branch
    dual = G @ jnp.linalg.inv(K_safe)  # (d, 2): columns g_i with g_i . m_j = delta_ij
    p_perp = eye - dual @ G.T
    c = g2 / (x2 * s)
    cp = (x2 - g2) / (x2 * s)
    U1n = c * eye + cp * jnp.outer(m2, delta) / (m2 @ delta)
    U2n = c * eye + cp * jnp.outer(m1, delta) / (m1 @ delta)
    V1n = a * jnp.outer(m1, dual[:, 0]) + 0.5 * a * p_perp
    V2n = a * jnp.outer(m2, dual[:, 1]) + 0.5 * a * p_perp
    # -- opposite means m1 = -m2 = m (m = delta / 2 also when they are only nearly opposite)
    e = delta / jnp.linalg.norm(delta)
    n = _unit_orthogonal(e[:, None])
    P = jnp.outer(e, e)
    A = (x2 * P + g2 * (eye - P)) / (2 * s)
    B = (g2 - x2) * jnp.outer(e, n) / (2 * s)
    U1o = (eye + jnp.outer(n, e)) / s
    U2o = (eye - jnp.outer(n, e)) / s
    pick = lambda o, nc: jnp.where(opposite, o, nc)  # noqa: E731
    return (pick(U1o, U1n), pick(A + B, V1n)), (pick(U2o, U2n), pick(A - B, V2n))


def single_head_bayes(problem: DenoisingProblem):
    r"""One softmax head equal to the Bayes denoiser, when one exists; a ``ValueError`` saying why otherwise.

    A single head on :math:`\mu_Z` reads :math:`T(z) = s V U z + V \sum_k \alpha_k(z) m_k`:
    one matrix :math:`V` weighs both the query and the barycenter, while
    :math:`f^\star` weighs them by :math:`1 - a` and :math:`a`. The cases where one
    head suffices (two components of equal norm):

    - :math:`\gamma = \xi` (Thm 4.1): :math:`U = S^{-1} = I/s`, :math:`V = I/2`;
    - :math:`\gamma = 0` (point masses) and a unit :math:`n` orthogonal to both means
      (opposite means, Prop C.3, or any means when d ≥ 3): with :math:`\Delta = m_1 - m_2`,
      :math:`w = \Delta + \|\Delta\|\, n`,
      :math:`U = w \Delta^\top / (\xi^2 \|\Delta\|^2)`,
      :math:`V = P_E - \Delta n^\top / \|\Delta\|` (:math:`P_E` the projection on
      :math:`E = \operatorname{span}(m_1, m_2)`), so that :math:`V U = 0`,
      :math:`V m_k = m_k` and :math:`U^\top \Delta = \Delta / \xi^2`. For opposite
      means this is Prop C.3's :math:`U = (m + n)m^\top/(\xi^2\|m\|^2)` with
      :math:`\|n\| = \|m\|`; the d ≥ 3 case is the same trick, not stated in the paper.

    Otherwise no head exists: :math:`\gamma > 0` with :math:`\gamma \ne \xi` (Prop C.4),
    or :math:`\gamma = 0` with linearly independent means in d = 2 (Prop C.3).
    The equality tests (:math:`\gamma = \xi`, :math:`\gamma = 0`) use a relative
    tolerance of 1e-9 (1e-5 in float32) on concrete values; under ``jit`` the
    checks are skipped and the :math:`\gamma = 0` construction is returned when
    :math:`\gamma = 0`, the :math:`\gamma = \xi` one otherwise.

    Args:
        problem: a :class:`DenoisingProblem` with M = 2 and :math:`\|m_1\| = \|m_2\|`.

    Returns:
        ``(U, V)``, each of shape (d, d).

    Raises:
        ValueError: naming the reason when no single head realizes :math:`f^\star`.
    """
    _check_pair(problem, "a single-head denoiser", need_dim2=False)
    if C.is_concrete(problem.gamma) and C.is_concrete(problem.means):
        g, x = float(problem.gamma), float(problem.xi)
        tol = _tol(problem.dtype)
        mu = np.asarray(problem.means, dtype=np.float64)
        sin2 = 1.0 - (mu[0] @ mu[1]) ** 2 / ((mu[0] @ mu[0]) * (mu[1] @ mu[1]))
        collinear = sin2 < np.finfo(np.dtype(problem.dtype)).eps ** (2.0 / 3.0)
        if g <= tol * x:
            if problem.dim < 2:
                raise ValueError("`problem` needs d >= 2 for a single head at gamma = 0: in d = 1 the head's "
                                 "linear part s V U z cannot vanish while V keeps the means")
            if problem.dim == 2 and not collinear:
                raise ValueError(
                    "no single head realizes the Bayes denoiser of `problem`: gamma = 0 with linearly "
                    "independent means in d = 2 (Prop C.3); use two_head_bayes"
                )
        elif abs(g - x) > tol * x:
            raise ValueError(
                f"no single head realizes the Bayes denoiser of `problem`: gamma^2 != xi^2 (gamma = {g:.6g}, "
                f"xi = {x:.6g}) and one value matrix cannot weigh the query by gamma^2/s and the barycenter "
                "by xi^2/s (Prop C.4); use two_head_bayes"
            )
    return _single_head(problem)


@jax.jit
def _single_head(p):
    dtype = p.dtype
    d = p.dim
    eye = jnp.eye(d, dtype=dtype)
    s = p.s
    balanced = (eye / s, 0.5 * eye)
    if d < 2:
        return balanced
    m1, m2 = p.means[0], p.means[1]
    delta = m1 - m2
    r = jnp.linalg.norm(delta)
    # orthonormal basis of E = span(m1, m2) (rank 1 for opposite means)
    e1 = delta / r
    w2 = m1 - (m1 @ e1) * e1
    w2n = jnp.linalg.norm(w2)
    rank2 = w2n > jnp.sqrt(jnp.finfo(dtype).eps) * jnp.linalg.norm(m1)
    e2 = jnp.where(rank2, w2 / jnp.where(rank2, w2n, 1.0), 0.0)
    basis = jnp.stack([e1, e2], axis=1)  # (d, 2), second column 0 when E is a line
    if d == 2:  # a normal to E exists only for opposite means (else single_head_bayes has raised)
        n = jnp.where(rank2, 0.0, _unit_orthogonal(e1[:, None]))
    else:  # a zero second column leaves _unit_orthogonal a normal to the line
        n = _unit_orthogonal(basis)
    w = delta + r * n
    U0 = jnp.outer(w, delta) / (p.xi**2 * r**2)
    V0 = basis @ basis.T - jnp.outer(delta, n) / r
    degenerate = p.gamma == 0
    return jnp.where(degenerate, U0, balanced[0]), jnp.where(degenerate, V0, balanced[1])


def augment(prompt):
    r"""Tokens, queries or a prompt law with a constant coordinate 1 appended.

    An array :math:`x` of shape (..., d) becomes :math:`(x, 1)`, shape (..., d + 1); a
    :class:`~gmlib.GaussianMixture` :math:`\sum_k \pi_k \mathcal N(m_k, \Gamma_k)` becomes
    :math:`\sum_k \pi_k \mathcal N\big((m_k, 1), \operatorname{blockdiag}(\Gamma_k, 0)\big)`,
    the law of the augmented tokens. A head :math:`(U, V)` on augmented tokens has the
    score :math:`(x, 1)^\top U (z, 1)`, which gains a term linear in the token
    (:math:`x^\top b` with :math:`b` the last column of U's first d rows), so that the
    gate logits of Prop 2.1 gain :math:`m_k^\top b`.

    Args:
        prompt: an array (..., d) or a :class:`~gmlib.GaussianMixture`.

    Returns:
        the same kind of object, in dimension d + 1.

    Raises:
        ValueError: naming ``prompt`` for a non-numeric, non-finite or 0-d array.

    Example:
        >>> augment(jnp.zeros((3, 2)))  # rows (0, 0, 1)
    """
    if isinstance(prompt, GaussianMixture):
        m, d = prompt.n_components, prompt.dim
        means = jnp.concatenate([prompt.means, jnp.ones((m, 1), prompt.dtype)], axis=1)
        covs = jnp.zeros((m, d + 1, d + 1), prompt.dtype).at[:, :d, :d].set(prompt.covs)
        return unchecked(GaussianMixture, prompt.weights, means, covs)
    x = jnp.asarray(prompt)  # its values are checked by the attention that reads it
    return jnp.concatenate([x, jnp.ones(x.shape[:-1] + (1,), x.dtype)], axis=-1)


def _plan(problem, constant_token: bool, n_heads=None):
    r"""The rank r of the mean differences and the number of matched-gate heads, after checking feasibility.

    Returns ``(r, h)``: h the fewest heads of :func:`multi_head_bayes` (``n_heads`` when
    given), or ``(r, None)`` when there is no matched-gate construction with any number of
    heads (the message of the ``ValueError`` that :func:`multi_head_bayes` raises then is
    the third element). Needs concrete means and covariance; under tracing it assumes
    general position (r = min(M - 1, d)) and trusts the offsets.
    """
    m, d = problem.n_components, problem.dim
    concrete = C.is_concrete(problem.means) and C.is_concrete(problem.S)
    if not concrete:
        r = min(m - 1, d)
        need = 1 if r == 0 else -(-d // (d - r)) if r < d else 1
        return r, (need if n_heads is None else n_heads), None
    mu = np.asarray(problem.means, dtype=np.float64)
    S = np.asarray(problem.S, dtype=np.float64)
    x2 = float(problem.xi) ** 2
    tol = _tol(problem.dtype)
    diffs = mu[:-1] - mu[-1]
    sv = np.linalg.svd(diffs, compute_uv=False) if m > 1 else np.zeros(0)
    r = int(np.sum(sv > tol * max(1.0, sv.max(initial=0.0))))
    # the gate offsets -m_k^T S^{-1} m_k / 2 (up to a common constant) must come from m_k^T b
    q = 0.5 * np.sum(mu * np.linalg.solve(S, mu.T).T, axis=-1)
    y = -(q[:-1] - q[-1])
    why = None
    if m > 1:
        if constant_token:
            b = np.linalg.lstsq(diffs, y, rcond=None)[0]
            if np.abs(diffs @ b - y).max() > tol * max(1.0, np.abs(y).max()) * 1e3:
                why = ("the gate offsets -m_k^T S^{-1} m_k / 2 are not m_k^T b + c for any b, c: the means "
                       "do not lie on a common sphere of the metric S^{-1} (affinely independent means always do)")
        elif np.abs(y).max() > tol * max(1.0, np.abs(q).max()):
            why = ("the means must have equal S^{-1}-norms m_k^T S^{-1} m_k without the constant coordinate "
                   "(the offsets of the posterior cannot come from dot-product scores); use constant_token=True")
    # the linear part left to the heads, (Gamma - xi^2 I) S^{-1}: zero exactly when Gamma = xi^2 I
    resid = np.abs(S - 2 * x2 * np.eye(d)).max() > tol * max(1.0, np.abs(S).max())
    need = 1 if not resid else (None if r >= d else -(-d // (d - r)))
    if need is None and why is None:
        why = (f"no matched-gate construction exists: the {m} means span an affine space of dimension r = {r} "
               f"= d, so every head's U is S^{{-1}} on it and the heads' linear part cannot be Gamma S^{{-1}} "
               "unless Gamma = xi^2 I; skip_head_bayes (a linear skip connection) works")
    if n_heads is not None and need is not None and n_heads < need:
        why = why or f"`n_heads` must be at least {need} for these means (r = {r}, d = {d}); got {n_heads}"
    return r, (need if n_heads is None else n_heads), why


def heads_needed(problem: DenoisingProblem, *, constant_token: bool = True):
    r"""The fewest heads of :func:`multi_head_bayes` for ``problem``, or ``None`` where it has no construction.

    With r the dimension of the affine span of the means and :math:`R = (\Gamma - \xi^2 I) S^{-1}`:
    1 when :math:`\Gamma = \xi^2 I_d`; :math:`\lceil d / (d - r) \rceil` when r < d; ``None``
    when r = d (M ≥ d + 1 means in general position) or when the gate offsets cannot be
    produced: they are :math:`m_k^\top b + c` for some b, c exactly when the means lie on a
    common sphere of the metric :math:`S^{-1}` (always for affinely independent means;
    never for three collinear ones), and without the constant coordinate that sphere must
    be centred at 0 (equal :math:`S^{-1}`-norms). It is the fewest heads of *this*
    construction, not always of every construction with the Bayes gates: with the constant
    coordinate the last column of the values absorbs a constant, and the book's chapter 8
    shows a case (d = 3, M = 3, a turned Γ) where two such heads are exact while this
    count is 3; there the necessary count is :math:`(h + 1)(d - r) \ge d`.

    Args:
        problem: a :class:`DenoisingProblem` (concrete values).
        constant_token: whether the tokens carry a constant coordinate.

    Returns:
        an int, or ``None``.
    """
    _, need, why = _plan(problem, constant_token)
    return None if why is not None else need


def multi_head_bayes(problem: DenoisingProblem, *, constant_token: bool = True, n_heads: int | None = None):
    r"""Heads whose sum on the noisy prompt is the Bayes denoiser of M components, any covariance (matched gates).

    Let :math:`S = \Gamma + \xi^2 I_d`, :math:`G = \xi^2 S^{-1}`,
    :math:`R = (\Gamma - \xi^2 I_d) S^{-1}`, :math:`D` the (M − 1, d) matrix of rows
    :math:`m_k - m_M`, of rank r, :math:`B_D` (d, r) and :math:`B_Q` (d, k = d − r)
    orthonormal bases of its row space and of the complement. Every head gets the Bayes
    gates, :math:`U_j = S^{-1} + B_Q E_j` (so :math:`D U_j = D S^{-1}`), and the values
    :math:`V_j = C_j T^{+} + G (I - T T^{+}) / h` with :math:`T = S B_Q`, where the blocks
    :math:`C_j` (d, k) sum to :math:`\xi^2 B_Q` and :math:`[C_1 \dots C_h]` has rank d
    (the first h − 1 carry :math:`\xi^2 B_D`), and
    :math:`E = [C_1 \dots C_h]^{+} R`. Then :math:`\sum_j V_j = G` and
    :math:`\sum_j V_j S U_j = G + R = \Gamma S^{-1}`, so that

    .. math::

        \sum_j T_{U_j, V_j}[\mu_Z](z) = \Gamma S^{-1} z + \xi^2 S^{-1} \sum_k \beta_k(z) m_k
        = f^\star(z) \quad (\text{eq 10}).

    With the constant coordinate (:func:`augment`) the heads are (d + 1) × (d + 1): their
    score gains :math:`x^\top b` with :math:`D b = -\tfrac12 (m_k^\top S^{-1} m_k -
    m_M^\top S^{-1} m_M)_k`, which puts the offsets of the posterior into the gates, the
    last column of the values cancels the shift :math:`V_j S b` it causes in the experts,
    and the last row of each value matrix is :math:`(0, \dots, 0, 1/h)` (the output
    carries the constant coordinate 1). Without it the means must have equal
    :math:`S^{-1}`-norms. The number of heads is :func:`heads_needed`'s.

    Args:
        problem: a :class:`DenoisingProblem` (any M, any covariance; concrete values to
            choose r and the number of heads).
        constant_token: act on augmented tokens (default ``True``).
        n_heads: more heads than the fewest (the same construction).

    Returns:
        a list of ``(U, V)`` pairs, (d, d) or (d + 1, d + 1) each.

    Raises:
        ValueError: where no construction exists (r = d with :math:`\Gamma \ne \xi^2 I`;
            offsets that cannot be produced), or ``n_heads`` is too small.

    Example:
        >>> heads = multi_head_bayes(prob)  # prob with three means in d = 3
        >>> multi_head_attention(augment(prob.noisy), augment(z), heads)[:, :-1]  # = prob.bayes(z)
    """
    if n_heads is not None:
        n_heads = C.scalar(n_heads, "n_heads", low=0, integer=True)
    r, h, why = _plan(problem, constant_token, n_heads)
    if why is not None:
        raise ValueError(f"no multi-head Bayes construction for `problem`: {why}")
    return _matched_heads(problem, r, h, bool(constant_token))


def _head_offsets(p, Sinv):
    """b with (m_k - m_M)^T b = -(m_k^T S^{-1} m_k - m_M^T S^{-1} m_M) / 2 (minimum norm)."""
    if p.n_components == 1:
        return jnp.zeros(p.dim, p.dtype)
    q = 0.5 * jnp.sum((p.means @ Sinv) * p.means, axis=-1)
    diffs = p.means[:-1] - p.means[-1]
    return jnp.linalg.pinv(diffs) @ (q[-1] - q[:-1])


def _embed(p, A, V, b, last):
    """The (d + 1) × (d + 1) head of a (d, d) head (A, V) with score offset b and value last row (0, last)."""
    d = p.dim
    U = jnp.zeros((d + 1, d + 1), p.dtype).at[:d, :d].set(A).at[:d, d].set(b)
    Vt = jnp.zeros((d + 1, d + 1), p.dtype).at[:d, :d].set(V).at[:d, d].set(-V @ p.S @ b).at[d, d].set(last)
    return U, Vt


@partial(jax.jit, static_argnums=(1, 2, 3))
def _matched_heads(p, r: int, h: int, constant: bool):
    d, dt = p.dim, p.dtype
    eye = jnp.eye(d, dtype=dt)
    S = p.S
    Sinv = jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(S), eye)
    Sinv = 0.5 * (Sinv + Sinv.T)
    x2 = p.xi**2
    G = x2 * Sinv
    if h == 1:
        As, Vs = [Sinv], [G]
    else:
        R = eye - 2 * G  # Gamma S^{-1} - xi^2 S^{-1}
        k = d - r
        if r > 0:
            _, _, vt = jnp.linalg.svd(p.means[:-1] - p.means[-1], full_matrices=True)
            B_D, B_Q = vt[:r].T, vt[r:].T
        else:
            B_D, B_Q = jnp.zeros((d, 0), dt), eye
        F = jnp.concatenate([x2 * B_D, jnp.zeros((d, (h - 1) * k - r), dt)], axis=1)
        Cs = [F[:, j * k:(j + 1) * k] for j in range(h - 1)]
        Cs.append(x2 * B_Q - sum(Cs))
        E = jnp.linalg.pinv(jnp.concatenate(Cs, axis=1)) @ R  # (h k, d)
        T = S @ B_Q
        T_plus = jnp.linalg.solve(T.T @ T, T.T)  # (k, d), T^+ T = I_k
        rest = G @ (eye - T @ T_plus) / h
        As = [Sinv + B_Q @ E[j * k:(j + 1) * k] for j in range(h)]
        Vs = [Cj @ T_plus + rest for Cj in Cs]
    if not constant:
        return list(zip(As, Vs))
    b = _head_offsets(p, Sinv)
    return [_embed(p, A, V, b, 1.0 / h) for A, V in zip(As, Vs)]


def skip_head_bayes(problem: DenoisingProblem, *, constant_token: bool = True):
    r"""One head and a linear skip connection, :math:`f(z) = B z + T_{U,V}[\mu_Z](z)`, equal to the Bayes denoiser.

    :math:`U = S^{-1}`, :math:`V = G = \xi^2 S^{-1}` and :math:`B = (\Gamma - \xi^2 I) S^{-1}`:
    the gates are the posterior, the head gives :math:`G z + G \sum_k \beta_k m_k` and the
    skip the rest of :math:`\Gamma S^{-1} z` (eq 10), for any number of components and any
    covariance. With the constant coordinate the score gains the offsets (as in
    :func:`multi_head_bayes`), U, V and B are (d + 1) × (d + 1), and the output carries the
    constant coordinate 1; without it the means must have equal :math:`S^{-1}`-norms. Prop
    4.4's output map is such a skip (its second head is zero).

    Args:
        problem: a :class:`DenoisingProblem`.
        constant_token: act on augmented tokens (default ``True``).

    Returns:
        ``(B, (U, V))``.

    Raises:
        ValueError: where the gate offsets cannot be produced.

    Example:
        >>> B, (U, V) = skip_head_bayes(prob)
        >>> zt = augment(z)
        >>> (zt @ B.T + population_attention(augment(prob.noisy), zt, U, V))[:, :-1]  # = prob.bayes(z)
    """
    _, _, why = _plan(problem, constant_token, 1)
    if why is not None and "offsets" in why:
        raise ValueError(f"no skip-head Bayes construction for `problem`: {why}")
    return _skip_head(problem, bool(constant_token))


@partial(jax.jit, static_argnums=(1,))
def _skip_head(p, constant: bool):
    d, dt = p.dim, p.dtype
    eye = jnp.eye(d, dtype=dt)
    Sinv = jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(p.S), eye)
    Sinv = 0.5 * (Sinv + Sinv.T)
    G = p.xi**2 * Sinv
    B = eye - 2 * G
    if not constant:
        return B, (Sinv, G)
    U, V = _embed(p, Sinv, G, _head_offsets(p, Sinv), 0.0)
    return jnp.zeros((d + 1, d + 1), dt).at[:d, :d].set(B).at[d, d].set(1.0), (U, V)


def multi_head_attention(prompt, queries, heads, *, block_size=None):
    r"""The sum of softmax heads, :math:`\sum_h T_{U_h, V_h}[\mu](z)` (multi-head attention: the heads add up).

    Args:
        prompt: a :class:`~gmlib.GaussianMixture` (the infinite prompt, through
            :func:`~gmlib.population_attention`) or an array of tokens (L, D) (a finite
            prompt, through :func:`~gmlib.softmax_attention`).
        queries: shape (n, D).
        heads: a sequence of ``(U, V)`` pairs, U of shape (D, D), V of shape (D_out, D).
        block_size: passed to :func:`~gmlib.softmax_attention` for a finite prompt.

    Returns:
        array (n, D_out).

    Raises:
        ValueError: for an empty ``heads``, and whatever the attention functions raise.
    """
    heads = list(heads)
    if not heads:  # sum([]) would be a silent 0
        raise ValueError("`heads` must hold at least one (U, V) pair; got none")
    return sum(_attend(prompt, queries, U, V, block_size) for U, V in heads)


def _attend(prompt, queries, U, V, block_size):
    if isinstance(prompt, GaussianMixture):
        return population_attention(prompt, queries, U, V)
    return softmax_attention(prompt, queries, U, V, block_size=block_size)


# ----------------------------------------------------------------------------- linear attention


def linear_optimum(problem: DenoisingProblem):
    r"""The best linear denoiser :math:`A^\star = M_2 (M_2 + \xi^2 I_d)^{-1}`, :math:`M_2 = \mathbb E[X X^\top]`.

    The risk of :math:`z \mapsto A z` is
    :math:`\mathbb E\|(I - A)X\|^2 + \xi^2 \|A\|_F^2` (the noise is independent of
    :math:`X`), a convex quadratic minimized at :math:`A^\star` (Prop C.6), with risk
    :math:`\mathcal R(A^\star) = \xi^2 \operatorname{tr} A^\star`. Every network of
    linear-attention layers is a linear map (Lemma C.7), so none does better.
    :func:`affine_optimum` adds an intercept.

    Args:
        problem: a :class:`DenoisingProblem` (any means, any M).

    Returns:
        array (d, d).
    """
    return _shrinkage(problem.clean.second_moment(), problem.xi)


def affine_optimum(problem: DenoisingProblem):
    r"""The best affine denoiser :math:`z \mapsto A z + b`: :math:`A = \Sigma (\Sigma + \xi^2 I_d)^{-1}`, :math:`b = (I - A)\,\mathbb E X`.

    Let :math:`\Sigma = \operatorname{Cov}(X)` and :math:`\mu = \mathbb E X = \mathbb E Z`.
    For a fixed :math:`A` the risk :math:`\mathbb E\|X - AZ - b\|^2` is a quadratic in
    :math:`b` minimized at :math:`b = \mu - A\mu`, which leaves the linear problem of the
    centred pair :math:`(X - \mu, Z - \mu)`: the risk is
    :math:`\mathbb E\|(I - A)(X - \mu)\|^2 + \xi^2\|A\|_F^2`, minimized (setting its
    gradient :math:`-2(I - A)\Sigma + 2\xi^2 A` to zero) at
    :math:`A = \operatorname{Cov}(X, Z)\operatorname{Cov}(Z)^{-1} = \Sigma(\Sigma + \xi^2 I_d)^{-1}`.
    Since :math:`\Sigma (I - A) = \xi^2 A`, the minimal risk is
    :math:`\operatorname{tr}\Sigma - \operatorname{tr}(A\Sigma) = \xi^2 \operatorname{tr} A`.

    Linear attention on tokens and queries that carry a constant coordinate is affine
    in the query, so this is the fair linear baseline once an intercept is allowed: the
    gap between :func:`linear_gap` and :func:`affine_gap` is the part of the linear gap
    due to the missing intercept, :func:`affine_gap` the part due to the lack of
    selection. Written with the clean mixture's mean and covariance, it holds for any
    number of components and any within-component covariance.

    Args:
        problem: a :class:`DenoisingProblem` (any means, any M).

    Returns:
        ``(A, b)``: shapes (d, d) and (d,).

    Example:
        >>> A, b = affine_optimum(prob)
        >>> prob.excess_risk(lambda z: z @ A.T + b)  # equals affine_gap(prob)
    """
    clean = problem.clean
    A = _shrinkage(clean.covariance(), problem.xi)
    mu = clean.mean()
    return A, mu - A @ mu


@jax.jit
def _shrinkage(cov, xi):
    # cov (cov + xi^2 I)^{-1} = Q diag(l / (l + xi^2)) Q^T: symmetric, and no singular solve when xi^2 is
    # below the rounding of cov (float32, xi -> 0: cov + xi^2 I rounds to a singular cov)
    lam, q = jnp.linalg.eigh(cov)
    lam = jnp.clip(lam, 0.0)
    return (q * (lam / (lam + xi**2))[None, :]) @ q.T


def linear_gap(problem: DenoisingProblem, *, n_nodes: int | None = None):
    r"""The excess risk of the best linear denoiser, :math:`\mathbb E\|A^\star Z - f^\star(Z)\|^2` (Prop C.6).

    .. math::

        \mathcal R(A^\star) - \mathcal R(f^\star), \qquad
        \mathcal R(A^\star) = \xi^2 \operatorname{tr}\big(M_2 (M_2 + \xi^2 I)^{-1}\big),

    the first term in closed form (:func:`linear_optimum`) and the Bayes risk from
    :meth:`DenoisingProblem.bayes_risk` (an integral over the M − 1 projections the
    posterior depends on). Positive whenever the posterior weights are not constant:
    the best any network of linear-attention layers can do. It is at least
    :func:`affine_gap`; the difference is the price of the missing intercept.

    Args:
        problem: a :class:`DenoisingProblem` with M ≤ 4.
        n_nodes: passed to :meth:`DenoisingProblem.bayes_risk`.

    Returns:
        a scalar.
    """
    A = linear_optimum(problem)
    return problem.xi**2 * jnp.trace(A) - problem.bayes_risk(n_nodes=n_nodes)


def affine_gap(problem: DenoisingProblem, *, n_nodes: int | None = None):
    r"""The excess risk of the best affine denoiser, :math:`\mathbb E\|AZ + b - f^\star(Z)\|^2`.

    .. math::

        \xi^2 \operatorname{tr}\big(\Sigma (\Sigma + \xi^2 I)^{-1}\big) - \mathcal R(f^\star),
        \qquad \Sigma = \operatorname{Cov}(X),

    with :math:`(A, b)` from :func:`affine_optimum` (whose docstring derives the risk)
    and the Bayes risk from :meth:`DenoisingProblem.bayes_risk`. Zero exactly when the
    Bayes denoiser is affine (one component); what remains of :func:`linear_gap` once
    an intercept is allowed: the price of no selection.

    Args:
        problem: a :class:`DenoisingProblem` with M ≤ 4.
        n_nodes: passed to :meth:`DenoisingProblem.bayes_risk`.

    Returns:
        a scalar.
    """
    A, _ = affine_optimum(problem)
    return problem.xi**2 * jnp.trace(A) - problem.bayes_risk(n_nodes=n_nodes)


# ----------------------------------------------------------------------------- in-context denoising


class InContextParams(NamedTuple):
    r"""Parameters of the residual two-head denoiser of Prop 4.4 (a pytree).

    Attributes:
        U1, V1: the first head, (d, d).
        U2, V2: the second head, (d, d).
        W_out: the output map, (d, 2d), applied to the concatenated residual heads.
    """

    U1: jax.Array
    V1: jax.Array
    U2: jax.Array
    V2: jax.Array
    W_out: jax.Array


def in_context_params(gamma, xi, dim: int, temperature=1.0) -> InContextParams:
    r"""The task-independent residual two-head denoiser of Prop 4.4, at a temperature c.

    Let :math:`c` denote ``temperature`` and :math:`a = \xi^2/(\gamma^2 + \xi^2)`:

    .. math::

        U_1 = c\,S^{-1},\quad V_1 = a I_d,\quad U_2 = V_2 = 0,\quad
        W_{\mathrm{out}} = \big(I_d,\ -a(1 + c) I_d\big).

    Through :func:`in_context_denoise`, on a finite prompt of noisy tokens
    :math:`z_1, \dots, z_L` this is

    .. math::

        \hat f_c(z) = (1 - a - ac)\, z + a \sum_{i=1}^L
        \operatorname{softmax}_i\big(c\, z_i^\top S^{-1} z\big)\, z_i,

    and on the infinite prompt :math:`\mu_Z^\tau` of a task
    :math:`\tau = (m_1, m_2, \pi_1)` (Prop 2.1 with the shared covariance S)

    .. math::

        \hat f_c[\mu_Z^\tau](z) = (1 - a)\, z + a \sum_k
        \operatorname{softmax}_k\big(\log \pi_k + c\, m_k^\top S^{-1} z\big)\, m_k.

    At :math:`c = 1` this is Prop 4.4 exactly: :math:`\mathbb E[X \mid Z = z, \tau]` for
    every task with :math:`\|m_1\| = \|m_2\|`. The residual correction
    :math:`-a(1 + c)` cancels the linear term :math:`a c z` that the head adds (Prop 2.1),
    so the family keeps the Bayes linear part :math:`(1 - a) z` at every temperature;
    :math:`c < 1` blurs the gate in exchange for less finite-prompt variance. Only
    :math:`\gamma`, :math:`\xi` and :math:`c`, shared by all tasks, enter.

    Args:
        gamma: :math:`\gamma \ge 0`.
        xi: :math:`\xi > 0`.
        dim: d, a positive int.
        temperature: c > 0, finite (default 1: Prop 4.4).

    Returns:
        an :class:`InContextParams`.

    Raises:
        ValueError: for ``gamma < 0``, ``xi <= 0``, ``temperature <= 0``, non-finite
            values or a bad ``dim``.

    Example:
        >>> ic = in_context_params(1.0, 0.5, 2, temperature=0.3)
        >>> in_context_denoise(ic, tokens, queries)  # (n, 2)
    """
    dim = C.scalar(dim, "dim", low=0, integer=True)
    temperature = C.scalar(temperature, "temperature", low=0)
    dtype = C.common_float_dtype(gamma, xi)
    gamma = C.scalar(gamma, "gamma", low=0, strict=False)
    xi = C.scalar(xi, "xi", low=0)
    s = gamma**2 + xi**2
    a = xi**2 / s
    eye = jnp.eye(dim, dtype=dtype)
    zero = jnp.zeros((dim, dim), dtype)
    w_out = jnp.concatenate([eye, -a * (1 + temperature) * eye], axis=1)
    return InContextParams(temperature * eye / s, a * eye, zero, zero, w_out)


def in_context_denoise(params: InContextParams, prompt, queries, *, block_size=None):
    r"""The residual two-head in-context denoiser of Prop 4.4.

    .. math::

        \hat f[\mu](z) = W_{\mathrm{out}}
        \begin{pmatrix} z + T_{U_1,V_1}[\mu](z) \\ z + T_{U_2,V_2}[\mu](z) \end{pmatrix}.

    With :func:`in_context_params` and a prompt law :math:`\mu = \mu_Z^\tau` of any
    admissible task (two components of equal norm, :math:`\pi_1 \in (0, 1)`), this is
    :math:`(1 - a) z + a \sum_k \beta_k(z) m_k = \mathbb E[X \mid Z = z, \tau]`.

    Args:
        params: an :class:`InContextParams` (any values, e.g. learned ones).
        prompt: a :class:`~gmlib.GaussianMixture` (the infinite prompt :math:`\mu_Z^\tau`)
            or an array (L, d) of noisy tokens (a finite prompt: ordinary softmax attention).
        queries: shape (n, d).
        block_size: passed to :func:`~gmlib.softmax_attention` for a finite prompt.

    Returns:
        array (n, d).
    """
    population = isinstance(prompt, GaussianMixture)
    if not population:
        prompt = C.array(prompt, "prompt", (None, None), desc="(L, d) (tokens), or a GaussianMixture")
    d = prompt.dim if population else prompt.shape[1]
    dtype = C.common_float_dtype(prompt.means if population else prompt, queries, *params)
    queries = C.array(queries, "queries", (None, d), dtype=dtype,
                      desc=f"(n, d) with d = {d} (the token dimension)")
    checked = {}
    for name, val in zip(InContextParams._fields, params):
        shape, desc = ((None, 2 * d), "(D_y, 2d)") if name == "W_out" else ((d, d), "(d, d)")
        checked[name] = C.array(val, f"params.{name}", shape, dtype=dtype, desc=f"{desc} with d = {d}")
    heads = ((checked["U1"], checked["V1"]), (checked["U2"], checked["V2"]))
    res = [queries + _attend(prompt, queries, U, V, block_size).astype(dtype) for U, V in heads]
    return jnp.concatenate(res, axis=-1) @ checked["W_out"].T


def estimate_task(prompt, gamma, xi, *, n_iter: int = 50) -> DenoisingProblem:
    r"""Read a two-component task from a finite prompt by EM: the plug-in in-context denoiser.

    Let :math:`z_1, \dots, z_L` denote the rows of ``prompt``, noisy draws of
    :math:`\sum_k \pi_k \mathcal N(m_k, S)` with :math:`S = (\gamma^2 + \xi^2) I_d` known
    (shared by all tasks, as in Prop 4.4). EM for the weights and the means starts from
    :math:`\hat\pi = (\tfrac12, \tfrac12)`, :math:`\hat m_{1,2} = \bar z \pm \sqrt{\lambda}\, v`
    (:math:`\lambda, v` the top eigenpair of the prompt's covariance) and repeats
    ``n_iter`` times

    .. math::

        r_{ik} = \operatorname{softmax}_k\Big(\log \hat\pi_k
        - \frac{\|z_i - \hat m_k\|^2}{2s}\Big),\qquad
        \hat\pi_k = \frac1L \sum_i r_{ik},\qquad
        \hat m_k = \frac{\sum_i r_{ik} z_i}{\sum_i r_{ik}}.

    The returned problem's :meth:`DenoisingProblem.bayes` is the plug-in denoiser
    :math:`(1 - a) z + a \sum_k \hat\beta_k(z) \hat m_k`: the Bayes formula (eq 10) of the
    estimated task, the reference for what a predictor can read from L tokens. It does
    not use the equal norms of the tasks.

    Args:
        prompt: tokens, shape (L, d), L ≥ 2.
        gamma: :math:`\gamma \ge 0`.
        xi: :math:`\xi > 0`.
        n_iter: EM iterations, a positive int.

    Returns:
        a :class:`DenoisingProblem` with the estimated weights and means (traceable:
        ``jax.vmap`` it over prompts).

    Raises:
        ValueError: naming ``prompt`` (shape, finiteness), ``gamma``, ``xi`` or ``n_iter``.

    Example:
        >>> task = estimate_task(tokens, 1.0, 0.5)
        >>> task.bayes(queries)  # the plug-in denoiser
    """
    n_iter = C.scalar(n_iter, "n_iter", low=0, integer=True)
    prompt = C.array(prompt, "prompt", (None, None), desc="(L, d) (tokens)", min_rows=2)
    # gamma and xi: checked (by name) by the DenoisingProblem built from them below
    weights, means = _em(prompt, jnp.asarray(gamma**2 + xi**2, prompt.dtype), n_iter)
    return DenoisingProblem(weights, means, jnp.asarray(gamma, prompt.dtype), jnp.asarray(xi, prompt.dtype))


@partial(jax.jit, static_argnums=2)
def _em(z, s, n_iter):
    centre = z.mean(0)
    lam, vec = jnp.linalg.eigh(jnp.cov(z.T).reshape(z.shape[1], z.shape[1]))
    step = jnp.sqrt(lam[-1]) * vec[:, -1]
    means = jnp.stack([centre + step, centre - step])
    log_w = jnp.log(jnp.full(2, 0.5, z.dtype))

    def update(_, state):
        log_w, means = state
        logits = log_w - jnp.sum((z[:, None, :] - means) ** 2, -1) / (2 * s)
        r = jax.nn.softmax(logits, axis=1)  # (L, 2)
        total = r.sum(0)
        return jnp.log(total / z.shape[0]), (r.T @ z) / total[:, None]

    log_w, means = jax.lax.fori_loop(0, n_iter, update, (log_w, means))
    return jnp.exp(log_w), means


# ----------------------------------------------------------------------------- iterated denoiser


def iterate(f: Callable, z0, n_steps: int):
    r"""The orbit :math:`z_0, f(z_0), f(f(z_0)), \dots` of a map, by ``lax.scan``.

    Args:
        f: a JAX-traceable map from an array to an array of the same shape and dtype
            (e.g. ``problem.bayes`` on queries (n, d), or ``lambda u: jnp.tanh(lam**2 * u)``).
        z0: the start.
        n_steps: the number of applications, a positive int.

    Returns:
        array of shape ``(n_steps + 1,) + z0.shape``: the whole trajectory, ``z0`` first.
    """
    n_steps = C.scalar(n_steps, "n_steps", low=0, integer=True)
    z0 = C.array(z0, "z0")  # an f that changes the shape or dtype is refused by lax.scan (carry types differ)

    def step(z, _):
        z_next = f(z)
        return z_next, z_next

    _, traj = jax.lax.scan(step, z0, None, length=n_steps)
    return jnp.concatenate([z0[None], traj], axis=0)


def separation(problem: DenoisingProblem):
    r"""The separation :math:`\lambda = \|m_1 - m_2\| / (2\xi)` of Prop 4.3.

    For :math:`\gamma = 0` and balanced weights, the Bayes denoiser is
    :math:`f^\star(z) = c + \delta \tanh(\langle z - c, \delta\rangle/\xi^2)` with
    :math:`c = (m_1 + m_2)/2`, :math:`\delta = (m_1 - m_2)/2`, and on the line of the
    means, :math:`z = c + u \delta`, one step is :math:`u \mapsto \tanh(\lambda^2 u)`.

    Args:
        problem: a :class:`DenoisingProblem` with M = 2.

    Returns:
        a scalar.
    """
    if problem.n_components != 2:  # the first two of more means would pass silently
        raise ValueError(f"`problem` must have M = 2 components; got M = {problem.n_components}")
    return jnp.linalg.norm(problem.means[0] - problem.means[1]) / (2 * problem.xi)


def tanh_fixed_point(lam):
    r"""The non-negative fixed point :math:`u_\lambda` of :math:`u = \tanh(\lambda^2 u)` (Prop 4.3).

    :math:`u_\lambda = 0` for :math:`\lambda \le 1` (weak separation: the iterates
    collapse to the midpoint), and for :math:`\lambda > 1` the unique root in
    :math:`(0, 1)`, found by ``scipy.optimize.brentq`` on
    :math:`G(u) = \tanh(\lambda^2 u)/u - 1` over :math:`[0, 1]` (:math:`G(0^+) = \lambda^2 - 1 > 0`,
    :math:`G(1) \le 0`), so the bracket holds however close :math:`\lambda` is to 1.
    The stable limits of the iterated denoiser are :math:`c \pm u_\lambda \delta`.

    A host function (numpy in, numpy out): not traceable by ``jit``.

    Args:
        lam: :math:`\lambda \ge 0`, a scalar or an array.

    Returns:
        numpy array (float64) of the shape of ``lam``.

    Raises:
        ValueError: for negative or non-finite ``lam``.
    """
    from scipy.optimize import brentq

    lam = np.asarray(lam)
    if lam.dtype.kind not in "biuf" or not np.all(np.isfinite(lam)) or np.any(lam < 0):
        raise ValueError(f"`lam` must be a finite non-negative real number or array; got {lam!r}")
    lam = lam.astype(np.float64)

    def root(l2):
        def g(u):
            return l2 - 1.0 if u == 0.0 else np.tanh(l2 * u) / u - 1.0

        if g(1.0) >= 0.0:  # tanh(l2) rounds to 1: the root is 1 to machine precision
            return 1.0
        return brentq(g, 0.0, 1.0, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)

    out = np.array([root(l * l) if l > 1.0 else 0.0 for l in lam.ravel()])
    return out.reshape(lam.shape)
