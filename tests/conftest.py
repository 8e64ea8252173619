"""Test set-up: float64 on, and strict dtype promotion so that silent up-casts fail loudly."""

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
