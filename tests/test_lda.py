"""Tests of gmlib.lda: reference values against independent computations (numpy, scipy's adaptive
quadrature, Monte Carlo, finite differences), steep gates, properties on random valid inputs, and
one set of bad-input tests (random corruptions of one argument: a ValueError naming it)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.flatten_util import ravel_pytree
from scipy import integrate, stats
from scipy.special import expit
from strategies import (
    DTYPES,
    SETTINGS,
    Arg,
    arrays,
    assert_rejects,
    asymmetric,
    bad_positive_int,
    corrupt,
    floats,
    indefinite,
    tol,
)

import gmlib
from gmlib import lda
from gmlib._pytree import unchecked
from gmlib.lda._risk import _effective_risk, _risk

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
    return lda.HeadParams.normal(d, key=jax.random.key(key), scale=scale, dtype=jnp.float64)


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
    np.testing.assert_allclose(P.bayes(x), logodds, atol=1e-12)


@pytest.mark.smoke
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
    """to_attention's head on the infinite prompt (Prop 2.1) is f_theta of eq 6, in numpy."""
    P = make(cfg)
    d = P.dim
    th = random_theta(2, d, 0.8)
    heads = lda.to_attention(th)
    assert isinstance(heads, gmlib.Heads) and heads.U.shape == (1, d + 1, d + 1) and heads.V.shape == (1, 1, d + 1)
    x = np.random.default_rng(2).normal(size=(9, d))
    q = np.concatenate([x, np.zeros((9, 1))], axis=1)
    out = gmlib.apply_heads(heads, P.prompt, q)
    assert out.shape == (9, 1)
    np.testing.assert_allclose(out[:, 0], np_predict(cfg, th, x), atol=1e-12)
    np.testing.assert_allclose(out[:, 0], lda.predict(P, th, x), atol=1e-12)
    # under jit, with the problem and theta traced
    f = jax.jit(lambda P, th: gmlib.apply_heads(lda.to_attention(th), P.prompt, q)[:, 0])
    np.testing.assert_allclose(f(P, th), np_predict(cfg, th, x), atol=1e-12)


def test_predict_matches_finite_prompt_softmax_attention():
    """Finite-prompt softmax attention over L sampled (X, Y) tokens converges to f_theta (error ~ L^-1/2)."""
    P = make(C1)
    th = lda.HeadParams([[0.4, -0.3], [0.2, 0.5]], [0.3, -0.2], [0.8, -0.6], 0.4)
    L = 400_000
    toks, _ = P.prompt.sample(key=jax.random.key(5), n_samples=L)
    x = np.array([[0.5, -0.3], [-1.0, 0.8], [0.0, 0.0]])
    q = np.concatenate([x, np.zeros((3, 1))], axis=1)
    out = gmlib.apply_heads(lda.to_attention(th), toks, q, block_size=100_000)[:, 0]
    err = np.abs(np.asarray(out) - np_predict(C1, th, x))
    assert err.max() < 0.02, err  # standard error ~ 2e-3 here
    # and the limit is not a coincidence: a wrong sign of u12 moves the answer by far more
    bad = lda.HeadParams(th.U11, -th.u12, th.v21, th.v22)
    assert np.abs(np_predict(C1, bad, x) - np.asarray(out)).max() > 0.05


def test_prompt_law():
    P = make(C1)
    mix = P.prompt
    np.testing.assert_allclose(mix.weights, [0.6, 0.4])
    np.testing.assert_allclose(mix.means, [[1, 0, 1], [0, 1, -1]])
    np.testing.assert_allclose(mix.covs[0], np.diag([1.0, 1.0, 0.0]))


# ----------------------------------------------------------------------------- risk


@pytest.mark.parametrize("cfg,seed,scale", [(C1, 3, 0.6), (SKEW, 4, 0.5), (HALF, 5, 0.8)])
def test_risk_matches_monte_carlo(cfg, seed, scale):
    P = make(cfg)
    th = random_theta(seed, P.dim, scale)
    x, y = P.sample(key=jax.random.key(seed + 100), n_samples=1_000_000)
    losses = np.logaddexp(0.0, -np.asarray(y) * np_predict(cfg, th, np.asarray(x)))
    mc, se = losses.mean(), losses.std(ddof=1) / np.sqrt(losses.size)
    assert abs(float(lda.risk(P, th)) - mc) < 4 * se, (float(lda.risk(P, th)), mc, se)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_risk_matches_quadrature_over_x(seed):
    """d = 2: the projection rule against a rule over X itself (60 nodes per coordinate)."""
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
        g = jax.jit(jax.grad(lambda v: _risk(P, unravel(v), 64)))(v)
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
    th = unchecked(lda.HeadParams, v[: d * d].reshape(d, d), v[d * d: d * d + d], v[d * d + d: d * d + 2 * d], v[-1])
    return _risk(P, th, n_nodes)


_GRAD = jax.jit(jax.grad(_flat_risk), static_argnums=2)
_HESS = jax.jit(jax.jacfwd(jax.jacfwd(_flat_risk)), static_argnums=2)  # jax.hessian's matrix, cheaper to compile


@pytest.mark.parametrize("cfg,names", [(C1, ("zero", "theta2", "parallel")), (HALF, ("zero", "theta2"))])
def test_hessian_matches_finite_differences(cfg, names):
    P = make(cfg)
    pts = special_points(cfg)
    for name in names:
        v, _ = ravel_pytree(pts[name])
        H = np.asarray(_HESS(v, P, 96))
        H_fd = np.stack([fd_grad(lambda u, i=i: float(_GRAD(jnp.asarray(u), P, 96)[i]), v, eps=1e-5)
                         for i in range(v.size)])
        assert np.all(np.isfinite(H)), name
        np.testing.assert_allclose(H, H.T, atol=1e-12)
        np.testing.assert_allclose(H, H_fd, atol=1e-7, err_msg=name)
        if cfg is HALF and name == "zero":
            # Thm 3.3: theta = 0 is critical when pi_+ = 1/2, and a strict saddle when m_1 != -m_-1
            assert np.abs(_GRAD(v, P, 96)).max() < 1e-14
            eig = np.linalg.eigvalsh(H)
            assert eig.min() < -1e-2 and eig.max() > 1e-2


def test_risk_under_vmap_and_float32():
    P = make(C1)
    ths = [random_theta(s, 2, 0.5) for s in range(3)]
    batch = jax.tree.map(lambda *a: jnp.stack(a), *ths)
    out = jax.vmap(lambda t: _risk(P, t, 64))(batch)
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


