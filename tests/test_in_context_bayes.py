"""The Bayes-optimal in-context predictors (gmlib.denoise.optimum, gmlib.lda._optimum), each against an
independent computation in plain numpy: the denoiser against a brute-force posterior on a fine grid (d = 2), a
closed form for the empty prompt, a prior-proposal Monte Carlo (d = 3), the task's Bayes denoiser on long prompts,
and the plug-in and tempered heads it must beat; the LDA log-odds against scipy's Bessel functions, a brute-force
grid posterior (d = 2), the closed form of d = 3 and the task's Bayes score on long prompts; masks, dtypes,
jit/vmap, the Monte Carlo standard error's calibration and ValueErrors naming the argument.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special as sp
from strategies import assert_rejects

from gmlib import denoise as dn
from gmlib import lda
from gmlib.denoise import in_context_bayes
from gmlib.lda import in_context_bayes as lda_bayes
from gmlib.lda._optimum import log_sphere_integral

GAMMA, XI, R = 1.0, 1.0, 3.0


def task_draws(rng, n, means, weights, gamma, xi):
    """n noisy draws of the task (numpy)."""
    labels = (rng.random(n) > weights[0]).astype(int)
    return means[labels] + np.sqrt(gamma**2 + xi**2) * rng.standard_normal((n, means.shape[1]))


def sphere(rng, n, d, r):
    u = rng.standard_normal((n, d))
    return r * u / np.linalg.norm(u, axis=-1, keepdims=True)


# ============================================================================ numpy references (denoising)


def log_normal(z, m, s):
    """log N(z; m, sI), z (..., d) against m (n, d): shape (..., n)."""
    d = z.shape[-1]
    return -np.sum((z[..., None, :] - m) ** 2, -1) / (2 * s) - 0.5 * d * np.log(2 * np.pi * s)


def numpy_grid_posterior_mean(prompt, queries, gamma, xi, r, lo, hi, n_theta=360, n_pi=40):
    """E[X | prompt, z] by brute force: the full double grid of angles times pi_1, full Gaussian densities, each
    query's posterior (its own likelihood included) and each task's Bayes denoiser, no symmetry, no streaming."""
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    th = 2 * np.pi * np.arange(n_theta) / n_theta
    means = r * np.stack([np.cos(th), np.sin(th)], -1)
    x, w = np.polynomial.legendre.leggauss(n_pi)
    pis = lo + (hi - lo) * (x + 1) / 2
    lp1, lp2 = np.log(pis)[None, None, :], np.log1p(-pis)[None, None, :]

    def log_p(z):  # log p_tau(z) on the grid (t1, t2, j)
        ln = log_normal(z, means, s)
        return np.logaddexp(lp1 + ln[:, None, None], lp2 + ln[None, :, None])

    ell = np.log(w)[None, None, :] + sum(log_p(zi) for zi in prompt)
    out = []
    for z in queries:
        lw = ell + log_p(z)
        post = np.exp(lw - lw.max())
        post /= post.sum()
        ln = log_normal(z, means, s)
        beta1 = 1 / (1 + np.exp(lp2 - lp1 + ln[None, :, None] - ln[:, None, None]))
        e = beta1[..., None] * means[:, None, None, :] + (1 - beta1[..., None]) * means[None, :, None, :]
        out.append((1 - a) * z + a * np.einsum("abj,abjd->d", post, e))
    return np.array(out)


def numpy_prior_predictive_mean(queries, gamma, xi, r):
    """E[X | z] with no prompt in d = 2: the means uniform on the circle, (1 - a) z + a r I_1(k)/I_0(k) z/|z|."""
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    norm = np.linalg.norm(queries, axis=-1, keepdims=True)
    kappa = r * norm / s
    return (1 - a) * queries + a * r * sp.i1e(kappa) / sp.i0e(kappa) * queries / norm


def numpy_prior_is(rng, prompt, queries, gamma, xi, r, lo, hi, n):
    """E[X | prompt, z] and its delta-method standard error by importance sampling from the prior (numpy)."""
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    d = prompt.shape[1]
    m1, m2 = sphere(rng, n, d, r), sphere(rng, n, d, r)
    p1 = rng.uniform(lo, hi, n)

    def log_p(z):  # (n,)
        return np.logaddexp(np.log(p1) - np.sum((z - m1) ** 2, -1) / (2 * s),
                            np.log1p(-p1) - np.sum((z - m2) ** 2, -1) / (2 * s))

    ell = sum(log_p(zi) for zi in prompt)
    est, se = [], []
    for z in queries:
        lw = ell + log_p(z)
        w = np.exp(lw - lw.max())
        w /= w.sum()
        l1 = np.log(p1) - np.sum((z - m1) ** 2, -1) / (2 * s)
        l2 = np.log1p(-p1) - np.sum((z - m2) ** 2, -1) / (2 * s)
        b1 = 1 / (1 + np.exp(l2 - l1))
        e = (1 - a) * z + a * (b1[:, None] * m1 + (1 - b1[:, None]) * m2)
        mean = w @ e
        est.append(mean)
        se.append(np.sqrt(np.sum(w[:, None] ** 2 * (e - mean) ** 2, 0)))
    return np.array(est), np.array(se)


def numpy_task_bayes(queries, means, weights, gamma, xi):
    s, a = gamma**2 + xi**2, xi**2 / (gamma**2 + xi**2)
    logits = np.log(weights) - np.sum((queries[:, None, :] - means) ** 2, -1) / (2 * s)
    beta = np.exp(logits - logits.max(-1, keepdims=True))
    beta /= beta.sum(-1, keepdims=True)
    return (1 - a) * queries + a * beta @ means


# ============================================================================ denoising, d = 2 (quadrature)


@pytest.mark.parametrize("gamma, xi, weight_range, length", [(1.0, 1.0, (0.2, 0.8), 4), (0.7, 1.2, (0.1, 0.6), 5),
                                                             (0.0, 1.5, (0.3, 0.7), 3), (1.0, 0.6, (0.4, 0.4), 4)])
def test_quadrature_matches_a_brute_force_posterior(gamma, xi, weight_range, length):
    """The grid (symmetric halving, streamed blocks, the predictive measure H) equals a brute-force numpy posterior
    on a finer grid of another rule, to 1e-9, on small prompts (symmetric and asymmetric priors, gamma = 0)."""
    rng = np.random.default_rng(length)
    means = sphere(rng, 2, 2, R)
    prompt = task_draws(rng, length, means, np.array([0.3, 0.7]), gamma, xi)
    queries = np.concatenate([task_draws(rng, 3, means, np.array([0.3, 0.7]), gamma, xi), [[0.1, -0.2]]])
    got = in_context_bayes(prompt, queries, gamma=gamma, xi=xi, radius=R, weight_range=weight_range)
    expected = numpy_grid_posterior_mean(prompt, queries, gamma, xi, R, *weight_range)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    # not the prompt-free answer, nor the plug-in's: the prompt moved the prediction
    assert np.abs(expected - numpy_prior_predictive_mean(queries, gamma, xi, R)).max() > 1e-2


def test_empty_prompt_is_the_prior_predictive_mean():
    """No tokens (an all-False mask, or zero rows): E[X | z] = (1 - a) z + a r I_1/I_0 (r|z|/s) z/|z| (scipy)."""
    rng = np.random.default_rng(1)
    queries = 2.5 * rng.standard_normal((6, 2))
    expected = numpy_prior_predictive_mean(queries, 0.8, 1.1, R)
    junk = 40 * rng.standard_normal((7, 2))
    masked = in_context_bayes(junk, queries, np.zeros(7, bool), gamma=0.8, xi=1.1, radius=R)
    empty = in_context_bayes(np.zeros((0, 2)), queries, gamma=0.8, xi=1.1, radius=R)
    np.testing.assert_allclose(masked, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(empty, expected, rtol=0, atol=1e-12)


def test_a_mask_is_the_prompt_cut():
    rng = np.random.default_rng(2)
    means = sphere(rng, 2, 2, R)
    prompt = task_draws(rng, 9, means, np.array([0.5, 0.5]), GAMMA, XI)
    keep = np.array([1, 1, 0, 1, 0, 0, 1, 1, 0], bool)
    prompt[~keep] = 30.0  # far-off junk where masked: it must not count
    queries = task_draws(rng, 4, means, np.array([0.5, 0.5]), GAMMA, XI)
    got = in_context_bayes(prompt, queries, keep, gamma=GAMMA, xi=XI, n_angles=96, n_weights=10)
    cut = in_context_bayes(prompt[keep], queries, gamma=GAMMA, xi=XI, n_angles=96, n_weights=10)
    np.testing.assert_allclose(got, cut, rtol=0, atol=1e-12)


def test_long_prompts_approach_the_task_bayes_denoiser():
    """L -> infinity: the posterior concentrates on the task, the prediction on its Bayes denoiser (eq 10), with
    the error of the posterior mean shrinking like 1/sqrt(L)."""
    rng = np.random.default_rng(3)
    means, weights = sphere(rng, 2, 2, R), np.array([0.35, 0.65])
    prompt = task_draws(rng, 1000, means, weights, GAMMA, XI)
    queries = task_draws(rng, 32, means, weights, GAMMA, XI)
    truth = numpy_task_bayes(queries, means, weights, GAMMA, XI)
    far = np.sqrt(np.mean(np.sum((in_context_bayes(prompt[:40], queries, gamma=GAMMA, xi=XI) - truth) ** 2, -1)))
    near = np.sqrt(np.mean(np.sum((in_context_bayes(prompt, queries, gamma=GAMMA, xi=XI) - truth) ** 2, -1)))
    assert near < 0.05 and near < far / 2.5, (far, near)


def test_float32_follows_float64_and_the_dtype():
    rng = np.random.default_rng(4)
    means = sphere(rng, 2, 2, R)
    prompt = task_draws(rng, 64, means, np.array([0.4, 0.6]), GAMMA, XI)
    queries = task_draws(rng, 8, means, np.array([0.4, 0.6]), GAMMA, XI)
    f64 = in_context_bayes(prompt, queries, gamma=GAMMA, xi=XI)
    f32 = in_context_bayes(prompt.astype(np.float32), queries.astype(np.float32), gamma=GAMMA, xi=XI)
    assert f64.dtype == jnp.float64 and f32.dtype == jnp.float32
    np.testing.assert_allclose(f32, f64, rtol=0, atol=2e-5)
    f32_mc, se = in_context_bayes(prompt.astype(np.float32), queries.astype(np.float32), gamma=GAMMA, xi=XI,
                                  key=jax.random.key(0), n_samples=4000, return_error=True)
    assert f32_mc.dtype == se.dtype == jnp.float32
    assert np.all(np.abs(np.asarray(f32_mc, np.float64) - np.asarray(f64)) < 5 * np.asarray(se, np.float64) + 1e-4)


def test_jit_vmap_and_grad():
    """Traced prompts, queries and masks (vmapped and jitted) give the per-prompt values; gradients in the queries
    match central differences."""
    rng = np.random.default_rng(5)
    prompts, queries = 2.0 * rng.standard_normal((3, 12, 2)), 2.0 * rng.standard_normal((3, 4, 2))
    masks = np.arange(12)[None, :] < np.array([12, 7, 0])[:, None]
    f = jax.jit(jax.vmap(partial(in_context_bayes, gamma=GAMMA, xi=XI, n_angles=64, n_weights=8)))
    loop = np.stack([in_context_bayes(p, q, m, gamma=GAMMA, xi=XI, n_angles=64, n_weights=8)
                     for p, q, m in zip(prompts, queries, masks)])
    np.testing.assert_allclose(f(prompts, queries, masks), loop, rtol=0, atol=1e-12)

    def total(q):
        return jnp.sum(in_context_bayes(prompts[0], q, gamma=GAMMA, xi=XI, n_angles=64, n_weights=8) ** 2)

    grad = jax.grad(total)(jnp.asarray(queries[0]))
    eps, fd = 1e-6, np.zeros_like(queries[0])
    for i, j in np.ndindex(*fd.shape):
        step = np.zeros_like(fd)
        step[i, j] = eps
        fd[i, j] = (total(queries[0] + step) - total(queries[0] - step)) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_the_quadrature_error_estimate_is_conservative():
    """return_error: the difference to the half grid bounds the full grid's actual error (against a finer grid)."""
    rng = np.random.default_rng(6)
    means = sphere(rng, 2, 2, R)
    prompt = task_draws(rng, 128, means, np.array([0.3, 0.7]), GAMMA, XI)
    queries = task_draws(rng, 16, means, np.array([0.3, 0.7]), GAMMA, XI)
    est, err = in_context_bayes(prompt, queries, gamma=GAMMA, xi=XI, n_angles=64, n_weights=12, return_error=True)
    fine = in_context_bayes(prompt, queries, gamma=GAMMA, xi=XI, n_angles=192, n_weights=36)
    assert err.shape == est.shape and np.all(err >= 0)
    assert np.all(np.abs(est - fine) <= err + 1e-12)
    assert np.abs(est - fine).max() > 1e-6  # (the test has something to bound: 64 x 12 is coarse at L = 128)


