"""Tests of gmlib.lda, each against an independent computation (numpy, scipy, Monte Carlo, finite differences)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree
from scipy import integrate, stats

import gmlib
from gmlib import lda

C1 = dict(mean_pos=[1.0, 0.0], mean_neg=[0.0, 1.0], cov=np.eye(2), p_pos=0.6)
HALF = dict(mean_pos=[1.0, 0.5], mean_neg=[0.0, 1.0], cov=[[1.0, 0.3], [0.3, 2.0]], p_pos=0.5)  # pi_+ = 1/2, asymmetric
SYM = dict(mean_pos=[0.7, -0.2, 0.1], mean_neg=[-0.7, 0.2, -0.1], cov=np.diag([1.0, 0.5, 2.0]), p_pos=0.5)
SKEW = dict(mean_pos=[0.3, -0.4, 0.5], mean_neg=[-0.2, 0.1, 0.0], cov=[[1.5, 0.2, 0.0], [0.2, 1.0, -0.3], [0.0, -0.3, 0.8]],
            p_pos=0.3)


def make(cfg, dtype=jnp.float64):
    return lda.LDAProblem(*(jnp.asarray(cfg[k], dtype) for k in ("mean_pos", "mean_neg", "cov", "p_pos")))


def np_effective(cfg, th):
    """eq 7 in plain numpy."""
    m1, m0, G = (np.asarray(cfg[k], float) for k in ("mean_pos", "mean_neg", "cov"))
    U, u, v, v22 = (np.asarray(a, float) for a in (th.U11, th.u12, th.v21, th.v22))
    return U @ G @ v, v @ m0 - v22, v @ (m1 - m0) + 2 * v22, 2 * u + U @ (m1 - m0)


def np_predict(cfg, th, x):
    w, b, r, s = np_effective(cfg, th)
    s0 = np.log(cfg["p_pos"] / (1 - cfg["p_pos"]))
    return x @ w + b + r / (1 + np.exp(-(s0 + x @ s)))


def random_theta(key, d, scale):
    return lda.HeadParams.normal(jax.random.key(key), d, scale=scale, dtype=jnp.float64)


def np_risk_over_x(cfg, th, n=60):
    """The risk by a tensor Gauss-Hermite rule over X itself (d = 2): no projections at all."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    nodes = np.stack(np.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2)
    weights = np.outer(w, w).ravel()
    G = np.asarray(cfg["cov"], float)
    L = np.linalg.cholesky(G)
    p = cfg["p_pos"]
    out = 0.0
    for c, m, pc in ((1.0, cfg["mean_pos"], p), (-1.0, cfg["mean_neg"], 1 - p)):
        X = np.asarray(m, float) + nodes @ L.T
        out += pc * weights @ np.logaddexp(0.0, -c * np_predict(cfg, th, X))
    return out


# ----------------------------------------------------------------------------- problem and representation


def test_bayes_params_and_score_match_numpy():
    P = make(SKEW)
    m1, m0, G, p = (np.asarray(SKEW[k], float) for k in ("mean_pos", "mean_neg", "cov", "p_pos"))
    Gi = np.linalg.inv(G)
    w, b = P.bayes_params()
    np.testing.assert_allclose(w, Gi @ (m1 - m0), rtol=1e-12)
    np.testing.assert_allclose(b, -0.5 * (m1 @ Gi @ m1 - m0 @ Gi @ m0) + np.log(p / (1 - p)), rtol=1e-12)
    # f* is the posterior log-odds, computed from the two Gaussian densities
    x = np.random.default_rng(0).normal(size=(7, 3))
    logodds = (np.log(p) + stats.multivariate_normal(m1, G).logpdf(x)
               - np.log(1 - p) - stats.multivariate_normal(m0, G).logpdf(x))
    np.testing.assert_allclose(P.bayes_score(x), logodds, atol=1e-12)


