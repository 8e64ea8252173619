"""gmlib's chunked loop (run_chunks) and its result type (TrainResult)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gmlib import TrainResult, run_chunks


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
    state, outs = run_chunks(block, (jnp.asarray(0), 0), 10, chunk_records=chunk)
    np.testing.assert_array_equal(outs, np.cumsum(np.arange(1, 11)))
    assert int(state[0]) == 55 and state[1] == 10


def test_progress_bar_changes_nothing(capsys):
    _, outs = run_chunks(block, (jnp.asarray(0), 0), 40, progress=True, desc="test")
    np.testing.assert_array_equal(outs, np.cumsum(np.arange(1, 41)))


def test_pytree_outputs_are_concatenated_leaf_by_leaf():
    def two(state, k):
        return state + k, {"a": jnp.full((k,), state), "b": jnp.zeros((k, 2))}

    _, outs = run_chunks(two, 0, 7, chunk_records=3)
    np.testing.assert_array_equal(outs["a"], [0, 0, 0, 3, 3, 3, 6])
    assert outs["b"].shape == (7, 2)


@pytest.mark.parametrize("kwargs, name", [(dict(n_records=0), "n_records"), (dict(n_records=2.5), "n_records"),
                                          (dict(n_records=4, chunk_records=0), "chunk_records")])
def test_run_chunks_rejects_invalid(kwargs, name):
    n = kwargs.pop("n_records")
    with pytest.raises(ValueError, match=f"`{name}`"):
        run_chunks(block, (jnp.asarray(0), 0), n, **kwargs)


def test_train_result_fields():
    res = TrainResult(params=1.0, steps=np.arange(3), metric=np.zeros(3))
    assert res.trajectory is None and res._fields == ("params", "steps", "metric", "trajectory")


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
