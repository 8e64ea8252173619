r"""The head's representation and its population risk (paper §3, eqs 6–8, Lemma B.3); see :mod:`gmlib.lda`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from gmlib import _checks as C
from gmlib._dtypes import common_float_dtype
from gmlib._pytree import unchecked
from gmlib.heads import Heads
from gmlib.lda._problem import HeadParams, _cast, _check_theta
from gmlib.quadrature import _gated_expectation

#: The default number of quadrature points of :func:`risk` along the gate's direction.
DEFAULT_NODES = 96

# ----------------------------------------------------------------------------- representation


def to_attention(theta) -> Heads:
    r"""The head :math:`\theta` as a :class:`gmlib.Heads` on tokens :math:`(x, y) \in \mathbb R^{d+1}` (eq 12).

    The paper writes the blocks of :math:`U^\top`:
    :math:`U^\top = \begin{pmatrix} U_{11} & u_{12} \\ 0 & 0 \end{pmatrix}`, so
    :math:`U = \begin{pmatrix} U_{11}^\top & 0 \\ u_{12}^\top & 0 \end{pmatrix}`
    (the blocks :math:`u_{21}, u_{22}` do not act at a query :math:`(x, 0)` and are set
    to zero). Of :math:`V` only the last row :math:`(v_{21}^\top, v_{22})` reaches the
    prediction, the last output coordinate: the head keeps that row alone, so its
    output is the score itself. ``apply_heads(to_attention(theta), problem.prompt, q)``
    is :math:`f_\theta(x)` (:func:`predict`, by Prop 2.1) at the queries
    ``q = [(x, 0)]``, and on L sampled tokens it approaches it as L grows.

    Args:
        theta: a :class:`HeadParams` of dimension d.

    Returns:
        a :class:`gmlib.Heads` of one head: ``U`` (1, d+1, d+1) and ``V`` (1, 1, d+1),
        whose output is (Q, 1).

    Raises:
        ValueError: naming the leaf, for leaves whose shapes do not fit one d or non-finite values.

    Example:
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> theta, x = lda.HeadParams.normal(2, key=jax.random.key(0)), jnp.array([[0.5, 0.5], [1.0, -1.0]])
        >>> q = jnp.concatenate([x, jnp.zeros((len(x), 1))], axis=1)  # queries (x, 0)
        >>> out = gmlib.apply_heads(lda.to_attention(theta), c1.prompt, q)[:, 0]
        >>> bool(jnp.allclose(out, lda.predict(c1, theta, x)))
        True
    """
    _check_theta(None, theta)
    d, dtype = theta.U11.shape[0], theta.U11.dtype
    U = jnp.zeros((d + 1, d + 1), dtype).at[:d, :d].set(theta.U11.T).at[d, :d].set(theta.u12)
    V = jnp.concatenate([theta.v21, theta.v22[None]])
    return unchecked(Heads, U[None], V[None, None], None, False)


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

        \begin{aligned}
        w &= U_{11}\Gamma v_{21}, & b &= v_{21}^\top m_{-1} - v_{22},\\
        r &= v_{21}^\top(m_1 - m_{-1}) + 2v_{22}, & s &= 2u_{12} + U_{11}(m_1 - m_{-1}).
        \end{aligned}

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

    The output of the head :func:`to_attention` at the query :math:`(x, 0)` on the
    infinite prompt of :math:`(X, Y)` tokens, :attr:`LDAProblem.prompt` (Prop 2.1).

    Args:
        problem: an :class:`LDAProblem` of dimension d.
        theta: a :class:`HeadParams`.
        x: queries, shape (n, d).

    Returns:
        array (n,).

    Raises:
        ValueError: naming the argument (``theta.U11``, ..., ``x``), for shapes that do not
            fit ``problem`` or non-finite values.

    Example:
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> x = jnp.array([[0.5, 0.5], [1.0, -1.0]])
        >>> bool(jnp.allclose(lda.predict(c1, lda.bayes_head(c1, "theta1"), x), c1.bayes(x)))
        True
    """
    problem, theta = _cast(problem, _check_theta(problem, theta))
    x = C.array(x, "x", ("n", "d"), dims={"d": problem.dim}, dtype=problem.dtype)
    return _predict(problem, theta, x)


