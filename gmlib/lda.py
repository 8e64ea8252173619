r"""Linear discriminant analysis with one softmax head (paper §3, Appendix B).

Data (eq 4): :math:`Y \in \{-1, +1\}` with :math:`P(Y = 1) = \pi_+` and
:math:`X \mid Y = c \sim \mathcal N(m_c, \Gamma)` in :math:`\mathbb R^d`. The Bayes
score (eq 5) is affine, :math:`f^\star(x) = w^{\star\top} x + b^\star` with

.. math::

    w^\star = \Gamma^{-1}(m_1 - m_{-1}), \qquad
    b^\star = -\tfrac12\big(m_1^\top\Gamma^{-1}m_1 - m_{-1}^\top\Gamma^{-1}m_{-1}\big)
              + \log\frac{\pi_+}{1-\pi_+}.

The prompt holds the tokens :math:`(X, Y) \in \mathbb R^{d+1}`, the query is
:math:`(x, 0)` and the prediction is the last output coordinate of one softmax
head. With the blocks of eq 12 (the paper writes the blocks of :math:`U^\top`),
only :math:`\theta = (U_{11}, u_{12}, v_{21}, v_{22})` matter and (eqs 6–7)

.. math::

    f_\theta(x) = w^\top x + b + r\,\sigma(s_0 + s^\top x), \qquad
    \begin{aligned}
    w &= U_{11}\Gamma v_{21}, & b &= v_{21}^\top m_{-1} - v_{22},\\
    r &= v_{21}^\top(m_1 - m_{-1}) + 2 v_{22}, & s &= 2u_{12} + U_{11}(m_1 - m_{-1}),
    \end{aligned}

with :math:`s_0 = \log(\pi_+/(1-\pi_+))`. The population logistic risk
:math:`\mathcal R(\theta) = \mathbb E\log(1 + e^{-Y f_\theta(X)})` (eq 8) depends on X,
in each class, only through the two projections :math:`(w^\top X, s^\top X)`: it is
computed by a two-dimensional rule per class that resolves the gate's step however
steep it is, with derivatives of every order that stay smooth where those
projections are rank-deficient (:math:`\theta = 0`, :math:`s = 0`,
:math:`s \parallel w`); see :func:`risk`.

Training (Thms 3.5–3.6, Figures 1, 4, 5): :func:`gradient_descent` (population
gradient descent on :func:`risk`) and :func:`sgd` (stochastic gradients on sampled
minibatches), both ``lax.scan`` loops around an optax optimizer, run in chunks by
:func:`gmlib.run_chunks` so that long runs can show a progress bar; both return a
:class:`gmlib.TrainResult`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gmlib import _checks as C
from gmlib import _random
from gmlib._loop import TrainResult, run_chunks
from gmlib._pytree import unchecked, validated_pytree
from gmlib.mixture import GaussianMixture
from gmlib.quadrature import gauss_hermite

__all__ = [
    "LDAProblem",
    "HeadParams",
    "to_attention",
    "effective",
    "predict",
    "risk",
    "effective_risk",
    "bayes_head",
    "gradient_descent",
    "sgd",
]


#: The default number of quadrature points of :func:`risk` along the gate's direction.
DEFAULT_NODES = 96

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
        >>> c1 = LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> w_star, b_star = c1.bayes_params()
    """

    mean_pos: jax.Array
    mean_neg: jax.Array
    cov: jax.Array
    p_pos: jax.Array

    def __init__(self, mean_pos, mean_neg, cov, p_pos):
        dtype = C.common_float_dtype(mean_pos, mean_neg, cov, p_pos)
        mean_pos = C.array(mean_pos, "mean_pos", (None,), dtype=dtype, desc="(d,)")
        d = mean_pos.shape[0]
        mean_neg = C.array(mean_neg, "mean_neg", (d,), dtype=dtype, desc=f"(d,) = ({d},), the dimension of `mean_pos`")
        cov = C.array(cov, "cov", (d, d), dtype=dtype, desc=f"(d, d) = ({d}, {d})")
        p_pos = C.array(p_pos, "p_pos", (), dtype=dtype, desc="() (a scalar)", low=0, high=1)
        C.check_psd(cov, "cov", definite=True)
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

    def bayes_score(self, x):
        r"""The Bayes score :math:`f^\star(x) = w^{\star\top}x + b^\star = \log\frac{P(Y=1\mid x)}{P(Y=-1\mid x)}`.

        Args:
            x: points, shape (n, d).

        Returns:
            array (n,).
        """
        x = _check_points(self, x)
        w, b = self.bayes_params()
        return x @ w + b

    def bayes_risk(self, n_nodes: int = 200):
        r"""The Bayes risk :math:`\mathcal R^\star = \mathbb E \log(1 + e^{-Y f^\star(X)})`.

        Under class c the Bayes score is Gaussian,
        :math:`f^\star(X) \sim \mathcal N(w^{\star\top} m_c + b^\star, \Delta^2)` with
        :math:`\Delta^2 = w^{\star\top}\Gamma w^\star` (the squared Mahalanobis distance of
        the means), so :math:`\mathcal R^\star` is a sum of two one-dimensional Gaussian
        integrals, computed by Gauss–Hermite with ``n_nodes`` nodes (error below
        1e-13 for :math:`\Delta \le 3` at the default). Independent of :func:`risk`'s rule.

        Returns:
            a scalar array.
        """
        x, wt = gauss_hermite(n_nodes, 1, self.dtype)
        w, b = self.bayes_params()
        x = x[:, 0] * jnp.sqrt(w @ self.cov @ w)
        pos = wt @ jax.nn.softplus(-(w @ self.mean_pos + b + x))
        neg = wt @ jax.nn.softplus(w @ self.mean_neg + b + x)
        return self.p_pos * pos + (1 - self.p_pos) * neg

    def tokens(self) -> GaussianMixture:
        r"""The law of the tokens :math:`(X, Y) \in \mathbb R^{d+1}`, a two-component :class:`~gmlib.GaussianMixture`.

        Component 0 is the class :math:`+1` (weight :math:`\pi_+`, mean :math:`(m_1, 1)`),
        component 1 the class :math:`-1` (weight :math:`1-\pi_+`, mean :math:`(m_{-1}, -1)`);
        both have the singular covariance :math:`\mathrm{blockdiag}(\Gamma, 0)`.
        """
        d = self.dim
        one = jnp.ones((1,), self.dtype)
        means = jnp.stack([jnp.concatenate([self.mean_pos, one]), jnp.concatenate([self.mean_neg, -one])])
        cov = jnp.zeros((d + 1, d + 1), self.dtype).at[:d, :d].set(self.cov)
        return unchecked(GaussianMixture, jnp.stack([self.p_pos, 1 - self.p_pos]), means, jnp.stack([cov, cov]))

    def sample(self, key, n: int):
        r"""Draw ``n`` i.i.d. pairs :math:`(X, Y)`.

        Args:
            key: a ``jax.random`` key.
            n: the number of pairs (a Python int).

        Returns:
            ``(x, y)``: shapes (n, d) and (n,), with ``y`` in {-1.0, +1.0} (floating).
        """
        return _sample(self, key, n)


