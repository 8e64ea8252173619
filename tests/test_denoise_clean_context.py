"""gmlib.denoise.clean_context: Smart et al.'s setting (clean tokens, a noisy query), each
quantity against an independent computation: numpy loops for the tempered head, the mixture
operator of Prop 2.1 and a long prompt for its infinite limit, the denoising problem's eq 10
for the known-centres Bayes denoiser, a grid integral over the centres' angles for the
posterior mean."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gmlib
from gmlib import denoise

S0, S2 = 0.05, 0.1


def _sample(dim=4, K=3, n=64, L=50, key=0, s0=S0, s2=S2, dtype=None):
    return denoise.clean_context_sampler(dim, K, within_var=s0, noise_var=s2, dtype=dtype)(jax.random.key(key), n, L)


def test_sampler_draws_the_law():
    batch = _sample(dim=3, K=4, n=400, L=200)
    tasks = batch.aux
    assert isinstance(tasks, denoise.CleanTasks)
    np.testing.assert_allclose(jnp.linalg.norm(tasks.centres, axis=-1), 1.0, atol=1e-12)
    own = jnp.take_along_axis(tasks.centres, tasks.labels[..., None], axis=1)
    spread = np.asarray(batch.prompt - own)
    assert abs(spread.var() / S0 - 1) < 0.02 and abs(spread.mean()) < 0.005
    noise = np.asarray(batch.queries - batch.targets)
    assert abs(noise.var() / S2 - 1) < 0.1
    counts = np.bincount(np.asarray(tasks.labels).ravel(), minlength=4) / tasks.labels.size
    np.testing.assert_allclose(counts, 0.25, atol=0.01)
    # the target is a sample of the same mixture: near one of its prompt's centres
    near = jnp.min(jnp.linalg.norm(batch.targets - tasks.centres, axis=-1), -1)
    assert float(jnp.median(near)) < 2 * np.sqrt(3 * S0)


def test_tempered_risk_matches_a_numpy_loop():
    batch = _sample(n=40)
    betas = np.array([0.0, 1.5, 4.0])
    scan = denoise.tempered_risk(batch, betas=betas)
    assert isinstance(scan, denoise.TemperedRisk)
    x, q, t = (np.asarray(a) for a in (batch.prompt, batch.queries[:, 0], batch.targets[:, 0]))
    for j, beta in enumerate(betas):
        h, ess = [], []
        for p in range(len(x)):
            w = np.exp(beta * x[p] @ q[p] - np.max(beta * x[p] @ q[p]))
            h.append(w @ x[p] / w.sum())
            ess.append(w.sum() ** 2 / (w**2).sum())
        h = np.array(h)
        alpha = np.sum(h * t) / np.sum(h * h)  # least squares in one variable
        np.testing.assert_allclose(scan.alpha[j], alpha, rtol=1e-10)
        np.testing.assert_allclose(scan.risk[j], np.mean((alpha * h - t) ** 2), rtol=1e-10)
        np.testing.assert_allclose(scan.risk_at(0.7)[j], np.mean((0.7 * h - t) ** 2), rtol=1e-10)
        err = np.sum((h - t) ** 2, -1) / x.shape[-1]
        np.testing.assert_allclose(scan.risk_at(1.0)[j], err.mean(), rtol=1e-10)
        np.testing.assert_allclose(scan.stderr[j], err.std() / np.sqrt(len(err)), rtol=1e-10)
        np.testing.assert_allclose(scan.effective_tokens[j], np.median(ess), rtol=1e-10)
    assert scan.effective_tokens[0] == pytest.approx(50)  # beta = 0: every token counts


def test_infinite_prompt_is_the_mixture_operator_and_the_long_prompt_limit():
    batch = _sample(dim=3, K=2, n=3, L=5)
    betas = np.array([1.0, 3.0])
    inf = denoise.tempered_risk(batch, betas=betas, infinite=True)
    assert np.all(np.isinf(inf.effective_tokens))
    tasks, q, t = batch.aux, batch.queries[:, 0], batch.targets[:, 0]
    for j, beta in enumerate(betas):
        h = []
        for p in range(3):
            mix = gmlib.GaussianMixture(np.full(2, 0.5), tasks.centres[p], np.stack([S0 * np.eye(3)] * 2))
            h.append(gmlib.population_attention(mix, q[p][None], beta * np.eye(3), np.eye(3))[0])
        h = np.array(h)
        np.testing.assert_allclose(inf.cross[j], np.mean(np.sum(h * np.asarray(t), -1)) / 3, rtol=1e-10)
        np.testing.assert_allclose(inf.power[j], np.mean(np.sum(h * h, -1)) / 3, rtol=1e-10)
    # a prompt of 200,000 tokens of the same tasks comes close to the infinite one
    long = denoise.clean_context_sampler(3, 2, within_var=S0, noise_var=S2)(jax.random.key(1), 8, 200_000)
    fin, inf = (denoise.tempered_risk(long, betas=betas, infinite=flag) for flag in (False, True))
    np.testing.assert_allclose(fin.power, inf.power, rtol=1e-2)
    np.testing.assert_allclose(fin.cross, inf.cross, rtol=1e-2)


def test_known_centres_bayes_is_eq_10():
    batch = _sample(dim=3, K=3, n=5, L=4)
    pred = denoise.known_centres_bayes(batch)
    for p in range(5):
        problem = denoise.DenoisingProblem(np.full(3, 1 / 3), batch.aux.centres[p], np.sqrt(S0), np.sqrt(S2))
        np.testing.assert_allclose(pred[p], problem.bayes(batch.queries[p])[0], rtol=1e-10)
    # the best denoiser of all: below every tempered head on the same queries
    big = _sample(dim=4, K=3, n=2000, L=100)
    risk = float(jnp.mean((denoise.known_centres_bayes(big) - big.targets[:, 0]) ** 2))
    assert risk < float(denoise.tempered_risk(big, betas=np.linspace(0, 10, 11)).risk.min())


def _grid_posterior_mean(prompt, labels, q, K, s0, s2, n_grid=20_000):
    """E[x | q, tokens, labels] in d = 2, each centre's angle integrated on a grid."""
    theta = np.linspace(0, 2 * np.pi, n_grid, endpoint=False)
    mu = np.stack([np.cos(theta), np.sin(theta)], -1)  # (G, 2)
    s = s0 + s2
    log_ev, mean_mu = [], []
    for k in range(K):
        log_prior = mu @ prompt[labels == k].sum(0) / s0  # the cluster's tokens, up to a constant
        log_lik = -np.sum((q - mu) ** 2, -1) / (2 * s)
        a, b = log_prior.max(), (log_prior + log_lik).max()
        prior, post = np.exp(log_prior - a), np.exp(log_prior + log_lik - b)
        log_ev.append(np.log(post.sum()) + b - np.log(prior.sum()) - a)
        mean_mu.append(post @ mu / post.sum())
    w = np.exp(np.array(log_ev) - max(log_ev))
    w /= w.sum()
    return (s0 * q + s2 * (w @ np.array(mean_mu))) / s