def dens1(z, m1, m2, p, s):
    """A task's density in d = 1, up to the factor common to all tasks."""
    return p * np.exp(-(z - m1) ** 2 / (2 * s)) + (1 - p) * np.exp(-(z - m2) ** 2 / (2 * s))


def test_one_dimension_is_exact():
    """d = 1: the sphere is {-r, r}; the four pairs of means and pi_1, against numpy."""
    rng = np.random.default_rng(7)
    prompt, queries = 3 + rng.standard_normal((6, 1)) * 1.4, rng.standard_normal((3, 1)) * 2
    s = GAMMA**2 + XI**2
    x, w = np.polynomial.legendre.leggauss(60)
    pis = 0.2 + 0.6 * (x + 1) / 2
    num, den = np.zeros(3), np.zeros(3)
    for m1 in (-R, R):
        for m2 in (-R, R):
            means = np.array([[m1], [m2]])
            for p, wp in zip(pis, w):
                lik = np.prod([dens1(z, m1, m2, p, s) for z in prompt[:, 0]])
                for k, z in enumerate(queries):
                    pq = dens1(z[0], m1, m2, p, s)
                    num[k] += wp * lik * pq * numpy_task_bayes(z[None], means, np.array([p, 1 - p]), GAMMA, XI)[0, 0]
                    den[k] += wp * lik * pq
    got = in_context_bayes(prompt, queries, gamma=GAMMA, xi=XI, n_weights=40)
    np.testing.assert_allclose(got[:, 0], num / den, rtol=0, atol=1e-10)


