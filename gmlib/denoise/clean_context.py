r"""In-context denoising from clean examples: the setting of Smart, Bietti and Sengupta (2025).

A prompt holds L *clean* tokens :math:`x_1, \dots, x_L` of a mixture of K equally likely
Gaussians :math:`\mathcal N(\mu_k, \sigma_0^2 I_d)` whose centres :math:`\mu_k` are drawn
afresh for each prompt, uniform on the unit sphere, and one *noisy* query
:math:`\tilde x = x + \sigma\varepsilon` of a fresh sample x of the same mixture; the target
is x (their §3.4; the book's chapter 10). Beside the sampler (:func:`clean_context_sampler`):

- :func:`tempered_risk`: the head :math:`\alpha\sum_i \operatorname{softmax}_i(\beta x_i^\top
  \tilde x)\, x_i` (the one-layer model they train, with :math:`W_{KQ} = \beta I`,
  :math:`W_{PV} = \alpha I`) over a grid of β, on the finite prompts or on their infinite
  prompts, α fitted for each β;
- :func:`known_centres_bayes`: the Bayes denoiser that knows the centres (their Prop 4);
- :func:`clean_context_bayes` and :func:`cluster_labels`: the posterior mean of x given the
  prompt when the centres are not known, given the tokens' cluster labels (the true ones: a
  lower bound on the Bayes-optimal in-context risk; those k-means finds: an upper bound);
- :func:`train_clean_context`: their one-layer model trained as they train it.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib import _random
from gmlib._loop import TrainResult, optimize
from gmlib.heads import Batch, Heads, apply_heads
from gmlib.lda._optimum import log_sphere_integral
from gmlib.train import _ints

__all__ = ["CleanTasks", "TemperedRisk", "clean_context_sampler", "tempered_risk", "known_centres_bayes",
           "cluster_labels", "clean_context_bayes", "train_clean_context"]


class CleanTasks(NamedTuple):
    """The tasks behind a batch of clean-context prompts (``Batch.aux`` of :func:`clean_context_sampler`).

    Attributes:
        centres: each prompt's centres on the unit sphere, shape (B, K, d).
        labels: each token's cluster, shape (B, L) (int32).
        within_var: :math:`\\sigma_0^2`, the variance of each coordinate within a cluster.
        noise_var: :math:`\\sigma^2`, the variance of each coordinate of the query's noise.
    """

    centres: jax.Array
    labels: jax.Array
    within_var: float
    noise_var: float


class TemperedRisk(NamedTuple):
    r"""The tempered heads over a grid of inverse temperatures (:func:`tempered_risk`), per coordinate.

    With :math:`h_\beta` the head of output scale 1 and x the target, the risk of the head of
    scale α is the quadratic :math:`R(\alpha, \beta) = P_x - 2\alpha C_\beta + \alpha^2 P_\beta`
    in α, so three moments over the batch give it for every α (each divided by d).

    Attributes:
        betas: the grid, shape (n_betas,).
        cross: :math:`C_\beta = \mathbb E\langle h_\beta, x\rangle / d`, shape (n_betas,).
        power: :math:`P_\beta = \mathbb E\|h_\beta\|^2 / d`, shape (n_betas,).
        target_power: :math:`P_x = \mathbb E\|x\|^2 / d`, a scalar.
        stderr: the Monte Carlo standard error of the risk at α = 1 (that of the risk at
            any α near 1 is the same to first order), shape (n_betas,).
        effective_tokens: the median effective number of tokens the head averages (Kish's
            :math:`(\sum_i w_i)^2/\sum_i w_i^2`), shape (n_betas,); infinite on the
            infinite prompt.
    """

    betas: jax.Array
    cross: jax.Array
    power: jax.Array
    target_power: jax.Array
    stderr: jax.Array
    effective_tokens: jax.Array

    @property
    def alpha(self) -> jax.Array:
        r"""The best output scale for each β, :math:`C_\beta / P_\beta`, shape (n_betas,)."""
        return self.cross / self.power

    @property
    def risk(self) -> jax.Array:
        """The mean squared error per coordinate at the best α, shape (n_betas,)."""
        return self.target_power - self.cross**2 / self.power

    def risk_at(self, alpha) -> jax.Array:
        """The mean squared error per coordinate at output scale ``alpha`` (broadcast against the grid)."""
        return self.target_power - 2 * jnp.asarray(alpha) * self.cross + jnp.asarray(alpha) ** 2 * self.power


def clean_context_sampler(dim: int, n_centres: int, *, within_var, noise_var, dtype=None):
    r"""Prompts of clean tokens and a noisy query, one fresh mixture per prompt (Smart et al., §3.4).

    Let d = ``dim``, K = ``n_centres``, :math:`\sigma_0^2` = ``within_var`` and
    :math:`\sigma^2` = ``noise_var``. Each prompt draws K centres :math:`\mu_k` uniform on
    the unit sphere of :math:`\mathbb R^d`, then L + 1 samples
    :math:`x = \mu_c + \sigma_0 g` with c uniform on the K clusters and
    :math:`g \sim \mathcal N(0, I_d)`: the first L are the prompt's tokens, the last one is
    the target, and the query is :math:`\tilde x = x + \sigma\varepsilon`. Their code draws the
    same law (``data_tools.py``; "prompts of 500 tokens" are 499 tokens and the query).

    Args:
        dim: d, a positive int.
        n_centres: K, a positive int.
        within_var: :math:`\sigma_0^2 \ge 0`.
        noise_var: :math:`\sigma^2 > 0`.
        dtype: the floating dtype of the arrays drawn (default: JAX's default float).

    Returns:
        ``sample(key, batch_size, prompt_length) -> gmlib.Batch``: prompts (B, L, d),
        queries and targets (B, 1, d), and ``aux`` a :class:`CleanTasks`. ``sample`` checks
        nothing (it runs inside training loops).

    Raises:
        ValueError: naming the argument, for a value outside the ranges above.

    Example:
        >>> sample = denoise.clean_context_sampler(16, 8, within_var=0.02, noise_var=0.1)
        >>> batch = sample(jax.random.key(0), 4, 499)
        >>> batch.prompt.shape, batch.queries.shape, batch.aux.centres.shape
        ((4, 499, 16), (4, 1, 16), (4, 8, 16))
    """
    dim = C.scalar(dim, "dim", low=0, integer=True)
    n_centres = C.scalar(n_centres, "n_centres", low=0, integer=True)
    within_var = C.scalar(within_var, "within_var", low=0, strict=False)
    noise_var = C.scalar(noise_var, "noise_var", low=0)
    dtype = C.check_float_dtype(dtype)

    def sample(key, batch_size: int, prompt_length: int) -> Batch:
        k_m, k_c, k_g, k_e = jax.random.split(key, 4)
        dirs = _random.normal(k_m, (batch_size, n_centres, dim), dtype)
        centres = dirs / jnp.linalg.norm(dirs, axis=-1, keepdims=True)
        labels = jax.random.randint(k_c, (batch_size, prompt_length + 1), 0, n_centres)
        clean = jnp.take_along_axis(centres, labels[..., None], axis=1)
        clean = clean + jnp.sqrt(within_var) * _random.normal(k_g, clean.shape, dtype)
        noisy = clean[:, -1:] + jnp.sqrt(noise_var) * _random.normal(k_e, (batch_size, 1, dim), dtype)
        tasks = CleanTasks(centres, labels[:, :-1], within_var, noise_var)
        return Batch(clean[:, :-1], noisy, clean[:, -1:], tasks)

    return sample


def tempered_risk(batch: Batch, *, betas, infinite: bool = False) -> TemperedRisk:
    r"""The tempered head :math:`\alpha \sum_i \operatorname{softmax}_i(\beta x_i^\top \tilde x)\, x_i` over a grid of β.

    Let :math:`h_\beta(\tilde x) = \sum_i \operatorname{softmax}_i(\beta x_i^\top \tilde x)\, x_i`
    on each prompt of ``batch`` (the one-head layer :math:`W_{KQ} = \beta I`,
    :math:`W_{PV} = I`). For each β the output scale minimising the mean squared error over
    the batch is :math:`\alpha_\beta = \sum \langle h_\beta, x\rangle / \sum \|h_\beta\|^2`,
    and the risk at that scale is
    :math:`\big(\sum \|x\|^2 - (\sum\langle h_\beta, x\rangle)^2/\sum\|h_\beta\|^2\big)/(Bd)`.
    With ``infinite`` the tokens are replaced by each prompt's infinite prompt, the mixture
    of its centres: by Prop 2.1 of the paper (a tilted Gaussian per component),

    .. math::

        h_\beta(\tilde x) = \sum_{k=1}^K \operatorname{softmax}_k(\beta \mu_k^\top \tilde x)
        \,(\mu_k + \beta\sigma_0^2 \tilde x),

    the gated mixture of affine experts whose gate and slope one β cannot both set to
    those of :func:`known_centres_bayes` (:math:`\beta = 1/(\sigma_0^2 + \sigma^2)` in the
    gate; :math:`\alpha = \sigma^2/(\sigma_0^2 + \sigma^2)` and :math:`\beta = 1/\sigma^2` in
    the experts).

    Args:
        batch: a :class:`gmlib.Batch` of :func:`clean_context_sampler`.
        betas: the inverse temperatures β ≥ 0, shape (n_betas,).
        infinite: score the heads on the infinite prompts of the batch's tasks.

    Returns:
        a :class:`TemperedRisk`.

    Raises:
        ValueError: naming ``betas``, for a negative or non-finite β or a wrong shape.

    Example:
        >>> sample = denoise.clean_context_sampler(16, 8, within_var=0.02, noise_var=0.1)
        >>> scan = denoise.tempered_risk(sample(jax.random.key(0), 200, 499), betas=[2.0, 5.0, 10.0])
        >>> int(scan.risk.argmin())  # β = 5 is the best of the three
        1
    """
    betas = C.array(betas, "betas", ("n_betas",), low=0, strict=False, min_rows=1)
    return _tempered(batch, betas.astype(batch.prompt.dtype), bool(infinite))


@partial(jax.jit, static_argnums=2)
def _tempered(batch, betas, infinite):
    x, q, target = batch.prompt, batch.queries[:, 0], batch.targets[:, 0]
    tasks = batch.aux

    def one(beta):
        if infinite:
            gate = jax.nn.softmax(beta * jnp.einsum("bkd,bd->bk", tasks.centres, q), axis=-1)
            h = jnp.einsum("bk,bkd->bd", gate, tasks.centres) + beta * tasks.within_var * q
            tokens = jnp.full((), jnp.inf, q.dtype)
        else:
            logw = beta * jnp.einsum("bld,bd->bl", x, q)
            h = jnp.einsum("bl,bld->bd", jax.nn.softmax(logw, axis=-1), x)
            lse = jax.nn.logsumexp
            tokens = jnp.median(jnp.exp(2 * lse(logw, axis=-1) - lse(2 * logw, axis=-1)))
        err_one = jnp.sum((h - target) ** 2, -1)
        return jnp.mean(jnp.sum(h * target, -1)), jnp.mean(jnp.sum(h * h, -1)), err_one.std(), tokens

    cross, power, spread, tokens = jax.lax.map(one, betas)
    d, n = q.shape[-1], q.shape[0]
    return TemperedRisk(betas, cross / d, power / d, jnp.mean(jnp.sum(target**2, -1)) / d, spread / (d * math.sqrt(n)),
                        tokens)


def known_centres_bayes(batch: Batch) -> jax.Array:
    r"""The Bayes denoiser that knows each prompt's centres: :math:`\mathbb E[x \mid \tilde x, \mu_{1:K}]`.

    With :math:`s = \sigma_0^2 + \sigma^2`, equal weights and centres of one norm (their Prop 4):

    .. math::

        f^\star(\tilde x) = \frac{\sigma_0^2}{s}\,\tilde x + \frac{\sigma^2}{s}
        \sum_k \operatorname{softmax}_k\big(\mu_k^\top \tilde x / s\big)\, \mu_k,

    the paper's eq 10 with :math:`\Gamma = \sigma_0^2 I`, :math:`\xi^2 = \sigma^2`. It is no
    in-context predictor (the prompt does not give the centres): every predictor that sees
    only the prompt does at least as badly.

    Args:
        batch: a :class:`gmlib.Batch` of :func:`clean_context_sampler`.

    Returns:
        the predictions, shape (B, d).
    """
    tasks, q = batch.aux, batch.queries[:, 0]
    s = tasks.within_var + tasks.noise_var
    gate = jax.nn.softmax(jnp.einsum("bkd,bd->bk", tasks.centres, q) / s, axis=-1)
    return (tasks.within_var * q + tasks.noise_var * jnp.einsum("bk,bkd->bd", gate, tasks.centres)) / s


def cluster_labels(prompt, *, n_clusters: int, n_iter: int = 20) -> jax.Array:
    r"""Each token's cluster by k-means (farthest-point start, then ``n_iter`` Lloyd steps).

    The start takes the first token, then repeatedly the token farthest from those taken
    (one per cluster when the clusters are well apart); each Lloyd step assigns every token
    to its nearest centre and moves each centre to the mean of its tokens.

    Args:
        prompt: tokens, shape (B, L, d).
        n_clusters: K, a positive int (at most L).
        n_iter: Lloyd steps, a positive int.

    Returns:
        labels in [0, K), shape (B, L) (int32), in an arbitrary order of the clusters.

    Raises:
        ValueError: naming the argument: a prompt of the wrong shape or not finite, K or
            ``n_iter`` not a positive int, K > L.
    """
    prompt = C.array(prompt, "prompt", ("B", "L", "d"), min_rows=1)
    n_iter = C.scalar(n_iter, "n_iter", low=0, integer=True)
    K = C.scalar(n_clusters, "n_clusters", low=0, high=prompt.shape[1], strict=False, integer=True)
    if K == 0:
        raise ValueError("`n_clusters` must be a positive int; got 0")
    return _kmeans(prompt, int(K), int(n_iter))


@partial(jax.jit, static_argnums=(1, 2))
def _kmeans(prompt, K, n_iter):
    def one(x):
        dist = lambda c: jnp.sum((x[:, None] - c[None]) ** 2, -1)  # noqa: E731  (L, K)

        def take(c, k):  # the token farthest from the k centres taken so far
            far = jnp.min(jnp.where(jnp.arange(K) < k, dist(c), jnp.inf), -1)
            return c.at[k].set(x[jnp.argmax(far)]), None

        c, _ = jax.lax.scan(take, jnp.zeros((K, x.shape[-1]), x.dtype).at[0].set(x[0]), jnp.arange(1, K))

        def lloyd(c, _):
            member = jax.nn.one_hot(jnp.argmin(dist(c), -1), K, dtype=x.dtype)
            count = member.sum(0)[:, None]
            return jnp.where(count > 0, member.T @ x / jnp.maximum(count, 1), c), None

        c, _ = jax.lax.scan(lloyd, c, None, length=n_iter)
        return jnp.argmin(dist(c), -1).astype(jnp.int32)

    return jax.vmap(one)(prompt)


def clean_context_bayes(batch: Batch, *, labels) -> jax.Array:
    r"""The posterior mean of x given the prompt's tokens and their cluster labels, the centres unknown.

    The centres are independent and uniform on the unit sphere, so given the tokens of
    cluster k, with sum :math:`S_k`, :math:`\mu_k` follows a von Mises–Fisher law of natural
    parameter :math:`S_k/\sigma_0^2`. With :math:`s = \sigma_0^2 + \sigma^2` and
    :math:`\eta_k = S_k/\sigma_0^2 + \tilde x/s`, integrating :math:`\mu_k` out,

    .. math::

        \begin{aligned}
        P(c = k \mid \tilde x, \cdot) &= \operatorname{softmax}_k
        \big(\log A(\|\eta_k\|) - \log A(\|S_k\|/\sigma_0^2)\big),\\
        \mathbb E[x \mid \tilde x, \cdot] &= \frac{\sigma_0^2}{s}\,\tilde x\\
        &\quad + \frac{\sigma^2}{s} \sum_k P(c = k \mid \tilde x, \cdot)\,
        (\log A)'(\|\eta_k\|)\,\frac{\eta_k}{\|\eta_k\|},
        \end{aligned}

    with A the normalising constant of :func:`gmlib.lda.in_context_bayes` (its
    ``log_sphere_integral``; the LDA optimum is the same computation with two labelled
    classes). Given the true labels this uses more than the prompt: its risk is a lower bound
    on that of the Bayes-optimal in-context denoiser; given labels computed from the prompt
    (:func:`cluster_labels`) it is an in-context denoiser, an upper bound. Where the two
    agree, both are the optimum.

    Args:
        batch: a :class:`gmlib.Batch` of :func:`clean_context_sampler`.
        labels: the tokens' clusters, ints in [0, K), shape (B, L).

    Returns:
        the predictions, shape (B, d).

    Raises:
        ValueError: naming ``labels``, for a wrong shape or dtype.
    """
    B, L, _ = batch.prompt.shape
    labels = jnp.asarray(labels)
    if labels.shape != (B, L) or not jnp.issubdtype(labels.dtype, jnp.integer):
        raise ValueError(f"`labels` must be ints of shape (B, L) = ({B}, {L}); got {labels.dtype} {labels.shape}")
    return _posterior_mean(batch, labels)


@jax.jit
def _posterior_mean(batch, labels):
    tasks, q = batch.aux, batch.queries[:, 0]
    K, d = tasks.centres.shape[1], q.shape[-1]
    s = tasks.within_var + tasks.noise_var
    members = jax.nn.one_hot(labels, K, dtype=q.dtype)
    prior = jnp.einsum("blk,bld->bkd", members, batch.prompt) / tasks.within_var
    eta = prior + q[:, None] / s
    norm = jnp.linalg.norm(eta, axis=-1)
    log_a = lambda k: log_sphere_integral(k, d)  # noqa: E731
    gate = jax.nn.softmax(log_a(norm) - log_a(jnp.linalg.norm(prior, axis=-1)), axis=-1)
    slope = jax.vmap(jax.grad(log_a))(norm.ravel()).reshape(norm.shape)  # E|mu| along eta
    mean_mu = jnp.einsum("bk,bkd->bd", gate * slope / norm, eta)
    return (tasks.within_var * q + tasks.noise_var * mean_mu) / s


def train_clean_context(train: Batch, *, seeds, optimizer, n_steps: int, batch_size: int,
                        record_every: int | None = None) -> TrainResult:
    r"""Smart et al.'s one-layer model trained on a fixed set of prompts, one run per seed.

    The model is one softmax head over the prompt's tokens,
    :math:`\hat x = W_{PV} \sum_i \operatorname{softmax}_i(x_i^\top W_{KQ} \tilde x)\, x_i`
    (no scaling of the scores, the query not among the tokens, no residual): a
    :class:`gmlib.Heads` with U = :math:`W_{KQ}` and V = :math:`W_{PV}`. Each seed starts both
    matrices uniform on :math:`\pm 1/\sqrt d` (their start) and runs ``n_steps`` steps of
    ``optimizer`` on the mean squared error per coordinate of ``batch_size`` prompts drawn at
    random from ``train``, with replacement (their code shuffles the set once an epoch
    instead), through
    :func:`gmlib.optimize`, the seeds side by side under ``vmap``.

    Args:
        train: a :class:`gmlib.Batch` of :func:`clean_context_sampler`, the training set.
        seeds: ints, one run each.
        optimizer: an ``optax.GradientTransformation``.
        n_steps: steps per run, a positive int.
        batch_size: prompts per step, a positive int.
        record_every: steps between two records of the training loss (default: ``n_steps``).

    Returns:
        a :class:`gmlib.TrainResult` whose leaves have a leading axis of seeds: ``params`` a
        :class:`gmlib.Heads` (U and V of shape (n_seeds, 1, d, d)).

    Raises:
        ValueError: naming the argument, for sizes that are not positive ints.
    """
    batch_size = C.scalar(batch_size, "batch_size", low=0, integer=True)
    n_steps = C.scalar(n_steps, "n_steps", low=0, integer=True)
    record_every = n_steps if record_every is None else record_every
    keys = jax.vmap(jax.random.key)(jnp.asarray(_ints(seeds, "seeds", 1, 0, 2**32), jnp.uint32))
    return _train_runs(keys, train, optimizer, int(n_steps), int(batch_size), int(record_every))


@partial(jax.jit, static_argnums=(2, 3, 4, 5))
@partial(jax.vmap, in_axes=(0, None, None, None, None, None))
def _train_runs(key, train, optimizer, n_steps, batch_size, record_every):
    k_u, k_v, k_t = jax.random.split(key, 3)
    d, dtype = train.prompt.shape[-1], train.prompt.dtype
    bound = 1 / math.sqrt(d)
    start = Heads(U=jax.random.uniform(k_u, (1, d, d), dtype, -bound, bound),
                  V=jax.random.uniform(k_v, (1, d, d), dtype, -bound, bound))

    def draw(k):
        pick = jax.random.randint(k, (batch_size,), 0, train.prompt.shape[0])
        return jax.tree.map(lambda a: a[pick], (train.prompt, train.queries, train.targets))

    def loss(heads, batch):
        prompt, queries, targets = batch
        return jnp.mean((jax.vmap(apply_heads, (None, 0, 0))(heads, prompt, queries) - targets) ** 2)

    return optimize(loss, start, optimizer, n_steps=n_steps, record_every=record_every, sample=draw, key=k_t)
