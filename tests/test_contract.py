"""The API's one convention, held over every public callable of gmlib (book/api.md, "Conventions").

Two parts: the signatures (random keys and sizes keyword-only, one default for
``constant_token``, one name per object), read with ``inspect`` from every public
function, class and method; and bad input: each public callable that takes arrays is
called with one of them of a wrong shape, of a wrong dtype and (where its docstring says
it checks finiteness) holding a NaN, and must raise a ``ValueError`` naming it. The
examples of valid calls live in ``CASES`` below; a public callable without one fails
``test_every_public_callable_has_a_case``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gmlib
from gmlib import denoise, lda
from strategies import assert_rejects

MODULES = ["gmlib", "gmlib.plotting", "gmlib.lda", "gmlib.denoise", "gmlib.regression", "gmlib.train"]
#: sizes: keyword-only wherever they appear
SIZES = {"n_nodes", "n_samples", "n_steps", "n_heads", "n_iter", "batch_size", "prompt_length", "record_every",
         "chunk_records", "n_queries", "n_records"}
#: names that must not be used, with the one name of the object
SYNONYMS = {"tokens": "prompt", "n": "n_samples", "bayes_score": "bayes", "posterior": "responsibilities",
            "sampler": "sample"}


def _public_callables():
    """``(qualified name, callable)`` for every public function, class and public method of a public class."""
    seen = {}
    for module in MODULES:
        mod = importlib.import_module(module)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if not callable(obj):
                continue
            seen.setdefault(f"{module}.{name}", obj)
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith(("_", "tree_")) or isinstance(member, property):  # tree_*: pytree protocol
                        continue
                    fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                    if callable(fn) and getattr(fn, "__module__", "").startswith("gmlib"):
                        seen.setdefault(f"{module}.{name}.{attr}", getattr(obj, attr))
    return sorted(seen.items())


PUBLIC = _public_callables()
_PUBLIC_BY_NAME = dict(PUBLIC)


def _parameters(fn):
    try:
        return inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return ()


@pytest.mark.parametrize("name, fn", PUBLIC, ids=[n for n, _ in PUBLIC])
def test_signature_follows_the_convention(name, fn):
    """Keys and sizes keyword-only; ``constant_token`` keyword-only, default False; one name per object."""
    wrong = []
    for p in _parameters(fn):
        if p.name in ("key", *SIZES) and p.kind is not p.KEYWORD_ONLY:
            wrong.append(f"`{p.name}` must be keyword-only")
        if p.name == "constant_token" and (p.kind is not p.KEYWORD_ONLY or p.default is not False):
            wrong.append("`constant_token` must be keyword-only with default False")
        if p.name in SYNONYMS:
            wrong.append(f"`{p.name}` is called `{SYNONYMS[p.name]}` everywhere else")
    assert not wrong, f"{name}: {'; '.join(wrong)}"


@pytest.mark.parametrize("module", MODULES)
def test_no_public_attribute_has_a_second_name(module):
    """No public class exposes an attribute under a synonym of the API's one name."""
    mod = importlib.import_module(module)
    clash = [f"{module}.{n}.{a}" for n in mod.__all__ if inspect.isclass(getattr(mod, n))
             for a in dir(getattr(mod, n)) if a in SYNONYMS]
    assert not clash, f"use the one name: {[(c, SYNONYMS[c.rsplit('.', 1)[1]]) for c in clash]}"


# ============================================================================ bad input


@dataclasses.dataclass(frozen=True)
class Case:
    """A valid call of a public callable: ``make() -> (fn, kwargs)``, and which kwargs are arrays to corrupt.

    ``arrays``: the argument names that take an array (each gets a wrong shape and a
    wrong dtype). ``finite``: those whose non-finite values are refused (the docstring
    says so). An empty ``arrays`` says the callable takes no array (a loop, a plotting
    helper): nothing to corrupt, the entry only records that it was looked at.
    """

    make: Callable
    arrays: tuple = ()
    finite: tuple = ()
    bad_shape: Callable = staticmethod(lambda a: a[None])  # a batch axis: must not be silently broadcast
    named: str = "{}"  # how the message names an argument ("theta.{}": a leaf of theta)