# ============================================================================ denoising, Monte Carlo


def test_monte_carlo_matches_a_prior_proposal_estimate_in_d3():
    """d = 3, small L: the EM-centred adaptive importance sampler against numpy importance sampling from the prior
    (a million tasks), within 4 combined standard errors."""
    rng = np.random.default_rng(8)
    means = sphere(rng, 2, 3, R)
    prompt = task_draws(rng, 4, means, np.array([0.3, 0.7]), GAMMA, XI)
    queries = task_draws(rng, 4, means, np.array([0.3, 0.7]), GAMMA, XI)
    got, se = in_context_bayes(prompt, queries, gamma=GAMMA, xi=XI, key=jax.random.key(1), n_samples=40_000,
                               return_error=True)
    ref, ref_se = numpy_prior_is(rng, prompt, queries, GAMMA, XI, R, 0.2, 0.8, 1_000_000)
    z = (np.asarray(got) - ref) / np.sqrt(np.asarray(se) ** 2 + ref_se**2)
    assert np.abs(z).max() < 4, z
    assert np.abs(ref - numpy_task_bayes(queries, means, np.array([0.3, 0.7]), GAMMA, XI)).max() > 0.05


def test_monte_carlo_matches_the_quadrature_in_d2():
    """d = 2 with n_samples: the importance sampler against the quadrature, within 4.5 standard errors, at L = 16
    (a mask on a prompt of 256) and 256."""
    rng = np.random.default_rng(9)
    means = sphere(rng, 2, 2, R)
    prompt = task_draws(rng, 256, means, np.array([0.4, 0.6]), GAMMA, XI)
    queries = task_draws(rng, 8, means, np.array([0.4, 0.6]), GAMMA, XI)
    for length in (16, 256):
        keep = np.arange(256) < length
        exact = in_context_bayes(prompt, queries, keep, gamma=GAMMA, xi=XI)
        got, se = in_context_bayes(prompt, queries, keep, gamma=GAMMA, xi=XI, key=jax.random.key(length),
                                   n_samples=8000, return_error=True)
        assert np.abs((got - exact) / se).max() < 4.5


