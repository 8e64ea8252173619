r"""The iterated Bayes denoiser of Prop 4.3: orbits, the separation, the tanh fixed point.

For :math:`\gamma = 0` and balanced weights the Bayes denoiser on the line of the two means
is :math:`u \mapsto \tanh(\lambda^2 u)` with the separation :math:`\lambda = \|m_1 - m_2\|/(2\xi)`:
iterated, it collapses to the midpoint when :math:`\lambda \le 1` and converges to
:math:`\pm u_\lambda` when :math:`\lambda > 1`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib.denoise.problem import DenoisingProblem

__all__ = ["iterate", "separation", "tanh_fixed_point", "cluster_limits"]


def iterate(f: Callable, z0, *, n_steps: int):
    r"""The orbit :math:`z_0, f(z_0), f(f(z_0)), \dots` of a map, by ``lax.scan``.

    Args:
        f: a JAX-traceable map from an array to an array of the same shape and dtype
            (e.g. ``problem.bayes`` on queries (n, d), or ``lambda u: jnp.tanh(lam**2 * u)``).
        z0: the start.
        n_steps: the number of applications, a positive int.

    Returns:
        array of shape ``(n_steps + 1,) + z0.shape``: the whole trajectory, ``z0`` first.

    Raises:
        ValueError: naming ``z0`` (not a finite numeric array) or ``n_steps`` (not a
            positive int).

    Example:
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[0.0, 3.0], [0.0, -3.0]], 0.0, 2.0)
        >>> traj = denoise.iterate(prob.bayes, jnp.array([[1.0, 0.5]]), n_steps=60)  # (61,) + starts.shape
        >>> traj.shape, np.round(traj[-1], 4).tolist()  # at a fixed point inside m_1 = (0, 3)
        ((61, 1, 2), [[0.0, 2.9265]])
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

    Raises:
        ValueError: naming ``problem`` when M ≠ 2.

    Example:
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[0.0, 3.0], [0.0, -3.0]], 0.0, 2.0)
        >>> float(denoise.separation(prob))  # means (0, ±3), xi = 2
        1.5
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

    Example:
        >>> np.round(denoise.tanh_fixed_point([0.5, 1.2, 3.0]), 4).tolist()  # 0 below lambda = 1
        [0.0, 0.8339, 1.0]
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


def cluster_limits(problem: DenoisingProblem, starts):
    r"""Where the iterated Bayes denoiser takes each start (Prop 4.3): :math:`c \pm u_\lambda\delta`, or c.

    Let :math:`z_0` denote a row of ``starts``, :math:`c = (m_1 + m_2)/2`,
    :math:`\delta = (m_1 - m_2)/2` and :math:`\lambda` the :func:`separation`. For
    :math:`\gamma = 0` and balanced weights the orbit :math:`z_{n+1} = f^\star(z_n)` converges to

    .. math::

        z_\infty = c + \operatorname{sign}\big(\langle z_0 - c, \delta\rangle\big)\, u_\lambda\, \delta,

    with :math:`u_\lambda` the :func:`tanh_fixed_point` (0 for :math:`\lambda \le 1`: every
    orbit collapses to the midpoint c; a start on the hyperplane
    :math:`\langle z_0 - c, \delta\rangle = 0` stays on it and goes to c as well).

    A host function (numpy out), like :func:`tanh_fixed_point`.

    Args:
        problem: a :class:`DenoisingProblem` with M = 2, :math:`\gamma = 0` and weights
            (1/2, 1/2).
        starts: the starts :math:`z_0`, shape (n, d).

    Returns:
        numpy array (n, d): the limit of each start's orbit.

    Raises:
        ValueError: naming ``problem`` (not two balanced point masses) or ``starts`` (shape,
            finiteness).

    Example:
        >>> prob = denoise.DenoisingProblem([0.5, 0.5], [[0.0, 3.0], [0.0, -3.0]], 0.0, 2.0)
        >>> np.round(denoise.cluster_limits(prob, [[1.0, 0.5]]), 4).tolist()  # (0, 3 u_1.5): inside m_1
        [[0.0, 2.9265]]
    """
    lam = float(separation(problem))  # refuses M != 2
    if not problem.isotropic or float(problem.gamma) != 0 or float(problem.weights[0]) != 0.5:
        raise ValueError("`problem` must be two point masses (gamma = 0) with weights (1/2, 1/2) (Prop 4.3); "
                         f"got gamma = {problem.gamma}, cov = {problem.cov}, weights = {problem.weights}")
    starts = np.asarray(C.array(starts, "starts", ("n", "d"), dims={"d": problem.dim}), np.float64)
    means = np.asarray(problem.means, np.float64)
    c, delta = means.mean(0), (means[0] - means[1]) / 2
    side = np.sign((starts - c) @ delta)
    return c + (side * float(tanh_fixed_point(lam)))[:, None] * delta