@pytest.mark.parametrize("cfg", [C1, HALF, SKEW])
def test_bayes_risk_matches_scipy_quad(cfg):
    P = make(cfg)
    m1, m0, G, p = (np.asarray(cfg[k], float) for k in ("mean_pos", "mean_neg", "cov", "p_pos"))
    w = np.linalg.solve(G, m1 - m0)
    b = float(P.bayes_params()[1])
    sd = np.sqrt(w @ G @ w)
    ref = 0.0
    for c, m, pc in ((1, m1, p), (-1, m0, 1 - p)):
        mu = w @ m + b
        val, _ = integrate.quad(lambda t: np.logaddexp(0, -c * t) * stats.norm.pdf(t, mu, sd), mu - 40 * sd, mu + 40 * sd,
                                epsabs=1e-14, epsrel=1e-13, limit=400)
        ref += pc * val
    assert abs(float(P.bayes_risk()) - ref) < 1e-12


def test_effective_and_predict_match_numpy():
    P = make(SKEW)
    th = random_theta(0, 3, 0.7)
    for got, want in zip(lda.effective(P, th), np_effective(SKEW, th)):
        np.testing.assert_allclose(got, want, atol=1e-13)
    x = np.random.default_rng(1).normal(size=(11, 3))
    np.testing.assert_allclose(lda.predict(P, th, x), np_predict(SKEW, th, x), atol=1e-13)


@pytest.mark.parametrize("cfg", [C1, HALF, SKEW])
def test_predict_matches_population_attention_on_tokens(cfg):
    P = make(cfg)
    d = P.dim
    th = random_theta(2, d, 0.8)
    U, V = lda.to_attention(th)
    assert U.shape == V.shape == (d + 1, d + 1)
    x = np.random.default_rng(2).normal(size=(9, d))
    q = np.concatenate([x, np.zeros((9, 1))], axis=1)
    out = jax.jit(gmlib.population_attention)(P.tokens(), q, U, V)
    np.testing.assert_allclose(out[:, -1], np_predict(cfg, th, x), atol=1e-12)


def test_predict_matches_finite_prompt_softmax_attention():
    """Finite-prompt softmax attention over L sampled (X, Y) tokens converges to f_theta (error ~ L^-1/2)."""
    P = make(C1)
    th = lda.HeadParams([[0.4, -0.3], [0.2, 0.5]], [0.3, -0.2], [0.8, -0.6], 0.4)
    U, V = lda.to_attention(th)
    L = 400_000
    toks, _ = P.tokens().sample(jax.random.key(5), L)
    x = np.array([[0.5, -0.3], [-1.0, 0.8], [0.0, 0.0]])
    q = np.concatenate([x, np.zeros((3, 1))], axis=1)
    out = gmlib.softmax_attention(toks, q, U, V, block_size=100_000)[:, -1]
    err = np.abs(np.asarray(out) - np_predict(C1, th, x))
    assert err.max() < 0.02, err  # standard error ~ 2e-3 here
    # and the limit is not a coincidence: a wrong sign of u12 moves the answer by far more
    bad = lda.HeadParams(th.U11, -th.u12, th.v21, th.v22)
    assert np.abs(np_predict(C1, bad, x) - np.asarray(out)).max() > 0.05


def test_tokens_law():
    P = make(C1)
    mix = P.tokens()
    np.testing.assert_allclose(mix.weights, [0.6, 0.4])
    np.testing.assert_allclose(mix.means, [[1, 0, 1], [0, 1, -1]])
    np.testing.assert_allclose(mix.covs[0], np.diag([1.0, 1.0, 0.0]))


# ----------------------------------------------------------------------------- risk


@pytest.mark.parametrize("cfg,seed,scale", [(C1, 3, 0.6), (SKEW, 4, 0.5), (HALF, 5, 0.8)])
def test_risk_matches_monte_carlo(cfg, seed, scale):
    P = make(cfg)
    th = random_theta(seed, P.dim, scale)
    x, y = P.sample(jax.random.key(seed + 100), 1_000_000)
    losses = np.logaddexp(0.0, -np.asarray(y) * np_predict(cfg, th, np.asarray(x)))
    mc, se = losses.mean(), losses.std(ddof=1) / np.sqrt(losses.size)
    assert abs(float(lda.risk(P, th)) - mc) < 4 * se, (float(lda.risk(P, th)), mc, se)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_risk_matches_quadrature_over_x(seed):
    """d = 2: the projection rule (64 nodes) against a rule over X itself (60 nodes per coordinate)."""
    P = make(C1)
    th = random_theta(seed + 10, 2, 0.5)
    assert abs(float(lda.risk(P, th)) - np_risk_over_x(C1, th)) < 1e-10