def test_monte_carlo_on_long_prompts_approaches_the_task_bayes_denoiser():
    rng = np.random.default_rng(10)
    means, weights = sphere(rng, 2, 3, R), np.array([0.45, 0.55])
    prompt = task_draws(rng, 2000, means, weights, GAMMA, XI)
    queries = task_draws(rng, 16, means, weights, GAMMA, XI)
    truth = numpy_task_bayes(queries, means, weights, GAMMA, XI)
    got, se = in_context_bayes(prompt, queries, gamma=GAMMA, xi=XI, key=jax.random.key(2), n_samples=4000,
                               return_error=True)
    assert np.sqrt(np.mean(np.sum((got - truth) ** 2, -1))) < 0.05
    assert np.max(se) < 0.01  # the proposal followed the posterior: no degeneracy at L = 2000


def test_the_standard_error_is_calibrated():
    """Over 64 independent keys the spread of the estimates matches the reported standard error within 1.5x, at
    L = 0, 16, 64 and 256 (masks on one prompt), d = 3, for a hard posterior: means 53 degrees apart."""
    rng = np.random.default_rng(11)
    first, second = sphere(rng, 2, 3, 1.0)
    second -= (second @ first) * first
    means = R * np.stack([first, 0.6 * first + 0.8 * second / np.linalg.norm(second)])
    prompt = task_draws(rng, 256, means, np.array([0.35, 0.65]), GAMMA, XI)
    queries = task_draws(rng, 6, means, np.array([0.35, 0.65]), GAMMA, XI)
    keys = jax.random.split(jax.random.key(3), 64)
    f = jax.jit(jax.vmap(lambda k, m: in_context_bayes(prompt, queries, m, gamma=GAMMA, xi=XI, key=k, n_samples=1000,
                                                       return_error=True), in_axes=(0, None)))
    for length in (0, 16, 64, 256):
        est, se = f(keys, jnp.arange(256) < length)
        ratio = np.sqrt(np.mean(np.var(est, axis=0, ddof=1)) / np.mean(se**2))
        assert 1 / 1.5 < ratio < 1.5, (length, ratio)


