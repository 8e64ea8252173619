r"""The Bayes-optimal in-context denoiser: the posterior mean over tasks (the book's construction).

A task :math:`\tau = (m_1, m_2, \pi_1)` of :func:`gmlib.denoise.task_sampler` has its means
independent and uniform on the sphere of radius r in :math:`\mathbb R^d` and :math:`\pi_1`
uniform on :math:`[\pi_{lo}, \pi_{hi}]`; the tokens and the queries are noisy draws
:math:`z \sim \pi_1 \mathcal N(m_1, sI) + \pi_2 \mathcal N(m_2, sI)`, :math:`s = \gamma^2 + \xi^2`.
The best any predictor can do from a finite prompt, for the squared loss, is the posterior
mean :math:`\mathbb E[X \mid z_1, \dots, z_L, z]` (:func:`in_context_bayes`): the reference
the book measures trained attention and the plug-in estimator
(:func:`gmlib.denoise.estimate_task`) against. It is not in the paper.

Because every task's Bayes denoiser is the same affine map of the posterior means of the
components, the posterior mean over tasks is itself a Bayes denoiser: that of the
*predictive* mixture :math:`\sum_\theta H(\theta)\, \mathcal N(r e_\theta, sI)`, whose
mixing measure :math:`H = \mathbb E[\pi_1 \delta_{m_1} + \pi_2 \delta_{m_2} \mid z_{1..L}]`
is read from the prompt once and serves every query. In d = 2 it is computed on a grid (the
two means' angles by the trapezoid rule, :math:`\pi_1` by Gauss–Legendre), in d = 1 exactly,
and in any d by self-normalised importance sampling with a proposal centred on an EM fit.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib import _random
from gmlib._dtypes import common_float_dtype

__all__ = ["in_context_bayes"]

#: Tokens multiplied together before one logarithm (a block's likelihood ratio stays above
#: the dtype's smallest normal number except where the block is hopeless; see ``_grid_kernel``).
_BLOCK = {4: 16, 8: 32}
#: The shares of the importance-sampling proposal: the prior (defensive), then the two labellings.
_SHARES = (0.2, 0.4, 0.4)
#: Rounds of refitting the proposal to its own weighted draws before the final draw.
_ROUNDS = 2
#: EM iterations of the proposal's start: on long prompts of overlapping components 50 leave the
#: fit farther from the posterior's mode than its width, and the importance weights collapse
#: (estimates off by many standard errors; tests: the long overlapping prompt).
_EM_ITER = 500


def in_context_bayes(prompt, queries, mask=None, *, gamma, xi, radius=3.0, weight_range=(0.2, 0.8),
                     n_angles: int | None = None, n_weights: int | None = None, key=None,
                     n_samples: int | None = None,
                     return_error: bool = False):
    r"""The Bayes-optimal in-context denoiser: the posterior mean of X given the prompt and the query.

    Let :math:`z_1, \dots, z_L` denote the rows of ``prompt`` that ``mask`` keeps, noisy
    draws of one task :math:`\tau = (m_1, m_2, \pi_1)` of :func:`gmlib.denoise.task_sampler`
    (means uniform on the sphere of radius r = ``radius``, :math:`\pi_1` uniform on
    ``weight_range``), and z a row of ``queries``, one more draw of the task. With
    :math:`s = \gamma^2 + \xi^2`, :math:`a = \xi^2/s` and the task's Bayes denoiser
    :math:`f_\tau(z) = (1 - a) z + a \sum_k \beta_k(z; \tau)\, m_k` (eq 10,
    :math:`\beta_k = \operatorname{softmax}_k(\log \pi_k + m_k^\top z/s)`, the norms equal),

    .. math::

        \begin{aligned}
        f^\star(z) &= \mathbb E[X \mid z_{1..L}, z]
        = \frac{\int w(\tau)\, f_\tau(z)\, d\tau}{\int w(\tau)\, d\tau},\\
        w(\tau) &= p(\tau) \prod_{i=1}^L p_\tau(z_i)\; p_\tau(z),
        \end{aligned}

    :math:`p_\tau = \pi_1 \mathcal N(m_1, sI) + \pi_2 \mathcal N(m_2, sI)` (the query's own
    likelihood enters). As :math:`p_\tau(z) \beta_k(z; \tau) \propto \pi_k e^{m_k^\top z/s}`,
    :math:`f^\star` is the Bayes denoiser of the predictive mixture,

    .. math::

        \begin{aligned}
        f^\star(z) &= (1 - a) z + a\, \frac{\int e^{m^\top z/s}\, m\, H(dm)}{\int e^{m^\top z/s}\, H(dm)},\\
        H &= \mathbb E\big[\pi_1 \delta_{m_1} + \pi_2 \delta_{m_2} \,\big|\, z_{1..L}\big]:
        \end{aligned}

    the minimiser of :math:`\mathbb E\|f(z_{1..L}, z) - X\|^2` (and of the excess over
    :math:`f_\tau`) over all predictors, the book's reference on finite prompts (chapter 7;
    not in the paper), beside the plug-in :func:`gmlib.denoise.estimate_task`.

    **d ≤ 2: quadrature.** The means' angles on ``n_angles`` equispaced points each (the
    trapezoid rule, spectrally accurate for periodic integrands), :math:`\pi_1` on
    ``n_weights`` Gauss–Legendre nodes (d = 1: the sphere is :math:`\{\pm r\}`, exact). The
    prompt's likelihood is streamed over blocks of tokens (memory O(grid), not O(grid × L)):
    a token's factor :math:`\pi_1 u_i(\theta_1) + \pi_2 u_i(\theta_2) \le 1`,
    :math:`u_i(\theta) = e^{r(e_\theta^\top z_i - \|z_i\|)/s}`, is multiplied over 16
    (float32) or 32 (float64) tokens before one logarithm, floored at the dtype's smallest
    normal number: exact except at grid points where a block is :math:`e^{-87}` (float32)
    less likely than its best explanation, points of negligible posterior weight. With
    ``weight_range`` symmetric about 1/2 the relabelling :math:`(m_1, \pi_1) \leftrightarrow
    (m_2, \pi_2)` halves the grid, exactly. By default the grid follows L: an angle's
    posterior standard deviation is about :math:`\sigma_\theta = \sqrt{s/(r^2\pi_{hi}L)}` and
    :math:`\pi_1`'s at most :math:`1/(2\sqrt L)`, and the grid keeps the steps below 1.5
    and 1.25 of them,

    .. math::

        \begin{aligned}
        n_{\rm angles} &= \max\Big(64, 8\Big\lceil \frac{2\pi r}{12}
        \sqrt{\frac{\pi_{hi}(L + 1)}{s}}\Big\rceil\Big),\\
        n_{\rm weights} &= \max\big(8, 2\lceil 1.25(\pi_{hi} - \pi_{lo})\sqrt{L + 1}\rceil\big)
        \end{aligned}

    (L the number of rows, masked or not): (64, 8), (72, 14), (128, 26) at L = 16, 64, 256
    for r = 3, s = 2, where the predictions are within 1e-5 (root mean square; 1e-4 at
    worst) of a grid twice as fine and the mean excess within 1e-7. The cost grows like
    :math:`L^{5/2}` (512 prompts of 256 tokens: about 4 s in float32, 10 s in float64 on
    two CPU cores); for L in the thousands use Monte Carlo (``n_samples``), and over very
    many prompts ``jax.lax.map`` with a ``batch_size`` rather than ``jax.vmap`` (each
    prompt holds its grid: 1.7 MB in float64 at L = 256).

    **Monte Carlo** (d ≥ 3, or d = 2 with ``n_samples``): self-normalised importance
    sampling of ``n_samples`` tasks from a defensive mixture, 20 % the prior and 40 % each
    labelling of a proposal about an EM fit of the prompt (each mean from the power spherical
    law :math:`\propto ((1 + \mu_k^\top u)/2)^{\kappa_k}` about the fitted direction, with
    :math:`\kappa_k = r\|\sum_i r_{ik} z_i\|/s`, twice the spread of the fitted component's
    posterior, and :math:`\pi_1` from a Beta law with twice its posterior variance), refitted
    twice to its own weighted draws (each mean's spread never narrowed); only the last
    round's draws are used, with the exact density of the proposal they came from. The
    weights are at most the likelihood over 0.2. The effective sample size (measured on
    prompts of ``task_sampler``, r = 3, s = 2, L from 16 to 2000) is in the median about 40 %
    of ``n_samples`` in d = 2, 30 % in d = 3 and 15 % in d = 5, and above 5 % for nine
    prompts in ten (a few prompts with nearly equal means, whose posterior is a ridge, fall
    to 1 %); take ``n_samples`` of a few thousand. The standard error is the delta-method
    one of a ratio, :math:`a(\sum_s \bar w_s^2 (E_s - \hat E)^2)^{1/2}` per coordinate
    (:math:`\bar w_s` the normalised weights, :math:`E_s` each draw's posterior mean of the
    component mean at z, :math:`\hat E` their weighted mean); the tests check it against the
    spread over independent keys. Cost: 3 × ``n_samples`` × (L + Q) likelihoods.

    Args:
        prompt: tokens, shape (L, d), L ≥ 0.
        queries: shape (Q, d).
        mask: ``None`` (every token counts) or booleans, shape (L,): the tokens that count
            (all False: the empty prompt, whose answer is the prior predictive mean).
        gamma: :math:`\gamma \ge 0`, a number.
        xi: :math:`\xi > 0`, a number.
        radius: r > 0, the norm of the means.
        weight_range: ``(low, high)`` with 0 < low ≤ high < 1.
        n_angles: angles per mean (d = 2), a positive int (default: the rule above).
        n_weights: Gauss–Legendre nodes for :math:`\pi_1` (d ≤ 2), a positive int (default:
            the rule above).
        key: a ``jax.random`` key (Monte Carlo).
        n_samples: tasks drawn (Monte Carlo), a positive int; with ``key``, required when
            d ≥ 3 (ignored in d = 1, which is exact).
        return_error: also return an error estimate, shape (Q, d): for the quadrature the
            absolute difference to the grid of half the angles and half the weights (an
            overestimate: the rules converge spectrally, the full grid's error is far
            smaller), for Monte Carlo the standard error.

    Returns:
        array (Q, d), in the dtype of ``prompt`` and ``queries`` (float32 is about twice as
        fast), or ``(estimate, error)`` with ``return_error``. Traceable in ``prompt``,
        ``queries``, ``mask`` and ``key``: ``jax.vmap`` it over prompts (the other arguments
        are concrete numbers; values are checked only on concrete inputs).

    Raises:
        ValueError: naming the argument: ``prompt`` or ``queries`` of the wrong shape or
            not finite, ``mask`` not booleans of shape (L,), ``gamma < 0``, ``xi <= 0``,
            ``radius <= 0``, ``weight_range`` outside 0 < low ≤ high < 1, ``n_angles``,
            ``n_weights`` or ``n_samples`` not positive ints, ``n_samples`` or ``key``
            missing for Monte Carlo.

    Example:
        >>> batch = denoise.task_sampler(1.0, 1.0, 2, n_queries=4)(jax.random.key(0), 8, 64)
        >>> best = jax.vmap(lambda p, q: denoise.in_context_bayes(p, q, gamma=1.0, xi=1.0))
        >>> best(batch.prompt, batch.queries).shape
        (8, 4, 2)
        >>> z = jax.random.normal(jax.random.key(1), (16, 3))
        >>> est, se = denoise.in_context_bayes(z, z[:2], gamma=1.0, xi=1.0, key=jax.random.key(2),
        ...                                    n_samples=1000, return_error=True)
        >>> est.shape, se.shape
        ((2, 3), (2, 3))
    """
    prompt = C.array(prompt, "prompt", ("L", "d"))
    d = prompt.shape[1]
    if d < 1:
        raise ValueError(f"`prompt` must have shape (L, d) with d >= 1; got {tuple(prompt.shape)}")
    queries = C.array(queries, "queries", ("Q", "d"), dims={"d": d})
    dtype = common_float_dtype(prompt, queries)
    prompt, queries = prompt.astype(dtype), queries.astype(dtype)
    keep = _mask(mask, prompt.shape[0])
    gamma = C.scalar(gamma, "gamma", low=0, strict=False)
    xi = C.scalar(xi, "xi", low=0)
    radius = C.scalar(radius, "radius", low=0)
    lo, hi = _weight_range(weight_range)
    auto_angles, auto_weights = _grid_size(prompt.shape[0], gamma=gamma, xi=xi, radius=radius,
                                          weight_range=(lo, hi))
    n_angles = auto_angles if n_angles is None else C.scalar(n_angles, "n_angles", low=0, integer=True)
    n_weights = auto_weights if n_weights is None else C.scalar(n_weights, "n_weights", low=0, integer=True)
    if n_samples is not None:
        n_samples = C.scalar(n_samples, "n_samples", low=0, integer=True)
    s = gamma**2 + xi**2
    a = jnp.asarray(xi**2 / s, dtype)
    radius, s = jnp.asarray(radius, dtype), jnp.asarray(s, dtype)
    if d <= 2 and (n_samples is None or d == 1):
        rule = _rule(d, n_angles, n_weights, lo, hi, dtype)
        est = _grid_predict(prompt, keep, queries, radius, s, a, *rule)
        if not return_error:
            return est
        coarse = _rule(d, max(n_angles // 2, 1), max(n_weights // 2, 1), lo, hi, dtype)
        return est, jnp.abs(est - _grid_predict(prompt, keep, queries, radius, s, a, *coarse))
    if n_samples is None or key is None:
        raise ValueError(f"`n_samples` and `key` are both required for Monte Carlo (d = {d}: the quadrature "
                         f"is for d <= 2); got n_samples={n_samples}, key={key}")
    est, se = _mc_predict(key, prompt, keep, queries, radius, s, a, lo, hi, n_samples)
    return (est, se) if return_error else est


# ----------------------------------------------------------------------------- checks


def _mask(mask, length):
    """``mask`` as booleans (L,) (all True for ``None``), or raise naming it."""
    if mask is None:
        return jnp.ones((length,), bool)
    m = mask if isinstance(mask, jax.Array) else np.asarray(mask)
    if m.dtype != bool or m.shape != (length,):
        raise ValueError(f"`mask` must be booleans of shape (L,) = ({length},); got dtype {m.dtype}, "
                         f"shape {tuple(m.shape)}")
    return jnp.asarray(m)


def _weight_range(weight_range):
    """``(low, high)`` as Python floats with 0 < low <= high < 1 (concrete: they shape the quadrature)."""
    try:
        wr = np.asarray(weight_range, dtype=np.float64)
    except (TypeError, ValueError):  # ragged, non-numeric or traced
        wr = None
    if wr is None or wr.shape != (2,) or not 0 < wr[0] <= wr[1] < 1:
        raise ValueError(f"`weight_range` must be two concrete numbers (low, high) with 0 < low <= high < 1; "
                         f"got {weight_range!r}")
    return float(wr[0]), float(wr[1])


def _grid_size(length: int, *, gamma, xi, radius=3.0, weight_range=(0.2, 0.8)):
    """The default (n_angles, n_weights) of :func:`in_context_bayes` for ``length`` rows (its docstring)."""
    length = C.scalar(length, "length", low=0, strict=False, integer=True)
    s = C.scalar(gamma, "gamma", low=0, strict=False) ** 2 + C.scalar(xi, "xi", low=0) ** 2
    radius = C.scalar(radius, "radius", low=0)
    lo, hi = _weight_range(weight_range)
    n_angles = max(64, 8 * math.ceil(2 * math.pi * radius * math.sqrt(hi * (length + 1) / s) / 12))
    n_weights = max(8, 2 * math.ceil(1.25 * (hi - lo) * math.sqrt(length + 1)))
    return n_angles, n_weights


# ----------------------------------------------------------------------------- quadrature (d <= 2)


def _rule(d, n_angles, n_weights, lo, hi, dtype):
    """Directions (n, d) (equal weights), the nodes of pi_1 and their log-weights (normalised).

    With ``lo + hi = 1`` only the nodes of pi_1 >= 1/2 are kept, the others' weights folded
    onto their mirror images (the relabelling symmetry; the formula of ``_grid_kernel`` for H is
    unchanged).
    """
    if d == 1:
        dirs = np.array([[1.0], [-1.0]])
    else:
        th = 2 * np.pi * np.arange(n_angles) / n_angles
        dirs = np.stack([np.cos(th), np.sin(th)], axis=-1)
    x, w = np.polynomial.legendre.leggauss(n_weights if hi > lo else 1)
    if abs(lo + hi - 1) <= 1e-12:
        keep = x >= 0
        x, w = x[keep], np.where(x > 0, 2 * w, w)[keep]
        lo = 1 - hi
    p = 0.5 * (lo + hi) + 0.5 * (hi - lo) * x
    return (jnp.asarray(dirs, dtype), jnp.asarray(p, dtype), jnp.asarray(np.log(w / w.sum()), dtype))


@jax.jit
def _grid_predict(prompt, keep, queries, r, s, a, dirs, p, log_w):
    log_h = _grid_kernel(prompt, keep, r / s, dirs, p, log_w)
    beta = jax.nn.softmax(log_h + (r / s) * queries @ dirs.T, axis=-1)
    return (1 - a) * queries + a * r * beta @ dirs


def _grid_kernel(z, keep, scale, dirs, p, log_w):
    r"""The log of the predictive mixing measure H on the directions, shape (n,).

    ``ell[j, t1, t2]`` is the prompt's log-likelihood at :math:`(\theta_1, \theta_2, \pi_j)` up to
    a constant; :math:`H(\theta) = \sum_j w_j [\pi_j \sum_{t_2} e^{\ell_{j\theta t_2}} +
    (1 - \pi_j) \sum_{t_1} e^{\ell_{j t_1 \theta}}]`.
    """
    dt = z.dtype
    length, n = z.shape[0], dirs.shape[0]
    k = min(_BLOCK[jnp.dtype(dt).itemsize], max(length, 1))
    n_blocks = -(-length // k)
    u = jnp.exp(scale * (z @ dirs.T - jnp.linalg.norm(z, axis=-1, keepdims=True)))  # (L, n), <= 1
    u = jnp.where(keep[:, None], u, 1)  # a factor of exactly 1: the token does not count
    u = jnp.pad(u, ((0, n_blocks * k - length), (0, 0)), constant_values=1).reshape(n_blocks, k, n)
    pj = p[:, None, None]
    tiny = jnp.finfo(dt).tiny

    def block(ell, ub):
        ub = jax.lax.optimization_barrier(ub)  # materialised, so that the product below vectorises
        f = jnp.ones((), dt)
        for i in range(k):
            f = f * (ub[i][None, None, :] + pj * (ub[i][None, :, None] - ub[i][None, None, :]))
        return ell + jnp.log(jnp.maximum(f, tiny)), None

    ell, _ = jax.lax.scan(block, jnp.zeros((p.shape[0], n, n), dt), u)
    ell = ell + log_w[:, None, None]
    first = jax.nn.logsumexp(ell + jnp.log(p)[:, None, None], axis=(0, 2))
    second = jax.nn.logsumexp(ell + jnp.log1p(-p)[:, None, None], axis=(0, 1))
    return jnp.logaddexp(first, second)


# ----------------------------------------------------------------------------- Monte Carlo (any d >= 2)


@partial(jax.jit, static_argnums=(7, 8, 9))
def _mc_predict(key, z, keep, queries, r, s, a, lo, hi, n_samples):
    means, log_pi, log_w = _mc_samples(key, z, keep, r, s, lo, hi, n_samples)

    def one(q):
        logits = log_pi + means @ q / s  # (S, 2)
        log_b = log_w + jax.nn.logsumexp(logits, -1)
        wbar = jax.nn.softmax(log_b)
        e = jnp.einsum("sk,skd->sd", jax.nn.softmax(logits, -1), means)  # E[component mean | q, tau_s]
        est = wbar @ e
        se = jnp.sqrt(jnp.sum(wbar[:, None] ** 2 * (e - est) ** 2, 0))
        return (1 - a) * q + a * est, a * se

    return jax.lax.map(one, queries)


def _mc_samples(key, z, keep, r, s, lo, hi, n_samples):
    """Tasks drawn from the last proposal: means (S, 2, d), log pi (S, 2), log importance weights (S,).

    The proposal starts from the EM fit (``_proposal``) and is refitted to its own weighted
    draws (``_refit``) after each of ``_ROUNDS + 1`` rounds of ``n_samples`` draws; only the
    last round's draws are returned, with the weights of the proposal they were drawn from
    (ordinary importance weights of a known density).
    """
    d, dt = z.shape[1], z.dtype

    def round_(i, state):
        prop, _ = state
        u1, u2, t = _draw(jax.random.fold_in(key, i), prop, n_samples, d, dt)
        log_pi, log_w = _log_weights(u1, u2, t, prop, z, keep, r, s, lo, hi)
        return _refit(prop, u1, u2, t, log_w, lo, hi), (r * jnp.stack([u1, u2], 1), log_pi, log_w)

    empty = (jnp.zeros((n_samples, 2, d), dt), jnp.zeros((n_samples, 2), dt), jnp.zeros(n_samples, dt))
    return jax.lax.fori_loop(0, _ROUNDS + 1, round_, (_proposal(z, keep, r, s, lo, hi), empty))[1]


def _draw(key, prop, n, d, dt):
    r"""n draws (u1 (n, d), u2 (n, d), t (n,)) of the defensive mixture: the prior, labelling A, labelling B.

    All three are one family with per-draw parameters (the prior: concentrations 0 and
    Beta(1, 1)), so that one call draws every gamma variate: the power spherical law of
    ``_power_spherical_logpdf`` has :math:`(1 + \mu^\top u)/2 \sim \mathrm{Beta}(a_0 + \kappa, a_0)`,
    :math:`a_0 = (d - 1)/2`, and its component orthogonal to :math:`\mu` uniform.
    """
    centres, kappas, beta_a, beta_b = prop
    k_c, k_g, k_n = jax.random.split(key, 3)
    label = _random.categorical(k_c, jnp.log(jnp.asarray(_SHARES, dt)), n)
    cen = jnp.stack([centres, centres, centres[::-1]])[label]  # (n, 2, d)
    kap = jnp.stack([jnp.zeros_like(kappas), kappas, kappas[::-1]])[label]  # (n, 2)
    bet = jnp.stack([jnp.ones_like(beta_a), beta_a, beta_b])[label]  # (n, 2)
    a0 = jnp.full((n, 2), 0.5 * (d - 1), dt)
    g = _gamma(k_g, jnp.concatenate([a0 + kap, a0, bet], -1))
    x, y = g[:, :2], g[:, 2:4]
    v = _random.normal(k_n, (n, 2, d), dt)
    # einsum, not jnp.sum(v * cen, -1, keepdims=True) * cen: jaxlib 0.10's CPU backend miscompiles that
    # product in float32 under jit for a last axis of 3 and ~10^4 rows (tests: float32 under jit and vmap)
    v = v - jnp.einsum("nkd,nkd->nk", v, cen)[..., None] * cen
    v = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
    u = ((x - y) / (x + y))[..., None] * cen + (2 * jnp.sqrt(x * y) / (x + y))[..., None] * v
    return u[:, 0], u[:, 1], g[:, 4] / (g[:, 4] + g[:, 5])


def _gamma(key, alpha, tries=12):
    r"""Gamma(alpha) variates, shape of ``alpha``: Marsaglia and Tsang's method with a fixed number of tries.

    ``tries`` candidates :math:`d v` with :math:`v = (1 + c\,n)^3`, :math:`d = a - 1/3`,
    :math:`c = 1/\sqrt{9d}`, the first accepted kept (for :math:`\alpha < 1`, :math:`a = \alpha + 1`
    and the draw times :math:`U^{1/\alpha}`). The acceptance rate is at least 0.95 for
    :math:`a \ge 1`, so all tries fail with probability below :math:`10^{-15}`: the law is
    Gamma(alpha) to that accuracy, without the while loop of ``jax.random.gamma``, which is
    slow to compile on a CPU.
    """
    dt = alpha.dtype
    k_n, k_u, k_b = jax.random.split(key, 3)
    boost = alpha < 1
    a = jnp.where(boost, alpha + 1, alpha)
    d = a - 1 / 3
    c = 1 / jnp.sqrt(9 * d)
    shape = (tries, *alpha.shape)
    n = _random.normal(k_n, shape, dt)
    v = (1 + c * n) ** 3
    log_u = jnp.log(_random.uniform(k_u, shape, dt))
    ok = (v > 0) & (log_u < 0.5 * n**2 + d - d * v + d * jnp.log(jnp.where(v > 0, v, 1)))
    first = jnp.argmax(ok, axis=0)
    x = d * jnp.take_along_axis(v, first[None], axis=0)[0]
    u = _random.uniform(k_b, alpha.shape, dt)
    return jnp.where(boost, x * jnp.exp(jnp.log(u) / alpha), x)


def _log_weights(u1, u2, t, prop, z, keep, r, s, lo, hi):
    """log pi (n, 2) and the log importance weights (n,): prior times prompt likelihood over the proposal."""
    centres, kappas, beta_a, beta_b = prop
    d = z.shape[1]
    log_q = jnp.stack([
        jnp.full(t.shape, math.log(_SHARES[0]) - 2 * _log_sphere(d), t.dtype),
        math.log(_SHARES[1]) + _proposal_logpdf(u1, u2, t, centres, kappas, beta_a),
        math.log(_SHARES[2]) + _proposal_logpdf(u1, u2, t, centres[::-1], kappas[::-1], beta_b)])
    pi1 = lo + (hi - lo) * t
    log_pi = jnp.stack([jnp.log(pi1), jnp.log1p(-pi1)], -1)
    log_prior = -2 * _log_sphere(d)  # t uniform on [0, 1]: pi_1 uniform on [lo, hi]
    loglik = _mc_loglik(z, keep, r * jnp.stack([u1, u2], 1) / s, log_pi)
    return log_pi, log_prior - jax.nn.logsumexp(log_q, axis=0) + loglik


def _refit(prop, u1, u2, t, log_w, lo, hi):
    r"""The proposal refitted to weighted draws: each labelling's moments, twice the spread, never narrower.

    Draws are aligned to labelling A (swapped when closer to B); a mean's power-spherical
    concentration matches :math:`\mathbb E[\mu^\top u] = \kappa/(\kappa + d - 1)`, halved,
    and capped by the previous one; t's Beta law matches the weighted mean and twice the
    variance.
    """
    centres, kappas, _, _ = prop
    d = u1.shape[1]
    wbar = jax.nn.softmax(log_w)
    swap = (u1 @ centres[1] + u2 @ centres[0]) > (u1 @ centres[0] + u2 @ centres[1])
    a1 = jnp.where(swap[:, None], u2, u1)
    a2 = jnp.where(swap[:, None], u1, u2)
    pi_a = jnp.where(swap, 1 - (lo + (hi - lo) * t), lo + (hi - lo) * t)
    res = jnp.stack([wbar @ a1, wbar @ a2])
    rho = jnp.clip(jnp.linalg.norm(res, axis=-1), 0, 1 - 1e-6)
    new_c = jnp.where((rho > 0)[:, None], res / jnp.maximum(rho, jnp.finfo(rho.dtype).tiny)[:, None], centres)
    new_k = jnp.minimum(0.5 * (d - 1) * rho / (1 - rho), kappas)
    width = max(hi - lo, 1e-300)

    def beta_of(pi):
        tt = jnp.clip((pi - lo) / width, 0, 1)
        mean = jnp.clip(wbar @ tt, 0.05, 0.95)
        var = 2 * (wbar @ (tt - mean) ** 2) + 1e-12
        return _beta_params(mean, var)

    return new_c, new_k, beta_of(pi_a), beta_of(1 - pi_a)


def _beta_params(mean, var):
    """Beta parameters (both >= 1) of the given mean and variance (the concentration at least 2)."""
    conc = jnp.maximum(mean * (1 - mean) / var - 1, 2)
    return jnp.stack([jnp.maximum(mean * conc, 1), jnp.maximum((1 - mean) * conc, 1)])


def _mc_loglik(z, keep, scaled_means, log_pi, block=32):
    """Each sample's prompt log-likelihood (up to a constant), summed over blocks of tokens."""
    length = z.shape[0]
    n_blocks = -(-length // block)
    zp = jnp.pad(z, ((0, n_blocks * block - length), (0, 0))).reshape(n_blocks, block, z.shape[1])
    kp = jnp.pad(keep, (0, n_blocks * block - length)).reshape(n_blocks, block)

    def step(total, blk):
        zb, kb = blk
        ll = jax.nn.logsumexp(log_pi[:, :, None] + jnp.einsum("skd,bd->skb", scaled_means, zb), axis=1)
        return total + jnp.sum(jnp.where(kb, ll, 0), -1), None

    return jax.lax.scan(step, jnp.zeros(scaled_means.shape[0], z.dtype), (zp, kp))[0]


def _masked_em(z, keep, s, n_iter=50):
    r"""EM for two components of covariance sI on the kept tokens (the start of ``estimate_task``).

    Returns the responsibilities' totals (2,) and resultants :math:`\sum_i r_{ik} z_i` (2, d).
    """
    w = keep.astype(z.dtype)
    n = jnp.maximum(w.sum(), 1)
    centre = w @ z / n
    dev = (z - centre) * w[:, None]
    lam, vec = jnp.linalg.eigh(dev.T @ dev / n)
    step = jnp.sqrt(jnp.maximum(lam[-1], 0)) * vec[:, -1]
    tiny = jnp.finfo(z.dtype).tiny

    def update(_, state):
        log_pi, means, _, _ = state
        logits = log_pi - jnp.sum((z[:, None, :] - means) ** 2, -1) / (2 * s)
        resp = jax.nn.softmax(logits, axis=1) * w[:, None]
        total = resp.sum(0)
        resultant = resp.T @ z
        safe = jnp.maximum(total, tiny)
        return jnp.log(safe / n), resultant / safe[:, None], total, resultant

    init = (jnp.log(jnp.full(2, 0.5, z.dtype)), jnp.stack([centre + step, centre - step]),
            jnp.zeros(2, z.dtype), jnp.zeros((2, z.shape[1]), z.dtype))
    _, _, total, resultant = jax.lax.fori_loop(0, n_iter, update, init)
    return total, resultant


def _proposal(z, keep, r, s, lo, hi):
    """The first proposal, from an EM fit: directions (2, d), concentrations (2,) and the two Beta laws."""
    total, resultant = _masked_em(z, keep, s, _EM_ITER)
    norm = jnp.linalg.norm(resultant, axis=-1)
    e1 = jnp.zeros(z.shape[1], z.dtype).at[0].set(1)
    centres = jnp.where((norm > 0)[:, None], resultant / jnp.where(norm > 0, norm, 1)[:, None], e1)
    kappas = r * norm / s  # the fitted component's vMF concentration, as power-spherical: twice the spread
    n = total.sum()
    width = max(hi - lo, 1e-300)

    def beta_of(n1, n2):  # Beta(n1 + 1, n2 + 1) over [lo, hi], twice the variance, as a Beta law of t
        mean = jnp.clip(((n1 + 1) / (n + 2) - lo) / width, 0.05, 0.95)
        var = 2 * (n1 + 1) * (n2 + 1) / ((n + 2) ** 2 * (n + 3)) / width**2
        return _beta_params(mean, var)

    return centres, kappas, beta_of(total[0], total[1]), beta_of(total[1], total[0])


def _log_sphere(d):
    """log of the area of the unit sphere in R^d."""
    return math.log(2) + 0.5 * d * math.log(math.pi) - math.lgamma(0.5 * d)


def _power_spherical_logpdf(u, mu, kappa):
    """log density on the sphere: kappa log t - log 2 - log B(a0 + kappa, a0) - (a0 - 1) log 4 - log|S^{d-2}|.

    (t = (1 + mu^T u)/2; the law of t is Beta(a0 + kappa, a0), and the surface measure is
    (1 - w^2)^{(d-3)/2} dw dv for u = w mu + sqrt(1 - w^2) v.)
    """
    d = mu.shape[0]
    a0 = 0.5 * (d - 1)
    gammaln = jax.scipy.special.gammaln
    log_b = gammaln(a0 + kappa) + math.lgamma(a0) - gammaln(2 * a0 + kappa)
    log_c = -math.log(2) - log_b - (a0 - 1) * math.log(4) - _log_sphere(d - 1)
    return jax.scipy.special.xlogy(kappa, jnp.maximum(0.5 * (1 + u @ mu), 0)) + log_c


def _proposal_logpdf(u1, u2, t, centres, kappas, beta):
    """log density of one labelling's proposal at (u1, u2, t) (t the position of pi_1 in [lo, hi])."""
    log_beta = (jax.scipy.special.xlogy(beta[0] - 1, t) + jax.scipy.special.xlog1py(beta[1] - 1, -t)
                - jax.scipy.special.betaln(beta[0], beta[1]))
    first = _power_spherical_logpdf(u1, centres[0], kappas[0])
    return first + _power_spherical_logpdf(u2, centres[1], kappas[1]) + log_beta
