"""Input validation shared by gmlib's public entry points.

A value is checked once, at the outermost public call (private helpers trust it), on
concrete values: under ``jit`` (abstract tracers) only shapes and dtypes are checked, since
values cannot be read without a host synchronisation. Each error names the argument and
says what was expected against what was got; shapes are described by named dimensions.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gmlib._dtypes import _float, _is_float, is_concrete


def array(x, name: str, shape=None, *, dims=None, dtype=None, finite: bool = True, min_rows: int = 0,
          low=None, high=None, strict: bool = True, psd: bool | str = False):
    """Convert ``x`` to a floating JAX array and check its dtype, shape, finiteness, bounds, PSD-ness in one call.

    Args:
        x: an array-like (numpy array, JAX array or tracer, nested lists, a number).
        name: the argument's name, quoted in every error message.
        shape: ``None`` (any shape) or a tuple whose entries are sizes (ints) or names of
            dimensions (a name takes one size wherever it recurs, the one ``dims`` gives it
            if it does): ``array(means, "means", ("M", "d"), dims={"d": 3})`` raises
            "`means` must have shape (M, d) with d = 3; got (3,)".
        dims: sizes of named dimensions, ``{"d": 3}``.
        dtype: the floating dtype of the result; default: ``x``'s own floating dtype
            (integers and booleans become JAX's default float).
        finite: check that the entries are finite (concrete values only: a numpy input on
            the host before it is copied, a JAX array by one fused reduction).
        min_rows: the least size of the first axis (e.g. 1: at least one token).
        low, high, strict: bounds on every entry (open with ``strict``), concrete values only.
        psd: ``True``: symmetric positive semi-definite matrices, ``"definite"``: positive
            definite (:func:`check_psd`).

    Returns:
        a JAX array.

    Raises:
        ValueError: naming ``name``: a non-numeric, complex or wider than 64-bit input, a
            wrong shape, NaN or infinite entries, entries out of bounds, matrices not PSD.
    """
    x = x if isinstance(x, jax.Array) else _host(x, name)  # a JAX array (or tracer) is not copied
    if not (x.dtype.kind in "biu" or _is_float(x.dtype)) or x.dtype.itemsize > 8:
        raise ValueError(f"`{name}` must be a real array (float64, float32, int, bool); got dtype {x.dtype}")
    if x.dtype != (target := jax.dtypes.canonicalize_dtype(_float(x.dtype, dtype))):
        # an overflow to inf is reported below; a concrete input stays concrete inside a jit
        with np.errstate(over="ignore"), jax.ensure_compile_time_eval():
            x = x.astype(target)
    if finite and isinstance(x, np.ndarray) and not np.isfinite(x).all():  # numpy: on the host
        raise ValueError(f"`{name}` must be finite; got NaN or infinite entries")
    if finite and isinstance(x, jax.Array):
        check_finite(**{name: x})
    x = jnp.asarray(x) if isinstance(x, np.ndarray) else x  # (jnp.asarray costs microseconds on a JAX array)
    if shape is not None and (expected := _expected(x.shape, shape, dims, min_rows)):
        raise ValueError(f"`{name}` must have shape {expected}; got {tuple(x.shape)}")
    if (low is not None or high is not None) and is_concrete(x) and _outside(np.asarray(x), low, high, strict):
        raise ValueError(f"`{name}` must be {_wanted(False, low, high, strict)}; got {np.asarray(x)}")
    if psd:
        check_psd(x, name, definite=psd == "definite")
    return x


def _host(x, name: str) -> np.ndarray:
    try:
        return np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"`{name}` must be a number or an array of numbers; got {type(x).__name__} ({exc})") from None


def _expected(got, shape, dims, min_rows):
    """``None`` when shape ``got`` matches ``shape`` (a name: one size wherever it recurs, ``dims``'s if given)
    and has ``min_rows`` rows; else how the expected shape reads: ``(M, d) with d = 3``."""
    seen = dict(dims or {})
    if len(got) == len(shape) and all(seen.setdefault(s, t) == t if isinstance(s, str) else s == t
                                      for s, t in zip(shape, got)) and (not min_rows or got[0] >= min_rows):
        return None
    bound = [f"{k} = {v}" for k, v in (dims or {}).items() if k in shape] + [
        f"{s} >= {min_rows}" for s in shape[:1] if min_rows]
    return f"({', '.join(map(str, shape))}{',' * (len(shape) == 1)})" + (" with " + ", ".join(bound)) * bool(bound)


@jax.jit
def _finite_flags(trees):
    return jnp.array([jnp.all(jnp.array([jnp.isfinite(a).all() for a in jax.tree.leaves(t)] + [True])) for t in trees])


def check_finite(**trees) -> None:
    """Raise, naming the first offender, unless every concrete pytree of arrays given is finite.

    One fused reduction for all of them (one dispatch, one flag per name copied back, no
    temporary of the arrays' size). Pytrees holding tracers are skipped (their values are
    unknown while tracing).
    """
    names = [k for k, v in trees.items() if all(map(is_concrete, jax.tree.leaves(v)))]
    with jax.ensure_compile_time_eval():  # concrete arrays met while tracing a jit: still checked now
        flags = np.asarray(_finite_flags(tuple(trees[k] for k in names))) if names else np.ones(1, bool)
    if not flags.all():
        raise ValueError(f"`{names[int(np.argmin(flags))]}` must be finite; got NaN or infinite entries")


def finite_kernel(*names, static_argnums=(), check=None):
    """Decorator: ``jax.jit`` a kernel whose non-finite inputs are reported by name, at almost no cost.

    ``names`` gives the name of each positional argument, ``None`` for those not checked.
    ``check`` (optional) maps the arguments to those the kernel takes, checking their shapes
    and dtypes: it runs when the kernel is traced, once per shape and dtype.
    Called with concrete arguments, the compiled kernel returns with its result one flag,
    whether the result is finite (so an accelerator copies back a flag, not the result).
    Only when it is not are the named arguments checked (:func:`check_finite`), and the
    ``ValueError`` names the first non-finite one: a NaN or an infinity in an input reaches
    the result of every gmlib kernel, so none passes unreported, and a result that
    overflows from finite inputs is returned as it is (the documented limits). Under an
    outer ``jit`` (tracers) nothing is checked.
    """

    def decorate(fn):
        def both(*args):
            out = fn(*(args if check is None else check(*args)))
            return out, jnp.isfinite(out).all()

        flagged = jax.jit(both, static_argnums=static_argnums)

        @functools.wraps(fn)
        def call(*args):
            out, ok = flagged(*args)
            if is_concrete(ok) and not ok:
                check_finite(**{n: a for n, a in zip(names, args) if n is not None})
            return out

        call.lower, call._cache_size = flagged.lower, flagged._cache_size  # for inspection
        return call

    return decorate


def scalar(x, name: str, *, low=None, high=None, strict: bool = True, integer: bool = False):
    """A concrete, finite real number within the bounds (open with ``strict``) as a Python ``float``.

    With ``integer``: an integer (Python, numpy or a 0-d integer array; booleans and floats
    are refused), returned as an ``int``.

    Raises:
        ValueError: naming ``name``, unless ``x`` is such a number.
    """
    a = _host(x, name) if is_concrete(x) else None
    if a is None or a.shape != () or a.dtype.kind not in "iu" + "f" * (not integer) or not np.isfinite(a) \
            or _outside(a, low, high, strict):
        raise ValueError(f"`{name}` must be {_wanted(integer, low, high, strict)}; got {x!r}")
    return int(a) if integer else float(a)


def _wanted(integer: bool, low, high, strict: bool) -> str:
    bounds = [f"{op} {v}" for op, v in zip((">", "<") if strict else (">=", "<="), (low, high)) if v is not None]
    return " ".join(["an integer" if integer else "a finite number", *bounds[:1], *(f"and {b}" for b in bounds[1:])])


def _outside(a, low, high, strict: bool) -> bool:
    return bool(low is not None and np.any(a <= low if strict else a < low)
                or high is not None and np.any(a >= high if strict else a > high))


def check_weights(weights, name: str = "weights", *, positive: bool = False) -> None:
    """Raise unless concrete ``weights`` are non-negative (``positive``: positive) and sum to one.

    The sum to a tolerance of 1e-9 in float64, 1e-5 in float32, 4 M eps in narrower dtypes.
    """
    if is_concrete(weights):
        w = np.asarray(weights, np.float64)
        tol = {8: 1e-9, 4: 1e-5}.get(weights.dtype.itemsize, 4.0 * max(1, w.size) * float(jnp.finfo(weights.dtype).eps))
        if np.any(w <= 0 if positive else w < 0) or abs(w.sum() - 1.0) > tol:
            raise ValueError(f"`{name}` must be {'positive' if positive else 'non-negative'} and sum to one; "
                             f"got {w} (sum {w.sum():.12g})")


def check_psd(mats, name: str, *, definite: bool = False) -> None:
    """Raise unless ``mats`` are square matrices (..., D, D), and on concrete values symmetric PSD.

    Symmetry and semi-definiteness to a tolerance of 1e-10 (1e-5 in float32) times the
    largest entry (at least 1). ``definite``: a condition number below 1 / (10 D eps), eps
    the dtype's machine epsilon (4.5e14 in float64 for D = 1): a Cholesky factor of anything
    closer to singular is meaningless.
    """
    if mats.ndim < 2 or mats.shape[-1] != mats.shape[-2] or mats.shape[-1] == 0:
        raise ValueError(f"`{name}` must hold square matrices, shape (..., D, D) with D >= 1; got {tuple(mats.shape)}")
    if is_concrete(mats):
        a, eps = np.asarray(mats, np.float64), 1e-5 if mats.dtype == jnp.float32 else 1e-10
        scale, skew = np.maximum(1.0, np.abs(a).max(axis=(-2, -1))), np.abs(a - np.swapaxes(a, -1, -2)).max((-2, -1))
        lam = np.linalg.eigvalsh(a)  # (of the lower triangle)
        if np.any(skew > eps * scale) or np.any(lam[..., 0] <= 10 * a.shape[-1] * float(jnp.finfo(mats.dtype).eps)
                                                * np.abs(lam).max(axis=-1) if definite else lam[..., 0] < -eps * scale):
            raise ValueError(f"`{name}` must be symmetric positive {'definite' if definite else 'semi-definite'}; got "
                             f"asymmetry {skew.max():.3g}, smallest eigenvalue {lam[..., 0].min():.3g}")


def check_choice(value, name: str, choices) -> None:
    """Raise unless ``value`` is one of ``choices`` (a mode string: a typo must not pick another mode)."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)}; got {value!r}")


def check_float_dtype(dtype):
    """``dtype`` as a canonical floating dtype (``None``: JAX's default float), or raise naming ``dtype``."""
    try:
        dt = np.dtype(jnp.float64 if dtype is None else dtype)
    except TypeError:
        dt = np.dtype(object)
    if not jnp.issubdtype(dt, jnp.floating) or dt.itemsize > 8:
        raise ValueError(f"`dtype` must be a floating dtype (float32 or float64); got {dtype!r}")
    return jax.dtypes.canonicalize_dtype(dt)
