"""Property-based tests of gmlib.lda's problem (helpers from test_properties.py).

Valid random problems: the Bayes score and risk are finite, 0 <= R* <= H(π₊) (at most
the risk of the prior alone), swapping the two classes (m₁ ↔ m₋₁, π₊ ↔ 1 − π₊) negates the
Bayes score and keeps the Bayes risk, and the token law is a valid two-component mixture.
Invalid inputs: ValueError naming the argument.
"""

import jax
import numpy as np
import optax
from hypothesis import given
from hypothesis import strategies as st
from jax.flatten_util import ravel_pytree
from test_properties import DTYPES, SETTINGS, Arg, _asymmetric, _bad_key, _bad_positive_int, _indefinite, arrays, \
    assert_rejects, corrupt, floats, tol

from gmlib import lda, population_attention


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
def test_bayes_score_and_risk_are_symmetric_in_the_classes(prob, x):
    x = x[:, :prob.dim].astype(prob.dtype)
    t = tol(prob.dtype)
    score = np.asarray(prob.bayes_score(x), np.float64)
    risk = float(prob.bayes_risk())
    p = float(prob.p_pos)
    prior_risk = -(p * np.log(p) + (1 - p) * np.log(1 - p))  # the best score that ignores x
    assert np.all(np.isfinite(score)) and np.isfinite(risk)
    assert -10 * t <= risk <= prior_risk + 100 * t
    swapped = lda.LDAProblem(prob.mean_neg, prob.mean_pos, prob.cov, 1 - prob.p_pos)
    scale = 1 + np.abs(score).max()
    np.testing.assert_allclose(np.asarray(swapped.bayes_score(x), np.float64), -score, atol=1e3 * t * scale)
    np.testing.assert_allclose(float(swapped.bayes_risk()), risk, atol=1e3 * t)
    mix = prob.tokens()
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
            "cov": Arg(fixed_axes=(0, 1), extra=(_asymmetric, _indefinite, rank_deficient)),
            "p_pos": Arg(extra=(_outside_unit_interval,))}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: lda.LDAProblem(**bad), name)


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_bayes_score_rejects_invalid_points(prob, data):
    name, bad = data.draw(corrupt(dict(x=np.zeros((2, prob.dim))), {"x": Arg(fixed_axes=(1,))}))
    assert_rejects(lambda: prob.bayes_score(bad["x"]), name)


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
    th = lda.HeadParams.normal(jax.random.key(seed), d, scale, dtype)
    th1 = lda.HeadParams.normal(jax.random.key(seed), d, 1.0, dtype)
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
    """predict = w·x + b + r σ(s₀ + s·x) (eq 6–7) = the last coordinate of population attention with
    to_attention's (U, V) on the (X, Y) token law (Prop 2.1); the class swap negates f."""
    prob, th = pt
    d, t = prob.dim, tol(prob.dtype)
    x = x[:, :d].astype(prob.dtype)
    U, V = lda.to_attention(th)
    assert U.shape == V.shape == (d + 1, d + 1)
    assert np.all(_np(U)[:, d] == 0) and np.all(_np(V)[:d] == 0)  # the blocks that do not act at (x, 0)
    np.testing.assert_array_equal(_np(U)[:d, :d], _np(th.U11).T)
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
    attn = _np(population_attention(prob.tokens(), q, U, V))
    np.testing.assert_allclose(attn[:, -1], f, atol=(1e3 if prob.dtype == np.float32 else 100) * t * scale * 3)
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
    assert np.isfinite(R) and R >= bayes - 1e-6 - 100 * t  # 64 nodes: quadrature error ~1e-10 here
    eff = lda.effective(prob, th)
    np.testing.assert_allclose(float(lda.effective_risk(prob, *eff)), R, rtol=100 * t, atol=100 * t)
    swapped, th2 = _swap(prob, th)
    np.testing.assert_allclose(float(lda.risk(swapped, th2)), R, rtol=1e3 * t, atol=1e3 * t)
    w, b, r, s = eff  # the same swap in effective coordinates: (−w, −(b + r), r, −s)
    np.testing.assert_allclose(float(lda.effective_risk(swapped, -w, -(b + r), r, -s)), R, rtol=1e3 * t,
                               atol=1e3 * t)