@partial(jax.jit, static_argnums=2)
def _sample(problem, key, n):
    k_y, k_x = jax.random.split(key)
    y = jnp.where(jax.random.bernoulli(k_y, problem.p_pos, (n,)), 1.0, -1.0).astype(problem.dtype)
    eps = _random.normal(k_x, (n, problem.dim), problem.dtype)
    means = jnp.where(y[:, None] > 0, problem.mean_pos[None, :], problem.mean_neg[None, :])
    return means + eps @ jnp.linalg.cholesky(problem.cov).T, y


def _check_points(problem, x):
    return C.array(x, "x", (None, problem.dim), dtype=problem.dtype, desc=f"(n, d) with d = {problem.dim}")


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
    act on the prediction (see :func:`to_attention`).

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
        dtype = C.common_float_dtype(U11, u12, v21, v22)
        for name, val in (("U11", U11), ("u12", u12), ("v21", v21), ("v22", v22)):
            object.__setattr__(self, name, C.array(val, name, dtype=dtype, finite=False))

    @classmethod
    def zeros(cls, d: int, dtype=None) -> "HeadParams":
        """The origin :math:`\\theta = 0` in dimension ``d``."""
        dtype = C.check_float_dtype(dtype)
        return cls(jnp.zeros((d, d), dtype), jnp.zeros((d,), dtype), jnp.zeros((d,), dtype), jnp.zeros((), dtype))

    @classmethod
    def normal(cls, key, d: int, scale=1.0, dtype=None) -> "HeadParams":
        """Every entry i.i.d. :math:`\\mathcal N(0, \\mathrm{scale}^2)` (the initialization of Figure 4)."""
        dtype = C.check_float_dtype(dtype)
        scale = C.array(scale, "scale", (), dtype=dtype, desc="() (a scalar)")
        k = jax.random.split(key, 4)
        shapes = ((d, d), (d,), (d,), ())
        return cls(*(scale * _random.normal(kk, shape, dtype) for kk, shape in zip(k, shapes)))


