"""gmlib.denoise.iterated: the orbit of a map against a Python loop, the tanh fixed point against long
iterations and its equation, the separation against its formula and the Bayes step on the line of the means
(Prop 4.3); then properties of random valid inputs and invalid inputs (ValueError naming the argument).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from strategies import (
    SETTINGS,
    Arg,
    arrays,
    as_f64,
    assert_rejects,
    bad_positive_int,
    corrupt,
    denoising_problems,
    equal_norm_problems,
    floats,
    negative,
    query_scale,
    tol,
)

from gmlib import denoise as dn


def test_degenerate_gamma_zero_is_posterior_barycenter():
    means = np.array([[0.0, 3.0], [0.0, -3.0]])
    prob = dn.DenoisingProblem([0.5, 0.5], means, 0.0, 2.0)
    z = np.random.default_rng(2).normal(size=(20, 2)) * 3
    c, delta = means.mean(0), (means[0] - means[1]) / 2
    expected = c + delta * np.tanh((z - c) @ delta / 4.0)[:, None]  # Prop 4.3's closed form
    np.testing.assert_allclose(prob.bayes(z), expected, atol=1e-13)
    assert float(dn.separation(prob)) == pytest.approx(1.5)


def test_iterate_and_fixed_point():
    traj = dn.iterate(lambda u: jnp.tanh(2.0 * u), jnp.array([0.3, -0.8]), n_steps=5)
    manual = [np.array([0.3, -0.8])]
    for _ in range(5):
        manual.append(np.tanh(2.0 * manual[-1]))
    np.testing.assert_allclose(traj, np.stack(manual), atol=1e-15)
    lams = np.array([0.5, 1.0, 1.05, 1.2, 1.5, 2.0, 3.0, 6.0])
    u = dn.tanh_fixed_point(lams)
    long = np.asarray(dn.iterate(lambda v: jnp.tanh(jnp.asarray(lams) ** 2 * v), jnp.ones(len(lams)),
                                 n_steps=20_000)[-1])
    np.testing.assert_allclose(u[lams != 1.0], long[lams != 1.0], atol=1e-12)
    assert u[0] == 0.0 and u[1] == 0.0 and np.all(u[2:] > 0) and np.all(u < 1 + 1e-15)
    np.testing.assert_allclose(np.tanh(lams**2 * u), u, atol=1e-15)


# ============================================================================ properties of random valid inputs


# iterate traces f on every call: under one jit per n_steps it compiles once per shape (validation: the
# eager calls of test_iterate_rejects_invalid)
_ITERATE_BAYES = {n: jax.jit(lambda p, z, n=n: dn.iterate(p.bayes, z, n_steps=n)) for n in (1, 3)}
_ITERATE_TANH = {n: jax.jit(lambda lam, u0, n=n: dn.iterate(lambda v: jnp.tanh(lam**2 * v), u0, n_steps=n))
                 for n in (1, 3)}


@SETTINGS
@given(prob=denoising_problems(), z=arrays((3, 3), -4.0, 4.0), n_steps=st.sampled_from([1, 3]),
       lam=floats(0.0, 3.0), u0=floats(-1.0, 1.0))
def test_iterate_applies_f(prob, z, n_steps, lam, u0):
    """The orbit starts at z₀ and each step is f of the previous one (for the Bayes denoiser and the tanh map)."""
    z = z[:, :prob.dim].astype(prob.dtype)
    t = tol(prob.dtype)
    traj = as_f64(_ITERATE_BAYES[n_steps](prob, z))
    assert traj.shape == (n_steps + 1,) + z.shape and np.all(np.isfinite(traj))
    np.testing.assert_array_equal(traj[0], as_f64(z))
    for k in range(n_steps):
        np.testing.assert_allclose(traj[k + 1], as_f64(prob.bayes(traj[k].astype(prob.dtype))),
                                   atol=10 * t * query_scale(prob, z))
    u = as_f64(_ITERATE_TANH[n_steps](np.float64(lam), np.float64(u0)))
    assert u.shape == (n_steps + 1,)
    np.testing.assert_allclose(u[1:], np.tanh(lam**2 * u[:-1]), rtol=1e-12, atol=1e-300)


@SETTINGS
@given(prob=equal_norm_problems(dtype=np.float64, gamma=0.0), u=arrays((4,), -2.0, 2.0))
def test_separation_and_the_tanh_map(prob, u):
    """λ = ‖m₁ − m₂‖/(2ξ); with γ = 0 and π = (1/2, 1/2) one Bayes step maps c + uδ to c + tanh(λ²u)δ (Prop 4.3)."""
    prob = dn.DenoisingProblem([0.5, 0.5], prob.means, 0.0, prob.xi)
    m = as_f64(prob.means)
    lam = float(dn.separation(prob))
    assert np.isfinite(lam) and lam >= 0
    np.testing.assert_allclose(lam, np.linalg.norm(m[0] - m[1]) / (2 * float(prob.xi)), rtol=1e-12)
    c, delta = 0.5 * (m[0] + m[1]), 0.5 * (m[0] - m[1])
    out = as_f64(prob.bayes(c + u[:, None] * delta))
    np.testing.assert_allclose(out, c + np.tanh(lam**2 * u)[:, None] * delta, atol=1e-9 * (1 + np.abs(m).max()))


@SETTINGS
@given(lam=st.one_of(floats(0.0, 1.0), floats(1.0, 1.1), floats(1.0, 20.0)).map(np.float64)
       | hnp.arrays(np.float64, st.sampled_from([(3,), (2, 2)]), elements=floats(0.0, 5.0)))
def test_tanh_fixed_point(lam):
    """u = tanh(λ²u), u ∈ [0, 1]; u = 0 exactly for λ ≤ 1 and u > 0 for λ > 1; the shape of λ."""
    u = dn.tanh_fixed_point(lam)
    lam = np.asarray(lam)
    assert isinstance(u, np.ndarray) and u.shape == lam.shape and u.dtype == np.float64
    assert np.all((u >= 0) & (u <= 1))
    assert np.all(u[lam <= 1] == 0) and np.all(u[(lam > 1) & (lam**2 - 1 > 1e-12)] > 0)
    np.testing.assert_allclose(u, np.tanh(lam**2 * u), atol=1e-13)


# ============================================================================ invalid inputs


OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731


@SETTINGS
@given(data=st.data(), shape=st.sampled_from([(2, 2), (3,)]))
def test_iterate_rejects_invalid(data, shape):
    # (an f that changes the shape or dtype is refused by lax.scan: not checked again)
    spec = {"z0": Arg(rank=False, dtype=True), "n_steps": OBJ(bad_positive_int)}
    name, bad = data.draw(corrupt(dict(f=jnp.tanh, z0=np.full(shape, 0.5), n_steps=3), spec))
    assert_rejects(lambda: dn.iterate(**bad), name)


@SETTINGS
@given(data=st.data(), lam=st.sampled_from([np.float64(1.5), np.array([0.5, 2.0])]))
def test_tanh_fixed_point_rejects_invalid(data, lam):
    # (a float128 lam is merely rounded to float64: a host function, not refused; a ragged list
    # is refused by numpy's own ValueError, "inhomogeneous shape")
    def not_real(_):
        return st.sampled_from(["2", None, [1.0, "a"], 1j, np.array([1.0 + 1j]), np.array(["1.5"])])

    spec = {"lam": Arg(rank=False, dtype=False, extra=(negative, not_real))}
    name, bad = data.draw(corrupt(dict(lam=lam), spec))
    assert_rejects(lambda: dn.tanh_fixed_point(**bad), name)


@pytest.mark.parametrize("xi", [2.0, 3.5, 4.0])
def test_cluster_limits_are_the_limits_of_long_orbits(xi):
    """Prop 4.3's limits c ± u_lambda delta (or c) against 400 iterations of the Bayes denoiser, off-centre means."""
    means = np.array([[1.0, 3.5], [-0.5, -2.0]])
    prob = dn.DenoisingProblem([0.5, 0.5], means, 0.0, xi)
    starts = np.random.default_rng(4).normal(size=(30, 2)) * 4
    c, delta = means.mean(0), (means[0] - means[1]) / 2
    starts[0] = c + np.array([delta[1], -delta[0]])  # on the boundary hyperplane: goes to c
    long = np.asarray(dn.iterate(prob.bayes, starts, n_steps=400)[-1])
    limits = dn.cluster_limits(prob, starts)
    np.testing.assert_allclose(limits, long, atol=1e-9)
    np.testing.assert_allclose(limits[0], c, atol=1e-12)
    lam = np.linalg.norm(means[0] - means[1]) / (2 * xi)
    assert (lam > 1) == (np.abs(limits - c).max() > 0.1)  # two clusters above lambda = 1, the midpoint below


def test_cluster_limits_rejects_invalid():
    means = [[0.0, 3.0], [0.0, -3.0]]
    for prob in (dn.DenoisingProblem([0.4, 0.6], means, 0.0, 2.0), dn.DenoisingProblem([0.5, 0.5], means, 0.5, 2.0),
                 dn.DenoisingProblem([0.2, 0.3, 0.5], [*means, [1.0, 0.0]], 0.0, 2.0)):
        with pytest.raises(ValueError, match="`problem`"):
            dn.cluster_limits(prob, np.ones((3, 2)))
    with pytest.raises(ValueError, match="`starts`"):
        dn.cluster_limits(dn.DenoisingProblem([0.5, 0.5], means, 0.0, 2.0), np.ones((3, 3)))
