"""Property-based tests of gmlib.lda's problem (helpers from test_properties.py).

Valid random problems: the Bayes score and risk are finite, 0 <= R* <= H(π₊) (at most
the risk of the prior alone), swapping the two classes (m₁ ↔ m₋₁, π₊ ↔ 1 − π₊) negates the
Bayes score and keeps the Bayes risk, and the token law is a valid two-component mixture.
Invalid inputs: ValueError naming the argument.
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from test_properties import DTYPES, SETTINGS, Arg, _asymmetric, _indefinite, arrays, assert_rejects, corrupt, \
    floats, tol

from gmlib import lda


@st.composite
def problems(draw, dtype=None):
    dtype = dtype or draw(st.sampled_from(DTYPES))
    d = draw(st.sampled_from([1, 2, 3]))
    a = draw(arrays((d, d), -1.0, 1.0))
    cov = a @ a.T + 0.2 * np.eye(d)
    p = draw(floats(0.05, 0.95))
    return lda.LDAProblem(draw(arrays((d,))).astype(dtype), draw(arrays((d,))).astype(dtype),
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