def _check_theta(problem, theta, arg: str = "theta"):
    """Check the leaves of ``theta`` against ``problem.dim`` (or, with ``problem=None``, against U11's size)."""
    d = (theta.U11.shape or (0,))[0] if problem is None else problem.dim  # HeadParams made the leaves arrays
    leaves = [C.array(getattr(theta, name), f"{arg}.{name}", shape, desc=f"{shape} for d = {d}")
              for name, shape in (("U11", (d, d)), ("u12", (d,)), ("v21", (d,)), ("v22", ()))]
    return unchecked(HeadParams, *leaves)


def _cast(problem, theta):
    """Bring problem and theta to one floating dtype (the wider), as strict promotion requires."""
    dtype = C.common_float_dtype(problem.mean_pos, theta.U11)
    cast = lambda a: a.astype(dtype)  # noqa: E731
    return jax.tree.map(cast, problem), jax.tree.map(cast, theta)


# ----------------------------------------------------------------------------- representation


def to_attention(theta):
    r"""The full :math:`(d+1)\times(d+1)` matrices :math:`(U, V)` of the head :math:`\theta` (eq 12).

    The paper writes the blocks of :math:`U^\top`:
    :math:`U^\top = \begin{pmatrix} U_{11} & u_{12} \\ 0 & 0 \end{pmatrix}`, so
    :math:`U = \begin{pmatrix} U_{11}^\top & 0 \\ u_{12}^\top & 0 \end{pmatrix}`, and
    :math:`V = \begin{pmatrix} 0 & 0 \\ v_{21}^\top & v_{22} \end{pmatrix}`; the blocks that do
    not act at a query :math:`(x, 0)` are set to zero. With these,
    ``population_attention(problem.tokens(), q, U, V)[:, -1]`` is :math:`f_\theta(x)` for
    the queries ``q = [(x, 0)]``, and ``softmax_attention`` on sampled tokens approaches it.

    Args:
        theta: a :class:`HeadParams` of dimension d.

    Returns:
        ``(U, V)``, both of shape (d+1, d+1).

    Raises:
        ValueError: naming the leaf, for leaves whose shapes do not fit one d or non-finite values.
    """
    _check_theta(None, theta)
    d = theta.U11.shape[0]
    dtype = theta.U11.dtype
    U = jnp.zeros((d + 1, d + 1), dtype).at[:d, :d].set(theta.U11.T).at[d, :d].set(theta.u12)
    V = jnp.zeros((d + 1, d + 1), dtype).at[d, :d].set(theta.v21).at[d, d].set(theta.v22)
    return U, V


def _effective(problem, theta):
    dm = problem.mean_pos - problem.mean_neg
    w = theta.U11 @ (problem.cov @ theta.v21)
    b = theta.v21 @ problem.mean_neg - theta.v22
    r = theta.v21 @ dm + 2 * theta.v22
    s = 2 * theta.u12 + theta.U11 @ dm
    return w, b, r, s


def effective(problem, theta):
    r"""The effective parameters :math:`\Phi(\theta) = (w, b, r, s)` (eq 7).

    .. math::

        w = U_{11}\Gamma v_{21},\quad b = v_{21}^\top m_{-1} - v_{22},\quad
        r = v_{21}^\top(m_1 - m_{-1}) + 2v_{22},\quad s = 2u_{12} + U_{11}(m_1 - m_{-1}).

    Args:
        problem: an :class:`LDAProblem` of dimension d.
        theta: a :class:`HeadParams` of dimension d.

    Returns:
        ``(w, b, r, s)``: shapes (d,), (), (), (d,).

    Raises:
        ValueError: for a ``theta`` whose shapes do not match ``problem``, or non-finite values.
    """
    problem, theta = _cast(problem, _check_theta(problem, theta))
    return _effective(problem, theta)


