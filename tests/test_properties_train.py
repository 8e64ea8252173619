"""Property-based tests of gmlib.train (helpers from test_properties.py).

Valid random inputs: init_heads has the advertised shapes, dtype and scale; apply_heads is the
formula of the module docstring and is invariant to permuting (or duplicating) the prompt's tokens
and to permuting the heads together with W_out's column blocks; the samplers give the advertised
shapes, equal-norm means, weights in range, labels ±1, and the same batch for the same key; a few
steps of fit / training_run give finite losses of the right shape, reproducibly; sharded_sweep on
this process's devices equals a Python loop over the seeds. Invalid inputs: ValueError naming the
argument, never another exception.

Every test runs 200 examples (the training loops' compilations are cached across examples).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from hypothesis import given
from hypothesis import strategies as st
from test_properties import DTYPES, SETTINGS, Arg, _bad_key, _bad_positive_int, arrays, assert_rejects, corrupt, \
    floats, tol

from gmlib import linear_attention, softmax_attention, train

OPT = optax.sgd(1e-2)
OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731
INT = OBJ(_bad_positive_int)


def _np(a):
    return np.asarray(a, np.float64)


# ============================================================================ init_heads, apply_heads


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), n_heads=st.sampled_from([1, 3]), dim=st.sampled_from([1, 2]),
       value_dim=st.sampled_from([None, 2]), out_dim=st.sampled_from([None, 1, 3]), scale=floats(0.0, 3.0),
       dtype=st.sampled_from(DTYPES))
def test_init_heads(seed, n_heads, dim, value_dim, out_dim, scale, dtype):
    """Shapes (H, D, D), (H, D_v, D), (D_y, H D_v); dtype; finite; reproducible; U, V linear in ``scale``."""
    kw = dict(n_heads=n_heads, dim=dim, value_dim=value_dim, out_dim=out_dim, dtype=dtype)
    p = train.init_heads(jax.random.key(seed), scale=scale, **kw)
    p1 = train.init_heads(jax.random.key(seed), scale=1.0, **kw)
    dv = value_dim or dim
    want = {"U": (n_heads, dim, dim), "V": (n_heads, dv, dim)}
    if out_dim is not None:
        want["W_out"] = (out_dim, n_heads * dv)
    assert {k: v.shape for k, v in p.items()} == want
    assert all(v.dtype == dtype and np.all(np.isfinite(_np(v))) for v in p.values())
    for k in ("U", "V"):
        np.testing.assert_allclose(_np(p[k]), scale * _np(p1[k]), rtol=tol(dtype), atol=tol(dtype))
    if out_dim is not None:
        np.testing.assert_array_equal(_np(p["W_out"]), _np(p1["W_out"]))


@st.composite
def head_layers(draw):
    """(params, tokens, queries, kind, residual) of a valid apply_heads call."""
    dtype = draw(st.sampled_from(DTYPES))
    H, D, L = draw(st.sampled_from([(1, 2, 5), (3, 2, 8), (2, 3, 5)]))
    residual = draw(st.booleans())
    dv = D if residual else draw(st.sampled_from([1, D]))
    params = {"U": draw(arrays((H, D, D))).astype(dtype), "V": draw(arrays((H, dv, D))).astype(dtype)}
    if draw(st.booleans()):
        params["W_out"] = draw(arrays((2, H * dv))).astype(dtype)
    return (params, draw(arrays((L, D))).astype(dtype), draw(arrays((2, D))).astype(dtype),
            draw(st.sampled_from(["softmax", "linear"])), residual)


@SETTINGS
@given(layer=head_layers(), seed=st.integers(0, 1000))
def test_apply_heads_formula_and_symmetries(layer, seed):
    """W_out [r z + T_h(z)]_h (or Σ_h); invariant to permuting or duplicating the tokens, and to permuting
    the heads together with W_out's column blocks."""
    params, toks, q, kind, residual = layer
    t = tol(toks.dtype)
    out = _np(train.apply_heads(params, toks, q, kind=kind, residual=residual))
    op = softmax_attention if kind == "softmax" else linear_attention
    heads = [_np(op(toks, q, U, V)) + (_np(q) if residual else 0) for U, V in zip(params["U"], params["V"])]
    expected = np.concatenate(heads, axis=1) @ _np(params["W_out"]).T if "W_out" in params else sum(heads)
    assert out.shape == expected.shape and np.all(np.isfinite(out))
    sc = 10 * t * (1 + np.abs(expected).max()) * 30
    np.testing.assert_allclose(out, expected, atol=sc)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(toks.shape[0])
    twice = np.concatenate([toks[perm]] * 2)
    np.testing.assert_allclose(_np(train.apply_heads(params, twice, q, kind=kind, residual=residual)), out, atol=sc)
    hp = rng.permutation(params["U"].shape[0])
    permuted = {"U": params["U"][hp], "V": params["V"][hp]}
    if "W_out" in params:
        dv = params["V"].shape[1]
        blocks = params["W_out"].reshape(params["W_out"].shape[0], -1, dv)
        permuted["W_out"] = blocks[:, hp].reshape(params["W_out"].shape)
    np.testing.assert_allclose(_np(train.apply_heads(permuted, toks, q, kind=kind, residual=residual)), out,
                               atol=sc)