# ----------------------------------------------------------------------------- risk


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
    pos, neg = jax.vmap(lambda m, q: _gated_expectation(_class_loss, n_nodes, m, cov, q))(mu, p)
    return problem.p_pos * pos + (1 - problem.p_pos) * neg


def risk(problem, theta, *, n_nodes: int = DEFAULT_NODES):
    r"""The population logistic risk :math:`\mathcal R(\theta) = \mathbb E \log(1 + e^{-Y f_\theta(X)})` (eq 8).

    In class c, :math:`f_\theta(X)` depends on X only through the pair
    :math:`(w^\top X, s^\top X) \sim \mathcal N(A m_c, A\Gamma A^\top)` with
    :math:`A = [w, s]^\top`, so

    .. math::

        \begin{gathered}
        \mathcal R(\theta) = \sum_{c = \pm 1} \pi_c\,
            \mathbb E\,\mathrm{softplus}\big(-c\,[y_1 + b + r\,\sigma(s_0 + y_2)]\big),\\
        y \sim \mathcal N(A m_c, A\Gamma A^\top).
        \end{gathered}

    The gate :math:`\sigma(s_0 + y_2)` steps over a length 1 in :math:`y_2`, whose
    standard deviation :math:`\sqrt{s^\top\Gamma s}` can be large (the minimizers of
    Figure 1 have :math:`|s| \approx 28`), where a Gauss–Hermite rule converges slowly.
    So each class is integrated in the conditional form: :math:`y_2` on ``n_nodes``
    points graded at the gate's step, and, given :math:`y_2`, the Gaussian
    :math:`y_1` on ``n_nodes // 2`` points graded at the softplus's kink (midpoint rules
    under a sinh-type change of variables, exponentially convergent whatever the
    steepness; the rule lives at the end of ``gmlib.quadrature``). Derivatives (``jax.grad``, ``jax.hessian``, any order) come from Stein's
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
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> abs(float(lda.risk(c1, lda.bayes_head(c1, "theta2")) - c1.bayes_risk())) < 1e-12
        True
        >>> theta = lda.HeadParams.normal(2, key=jax.random.key(0))
        >>> type(jax.grad(lambda th: lda.risk(c1, th, n_nodes=64))(theta)).__name__
        'HeadParams'
    """
    n_nodes = C.scalar(n_nodes, "n_nodes", low=0, integer=True)
    problem, theta = _cast(problem, _check_theta(problem, theta))
    return _risk_jit(problem, theta, n_nodes)


_risk_jit = jax.jit(_risk, static_argnums=2)