# ----------------------------------------------------------------------------- steep gates


def quad_class_risk(mu, cov, b, r, s0, c):
    """E softplus(-c (y1 + b + r sigma(s0 + y2))), y ~ N(mu, cov), by scipy's adaptive quadrature of the
    one-dimensional conditional integral over y2 (split at the gate's step); given y2, y1 is Gaussian and
    the smooth inner integral is a 200-node Gauss-Hermite rule (not gmlib's graded rule)."""
    sd2 = np.sqrt(cov[1, 1])
    a = cov[0, 1] / sd2
    e = np.sqrt(cov[0, 0] - a * a)
    x1, w1 = np.polynomial.hermite_e.hermegauss(200)
    w1 = w1 / w1.sum()

    def integrand(xi2):
        alpha = mu[0] + a * xi2 + b + r * expit(s0 + mu[1] + sd2 * xi2)
        return stats.norm.pdf(xi2) * (w1 @ np.logaddexp(0.0, -c * (alpha + e * x1)))

    step = (-s0 - mu[1]) / sd2
    opts = dict(epsabs=1e-15, epsrel=1e-14, limit=400)
    return sum(integrate.quad(integrand, lo, hi, **opts)[0] for lo, hi in ((-12.0, step), (step, 12.0))
               if lo < hi)


def quad_effective_risk(cfg, w, b, r, s):
    m1, m0, G = (np.asarray(cfg[k], float) for k in ("mean_pos", "mean_neg", "cov"))
    p = cfg["p_pos"]
    s0 = np.log(p / (1 - p))
    A = np.stack([w, s])
    cov = A @ G @ A.T
    return (p * quad_class_risk(A @ m1, cov, b, r, s0, 1.0)
            + (1 - p) * quad_class_risk(A @ m0, cov, b, r, s0, -1.0))


def table3_theta1(P):
    """The Theta1 start of the paper's Figure 1 (Table 3, C1): |s| = 28.3 (see chapter 4 for the reading)."""
    b_star = float(P.bayes_params()[1])
    return lda.HeadParams(np.array([[1.0, 0.0], [-1.0, 0.0]]) / (2 * b_star), [10.0, 10.0], [2 * b_star, 0.0], -b_star)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("norm_s", [0.0, 1.0, 4.0, 10.0, 28.0, 100.0])
def test_effective_risk_matches_adaptive_quadrature_for_steep_gates(norm_s):
    """The projection sd of s^T X from 0 to 100 (Gamma = I: |s|): error at round-off against scipy's quad."""
    P = make(C1)
    s = norm_s * np.array([0.8, 0.6])
    w, b, r = np.array([1.0, -1.0]), 0.3, 1.7
    got = float(lda.effective_risk(P, w, b, r, s))
    if norm_s == 0.0:  # no gate: a one-dimensional integral
        want = sum(pc * integrate.quad(lambda t: stats.norm.pdf(t, w @ m + b + r * 0.6, np.sqrt(2.0))
                                       * np.logaddexp(0.0, -c * t), -40, 40, epsabs=1e-15, epsrel=1e-13,
                                       limit=400)[0]
                   for c, m, pc in ((1, np.array(C1["mean_pos"]), 0.6), (-1, np.array(C1["mean_neg"]), 0.4)))
    else:
        want = quad_effective_risk(C1, w, b, r, s)
    assert abs(got - want) < 1e-12, (got, want)
    # the old two-dimensional Gauss-Hermite rule (64 nodes) is not this accurate once the gate is steep
    if norm_s >= 10:
        x, wt = np.polynomial.hermite_e.hermegauss(64)
        wt = wt / wt.sum()
        nodes = np.stack(np.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2)
        weights = np.outer(wt, wt).ravel()
        A = np.stack([w, s])
        root = np.linalg.cholesky(A @ A.T)
        gh = sum(pc * weights @ np.logaddexp(0.0, -c * (y[:, 0] + b + r * expit(np.log(1.5) + y[:, 1])))
                 for c, pc, y in ((1, 0.6, A @ C1["mean_pos"] + nodes @ root.T),
                                  (-1, 0.4, A @ C1["mean_neg"] + nodes @ root.T)))
        assert abs(gh - want) > 1e3 * abs(got - want) + 1e-9


@pytest.mark.parametrize("norm_s", [4.0, 28.0, 100.0])
def test_gradient_matches_finite_differences_for_steep_gates(norm_s):
    """Stein's-identity gradient against central differences of the value (checked against quad above)."""
    P = make(C1)
    z = jnp.concatenate([jnp.array([1.0, -1.0, 0.3, 1.7]), norm_s * jnp.array([0.8, 0.6])])
    f = jax.jit(lambda z: _effective_risk(P, z[:2], z[2], z[3], z[4:], lda.DEFAULT_NODES))
    g_fd = fd_grad(lambda u: float(f(jnp.asarray(u))), z, eps=1e-5)
    np.testing.assert_allclose(jax.grad(f)(z), g_fd, atol=1e-9)


def test_hessian_at_the_figure_1_start_is_psd_with_the_kernel_of_theorem_3_5():
    """At Table 3's Theta1 point (|s| = 28) the Hessian is PSD; its kernel is the tangent space of Theta1
    (the null space of the Jacobian of (w - w*, b - b*, r)), of dimension d^2 + d - 1 = 5 (Thm 3.5)."""
    P = make(C1)
    th = table3_theta1(P)
    w, b, r, s = np_effective(C1, th)
    w_star, b_star = (np.asarray(a) for a in P.bayes_params())
    np.testing.assert_allclose(w, w_star, atol=1e-14)
    assert abs(b - b_star) < 1e-14 and abs(r) < 1e-14 and 28 < np.linalg.norm(s) < 29
    v, unravel = ravel_pytree(th)
    H = np.asarray(_HESS(v, P, 96))
    eig, vec = np.linalg.eigh(H)
    assert eig.min() > -1e-12 * eig.max()  # no spurious negative eigenvalue
    kernel = vec[:, np.abs(eig) < 1e-9 * eig.max()]
    assert kernel.shape[1] == 5 and eig[np.abs(eig) >= 1e-9 * eig.max()].min() > 1e-3

    def constraint(u):
        w, b, r, _ = lda.effective(P, unravel(u))
        return jnp.concatenate([w, jnp.stack([b, r])])

    J = np.asarray(jax.jacobian(constraint)(v))
    _, sv, vt = np.linalg.svd(J)
    tangent = vt[int(np.sum(sv > 1e-10)):].T
    assert tangent.shape[1] == 5
    # the two 5-dimensional subspaces coincide: the principal angles vanish
    np.testing.assert_allclose(np.linalg.svd(kernel.T @ tangent)[1], 1.0, atol=1e-8)