def special_points(cfg):
    """theta = 0, a point of Theta2 (s = 0), a point with s parallel to w, and a random point."""
    P = make(cfg)
    d = P.dim
    zero = lda.HeadParams.zeros(d)
    t2 = lda.bayes_head(P, "theta2")
    rnd = random_theta(7, d, 0.5)
    # s parallel to w: choose u12 so that s = 2 u12 + U11 dm equals 0.5 w
    w, _, _, _ = np_effective(cfg, rnd)
    dm = np.asarray(cfg["mean_pos"], float) - np.asarray(cfg["mean_neg"], float)
    par = lda.HeadParams(rnd.U11, 0.5 * (0.5 * w - np.asarray(rnd.U11) @ dm), rnd.v21, rnd.v22)
    return {"zero": zero, "theta2": t2, "parallel": par, "random": rnd}


@pytest.mark.parametrize("cfg", [C1, SKEW])
def test_risk_converged_in_nodes_at_special_points(cfg):
    P = make(cfg)
    for name, th in special_points(cfg).items():
        a, b = float(lda.risk(P, th, n_nodes=64)), float(lda.risk(P, th, n_nodes=96))
        assert abs(a - b) < 1e-10, name
    np.testing.assert_allclose(lda.risk(P, lda.HeadParams.zeros(P.dim)), np.log(2.0), atol=1e-14)


def fd_grad(f, v, eps=1e-5):
    v = np.asarray(v, float)
    g = np.zeros_like(v)
    for i in range(v.size):
        e = np.zeros_like(v)
        e[i] = eps
        g[i] = (f(v + e) - f(v - e)) / (2 * eps)
    return g


@pytest.mark.parametrize("cfg", [C1, SKEW])
def test_gradient_matches_finite_differences(cfg):
    P = make(cfg)
    for name, th in special_points(cfg).items():
        v, unravel = ravel_pytree(th)
        g = jax.jit(jax.grad(lambda v: lda._risk(P, unravel(v), 64)))(v)
        g_fd = fd_grad(lambda u: float(lda.risk(P, unravel(jnp.asarray(u)))), v)
        assert np.all(np.isfinite(g)), name
        np.testing.assert_allclose(g, g_fd, atol=2e-8, err_msg=name)
    # the gradient returned for a HeadParams is a HeadParams
    assert isinstance(jax.grad(lambda t: lda.risk(P, t))(special_points(cfg)["random"]), lda.HeadParams)


def test_gradient_over_x_d2():
    """d = 2: gradient against finite differences of the rule over X itself (independent of gmlib's quadrature)."""
    P = make(C1)
    th = random_theta(21, 2, 0.5)
    v, unravel = ravel_pytree(th)
    g = jax.grad(lambda v: lda.risk(P, unravel(v)))(v)
    g_fd = fd_grad(lambda u: np_risk_over_x(C1, unravel(jnp.asarray(u))), v)
    np.testing.assert_allclose(g, g_fd, atol=1e-8)


def _flat_risk(v, P, n_nodes):
    d = P.dim
    th = lda.HeadParams.tree_unflatten(None, (v[: d * d].reshape(d, d), v[d * d: d * d + d], v[d * d + d: d * d + 2 * d],
                                              v[-1]))
    return lda._risk(P, th, n_nodes)


_GRAD = jax.jit(jax.grad(_flat_risk), static_argnums=2)
_HESS = jax.jit(jax.hessian(_flat_risk), static_argnums=2)