@pytest.mark.parametrize("L, s0", [(6, 0.3), (60, 0.05)])
def test_clean_context_bayes_against_a_grid_integral(L, s0):
    batch = _sample(dim=2, K=3, n=6, L=L, s0=s0, key=3)
    pred = denoise.clean_context_bayes(batch, labels=batch.aux.labels)
    for p in range(6):
        expected = _grid_posterior_mean(*(np.asarray(a) for a in (batch.prompt[p], batch.aux.labels[p],
                                                                   batch.queries[p, 0])), 3, s0, S2)
        np.testing.assert_allclose(pred[p], expected, rtol=1e-6, atol=1e-9)


def test_clean_context_bayes_between_the_known_centres_and_the_tempered_heads():
    batch = _sample(dim=8, K=4, n=3000, L=400, s0=0.02)
    err = lambda f: float(jnp.mean((f - batch.targets[:, 0]) ** 2))  # noqa: E731
    known = err(denoise.known_centres_bayes(batch))
    lower = err(denoise.clean_context_bayes(batch, labels=batch.aux.labels))
    upper = err(denoise.clean_context_bayes(batch, labels=denoise.cluster_labels(batch.prompt, n_clusters=4)))
    tempered = float(denoise.tempered_risk(batch, betas=np.linspace(1, 12, 23)).risk.min())
    assert known < lower <= upper * (1 + 1e-3) and upper < tempered
    assert lower / known - 1 < 0.05  # 100 tokens per cluster: the centres are nearly known
    # a cluster without tokens falls back on the uniform prior: finite, and no better
    empty = batch.aux.labels % 3  # cluster 3 never labelled
    assert np.isfinite(np.asarray(denoise.clean_context_bayes(batch, labels=empty))).all()