@pytest.mark.parametrize("cfg", [C1, SKEW])
def test_risk_hessian_matches_the_flat_hessian_and_is_symmetric(cfg):
    """risk_hessian is the matrix of jax.hessian in ravel_pytree's order, at a random head."""
    P = make(cfg)
    th = lda.HeadParams.normal(P.dim, key=jax.random.key(4))
    v, _ = ravel_pytree(th)
    H = np.asarray(lda.risk_hessian(P, th, n_nodes=64))
    assert H.shape == (v.size, v.size)
    np.testing.assert_allclose(H, np.asarray(_HESS(v, P, 64)), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(H, H.T, atol=1e-12)


@pytest.mark.parametrize("cfg", [C1, HALF, SKEW])
@pytest.mark.parametrize("family", ["theta1", "theta2"])
def test_family_constraints_vanish_on_their_family_only(cfg, family):
    """The constraints are (w - w*, b - b*, r) or (w - w*, s, b + r sigma(s0) - b*), in numpy;
    zero at a Bayes head of the family, not at one of the other family."""
    P = make(cfg)
    d, other = P.dim, {"theta1": "theta2", "theta2": "theta1"}[family]
    w_star, b_star = (np.asarray(a) for a in P.bayes_params())
    sig0 = expit(float(P.s0))
    th = lda.HeadParams.normal(d, key=jax.random.key(5))
    w, b, r, s = np_effective(cfg, th)
    expected = (np.concatenate([w - w_star, [b - b_star, r]]) if family == "theta1"
                else np.concatenate([w - w_star, s, [b + r * sig0 - b_star]]))
    got = np.asarray(lda.family_constraints(P, th, family))
    assert got.shape == ((d + 2,) if family == "theta1" else (2 * d + 1,))
    np.testing.assert_allclose(got, expected, atol=1e-12)
    assert np.abs(np.asarray(lda.family_constraints(P, lda.bayes_head(P, family), family))).max() < 1e-12
    assert np.abs(np.asarray(lda.family_constraints(P, lda.bayes_head(P, other), family))).max() > 1e-3
    with pytest.raises(ValueError, match="family"):
        lda.family_constraints(P, th, "theta3")


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
    np.testing.assert_allclose(np_predict(cfg, th, x), P.bayes(x), atol=1e-12)
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
    out = lda.gradient_descent(P, th0, opt, n_steps=40, record_every=10, n_nodes=32)
    assert out.steps.tolist() == [0, 10, 20, 30, 40]
    assert np.all(np.diff(np.asarray(out.metric)) < 0)
    th = th0
    grad = jax.jit(jax.grad(lambda t: _risk(P, t, 32)))
    for _ in range(40):
        th = jax.tree.map(lambda a, g: a - 0.5 * g, th, grad(th))
    np.testing.assert_allclose(ravel_pytree(out.params)[0], ravel_pytree(th)[0], atol=1e-12)
    np.testing.assert_allclose(ravel_pytree(jax.tree.map(lambda a: a[-1], out.trajectory))[0], ravel_pytree(th)[0])
    # chunked runs give the same result
    out2 = lda.gradient_descent(P, th0, opt, n_steps=40, record_every=10, n_nodes=32, chunk_records=2)
    np.testing.assert_allclose(out2.metric, out.metric, atol=1e-14)


def test_sgd_is_reproducible_and_learns():
    P = make(C1)
    th0 = lda.HeadParams.zeros(2)
    opt = optax.sgd(0.05)
    a = lda.sgd(P, th0, opt, key=jax.random.key(1), n_steps=2000, batch_size=16, record_every=500, n_nodes=32)
    b = lda.sgd(P, th0, opt, key=jax.random.key(1), n_steps=2000, batch_size=16, record_every=500, n_nodes=32, chunk_records=1)
    np.testing.assert_allclose(a.metric, b.metric, atol=1e-12)
    assert float(a.metric[-1]) < float(a.metric[0]) - 0.02
    assert float(a.metric[-1]) > float(P.bayes_risk()) - 1e-12


def test_training_shares_one_compilation_across_problems():
    """Calls that differ only in the problem and the start point reuse optimize's compiled chunk."""
    from gmlib._loop import _block

    probs = [make(C1), make(HALF)]
    th0s = [random_theta(40, 2, 0.5), random_theta(41, 2, 0.5)]
    for run in (lambda P, th: lda.gradient_descent(P, th, OPT, n_steps=2, n_nodes=N_NODES),
                lambda P, th: lda.sgd(P, th, OPT, key=jax.random.key(3), n_steps=2, batch_size=4, n_nodes=N_NODES)):
        first = run(probs[0], th0s[0])
        size = _block._cache_size()
        second = run(probs[1], th0s[1])
        assert _block._cache_size() == size
        assert not np.array_equal(first.metric, second.metric)


def test_works_under_jit_with_traced_problem():
    P = make(HALF)
    th = lda.bayes_head(P, "theta1")
    f = jax.jit(lambda P, t: _risk(P, t, 64))
    assert abs(float(f(P, th)) - float(P.bayes_risk())) < 1e-10


# ============================================================================ properties on random inputs


@st.composite
def problems(draw, dtype=None, mean_scale=2.0):
    dtype = dtype or draw(st.sampled_from(DTYPES))
    d = draw(st.sampled_from([1, 2, 3]))
    a = draw(arrays((d, d), -1.0, 1.0))
    cov = a @ a.T + 0.2 * np.eye(d)
    p = draw(floats(0.05, 0.95))
    return lda.LDAProblem(draw(arrays((d,), -mean_scale, mean_scale)).astype(dtype),
                          draw(arrays((d,), -mean_scale, mean_scale)).astype(dtype),
                          (0.5 * (cov + cov.T)).astype(dtype), dtype(p))


@SETTINGS
@given(prob=problems(), x=arrays((4, 3), -5.0, 5.0))
def test_bayes_and_risk_are_symmetric_in_the_classes(prob, x):
    x = x[:, :prob.dim].astype(prob.dtype)
    t = tol(prob.dtype)
    score = np.asarray(prob.bayes(x), np.float64)
    risk = float(prob.bayes_risk())
    p = float(prob.p_pos)
    prior_risk = -(p * np.log(p) + (1 - p) * np.log(1 - p))  # the best score that ignores x
    assert np.all(np.isfinite(score)) and np.isfinite(risk)
    assert -10 * t <= risk <= prior_risk + 100 * t
    swapped = lda.LDAProblem(prob.mean_neg, prob.mean_pos, prob.cov, 1 - prob.p_pos)
    scale = 1 + np.abs(score).max()
    np.testing.assert_allclose(np.asarray(swapped.bayes(x), np.float64), -score, atol=1e3 * t * scale)
    np.testing.assert_allclose(float(swapped.bayes_risk()), risk, atol=1e3 * t)
    mix = prob.prompt
    assert mix.n_components == 2 and mix.dim == prob.dim + 1
    np.testing.assert_allclose(float(mix.weights.sum()), 1.0, atol=10 * t)


def _outside_unit_interval(_):
    return st.sampled_from([0.0, 1.0, -0.2, 1.5])


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_problem_rejects_invalid(prob, data):
    args = dict(mean_pos=np.asarray(prob.mean_pos), mean_neg=np.asarray(prob.mean_neg), cov=np.asarray(prob.cov),
                p_pos=np.float64(prob.p_pos))

    def rank_deficient(_):  # LDA needs a positive definite covariance
        return st.just(np.zeros((prob.dim, prob.dim)))

    spec = {"mean_pos": Arg(), "mean_neg": Arg(fixed_axes=(0,)),
            "cov": Arg(fixed_axes=(0, 1), extra=(asymmetric, indefinite, rank_deficient)),
            "p_pos": Arg(extra=(_outside_unit_interval,))}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: lda.LDAProblem(**bad), name)


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_bayes_rejects_invalid_points(prob, data):
    name, bad = data.draw(corrupt(dict(x=np.zeros((2, prob.dim))), {"x": Arg(fixed_axes=(1,))}))
    assert_rejects(lambda: prob.bayes(bad["x"]), name)