@pytest.mark.parametrize("cfg,names", [(C1, ("zero", "theta2", "parallel")), (HALF, ("zero", "theta2"))])
def test_hessian_matches_finite_differences(cfg, names):
    P = make(cfg)
    pts = special_points(cfg)
    for name in names:
        v, _ = ravel_pytree(pts[name])
        H = np.asarray(_HESS(v, P, 48))
        H_fd = np.stack([fd_grad(lambda u, i=i: float(_GRAD(jnp.asarray(u), P, 48)[i]), v, eps=1e-5)
                         for i in range(v.size)])
        assert np.all(np.isfinite(H)), name
        np.testing.assert_allclose(H, H.T, atol=1e-12)
        np.testing.assert_allclose(H, H_fd, atol=1e-7, err_msg=name)
        if cfg is HALF and name == "zero":
            # Thm 3.3: theta = 0 is critical when pi_+ = 1/2, and a strict saddle when m_1 != -m_-1
            assert np.abs(_GRAD(v, P, 48)).max() < 1e-14
            eig = np.linalg.eigvalsh(H)
            assert eig.min() < -1e-2 and eig.max() > 1e-2


def test_risk_under_vmap_and_float32():
    P = make(C1)
    ths = [random_theta(s, 2, 0.5) for s in range(3)]
    batch = jax.tree.map(lambda *a: jnp.stack(a), *ths)
    out = jax.vmap(lambda t: lda._risk(P, t, 64))(batch)
    np.testing.assert_allclose(out, [lda.risk(P, t) for t in ths], atol=1e-14)
    P32 = make(C1, jnp.float32)
    th32 = jax.tree.map(lambda a: a.astype(jnp.float32), ths[0])
    r32 = lda.risk(P32, th32, n_nodes=32)
    assert r32.dtype == jnp.float32
    np.testing.assert_allclose(r32, lda.risk(P, ths[0]), atol=1e-5)
    g32 = jax.grad(lambda t: lda.risk(P32, t, n_nodes=32))(th32)
    g64 = jax.grad(lambda t: lda.risk(P, t))(ths[0])
    np.testing.assert_allclose(ravel_pytree(g32)[0], ravel_pytree(g64)[0], atol=1e-4)
    z32 = lda.HeadParams.zeros(2, jnp.float32)
    assert np.all(np.isfinite(ravel_pytree(jax.grad(lambda t: lda.risk(P32, t, n_nodes=32))(z32))[0]))


# ----------------------------------------------------------------------------- Bayes heads


@pytest.mark.parametrize("cfg", [C1, HALF, SYM, SKEW])
@pytest.mark.parametrize("family", ["theta1", "theta2"])
def test_bayes_head_is_bayes_optimal(cfg, family):
    P = make(cfg)
    th = lda.bayes_head(P, family)
    w, b, r, s = np_effective(cfg, th)
    if family == "theta1":
        assert abs(r) < 1e-12 and np.linalg.norm(s) > 1e-3
    else:
        assert np.linalg.norm(s) < 1e-12 and abs(r) > 1e-3
    x = np.random.default_rng(3).normal(size=(13, P.dim))
    np.testing.assert_allclose(np_predict(cfg, th, x), P.bayes_score(x), atol=1e-12)
    assert abs(float(lda.risk(P, th)) - float(P.bayes_risk())) < 1e-10
    v, unravel = ravel_pytree(th)
    assert np.abs(jax.grad(lambda v: lda.risk(P, unravel(v)))(v)).max() < 1e-10


def test_bayes_head_theta1_impossible_for_symmetric_unbalanced():
    P = lda.LDAProblem([1.0, 0.0], [-1.0, 0.0], np.eye(2), 0.7)
    with pytest.raises(ValueError, match="Theta1"):
        lda.bayes_head(P, "theta1")
    th = lda.bayes_head(P, "theta2")
    assert abs(float(lda.risk(P, th)) - float(P.bayes_risk())) < 1e-10
    with pytest.raises(ValueError, match="family"):
        lda.bayes_head(P, "theta3")


# ----------------------------------------------------------------------------- training


