"""Doctest set-up: `make unit` runs every ``>>>`` example of gmlib's docstrings as written.

float64 is on (as in tests/conftest.py), and the examples may use, unimported, the names a
chapter imports: ``jax``, ``jnp``, ``np``, ``optax``, ``gmlib``, ``lda``, ``denoise`` and ``regression``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    import optax

    import gmlib
    from gmlib import denoise, lda, regression

    doctest_namespace.update(jax=jax, jnp=jnp, np=np, optax=optax, gmlib=gmlib, lda=lda, denoise=denoise,
                             regression=regression)