# ----------------------------------------------------------------------------- finite prompts


def test_prompt_sampler_statistics():
    """The prompt's tokens (x, y) and the queries' (x, target) follow the LDA law; the label slot of a query is 0."""
    mp, mn, cov = np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([[1.0, 0.3], [0.3, 0.5]])
    sample = lda.prompt_sampler(lda.LDAProblem(mp, mn, cov, 0.6), n_queries=3)
    b = sample(jax.random.key(0), 512, 200)
    assert isinstance(b, gmlib.Batch) and b.aux is None and b.mask is None
    assert b.prompt.shape == (512, 200, 3) and b.queries.shape == (512, 3, 3) and b.targets.shape == (512, 3, 1)
    y = np.asarray(b.prompt[..., 2]).ravel()
    x = np.asarray(b.prompt[..., :2]).reshape(-1, 2)
    np.testing.assert_allclose((y > 0).mean(), 0.6, atol=0.01)
    np.testing.assert_allclose(x[y > 0].mean(0), mp, atol=0.01)
    np.testing.assert_allclose(np.cov(x[y < 0].T), cov, atol=0.02)
    assert np.all(np.asarray(b.queries[..., 2]) == 0)
    yq, xq = np.asarray(b.targets).ravel(), np.asarray(b.queries[..., :2]).reshape(-1, 2)
    np.testing.assert_allclose((yq > 0).mean(), 0.6, atol=0.05)  # 1536 queries: sd 0.0125
    np.testing.assert_allclose(xq[yq < 0].mean(0), mn, atol=0.15)
    # the sampler is a pytree holding the problem's arrays: it goes through jit as an argument
    again = jax.jit(lambda s, k: s(k, 512, 200))(sample, jax.random.key(0))
    np.testing.assert_array_equal(again.prompt, b.prompt)


@SETTINGS
@given(prob=problems(), n_queries=st.sampled_from([1, 3]), seed=st.integers(0, 2**31 - 1),
       bl=st.sampled_from([(1, 4), (3, 2)]))
def test_prompt_sampler(prob, n_queries, seed, bl):
    """Tokens (x, y) with y = ±1, queries (x, 0), targets ±1 of shape (B, Q, 1), in the problem's dtype; reproducible."""
    B, L = bl
    d = prob.dim
    sample = lda.prompt_sampler(prob, n_queries=n_queries)
    b = sample(jax.random.key(seed), B, L)
    assert isinstance(b, gmlib.Batch)
    assert b.prompt.shape == (B, L, d + 1) and b.queries.shape == (B, n_queries, d + 1)
    assert b.targets.shape == (B, n_queries, 1)
    for a in (b.prompt, b.queries, b.targets):
        assert np.all(np.isfinite(_np(a))) and a.dtype == prob.dtype
    assert set(np.unique(_np(b.prompt[..., -1]))) <= {-1.0, 1.0}
    assert set(np.unique(_np(b.targets))) <= {-1.0, 1.0}
    assert np.all(_np(b.queries[..., -1]) == 0)
    again = sample(jax.random.key(seed), B, L)
    np.testing.assert_array_equal(_np(again.prompt), _np(b.prompt))


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_prompt_sampler_rejects_invalid(prob, data):
    # (the problem was checked when it was built: test_problem_rejects_invalid)
    name, bad = data.draw(corrupt(dict(n_queries=2), {"n_queries": INT}))
    assert_rejects(lambda: lda.prompt_sampler(prob, **bad), name)





# ============================================================================ heads, prediction, risk, training
#
# Valid random heads θ: to_attention's (U, V) on the token law is the prediction f_θ (Prop 2.1),
# predict is w·x + b + r σ(s₀ + s·x) with (w, b, r, s) = effective(θ), effective_risk ∘ effective
# is risk, risk ≥ R* (the Bayes risk) with equality at bayes_head, and swapping the classes
# (m₁ ↔ m₋₁, π₊ ↔ 1 − π₊) with θ' = (U₁₁, −u₁₂, −v₂₁, v₂₂) negates f and keeps the risk.
# A few steps of gradient descent (small step) do not raise the risk.

#: One optimizer object: the jitted training loops are cached per optimizer (a static argument).
OPT = optax.sgd(1e-3)
N_NODES = 16  # training loops: few quadrature nodes, one compilation per (d, dtype)