# ============================================================================ samplers


@SETTINGS
@given(gamma=st.one_of(st.just(0.0), floats(0.0, 2.0)), xi=floats(0.05, 2.0), dim=st.sampled_from([1, 2]),
       radius=floats(0.1, 5.0), lo=floats(0.05, 0.5), width=floats(0.0, 0.45), n_queries=st.sampled_from([1, 3]),
       seed=st.integers(0, 2**31 - 1), bl=st.sampled_from([(1, 4), (3, 2)]))
def test_denoising_task_sampler(gamma, xi, dim, radius, lo, width, n_queries, seed, bl):
    """Batch shapes; equal-norm means (‖m_k‖ = radius); weights in range summing to one; reproducible."""
    B, L = bl
    sample = train.denoising_task_sampler(gamma, xi, dim, radius=radius, weight_range=(lo, lo + width),
                                          n_queries=n_queries)
    b = sample(jax.random.key(seed), B, L)
    assert isinstance(b, train.Batch)
    means, weights = b.aux
    assert b.tokens.shape == (B, L, dim) and b.queries.shape == b.targets.shape == (B, n_queries, dim)
    assert means.shape == (B, 2, dim) and weights.shape == (B, 2)
    for a in (b.tokens, b.queries, b.targets, means, weights):
        assert np.all(np.isfinite(_np(a)))
    t = 1e-5 if means.dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(np.linalg.norm(_np(means), axis=-1), radius, rtol=t)
    w = _np(weights)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=t)
    assert np.all(w[:, 0] >= lo - t) and np.all(w[:, 0] <= lo + width + t)
    again = sample(jax.random.key(seed), B, L)
    for a, c in zip(jax.tree.leaves(b), jax.tree.leaves(again)):
        np.testing.assert_array_equal(_np(a), _np(c))


@st.composite
def lda_tasks(draw):
    d = draw(st.sampled_from([1, 2]))
    a = draw(arrays((d, d), -1.0, 1.0))
    cov = a @ a.T + 0.2 * np.eye(d)
    return dict(mean_pos=draw(arrays((d,))), mean_neg=draw(arrays((d,))), cov=0.5 * (cov + cov.T),
                p_pos=draw(floats(0.05, 0.95)))


@SETTINGS
@given(task=lda_tasks(), n_queries=st.sampled_from([1, 3]), seed=st.integers(0, 2**31 - 1),
       bl=st.sampled_from([(1, 4), (3, 2)]))
def test_classification_prompt_sampler(task, n_queries, seed, bl):
    """Tokens (x, y) with y = ±1, queries (x, 0), targets ±1 of shape (B, Q, 1); reproducible."""
    B, L = bl
    d = task["mean_pos"].shape[0]
    sample = train.classification_prompt_sampler(**task, n_queries=n_queries)
    b = sample(jax.random.key(seed), B, L)
    assert isinstance(b, train.Batch)
    assert b.tokens.shape == (B, L, d + 1) and b.queries.shape == (B, n_queries, d + 1)
    assert b.targets.shape == (B, n_queries, 1)
    for a in (b.tokens, b.queries, b.targets):
        assert np.all(np.isfinite(_np(a)))
    assert set(np.unique(_np(b.tokens[..., -1]))) <= {-1.0, 1.0}
    assert set(np.unique(_np(b.targets))) <= {-1.0, 1.0}
    assert np.all(_np(b.queries[..., -1]) == 0)
    again = sample(jax.random.key(seed), B, L)
    np.testing.assert_array_equal(_np(again.tokens), _np(b.tokens))


# ============================================================================ training loops


