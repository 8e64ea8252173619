r"""The LDA model and the head parameters θ (paper §3, eqs 4–5 and 12); see :mod:`gmlib.lda`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib import _random
from gmlib._dtypes import common_float_dtype
from gmlib._pytree import unchecked, validated_pytree
from gmlib.heads import Batch
from gmlib.mixture import GaussianMixture
from gmlib.quadrature import gauss_hermite

# ----------------------------------------------------------------------------- the problem


@validated_pytree
@dataclass(frozen=True, eq=False)
class LDAProblem:
    r"""The LDA model :math:`X \mid Y = c \sim \mathcal N(m_c, \Gamma)`, :math:`P(Y = 1) = \pi_+` (eq 4).

    A frozen JAX pytree (its four leaves are arrays), so it passes through
    ``jit``, ``vmap`` and ``grad``.

    Args:
        mean_pos: :math:`m_1`, shape (d,).
        mean_neg: :math:`m_{-1}`, shape (d,).
        cov: :math:`\Gamma`, shape (d, d), symmetric positive definite.
        p_pos: :math:`\pi_+ = P(Y = 1)`, a scalar in (0, 1).

    Raises:
        ValueError: naming the argument, for means of different dimensions or
            wrong shapes, non-finite values, a ``cov`` that is not symmetric
            positive definite, or ``p_pos`` outside (0, 1).

    Example:
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> w_star, b_star = c1.bayes_params()  # w* = m_1 - m_-1, b* = log(0.6 / 0.4)
        >>> w_star.tolist(), round(float(b_star), 6)
        ([1.0, -1.0], 0.405465)
    """

    mean_pos: jax.Array
    mean_neg: jax.Array
    cov: jax.Array
    p_pos: jax.Array

    def __init__(self, mean_pos, mean_neg, cov, p_pos):
        dtype = common_float_dtype(mean_pos, mean_neg, cov, p_pos)
        mean_pos = C.array(mean_pos, "mean_pos", ("d",), dtype=dtype)
        dims = {"d": mean_pos.shape[0]}
        mean_neg = C.array(mean_neg, "mean_neg", ("d",), dims=dims, dtype=dtype)
        cov = C.array(cov, "cov", ("d", "d"), dims=dims, dtype=dtype, psd="definite")
        p_pos = C.array(p_pos, "p_pos", (), dtype=dtype, low=0, high=1)
        for name, val in (("mean_pos", mean_pos), ("mean_neg", mean_neg), ("cov", cov), ("p_pos", p_pos)):
            object.__setattr__(self, name, val)

    @property
    def dim(self) -> int:
        """d, the dimension of X."""
        return self.mean_pos.shape[0]

    @property
    def dtype(self):
        """The floating dtype of the parameters."""
        return self.mean_pos.dtype

    @property
    def s0(self):
        r""":math:`s_0 = \log(\pi_+/(1-\pi_+))`, the prior log-odds (eq 7)."""
        return jnp.log(self.p_pos) - jnp.log1p(-self.p_pos)

    def bayes_params(self):
        r"""The Bayes score's coefficients :math:`(w^\star, b^\star)` (eq 5).

        Returns:
            ``(w_star, b_star)``: shapes (d,) and ().
        """
        w = jnp.linalg.solve(self.cov, self.mean_pos - self.mean_neg)
        # m1^T G^-1 m1 - m0^T G^-1 m0 = (m1 + m0)^T G^-1 (m1 - m0)
        return w, -0.5 * (self.mean_pos + self.mean_neg) @ w + self.s0

    def bayes(self, x):
        r"""The Bayes score :math:`f^\star(x) = w^{\star\top}x + b^\star = \log\frac{P(Y=1\mid x)}{P(Y=-1\mid x)}` (eq 5).

        Args:
            x: points, shape (n, d).

        Returns:
            array (n,).

        Raises:
            ValueError: naming ``x``, for a wrong shape or non-finite values.
        """
        x = C.array(x, "x", ("n", "d"), dims={"d": self.dim}, dtype=self.dtype)
        w, b = self.bayes_params()
        return x @ w + b

    def bayes_risk(self, *, n_nodes: int = 200):
        r"""The Bayes risk :math:`\mathcal R^\star = \mathbb E \log(1 + e^{-Y f^\star(X)})`.

        Under class c the Bayes score is Gaussian,
        :math:`f^\star(X) \sim \mathcal N(w^{\star\top} m_c + b^\star, \Delta^2)` with
        :math:`\Delta^2 = w^{\star\top}\Gamma w^\star` (the squared Mahalanobis distance of
        the means), so :math:`\mathcal R^\star` is a sum of two one-dimensional Gaussian
        integrals, computed by Gauss–Hermite with ``n_nodes`` nodes (error below
        1e-13 for :math:`\Delta \le 3` at the default). Independent of :func:`risk`'s rule.

        Returns:
            a scalar array.

        Raises:
            ValueError: naming ``n_nodes`` when not a positive int (at most 256).
        """
        x, wt = gauss_hermite(n_nodes=n_nodes, dim=1, dtype=self.dtype)
        w, b = self.bayes_params()
        x = x[:, 0] * jnp.sqrt(w @ self.cov @ w)
        pos = wt @ jax.nn.softplus(-(w @ self.mean_pos + b + x))
        neg = wt @ jax.nn.softplus(w @ self.mean_neg + b + x)
        return self.p_pos * pos + (1 - self.p_pos) * neg

    @property
    def prompt(self) -> GaussianMixture:
        r"""The infinite prompt, the law of the tokens :math:`(X, Y) \in \mathbb R^{d+1}`, a :class:`~gmlib.GaussianMixture`.

        Component 0 is the class :math:`+1` (weight :math:`\pi_+`, mean :math:`(m_1, 1)`),
        component 1 the class :math:`-1` (weight :math:`1-\pi_+`, mean :math:`(m_{-1}, -1)`);
        both have the singular covariance :math:`\mathrm{blockdiag}(\Gamma, 0)`.
        ``apply_heads(to_attention(theta), problem.prompt, queries)`` is the head's score.
        """
        d = self.dim
        one = jnp.ones((1,), self.dtype)
        means = jnp.stack([jnp.concatenate([self.mean_pos, one]), jnp.concatenate([self.mean_neg, -one])])
        cov = jnp.zeros((d + 1, d + 1), self.dtype).at[:d, :d].set(self.cov)
        return unchecked(GaussianMixture, jnp.stack([self.p_pos, 1 - self.p_pos]), means, jnp.stack([cov, cov]))

    def sample(self, *, key, n_samples: int):
        r"""Draw ``n_samples`` i.i.d. pairs :math:`(X, Y)`.

        Args:
            key: a ``jax.random`` key.
            n_samples: the number of pairs, a positive int.

        Returns:
            ``(x, y)``: shapes (n_samples, d) and (n_samples,), with ``y`` in {-1.0, +1.0}
            (floating).

        Raises:
            ValueError: naming ``n_samples`` when not a positive int.
        """
        return _sample(self, key, C.scalar(n_samples, "n_samples", low=0, integer=True))


@partial(jax.jit, static_argnums=2)
def _sample(problem, key, n):
    k_y, k_x = jax.random.split(key)
    y = jnp.where(jax.random.bernoulli(k_y, problem.p_pos, (n,)), 1.0, -1.0).astype(problem.dtype)
    eps = _random.normal(k_x, (n, problem.dim), problem.dtype)
    means = jnp.where(y[:, None] > 0, problem.mean_pos[None, :], problem.mean_neg[None, :])
    return means + eps @ jnp.linalg.cholesky(problem.cov).T, y


# ----------------------------------------------------------------------------- prompts of labelled tokens


@dataclass(frozen=True)
class _PromptDraw:
    """The ``sample`` of :func:`prompt_sampler` (hashable by value: its arrays come in a ``Partial``)."""

    n_queries: int

    def __call__(self, mean_pos, mean_neg, root, p_pos, key, batch_size: int, prompt_length: int) -> Batch:
        dtype = mean_pos.dtype
        k_y, k_x = jax.random.split(key)
        n, d = prompt_length + self.n_queries, mean_pos.shape[0]
        y = jnp.where(_random.uniform(k_y, (batch_size, n), dtype) < p_pos, 1.0, -1.0).astype(dtype)
        x = jnp.where(y[..., None] > 0, mean_pos, mean_neg) + _random.normal(k_x, (batch_size, n, d), dtype) @ root.T
        prompt = jnp.concatenate([x[:, :prompt_length], y[:, :prompt_length, None]], axis=-1)
        queries = jnp.concatenate([x[:, prompt_length:], jnp.zeros((batch_size, self.n_queries, 1), dtype)], axis=-1)
        return Batch(prompt, queries, y[:, prompt_length:, None])


def prompt_sampler(problem: LDAProblem, *, n_queries: int = 1):
    r"""Finite prompts of labelled tokens :math:`(X, Y)` for in-context LDA (chapter 7).

    Every prompt holds L i.i.d. tokens :math:`(X_i, Y_i) \in \mathbb R^{d+1}` of ``problem``
    (:math:`P(Y = 1) = \pi_+`, :math:`X \mid Y = c \sim \mathcal N(m_c, \Gamma)`, eq 4), and
    Q more pairs give the queries :math:`(x, 0)` and their targets, the labels :math:`y`.
    The task is the same for every prompt; the prompts differ. The empirical measure of
    the tokens tends to :attr:`LDAProblem.prompt` as L grows.

    Args:
        problem: an :class:`LDAProblem` (the draws are in its dtype).
        n_queries: Q, queries per prompt, a positive int.

    Returns:
        ``sample(key, batch_size, prompt_length) -> gmlib.Batch`` with ``prompt`` (B, L, d+1),
        ``queries`` (B, Q, d+1) and ``targets`` (B, Q, 1) in {-1, +1}. It is a
        ``jax.tree_util.Partial`` holding the problem's arrays: passed to
        :func:`gmlib.optimize`, samplers of different problems share one compilation.

    Raises:
        ValueError: naming ``n_queries`` when not a positive int.

    Example:
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> sample = lda.prompt_sampler(c1, n_queries=8)
        >>> batch = sample(jax.random.key(0), 64, 16)  # 64 prompts of 16 tokens (x, y)
        >>> batch.prompt.shape, batch.queries.shape
        ((64, 16, 3), (64, 8, 3))
    """
    n_queries = C.scalar(n_queries, "n_queries", low=0, integer=True)
    root = jnp.asarray(np.linalg.cholesky(np.asarray(problem.cov, np.float64)), problem.dtype)
    return jax.tree_util.Partial(_PromptDraw(n_queries), problem.mean_pos, problem.mean_neg, root, problem.p_pos)


# ----------------------------------------------------------------------------- head parameters


@validated_pytree
@dataclass(frozen=True, eq=False)
class HeadParams:
    r"""The head parameters :math:`\theta = (U_{11}, u_{12}, v_{21}, v_{22})` that act at a query :math:`(x, 0)`.

    A frozen pytree: ``jax.grad`` of a function of a :class:`HeadParams` returns a
    :class:`HeadParams`, and ``jax.flatten_util.ravel_pytree`` turns one into a
    vector of length :math:`d^2 + 2d + 1` (the order: ``U11`` row-major, ``u12``,
    ``v21``, ``v22``). Blocks of eq 12: :math:`U^\top = [[U_{11}, u_{12}], [u_{21}^\top, u_{22}]]`,
    :math:`V = [[V_{11}, v_{12}], [v_{21}^\top, v_{22}]]`; the other blocks do not
    act on the prediction (see :func:`to_attention`, which builds the :class:`gmlib.Heads`).

    Args:
        U11: shape (d, d).
        u12: shape (d,).
        v21: shape (d,).
        v22: shape ().
    """

    U11: jax.Array
    u12: jax.Array
    v21: jax.Array
    v22: jax.Array

    def __init__(self, U11, u12, v21, v22):
        dtype = common_float_dtype(U11, u12, v21, v22)
        for name, val in (("U11", U11), ("u12", u12), ("v21", v21), ("v22", v22)):
            object.__setattr__(self, name, C.array(val, name, dtype=dtype, finite=False))

    @classmethod
    def zeros(cls, d: int, dtype=None) -> HeadParams:
        """The origin :math:`\\theta = 0` in dimension ``d``."""
        dtype = C.check_float_dtype(dtype)
        return cls(jnp.zeros((d, d), dtype), jnp.zeros((d,), dtype), jnp.zeros((d,), dtype), jnp.zeros((), dtype))

    @classmethod
    def normal(cls, d: int, *, key, scale=1.0, dtype=None) -> HeadParams:
        """Every entry i.i.d. :math:`\\mathcal N(0, \\mathrm{scale}^2)` (the initialization of Figure 4).

        Example:
            >>> theta0 = lda.HeadParams.normal(20, key=jax.random.key(0))
            >>> theta0.U11.shape, theta0.u12.shape, theta0.v22.shape
            ((20, 20), (20,), ())
        """
        dtype = C.check_float_dtype(dtype)
        scale = C.array(scale, "scale", (), dtype=dtype)
        k = jax.random.split(key, 4)
        shapes = ((d, d), (d,), (d,), ())
        return cls(*(scale * _random.normal(kk, shape, dtype) for kk, shape in zip(k, shapes)))


_THETA_SHAPES = (("U11", ("d", "d")), ("u12", ("d",)), ("v21", ("d",)), ("v22", ()))


def _check_theta(problem, theta, arg: str = "theta"):
    """Check the leaves of ``theta`` (shapes against ``problem.dim``, or U11's size without a problem; finite)."""
    d = (theta.U11.shape or (0,))[0] if problem is None else problem.dim  # HeadParams made the leaves arrays
    for name, shape in _THETA_SHAPES:
        C.array(getattr(theta, name), f"{arg}.{name}", shape, dims={"d": d}, finite=False)
    C.check_finite(**{f"{arg}.{name}": getattr(theta, name) for name, _ in _THETA_SHAPES})
    return theta


def _cast(problem, theta):
    """Bring problem and theta to one floating dtype (the wider), as strict promotion requires."""
    dtype = common_float_dtype(problem.mean_pos, theta.U11)
    return problem.astype(dtype), theta.astype(dtype)