def _predict(problem, theta, x):
    w, b, r, s = _effective(problem, theta)
    return x @ w + b + r * jax.nn.sigmoid(problem.s0 + x @ s)


def predict(problem, theta, x):
    r"""The head's score :math:`f_\theta(x) = w^\top x + b + r\,\sigma(s_0 + s^\top x)` (eq 6).

    The last output coordinate of softmax attention at the query :math:`(x, 0)` on
    the infinite prompt of :math:`(X, Y)` tokens (Prop 2.1 applied to
    :meth:`LDAProblem.tokens`).

    Args:
        problem: an :class:`LDAProblem` of dimension d.
        theta: a :class:`HeadParams`.
        x: queries, shape (n, d).

    Returns:
        array (n,).

    Example:
        >>> predict(c1, bayes_head(c1, "theta1"), x)  # equals c1.bayes_score(x)
    """
    problem, theta = _cast(problem, _check_theta(problem, theta))
    x = _check_points(problem, x)
    return _predict(problem, theta, x)


# ----------------------------------------------------------------------------- quadrature with smooth derivatives

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


def _class_rule(mu, cov, p, n_nodes: int):
    r"""Points (N, 2) and weights (N,) for :math:`\mathbb E[\varphi(Y)]`, :math:`Y \sim \mathcal N(\mu, C)`.

    For the class losses of :func:`risk`, with :math:`Y = (w^\top X, s^\top X)` and
    ``p`` = (b, r, s0): the gate :math:`\sigma(s_0 + y_2)` steps at :math:`y_2 = -s_0` over a
    length 1, the softplus kinks where :math:`y_1 + b + r\sigma(s_0 + y_2) = 0`. Write
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


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _expect(fn, n_nodes, mu, cov, p):
    r""":math:`\mathbb E[\varphi(Y; p)]`, :math:`Y \sim \mathcal N(\mu, C)` in :math:`\mathbb R^2`, by :func:`_class_rule`.

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
    points, weights = _class_rule(mu, cov, p, n_nodes)
    return jax.tree.map(lambda v: jnp.tensordot(weights, v, axes=1), fn(points, p))


def _derivatives(fn):
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


@_expect.defjvp
def _expect_jvp(fn, n_nodes, primals, tangents):
    mu, cov, p = primals
    dmu, dcov, dp = tangents
    value = _expect(fn, n_nodes, mu, cov, p)
    gy, hy, gp = _expect(_derivatives(fn), n_nodes, mu, cov, p)
    # The tangent is an explicit contraction of primal coefficients with the tangents:
    # linear (so reverse mode can transpose it) and never differentiated through the rule.
    tangent = jax.tree.map(
        lambda a, h, g: a @ dmu + 0.5 * jnp.tensordot(h, dcov, axes=2) + g @ dp, gy, hy, gp
    )
    return value, tangent


def _class_loss(y, p):
    """softplus(-c f): y = (w^T x, s^T x), p = (b, r, s0, c) with the class c = ±1."""
    f = y[:, 0] + p[0] + p[1] * jax.nn.sigmoid(p[2] + y[:, 1])
    return jax.nn.softplus(-p[3] * f)


def _risk(problem, theta, n_nodes: int):
    return _effective_risk(problem, *_effective(problem, theta), n_nodes)


def _effective_risk(problem, w, b, r, s, n_nodes: int):
    A = jnp.stack([w, s])
    cov = A @ problem.cov @ A.T
    # both classes in one (vmapped) expectation: one rule in the program, half the compilation
    mu = jnp.stack([A @ problem.mean_pos, A @ problem.mean_neg])
    one = jnp.ones((), b.dtype)
    p = jnp.stack([jnp.stack([b, r, problem.s0, one]), jnp.stack([b, r, problem.s0, -one])])
    pos, neg = jax.vmap(lambda m, q: _expect(_class_loss, n_nodes, m, cov, q))(mu, p)
    return problem.p_pos * pos + (1 - problem.p_pos) * neg