@st.composite
def thetas(draw, d, dtype, scale=1.0):
    return lda.HeadParams(draw(arrays((d, d), -scale, scale)).astype(dtype),
                          draw(arrays((d,), -scale, scale)).astype(dtype),
                          draw(arrays((d,), -scale, scale)).astype(dtype), dtype(draw(floats(-scale, scale))))


@st.composite
def problem_and_theta(draw, dtype=None, scale=1.0, mean_scale=2.0):
    prob = draw(problems(dtype, mean_scale=mean_scale))
    th = draw(thetas(prob.dim, np.dtype(prob.dtype).type, scale))
    return prob, th


def _swap(prob, th):
    """The class swap: the problem (m₋₁, m₁, Γ, 1 − π₊) and the head θ' whose prediction is −f_θ."""
    swapped = lda.LDAProblem(prob.mean_neg, prob.mean_pos, prob.cov, 1 - prob.p_pos)
    return swapped, lda.HeadParams(th.U11, -th.u12, -th.v21, th.v22)


def _np(a):
    return np.asarray(a, np.float64)


@SETTINGS
@given(d=st.sampled_from([1, 2, 3]), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1),
       scale=floats(0.0, 3.0), prob=problems())
def test_head_params_constructors(d, dtype, seed, scale, prob):
    """zeros and normal have the advertised shapes and dtype; θ = 0 predicts 0 and has risk log 2;
    normal is reproducible and linear in ``scale``; ravel_pytree gives d² + 2d + 1 numbers."""
    zero = lda.HeadParams.zeros(d, dtype)
    th = lda.HeadParams.normal(d, key=jax.random.key(seed), scale=scale, dtype=dtype)
    th1 = lda.HeadParams.normal(d, key=jax.random.key(seed), dtype=dtype)
    for p in (zero, th):
        assert [leaf.shape for leaf in jax.tree.leaves(p)] == [(d, d), (d,), (d,), ()]
        assert all(leaf.dtype == dtype for leaf in jax.tree.leaves(p))
        assert all(np.all(np.isfinite(_np(leaf))) for leaf in jax.tree.leaves(p))
        assert ravel_pytree(p)[0].shape == (d * d + 2 * d + 1,)
    assert all(np.all(_np(leaf) == 0) for leaf in jax.tree.leaves(zero))
    for a, b in zip(jax.tree.leaves(th), jax.tree.leaves(th1)):
        np.testing.assert_allclose(_np(a), scale * _np(b), rtol=tol(dtype), atol=tol(dtype))
    built = lda.HeadParams(*(np.asarray(leaf) for leaf in jax.tree.leaves(th)))
    assert all(np.array_equal(_np(a), _np(b)) for a, b in zip(jax.tree.leaves(built), jax.tree.leaves(th)))
    z = lda.HeadParams.zeros(prob.dim, prob.dtype)
    assert np.all(_np(lda.predict(prob, z, np.zeros((2, prob.dim), prob.dtype))) == 0)
    np.testing.assert_allclose(float(lda.risk(prob, z)), np.log(2.0), rtol=10 * tol(prob.dtype))


@SETTINGS
@given(pt=problem_and_theta(), x=arrays((4, 3), -3.0, 3.0))
def test_to_attention_effective_and_predict_agree(pt, x):
    """predict = w·x + b + r σ(s₀ + s·x) (eq 6–7) = the output of to_attention's head on the (X, Y)
    token law (Prop 2.1, by apply_heads); the class swap negates f."""
    prob, th = pt
    d, t = prob.dim, tol(prob.dtype)
    x = x[:, :d].astype(prob.dtype)
    heads = lda.to_attention(th)
    assert heads.n_heads == 1 and heads.dim == d + 1 and heads.out_dim == 1 and heads.dtype == prob.dtype
    U, V = _np(heads.U[0]), _np(heads.V[0])
    assert np.all(U[:, d] == 0)  # the blocks u21, u22 do not act at (x, 0)
    np.testing.assert_array_equal(U[:d, :d], _np(th.U11).T)
    np.testing.assert_array_equal(U[d, :d], _np(th.u12))
    np.testing.assert_array_equal(V[0], np.append(_np(th.v21), _np(th.v22)))
    w, b, r, s = (_np(a) for a in lda.effective(prob, th))
    assert w.shape == s.shape == (d,) and b.shape == r.shape == ()
    assert all(np.all(np.isfinite(a)) for a in (w, b, r, s))
    m1, m0, G = _np(prob.mean_pos), _np(prob.mean_neg), _np(prob.cov)
    U11, u12, v21, v22 = (_np(a) for a in jax.tree.leaves(th))
    scale = (1 + np.abs(U11).max()) * (1 + np.abs(v21).max() + abs(v22)) * (1 + np.abs(G).max()) * \
        (1 + np.abs(m1).max() + np.abs(m0).max()) * 10
    for got, want in zip((w, b, r, s), (U11 @ G @ v21, v21 @ m0 - v22, v21 @ (m1 - m0) + 2 * v22,
                                        2 * u12 + U11 @ (m1 - m0))):
        np.testing.assert_allclose(got, want, atol=10 * t * scale)
    f = _np(lda.predict(prob, th, x))
    assert f.shape == (x.shape[0],) and np.all(np.isfinite(f))
    s0 = np.log(float(prob.p_pos) / (1 - float(prob.p_pos)))
    xs = _np(x)
    np.testing.assert_allclose(f, xs @ w + b + r / (1 + np.exp(-(s0 + xs @ s))), atol=100 * t * scale * 3)
    q = np.concatenate([x, np.zeros((x.shape[0], 1), prob.dtype)], axis=1)
    attn = _np(gmlib.apply_heads(heads, prob.prompt, q))
    assert attn.shape == (x.shape[0], 1)
    np.testing.assert_allclose(attn[:, 0], f, atol=(1e3 if prob.dtype == np.float32 else 100) * t * scale * 3)
    swapped, th2 = _swap(prob, th)
    np.testing.assert_allclose(_np(lda.predict(swapped, th2, x)), -f, atol=100 * t * scale * 3)


