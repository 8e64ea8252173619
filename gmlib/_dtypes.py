"""Dtypes: the floating dtype a computation runs in, and whether a value is concrete (not a tracer).

Explicit, so that gmlib works under ``jax_numpy_dtype_promotion = "strict"``: every public
function computes in the widest floating dtype among its arguments, Python floats following
the arrays (they are "weak").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
    """True when ``x`` holds values we can inspect (not an abstract tracer)."""
    return not isinstance(x, jax.core.Tracer)


def common_float_dtype(*arrays):
    """The widest floating dtype among ``arrays`` (default float if none is floating).

    Explicit, so that gmlib works under ``jax_numpy_dtype_promotion = "strict"``.
    """
    best = None
    for a in arrays:
        dt = getattr(a, "dtype", None)
        if dt is None:
            try:
                dt = np.asarray(a).dtype
            except Exception:  # ragged or non-numeric: array() reports it
                continue
            if dt == np.float64:  # Python floats are weak: they follow the other arguments
                continue
        elif not isinstance(dt, np.dtype):
            try:
                dt = np.dtype(dt)
            except TypeError:  # e.g. a typed PRNG key: not floating
                continue
        if (dt.kind == "f" or _is_float(dt)) and dt.itemsize <= 8 and (best is None or dt.itemsize > best.itemsize):
            best = dt  # float128 is not: array() reports it
    if best is not None and best.itemsize < 8:  # already canonical (only 64-bit types change)
        return best
    return jax.dtypes.canonicalize_dtype(jnp.float64 if best is None else best)


def _is_float(dt) -> bool:
    """Whether numpy dtype ``dt`` is floating (numpy's kinds, and ml_dtypes' bfloat16 and friends)."""
    return dt.kind == "f" or (dt.kind == "V" and jnp.issubdtype(dt, jnp.floating))


def _float(dt, dtype):
    """The floating dtype an array of dtype ``dt`` becomes (``dtype`` when given)."""
    if dtype is not None:
        return dtype
    if _is_float(np.dtype(dt)):
        return dt
    return jax.dtypes.canonicalize_dtype(jnp.float64)