@SETTINGS
@given(prob=problems(mean_scale=1.0), family=st.sampled_from(["theta1", "theta2"]), x=arrays((3, 3), -3.0, 3.0))
def test_bayes_head_is_bayes_optimal(prob, family, x):
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
    score = _np(prob.bayes_score(x))
    scale = 1 + np.abs(score).max() + sum(np.abs(_np(leaf)).max() for leaf in jax.tree.leaves(th)) ** 3
    np.testing.assert_allclose(_np(lda.predict(prob, th, x)), score, atol=100 * t * scale)
    w_star, _ = prob.bayes_params()
    delta = float(np.sqrt(_np(w_star) @ _np(prob.cov) @ _np(w_star)))
    n = 64 if delta < 2.5 else 200  # risk's accuracy at 64 nodes holds for projections of sd <= 2.5
    np.testing.assert_allclose(float(lda.risk(prob, th, n_nodes=n)), float(prob.bayes_risk()),
                               atol=1e-8 + 1e3 * t * scale)


@SETTINGS
@given(pt=problem_and_theta(scale=0.5), n_steps=st.sampled_from([1, 2]))
def test_gradient_descent_does_not_raise_the_risk(pt, n_steps):
    """A TrainResult of n_steps + 1 records; the first is θ₀ and its risk; small steps do not raise the risk."""
    prob, th = pt
    t = tol(prob.dtype)
    out = lda.gradient_descent(prob, th, OPT, n_steps, n_nodes=N_NODES)
    assert isinstance(out, lda.TrainResult) and isinstance(out.params, lda.HeadParams)
    assert out.steps.tolist() == list(range(n_steps + 1))
    risks = _np(out.risks)
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
    out = lda.sgd(prob, th, key, OPT, 2, batch_size=batch, n_nodes=N_NODES)
    assert isinstance(out, lda.TrainResult) and out.steps.tolist() == [0, 1, 2]
    risks = _np(out.risks)
    assert risks.shape == (3,) and np.all(np.isfinite(risks))
    np.testing.assert_allclose(risks[0], float(lda.risk(prob, th, n_nodes=N_NODES)), rtol=10 * t, atol=10 * t)
    again = lda.sgd(prob, th, key, OPT, 2, batch_size=batch, n_nodes=N_NODES)
    np.testing.assert_array_equal(_np(again.risks), risks)
    assert all(np.all(np.isfinite(_np(a))) for a in jax.tree.leaves(out.params))


@SETTINGS
@given(prob=problems(), seed=st.integers(0, 2**31 - 1), n=st.sampled_from([1, 7]))
def test_problem_sample_and_bayes_params(prob, seed, n):
    """sample: shapes, finite, labels ±1, reproducible; bayes_params is (Γ⁻¹(m₁ − m₋₁), b*) with f* = w*·x + b*."""
    x, y = prob.sample(jax.random.key(seed), n)
    assert x.shape == (n, prob.dim) and y.shape == (n,) and x.dtype == y.dtype == prob.dtype
    assert np.all(np.isfinite(_np(x))) and set(np.unique(_np(y))) <= {-1.0, 1.0}
    x2, y2 = prob.sample(jax.random.key(seed), n)
    np.testing.assert_array_equal(_np(x), _np(x2))
    np.testing.assert_array_equal(_np(y), _np(y2))
    w, b = (_np(a) for a in prob.bayes_params())
    G = _np(prob.cov)
    t = tol(prob.dtype)
    np.testing.assert_allclose(G @ w, _np(prob.mean_pos) - _np(prob.mean_neg), atol=1e3 * t * (1 + np.abs(w).max()))
    np.testing.assert_allclose(_np(prob.bayes_score(x)), _np(x) @ w + b, atol=1e3 * t * (1 + np.abs(w).max()) * 10)


# ---------------------------------------------------------------------------- invalid inputs


THETA_SPEC = {"U11": Arg(fixed_axes=(0, 1)), "u12": Arg(fixed_axes=(0,)), "v21": Arg(fixed_axes=(0,)), "v22": Arg()}


def _leaves(th):
    return dict(zip(("U11", "u12", "v21", "v22"), (np.asarray(a) for a in jax.tree.leaves(th))))


def _not_a_head(th):
    return st.sampled_from([tuple(jax.tree.leaves(th)), None, "theta", {"U11": th.U11}, np.zeros(3)])