@SETTINGS
@given(pt=problem_and_theta(scale=0.5))
def test_risk_is_at_least_bayes_and_class_symmetric(pt):
    """risk ≥ R* (up to quadrature error), effective_risk ∘ effective = risk, and the class swap keeps it."""
    prob, th = pt
    t = tol(prob.dtype)
    R = float(lda.risk(prob, th))
    bayes = float(prob.bayes_risk())
    assert np.isfinite(R) and R >= bayes - 1e-6 - 100 * t  # the quadrature error is far below 1e-6
    eff = lda.effective(prob, th)
    np.testing.assert_allclose(float(lda.effective_risk(prob, *eff)), R, rtol=100 * t, atol=100 * t)
    swapped, th2 = _swap(prob, th)
    np.testing.assert_allclose(float(lda.risk(swapped, th2)), R, rtol=1e3 * t, atol=1e3 * t)
    w, b, r, s = eff  # the same swap in effective coordinates: (−w, −(b + r), r, −s)
    np.testing.assert_allclose(float(lda.effective_risk(swapped, -w, -(b + r), r, -s)), R, rtol=1e3 * t,
                               atol=1e3 * t)


@SETTINGS
@given(prob=problems(mean_scale=1.0), family=st.sampled_from(["theta1", "theta2"]), x=arrays((3, 3), -3.0, 3.0))
def test_bayes_head_is_bayes_optimal_on_random_problems(prob, family, x):
    """f_θ = f* at bayes_head (both families), so risk(bayes_head) = R*; Θ₁ is empty only when m₁ = −m₋₁."""
    t = tol(prob.dtype)
    x = x[:, :prob.dim].astype(prob.dtype)
    try:
        th = lda.bayes_head(prob, family)
    except ValueError as exc:
        assert family == "theta1" and "Theta1" in str(exc)
        np.testing.assert_allclose(_np(prob.mean_pos), -_np(prob.mean_neg), atol=1e-6)
        return
    assert all(np.all(np.isfinite(_np(leaf))) for leaf in jax.tree.leaves(th))
    score = _np(prob.bayes(x))
    scale = 1 + np.abs(score).max() + sum(np.abs(_np(leaf)).max() for leaf in jax.tree.leaves(th)) ** 3
    np.testing.assert_allclose(_np(lda.predict(prob, th, x)), score, atol=100 * t * scale)
    np.testing.assert_allclose(float(lda.risk(prob, th)), float(prob.bayes_risk()),
                               atol=1e-8 + 1e3 * t * scale)


@SETTINGS
@given(pt=problem_and_theta(scale=0.5), n_steps=st.sampled_from([1, 2]))
def test_gradient_descent_does_not_raise_the_risk(pt, n_steps):
    """A TrainResult of n_steps + 1 records; the first is θ₀ and its risk; small steps do not raise the risk."""
    prob, th = pt
    t = tol(prob.dtype)
    out = lda.gradient_descent(prob, th, OPT, n_steps=n_steps, n_nodes=N_NODES)
    assert isinstance(out, gmlib.TrainResult) and isinstance(out.params, lda.HeadParams)
    assert out.steps.tolist() == list(range(n_steps + 1))
    risks = _np(out.metric)
    assert risks.shape == (n_steps + 1,) and np.all(np.isfinite(risks))
    np.testing.assert_allclose(risks[0], float(lda.risk(prob, th, n_nodes=N_NODES)), rtol=10 * t, atol=10 * t)
    assert np.all(np.diff(risks) <= 100 * t * (1 + risks[0]))
    for a, first, last in zip(jax.tree.leaves(out.trajectory), jax.tree.leaves(th), jax.tree.leaves(out.params)):
        assert a.shape == (n_steps + 1,) + first.shape and np.all(np.isfinite(_np(a)))
        np.testing.assert_array_equal(_np(a[0]), _np(first))
        np.testing.assert_array_equal(_np(a[-1]), _np(last))


@SETTINGS
@given(pt=problem_and_theta(scale=0.5), seed=st.integers(0, 2**31 - 1), batch=st.sampled_from([1, 4]))
def test_sgd_is_reproducible_and_finite(pt, seed, batch):
    """Finite records of the advertised shapes; the first is θ₀'s risk; the same key gives the same run."""
    prob, th = pt
    t = tol(prob.dtype)
    key = jax.random.key(seed)
    out = lda.sgd(prob, th, OPT, key=key, n_steps=2, batch_size=batch, n_nodes=N_NODES)
    assert isinstance(out, gmlib.TrainResult) and out.steps.tolist() == [0, 1, 2]
    risks = _np(out.metric)
    assert risks.shape == (3,) and np.all(np.isfinite(risks))
    np.testing.assert_allclose(risks[0], float(lda.risk(prob, th, n_nodes=N_NODES)), rtol=10 * t, atol=10 * t)
    again = lda.sgd(prob, th, OPT, key=key, n_steps=2, batch_size=batch, n_nodes=N_NODES)
    np.testing.assert_array_equal(_np(again.metric), risks)
    assert all(np.all(np.isfinite(_np(a))) for a in jax.tree.leaves(out.params))


@SETTINGS
@given(prob=problems(), seed=st.integers(0, 2**31 - 1), n=st.sampled_from([1, 7]))
def test_problem_sample_and_bayes_params(prob, seed, n):
    """sample: shapes, finite, labels ±1, reproducible; bayes_params is (Γ⁻¹(m₁ − m₋₁), b*) with f* = w*·x + b*."""
    x, y = prob.sample(key=jax.random.key(seed), n_samples=n)
    assert x.shape == (n, prob.dim) and y.shape == (n,) and x.dtype == y.dtype == prob.dtype
    assert np.all(np.isfinite(_np(x))) and set(np.unique(_np(y))) <= {-1.0, 1.0}
    x2, y2 = prob.sample(key=jax.random.key(seed), n_samples=n)
    np.testing.assert_array_equal(_np(x), _np(x2))
    np.testing.assert_array_equal(_np(y), _np(y2))
    w, b = (_np(a) for a in prob.bayes_params())
    G = _np(prob.cov)
    t = tol(prob.dtype)
    np.testing.assert_allclose(G @ w, _np(prob.mean_pos) - _np(prob.mean_neg), atol=1e3 * t * (1 + np.abs(w).max()))
    np.testing.assert_allclose(_np(prob.bayes(x)), _np(x) @ w + b, atol=1e3 * t * (1 + np.abs(w).max()) * 10)


# ---------------------------------------------------------------------------- invalid inputs


THETA_SPEC = {"U11": Arg(fixed_axes=(0, 1)), "u12": Arg(fixed_axes=(0,)), "v21": Arg(fixed_axes=(0,)), "v22": Arg()}


def _leaves(th):
    return dict(zip(("U11", "u12", "v21", "v22"), (np.asarray(a) for a in jax.tree.leaves(th))))


# (an object that is not an LDAProblem or a HeadParams, a bad optimizer or a bad key fail in
# Python, optax or jax.random with their own errors: gmlib does not check them)


