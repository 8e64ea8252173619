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
