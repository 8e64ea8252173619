"""Input validation shared by gmlib's public entry points.

Every public function checks its inputs here, on concrete values and outside
the jitted kernels. Under ``jit`` (abstract tracers) only the shapes are
checked: values cannot be inspected without a host synchronisation.
Each error names the argument and says what was expected against what was got.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "as_float_array",
    "common_float_dtype",
    "is_concrete",
    "check_finite",
    "check_shape",
    "check_weights",
    "check_psd",
    "check_positive_int",
]


def is_concrete(x) -> bool:
    """True when ``x`` holds values we can inspect (not an abstract tracer)."""
    return not isinstance(x, jax.core.Tracer)


def common_float_dtype(*arrays):
    """The widest floating dtype among ``arrays`` (default float if none is floating).

    Explicit, so that gmlib works under ``jax_numpy_dtype_promotion = "strict"``.
    """
    best = None
    for a in arrays:
        if hasattr(a, "dtype"):
            dt = a.dtype
        else:
            try:
                dt = np.asarray(a).dtype
            except Exception:  # ragged or non-numeric: as_float_array reports it
                continue
            if dt == np.float64:  # Python floats are weak: they follow the other arguments
                continue
        if jnp.issubdtype(dt, jnp.floating):
            dt = jax.dtypes.canonicalize_dtype(dt)
            if best is None or jnp.finfo(dt).bits > jnp.finfo(best).bits:
                best = dt
    if best is None:
        best = jax.dtypes.canonicalize_dtype(jnp.float64)
    return best


def as_float_array(x, name: str, dtype=None):
    """Convert ``x`` to a floating JAX array (of ``dtype`` if given).

    Raises:
        ValueError: if ``x`` is not numeric (strings, objects, complex numbers).
    """
    if is_concrete(x):
        try:
            arr = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise ValueError(f"`{name}` must be a numeric array; got {type(x).__name__} ({exc})") from None
        if arr.dtype == object or not (
            np.issubdtype(arr.dtype, np.floating)
            or np.issubdtype(arr.dtype, np.integer)
            or np.issubdtype(arr.dtype, np.bool_)
            or str(arr.dtype) == "bfloat16"
        ):
            raise ValueError(f"`{name}` must be a real numeric array; got dtype {arr.dtype}")
    x = jnp.asarray(x)
    if dtype is None:
        dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else common_float_dtype()
    return x.astype(dtype)


def check_finite(x, name: str) -> None:
    """Raise if a concrete ``x`` holds NaN or infinite values."""
    if is_concrete(x) and not bool(np.all(np.isfinite(np.asarray(x)))):
        raise ValueError(f"`{name}` must be finite; got NaN or infinite entries")


def check_shape(x, name: str, shape: tuple, desc: str | None = None) -> None:
    """Raise unless ``x.shape`` matches ``shape`` (``None`` entries match anything)."""
    ok = x.ndim == len(shape) and all(s is None or s == t for s, t in zip(shape, x.shape))
    if not ok:
        want = desc or "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"`{name}` must have shape {want}; got {tuple(x.shape)}")


def check_weights(weights, name: str = "weights") -> None:
    """Raise unless concrete ``weights`` are non-negative and sum to one."""
    if not is_concrete(weights):
        return
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0):
        raise ValueError(f"`{name}` must be non-negative; got {w}")
    tol = 1e-5 if weights.dtype == jnp.float32 else 1e-9
    if abs(w.sum() - 1.0) > tol:
        raise ValueError(f"`{name}` must sum to one; got sum {w.sum():.12g}")


def check_psd(mats, name: str) -> None:
    """Raise unless concrete ``mats`` (..., D, D) are symmetric positive semi-definite.

    Tolerances are relative to the largest entry, in the matrices' precision.
    """
    if not is_concrete(mats):
        return
    a = np.asarray(mats, dtype=np.float64)
    eps = 1e-5 if mats.dtype == jnp.float32 else 1e-10
    scale = np.maximum(1.0, np.abs(a).max(axis=(-2, -1), keepdims=True))
    if np.any(np.abs(a - np.swapaxes(a, -1, -2)) > eps * scale):
        raise ValueError(f"`{name}` must be symmetric")
    low = np.linalg.eigvalsh(a).min(axis=-1)
    if np.any(low < -eps * scale[..., 0, 0]):
        k = np.flatnonzero(np.atleast_1d(low < -eps * scale[..., 0, 0]))
        raise ValueError(
            f"`{name}` must be positive semi-definite; entry {k.tolist()} has eigenvalue "
            f"{np.atleast_1d(low)[k[0]]:.3g}"
        )


def check_positive_int(value, name: str) -> int:
    """Return ``value`` as an int, raising unless it is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer; got {value!r}")
    return int(value)