def _bad_family(_):
    return st.sampled_from(["theta3", "Theta1", "", None, 1])


INT = Arg(rank=False, finite=False, dtype=False, extra=(bad_positive_int,))
OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731


@SETTINGS
@given(pt=problem_and_theta(dtype=np.float64), data=st.data(),
       fn=st.sampled_from(["to_attention", "effective", "predict", "risk", "gradient_descent", "sgd"]))
def test_head_params_leaves_reject_invalid(pt, data, fn):
    """One leaf of θ corrupted: HeadParams (a bad dtype) or the function (shape, NaN) names the leaf."""
    prob, th = pt
    name, bad = data.draw(corrupt(_leaves(th), THETA_SPEC))
    arg = "theta0" if fn in ("gradient_descent", "sgd") else "theta"
    calls = {
        "to_attention": lambda t: lda.to_attention(t),
        "effective": lambda t: lda.effective(prob, t),
        "predict": lambda t: lda.predict(prob, t, np.zeros((1, prob.dim))),
        "risk": lambda t: lda.risk(prob, t),
        "gradient_descent": lambda t: lda.gradient_descent(prob, t, OPT, n_steps=1, n_nodes=N_NODES),
        "sgd": lambda t: lda.sgd(prob, t, OPT, key=jax.random.key(0), n_steps=1, n_nodes=N_NODES),
    }
    assert_rejects(lambda: calls[fn](lda.HeadParams(**bad)), f"{arg}.{name}", name)


@SETTINGS
@given(data=st.data())
def test_head_params_constructors_reject_invalid(data):
    def bad_dtype(_):
        return st.sampled_from([np.int32, "banana", np.complex64, bool])

    def bad_scale(_):
        return st.sampled_from([np.nan, np.inf, -np.inf, np.ones(2), "1", None])

    which = data.draw(st.sampled_from(["zeros", "normal"]))
    # (a bad size d fails in jnp.zeros / jax.random.normal with their own errors)
    if which == "zeros":
        spec = {"dtype": OBJ(bad_dtype)}
        name, bad = data.draw(corrupt(dict(d=2, dtype=None), spec))
        assert_rejects(lambda: lda.HeadParams.zeros(**bad), name)
    else:
        spec = {"scale": OBJ(bad_scale), "dtype": OBJ(bad_dtype)}
        name, bad = data.draw(corrupt(dict(key=jax.random.key(0), d=2, scale=1.0, dtype=None), spec))
        assert_rejects(lambda: lda.HeadParams.normal(**bad), name)


@SETTINGS
@given(pt=problem_and_theta(dtype=np.float64), data=st.data())
def test_effective_predict_risk_reject_invalid(pt, data):
    prob, th = pt
    fn = data.draw(st.sampled_from(["predict", "risk"]))  # (effective: only problem and theta, see above)
    args = dict(problem=prob, theta=th)
    spec = {}
    if fn == "predict":
        args["x"], spec["x"] = np.zeros((2, prob.dim)), Arg(fixed_axes=(1,))
    if fn == "risk":
        args["n_nodes"], spec["n_nodes"] = 8, INT
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: getattr(lda, fn)(**bad), name)


@SETTINGS
@given(pt=problem_and_theta(dtype=np.float64), data=st.data())
def test_effective_risk_rejects_invalid(pt, data):
    prob, th = pt
    d = prob.dim
    args = dict(problem=prob, w=np.ones(d), b=np.float64(0.5), r=np.float64(-0.5), s=np.ones(d), n_nodes=8)
    spec = {"w": Arg(fixed_axes=(0,)), "b": Arg(), "r": Arg(),
            "s": Arg(fixed_axes=(0,)), "n_nodes": INT}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: lda.effective_risk(**bad), name)


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_bayes_head_rejects_invalid(prob, data):
    spec = {"family": OBJ(_bad_family)}
    name, bad = data.draw(corrupt(dict(problem=prob, family="theta2"), spec))
    assert_rejects(lambda: lda.bayes_head(**bad), name)


@SETTINGS
@given(pt=problem_and_theta(dtype=np.float64), data=st.data(), fn=st.sampled_from(["gradient_descent", "sgd"]))
def test_training_rejects_invalid(pt, data, fn):
    prob, th = pt

    def not_a_divisor(_):  # n_steps = 4 is not a multiple of record_every = 3
        return st.just(3)

    args = dict(problem=prob, theta0=th, optimizer=OPT, n_steps=4, record_every=2, n_nodes=N_NODES,
                chunk_records=1)
    spec = {"n_steps": INT, "record_every": OBJ(bad_positive_int, not_a_divisor), "n_nodes": INT,
            "chunk_records": OBJ(lambda v: bad_positive_int(v).filter(lambda c: c is not None))}  # None: default
    if fn == "sgd":
        args.update(key=jax.random.key(0), batch_size=2)
        spec.update(batch_size=INT)
    name, bad = data.draw(corrupt(args, spec))
    also = ("n_steps",) if name == "record_every" else ("record_every",) if name == "n_steps" else ()
    assert_rejects(lambda: getattr(lda, fn)(**bad), name, *also)


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_problem_methods_reject_invalid(prob, data):
    # (sample's key: jax.random refuses a bad key itself)
    name, bad = data.draw(corrupt(dict(n_nodes=20), {"n_nodes": INT}))
    assert_rejects(lambda: prob.bayes_risk(**bad), name)
    name, bad = data.draw(corrupt(dict(n_samples=3), {"n_samples": INT}))
    assert_rejects(lambda: prob.sample(key=jax.random.key(0), **bad), name)


# ----------------------------------------------------------------------------- in context (chapter 9)


