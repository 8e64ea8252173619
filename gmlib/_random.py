"""``jax.random`` draws taken flat and reshaped: the same numbers, compiled faster on a CPU.

With JAX's default threefry (``jax_threefry_partitionable``), a draw of shape
``(n1, ..., nk)`` builds its counters from one iota per axis, and XLA's CPU compiler is
slow on such counters of rank 2 or more: a jitted denoising prompt sampler of
:mod:`gmlib.train` compiles about twice as fast with flat draws. An element's counter is
its row-major flat index (and without the flag the bits are drawn flat anyway), so a draw
of the flattened size, reshaped, is the same array bit for bit (``tests/test_random.py``
checks it against ``jax.random`` in both modes).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def normal(key, shape: tuple, dtype=float):
    """``jax.random.normal(key, shape, dtype)``, bit for bit."""
    return jax.random.normal(key, (math.prod(shape),), dtype).reshape(shape)


def uniform(key, shape: tuple, dtype=float, minval=0.0, maxval=1.0):
    """``jax.random.uniform(key, shape, dtype, minval, maxval)``, bit for bit."""
    return jax.random.uniform(key, (math.prod(shape),), dtype, minval, maxval).reshape(shape)


def categorical(key, logits, n: int):
    """``jax.random.categorical(key, logits, shape=(n,))`` for 1-D ``logits``, bit for bit (Gumbel-max)."""
    m = logits.shape[-1]
    return jnp.argmax(jax.random.gumbel(key, (n * m,), logits.dtype).reshape(n, m) + logits, axis=-1)