def _loss(params, batch):
    pred = jax.vmap(lambda tk, q: train.apply_heads(params, tk, q, kind="linear", residual=True))(batch.tokens,
                                                                                                   batch.queries)
    return jnp.mean((pred - batch.targets) ** 2)


SAMPLER = train.denoising_task_sampler(0.5, 1.0, 2)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), n_steps=st.sampled_from([1, 2]), n_heads=st.sampled_from([1, 2]),
       with_metric=st.booleans())
def test_fit_returns_finite_history(seed, n_steps, n_heads, with_metric):
    """n_steps records (record_every = 1) of finite losses or metrics, steps 1..n, the params' structure kept,
    the same key giving the same run. (The compiled chunk is cached per loss, sampler, optimizer and sizes,
    so the examples reuse a few compilations.)"""
    params = train.init_heads(jax.random.key(seed), n_heads=n_heads, dim=2)
    metric = (lambda p: jnp.sum(p["U"] ** 2)) if with_metric else None
    kw = dict(n_steps=n_steps, batch_size=2, prompt_length=4, record_every=1, metric=metric)
    out, hist = train.fit(_loss, params, SAMPLER, OPT, jax.random.key(seed + 1), **kw)
    assert hist["step"].tolist() == list(range(1, n_steps + 1))
    assert hist["metric"].shape == (n_steps,) and np.all(np.isfinite(_np(hist["metric"])))
    assert jax.tree.structure(out) == jax.tree.structure(params)
    assert all(a.shape == b.shape and np.all(np.isfinite(_np(a))) for a, b in zip(jax.tree.leaves(out),
                                                                                    jax.tree.leaves(params)))
    out2, hist2 = train.fit(_loss, params, SAMPLER, OPT, jax.random.key(seed + 1), **kw)
    np.testing.assert_array_equal(_np(hist2["metric"]), _np(hist["metric"]))


def _runs(record_every):
    run = train.training_run(_loss, lambda k: train.init_heads(k, n_heads=1, dim=2), SAMPLER, OPT, n_steps=2,
                             batch_size=2, prompt_length=4, record_every=record_every)
    return run, jax.jit(run)


#: one run per record_every: the sweep's compilation is cached per (run, seed count)
RUNS = {r: _runs(r) for r in (1, 2)}