def risk(problem, theta, n_nodes: int = DEFAULT_NODES):
    r"""The population logistic risk :math:`\mathcal R(\theta) = \mathbb E \log(1 + e^{-Y f_\theta(X)})` (eq 8).

    In class c, :math:`f_\theta(X)` depends on X only through the pair
    :math:`(w^\top X, s^\top X) \sim \mathcal N(A m_c, A\Gamma A^\top)` with
    :math:`A = [w, s]^\top`, so

    .. math::

        \mathcal R(\theta) = \sum_{c = \pm 1} \pi_c\,
            \mathbb E\,\mathrm{softplus}\big(-c\,[y_1 + b + r\,\sigma(s_0 + y_2)]\big),
        \qquad y \sim \mathcal N(A m_c, A\Gamma A^\top).

    The gate :math:`\sigma(s_0 + y_2)` steps over a length 1 in :math:`y_2`, whose
    standard deviation :math:`\sqrt{s^\top\Gamma s}` can be large (the minimizers of
    Figure 1 have :math:`|s| \approx 28`), where a Gauss–Hermite rule converges slowly.
    So each class is integrated in the conditional form: :math:`y_2` on ``n_nodes``
    points graded at the gate's step, and, given :math:`y_2`, the Gaussian
    :math:`y_1` on ``n_nodes // 2`` points graded at the softplus's kink (midpoint rules
    under a sinh-type change of variables, exponentially convergent whatever the
    steepness). Derivatives (``jax.grad``, ``jax.hessian``, any order) come from Stein's
    identity, not from the rule, so they are smooth and exact up to quadrature error
    also where :math:`A\Gamma A^\top` is singular: at :math:`\theta = 0`, on
    :math:`\Theta_2` (:math:`s = 0`) and where :math:`s \parallel w`.

    Accuracy (float64, tested against adaptive quadrature): at the default 96 nodes
    the error is at round-off (about 1e-15) for :math:`\sqrt{s^\top\Gamma s}` from 0 to
    300 at least, with :math:`\sqrt{w^\top\Gamma w}` of order one; 64 nodes give about
    1e-10. The rule assumes the two transitions are not both steep along one direction
    (large :math:`|w|` with :math:`s \parallel w`): there raise ``n_nodes``.

    Args:
        problem: an :class:`LDAProblem` of dimension d.
        theta: a :class:`HeadParams` of dimension d.
        n_nodes: points along the gate's direction (half as many across it).

    Returns:
        a scalar array.

    Raises:
        ValueError: for mismatched shapes, non-finite values or a bad ``n_nodes``.

    Example:
        >>> risk(c1, bayes_head(c1, "theta2"))  # equals c1.bayes_risk() to ~1e-15
    """
    n_nodes = C.scalar(n_nodes, "n_nodes", low=0, integer=True)
    problem, theta = _cast(problem, _check_theta(problem, theta))
    return _risk_jit(problem, theta, n_nodes)


_risk_jit = jax.jit(_risk, static_argnums=2)


def effective_risk(problem, w, b, r, s, n_nodes: int = DEFAULT_NODES):
    r"""The risk in effective coordinates, :math:`\widetilde{\mathcal R}(w, b, r, s)` (eq 8), so that :math:`\mathcal R = \widetilde{\mathcal R}\circ\Phi`.

    The population logistic risk of :math:`g(x) = w^\top x + b + r\,\sigma(s_0 + s^\top x)`,
    by the same quadrature (and smooth derivatives) as :func:`risk`.

    Args:
        problem: an :class:`LDAProblem` of dimension d.
        w: shape (d,).
        b: shape ().
        r: shape ().
        s: shape (d,).
        n_nodes: as in :func:`risk`.

    Returns:
        a scalar array.

    Raises:
        ValueError: for wrong shapes or non-finite values.
    """
    n_nodes = C.scalar(n_nodes, "n_nodes", low=0, integer=True)
    d = problem.dim
    dtype = C.common_float_dtype(problem.mean_pos, w, b, r, s)
    args = [C.array(val, name, shape, dtype=dtype, desc=str(shape) + f" for d = {d}")
            for name, val, shape in (("w", w, (d,)), ("b", b, ()), ("r", r, ()), ("s", s, (d,)))]
    return _effective_risk_jit(jax.tree.map(lambda a: a.astype(dtype), problem), *args, n_nodes)