def test_gradient_descent_matches_a_python_loop_and_decreases_risk():
    P = make(C1)
    th0 = random_theta(30, 2, 0.5)
    opt = optax.sgd(0.5)
    out = lda.gradient_descent(P, th0, opt, 40, record_every=10, n_nodes=32)
    assert out.steps.tolist() == [0, 10, 20, 30, 40]
    assert np.all(np.diff(np.asarray(out.risks)) < 0)
    th = th0
    grad = jax.jit(jax.grad(lambda t: lda._risk(P, t, 32)))
    for _ in range(40):
        th = jax.tree.map(lambda a, g: a - 0.5 * g, th, grad(th))
    np.testing.assert_allclose(ravel_pytree(out.params)[0], ravel_pytree(th)[0], atol=1e-12)
    np.testing.assert_allclose(ravel_pytree(jax.tree.map(lambda a: a[-1], out.trajectory))[0], ravel_pytree(th)[0])
    # chunked runs give the same result
    out2 = lda.gradient_descent(P, th0, opt, 40, record_every=10, n_nodes=32, chunk_records=2)
    np.testing.assert_allclose(out2.risks, out.risks, atol=1e-14)


def test_sgd_is_reproducible_and_learns():
    P = make(C1)
    th0 = lda.HeadParams.zeros(2)
    opt = optax.sgd(0.05)
    a = lda.sgd(P, th0, jax.random.key(1), opt, 2000, batch_size=16, record_every=500, n_nodes=32)
    b = lda.sgd(P, th0, jax.random.key(1), opt, 2000, batch_size=16, record_every=500, n_nodes=32, chunk_records=1)
    np.testing.assert_allclose(a.risks, b.risks, atol=1e-12)
    assert float(a.risks[-1]) < float(a.risks[0]) - 0.02
    assert float(a.risks[-1]) > float(P.bayes_risk()) - 1e-12


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(C1, p_pos=1.0), "p_pos"),
        (dict(C1, p_pos=-0.1), "p_pos"),
        (dict(C1, cov=[[1.0, 0.0], [0.0, 0.0]]), "cov"),
        (dict(C1, cov=[[1.0, 2.0], [2.0, 1.0]]), "cov"),
        (dict(C1, cov=[[1.0, 0.5], [0.0, 1.0]]), "cov"),
        (dict(C1, mean_neg=[0.0, 1.0, 2.0]), "mean_neg"),
        (dict(C1, mean_pos=[np.nan, 0.0]), "mean_pos"),
        (dict(C1, p_pos=np.inf), "p_pos"),
    ],
)
def test_problem_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        lda.LDAProblem(**kwargs)


def test_function_validation():
    P = make(C1)
    th = lda.HeadParams.zeros(3)
    with pytest.raises(ValueError, match="theta.U11"):
        lda.risk(P, th)
    with pytest.raises(ValueError, match="theta"):
        lda.effective(P, (1, 2, 3, 4))
    with pytest.raises(ValueError, match="x"):
        lda.predict(P, lda.HeadParams.zeros(2), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="n_nodes"):
        lda.risk(P, lda.HeadParams.zeros(2), n_nodes=0)
    with pytest.raises(ValueError, match="problem"):
        lda.risk("C1", lda.HeadParams.zeros(2))
    with pytest.raises(ValueError, match="optimizer"):
        lda.gradient_descent(P, lda.HeadParams.zeros(2), 0.1, 10)
    with pytest.raises(ValueError, match="n_steps"):
        lda.gradient_descent(P, lda.HeadParams.zeros(2), optax.sgd(0.1), 10, record_every=3)
    bad = lda.HeadParams(np.full((2, 2), np.nan), np.zeros(2), np.zeros(2), 0.0)
    with pytest.raises(ValueError, match="finite"):
        lda.risk(P, bad)


def test_works_under_jit_with_traced_problem():
    P = make(HALF)
    th = lda.bayes_head(P, "theta1")
    f = jax.jit(lambda P, t: lda._risk(P, t, 64))
    assert abs(float(f(P, th)) - float(P.bayes_risk())) < 1e-10