@SETTINGS
@given(seeds=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=3), record_every=st.sampled_from([1, 2]))
def test_training_run_and_sharded_sweep_equal_a_python_loop(seeds, record_every):
    """training_run's losses have shape (n_steps // record_every,) and are finite; sharded_sweep over this
    process's devices equals run(key(seed)) seed by seed."""
    run, loop = RUNS[record_every]
    params, losses = train.sharded_sweep(run, seeds)
    assert losses.shape == (len(seeds), 2 // record_every) and np.all(np.isfinite(_np(losses)))
    assert params["U"].shape == (len(seeds), 1, 2, 2)
    for i, s in enumerate(seeds):
        p1, l1 = loop(jax.random.key(np.uint32(s)))
        np.testing.assert_allclose(_np(losses[i]), _np(l1), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(_np(params["U"][i]), _np(p1["U"]), rtol=1e-10, atol=1e-12)


# ============================================================================ invalid inputs


def _bad_dtype_arg(_):
    return st.sampled_from([np.int32, "banana", np.complex64, bool])


def _not_none(strategy):
    return lambda v: strategy(v).filter(lambda c: c is not None)


@SETTINGS
@given(data=st.data())
def test_init_heads_rejects_invalid(data):
    def bad_scale(_):
        return st.sampled_from([np.nan, np.inf, np.ones(2), "1", None])

    args = dict(key=jax.random.key(0), n_heads=2, dim=2, value_dim=None, out_dim=3, scale=1.0, dtype=None)
    spec = {"key": OBJ(_bad_key), "n_heads": INT, "dim": INT, "value_dim": OBJ(_not_none(_bad_positive_int)),
            "out_dim": OBJ(_not_none(_bad_positive_int)), "scale": OBJ(bad_scale), "dtype": OBJ(_bad_dtype_arg)}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: train.init_heads(**bad), name)


@SETTINGS
@given(layer=head_layers(), data=st.data())
def test_apply_heads_rejects_invalid(layer, data):
    params, toks, q, kind, residual = layer
    toks, q = toks.astype(np.float64), q.astype(np.float64)
    what = data.draw(st.sampled_from(["params", "leaf", "other"]))
    call = dict(kind=kind, residual=residual)
    if what == "params":
        bad = data.draw(st.sampled_from([None, (params["U"], params["V"]), {"U": params["U"]}, "params"]))
        assert_rejects(lambda: train.apply_heads(bad, toks, q, **call), "params")
        return
    if what == "leaf":
        leaves = {f"params['{k}']": np.asarray(v) for k, v in params.items()}
        spec = {"params['U']": Arg(fixed_axes=(1, 2)), "params['V']": Arg(fixed_axes=(0, 2)),
                "params['W_out']": Arg(fixed_axes=(1,))}
        name, bad = data.draw(corrupt(leaves, {k: v for k, v in spec.items() if k in leaves}))
        p = {k[8:-2]: v for k, v in bad.items()}
        # a wrong D_v for a residual head is refused by name too ("a residual head needs D_v = D")
        assert_rejects(lambda: train.apply_heads(p, toks, q, **call), name, "params['V']", "params['U']")
        return

    def bad_kind(_):
        return st.sampled_from(["cosine", None, 1, "Softmax"])

    def empty(a):
        return st.just(np.asarray(a)[:0])

    args = dict(tokens=toks, queries=q, kind=kind)
    spec = {"tokens": Arg(extra=(empty,)), "queries": Arg(fixed_axes=(1,)), "kind": OBJ(bad_kind)}
    name, bad = data.draw(corrupt(args, spec))
    # tokens of a wrong width disagree with params['U'] (D is read from the tokens)
    also = ("params['U']",) if name == "tokens" else ()
    assert_rejects(lambda: train.apply_heads(params, **bad, residual=residual), name, *also)


def _bad_scalar(_):
    return st.sampled_from([np.nan, np.inf, -1.0, np.ones(2), "1", None, 1j])


@SETTINGS
@given(data=st.data())
def test_denoising_task_sampler_rejects_invalid(data):
    def bad_range(_):
        return st.sampled_from([(0.0, 0.5), (0.6, 0.4), (0.2, 1.0), (0.1, 0.2, 0.3), (np.nan, 0.5), ("a", "b"),
                                0.5, None])

    if data.draw(st.booleans()):
        args = dict(gamma=0.5, xi=1.0, dim=2, radius=3.0, weight_range=(0.2, 0.8), n_queries=1)
        spec = {"gamma": OBJ(lambda _: st.sampled_from([np.nan, np.inf, -1.0, np.ones(2), "1", None])),
                "xi": OBJ(_bad_scalar, lambda _: st.just(0.0)), "dim": INT, "radius": OBJ(_bad_scalar),
                "weight_range": OBJ(bad_range), "n_queries": INT}
        name, bad = data.draw(corrupt(args, spec))
        assert_rejects(lambda: train.denoising_task_sampler(**bad), name)
    else:
        sample = train.denoising_task_sampler(0.5, 1.0, 2)
        spec = {"key": OBJ(_bad_key), "batch_size": INT, "prompt_length": INT}
        name, bad = data.draw(corrupt(dict(key=jax.random.key(0), batch_size=2, prompt_length=3), spec))
        assert_rejects(lambda: sample(**bad), name)


@SETTINGS
@given(task=lda_tasks(), data=st.data())
def test_classification_prompt_sampler_rejects_invalid(task, data):
    from test_properties import _asymmetric, _indefinite

    if data.draw(st.booleans()):
        spec = {"mean_pos": Arg(), "mean_neg": Arg(fixed_axes=(0,)),
                "cov": Arg(fixed_axes=(0, 1), extra=(_asymmetric, _indefinite)),
                "p_pos": Arg(extra=(lambda _: st.sampled_from([0.0, 1.0, -0.5, 2.0]),)), "n_queries": INT}
        name, bad = data.draw(corrupt({**task, "p_pos": np.float64(task["p_pos"]), "n_queries": 2}, spec))
        also = ("mean_neg", "cov") if name == "mean_pos" else ()  # the dimension d is read from mean_pos
        assert_rejects(lambda: train.classification_prompt_sampler(**bad), name, *also)
    else:
        sample = train.classification_prompt_sampler(**task)
        spec = {"key": OBJ(_bad_key), "batch_size": INT, "prompt_length": INT}
        name, bad = data.draw(corrupt(dict(key=jax.random.key(0), batch_size=2, prompt_length=3), spec))
        assert_rejects(lambda: sample(**bad), name)


def _bad_callable(_):
    return st.sampled_from([None, 3.0, "fn", lambda: 0.0])


def _bad_loss(_):  # callables that cannot be a loss: a vector, a wrong signature, a crash on the batch
    return st.sampled_from([None, "loss", lambda p, b: b.tokens, lambda p: 0.0, lambda p, b: p["nope"]])


def _bad_sampler(_):
    return st.sampled_from([None, "sampler", lambda k: None, lambda k, b, L: jnp.zeros(3) + "a"])


def _bad_params(p):
    return st.sampled_from([{}, None, {"U": np.full((1, 2, 2), np.nan), "V": p["V"]},
                            {"U": np.zeros((1, 2, 2), np.int32), "V": p["V"]}, "params"])


@SETTINGS
@given(data=st.data())
def test_fit_rejects_invalid(data):
    params = train.init_heads(jax.random.key(0), n_heads=1, dim=2)

    def not_a_divisor(_):
        return st.just(3)

    args = dict(loss=_loss, params=params, sampler=SAMPLER, optimizer=OPT, key=jax.random.key(0), n_steps=4,
                batch_size=2, prompt_length=3, record_every=2, metric=lambda p: jnp.sum(p["U"]))
    spec = {"loss": OBJ(_bad_loss), "params": OBJ(_bad_params), "sampler": OBJ(_bad_sampler),
            "optimizer": OBJ(lambda _: st.sampled_from([0.1, None, optax.sgd])), "key": OBJ(_bad_key),
            "n_steps": INT, "batch_size": INT, "prompt_length": INT,
            "record_every": OBJ(_bad_positive_int, not_a_divisor), "metric": OBJ(_not_none(_bad_callable))}
    name, bad = data.draw(corrupt(args, spec))
    also = ("n_steps",) if name == "record_every" else ("record_every",) if name == "n_steps" else ()
    assert_rejects(lambda: train.fit(**bad), name, *also)


@SETTINGS
@given(data=st.data())
def test_training_run_rejects_invalid(data):
    init = lambda k: train.init_heads(k, n_heads=1, dim=2)  # noqa: E731
    if data.draw(st.booleans()):
        def bad_init(_):
            return st.sampled_from([None, "init", lambda: None, lambda k: {"U": jnp.zeros((1, 2, 2), jnp.int32)},
                                    lambda k: {}])

        args = dict(loss=_loss, init=init, sampler=SAMPLER, optimizer=OPT, n_steps=2, batch_size=2,
                    prompt_length=3, record_every=1)
        spec = {"loss": OBJ(_bad_loss), "init": OBJ(bad_init), "sampler": OBJ(_bad_sampler),
                "optimizer": OBJ(lambda _: st.sampled_from([0.1, None])), "n_steps": INT, "batch_size": INT,
                "prompt_length": INT, "record_every": OBJ(_bad_positive_int, lambda _: st.just(4))}
        name, bad = data.draw(corrupt(args, spec))
        also = ("n_steps",) if name == "record_every" else ()
        assert_rejects(lambda: train.training_run(**bad), name, *also)
    else:
        run = train.training_run(_loss, init, SAMPLER, OPT, n_steps=1, batch_size=1, prompt_length=2,
                                 record_every=1)
        name, bad = data.draw(corrupt(dict(key=jax.random.key(0)), {"key": OBJ(_bad_key)}))
        assert_rejects(lambda: run(**bad), name)


@SETTINGS
@given(data=st.data())
def test_sharded_sweep_rejects_invalid(data):
    def bad_seeds(_):
        return st.sampled_from([[], [1.5, 2.0], [[1, 2]], 3, [-1, 2], [2**32], ["a"], [True, False], None])

    def bad_devices(_):
        return st.sampled_from([[], ["cpu"], 3, [None]])

    args = dict(fn=lambda k: jax.random.normal(k, ()), seeds=[0, 1], devices=None)
    spec = {"fn": OBJ(lambda _: st.sampled_from([None, 3.0, "fn"])), "seeds": OBJ(bad_seeds),
            "devices": OBJ(bad_devices)}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: train.sharded_sweep(**bad), name)


def test_public_entry_points_are_all_covered():
    """A new public name in gmlib.train must get property tests here (a valid-input and an invalid-input test).

    ``Batch`` is a plain NamedTuple (no validation of its own): covered through the samplers that build it
    and the loops (fit, training_run) that refuse a sampler or loss that does not fit it.
    """
    covered = {"Batch", "init_heads", "apply_heads", "denoising_task_sampler", "classification_prompt_sampler",
               "fit", "training_run", "sharded_sweep"}
    missing = set(train.__all__) - covered
    assert not missing, f"gmlib.train.{sorted(missing)} has no property tests: add them here, then list the name"