_effective_risk_jit = jax.jit(_effective_risk, static_argnums=5)


# ----------------------------------------------------------------------------- Bayes-optimal heads


def bayes_head(problem, family: str = "theta1") -> HeadParams:
    r"""An explicit Bayes-optimal head, :math:`f_\theta = f^\star` (Lemma B.3, Thm 3.3).

    ``family="theta1"`` returns a point of :math:`\Theta_1 = \Phi^{-1}(\mathcal E_1)`
    with :math:`s \ne 0` (the regular component: :math:`r = 0`, the sigmoid is
    switched off): :math:`v_{21}^\top \tfrac{m_1 + m_{-1}}{2} = b^\star`,
    :math:`v_{22} = -\tfrac12 v_{21}^\top(m_1 - m_{-1})`.
    ``family="theta2"`` returns a point of :math:`\Theta_2 = \Phi^{-1}(\mathcal E_2)`
    with :math:`r \ne 0` (:math:`s = 0`: the sigmoid is the constant :math:`\pi_+`,
    absorbed in the bias): :math:`u_{12} = -\tfrac12 U_{11}(m_1 - m_{-1})` and
    :math:`v_{21}^\top\bar m + (2\pi_+ - 1)v_{22} = b^\star` with
    :math:`\bar m = (1-\pi_+)m_{-1} + \pi_+ m_1`. For :math:`\pi_+ \ne 1/2` this is the
    paper's construction (:math:`U_{11} = I`, :math:`v_{21} = \Gamma^{-1}w^\star`,
    :math:`v_{22} = (b^\star - v_{21}^\top\bar m)/(2\pi_+ - 1)`); for :math:`\pi_+ = 1/2`
    the :math:`v_{22}` term drops out of :math:`f_\theta`, so :math:`v_{21}` must carry
    the bias (:math:`v_{21} = b^\star \bar m/\|\bar m\|^2`, or any non-zero
    :math:`v_{21} \perp \bar m` when :math:`b^\star = 0`) and :math:`v_{22}` is chosen to
    make :math:`r = 1`. In both families :math:`U_{11} = I + (w^\star - a)a^\top/\|a\|^2`
    with :math:`a = \Gamma v_{21}`, so that :math:`w = U_{11} a = w^\star`.

    Computed on the host in float64, returned in the problem's dtype.

    Args:
        problem: an :class:`LDAProblem` with concrete values.
        family: ``"theta1"`` or ``"theta2"``.

    Returns:
        a :class:`HeadParams`.

    Raises:
        ValueError: for an unknown ``family``, or when the requested component has
            no such point (:math:`\Theta_1` with :math:`s \ne 0` is empty when
            :math:`m_1 = -m_{-1}` and :math:`\pi_+ \ne 1/2`).
    """
    C.check_choice(family, "family", ("theta1", "theta2"))
    m1, m0 = np.asarray(problem.mean_pos, np.float64), np.asarray(problem.mean_neg, np.float64)
    G, p = np.asarray(problem.cov, np.float64), float(problem.p_pos)
    d = m1.shape[0]
    dm = m1 - m0
    w_star = np.linalg.solve(G, dm)
    b_star = -0.5 * (m1 @ np.linalg.solve(G, m1) - m0 @ np.linalg.solve(G, m0)) + np.log(p / (1 - p))
    tol = 1e-12 * (1.0 + np.abs(m1).max() + np.abs(m0).max())
    eye = np.eye(d)

    def bias_direction(mbar, target):
        """A v with v^T mbar = target, non-zero when w* needs it."""
        if np.linalg.norm(mbar) > tol:
            if abs(target) > tol:
                return target * mbar / (mbar @ mbar)
            if d >= 2:  # any non-zero vector orthogonal to mbar
                k = int(np.argmin(np.abs(mbar)))
                e = eye[k] - (mbar[k] / (mbar @ mbar)) * mbar
                return e / np.linalg.norm(e)
            return np.zeros(d)
        if abs(target) > tol:
            return None
        return w_star.copy() if np.linalg.norm(w_star) > tol else eye[0].copy()

    def u11_for(v21):
        a = G @ v21
        if np.linalg.norm(a) <= tol:
            return eye.copy()
        return eye + np.outer(w_star - a, a) / (a @ a)

    if family == "theta1":
        v21 = bias_direction(0.5 * (m1 + m0), b_star)
        if v21 is None:
            raise ValueError(
                "`problem` has no point of Theta1: with m_1 = -m_{-1} the head's bias is zero when r = 0, "
                f"but b* = {b_star:.6g} != 0 (p_pos != 1/2)"
            )
        v22 = -0.5 * (v21 @ dm)
        U11 = u11_for(v21)
        u12 = np.zeros(d)
        if np.linalg.norm(U11 @ dm) <= tol:
            u12 = 0.5 * eye[0]
    else:
        mbar = (1 - p) * m0 + p * m1
        if abs(2 * p - 1) > 1e-12:
            coef = dm - 2 * mbar / (2 * p - 1)  # r(v21) = coef^T v21 + 2 b*/(2p - 1)
            r_of = lambda v: coef @ v + 2 * b_star / (2 * p - 1)  # noqa: E731
            base = w_star if np.linalg.norm(w_star) > tol else eye[0]
            candidates = [np.linalg.solve(G, dm) if np.linalg.norm(w_star) > tol else base, 2 * base]
            candidates += [eye[k] for k in range(d)]
            v21 = next((v for v in candidates if abs(r_of(v)) > 1e-8), None)
            if v21 is None:
                raise ValueError("`problem` has no point of Theta2 with r != 0 (r vanishes on all of Theta2)")
            v22 = (b_star - v21 @ mbar) / (2 * p - 1)
        else:
            v21 = bias_direction(mbar, b_star)  # never None here: mbar = 0 forces b* = 0 at p = 1/2
            v22 = 0.5 * (1.0 - v21 @ dm)  # r = 1
        U11 = u11_for(v21)
        u12 = -0.5 * U11 @ dm
    dtype = problem.dtype
    return HeadParams(
        jnp.asarray(U11, dtype), jnp.asarray(u12, dtype), jnp.asarray(v21, dtype), jnp.asarray(v22, dtype)
    )