def test_monte_carlo_on_a_long_prompt_of_overlapping_components():
    """L = 2000 tokens of two components 0.95 rad apart (norm 2, s = 2.08): the sampler against the quadrature.
    Its proposal starts from an EM fit, which after 50 iterations was still far from the posterior's mode
    (then the estimate was 0.1 off, 33 standard errors)."""
    rng = np.random.default_rng(3)
    theta, p = rng.uniform(0, 2 * np.pi, 2), rng.uniform(0.05, 0.95)
    means = 2.0 * np.stack([np.cos(theta), np.sin(theta)], 1)
    labels = rng.random(2064) < p
    z = np.where(labels[:, None], means[0], means[1]) + np.sqrt(0.8**2 + 1.2**2) * rng.standard_normal((2064, 2))
    args = dict(gamma=0.8, xi=1.2, radius=2.0, weight_range=(0.05, 0.95))
    quad = in_context_bayes(z[:2000], z[2000:], **args)
    mc, se = in_context_bayes(z[:2000], z[2000:], **args, key=jax.random.key(3), n_samples=2000, return_error=True)
    assert np.all(np.abs(np.asarray(mc) - quad) < 5 * np.asarray(se) + 2e-3)


def test_monte_carlo_in_float32_under_jit_and_vmap():
    """d = 3 in float32, vmapped over prompts and jitted (the way a chapter scores test prompts), follows float64
    within its standard errors. Guards the draw of the proposal: on jaxlib 0.10's CPU backend a
    ``jnp.sum(v * c, -1, keepdims=True) * c`` there gave wrong directions in float32 under jit."""
    batch = dn.task_sampler(GAMMA, XI, 3, n_queries=4)(jax.random.key(6), 6, 32)
    f = partial(in_context_bayes, gamma=GAMMA, xi=XI, key=jax.random.key(2), n_samples=8000, return_error=True)
    f32, se = jax.jit(jax.vmap(f))(batch.prompt.astype(jnp.float32), batch.queries.astype(jnp.float32))
    f64, se64 = jax.vmap(f)(batch.prompt.astype(jnp.float64), batch.queries.astype(jnp.float64))
    assert f32.dtype == jnp.float32
    combined = np.sqrt(np.asarray(se, np.float64) ** 2 + np.asarray(se64) ** 2)
    assert np.all(np.abs(np.asarray(f32, np.float64) - np.asarray(f64)) < 5 * combined + 1e-4)


def test_monte_carlo_needs_a_key_and_a_size():
    z = np.ones((4, 3))
    assert_rejects(lambda: in_context_bayes(z, z, gamma=GAMMA, xi=XI), "n_samples", "key")
    assert_rejects(lambda: in_context_bayes(z, z, gamma=GAMMA, xi=XI, n_samples=100), "n_samples", "key")
    assert_rejects(lambda: in_context_bayes(z, z, gamma=GAMMA, xi=XI, key=jax.random.key(0), n_samples=0),
                   "n_samples")


# ============================================================================ denoising: optimality


def test_the_posterior_mean_beats_the_plug_in_and_every_tempered_head():
    """On test prompts of task_sampler the excess of the posterior mean is below the plug-in's and the best tempered
    head's at L = 16 and 64 (it is the minimiser of the risk), and far below the plug-in's at L = 16."""
    batch = dn.task_sampler(GAMMA, XI, 2, n_queries=4)(jax.random.key(4), 512, 64)
    best = jax.jit(jax.vmap(partial(in_context_bayes, gamma=GAMMA, xi=XI)))
    temps = np.linspace(0.1, 1.5, 15)
    tempered, _ = dn.tempered_excess(batch, GAMMA, XI, temperatures=temps, lengths=[16, 64])
    for i, length in enumerate((16, 64)):
        cut = batch._replace(prompt=batch.prompt[:, :length])
        pred = best(cut.prompt, cut.queries)
        truth = jax.vmap(lambda q, m, w: dn.DenoisingProblem(w, m, GAMMA, XI).bayes(q))(cut.queries, *cut.aux)
        ours = np.mean(np.sum((np.asarray(pred) - np.asarray(truth)) ** 2, -1), -1)
        plug = np.asarray(dn.plug_in_excess(cut, GAMMA, XI, length=length))
        assert ours.mean() < plug.mean() and ours.mean() < np.asarray(tempered[:, i]).mean(-1).min()
        paired = plug - ours
        assert paired.mean() > 3 * paired.std() / np.sqrt(len(paired))
        if length == 16:
            assert ours.mean() < 0.6 * plug.mean()