def test_cluster_labels_recover_separated_clusters():
    batch = _sample(dim=16, K=8, n=50, L=499, s0=0.005)
    found = np.asarray(denoise.cluster_labels(batch.prompt, n_clusters=8))
    true = np.asarray(batch.aux.labels)
    for p in range(50):  # a partition equal to the true one, up to the clusters' names
        pairs = set(zip(true[p], found[p]))
        assert len(pairs) == len(set(true[p])) == len(set(found[p]))


def test_training_starts_where_smart_et_al_start_and_learns():
    sample = denoise.clean_context_sampler(4, 2, within_var=S0, noise_var=S2)
    train = sample(jax.random.key(0), 64, 30)
    still = denoise.train_clean_context(train, seeds=[0, 1], optimizer=optax.sgd(0.0), n_steps=1, batch_size=8)
    U = np.asarray(still.params.U)
    assert U.shape == (2, 1, 4, 4) and np.abs(U).max() <= 0.5 and np.abs(U).std() > 0.1  # uniform on +-1/2
    assert not np.allclose(U[0], U[1])
    runs = denoise.train_clean_context(train, seeds=[0, 1], optimizer=optax.adam(0.02), n_steps=300,
                                       batch_size=16, record_every=100)
    assert runs.metric.shape == (2, 3) and np.all(runs.metric[:, -1] < 0.6 * runs.metric[:, 0])
    again = denoise.train_clean_context(train, seeds=[1], optimizer=optax.adam(0.02), n_steps=300, batch_size=16)
    np.testing.assert_allclose(again.params.U[0], runs.params.U[1], rtol=1e-12)
    # the loss it minimises is the mean squared error per coordinate of the heads
    heads = jax.tree.map(lambda a: a[0], runs.params)
    pred = jax.vmap(gmlib.apply_heads, (None, 0, 0))(heads, train.prompt, train.queries)
    direct = np.mean((np.asarray(pred) - np.asarray(train.targets)) ** 2)
    assert 0.5 * runs.metric[0, -1] < direct < 1.5 * runs.metric[0, -1]


def test_float32():
    batch = _sample(n=100, dtype=jnp.float32)
    scan = denoise.tempered_risk(batch, betas=[1.0, 4.0])
    assert scan.risk.dtype == jnp.float32
    pred = denoise.clean_context_bayes(batch, labels=batch.aux.labels)
    wide = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating)
                        else a, batch)
    ref = denoise.clean_context_bayes(wide, labels=batch.aux.labels)
    assert pred.dtype == jnp.float32
    np.testing.assert_allclose(pred, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs, name", [
    (dict(dim=0, n_centres=2, within_var=0.1, noise_var=0.1), "dim"),
    (dict(dim=2, n_centres=0, within_var=0.1, noise_var=0.1), "n_centres"),
    (dict(dim=2, n_centres=2, within_var=-0.1, noise_var=0.1), "within_var"),
    (dict(dim=2, n_centres=2, within_var=0.1, noise_var=0.0), "noise_var"),
])
def test_sampler_rejects_bad_values(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        denoise.clean_context_sampler(**kwargs)


def test_bad_input_is_named():
    batch = _sample(n=4)
    with pytest.raises(ValueError, match="`betas`"):
        denoise.tempered_risk(batch, betas=[-1.0])
    with pytest.raises(ValueError, match="`betas`"):
        denoise.tempered_risk(batch, betas=[[1.0]])
    with pytest.raises(ValueError, match="`labels`"):
        denoise.clean_context_bayes(batch, labels=batch.aux.labels[:, :-1])
    with pytest.raises(ValueError, match="`labels`"):
        denoise.clean_context_bayes(batch, labels=batch.aux.labels.astype(float))
    with pytest.raises(ValueError, match="`n_clusters`"):
        denoise.cluster_labels(batch.prompt, n_clusters=51)
    with pytest.raises(ValueError, match="`n_clusters`"):
        denoise.cluster_labels(batch.prompt, n_clusters=0)
    with pytest.raises(ValueError, match="`prompt`"):
        denoise.cluster_labels(batch.prompt[0], n_clusters=2)
    with pytest.raises(ValueError, match="`batch_size`"):
        denoise.train_clean_context(batch, seeds=[0], optimizer=optax.sgd(0.1), n_steps=1, batch_size=0)
