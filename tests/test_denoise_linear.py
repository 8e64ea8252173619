"""gmlib.denoise.linear: the best linear and affine denoisers against least squares on samples and numpy
formulas, their risks against Monte Carlo, their gaps against the quadrature excess risk of the maps; then
properties of random valid inputs (A* = M2 (M2 + xi^2 I)^-1 symmetric with eigenvalues in [0, 1), the gaps
between 0 and their bounds) and invalid inputs (ValueError naming the argument).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    SETTINGS,
    Arg,
    as_f64,
    assert_rejects,
    bad_positive_int,
    corrupt,
    denoising_problems,
    numpy_affine_optimum,
    tol,
)

from gmlib import denoise as dn


def test_linear_optimum_is_least_squares():
    rng = np.random.default_rng(8)
    weights = np.array([0.25, 0.75])
    means = rng.normal(size=(2, 3)) * 2
    prob = dn.DenoisingProblem(weights, means, 0.7, 1.2)
    x, _ = prob.clean.sample(key=jax.random.key(2), n_samples=400_000)
    z = np.asarray(x) + 1.2 * np.asarray(jax.random.normal(jax.random.key(3), x.shape))
    coef, *_ = np.linalg.lstsq(z, np.asarray(x), rcond=None)  # x ≈ z @ coef, so A = coef.T
    np.testing.assert_allclose(dn.linear_optimum(prob), coef.T, atol=0.01)
    # closed form of the gap against the quadrature excess risk of z -> A* z, and against Monte Carlo
    A = dn.linear_optimum(prob)
    gap = float(dn.linear_gap(prob))
    quad = prob.excess_risk(lambda q: q @ A.T)
    assert abs(gap - float(quad)) < 1e-9
    loss = np.sum((np.asarray(x) - z @ np.asarray(A).T) ** 2, -1) - np.sum((np.asarray(x) - np.asarray(prob.bayes(z))) ** 2, -1)
    assert abs(loss.mean() - gap) < 5 * loss.std() / np.sqrt(loss.size)
    assert gap > 0
    # the risk: xi^2 tr(M2 (M2 + xi^2 I)^-1) written in numpy, and the sample risk of z -> A* z
    M2 = 0.49 * np.eye(3) + (weights[:, None] * means).T @ means
    risk = float(dn.linear_risk(prob))
    assert risk == pytest.approx(1.44 * np.trace(M2 @ np.linalg.inv(M2 + 1.44 * np.eye(3))), rel=1e-12)
    sq = np.sum((np.asarray(x) - z @ np.asarray(A).T) ** 2, -1)
    assert abs(sq.mean() - risk) < 5 * sq.std() / np.sqrt(sq.size)
    assert risk - float(prob.bayes_risk()) == pytest.approx(gap, abs=1e-14)


@pytest.mark.parametrize("m, d", [(2, 2), (3, 3)])
def test_affine_optimum_is_least_squares_with_an_intercept(m, d):
    rng = np.random.default_rng(20 + m)
    weights = rng.dirichlet(np.ones(m))
    means = rng.normal(size=(m, d)) * 2 + 1.0  # unequal norms, E X far from 0
    prob = dn.DenoisingProblem(weights, means, 0.7, 1.2)
    A, b = dn.affine_optimum(prob)
    assert A.shape == (d, d) and b.shape == (d,)
    A_np, b_np = numpy_affine_optimum(weights, means, 0.7, 1.2)
    np.testing.assert_allclose(A, A_np, atol=1e-12)
    np.testing.assert_allclose(b, b_np, atol=1e-12)
    x, z = prob.sample(key=jax.random.key(m), n_samples=400_000)
    x, z = np.asarray(x), np.asarray(z)
    design = np.concatenate([z, np.ones((len(z), 1))], axis=1)
    coef, *_ = np.linalg.lstsq(design, x, rcond=None)  # x ≈ z @ A.T + b
    np.testing.assert_allclose(A, coef[:d].T, atol=0.01)
    np.testing.assert_allclose(b, coef[d], atol=0.02)
    # the gap: closed form against the quadrature excess risk of z -> Az + b and the sample risk difference
    gap = float(dn.affine_gap(prob, n_nodes=4001 if m == 2 else 200))  # fine rules: the M = 3 gates are steep
    assert abs(gap - float(prob.excess_risk(lambda q: q @ A.T + b, n_nodes=80 if d == 2 else 90))) < 1e-8
    loss = np.sum((x - z @ np.asarray(A).T - np.asarray(b)) ** 2, -1) - np.sum((x - np.asarray(prob.bayes(z))) ** 2, -1)
    assert abs(loss.mean() - gap) < 5 * loss.std() / np.sqrt(loss.size)
    # the risk xi^2 tr A against the sample risk of z -> Az + b
    risk = float(dn.affine_risk(prob))
    assert risk == pytest.approx(1.44 * np.trace(A_np), rel=1e-12)
    sq = np.sum((x - z @ np.asarray(A).T - np.asarray(b)) ** 2, -1)
    assert abs(sq.mean() - risk) < 5 * sq.std() / np.sqrt(sq.size)
    # the intercept helps: the affine gap is below the linear one, by xi^2 (tr A_lin - tr A_aff) > 0
    lin = float(dn.linear_gap(prob, n_nodes=4001 if m == 2 else 200))
    assert 0 < gap < lin
    np.testing.assert_allclose(lin - gap, 1.44 * (np.trace(dn.linear_optimum(prob)) - np.trace(A_np)), rtol=1e-9)


def test_affine_gap_in_the_figure_2_setting_and_special_cases():
    prob = dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], 1.0, 2.0)
    # the values the issue quotes (0.126 against 1.642), now from the independent numpy optimum
    A, b = numpy_affine_optimum(np.array([0.5, 0.5]), np.array([[3.0, 0.0], [0.0, 3.0]]), 1.0, 2.0)
    assert float(dn.affine_gap(prob)) == pytest.approx(float(prob.excess_risk(lambda q: q @ A.T + b)), abs=1e-9)
    assert float(dn.affine_gap(prob)) == pytest.approx(0.126, abs=5e-4)
    assert float(dn.linear_gap(prob)) == pytest.approx(1.642, abs=5e-4)
    # one component: the Bayes denoiser is affine, (gamma^2/s) z + (xi^2/s) m, and the gap vanishes
    one = dn.DenoisingProblem([1.0], [[2.0, -1.0]], 0.8, 1.5)
    A1, b1 = dn.affine_optimum(one)
    s = 0.8**2 + 1.5**2
    np.testing.assert_allclose(A1, 0.8**2 / s * np.eye(2), atol=1e-14)
    np.testing.assert_allclose(b1, 1.5**2 / s * np.array([2.0, -1.0]), atol=1e-14)
    assert abs(float(dn.affine_gap(one))) < 1e-12
    # E X = 0 (opposite means, balanced): the intercept is 0 and the two gaps coincide
    sym = dn.DenoisingProblem([0.5, 0.5], [[2.0, 1.0], [-2.0, -1.0]], 1.0, 1.0)
    A2, b2 = dn.affine_optimum(sym)
    np.testing.assert_allclose(b2, 0.0, atol=1e-14)
    np.testing.assert_allclose(A2, dn.linear_optimum(sym), atol=1e-14)
    assert float(dn.affine_gap(sym)) == pytest.approx(float(dn.linear_gap(sym)), abs=1e-14)
    # float32 follows the problem's dtype
    p32 = dn.DenoisingProblem(np.float32([0.5, 0.5]), np.float32([[3.0, 0.0], [0.0, 3.0]]), np.float32(1.0),
                              np.float32(2.0))
    A32, b32 = dn.affine_optimum(p32)
    assert A32.dtype == b32.dtype == jnp.float32
    np.testing.assert_allclose(A32, A, atol=1e-5)


def test_gaps_with_a_full_covariance_match_the_quadrature_excess_risk():
    cov = np.array([[1.0, 0.6], [0.6, 0.5]])
    prob = dn.DenoisingProblem([0.3, 0.7], [[3.0, 0.0], [-1.0, 2.0]], xi=1.5, cov=cov)
    A, b = dn.affine_optimum(prob)
    mean = np.array([0.3, 0.7]) @ np.array([[3.0, 0.0], [-1.0, 2.0]])
    spread = np.cov(np.array([[3.0, 0.0], [-1.0, 2.0]]).T, aweights=[0.3, 0.7], bias=True)
    cov_x = cov + spread  # Cov X = Gamma + the spread of the means
    A_full = np.linalg.solve(cov_x + 2.25 * np.eye(2), cov_x).T
    np.testing.assert_allclose(A, A_full, atol=1e-12)
    np.testing.assert_allclose(b, mean - A_full @ mean, atol=1e-12)
    for gap, f in ((dn.affine_gap(prob), lambda q: q @ A.T + b),
                   (dn.linear_gap(prob), lambda q: q @ dn.linear_optimum(prob).T)):
        assert abs(float(gap) - float(prob.excess_risk(f, n_nodes=120))) < 1e-9


# ============================================================================ properties of random valid inputs


@SETTINGS
@given(prob=denoising_problems())
def test_linear_optimum_and_gap(prob):
    """A* = M₂(M₂ + ξ²I)⁻¹: symmetric, eigenvalues in [0, 1); linear_gap = ξ² tr A* − R* ≥ 0;
    the Bayes risk lies between its within-component part d γ²ξ²/s and min(d ξ², tr Cov X)."""
    t = tol(prob.dtype)
    A = as_f64(dn.linear_optimum(prob))
    w, m, g, x = as_f64(prob.weights), as_f64(prob.means), float(prob.gamma), float(prob.xi)
    d = prob.dim
    M2 = (w[:, None] * m).T @ m + g**2 * np.eye(d)
    assert A.shape == (d, d) and np.all(np.isfinite(A))
    sc = 1 + np.abs(M2).max() / x**2
    np.testing.assert_allclose(A, A.T, atol=10 * t * sc)
    np.testing.assert_allclose(A, M2 @ np.linalg.inv(M2 + x**2 * np.eye(d)), atol=100 * t * sc)
    eig = np.linalg.eigvalsh(0.5 * (A + A.T))
    assert eig.min() >= -10 * t * sc and eig.max() < 1 + 10 * t * sc
    bayes = float(prob.bayes_risk())
    gap = float(dn.linear_gap(prob))
    s = g**2 + x**2
    cov_x = M2 - np.outer(w @ m, w @ m)
    assert np.isfinite(bayes) and np.isfinite(gap)
    slack = 1e-6 * (1 + d * x**2)  # quadrature error of the Bayes risk (sharp gates: M = 3 uses Gauss–Hermite)
    assert d * g**2 * x**2 / s - slack - 100 * t <= bayes <= min(d * x**2, np.trace(cov_x)) + slack + 100 * t
    assert gap >= -slack - 1e3 * t * sc
    np.testing.assert_allclose(gap, x**2 * np.trace(A) - bayes, atol=1e3 * t * sc * (1 + d * x**2))
    np.testing.assert_allclose(float(dn.linear_risk(prob)), x**2 * np.trace(A), atol=100 * t * sc * (1 + d * x**2))
    # the affine optimum: the same shrinkage of Cov X, the intercept (I - A) E X, a gap between 0 and the linear one
    Aa, b = (as_f64(v) for v in dn.affine_optimum(prob))
    mean = w @ m
    np.testing.assert_allclose(Aa, (M2 - np.outer(mean, mean)) @ np.linalg.inv(M2 - np.outer(mean, mean) + x**2 * np.eye(d)),
                               atol=100 * t * sc)
    np.testing.assert_allclose(b, mean - Aa @ mean, atol=100 * t * sc * (1 + np.abs(mean).max()))
    np.testing.assert_allclose(float(dn.affine_risk(prob)), x**2 * np.trace(Aa), atol=100 * t * sc * (1 + d * x**2))
    affine = float(dn.affine_gap(prob))
    assert -slack - 1e3 * t * sc <= affine <= gap + slack + 1e3 * t * sc


# ============================================================================ invalid inputs


OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731


@SETTINGS
@given(prob=denoising_problems(dtype=np.float64), data=st.data())
def test_linear_optimum_and_gap_reject_invalid(prob, data):
    fn = data.draw(st.sampled_from(["linear_gap", "affine_gap"]))  # the optima take only `problem`
    args = dict(problem=prob, n_nodes=20)
    spec = {"n_nodes": OBJ(lambda v: bad_positive_int(v).filter(lambda c: c is not None))}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: getattr(dn, fn)(**bad), name)