def test_task_excess_accepts_it_as_a_predictor():
    batch = dn.task_sampler(GAMMA, XI, 2, n_queries=2)(jax.random.key(5), 4, 16)
    f = jax.tree_util.Partial(partial(in_context_bayes, gamma=GAMMA, xi=XI))
    got = dn.task_excess(f, batch, GAMMA, XI)
    pred = np.stack([in_context_bayes(p, q, gamma=GAMMA, xi=XI) for p, q in zip(batch.prompt, batch.queries)])
    truth = np.stack([numpy_task_bayes(np.asarray(q), np.asarray(m), np.asarray(w), GAMMA, XI)
                      for q, m, w in zip(batch.queries, *batch.aux)])
    np.testing.assert_allclose(got, np.mean(np.sum((pred - truth) ** 2, -1), -1), rtol=1e-9)


# ============================================================================ denoising: invalid inputs


def _call(**over):
    args = {"prompt": np.ones((5, 2)), "queries": np.ones((3, 2)), "mask": None, "gamma": GAMMA, "xi": XI}
    args.update(over)
    return lambda: in_context_bayes(args.pop("prompt"), args.pop("queries"), args.pop("mask"), **args)


@pytest.mark.parametrize("name, over", [
    ("prompt", {"prompt": np.ones(5)}), ("prompt", {"prompt": np.full((5, 2), np.nan)}),
    ("prompt", {"prompt": np.ones((5, 0)), "queries": np.ones((3, 0))}),
    ("queries", {"queries": np.ones((3, 3))}), ("queries", {"queries": np.ones(2)}),
    ("mask", {"mask": np.ones(5)}), ("mask", {"mask": np.ones(4, bool)}),
    ("gamma", {"gamma": -1.0}), ("gamma", {"gamma": np.nan}), ("xi", {"xi": 0.0}), ("radius", {"radius": 0.0}),
    ("weight_range", {"weight_range": (0.6, 0.4)}), ("weight_range", {"weight_range": (0.0, 0.5)}),
    ("weight_range", {"weight_range": (0.2, 1.0)}), ("weight_range", {"weight_range": (0.2,)}),
    ("n_angles", {"n_angles": 0}), ("n_angles", {"n_angles": 2.5}), ("n_weights", {"n_weights": -3}),
    ("n_samples", {"n_samples": 0, "key": jax.random.key(0)}),
])
def test_invalid_inputs_are_named(name, over):
    assert_rejects(_call(**over), name)


# ============================================================================ LDA


def numpy_log_a(kappa, d):
    """log of int_0^pi e^{k cos t} sin^{d-2} t dt by scipy's scaled Bessel function (B(1/2, (d-1)/2) at 0)."""
    nu = d / 2 - 1
    kappa = np.asarray(kappa, np.float64)
    safe = np.where(kappa > 0, kappa, 1.0)
    value = 0.5 * np.log(np.pi) + sp.gammaln((d - 1) / 2) + nu * np.log(2 / safe) + np.log(sp.ive(nu, safe)) + safe
    return np.where(kappa > 0, value, sp.betaln(0.5, (d - 1) / 2))


@pytest.mark.parametrize("d", [2, 3, 5, 10])
def test_log_sphere_integral_against_scipy_and_quadrature(d):
    kappa = np.array([0.0, 1e-6, 0.01, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 250.0, 500.0, 1e4])
    expected = numpy_log_a(kappa, d)
    got = log_sphere_integral(jnp.asarray(kappa), d)
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-13)
    got32 = log_sphere_integral(jnp.asarray(kappa, jnp.float32), d)
    assert got32.dtype == jnp.float32
    np.testing.assert_allclose(got32, expected, rtol=1e-6, atol=1e-6)
    # and against a direct numpy integral at moderate kappa (a fine midpoint rule)
    t = (np.arange(200_000) + 0.5) * np.pi / 200_000
    for k in (0.0, 2.0, 20.0):
        direct = np.log(np.sum(np.exp(k * np.cos(t)) * np.sin(t) ** (d - 2)) * np.pi / 200_000)
        np.testing.assert_allclose(log_sphere_integral(jnp.asarray(k), d), direct, rtol=1e-9)


def lda_prompt(rng, n, means):
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    x = np.where(y[:, None] > 0, means[0], means[1]) + rng.standard_normal((n, means.shape[1]))
    return np.concatenate([x, y[:, None]], -1)


