r"""Heads beyond the paper's assumptions (the book's chapter 8), as :class:`gmlib.Heads`.

Any two means, any shared covariance :math:`\Gamma`, any number M of components. What
makes the difference is a constant coordinate in the tokens (:func:`augment`): the score
of a head then gains a term linear in the token, which puts the offsets
:math:`-\tfrac12 m_k^\top S^{-1} m_k` of the posterior into its gates.

- :func:`multi_head_bayes`: heads with the Bayes gates whose sum is the Bayes denoiser,
  :func:`heads_needed` of them (Propositions 8.1 and 8.3 of the book);
- :func:`fewer_heads`: one head fewer, on augmented tokens, where Proposition 8.3's
  condition holds;
- :func:`skip_head_bayes`: one head and a linear skip connection, exact for any M
  (Proposition 8.4);
- :func:`small_score_head`: a head whose gates barely move and whose output tends to a
  linear map, the second head of Proposition 8.5's nearly exact pair.

The paper's own constructions (equal norms, isotropic) are in
:mod:`gmlib.denoise.paper_heads`.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib._dtypes import is_concrete
from gmlib._pytree import unchecked
from gmlib.denoise.problem import DenoisingProblem, _tol
from gmlib.heads import Heads
from gmlib.mixture import GaussianMixture

__all__ = ["augment", "heads_needed", "multi_head_bayes", "skip_head_bayes", "fewer_heads", "small_score_head"]


def _as_heads(pairs) -> Heads:
    """The summed layer (no output map, not residual) of a list of ``(U, V)`` pairs; traceable."""
    return unchecked(Heads, jnp.stack([U for U, _ in pairs]), jnp.stack([V for _, V in pairs]), None, False)


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
        >>> augment(jnp.zeros((3, 2))).tolist()
        [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]
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
    concrete = is_concrete(problem.means) and is_concrete(problem.S)
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


def heads_needed(problem: DenoisingProblem, *, constant_token: bool = False):
    r"""The fewest heads of :func:`multi_head_bayes` for ``problem``, or ``None`` where it has no construction.

    With r the dimension of the affine span of the means and :math:`R = (\Gamma - \xi^2 I) S^{-1}`:
    1 when :math:`\Gamma = \xi^2 I_d`; :math:`\lceil d / (d - r) \rceil` when r < d; ``None``
    when r = d (M ≥ d + 1 means in general position) or when the gate offsets cannot be
    produced: they are :math:`m_k^\top b + c` for some b, c exactly when the means lie on a
    common sphere of the metric :math:`S^{-1}` (always for affinely independent means;
    never for three collinear ones), and without the constant coordinate that sphere must
    be centred at 0 (equal :math:`S^{-1}`-norms). It is the fewest heads of *this*
    construction, not always of every construction with the Bayes gates: with the constant
    coordinate the last column of the values absorbs a constant, and :func:`fewer_heads`
    builds d − 1 such heads where the means span a hyperplane and Proposition 8.3's
    condition holds (the book's chapter 8: d = 3, M = 3, a turned Γ, where this count is 3);
    there the necessary count is :math:`(h + 1)(d - r) \ge d`.

    Args:
        problem: a :class:`DenoisingProblem` (concrete values).
        constant_token: whether the tokens carry a constant coordinate.

    Returns:
        an int, or ``None``.

    Example:
        >>> means = [[2.0, 0.0, 0.5], [-1.0, 1.5, 0.0], [-0.5, -1.0, 2.0]]  # in general position, d = 3
        >>> prob = denoise.DenoisingProblem([0.3, 0.3, 0.4], means, gamma=0.5, xi=1.0)
        >>> denoise.heads_needed(prob, constant_token=True)
        3
    """
    _, need, why = _plan(problem, constant_token)
    return None if why is not None else need


def multi_head_bayes(problem: DenoisingProblem, *, constant_token: bool = False,
                     n_heads: int | None = None) -> Heads:
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
    :math:`\sum_j V_j S U_j = G + R = \Gamma S^{-1}`, so that (eq 10)

    .. math::

        \sum_j T_{U_j, V_j}[\mu_Z](z) = \Gamma S^{-1} z + \xi^2 S^{-1} \sum_k \beta_k(z) m_k
        = f^\star(z).

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
        constant_token: act on augmented tokens.
        n_heads: more heads than the fewest (the same construction).

    Returns:
        a :class:`gmlib.Heads` of h heads, summed (no output map, not residual): U and V
        of shape (h, d, d), or (h, d + 1, d + 1) with ``constant_token=True``.

    Raises:
        ValueError: where no construction exists (r = d with :math:`\Gamma \ne \xi^2 I`;
            offsets that cannot be produced), or ``n_heads`` is too small.

    Example:
        >>> means = [[2.0, 0.0, 0.5], [-1.0, 1.5, 0.0], [-0.5, -1.0, 2.0]]  # 3 means in d = 3
        >>> prob = denoise.DenoisingProblem([0.3, 0.3, 0.4], means, gamma=0.5, xi=1.0)
        >>> heads = denoise.multi_head_bayes(prob, constant_token=True)
        >>> aug, z = denoise.augment, jnp.array([[1.0, 1.0, 0.0], [2.0, -1.0, 1.0]])
        >>> out = gmlib.apply_heads(heads, aug(prob.noisy), aug(z))[:, :-1]
        >>> heads.n_heads, bool(jnp.allclose(out, prob.bayes(z)))
        (3, True)
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
        return _as_heads(list(zip(As, Vs)))
    b = _head_offsets(p, Sinv)
    return _as_heads([_embed(p, A, V, b, 1.0 / h) for A, V in zip(As, Vs)])


def skip_head_bayes(problem: DenoisingProblem, *, constant_token: bool = False) -> Heads:
    r"""One head and a linear skip connection, :math:`f(z) = B z + T_{U,V}[\mu_Z](z)`, equal to the Bayes denoiser.

    :math:`U = S^{-1}`, :math:`V = G = \xi^2 S^{-1}` and :math:`B = (\Gamma - \xi^2 I) S^{-1}`:
    the gates are the posterior, the head gives :math:`G z + G \sum_k \beta_k m_k` and the
    skip the rest of :math:`\Gamma S^{-1} z` (eq 10), for any number of components and any
    covariance. With the constant coordinate the score gains the offsets (as in
    :func:`multi_head_bayes`), U, V and B are (d + 1) × (d + 1), and the output carries the
    constant coordinate 1; without it the means must have equal :math:`S^{-1}`-norms.

    The skip is written in the layer of :class:`gmlib.Heads` as Prop 4.4's output map is
    (:func:`~gmlib.denoise.in_context_heads`): two residual heads, the second zero, and the
    output map :math:`W_{\mathrm{out}} = (I, B - I)`, so that

    .. math::

        \begin{aligned}
        W_{\mathrm{out}} \begin{pmatrix} z + T_{U,V}[\mu_Z](z) \\ z + 0 \end{pmatrix}
        &= z + T_{U,V}[\mu_Z](z) + (B - I) z\\
        &= B z + T_{U,V}[\mu_Z](z).
        \end{aligned}

    Args:
        problem: a :class:`DenoisingProblem` (any M, any covariance).
        constant_token: act on augmented tokens.

    Returns:
        a :class:`gmlib.Heads` with ``residual=True``: U and V of shape (2, D, D) (the
        head :math:`(U, V)` first, then zeros) and ``W_out`` of shape (D, 2D), D = d, or
        d + 1 with ``constant_token=True``. The attention head alone is
        ``gmlib.Heads(U=heads.U[:1], V=heads.V[:1])``, B is ``I + heads.W_out[:, D:]``.

    Raises:
        ValueError: naming ``problem`` where the gate offsets cannot be produced.

    Example:
        >>> prob = denoise.DenoisingProblem([0.3, 0.7], [[2.0, 0.0], [0.0, 2.0]], gamma=1.0, xi=1.0)
        >>> heads = denoise.skip_head_bayes(prob, constant_token=True)
        >>> aug, z = denoise.augment, jnp.array([[1.0, 1.0], [2.0, -1.0]])
        >>> out = gmlib.apply_heads(heads, aug(prob.noisy), aug(z))[:, :-1]
        >>> bool(jnp.allclose(out, prob.bayes(z)))
        True
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
    U, V = Sinv, G
    if constant:
        U, V = _embed(p, Sinv, G, _head_offsets(p, Sinv), 0.0)
        B = jnp.zeros((d + 1, d + 1), dt).at[:d, :d].set(B).at[d, d].set(1.0)
    zero, eye = jnp.zeros_like(U), jnp.eye(U.shape[0], dtype=dt)
    return unchecked(Heads, jnp.stack([U, zero]), jnp.stack([V, zero]),
                     jnp.concatenate([eye, B - eye], axis=1), True)


def fewer_heads(problem: DenoisingProblem) -> Heads:
    r"""d − 1 augmented heads with the Bayes gates, one fewer than :func:`heads_needed`, where they exist.

    Let the means span an affine hyperplane (r = d − 1) with unit normal :math:`q`, let
    :math:`R = (\Gamma - \xi^2 I)S^{-1}` be invertible and :math:`h = d - 1`. Proposition 8.3
    of the book: h heads with the Bayes gates, :math:`U_j = S^{-1} + q E_j` on the first d
    coordinates, sum to :math:`f^\star` on augmented tokens exactly when

    .. math::

        q^\top S (\Gamma - \xi^2 I)^{-1} \Gamma\, q = 0

    (never for :math:`\Gamma = \gamma^2 I`, :math:`0 < \gamma \ne \xi`). The proof's converse builds
    them: with :math:`w = R^{-\top} q`, :math:`x = w / \|w\|^2` (so :math:`q^\top R^{-1} x = 1`),
    :math:`a_1, \dots, a_{h-1}` orthonormal in the plane :math:`w^\top a = 0` and
    :math:`a_h = \xi^2 q + (q^\top S q)\, x - \sum_{j<h} a_j` (in that plane by the condition),
    :math:`(q, E_1^\top, \dots, E_h^\top)^\top = (x\ a_1 \cdots a_h)^{-1} R`,
    :math:`W = x q^\top`, :math:`V_j = a_j (Sq)^\top / \|Sq\|^2` for :math:`j < h` and
    :math:`V_h = \xi^2 S^{-1} + W - \sum_{j<h} V_j`; the score gains the offsets :math:`b` of
    :func:`multi_head_bayes` and the values' last column :math:`-V_j S b - W m_M / h` cancels
    the constants, so that the first d coordinates of the summed heads on
    ``augment(problem.noisy)`` are :math:`f^\star` (the last is 1). A host function: it reads
    the problem's values (numpy, float64), then casts the heads to the problem's dtype.

    Args:
        problem: a :class:`DenoisingProblem` with d ≥ 2 whose means span an affine
            hyperplane and lie on a common :math:`S^{-1}`-sphere, :math:`\Gamma - \xi^2 I`
            invertible, and the condition above (to a relative tolerance of 1e-7, 1e-3 in
            float32).

    Returns:
        a :class:`gmlib.Heads` of d − 1 summed heads on augmented tokens: U and V of shape
        (d − 1, d + 1, d + 1).

    Raises:
        ValueError: naming ``problem`` and the assumption that fails.

    Example:
        >>> from scipy.optimize import brentq
        >>> def cov(t):  # diag(0.3, 3) turned by t; the means below lie on the x-axis, q = (0, 1)
        ...     R = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
        ...     return R @ np.diag([0.3, 3.0]) @ R.T
        >>> q, eye = np.array([0.0, 1.0]), np.eye(2)
        >>> t = brentq(lambda t: q @ (cov(t) + eye) @ np.linalg.solve(cov(t) - eye, cov(t)) @ q, 0, np.pi / 2)
        >>> prob = denoise.DenoisingProblem([0.4, 0.6], [[2.0, 0.0], [-2.0, 0.0]], xi=1.0, cov=cov(t))
        >>> heads = denoise.fewer_heads(prob)
        >>> aug, z = denoise.augment, jnp.array([[1.0, 1.0], [2.0, -1.0]])
        >>> out = gmlib.apply_heads(heads, aug(prob.noisy), aug(z))[:, :-1]
        >>> heads.n_heads, denoise.heads_needed(prob, constant_token=True), bool(jnp.allclose(out, prob.bayes(z)))
        (1, 2, True)
    """
    d = problem.dim
    r, _, why = _plan(problem, True)
    if why is not None and "offsets" in why:
        raise ValueError(f"no Bayes-gated heads for `problem`: {why}")
    if d < 2 or r != d - 1:
        raise ValueError(f"`problem` must have means on an affine hyperplane (r = d - 1 >= 1); got r = {r}, d = {d}")
    m, x2 = np.asarray(problem.means, np.float64), float(problem.xi) ** 2
    S, cov = np.asarray(problem.S, np.float64), np.asarray(problem.covariance, np.float64)
    shift = cov - x2 * np.eye(d)  # Gamma - xi^2 I
    low = np.abs(np.linalg.eigvalsh(shift)).min()
    if low <= _tol(problem.dtype) * max(1.0, np.abs(S).max()):
        raise ValueError(f"`problem` must have Gamma - xi^2 I invertible; got smallest |eigenvalue| {low:.3g}")
    q = np.linalg.svd(m[:-1] - m[-1])[2][-1]  # the unit normal of the means' affine span
    gain = np.linalg.solve(shift, cov)
    condition = q @ S @ gain @ q
    if abs(condition) > 100 * _tol(problem.dtype) * np.linalg.norm(S, 2) * np.linalg.norm(gain, 2):
        raise ValueError("no d - 1 Bayes-gated heads for `problem` (Proposition 8.3): q^T S (Gamma - xi^2 I)^-1 "
                         f"Gamma q = {condition:.3g} != 0, q the unit normal of the means' span")
    return _fewer(m, x2, S, q, problem.dtype)


def _fewer(m, x2, S, q, dtype) -> Heads:
    """The heads of :func:`fewer_heads` (its docstring has the formulas), in float64 numpy."""
    d = len(q)
    h = d - 1
    S_inv = np.linalg.inv(S)
    R = np.eye(d) - 2 * x2 * S_inv  # (Gamma - xi^2 I) S^{-1}
    w = np.linalg.solve(R.T, q)
    x = w / (w @ w)
    plane = np.linalg.svd(w[None])[2][1:]  # (d - 1, d): an orthonormal basis of w^T a = 0
    a = list(plane[:-1])
    a.append(x2 * q + (q @ S @ q) * x - sum(a, np.zeros(d)))
    E = np.linalg.solve(np.column_stack([x, *a]), R)[1:]
    W = np.outer(x, q)
    Sq = S @ q
    V = [np.outer(aj, Sq) / (Sq @ Sq) for aj in a[:-1]]
    V.append(x2 * S_inv + W - sum(V, np.zeros((d, d))))
    half = 0.5 * np.sum(m @ S_inv * m, axis=1)
    b = np.linalg.pinv(m[:-1] - m[-1]) @ (half[-1] - half[:-1])
    U_aug, V_aug = np.zeros((h, d + 1, d + 1)), np.zeros((h, d + 1, d + 1))
    U_aug[:, :d, :d] = S_inv + q[None, :, None] * E[:, None, :]
    U_aug[:, :d, d] = b
    V_aug[:, :d, :d] = V
    V_aug[:, :d, d] = -np.stack(V) @ S @ b - W @ m[-1] / h
    V_aug[:, d, d] = 1.0 / h
    return unchecked(Heads, jnp.asarray(U_aug, dtype), jnp.asarray(V_aug, dtype), None, False)


def small_score_head(problem: DenoisingProblem, eps) -> Heads:
    r"""A head of small scores and large values whose output tends to :math:`(\Gamma - \xi^2 I) S^{-1} z` (Proposition 8.5).

    Let :math:`\varepsilon` denote ``eps``, :math:`\bar m = \sum_k \pi_k m_k`,
    :math:`C = \operatorname{Cov}(Z) = S + \sum_k \pi_k (m_k - \bar m)(m_k - \bar m)^\top`,
    :math:`R = (\Gamma - \xi^2 I) S^{-1}` and :math:`W = R C^{-1}`. On augmented tokens
    (:func:`augment`) the head is

    .. math::

        U_\varepsilon = \begin{pmatrix}\varepsilon I_d & 0 \\ 0 & 0\end{pmatrix},\qquad
        V_\varepsilon = \begin{pmatrix} W/\varepsilon & -W \bar m/\varepsilon \\ 0 & 0\end{pmatrix},

    and the first d coordinates of :math:`T_{U_\varepsilon, V_\varepsilon}[\mu_Z](z)` are
    :math:`R z + O(\varepsilon \|z\|^2)` (its gates barely depart from :math:`\pi_k`; the last
    coordinate is 0). Beside the attention head of :func:`skip_head_bayes` it replaces the
    skip connection: the two heads summed have excess risk :math:`O(\varepsilon^2)`, for any M
    and any :math:`\Gamma` (Proposition 8.5 of the book: the infimum over two augmented heads
    is 0, with values of size :math:`1/\varepsilon`).

    Args:
        problem: a :class:`DenoisingProblem` (any M, any covariance).
        eps: :math:`\varepsilon > 0`, a finite number.

    Returns:
        a :class:`gmlib.Heads` of one head on augmented tokens: U and V of shape
        (1, d + 1, d + 1).

    Raises:
        ValueError: naming ``eps`` when it is not a positive finite number.

    Example:
        >>> prob = denoise.DenoisingProblem([0.3, 0.7], [[2.0, 0.0], [0.0, 2.0]], gamma=1.0, xi=1.0)
        >>> skip = denoise.skip_head_bayes(prob, constant_token=True)
        >>> small = denoise.small_score_head(prob, 1e-3)
        >>> pair = gmlib.Heads(U=skip.U.at[1].set(small.U[0]), V=skip.V.at[1].set(small.V[0]))
        >>> aug, z = denoise.augment, jnp.array([[1.0, 1.0], [2.0, -1.0]])
        >>> out = gmlib.apply_heads(pair, aug(prob.noisy), aug(z))[:, :-1]
        >>> bool(jnp.abs(out - prob.bayes(z)).max() < 1e-2)  # close to the Bayes denoiser
        True
    """
    eps = C.scalar(eps, "eps", low=0)
    return _small_score(problem, jnp.asarray(eps, problem.dtype))


@jax.jit
def _small_score(p, eps):
    d, dt = p.dim, p.dtype
    eye = jnp.eye(d, dtype=dt)
    S = p.S
    R = eye - 2 * p.xi**2 * jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(S), eye)
    m_bar = p.weights @ p.means
    dev = p.means - m_bar
    cov_z = S + dev.T @ (p.weights[:, None] * dev)
    W = jnp.linalg.solve(cov_z, R.T).T  # R C^{-1} (C symmetric)
    U = jnp.zeros((d + 1, d + 1), dt).at[:d, :d].set(eps * eye)
    V = jnp.zeros((d + 1, d + 1), dt).at[:d, :d].set(W / eps).at[:d, d].set(-W @ m_bar / eps)
    return unchecked(Heads, U[None], V[None], None, False)