def effective_risk(problem, w, b, r, s, *, n_nodes: int = DEFAULT_NODES):
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
        ValueError: naming the argument, for wrong shapes, non-finite values or a bad ``n_nodes``.

    Example:
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> theta = lda.HeadParams.normal(2, key=jax.random.key(0))
        >>> bool(jnp.allclose(lda.effective_risk(c1, *lda.effective(c1, theta)), lda.risk(c1, theta)))
        True
    """
    n_nodes = C.scalar(n_nodes, "n_nodes", low=0, integer=True)
    dtype, dims = common_float_dtype(problem.mean_pos, w, b, r, s), {"d": problem.dim}
    args = [C.array(val, name, shape, dims=dims, dtype=dtype)
            for name, val, shape in (("w", w, ("d",)), ("b", b, ()), ("r", r, ()), ("s", s, ("d",)))]
    return _effective_risk_jit(problem.astype(dtype), *args, n_nodes)


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
            raise ValueError("`problem` has no point of Theta1: with m_1 = -m_{-1} the head's bias is zero when "
                             f"r = 0, but b* = {b_star:.6g} != 0 (p_pos != 1/2)")
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


# ----------------------------------------------------------------------------- geometry of the minimizers


def _family_constraints(problem, theta, family):
    w_star, b_star = problem.bayes_params()
    w, b, r, s = _effective(problem, theta)
    if family == "theta1":
        return jnp.concatenate([w - w_star, jnp.stack([b - b_star, r])])
    sig0 = jax.nn.sigmoid(problem.s0)
    return jnp.concatenate([w - w_star, s, jnp.stack([b + r * sig0 - b_star])])


def family_constraints(problem, theta, family: str = "theta1"):
    r"""The constraints whose zero set is the family of Bayes-optimal heads :math:`\Theta_1` or :math:`\Theta_2` (Thm 3.3).

    ``family="theta1"``: :math:`(w - w^\star,\ b - b^\star,\ r)`, d + 2 entries, zero on
    :math:`\Theta_1 = \Phi^{-1}(\mathcal E_1)`. ``family="theta2"``:
    :math:`(w - w^\star,\ s,\ b + r\sigma(s_0) - b^\star)`, 2d + 1 entries, zero on
    :math:`\Theta_2 = \Phi^{-1}(\mathcal E_2)`; :math:`(w, b, r, s) = \Phi(\theta)` as in
    :func:`effective`. Traceable: ``jax.jacobian`` of it gives the normal space of the
    family (its null space is the tangent space, Theorem 3.5).

    Args:
        problem: an :class:`LDAProblem` of dimension d.
        theta: a :class:`HeadParams` of dimension d.
        family: ``"theta1"`` or ``"theta2"``.

    Returns:
        an array of shape (d + 2,) or (2d + 1,).

    Raises:
        ValueError: for an unknown ``family``, or a ``theta`` whose shapes do not match ``problem``.

    Example:
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> bool(np.abs(lda.family_constraints(c1, lda.bayes_head(c1, "theta2"), "theta2")).max() < 1e-12)  # zeros
        True
    """
    C.check_choice(family, "family", ("theta1", "theta2"))
    problem, theta = _cast(problem, _check_theta(problem, theta))
    return _family_constraints(problem, theta, family)


def _flat_hessian(problem, theta, n_nodes):
    flat, unravel = ravel_pytree(theta)
    # forward over forward: the matrix of jax.hessian, and cheaper to compile through the quadrature
    return jax.jacfwd(jax.jacfwd(lambda v: _risk(problem, unravel(v), n_nodes)))(flat)


_flat_hessian_jit = jax.jit(_flat_hessian, static_argnums=2)


def risk_hessian(problem, theta, *, n_nodes: int = DEFAULT_NODES):
    r"""The Hessian :math:`\nabla^2\mathcal R(\theta)` of :func:`risk` in the flat parameters.

    The parameters are flattened as ``jax.flatten_util.ravel_pytree(theta)`` does:
    :math:`U_{11}` row by row, then :math:`u_{12}`, :math:`v_{21}`, :math:`v_{22}`
    (:math:`n = d^2 + 2d + 1` in all). Computed by forward-mode differentiation twice
    through the quadrature (the matrix of ``jax.hessian``, cheaper to compile), in one
    compiled program per dimension and ``n_nodes``.

    Args:
        problem: an :class:`LDAProblem` of dimension d.
        theta: a :class:`HeadParams` of dimension d.
        n_nodes: as in :func:`risk`.

    Returns:
        a symmetric array of shape (n, n).

    Raises:
        ValueError: for mismatched shapes, non-finite values or a bad ``n_nodes``.

    Example:
        >>> c1 = lda.LDAProblem([1.0, 0.0], [0.0, 1.0], jnp.eye(2), 0.6)  # configuration C1
        >>> eigenvalues = np.linalg.eigvalsh(lda.risk_hessian(c1, lda.bayes_head(c1, "theta1")))
        >>> int((np.abs(eigenvalues) < 1e-8).sum()), int((eigenvalues > 1e-4).sum())  # d^2 + d - 1 zeros
        (5, 4)
    """
    n_nodes = C.scalar(n_nodes, "n_nodes", low=0, integer=True)
    problem, theta = _cast(problem, _check_theta(problem, theta))
    return _flat_hessian_jit(problem, theta, n_nodes)
