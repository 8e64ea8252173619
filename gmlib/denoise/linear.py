r"""Denoisers without selection: the best linear and affine maps and their gaps to Bayes (Prop C.6).

Every network of linear-attention layers is a linear map of the query (Lemma C.7 of the
paper); on tokens with a constant coordinate it is affine. The best such maps, their risks
and their excess risks over the Bayes denoiser are closed forms (the excess needs the
Bayes risk, :meth:`DenoisingProblem.bayes_risk`): what softmax attention's selection is
worth.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gmlib.denoise.problem import DenoisingProblem

__all__ = ["linear_optimum", "affine_optimum", "linear_risk", "affine_risk", "linear_gap", "affine_gap"]


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

    Example:
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
        >>> A = denoise.linear_optimum(prob)
        >>> round(float(prob.excess_risk(lambda z: z @ A.T)), 6), round(float(denoise.linear_gap(prob)), 6)
        (1.641524, 1.641524)
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
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
        >>> A, b = denoise.affine_optimum(prob)
        >>> round(float(prob.excess_risk(lambda z: z @ A.T + b)), 6), round(float(denoise.affine_gap(prob)), 6)
        (0.125734, 0.125734)
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


def linear_risk(problem: DenoisingProblem):
    r"""The risk of the best linear denoiser, :math:`\mathcal R(A^\star) = \xi^2 \operatorname{tr} A^\star` (Prop C.6).

    .. math::

        \begin{gathered}
        \mathcal R(A^\star) = \mathbb E\|X - A^\star Z\|^2
        = \xi^2 \operatorname{tr}\big(M_2 (M_2 + \xi^2 I_d)^{-1}\big),\\
        M_2 = \mathbb E[X X^\top],
        \end{gathered}

    with :math:`A^\star` of :func:`linear_optimum` (whose docstring derives it). In closed
    form, for any M and any covariance; traceable (``jit``, ``vmap``, ``grad``).

    Args:
        problem: a :class:`DenoisingProblem`.

    Returns:
        a scalar.

    Example:
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
        >>> round(float(denoise.linear_risk(prob)), 6), round(float(denoise.linear_risk(prob) - prob.bayes_risk()), 6)
        (4.631579, 1.641524)
    """
    return problem.xi**2 * jnp.trace(linear_optimum(problem))


def affine_risk(problem: DenoisingProblem):
    r"""The risk of the best affine denoiser, :math:`\mathcal R(A, b) = \xi^2 \operatorname{tr} A`.

    .. math::

        \begin{gathered}
        \mathcal R(A, b) = \mathbb E\|X - A Z - b\|^2
        = \xi^2 \operatorname{tr}\big(\Sigma (\Sigma + \xi^2 I_d)^{-1}\big),\\
        \Sigma = \operatorname{Cov}(X),
        \end{gathered}

    with :math:`(A, b)` of :func:`affine_optimum` (whose docstring derives it). In closed
    form, for any M and any covariance; traceable (``jit``, ``vmap``, ``grad``).

    Args:
        problem: a :class:`DenoisingProblem`.

    Returns:
        a scalar.

    Example:
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
        >>> round(float(denoise.affine_risk(prob)), 6), round(float(denoise.affine_risk(prob) - prob.bayes_risk()), 6)
        (3.115789, 0.125734)
    """
    return problem.xi**2 * jnp.trace(affine_optimum(problem)[0])


def linear_gap(problem: DenoisingProblem, *, n_nodes: int | None = None):
    r"""The excess risk of the best linear denoiser, :math:`\mathbb E\|A^\star Z - f^\star(Z)\|^2` (Prop C.6).

    .. math::

        \mathcal R(A^\star) - \mathcal R(f^\star), \qquad
        \mathcal R(A^\star) = \xi^2 \operatorname{tr}\big(M_2 (M_2 + \xi^2 I)^{-1}\big),

    the first term in closed form (:func:`linear_risk`) and the Bayes risk from
    :meth:`DenoisingProblem.bayes_risk` (an integral over the M − 1 projections the
    posterior depends on). Positive whenever the posterior weights are not constant:
    the best any network of linear-attention layers can do. It is at least
    :func:`affine_gap`; the difference is the price of the missing intercept.

    Args:
        problem: a :class:`DenoisingProblem` with M ≤ 4.
        n_nodes: passed to :meth:`DenoisingProblem.bayes_risk`.

    Returns:
        a scalar.

    Raises:
        ValueError: as :meth:`DenoisingProblem.bayes_risk` (M > 4, a bad ``n_nodes``).

    Example:
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
        >>> round(float(denoise.linear_gap(prob)), 3)
        1.642
    """
    return linear_risk(problem) - problem.bayes_risk(n_nodes=n_nodes)


def affine_gap(problem: DenoisingProblem, *, n_nodes: int | None = None):
    r"""The excess risk of the best affine denoiser, :math:`\mathbb E\|AZ + b - f^\star(Z)\|^2`.

    .. math::

        \xi^2 \operatorname{tr}\big(\Sigma (\Sigma + \xi^2 I)^{-1}\big) - \mathcal R(f^\star),
        \qquad \Sigma = \operatorname{Cov}(X),

    the first term :func:`affine_risk`, with :math:`(A, b)` from :func:`affine_optimum` (whose
    docstring derives the risk),
    and the Bayes risk from :meth:`DenoisingProblem.bayes_risk`. Zero exactly when the
    Bayes denoiser is affine (one component); what remains of :func:`linear_gap` once
    an intercept is allowed: the price of no selection.

    Args:
        problem: a :class:`DenoisingProblem` with M ≤ 4.
        n_nodes: passed to :meth:`DenoisingProblem.bayes_risk`.

    Returns:
        a scalar.

    Raises:
        ValueError: as :meth:`DenoisingProblem.bayes_risk` (M > 4, a bad ``n_nodes``).

    Example:
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)  # Figure 2's
        >>> round(float(denoise.affine_gap(prob)), 3)
        0.126
    """
    return affine_risk(problem) - problem.bayes_risk(n_nodes=n_nodes)