def _mix():
    return gmlib.GaussianMixture(np.array([0.3, 0.7]), np.array([[1.0, 0.0], [-1.0, 0.5]]),
                                 np.stack([np.eye(2), 0.5 * np.eye(2)]))


def _head():
    return dict(queries=np.ones((3, 2)), U=0.5 * np.eye(2), V=np.eye(2))


def _heads():
    return gmlib.Heads(U=np.stack([np.eye(2), -np.eye(2)]), V=np.stack([np.eye(2), np.eye(2)]))


def _dp():
    return denoise.DenoisingProblem(np.array([0.3, 0.7]), np.array([[2.0, 0.0], [0.0, 2.0]]), 0.5, 1.0)


def _c1():
    return lda.LDAProblem(np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.eye(2), 0.6)


def _theta():
    return lda.HeadParams(np.eye(2), np.ones(2), np.ones(2), np.float64(0.5))


_PROMPT = np.linspace(-1, 1, 10).reshape(5, 2)
_NO_ARRAYS = Case(lambda: (None, {}))


def _clean_batch():
    return denoise.clean_context_sampler(2, 2, within_var=0.1, noise_var=0.1)(jax.random.key(0), 2, 5)

CASES: dict[str, Case] = {
    "gmlib.GaussianMixture": Case(lambda: (gmlib.GaussianMixture, dict(
        weights=np.array([0.3, 0.7]), means=np.zeros((2, 2)), covs=np.stack([np.eye(2)] * 2))),
        ("weights", "means", "covs"), ("weights", "means", "covs")),
    "gmlib.GaussianMixture.isotropic": Case(lambda: (gmlib.GaussianMixture.isotropic, dict(
        weights=np.array([0.3, 0.7]), means=np.zeros((2, 2)), std=np.float64(0.5))),
        ("weights", "means"), ("weights", "means")),
    "gmlib.GaussianMixture.add_noise": Case(lambda: (_mix().add_noise, dict(xi=np.float64(0.5))), ("xi",), ("xi",)),
    "gmlib.GaussianMixture.log_prob": Case(lambda: (_mix().log_prob, dict(z=np.ones((3, 2)))), ("z",), ("z",)),
    "gmlib.GaussianMixture.responsibilities": Case(lambda: (_mix().responsibilities, dict(z=np.ones((3, 2)))),
                                                   ("z",), ("z",)),
    "gmlib.GaussianMixture.sample": _NO_ARRAYS,
    "gmlib.GaussianMixture.mean": _NO_ARRAYS,
    "gmlib.GaussianMixture.second_moment": _NO_ARRAYS,
    "gmlib.GaussianMixture.covariance": _NO_ARRAYS,
    "gmlib.GaussianMixture.astype": _NO_ARRAYS,
    "gmlib.psd_sqrt": Case(lambda: (gmlib.psd_sqrt, dict(mats=np.eye(2))), ("mats",), ("mats",),
                           bad_shape=lambda a: a[..., :1]),  # batched by design: not square is wrong
    "gmlib.softmax_attention": Case(lambda: (gmlib.softmax_attention, dict(prompt=_PROMPT, **_head())),
                                    ("prompt", "queries", "U", "V"), ("prompt", "queries", "U", "V")),
    "gmlib.linear_attention": Case(lambda: (gmlib.linear_attention, dict(prompt=_PROMPT, **_head())),
                                   ("prompt", "queries", "U", "V"), ("prompt", "queries", "U", "V")),
    "gmlib.population_attention": Case(lambda: (gmlib.population_attention, dict(mixture=_mix(), **_head())),
                                       ("queries", "U", "V"), ("queries", "U", "V")),
    "gmlib.population_linear_attention": Case(lambda: (gmlib.population_linear_attention,
                                                       dict(mixture=_mix(), **_head())),
                                              ("queries", "U", "V"), ("queries", "U", "V")),
    "gmlib.gates": Case(lambda: (gmlib.gates, dict(mixture=_mix(), queries=np.ones((3, 2)), U=np.eye(2))),
                        ("queries", "U"), ("queries", "U")),
    "gmlib.Heads": Case(lambda: (gmlib.Heads, dict(U=np.stack([np.eye(2)] * 2), V=np.ones((2, 1, 2)),
                                                   W_out=np.ones((3, 2)))),
                        ("U", "V", "W_out"), ("U", "V", "W_out")),
    "gmlib.Heads.astype": _NO_ARRAYS,
    "gmlib.apply_heads": Case(lambda: (gmlib.apply_heads, dict(heads=_heads(), prompt=_PROMPT,
                                                               queries=np.ones((3, 2)))),
                              ("prompt", "queries"), ("prompt", "queries")),
    "gmlib.init_heads": _NO_ARRAYS,
    "gmlib.mixture_expectation": Case(lambda: (gmlib.mixture_expectation, dict(
        mixture=_mix(), fn=lambda y: y[:, 0], projection=np.ones((1, 2)))), ("projection",), ("projection",)),
    "gmlib.monte_carlo_expectation": Case(lambda: (gmlib.monte_carlo_expectation, dict(
        mixture=_mix(), fn=lambda y: y[:, 0], projection=np.ones((1, 2)), key=jax.random.key(0), n_samples=8)),
        ("projection",), ("projection",)),
    "gmlib.gauss_hermite": _NO_ARRAYS,
    "gmlib.optimize": _NO_ARRAYS,
    "gmlib.run_chunks": _NO_ARRAYS,
    "gmlib.Batch": _NO_ARRAYS,  # a NamedTuple of what a sampler drew: no checks (it is built inside jit)
    "gmlib.TrainResult": _NO_ARRAYS,
    "gmlib.plotting.glue": _NO_ARRAYS,
    "gmlib.plotting.number": _NO_ARRAYS,  # a scalar in, text out (test_plotting: what it refuses)
    "gmlib.plotting.legend": _NO_ARRAYS,  # a figure in, a legend out
    "gmlib.plotting.check_figure": _NO_ARRAYS,
    "gmlib.plotting.figure_problems": _NO_ARRAYS,
    "gmlib.plotting.Table": _NO_ARRAYS,
    "gmlib.plotting.animation_html": _NO_ARRAYS,  # an Animation in, HTML out  # rows of any printable values (test_plotting: a short row)
    # ---- gmlib.lda
    "gmlib.lda.LDAProblem": Case(lambda: (lda.LDAProblem, dict(
        mean_pos=np.array([1.0, 0.0]), mean_neg=np.array([0.0, 1.0]), cov=np.eye(2), p_pos=np.float64(0.6))),
        ("mean_pos", "mean_neg", "cov", "p_pos"), ("mean_pos", "mean_neg", "cov", "p_pos")),
    "gmlib.lda.LDAProblem.bayes": Case(lambda: (_c1().bayes, dict(x=np.ones((3, 2)))), ("x",), ("x",)),
    "gmlib.lda.LDAProblem.bayes_params": _NO_ARRAYS,
    "gmlib.lda.LDAProblem.bayes_risk": _NO_ARRAYS,
    "gmlib.lda.LDAProblem.sample": _NO_ARRAYS,
    "gmlib.lda.LDAProblem.astype": _NO_ARRAYS,
    "gmlib.lda.HeadParams": _NO_ARRAYS,  # a container (built inside jit): checked by what takes it
    "gmlib.lda.effective@theta": Case(lambda: (lambda **kw: lda.effective(_c1(), lda.HeadParams(**kw)), dict(
        U11=np.eye(2), u12=np.ones(2), v21=np.ones(2), v22=np.float64(0.5))),
        ("U11", "u12", "v21", "v22"), ("U11", "u12", "v21", "v22"), named="theta.{}"),
    "gmlib.lda.HeadParams.zeros": _NO_ARRAYS,
    "gmlib.lda.HeadParams.normal": _NO_ARRAYS,
    "gmlib.lda.HeadParams.astype": _NO_ARRAYS,
    "gmlib.lda.prompt_sampler": _NO_ARRAYS,  # takes a validated LDAProblem
    "gmlib.lda.to_attention": _NO_ARRAYS,  # takes a validated HeadParams
    "gmlib.lda.effective": _NO_ARRAYS,
    "gmlib.lda.predict": Case(lambda: (lda.predict, dict(problem=_c1(), theta=_theta(), x=np.ones((3, 2)))),
                              ("x",), ("x",)),
    "gmlib.lda.risk": _NO_ARRAYS,
    "gmlib.lda.effective_risk": Case(lambda: (lda.effective_risk, dict(
        problem=_c1(), w=np.ones(2), b=np.float64(0.1), r=np.float64(0.2), s=np.ones(2), n_nodes=8)),
        ("w", "b", "r", "s"), ("w", "b", "r", "s")),
    "gmlib.lda.bayes_head": _NO_ARRAYS,
    "gmlib.lda.family_constraints": _NO_ARRAYS,  # takes a validated problem and HeadParams
    "gmlib.lda.risk_hessian": _NO_ARRAYS,
    "gmlib.lda.gradient_descent": _NO_ARRAYS,
    "gmlib.lda.sgd": _NO_ARRAYS,
    # ---- gmlib.train
    "gmlib.train.sweep": _NO_ARRAYS,
    # ---- gmlib.denoise: the problem is checked when it is built; what takes one checks the rest
    "gmlib.denoise.DenoisingProblem": Case(lambda: (denoise.DenoisingProblem, dict(
        weights=np.array([0.3, 0.7]), means=np.array([[1.0, 0.0], [0.0, 1.0]]), gamma=np.float64(0.5),
        xi=np.float64(1.0))), ("weights", "means", "gamma", "xi"), ("weights", "means", "gamma", "xi")),
    "gmlib.denoise.DenoisingProblem@cov": Case(lambda: (denoise.DenoisingProblem, dict(
        weights=np.array([0.3, 0.7]), means=np.array([[1.0, 0.0], [0.0, 1.0]]), xi=np.float64(1.0),
        cov=np.eye(2))), ("cov",), ("cov",)),
    "gmlib.denoise.DenoisingProblem.responsibilities": Case(lambda: (_dp().responsibilities, dict(
        z=np.ones((3, 2)))), ("z",), ("z",)),
    "gmlib.denoise.DenoisingProblem.bayes": Case(lambda: (_dp().bayes, dict(z=np.ones((3, 2)))), ("z",), ("z",)),
    "gmlib.denoise.DenoisingProblem.sample": _NO_ARRAYS,
    "gmlib.denoise.DenoisingProblem.excess_risk": _NO_ARRAYS,  # takes a function
    "gmlib.denoise.DenoisingProblem.bayes_risk": _NO_ARRAYS,
    "gmlib.denoise.DenoisingProblem.astype": _NO_ARRAYS,
    "gmlib.denoise.two_head_bayes": _NO_ARRAYS,  # each construction takes a validated problem
    "gmlib.denoise.single_head_bayes": _NO_ARRAYS,
    "gmlib.denoise.multi_head_bayes": _NO_ARRAYS,
    "gmlib.denoise.heads_needed": _NO_ARRAYS,
    "gmlib.denoise.fewer_heads": _NO_ARRAYS,
    "gmlib.denoise.skip_head_bayes": _NO_ARRAYS,
    "gmlib.denoise.small_score_head": Case(lambda: (denoise.small_score_head, dict(
        problem=_dp(), eps=np.float64(0.1))), ("eps",), ("eps",)),
    "gmlib.denoise.augment": _NO_ARRAYS,  # its values are checked by the attention that reads the result
    "gmlib.denoise.linear_optimum": _NO_ARRAYS,
    "gmlib.denoise.linear_risk": _NO_ARRAYS,
    "gmlib.denoise.linear_gap": _NO_ARRAYS,
    "gmlib.denoise.affine_optimum": _NO_ARRAYS,
    "gmlib.denoise.affine_risk": _NO_ARRAYS,
    "gmlib.denoise.affine_gap": _NO_ARRAYS,
    "gmlib.denoise.in_context_heads": Case(lambda: (denoise.in_context_heads, dict(
        gamma=np.float64(1.0), xi=np.float64(0.5), dim=2, temperature=np.float64(0.5))),
        ("gamma", "xi", "temperature"), ("gamma", "xi", "temperature")),
    "gmlib.denoise.estimate_task": Case(lambda: (denoise.estimate_task, dict(
        prompt=np.linspace(-2, 2, 40).reshape(20, 2), gamma=np.float64(0.5), xi=np.float64(1.0))),
        ("prompt",), ("prompt",)),
    "gmlib.denoise.in_context_bayes": Case(lambda: (denoise.in_context_bayes, dict(
        prompt=np.linspace(-2, 2, 40).reshape(20, 2), queries=np.ones((3, 2)), gamma=np.float64(0.5),
        xi=np.float64(1.0), n_angles=32, n_weights=4)), ("prompt", "queries"), ("prompt", "queries")),
    "gmlib.denoise.finite_prompt_errors": _NO_ARRAYS,  # traceable, checks nothing: the task was checked
    "gmlib.denoise.task_sampler": _NO_ARRAYS,
    "gmlib.denoise.task_excess": _NO_ARRAYS,  # takes a Batch the sampler drew (inside jit)
    "gmlib.denoise.excess_by_length": _NO_ARRAYS,  # takes a Batch, like task_excess
    "gmlib.denoise.tempered_excess": _NO_ARRAYS,  # a Batch; temperatures checked by in_context_heads
    "gmlib.denoise.plug_in_excess": _NO_ARRAYS,  # a Batch
    "gmlib.denoise.train_in_context": _NO_ARRAYS,  # takes models and an optimizer
    "gmlib.denoise.trained_excess": _NO_ARRAYS,  # takes models, their runs and a Batch
    "gmlib.train.schedule": _NO_ARRAYS,  # numbers only, checked by name (tests/test_train.py)
    "gmlib.train.side_by_side": _NO_ARRAYS,  # takes models and functions (tests/test_train.py)
    "gmlib.lda.task_sampler": _NO_ARRAYS,  # numbers only, checked by name (tests/test_lda.py)
    "gmlib.lda.in_context_bayes": Case(lambda: (lda.in_context_bayes, dict(
        prompt=np.linspace(-1, 1, 30).reshape(10, 3), queries=np.ones((3, 3)))), ("prompt", "queries"),
        ("prompt", "queries")),
    "gmlib.lda.plug_in": _NO_ARRAYS,  # traceable, checks nothing: a predictor inside task_metrics
    "gmlib.lda.task_metrics": _NO_ARRAYS,  # takes a Batch the sampler drew
    "gmlib.lda.train_in_context": _NO_ARRAYS,  # takes models and an optimizer
    "gmlib.heads_from_flax": _NO_ARRAYS,  # takes a flax layer (tests/test_heads.py; flax is optional)
    "gmlib.denoise.iterate": Case(lambda: (denoise.iterate, dict(f=lambda z: 0.5 * z, z0=np.ones((3, 2)),
                                                                 n_steps=2)), ("z0",), ("z0",),
                            bad_shape=None),  # any shape: f decides
    "gmlib.denoise.separation": _NO_ARRAYS,
    "gmlib.denoise.tanh_fixed_point": _NO_ARRAYS,
    "gmlib.denoise.cluster_limits": Case(lambda: (denoise.cluster_limits, dict(problem=denoise.DenoisingProblem(
        [0.5, 0.5], [[0.0, 3.0], [0.0, -3.0]], 0.0, 2.0), starts=np.ones((3, 2)))), ("starts",), ("starts",)),
    # ---- chapter 10: gmlib.denoise.clean_context and gmlib.regression
    "gmlib.denoise.clean_context_sampler": _NO_ARRAYS,  # numbers only (tests/test_denoise_clean_context.py)
    "gmlib.denoise.CleanTasks": _NO_ARRAYS,  # a container the sampler fills
    "gmlib.denoise.TemperedRisk": _NO_ARRAYS,  # a container tempered_risk fills
    "gmlib.denoise.TemperedRisk.risk_at": _NO_ARRAYS,  # a quadratic in alpha, broadcast
    "gmlib.denoise.tempered_risk": Case(lambda: (denoise.tempered_risk, dict(
        batch=_clean_batch(), betas=np.array([1.0, 2.0]))), ("betas",), ("betas",)),
    "gmlib.denoise.known_centres_bayes": _NO_ARRAYS,  # a Batch the sampler drew
    "gmlib.denoise.cluster_labels": Case(lambda: (denoise.cluster_labels, dict(
        prompt=np.linspace(-1, 1, 20).reshape(2, 5, 2), n_clusters=2)), ("prompt",), ("prompt",)),
    "gmlib.denoise.clean_context_bayes": Case(lambda: (denoise.clean_context_bayes, dict(
        batch=_clean_batch(), labels=np.zeros((2, 5), np.int32))), ("labels",)),
    "gmlib.denoise.train_clean_context": _NO_ARRAYS,  # a Batch and an optimizer
    "gmlib.regression.regression_sampler": _NO_ARRAYS,  # numbers only (tests/test_regression.py)
    "gmlib.regression.gd_heads": _NO_ARRAYS,  # a number, checked by name (tests/test_regression.py)
    "gmlib.regression.lsa_heads": _NO_ARRAYS,  # a dict of matrices, checked by gmlib.Heads
    "gmlib.regression.predict": _NO_ARRAYS,  # heads and a Batch
    "gmlib.regression.train_lsa": _NO_ARRAYS,  # a sampler and numbers
    "gmlib.regression.Alignment": _NO_ARRAYS,  # a container alignment fills
    "gmlib.regression.alignment": _NO_ARRAYS,  # heads (checked by out_dim) and a Batch
    "gmlib.plotting.loglog_slope": Case(lambda: (gmlib.plotting.loglog_slope, dict(
        x=np.array([1.0, 2.0, 4.0]), y=np.array([1.0, 0.5, 0.25]))), ("x", "y"), ("x", "y")),
}