# ----------------------------------------------------------------------------- training


def _check_training(problem, theta0, optimizer, n_steps, record_every, n_nodes):
    problem, theta0 = _cast(problem, _check_theta(problem, theta0, "theta0"))
    n_steps, record_every = C.check_steps(n_steps, record_every)
    return problem, theta0, n_steps // record_every, C.scalar(n_nodes, "n_nodes", low=0, integer=True)


def _train(step, problem, state, n_records, record_every, n_nodes, chunk_records, progress, desc):
    """Run ``step`` (a jitted chunk of records) through :func:`gmlib.run_chunks` and add the record at step 0."""

    def block(state, k):
        return step(problem, state, record_every=record_every, n_records=k, n_nodes=n_nodes)

    theta0 = state[0]
    state, (risks, traj) = run_chunks(block, state, n_records=n_records, chunk_records=chunk_records, progress=progress,
                                      desc=desc)
    first = lambda a0, a: jnp.concatenate([a0[None], a])  # noqa: E731
    risks = first(_risk_jit(problem, theta0, n_nodes), risks)
    return TrainResult(state[0], np.arange(n_records + 1) * record_every, risks, jax.tree.map(first, theta0, traj))


def _scan_records(step, loss, state, record_every, n_records):
    """``n_records`` times: ``record_every`` steps, then record (loss, params)."""

    def record(carry, _):
        carry, _ = jax.lax.scan(step, carry, None, length=record_every)
        return carry, (loss(carry[0]), carry[0])

    return jax.lax.scan(record, state, None, length=n_records)


@partial(jax.jit, static_argnames=("optimizer", "record_every", "n_records", "n_nodes"))
def _gd_block(problem, state, *, optimizer, record_every, n_records, n_nodes):
    loss = partial(_risk, problem, n_nodes=n_nodes)

    def step(carry, _):
        theta, opt_state = carry
        updates, opt_state = optimizer.update(jax.grad(loss)(theta), opt_state, theta)
        return (optax.apply_updates(theta, updates), opt_state), None

    return _scan_records(step, loss, state, record_every, n_records)


