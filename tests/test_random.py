"""gmlib's flat random draws (gmlib/_random.py) are jax.random's draws, bit for bit, in both threefry modes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gmlib import _random

SHAPES = [(3, 5), (2, 1, 3, 2), (0, 3)]


@pytest.fixture(params=[True, False], ids=["partitionable", "original"])
def threefry_mode(request):
    with jax.threefry_partitionable(request.param):
        yield


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_flat_draws_equal_jax_random(threefry_mode, shape, dtype):
    key = jax.random.key(sum(shape) + 17)
    np.testing.assert_array_equal(_random.normal(key, shape, dtype), jax.random.normal(key, shape, dtype))
    np.testing.assert_array_equal(_random.uniform(key, shape, dtype, -1.5, 2.0),
                                  jax.random.uniform(key, shape, dtype, -1.5, 2.0))
    assert _random.normal(key, shape, dtype).dtype == dtype
    np.testing.assert_array_equal(_random.uniform(key, shape), jax.random.uniform(key, shape))  # default dtype


@pytest.mark.smoke
@pytest.mark.parametrize("n, m", [(1, 1), (9, 3), (50, 2)])
def test_flat_categorical_equals_jax_random(threefry_mode, n, m):
    key = jax.random.key(n * m)
    logits = jnp.log(jnp.arange(1.0, m + 1))
    labels = _random.categorical(key, logits, n)
    np.testing.assert_array_equal(labels, jax.random.categorical(key, logits, shape=(n,)))
    if m > 1 and n == 50:
        assert len(np.unique(labels)) == m  # the draw is not constant (a wrong axis would be)


def test_flat_draws_differ_from_a_transposed_draw():
    """A guard on the test itself: a draw's layout matters, so equality above is not trivial."""
    key = jax.random.key(0)
    assert not np.array_equal(_random.normal(key, (3, 5), jnp.float64),
                              jax.random.normal(key, (5, 3), jnp.float64).T)