def test_lda_log_odds_against_a_brute_force_grid_posterior():
    """d = 2: the joint grid of both means' angles, the full Gaussian likelihood of every labelled token and the
    query's predictive densities under each label (numpy), to 1e-9."""
    rng = np.random.default_rng(12)
    r = 1.5
    means = sphere(rng, 2, 2, r)
    prompt = lda_prompt(rng, 7, means)
    queries = np.concatenate([rng.standard_normal((5, 2)) * 2, np.zeros((5, 1))], -1)
    n = 720
    th = 2 * np.pi * np.arange(n) / n
    grid = r * np.stack([np.cos(th), np.sin(th)], -1)
    ln = log_normal(prompt[:, :2], grid, 1.0)  # (L, n)
    positive, negative = prompt[:, 2:] > 0, prompt[:, 2:] < 0
    ll = np.sum(np.where(positive, ln, 0), 0)[:, None] + np.sum(np.where(negative, ln, 0), 0)[None]
    post = np.exp(ll - ll.max())
    post /= post.sum()  # over (m_1, m_-1) jointly
    lq = np.exp(log_normal(queries[:, :2], grid, 1.0))  # (Q, n)
    p_pos = np.einsum("ab,qa->q", post, lq)
    p_neg = np.einsum("ab,qb->q", post, lq)
    expected = np.log(p_pos / p_neg)
    got = lda_bayes(prompt, queries, radius=r)
    assert got.shape == (5, 1)
    np.testing.assert_allclose(got[:, 0], expected, rtol=0, atol=1e-9)


def test_lda_log_odds_in_d3_against_the_closed_form():
    """d = 3: A(k) = 2 sinh(k)/k, so each class contributes log(sinh(r|S+x|) |S| / (sinh(r|S|) |S+x|))."""
    rng = np.random.default_rng(13)
    r = 1.5
    means = sphere(rng, 2, 3, r)
    prompt = lda_prompt(rng, 20, means)
    queries = np.concatenate([rng.standard_normal((6, 3)) * 2, np.zeros((6, 1))], -1)

    def log_a(k):  # log(2 sinh k / k), log 2 at 0
        return np.where(k > 0, k + np.log1p(-np.exp(-2 * k)) - np.log(np.where(k > 0, k, 1)), np.log(2))

    def gain(c):
        total = prompt[prompt[:, 3] == c, :3].sum(0)
        return log_a(r * np.linalg.norm(total + queries[:, :3], axis=-1)) - log_a(r * np.linalg.norm(total))

    got = lda_bayes(prompt, queries, radius=r)[:, 0]
    np.testing.assert_allclose(got, gain(1) - gain(-1), rtol=1e-12, atol=1e-12)


def test_lda_empty_prompt_mask_and_long_prompts():
    rng = np.random.default_rng(14)
    r = 1.5
    means = sphere(rng, 2, 2, r)
    prompt = lda_prompt(rng, 4000, means)
    queries = np.concatenate([rng.standard_normal((8, 2)) * 2, np.zeros((8, 1))], -1)
    # no tokens: both posteriors uniform, even odds
    np.testing.assert_array_equal(lda_bayes(prompt[:5], queries, np.zeros(5, bool), radius=r), np.zeros((8, 1)))
    np.testing.assert_array_equal(lda_bayes(prompt[:0], queries, radius=r), np.zeros((8, 1)))
    # a mask is the prompt cut, junk where masked
    keep = rng.random(30) < 0.5
    junk = prompt[:30].copy()
    junk[~keep, :2] = 50.0
    cut = lda_bayes(prompt[:30][keep], queries, radius=r)
    np.testing.assert_allclose(lda_bayes(junk, queries, keep, radius=r), cut, rtol=0, atol=1e-12)
    # long prompts: the task's Bayes score (m_1 - m_-1)^T x
    truth = queries[:, :2] @ (means[0] - means[1])
    far = np.abs(lda_bayes(prompt[:40], queries, radius=r)[:, 0] - truth).max()
    near = np.abs(lda_bayes(prompt, queries, radius=r)[:, 0] - truth).max()
    assert near < 0.15 and near < far / 3, (far, near)


def test_lda_dtypes_jit_vmap():
    batch = lda.task_sampler(3, radius=1.5, n_queries=4, dtype=jnp.float32)(jax.random.key(6), 5, 20)
    masks = np.arange(20)[None] < np.array([20, 10, 3, 0, 1])[:, None]
    f = jax.jit(jax.vmap(partial(lda_bayes, radius=1.5)))
    got = f(batch.prompt, batch.queries, masks)
    assert got.dtype == jnp.float32 and got.shape == (5, 4, 1)
    loop = np.stack([lda_bayes(np.asarray(p, np.float64), np.asarray(q, np.float64), m, radius=1.5)
                     for p, q, m in zip(batch.prompt, batch.queries, masks)])
    np.testing.assert_allclose(got, loop, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[3], 0)