def _bad_inputs(case):
    """``(argument, how, bad kwargs)`` for each corruption of each array argument of ``case``."""
    fn, kwargs = case.make()
    for name in case.arrays:
        a = np.asarray(kwargs[name])
        if case.bad_shape is not None:  # None: every shape is valid
            yield name, "a wrong shape", fn, {**kwargs, name: case.bad_shape(a)}
        yield name, "complex dtype", fn, {**kwargs, name: a.astype(np.complex128) + 1j}
        if name in case.finite:
            nan = np.array(a, dtype=np.float64)
            nan.reshape(-1)[0] = np.nan
            yield name, "a NaN", fn, {**kwargs, name: nan}


BAD = [(f"{qual}:{arg}:{how}", fn, bad, (arg, case.named.format(arg))) for qual, case in CASES.items()
       if case.arrays for arg, how, fn, bad in _bad_inputs(case)]


def test_every_public_callable_has_a_case():
    """Each public callable is in CASES (its valid call and its array arguments), and CASES names no stale one."""
    public, cases = {name for name, _ in PUBLIC}, {name.split("@")[0] for name in CASES}  # name@arg: one more case
    missing, stale = sorted(public - cases), sorted(cases - public)
    assert not missing and not stale, f"add to CASES: {missing}; remove from CASES: {stale}"


