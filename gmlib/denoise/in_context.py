r"""In-context denoising (Prop 4.4): one layer of heads for every task, read from the prompt.

A task :math:`\tau = (m_1, m_2, \pi_1)` with :math:`\|m_1\| = \|m_2\|` is drawn afresh for each
prompt, while :math:`\gamma` and :math:`\xi` are shared by all tasks. The residual two-head
layer of Prop 4.4 (:func:`in_context_heads`) is the Bayes denoiser of every task on its
infinite prompt :math:`\mu_Z^\tau`; on a finite prompt it is ordinary softmax attention over
the tokens (``gmlib.apply_heads``). Beside it: :func:`estimate_task`, the plug-in
competitor (EM on the prompt), :func:`finite_prompt_errors`, both on one finite
prompt against the task's Bayes denoiser, and the prompts of in-context training,
:func:`task_sampler`, with :func:`task_excess`, each prompt's excess over its task's Bayes
denoiser. For finite prompts (the book's chapter 7): :func:`excess_by_length` (a layer of
heads at several prompt lengths and at :math:`L = \infty`), :func:`tempered_excess` (the
whole tempered family at once), :func:`plug_in_excess` and :func:`train_in_context` (layers
of two residual heads trained side by side on the same prompts, for every length and seed).
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib import _random
from gmlib._dtypes import common_float_dtype
from gmlib._pytree import unchecked
from gmlib.denoise.problem import DenoisingProblem
from gmlib.heads import Batch, Heads, apply_heads, init_heads
from gmlib.train import _ints, side_by_side

__all__ = ["in_context_heads", "estimate_task", "finite_prompt_errors", "task_sampler", "task_excess",
           "excess_by_length", "tempered_excess", "plug_in_excess", "train_in_context", "trained_excess"]


def in_context_heads(gamma, xi, dim: int, *, temperature=1.0) -> Heads:
    r"""The task-independent residual two-head denoiser of Prop 4.4, at a temperature c.

    Let :math:`c` denote ``temperature``, :math:`d` ``dim``, :math:`S = (\gamma^2 + \xi^2) I_d`
    and :math:`a = \xi^2/(\gamma^2 + \xi^2)`:

    .. math::

        \begin{gathered}
        U_1 = c\,S^{-1},\quad V_1 = a I_d,\quad U_2 = V_2 = 0,\\
        W_{\mathrm{out}} = \big(I_d,\ -a(1 + c) I_d\big),
        \end{gathered}

    residual heads, so that ``gmlib.apply_heads`` computes
    :math:`W_{\mathrm{out}} (z + T_{U_1,V_1}[\mu](z),\ z + T_{U_2,V_2}[\mu](z))`. On a finite
    prompt of noisy tokens :math:`z_1, \dots, z_L` this is

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
        a :class:`gmlib.Heads` with ``residual=True``: U and V of shape (2, d, d),
        ``W_out`` of shape (d, 2d), in the dtype of ``gamma`` and ``xi`` (JAX's default
        float for Python numbers).

    Raises:
        ValueError: naming the argument, for ``gamma < 0``, ``xi <= 0``,
            ``temperature <= 0``, non-finite values or a bad ``dim``.

    Example:
        >>> task = denoise.DenoisingProblem([0.4, 0.6], [[1.0, 1.0], [-1.0, -1.0]], gamma=1.0, xi=0.5)
        >>> tokens, _ = task.noisy.sample(key=jax.random.key(0), n_samples=500)
        >>> queries = jnp.array([[0.5, 0.5], [1.0, -2.0]])
        >>> heads = denoise.in_context_heads(1.0, 0.5, 2, temperature=0.3)
        >>> gmlib.apply_heads(heads, tokens, queries).shape  # a finite prompt
        (2, 2)
        >>> out = gmlib.apply_heads(denoise.in_context_heads(1.0, 0.5, 2), task.noisy, queries)
        >>> bool(jnp.allclose(out, task.bayes(queries)))  # c = 1, the infinite prompt: the task's Bayes
        True
    """
    dim = C.scalar(dim, "dim", low=0, integer=True)
    temperature = C.scalar(temperature, "temperature", low=0)
    dtype = common_float_dtype(gamma, xi)
    gamma = C.scalar(gamma, "gamma", low=0, strict=False)
    xi = C.scalar(xi, "xi", low=0)
    s = gamma**2 + xi**2
    a = xi**2 / s
    eye = jnp.eye(dim, dtype=dtype)
    zero = jnp.zeros((dim, dim), dtype)
    w_out = jnp.concatenate([eye, -a * (1 + temperature) * eye], axis=1)
    return unchecked(Heads, jnp.stack([temperature * eye / s, zero]), jnp.stack([a * eye, zero]), w_out, True)


def estimate_task(prompt, gamma, xi, *, n_iter: int = 50) -> DenoisingProblem:
    r"""Read a two-component task from a finite prompt by EM: the plug-in in-context denoiser.

    Let :math:`z_1, \dots, z_L` denote the rows of ``prompt``, noisy draws of
    :math:`\sum_k \pi_k \mathcal N(m_k, S)` with :math:`S = (\gamma^2 + \xi^2) I_d` known
    (shared by all tasks, as in Prop 4.4). EM for the weights and the means starts from
    :math:`\hat\pi = (\tfrac12, \tfrac12)`, :math:`\hat m_{1,2} = \bar z \pm \sqrt{\lambda}\, v`
    (:math:`\lambda, v` the top eigenpair of the prompt's covariance) and repeats
    ``n_iter`` times

    .. math::

        \begin{gathered}
        r_{ik} = \operatorname{softmax}_k\Big(\log \hat\pi_k
        - \frac{\|z_i - \hat m_k\|^2}{2s}\Big),\\
        \hat\pi_k = \frac1L \sum_i r_{ik},\qquad
        \hat m_k = \frac{\sum_i r_{ik} z_i}{\sum_i r_{ik}}.
        \end{gathered}

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
        >>> truth = denoise.DenoisingProblem([0.4, 0.6], [[1.0, 1.0], [-1.0, -1.0]], gamma=1.0, xi=0.5)
        >>> tokens, _ = truth.noisy.sample(key=jax.random.key(0), n_samples=20_000)
        >>> task = denoise.estimate_task(tokens, 1.0, 0.5)
        >>> queries = jnp.array([[0.5, 0.5], [1.0, -2.0]])
        >>> bool(jnp.abs(task.bayes(queries) - truth.bayes(queries)).max() < 0.05)  # the plug-in denoiser
        True
    """
    n_iter = C.scalar(n_iter, "n_iter", low=0, integer=True)
    prompt = C.array(prompt, "prompt", ("L", "d"), min_rows=2)
    # gamma and xi: checked (by name) by the DenoisingProblem built from them below
    weights, means = _em(prompt, jnp.asarray(gamma**2 + xi**2, prompt.dtype), n_iter)
    return DenoisingProblem(weights, means, jnp.asarray(gamma, prompt.dtype), jnp.asarray(xi, prompt.dtype))


def finite_prompt_errors(heads: Heads, task: DenoisingProblem, *, key, prompt_length: int,
                         n_queries: int = 256):
    r"""Squared errors of a layer of heads and of the plug-in on one finite prompt of a task.

    Draws a prompt of L = ``prompt_length`` noisy tokens :math:`z_1, \dots, z_L` of the task
    (``task.noisy``) and ``n_queries`` fresh noisy queries :math:`z` of the same task, and
    returns, against the task's Bayes denoiser :math:`f^\star_\tau` (eq 10),

    .. math::

        \big\|\hat f[\hat\mu_L](z) - f^\star_\tau(z)\big\|^2 \quad\text{and}\quad
        \big\|\hat f_{\rm EM}(z) - f^\star_\tau(z)\big\|^2,

    where :math:`\hat f[\hat\mu_L]` = ``gmlib.apply_heads(heads, tokens, ·)`` (e.g. the
    layer of :func:`in_context_heads`) and :math:`\hat f_{\rm EM}` the plug-in denoiser of
    :func:`estimate_task` fitted to the same tokens; and the first error at the task's own
    means :math:`m_k` too (the most favourable queries). Traceable: ``jax.vmap`` it over
    tasks and keys. Nothing is checked here (``task`` was checked when it was built).

    Args:
        heads: a :class:`gmlib.Heads` on dimension d with output dimension d.
        task: a :class:`DenoisingProblem`, isotropic (its ``gamma`` and ``xi`` go to the EM).
        key: a ``jax.random`` key; the prompt and the queries use the two halves of
            ``jax.random.split(key)``.
        prompt_length: L, a positive int (static).
        n_queries: queries drawn from the task, a positive int (static).

    Returns:
        ``(attention, at_means, plug_in)``: the squared errors of the heads at the
        queries, shape (n_queries,), at the task's means, shape (M,), and of the plug-in at
        the queries, shape (n_queries,).

    Example:
        >>> task = denoise.DenoisingProblem([0.5, 0.5], [[1.0, 0.0, 1.0], [-1.0, 0.0, -1.0]], gamma=0.8, xi=1.2)
        >>> heads = denoise.in_context_heads(0.8, 1.2, 3)
        >>> attn, at_means, plug = denoise.finite_prompt_errors(
        ...     heads, task, key=jax.random.key(0), prompt_length=1000, n_queries=64)
        >>> attn.shape, at_means.shape, plug.shape
        ((64,), (2,), (64,))
        >>> bool(plug.mean() < attn.mean())  # on 1000 tokens the plug-in is the closer of the two
        True
    """
    k_tok, k_q = jax.random.split(key)
    tokens, _ = task.noisy.sample(key=k_tok, n_samples=prompt_length)
    queries, _ = task.noisy.sample(key=k_q, n_samples=n_queries)
    queries = jnp.concatenate([queries, task.means])
    target = task.bayes(queries)
    sq = jnp.sum((apply_heads(heads, tokens, queries) - target) ** 2, -1)
    plug_in = estimate_task(tokens, task.gamma, task.xi).bayes(queries[:n_queries])
    sq_plug = jnp.sum((plug_in - target[:n_queries]) ** 2, -1)
    return sq[:n_queries], sq[n_queries:], sq_plug


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


def task_sampler(gamma, xi, dim: int, *, radius=3.0, weight_range=(0.2, 0.8), n_queries: int = 1, dtype=None):
    r"""Prompts for in-context denoising (the setting of Prop 4.4), one fresh task per prompt.

    A task is :math:`\tau = (m_1, m_2, \pi_1)` with :math:`m_1, m_2` independent uniform on
    the sphere of radius ``radius`` in :math:`\mathbb R^d`, d = ``dim`` (equal norms, as
    Prop 4.4 needs) and :math:`\pi_1` uniform on ``weight_range``. The prompt holds L noisy
    samples :math:`Z = X + \xi\varepsilon`, :math:`X \sim \sum_k \pi_k \mathcal N(m_k, \gamma^2 I_d)`;
    the queries are ``n_queries`` fresh noisy samples of the same task and the targets their
    clean :math:`X`, so that the squared loss is the denoising risk.

    Args:
        gamma: :math:`\gamma \ge 0`.
        xi: :math:`\xi > 0`.
        dim: d, a positive int.
        radius: the norm of the means, a positive number.
        weight_range: ``(low, high)`` with 0 < low ≤ high < 1.
        n_queries: queries per prompt, a positive int.
        dtype: the floating dtype of every array drawn (default: JAX's default float;
            float32 halves the cost of training on a CPU).

    Returns:
        ``sample(key, batch_size, prompt_length) -> gmlib.Batch``: prompts (B, L, d),
        queries and targets (B, n_queries, d), and ``aux = (means (B, 2, d), weights (B, 2))``
        for :func:`task_excess`. ``sample`` checks nothing (it runs inside training loops).

    Raises:
        ValueError: naming the argument, for a value outside the ranges above.

    Example:
        >>> sample = denoise.task_sampler(0.5, 1.0, 2, n_queries=4)
        >>> batch = sample(jax.random.key(0), 32, 100)  # 32 prompts of 100 tokens
        >>> batch.prompt.shape, batch.queries.shape, batch.targets.shape
        ((32, 100, 2), (32, 4, 2), (32, 4, 2))
    """
    dim = C.scalar(dim, "dim", low=0, integer=True)
    n_queries = C.scalar(n_queries, "n_queries", low=0, integer=True)
    gamma = C.scalar(gamma, "gamma", low=0, strict=False)
    xi = C.scalar(xi, "xi", low=0)
    radius = C.scalar(radius, "radius", low=0)
    dtype = C.check_float_dtype(dtype)
    wr = C.array(weight_range, "weight_range", (2,), dtype=np.float64)
    lo, hi = (float(v) for v in np.asarray(wr))
    if not 0 < lo <= hi < 1:
        raise ValueError(f"`weight_range` must satisfy 0 < low <= high < 1; got {weight_range}")

    def sample(key, batch_size: int, prompt_length: int) -> Batch:
        k_m, k_p, k_x = jax.random.split(key, 3)
        dirs = _random.normal(k_m, (batch_size, 2, dim), dtype)
        means = radius * dirs / jnp.linalg.norm(dirs, axis=-1, keepdims=True)
        p1 = jax.random.uniform(k_p, (batch_size,), dtype, minval=lo, maxval=hi)
        weights = jnp.stack([p1, 1 - p1], axis=-1)
        n = prompt_length + n_queries
        k_c, k_g, k_e = jax.random.split(k_x, 3)
        labels = (_random.uniform(k_c, (batch_size, n), dtype) > p1[:, None]).astype(jnp.int32)
        clean = jnp.take_along_axis(means, labels[..., None], axis=1) + gamma * _random.normal(
            k_g, (batch_size, n, dim), dtype)
        noisy = clean + xi * _random.normal(k_e, (batch_size, n, dim), dtype)
        return Batch(noisy[:, :prompt_length], noisy[:, prompt_length:], clean[:, prompt_length:],
                     (means, weights))

    return sample


def task_excess(heads: Heads, batch: Batch, gamma, xi, *, kind: str = "softmax", infinite: bool = False):
    r"""Each prompt's excess risk over its task's Bayes denoiser, for a layer of heads.

    For prompt b with task :math:`\tau_b` (``batch.aux`` of :func:`task_sampler`) and queries
    :math:`z_{b,1..Q}`, the value is

    .. math::

        \frac1Q \sum_{q=1}^Q \big\|f[\mu](z_{b,q}) - \mathbb E[X \mid Z = z_{b,q}, \tau_b]\big\|^2,

    with :math:`f` = ``gmlib.apply_heads(heads, ...)`` (its output map and residual flag are
    the ``heads``'s, e.g. :func:`in_context_heads`), or any predictor
    ``heads(prompt, queries, mask)`` (e.g. a trained network of :mod:`gmlib.transformer`,
    as a ``jax.tree_util.Partial`` so that its parameters are data), and :math:`\mu` the prompt's tokens
    (under ``batch.mask``), or with ``infinite=True`` the task's noisy law
    :math:`\mu_Z^{\tau_b}` itself (:math:`L = \infty`, exact in the prompt). Averaged over
    prompts, the first is the excess risk at the prompt length L and the second at
    :math:`L = \infty`: their difference is what finite prompts cost. Traceable: a training
    loss or metric can call it.

    Args:
        heads: a :class:`gmlib.Heads` on dimension d with output dimension d, or a
            predictor ``f(prompt (L, d), queries (Q, d), mask) -> (Q, d)``.
        batch: a :class:`gmlib.Batch` of :func:`task_sampler`.
        gamma, xi: the noise levels of the tasks (those of the sampler).
        kind: ``"softmax"`` or ``"linear"`` (for :class:`gmlib.Heads`).
        infinite: evaluate on the infinite prompts (:class:`gmlib.Heads` only).

    Returns:
        array (B,): the excess of each prompt (its mean over prompts estimates the excess
        risk; its standard deviation over :math:`\sqrt B` is the Monte Carlo error).

    Raises:
        ValueError: what ``gmlib.apply_heads`` raises (naming ``kind``, ``heads``, ...); naming
            ``heads`` for a predictor that is not callable, or a predictor with ``infinite``.

    Example:
        >>> batch = denoise.task_sampler(0.5, 1.0, 2, n_queries=8)(jax.random.key(0), 64, 200)
        >>> excess = denoise.task_excess(denoise.in_context_heads(0.5, 1.0, 2), batch, 0.5, 1.0)
        >>> excess.shape, bool((excess > 0).all())  # one excess per prompt
        ((64,), True)
    """
    means, weights = batch.aux
    if not isinstance(heads, Heads) and (not callable(heads) or infinite):
        raise ValueError(f"`heads` must be a gmlib.Heads, or a predictor f(prompt, queries, mask) without "
                         f"`infinite`; got {type(heads).__name__} with infinite={infinite}")

    def one(prompt, queries, m, w):
        problem = DenoisingProblem(w, m, gamma, xi)
        if not isinstance(heads, Heads):
            return jnp.mean(jnp.sum((heads(prompt, queries, batch.mask) - problem.bayes(queries)) ** 2, -1))
        pred = apply_heads(heads, problem.noisy if infinite else prompt, queries, kind=kind,
                           mask=None if infinite else batch.mask)
        return jnp.mean(jnp.sum((pred - problem.bayes(queries)) ** 2, -1))

    return jax.vmap(one)(batch.prompt, batch.queries, means, weights)


@partial(jax.jit, static_argnames="kind")
def _by_length(heads, batch, gamma, xi, lengths, kind):
    positions = jnp.arange(batch.prompt.shape[1], dtype=lengths.dtype)

    def at(length):
        return task_excess(heads, batch._replace(mask=positions < length), gamma, xi, kind=kind)

    population = task_excess(heads, batch, gamma, xi, kind=kind, infinite=True) if isinstance(heads, Heads) else None
    return jax.vmap(at)(lengths), population


def excess_by_length(heads: Heads, batch: Batch, gamma, xi, *, lengths, kind: str = "softmax"):
    r"""Each prompt's excess at several prompt lengths and on the infinite prompt.

    The prompt of length :math:`L` is the first L tokens of each prompt of ``batch`` (a
    mask hides the others, so that one compiled program serves every length: draw the
    test prompts once at the largest length). With :math:`e_b(L)` the value of
    :func:`task_excess` on prompt b cut to L tokens, the mean over prompts
    :math:`\frac1B \sum_b e_b(L)` estimates the excess risk :math:`\mathcal E_L(f)`, and
    :math:`e_b(\infty)` (the task's noisy law as the prompt) gives :math:`\mathcal E_\infty(f)`,
    the bias of the heads; :math:`\mathcal E_L - \mathcal E_\infty` is what a finite prompt
    costs. Per-prompt values are returned so that two heads can be compared on the same
    prompts with a paired standard error.

    Args:
        heads: a :class:`gmlib.Heads` on dimension d with output dimension d, or a
            predictor as in :func:`task_excess` (a ``jax.tree_util.Partial``: it is
            an argument of a compiled program).
        batch: a :class:`gmlib.Batch` of :func:`task_sampler`, prompts (B, L_max, d).
        gamma, xi: the noise levels of the tasks (those of the sampler).
        lengths: prompt lengths, ints in [1, L_max], shape (n_lengths,).
        kind: ``"softmax"`` or ``"linear"``.

    Returns:
        ``(at_L, at_inf)``: arrays (n_lengths, B) and (B,), each prompt's excess
        (``at_inf`` is ``None`` for a predictor: only heads have an infinite prompt).

    Raises:
        ValueError: what ``gmlib.apply_heads`` raises (naming ``kind``, ``heads``, ...).

    Example:
        >>> tests = denoise.task_sampler(1.0, 1.0, 2, n_queries=4)(jax.random.key(0), 512, 256)
        >>> heads = denoise.in_context_heads(1.0, 1.0, 2)
        >>> at_L, at_inf = denoise.excess_by_length(heads, tests, 1.0, 1.0, lengths=[16, 64, 256])
        >>> excess = at_L.mean(-1)  # the excess risk at L = 16, 64, 256
        >>> bool(excess[0] > excess[1] > excess[2] > at_inf.mean() >= 0)
        True
    """
    return _by_length(heads, batch, gamma, xi, jnp.asarray(lengths, jnp.int32), kind)


def tempered_excess(batch: Batch, gamma, xi, *, temperatures, lengths, corrected: bool = True):
    r"""Each prompt's excess for every head of the tempered family, at several lengths and at L = ∞.

    The heads are :func:`in_context_heads` at each temperature :math:`c` (output map
    :math:`(I, -a(1 + c)I)`, the linear part of the Bayes denoiser kept), or with
    ``corrected=False`` the same heads with the output map :math:`(I, -2aI)` of Prop 4.4 at
    every c, which leaves a linear term :math:`a(c - 1)z` on the infinite prompt. Each is
    scored by :func:`excess_by_length`, all in one compiled program.

    Args:
        batch: a :class:`gmlib.Batch` of :func:`task_sampler`, prompts (B, L_max, d).
        gamma, xi: the noise levels of the tasks.
        temperatures: c > 0, shape (n_temps,).
        lengths: prompt lengths, ints in [1, L_max], shape (n_lengths,).
        corrected: the output map :math:`(I, -a(1 + c)I)` (default) or :math:`(I, -2aI)`.

    Returns:
        ``(at_L, at_inf)``: arrays (n_temps, n_lengths, B) and (n_temps, B).

    Raises:
        ValueError: what :func:`in_context_heads` raises, naming ``temperature``.

    Example:
        >>> tests = denoise.task_sampler(1.0, 1.0, 2, n_queries=4)(jax.random.key(0), 512, 64)
        >>> at_L, at_inf = denoise.tempered_excess(tests, 1.0, 1.0, temperatures=[0.3, 1.0], lengths=[16, 64])
        >>> at_L.mean(-1).shape  # (2 temperatures, 2 lengths)
        (2, 2)
    """
    d = batch.prompt.shape[-1]
    heads = [in_context_heads(gamma, xi, d, temperature=c) for c in np.asarray(temperatures).ravel()]
    if not corrected:
        a = xi**2 / (gamma**2 + xi**2)
        w_out = heads[0].W_out.at[:, d:].set(-2 * a * jnp.eye(d, dtype=heads[0].W_out.dtype))
        heads = [dataclasses.replace(h, W_out=w_out) for h in heads]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *heads)
    lengths = jnp.asarray(lengths, jnp.int32)
    return jax.vmap(_by_length, in_axes=(0, None, None, None, None, None))(stacked, batch, gamma, xi, lengths,
                                                                           "softmax")


@partial(jax.jit, static_argnames="length")
def _plug_in(batch, gamma, xi, length):
    def one(prompt, queries, means, weights):
        truth = DenoisingProblem(weights, means, gamma, xi)
        guess = estimate_task(prompt[:length], gamma, xi)
        return jnp.mean(jnp.sum((guess.bayes(queries) - truth.bayes(queries)) ** 2, -1))

    return jax.vmap(one)(batch.prompt, batch.queries, *batch.aux)


def plug_in_excess(batch: Batch, gamma, xi, *, length: int):
    r"""Each prompt's excess of the plug-in denoiser (:func:`estimate_task`) on its first ``length`` tokens.

    For prompt b, EM reads the task from :math:`z_{b,1..L}` and the Bayes formula of the
    estimated task is compared with the true task's at the queries, as in
    :func:`task_excess`. The plug-in is not an attention head: it is the reference for what
    a predictor can read from L tokens.

    Args:
        batch: a :class:`gmlib.Batch` of :func:`task_sampler`, prompts (B, L_max, d).
        gamma, xi: the noise levels of the tasks.
        length: L, an int in [2, L_max].

    Returns:
        array (B,): each prompt's excess (mean: the excess risk; standard deviation over
        :math:`\sqrt B`: its Monte Carlo error).

    Raises:
        ValueError: naming ``gamma`` or ``xi`` (by :class:`DenoisingProblem`).

    Example:
        >>> tests = denoise.task_sampler(1.0, 1.0, 2, n_queries=4)(jax.random.key(0), 256, 64)
        >>> excess = denoise.plug_in_excess(tests, 1.0, 1.0, length=64)
        >>> excess.shape, bool(0 < excess.mean() < 0.2)
        ((256,), True)
    """
    return _plug_in(batch, gamma, xi, int(length))


def _squared_error(predictions, batch):
    return jnp.mean(jnp.sum((predictions - batch.targets) ** 2, -1))


def train_in_context(models, gamma, xi, dim: int, *, optimizer, lengths, seeds, init_seeds, n_steps: int,
                     batch_size: int, n_queries: int = 1, n_records: int = 1, init_scale=0.5, dtype=jnp.float32):
    r"""Train layers of two residual heads side by side on the same in-context denoising prompts, for every (length, seed).

    The architecture is that of Prop 4.4: two residual heads and an output map, a
    :class:`gmlib.Heads` with ``residual=True`` and ``W_out`` (d, 2d). Each model
    ``name: (kind, start)`` of ``models`` (``kind`` ``"softmax"`` or ``"linear"``; ``start``
    ``"random"``: :func:`gmlib.init_heads` with scale ``init_scale`` and key
    ``jax.random.key(init_seeds[j])`` for seed j, or a :class:`gmlib.Heads` used for every
    seed), or any other network: ``kind`` its forward pass
    ``kind(params, prompt, queries, mask) -> (Q, d)`` and ``start`` a function
    ``start(init_seed) -> params`` (e.g. :func:`gmlib.transformer.network` of a flax model),
    minimises the squared error to the clean signal,
    :math:`\frac1{BQ}\sum_{b,q}\|f[\mu_b](z_{b,q}) - x_{b,q}\|^2`, on fresh prompts of
    :func:`task_sampler` (``batch_size`` prompts of ``n_queries`` queries per step). The
    models of one run see the same prompts: the loss of a run is the sum of the models'
    losses, so each model gets its own gradient, and an optimizer that updates every
    parameter on its own (Adam) trains each exactly as it would alone on those prompts.
    The runs are those of :func:`gmlib.train.side_by_side` (one program over every device;
    prompts drawn at ``max(lengths)`` tokens and masked).

    Args:
        models: ``{name: (kind, start)}``: heads, or a network's forward pass and start.
        gamma, xi: the noise levels of the tasks.
        dim: d.
        optimizer: an ``optax.GradientTransformation``.
        lengths: prompt lengths, positive ints, shape (n_lengths,).
        seeds: the key of each run, ints, shape (n_lengths, n_seeds) (or (n_seeds,)):
            :func:`gmlib.train.sweep`'s ``seeds``.
        init_seeds: the key of each seed's random start, ints, shape (n_seeds,).
        n_steps: steps per run, a multiple of ``n_records``.
        batch_size: prompts per step.
        n_queries: queries per prompt.
        n_records: parameters kept this many times, evenly spaced (the last at the end).
        init_scale: the scale of the random starts.
        dtype: the floating dtype of training (float32, the default, is cheaper on a CPU).

    Returns:
        the :class:`gmlib.TrainResult` of :func:`gmlib.train.sweep`, leading axes
        (n_lengths, n_seeds): ``params[name]`` the final heads, ``trajectory[name]`` the
        ``n_records`` copies (axis 2).

    Raises:
        ValueError: what :func:`task_sampler`, :func:`gmlib.init_heads`, :func:`gmlib.optimize`
            and :func:`gmlib.train.sweep` raise, naming the argument.

    Example:
        >>> out = denoise.train_in_context({"softmax": ("softmax", "random")}, 1.0, 1.0, 2,
        ...     optimizer=optax.adam(1e-2), lengths=[16, 64], seeds=[[0, 1], [2, 3]],
        ...     init_seeds=[0, 1], n_steps=20, batch_size=16, n_queries=4)
        >>> out.params["softmax"].U.shape  # (2 lengths, 2 seeds, 2 heads, d, d)
        (2, 2, 2, 2, 2)
    """
    sampler = task_sampler(gamma, xi, dim, n_queries=n_queries, dtype=dtype)

    def random(seed):
        return init_heads(key=jax.random.key(seed), n_heads=2, dim=dim, out_dim=dim, residual=True, scale=init_scale,
                          dtype=dtype)

    return side_by_side(models,
                        lambda key, length: sampler(key, batch_size, length), _squared_error,
                        optimizer=optimizer, lengths=lengths, seeds=seeds, init_seeds=init_seeds, n_steps=n_steps,
                        n_records=n_records, random=random, dtype=dtype)


@partial(jax.jit, static_argnames="kind")
def _mean_excess(runs, batch, gamma, xi, lengths, kind):
    positions = jnp.arange(batch.prompt.shape[1], dtype=lengths.dtype)

    def at(row, length):  # the seeds of one length
        masked = batch._replace(mask=positions < length)
        return jax.vmap(lambda f: task_excess(f, masked, gamma, xi, kind=kind).mean())(row)

    return jax.vmap(at)(runs, lengths)


def trained_excess(models, params, batch: Batch, gamma, xi, *, lengths, dtype=None) -> dict:
    r"""The test excess of every run of :func:`train_in_context`, each at its own prompt length.

    Run (i, j) of model ``name`` (``params[name]`` at ``[i, j]``, trained at ``lengths[i]``)
    is scored by :func:`task_excess` on the first ``lengths[i]`` tokens of the test prompts
    ``batch``, averaged over the prompts: the excess risk :math:`\mathcal E_{L_i}` of that
    run. The prompts are cut to ``max(lengths)`` tokens (no run reads the others, so they
    are not computed) and masked below that, and all the runs of a model are scored in one
    vectorised call (one compiled program per model).

    Args:
        models: the ``{name: (kind, start)}`` of :func:`train_in_context`: heads (``kind``
            ``"softmax"`` or ``"linear"``) or a network's forward pass
            ``kind(params, prompt, queries, mask)``.
        params: ``out.params`` of :func:`train_in_context`, leading axes (n_lengths, n_seeds).
        batch: test prompts of :func:`task_sampler`, drawn once at ``max(lengths)`` tokens or more.
        gamma, xi: the noise levels of the tasks.
        lengths: the training lengths, ints, shape (n_lengths,), at most the prompts' length.
        dtype: the floating dtype of the scoring, to which the prompts and the parameters
            are cast (float32 is cheaper on a CPU); default: that of ``batch.prompt``.

    Returns:
        ``{name: array (n_lengths, n_seeds)}``, the mean excess of each run.

    Raises:
        ValueError: naming ``models`` (a name missing from ``params``) or ``lengths`` (not
            ints in [1, L_max], or not one per row of ``params``); what :func:`task_excess`
            raises.

    Example:
        >>> models = {"softmax": ("softmax", "random"), "linear": ("linear", "random")}
        >>> out = denoise.train_in_context(models, 1.0, 1.0, 2, optimizer=optax.adam(1e-2), lengths=[16, 64],
        ...     seeds=[0, 1], init_seeds=[0, 1], n_steps=20, batch_size=16)
        >>> tests = denoise.task_sampler(1.0, 1.0, 2, n_queries=4)(jax.random.key(1), 512, 64)
        >>> excess = denoise.trained_excess(models, out.params, tests, 1.0, 1.0, lengths=[16, 64])
        >>> excess["softmax"].shape  # (n_lengths, n_seeds)
        (2, 2)
    """
    lengths = _ints(lengths, "lengths", 1, 1, batch.prompt.shape[1] + 1)
    missing = [name for name in models if name not in params]
    if missing:
        raise ValueError(f"`models` names {missing} that `params` lacks (it has {list(params)})")
    rows = {jax.tree.leaves(params[name])[0].shape[0] for name in models}
    if rows != {len(lengths)}:
        raise ValueError(f"`lengths` must have one entry per row of `params` ({sorted(rows)}); got {len(lengths)}")

    dtype = batch.prompt.dtype if dtype is None else dtype

    def cast(x):
        return x.astype(dtype) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x

    batch, gamma, xi = jax.tree.map(cast, (batch, jnp.asarray(gamma), jnp.asarray(xi)))
    batch = batch._replace(prompt=batch.prompt[:, :lengths.max()], mask=None)
    out = {}
    for name, (kind, _) in models.items():
        runs = jax.tree.map(cast, params[name])
        runs, kind = (runs, kind) if isinstance(kind, str) else (jax.tree_util.Partial(kind, runs), "softmax")
        out[name] = np.asarray(_mean_excess(runs, batch, gamma, xi, jnp.asarray(lengths, jnp.int32), kind))
    return out