def _not_a_problem(prob):
    return st.sampled_from([(prob.mean_pos, prob.mean_neg, prob.cov, prob.p_pos), None, "C1", prob.tokens()])


def _bad_optimizer(_):
    return st.sampled_from([0.1, "sgd", None, optax.sgd, lambda g: g])


def _bad_family(_):
    return st.sampled_from(["theta3", "Theta1", "", None, 1])


INT = Arg(rank=False, finite=False, dtype=False, extra=(_bad_positive_int,))
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
        "gradient_descent": lambda t: lda.gradient_descent(prob, t, OPT, 1, n_nodes=N_NODES),
        "sgd": lambda t: lda.sgd(prob, t, jax.random.key(0), OPT, 1, n_nodes=N_NODES),
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
    if which == "zeros":
        spec = {"d": INT, "dtype": OBJ(bad_dtype)}
        name, bad = data.draw(corrupt(dict(d=2, dtype=None), spec))
        assert_rejects(lambda: lda.HeadParams.zeros(**bad), name)
    else:
        spec = {"key": OBJ(_bad_key), "d": INT, "scale": OBJ(bad_scale), "dtype": OBJ(bad_dtype)}
        name, bad = data.draw(corrupt(dict(key=jax.random.key(0), d=2, scale=1.0, dtype=None), spec))
        assert_rejects(lambda: lda.HeadParams.normal(**bad), name)


@SETTINGS
@given(pt=problem_and_theta(dtype=np.float64), data=st.data())
def test_to_attention_rejects_invalid(pt, data):
    _, th = pt
    name, bad = data.draw(corrupt(dict(theta=th), {"theta": OBJ(_not_a_head)}))
    assert_rejects(lambda: lda.to_attention(**bad), name)


@SETTINGS
@given(pt=problem_and_theta(dtype=np.float64), data=st.data())
def test_effective_predict_risk_reject_invalid(pt, data):
    prob, th = pt
    fn = data.draw(st.sampled_from(["effective", "predict", "risk"]))
    args = dict(problem=prob, theta=th)
    spec = {"problem": OBJ(_not_a_problem), "theta": OBJ(_not_a_head)}
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
    spec = {"problem": OBJ(_not_a_problem), "w": Arg(fixed_axes=(0,)), "b": Arg(), "r": Arg(),
            "s": Arg(fixed_axes=(0,)), "n_nodes": INT}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: lda.effective_risk(**bad), name)


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_bayes_head_rejects_invalid(prob, data):
    spec = {"problem": OBJ(_not_a_problem), "family": OBJ(_bad_family)}
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
    spec = {"problem": OBJ(_not_a_problem), "theta0": OBJ(_not_a_head), "optimizer": OBJ(_bad_optimizer),
            "n_steps": INT, "record_every": OBJ(_bad_positive_int, not_a_divisor), "n_nodes": INT,
            "chunk_records": OBJ(lambda v: _bad_positive_int(v).filter(lambda c: c is not None))}  # None: default
    if fn == "sgd":
        args.update(key=jax.random.key(0), batch_size=2)
        spec.update(key=OBJ(_bad_key), batch_size=INT)
    name, bad = data.draw(corrupt(args, spec))
    also = ("n_steps",) if name == "record_every" else ("record_every",) if name == "n_steps" else ()
    assert_rejects(lambda: getattr(lda, fn)(**bad), name, *also)


@SETTINGS
@given(prob=problems(dtype=np.float64), data=st.data())
def test_problem_methods_reject_invalid(prob, data):
    method = data.draw(st.sampled_from(["bayes_risk", "sample"]))
    if method == "bayes_risk":
        name, bad = data.draw(corrupt(dict(n_nodes=20), {"n_nodes": INT}))
    else:
        name, bad = data.draw(corrupt(dict(key=jax.random.key(0), n=3), {"key": OBJ(_bad_key), "n": INT}))
    assert_rejects(lambda: getattr(prob, method)(**bad), name)


def test_public_entry_points_are_all_covered():
    """A new public name in gmlib.lda must get property tests here (a valid-input and an invalid-input test)."""
    covered = {"LDAProblem", "HeadParams", "TrainResult", "to_attention", "effective", "predict", "risk",
               "effective_risk", "bayes_head", "gradient_descent", "sgd"}
    missing = set(lda.__all__) - covered
    assert not missing, f"gmlib.lda.{sorted(missing)} has no property tests: add them here, then list the name"