def test_task_sampler_statistics():
    """One task per prompt: means on the sphere of the radius, balanced labels, X | Y = c ~ N(m_c, I), queries (x, 0)."""
    b = lda.task_sampler(2, radius=1.5, n_queries=3)(jax.random.key(0), 400, 300)
    (means,) = b.aux
    assert b.prompt.shape == (400, 300, 3) and b.queries.shape == (400, 3, 3) and b.targets.shape == (400, 3, 1)
    np.testing.assert_allclose(np.linalg.norm(means, axis=-1), 1.5, rtol=1e-12)
    assert abs(float(np.mean(means[:, 0] @ np.array([1.0, 0.0])))) < 0.2  # directions uniform, not fixed
    y = np.asarray(b.prompt[..., 2])
    assert set(np.unique(y)) == {-1.0, 1.0}
    np.testing.assert_allclose((y > 0).mean(), 0.5, atol=0.01)
    centred = np.asarray(b.prompt[..., :2]) - np.where(y[..., None] > 0, means[:, None, 0], means[:, None, 1])
    np.testing.assert_allclose(centred.reshape(-1, 2).mean(0), 0.0, atol=0.01)
    np.testing.assert_allclose(np.cov(centred.reshape(-1, 2).T), np.eye(2), atol=0.02)
    assert np.all(np.asarray(b.queries[..., 2]) == 0)
    yq = np.asarray(b.targets[..., 0])
    cq = np.asarray(b.queries[..., :2]) - np.where(yq[..., None] > 0, means[:, None, 0], means[:, None, 1])
    np.testing.assert_allclose(np.cov(cq.reshape(-1, 2).T), np.eye(2), atol=0.15)


@pytest.mark.parametrize("bad, name", [(dict(dim=0), "dim"), (dict(radius=-1.0), "radius"),
                                       (dict(n_queries=0), "n_queries"), (dict(radius=np.nan), "radius")])
def test_task_sampler_rejects_invalid(bad, name):
    kw = dict(dim=2, radius=1.5, n_queries=2) | bad
    with pytest.raises(ValueError, match=name):
        lda.task_sampler(kw.pop("dim"), **kw)


def test_plug_in_matches_numpy_and_masks():
    """The plug-in score: class means of the tokens that count, in the Bayes formula with Γ = I, equal weights."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 2)), np.where(rng.random(30) < 0.5, 1.0, -1.0)
    q = np.concatenate([rng.normal(size=(5, 2)), np.zeros((5, 1))], axis=1)
    prompt = np.concatenate([x, y[:, None]], axis=1)
    mask = np.arange(30) < 17
    for keep in (np.ones(30, bool), mask):
        m1, m0 = x[keep & (y > 0)].mean(0), x[keep & (y < 0)].mean(0)
        want = q[:, :2] @ (m1 - m0) - 0.5 * (m1 @ m1 - m0 @ m0)
        got = lda.plug_in(jnp.asarray(prompt), jnp.asarray(q), jnp.asarray(keep))
        np.testing.assert_allclose(got[:, 0], want, rtol=1e-12)
    one_class = prompt.copy()
    one_class[:, 2] = 1.0  # no token of label -1: its mean is 0
    m1 = x.mean(0)
    np.testing.assert_allclose(lda.plug_in(one_class, q)[:, 0], q[:, :2] @ m1 - 0.5 * m1 @ m1, rtol=1e-12)


def test_task_metrics_against_numpy():
    """Risk and accuracy per prompt, computed by hand: Bayes from the means, heads by softmax over the first L tokens,
    a predictor; the plug-in tends to Bayes on long prompts."""
    tests = lda.task_sampler(2, radius=1.5, n_queries=4)(jax.random.key(3), 64, 400)
    x, y = np.asarray(tests.queries[..., :2]), np.asarray(tests.targets[..., 0])
    (means,) = tests.aux

    def by_hand(scores):
        return np.log1p(np.exp(-y * scores)).mean(-1), (y * scores > 0).mean(-1)

    w = means[:, 0] - means[:, 1]  # equal norms: no intercept
    risk, acc = lda.task_metrics("bayes", tests, lengths=[10, 400])
    want = by_hand(np.einsum("bqd,bd->bq", x, w))
    for got, ref in zip((risk, acc), want):
        np.testing.assert_allclose(got, np.broadcast_to(ref, (2, 64)), rtol=1e-10)
    U = jnp.zeros((1, 3, 3)).at[0, :2, :2].set(0.7 * jnp.eye(2))
    V = jnp.zeros((1, 1, 3)).at[0, 0, 2].set(3.0)
    heads = gmlib.Heads(U, V)
    L = 25
    tok = np.asarray(tests.prompt[:, :L])
    a = np.exp(0.7 * np.einsum("bqd,bld->bql", x, tok[..., :2]))
    scores = 3.0 * (a * tok[:, None, :, 2]).sum(-1) / a.sum(-1)
    risk, acc = lda.task_metrics(heads, tests, lengths=[L])
    np.testing.assert_allclose(risk[0], by_hand(scores)[0], rtol=1e-10)
    np.testing.assert_allclose(acc[0], by_hand(scores)[1], rtol=1e-12)
    pred = jax.tree_util.Partial(lambda p, q, m: gmlib.apply_heads(heads, p, q, mask=m))
    np.testing.assert_allclose(lda.task_metrics(pred, tests, lengths=[L])[0], risk, rtol=1e-12)
    bayes = float(lda.task_metrics("bayes", tests, lengths=[1])[0].mean())
    plug = np.asarray(lda.task_metrics(lda.plug_in, tests, lengths=[8, 400])[0].mean(-1))
    assert plug[0] > plug[1] and abs(plug[1] / bayes - 1) < 0.02
    with pytest.raises(ValueError, match="`f`"):
        lda.task_metrics("plug-in", tests, lengths=[8])


def test_train_in_context_lowers_the_risk_and_trains_each_model_as_alone():
    """Side by side each model ends where it ends alone; a trained linear head beats its start on fresh prompts."""
    kw = dict(optimizer=optax.adam(2e-2), lengths=[16], seeds=[[0, 1]], init_seeds=[3, 4], n_steps=300,
              batch_size=16, n_queries=4)
    both = lda.train_in_context({"lin": ("linear", "random"), "soft": ("softmax", "random")}, 2, **kw)
    alone = lda.train_in_context({"lin": ("linear", "random")}, 2, **kw)
    np.testing.assert_allclose(both.params["lin"].U, alone.params["lin"].U, rtol=1e-5, atol=1e-6)
    assert both.params["lin"].V.shape == (1, 2, 1, 1, 3)  # (lengths, seeds, H, value_dim, d + 1)
    tests = lda.task_sampler(2, n_queries=8)(jax.random.key(9), 256, 16)
    start = gmlib.init_heads(key=jax.random.key(3), n_heads=1, dim=3, value_dim=1, scale=0.5)
    trained = jax.tree.map(lambda a: a[0, 0].astype(jnp.float64), both.params["lin"])
    r0 = float(lda.task_metrics(start, tests, lengths=[16], kind="linear")[0].mean())
    r1 = float(lda.task_metrics(trained, tests, lengths=[16], kind="linear")[0].mean())
    assert r1 < r0 - 0.05 and r1 < np.log(2)