def test_lda_posterior_beats_the_plug_in():
    """On test prompts of task_sampler(2, radius=1.5) at L = 64 the logistic risk of the posterior log-odds is
    below the plug-in's (a paired difference several standard errors from zero) and above the tasks' Bayes risk."""
    tests = lda.task_sampler(2, radius=1.5, n_queries=8)(jax.random.key(7), 2048, 64)
    ours, _ = lda.task_metrics(partial(lda_bayes, radius=1.5), tests, lengths=[64])
    plug, _ = lda.task_metrics(lda.plug_in, tests, lengths=[64])
    bayes, _ = lda.task_metrics("bayes", tests, lengths=[64])
    paired = np.asarray(plug[0] - ours[0])
    assert paired.mean() > 3 * paired.std() / np.sqrt(paired.size)
    assert np.asarray(bayes).mean() < np.asarray(ours).mean()


@pytest.mark.parametrize("name, over", [
    ("prompt", {"prompt": np.ones((4, 1)), "queries": np.ones((2, 1))}), ("prompt", {"prompt": np.ones(4)}),
    ("queries", {"queries": np.ones((2, 4))}), ("mask", {"mask": np.ones(4)}), ("mask", {"mask": np.ones(3, bool)}),
    ("radius", {"radius": 0.0}), ("radius", {"radius": -1.0}),
])
def test_lda_invalid_inputs_are_named(name, over):
    args = {"prompt": np.ones((4, 3)), "queries": np.ones((2, 3)), "mask": None, "radius": 1.5}
    args.update(over)
    assert_rejects(lambda: lda_bayes(args["prompt"], args["queries"], args["mask"], radius=args["radius"]), name)


# ============================================================================ the proposal's pieces


@pytest.mark.parametrize("d, kappa", [(2, 7.0), (3, 40.0), (5, 12.0)])
def test_power_spherical_law(d, kappa):
    """The proposal's law of a mean: its density integrates to one over the sphere (numpy quadrature in the angle
    to mu, with the area of S^{d-2}) and its draws have E[mu^T u] = kappa/(kappa + d - 1)."""
    from gmlib.denoise.optimum import _draw, _power_spherical_logpdf

    mu = np.zeros(d)
    mu[0] = 1.0
    t = (np.arange(100_000) + 0.5) * np.pi / 100_000
    u = np.zeros((t.size, d))
    u[:, 0], u[:, 1] = np.cos(t), np.sin(t)
    dens = np.exp(np.asarray(_power_spherical_logpdf(jnp.asarray(u), jnp.asarray(mu), jnp.asarray(kappa))))
    area = 2 * np.pi ** ((d - 1) / 2) / sp.gamma((d - 1) / 2)  # |S^{d-2}|
    np.testing.assert_allclose(np.sum(dens * np.sin(t) ** (d - 2)) * np.pi / t.size * area, 1.0, rtol=1e-6)
    # draws: labelling A of a proposal whose two means share mu and kappa (the prior's share is uniform)
    prop = (jnp.asarray(np.stack([mu, mu])), jnp.full(2, kappa), jnp.ones(2), jnp.ones(2))
    n = 50_000
    u1, _, tt = _draw(jax.random.key(0), prop, n, d, jnp.float64)
    np.testing.assert_allclose(np.linalg.norm(u1, axis=-1), 1.0, rtol=1e-12)
    expected = 0.8 * kappa / (kappa + d - 1)  # 20 % from the prior (mean 0)
    assert abs(float(jnp.mean(u1 @ mu)) - expected) < 5 * 1.0 / np.sqrt(n)
    assert abs(float(jnp.mean(tt)) - 0.5) < 5 * 0.3 / np.sqrt(n)


def test_gamma_draws():
    from gmlib.denoise.optimum import _gamma

    """The fixed-tries Marsaglia-Tsang sampler against scipy's Gamma law (Kolmogorov-Smirnov), both dtypes."""
    from scipy import stats

    for dtype in (jnp.float64, jnp.float32):
        alpha = np.array([0.5, 1.0, 3.7, 250.0])
        draws = _gamma(jax.random.key(1), jnp.broadcast_to(jnp.asarray(alpha, dtype), (50_000, 4)))
        g = np.asarray(draws, np.float64)
        for j, a in enumerate(alpha):
            assert stats.kstest(g[:, j], "gamma", args=(a,)).pvalue > 1e-4, (dtype, a)