@pytest.mark.smoke
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_the_valid_call_runs(case):
    """The example call of each case is valid (so that the corruptions below test what they claim)."""
    fn, kwargs = CASES[case].make()
    if fn is not None:
        jax.block_until_ready(jax.tree.leaves(fn(**kwargs)))


@pytest.mark.parametrize("label, fn, bad, names", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_a_value_error_naming_it(label, fn, bad, names):
    """A wrong shape, a wrong dtype or (where checked) a NaN in one argument: a ValueError that names it."""
    assert_rejects(lambda: jax.block_until_ready(jax.tree.leaves(fn(**bad))), *names)


def test_the_finite_flags_follow_the_docstrings():
    """An argument is listed as checked for finiteness exactly when the callable's docstring says it is checked."""
    wrong = []
    for qual, case in CASES.items():
        if not case.arrays:
            continue
        fn, _ = case.make()
        fn = _PUBLIC_BY_NAME[qual.split("@")[0]]
        says = "finite" in (inspect.getdoc(fn) or "").lower()
        if bool(case.finite) != says:
            wrong.append(qual)
    assert not wrong, f"docstring and CASES disagree on finiteness: {wrong}"


def test_the_checks_see_through_jit():
    """Shapes are still checked under jit (at trace time): the same message as outside."""
    f = jax.jit(lambda q: gmlib.apply_heads(_heads(), jnp.asarray(_PROMPT), q))
    assert_rejects(lambda: f(jnp.ones((3, 3))), "queries")
