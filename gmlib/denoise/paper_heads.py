r"""The paper's heads for two components of equal norm (Thm 4.1, Props C.3–C.5), as :class:`gmlib.Heads`.

For :math:`M = 2`, :math:`\Gamma = \gamma^2 I_d` and :math:`\|m_1\| = \|m_2\|`, softmax attention
on the noisy prompt :math:`\mu_Z` has the shape of the Bayes denoiser (eq 10) but one head
cannot weigh the query and the barycenter differently (Prop C.4):
:func:`two_head_bayes` returns two heads whose sum is exact (Prop C.5, Prop C.3 for point
masses), :func:`single_head_bayes` the one head that is exact where one exists. Evaluate
them with ``gmlib.apply_heads(heads, problem.noisy, z)``. The constructions beyond these
assumptions are in :mod:`gmlib.denoise.general_heads`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib.denoise.general_heads import _as_heads, multi_head_bayes
from gmlib.denoise.problem import DenoisingProblem, _tol
from gmlib.heads import Heads

__all__ = ["two_head_bayes", "single_head_bayes"]


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


def _check_pair(problem, what: str, need_dim2: bool = True, general: bool = False):
    """Two components (and d >= 2); unless ``general``, isotropic and of equal norm: what the head constructions need."""
    if problem.n_components != 2 or (need_dim2 and problem.dim < 2):
        raise ValueError(f"`problem` must have M = 2 components{' and dimension d >= 2' * need_dim2} for {what} "
                         f"(more: multi_head_bayes); got M = {problem.n_components}, d = {problem.dim}")
    if not general and not problem.isotropic:
        raise ValueError(f"`problem` must be isotropic (given `gamma`) for {what}; for a full covariance use "
                         "two_head_bayes, multi_head_bayes or skip_head_bayes")
    if not general and C.is_concrete(problem.means):
        r1, r2 = np.linalg.norm(np.asarray(problem.means, dtype=np.float64), axis=-1)
        if abs(r1 - r2) > _tol(problem.dtype) * max(r1, r2, 1.0):
            raise ValueError(f"`means` must have equal norms for {what} (the offsets -||m_k||^2/(2s) of the "
                             f"posterior cannot come from dot-product scores); got ||m_1|| = {r1:.6g}, ||m_2|| = "
                             f"{r2:.6g}. Tokens with a constant coordinate produce them: two_head_bayes(problem, "
                             "constant_token=True)")


def two_head_bayes(problem: DenoisingProblem, *, constant_token: bool = False) -> Heads:
    r"""Two softmax heads whose sum on the noisy prompt is the Bayes denoiser (Thm 4.1).

    With ``constant_token=True`` the heads are (d + 1) × (d + 1) and act on tokens and
    queries that carry a constant coordinate 1 (:func:`~gmlib.denoise.augment`): then any two distinct
    means (any norms, collinear or not), any weights and any covariance (``gamma`` or
    ``cov``) are allowed, and the first d coordinates of the summed heads on
    ``augment(problem.noisy)`` are :math:`f^\star` (the last is 1). The construction is
    :func:`~gmlib.denoise.multi_head_bayes`'s with two heads; its derivation is in chapter 8
    of the book.
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

    A full-covariance problem without the constant coordinate gets
    :func:`~gmlib.denoise.multi_head_bayes`'s construction, which needs equal
    :math:`S^{-1}`-norms :math:`m_1^\top S^{-1} m_1 = m_2^\top S^{-1} m_2`.

    Args:
        problem: a :class:`DenoisingProblem` with M = 2, d ≥ 2 and (without the constant
            coordinate) :math:`\|m_1\| = \|m_2\|` (any weights, any :math:`\gamma \ge 0`).
        constant_token: act on tokens augmented with a constant coordinate (any norms).

    Returns:
        a :class:`gmlib.Heads` of two heads, no output map, not residual (the heads are
        summed): U and V of shape (2, d, d), or (2, d + 1, d + 1) with
        ``constant_token=True``.

    Raises:
        ValueError: if M ≠ 2, d < 2, or (without the constant coordinate) the norms
            differ; the message says that ``constant_token=True`` handles unequal norms.

    Example:
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)
        >>> z = jnp.array([[1.0, 1.0], [2.0, -1.0]])
        >>> heads = denoise.two_head_bayes(prob)
        >>> bool(jnp.allclose(gmlib.apply_heads(heads, prob.noisy, z), prob.bayes(z)))
        True
        >>> heads = denoise.two_head_bayes(prob, constant_token=True)  # on augmented tokens too
        >>> aug = denoise.augment
        >>> bool(jnp.allclose(gmlib.apply_heads(heads, aug(prob.noisy), aug(z))[:, :-1], prob.bayes(z)))
        True
    """
    general = bool(constant_token) or not problem.isotropic  # multi_head_bayes's construction, two heads
    _check_pair(problem, "the two-head construction", general=general)
    if general:
        return multi_head_bayes(problem, constant_token=bool(constant_token), n_heads=2)
    return _two_heads(problem)


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
    opposite = sin2 < float(eps) ** (2.0 / 3.0)  # a weak Python float (numpy 1.x: float64)
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
    pick = lambda o, nc: jnp.where(opposite, o, nc)
    return _as_heads([(pick(U1o, U1n), pick(A + B, V1n)), (pick(U2o, U2n), pick(A - B, V2n))])


def single_head_bayes(problem: DenoisingProblem) -> Heads:
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
        a :class:`gmlib.Heads` of one head (U and V of shape (1, d, d)).

    Raises:
        ValueError: naming ``problem`` or ``means`` and the reason when no single head
            realizes :math:`f^\star` (M ≠ 2, unequal norms, Props C.3, C.4).

    Example:
        >>> prob = denoise.DenoisingProblem([0.2, 0.8], [[2.0, 0.0], [0.0, 2.0]], 1.1, 1.1)
        >>> z = jnp.array([[1.0, 1.0], [2.0, -1.0]])
        >>> out = gmlib.apply_heads(denoise.single_head_bayes(prob), prob.noisy, z)
        >>> bool(jnp.allclose(out, prob.bayes(z)))
        True
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
                raise ValueError("no single head realizes the Bayes denoiser of `problem`: gamma = 0 with linearly "
                                 "independent means in d = 2 (Prop C.3); use two_head_bayes")
        elif abs(g - x) > tol * x:
            raise ValueError(f"no single head realizes the Bayes denoiser of `problem`: gamma^2 != xi^2 (gamma = "
                             f"{g:.6g}, xi = {x:.6g}) and one value matrix cannot weigh the query by gamma^2/s and "
                             "the barycenter by xi^2/s (Prop C.4); use two_head_bayes")
    return _single_head(problem)


@jax.jit
def _single_head(p):
    dtype = p.dtype
    d = p.dim
    eye = jnp.eye(d, dtype=dtype)
    s = p.s
    balanced = (eye / s, 0.5 * eye)
    if d < 2:
        return _as_heads([balanced])
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
    return _as_heads([(jnp.where(degenerate, U0, balanced[0]), jnp.where(degenerate, V0, balanced[1]))])


