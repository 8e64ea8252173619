"""gmlib's training loop (optimize), its chunked driver (run_chunks) and its result type (TrainResult).

optimize is checked against the optax loop written out by hand (bit for bit, deterministic and
stochastic), for its records, trajectory, chunking, vmap, compilation reuse and bad input.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.tree_util import Partial

from gmlib import TrainResult, _loop, optimize, run_chunks


@jax.jit
def _count(state, xs):
    return jax.lax.scan(lambda s, x: (s + x, s + x), state, xs)


def block(state, k):
    """Advance a running sum by k records (adding 1, 2, 3, ... in turn)."""
    total, step = state
    new_total, outs = _count(total, step + 1 + jnp.arange(k))
    return (new_total, step + k), outs


@pytest.mark.parametrize("chunk", [None, 1, 3, 10, 25])
def test_chunks_concatenate_to_one_run(chunk):
    """Any chunking gives the outputs of one scan over all the records (the cumulative sums 1, 3, 6, ...)."""
    state, outs = run_chunks(block, (jnp.asarray(0), 0), n_records=10, chunk_records=chunk)
    np.testing.assert_array_equal(outs, np.cumsum(np.arange(1, 11)))
    assert int(state[0]) == 55 and state[1] == 10


def test_progress_bar_changes_nothing(capsys):
    _, outs = run_chunks(block, (jnp.asarray(0), 0), n_records=40, progress=True, desc="test")
    np.testing.assert_array_equal(outs, np.cumsum(np.arange(1, 41)))


def test_pytree_outputs_are_concatenated_leaf_by_leaf():
    def two(state, k):
        return state + k, {"a": jnp.full((k,), state), "b": jnp.zeros((k, 2))}

    _, outs = run_chunks(two, 0, n_records=7, chunk_records=3)
    np.testing.assert_array_equal(outs["a"], [0, 0, 0, 3, 3, 3, 6])
    assert outs["b"].shape == (7, 2)


@pytest.mark.parametrize("kwargs, name", [(dict(n_records=0), "n_records"), (dict(n_records=2.5), "n_records"),
                                          (dict(n_records=4, chunk_records=0), "chunk_records")])
def test_run_chunks_rejects_invalid(kwargs, name):
    n = kwargs.pop("n_records")
    with pytest.raises(ValueError, match=f"`{name}`"):
        run_chunks(block, (jnp.asarray(0), 0), n_records=n, **kwargs)


def test_train_result_fields():
    res = TrainResult(params=1.0, steps=np.arange(3), metric=np.zeros(3))
    assert res.trajectory is None and res._fields == ("params", "steps", "metric", "trajectory")


# ============================================================================ optimize: the one training loop

TARGET = jnp.array([[1.0, -2.0], [0.5, 3.0]])
P0 = {"a": jnp.array([[0.3, 0.1], [-0.2, 0.4]]), "b": jnp.array([0.5, -1.0])}


def quadratic(target, params):
    """A deterministic loss: the squared distance of a to target, plus a quartic term in b."""
    return jnp.sum((params["a"] - target) ** 2) + jnp.sum(params["b"] ** 4)


def draw(scale, key):
    """A stochastic batch: noisy targets (8, 2, 2) around TARGET."""
    return TARGET + scale * jax.random.normal(key, (8, 2, 2))


def batch_loss(params, batch):
    return jnp.mean(jnp.sum((params["a"] - batch) ** 2, axis=(1, 2))) + jnp.sum(params["b"] ** 4)


def hand_loop(loss, params, opt, n_steps, keys=None):
    """The optax loop written out: step t takes the gradient at a fresh batch of fold_in(key, t)."""
    with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats with int32 counts
        return _hand_loop(loss, params, opt, n_steps, keys)


def _hand_loop(loss, params, opt, n_steps, keys):
    @jax.jit  # one compiled step, as in the loop's scan (eager ops would round a few sums differently)
    def step(params, state, *key):
        args = [draw(0.5, k) for k in key]  # the batch of fold_in(key, t), drawn inside the step
        value, grads = jax.value_and_grad(loss)(params, *args)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    state, losses, path = opt.init(params), [], []
    for t in range(n_steps):
        key_t = () if keys is None else (jax.random.fold_in(keys, t),)
        params, state, value = step(params, state, *key_t)
        losses.append(value)
        path.append(params)
    return params, np.asarray(losses), path


def _equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.smoke
@pytest.mark.parametrize("opt", [optax.sgd(0.05), optax.adam(0.1)], ids=["sgd", "adam"])
def test_optimize_deterministic_equals_the_hand_written_loop(opt):
    """loss(params): the final parameters and the mean losses per record equal the hand-written optax loop
    bit for bit; the records sit at steps 5, 10, ..., 20."""
    loss = Partial(quadratic, TARGET)
    out = optimize(loss, P0, opt, n_steps=20, record_every=5)
    params, losses, _ = hand_loop(loss, P0, opt, 20)
    _equal(out.params, params)
    np.testing.assert_array_equal(out.steps, [5, 10, 15, 20])
    np.testing.assert_allclose(out.metric, losses.reshape(4, 5).mean(1), rtol=1e-15)
    assert out.trajectory is None and float(out.metric[-1]) < float(out.metric[0])


def test_optimize_stochastic_equals_the_hand_written_loop():
    """loss(params, sample(fold_in(key, t))): the same parameters and losses as the loop drawing its batch t
    from fold_in(key, t), bit for bit; another key gives another run."""
    opt, key = optax.adam(0.05), jax.random.key(3)
    out = optimize(batch_loss, P0, opt, n_steps=12, record_every=3, sample=Partial(draw, 0.5), key=key)
    params, losses, _ = hand_loop(batch_loss, P0, opt, 12, keys=key)
    _equal(out.params, params)
    np.testing.assert_allclose(out.metric, losses.reshape(4, 3).mean(1), rtol=1e-15)
    other = optimize(batch_loss, P0, opt, n_steps=12, record_every=3, sample=Partial(draw, 0.5),
                     key=jax.random.key(4))
    assert not np.allclose(other.metric, out.metric)


def _dist(params):
    return {"dist": jnp.sum((params["a"] - TARGET) ** 2), "b": params["b"]}


def test_optimize_metric_records_step_0_and_trajectory():
    """With a metric: steps 0, 4, 8, 12 and metric(params) there (a pytree), the first at the start point;
    the trajectory holds the parameters at those steps."""
    opt = optax.sgd(0.05)
    loss = Partial(quadratic, TARGET)
    out = optimize(loss, P0, opt, n_steps=12, record_every=4, metric=_dist, trajectory=True)
    _, _, path = hand_loop(loss, P0, opt, 12)
    at = [P0] + [path[t - 1] for t in (4, 8, 12)]
    np.testing.assert_array_equal(out.steps, [0, 4, 8, 12])
    for i, p in enumerate(at):
        np.testing.assert_allclose(out.metric["dist"][i], _dist(p)["dist"], rtol=1e-14)
        np.testing.assert_allclose(out.metric["b"][i], p["b"], rtol=1e-14)
        np.testing.assert_allclose(out.trajectory["a"][i], p["a"], rtol=1e-14)
    assert out.trajectory["b"].shape == (4, 2)
    plain = optimize(loss, P0, opt, n_steps=12, record_every=4, trajectory=True)  # no metric: no step 0
    np.testing.assert_array_equal(plain.steps, [4, 8, 12])
    np.testing.assert_allclose(plain.trajectory["a"], out.trajectory["a"][1:], rtol=1e-14)


@pytest.mark.parametrize("chunk_records, progress", [(1, False), (2, False), (3, False), (None, True)])
def test_optimize_chunking_changes_nothing(chunk_records, progress):
    """Any chunking of the records (and the progress bar) gives the run in one chunk, bit for bit."""
    kw = dict(n_steps=10, record_every=2, sample=Partial(draw, 0.5), key=jax.random.key(0), metric=_dist)
    whole = optimize(batch_loss, P0, optax.adam(0.05), **kw)
    parts = optimize(batch_loss, P0, optax.adam(0.05), chunk_records=chunk_records, progress=progress, **kw)
    _equal(parts, whole)


def test_optimize_under_vmap_equals_separate_runs():
    """jax.vmap over keys and start points: each run equals the same run alone (the way train.sweep runs)."""
    keys = jax.random.split(jax.random.key(1), 3)
    starts = jax.tree.map(lambda a: jnp.stack([a, 2 * a, -a]), P0)

    def run(key, p0):
        return optimize(batch_loss, p0, optax.adam(0.05), n_steps=6, record_every=2, sample=Partial(draw, 0.5),
                        key=key, metric=_dist)

    out = jax.jit(jax.vmap(run))(keys, starts)
    assert out.metric["dist"].shape == (3, 4)
    for i in range(3):
        alone = run(keys[i], jax.tree.map(lambda a: a[i], starts))
        for a, b in zip(jax.tree.leaves((out.params, out.metric)), jax.tree.leaves((alone.params, alone.metric))):
            np.testing.assert_allclose(a[i], b, rtol=1e-12, atol=1e-14)


def test_optimize_reuses_its_compilation_when_only_partial_data_changes():
    """Partial(fn, data) with new data of the same shape is data of the compiled chunk: no new compilation;
    a new function object compiles anew (the counter does see compilations)."""
    if not hasattr(_loop._block, "_cache_size"):
        pytest.skip("this jax version does not expose a jitted function's cache size")
    opt = optax.sgd(0.01)
    optimize(Partial(quadratic, TARGET), P0, opt, n_steps=4, record_every=2)
    before = _loop._block._cache_size()
    for shift in (1.0, 2.0, 3.0):
        out = optimize(Partial(quadratic, TARGET + shift), P0, opt, n_steps=4, record_every=2)
        ref = optimize(Partial(quadratic, TARGET + shift), P0, opt, n_steps=4, record_every=2)
        _equal(out, ref)
    assert _loop._block._cache_size() == before
    optimize(lambda p: quadratic(TARGET, p), P0, opt, n_steps=4, record_every=2)
    assert _loop._block._cache_size() == before + 1


def test_optimize_sizes_are_keyword_only():
    params = inspect.signature(optimize).parameters
    assert [p for p, v in params.items() if v.kind is not inspect.Parameter.KEYWORD_ONLY] == \
        ["loss", "params", "optimizer"]


@pytest.mark.parametrize("bad, name", [
    (dict(n_steps=0), "n_steps"), (dict(n_steps=2.5), "n_steps"), (dict(n_steps=None), "n_steps"),
    (dict(n_steps=5, record_every=2), "n_steps"), (dict(record_every=0), "record_every"),
    (dict(record_every=True), "record_every"), (dict(loss=3.0), "loss"), (dict(sample="draw"), "sample"),
    (dict(metric=1), "metric"), (dict(optimizer="adam"), "optimizer"),
    (dict(sample=Partial(draw, 0.5), key=None), "key"), (dict(chunk_records=0), "chunk_records"),
])
def test_optimize_rejects_invalid(bad, name):
    kw = {"loss": Partial(quadratic, TARGET), "optimizer": optax.sgd(0.1), "n_steps": 4, "record_every": 2, **bad}
    with pytest.raises(ValueError, match=f"`{name}`"):
        optimize(kw.pop("loss"), P0, kw.pop("optimizer"), **kw)


def _smooth(x):
    """A smooth, well-conditioned objective (rounding is not amplified along the iterates), minimum not at 0."""
    return jnp.sum(jnp.array([1.0, 3.0, 10.0]) * (x - jnp.array([1.0, -0.5, 0.2])) ** 2 + 0.25 * x**4)


def test_optimize_runs_a_line_search_as_optax_does():
    """optax.lbfgs (its zoom line search needs the value, the gradient and the loss) in optimize: the same iterates
    as optax's own loop with value_and_grad_from_state, which reuses the line search's value and gradient."""
    import optax

    from gmlib import optimize

    x0 = jnp.array([-1.2, 1.0, 0.5])
    opt = optax.lbfgs()
    out = optimize(_smooth, x0, opt, n_steps=15, trajectory=True, metric=_smooth)
    value_and_grad = optax.value_and_grad_from_state(_smooth)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int32 counts with Python ints
        x, state, xs = x0, opt.init(x0), [x0]
        for _ in range(15):
            value, grad = value_and_grad(x, state=state)
            updates, state = opt.update(grad, state, x, value=value, grad=grad, value_fn=_smooth)
            x = optax.apply_updates(x, updates)
            xs.append(x)
    np.testing.assert_allclose(out.trajectory, np.stack(xs), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out.metric, [float(_smooth(v)) for v in xs], rtol=1e-10, atol=1e-14)
    grad_norm = float(jnp.linalg.norm(jax.grad(_smooth)(out.params)))
    assert grad_norm < 1e-8 and float(out.metric[-1]) < float(out.metric[1])  # L-BFGS has converged
    # the recorded losses without a metric: the value at the start of each step
    plain = optimize(_smooth, x0, opt, n_steps=15)
    np.testing.assert_allclose(plain.metric, out.metric[:-1], rtol=1e-10, atol=1e-14)