def gradient_descent(
    problem,
    theta0,
    optimizer,
    n_steps: int,
    *,
    record_every: int = 1,
    n_nodes: int = DEFAULT_NODES,
    chunk_records: int | None = None,
    progress: bool = False,
) -> TrainResult:
    r"""Population gradient descent on :func:`risk`: :math:`\theta_{t+1} = \theta_t - \eta\,\nabla\mathcal R(\theta_t)`.

    The exact population gradient (:func:`risk`) fed to an optax optimizer
    (``optax.sgd(eta)`` is plain gradient descent, the discretized gradient flow of
    Thms 3.5–3.6 and Figure 1), run as a ``lax.scan``. The risk and the parameters are
    recorded every ``record_every`` steps (and at step 0). The scan runs in chunks of
    ``chunk_records`` records (:func:`gmlib.run_chunks`), between which a tqdm bar
    advances when ``progress`` is true; every chunk of the same size reuses one
    compilation (keep the ``optimizer`` object to reuse it across calls).

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
        >>> out = gradient_descent(c1, theta0, optax.sgd(1e-4), 10_000, record_every=100)
    """
    problem, theta0, n_records, n_nodes = _check_training(problem, theta0, optimizer, n_steps, record_every, n_nodes)
    step = partial(_gd_block, optimizer=optimizer)
    return _train(step, problem, (theta0, optimizer.init(theta0)), n_records, record_every, n_nodes, chunk_records,
                  progress, "gradient descent")


def _empirical_risk(problem, theta, x, y):
    return jnp.mean(jax.nn.softplus(-y * _predict(problem, theta, x)))


@partial(jax.jit, static_argnames=("optimizer", "record_every", "n_records", "n_nodes", "batch_size"))
def _sgd_block(problem, state, *, optimizer, record_every, n_records, n_nodes, batch_size):
    def step(carry, _):
        theta, opt_state, key = carry
        key, sub = jax.random.split(key)
        x, y = _sample(problem, sub, batch_size)
        g = jax.grad(_empirical_risk, argnums=1)(problem, theta, x, y)
        updates, opt_state = optimizer.update(g, opt_state, theta)
        return (optax.apply_updates(theta, updates), opt_state, key), None

    return _scan_records(step, partial(_risk, problem, n_nodes=n_nodes), state, record_every, n_records)


def sgd(
    problem,
    theta0,
    key,
    optimizer,
    n_steps: int,
    *,
    batch_size: int = 1,
    record_every: int = 1,
    n_nodes: int = DEFAULT_NODES,
    chunk_records: int | None = None,
    progress: bool = False,
) -> TrainResult:
    r"""Stochastic gradient descent on fresh minibatches of :math:`(X, Y)` (online SGD, Figures 4–5).

    At every step ``batch_size`` new pairs are drawn from ``problem`` and the
    optimizer gets the gradient of their mean logistic loss
    :math:`\frac1B\sum_i \log(1 + e^{-y_i f_\theta(x_i)})`, an unbiased estimate of
    :math:`\nabla\mathcal R(\theta)`. The *population* risk is recorded by quadrature
    (:func:`risk`) every ``record_every`` steps. Same loop structure as
    :func:`gradient_descent`.

    Args:
        problem: an :class:`LDAProblem`.
        theta0: the initial :class:`HeadParams`.
        key: a ``jax.random`` key (the only source of randomness).
        optimizer: an ``optax.GradientTransformation`` (``optax.sgd(1e-2)`` in the paper).
        n_steps: number of steps, a multiple of ``record_every``.
        batch_size: pairs per step (1: the online SGD of the paper).
        record_every, n_nodes, chunk_records, progress: as in :func:`gradient_descent`.

    Returns:
        a :class:`gmlib.TrainResult`, as :func:`gradient_descent`.

    Raises:
        ValueError: as :func:`gradient_descent`, and for a bad ``batch_size`` or ``key``.
    """
    problem, theta0, n_records, n_nodes = _check_training(problem, theta0, optimizer, n_steps, record_every, n_nodes)
    batch_size = C.scalar(batch_size, "batch_size", low=0, integer=True)
    step = partial(_sgd_block, optimizer=optimizer, batch_size=batch_size)
    return _train(step, problem, (theta0, optimizer.init(theta0), key), n_records, record_every, n_nodes,
                  chunk_records, progress, "SGD")
