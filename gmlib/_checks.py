"""Input validation shared by gmlib's public entry points.

Every public function checks its inputs here, on concrete values and outside
the jitted kernels. Under ``jit`` (abstract tracers) only the shapes are
checked: values cannot be inspected without a host synchronisation.
Each error names the argument and says what was expected against what was got.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gmlib._dtypes import _float, _is_float, common_float_dtype, is_concrete  # noqa: F401 (re-exported)

__all__ = [
    "array",
    "finite",
    "finite_kernel",
    "scalar",
    "common_float_dtype",
    "is_concrete",
    "check_weights",
    "check_psd",
    "check_choice",
    "check_steps",
    "check_float_dtype",
]


def _describe(shape, dims=None) -> str:
    """``(M, d) with d = 3``: the shape's named dimensions, and the sizes ``dims`` binds."""
    text = "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
    bound = [f"{k} = {v}" for k, v in (dims or {}).items() if k in shape]
    return text + (" with " + ", ".join(bound) if bound else "")


def _real_dtype(dt, name: str) -> None:
    """Raise unless ``dt`` is a real numeric dtype JAX supports."""
    dt = np.dtype(dt)
    if not (dt.kind in "biu" or _is_float(dt)):
        raise ValueError(f"`{name}` must be a real numeric array; got dtype {dt}")
    if dt.kind == "f" and dt.itemsize > 8:  # float128: JAX has none
        raise ValueError(f"`{name}` has dtype {dt}, which JAX does not support; convert it to float64 or float32")


@jax.jit
def _all_finite(x):
    return _finite_all(x)


def array(x, name: str, shape=None, *, dims=None, dtype=None, desc: str | None = None, finite: bool = True,
          min_rows: int = 0, low=None, high=None, strict: bool = True, why: str = ""):
    """Convert ``x`` to a floating JAX array and check its shape and finiteness, in one call.

    Args:
        x: an array-like (numpy array, JAX array, nested lists, a number).
        name: the argument's name, quoted in every error message.
        shape: ``None`` (any shape) or a tuple of sizes: an int (that size), ``None`` (any
            size) or a dimension's name such as ``"M"`` (any size, the same wherever the
            name recurs in the tuple, and the size ``dims`` gives it if it does), e.g.
            ``array(means, "means", ("M", "d"), dims={"d": 3})``, whose message reads
            "`means` must have shape (M, d) with d = 3; got (3,)".
        dims: sizes of named dimensions, ``{"d": 3}``.
        dtype: the floating dtype of the result; default: ``x``'s own floating dtype
            (integers and booleans become JAX's default float).
        desc: how the expected shape reads in the message, e.g. ``"(n, D) with D = 3"``.
        finite: check that the values are finite. Done on concrete values only (not on
            abstract tracers under ``jit``): a numpy input is checked on the host before it
            is copied, a JAX array with one fused reduction (one scalar comes back).
        min_rows: the least size of the first axis (e.g. 1: at least one token).
        low, high, strict: bounds on every entry, as in :func:`scalar` (checked on
            concrete values); ``why`` is appended to their message (e.g. " (a standard
            deviation)").

    Returns:
        a JAX array.

    Raises:
        ValueError: naming ``name``: non-numeric or complex input, a wrong shape,
            NaN or infinite entries.
    """
    if isinstance(x, jax.Array):  # a JAX array or a tracer: no copy to the host
        traced = isinstance(x, jax.core.Tracer)
        dt = x.dtype
        if dt is not dtype and dt.kind != "f":
            _real_dtype(dt, name)
    else:
        traced = False
        try:
            host = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise ValueError(f"`{name}` must be a numeric array; got {type(x).__name__} ({exc})") from None
        _real_dtype(host.dtype, name)
        target = jax.dtypes.canonicalize_dtype(_float(host.dtype, dtype))
        with np.errstate(over="ignore"):  # an overflow to inf is reported just below
            host = host.astype(target, copy=False)
        if finite and not np.isfinite(host).all():  # on the host, before the copy
            raise ValueError(f"`{name}` must be finite; got NaN or infinite entries")
        finite = False
        x = jnp.asarray(host)
        dt = x.dtype
    if dt is not dtype:  # (numpy's built-in dtypes are singletons: the common case costs one test)
        target = _float(dt, dtype)
        if dt != target:
            finite = finite and jnp.issubdtype(dt, jnp.inexact)
            with jax.ensure_compile_time_eval():  # a concrete input stays concrete inside a jit
                x = x.astype(target)
    if shape is not None and not _matches(x.shape, shape, dims):
        raise ValueError(f"`{name}` must have shape {desc or _describe(shape, dims)}; got {tuple(x.shape)}")
    if min_rows and (x.ndim == 0 or x.shape[0] < min_rows):
        raise ValueError(f"`{name}` must hold at least {min_rows} row{'s' if min_rows > 1 else ''} "
                         f"(first axis); got shape {tuple(x.shape)}")
    if finite and not traced:
        with jax.ensure_compile_time_eval():  # a concrete array met while tracing a jit: still check it now
            ok = bool(_all_finite(x))
        if not ok:
            raise ValueError(f"`{name}` must be finite; got NaN or infinite entries")
    if (low is not None or high is not None) and is_concrete(x):  # not a value staged into a jit
        _bounds(x, name, low, high, strict, why)
    return x


def _matches(got, shape, dims=None) -> bool:
    """Whether shape ``got`` matches ``shape`` (``None``: any size; a name: one size wherever it recurs)."""
    if len(got) != len(shape):
        return False
    seen = dict(dims or ())
    for s, t in zip(shape, got):
        if isinstance(s, str):
            if seen.setdefault(s, t) != t:
                return False
        elif s is not None and s != t:
            return False
    return True


def _finite_all(x):
    """Whether every entry of ``x`` is finite, as a reduction that never holds an (x.shape) temporary.

    (``jnp.isfinite(x).all()`` materialises the boolean array: 88 MB for a (2**22, 21) prompt.)
    The maximum propagates NaN and keeps infinities.
    """
    if x.size == 0:
        return jnp.asarray(True)
    return jnp.isfinite(jnp.abs(x).max())


@jax.jit
def _finite_flags(arrays):
    return jnp.stack([_finite_all(a) for a in arrays])


def finite(**arrays) -> None:
    """Raise, naming the first offender, unless every concrete array given is finite.

    One fused reduction for all of them (one dispatch, one small host copy): cheaper than
    a check per array when a public function takes several arrays already on a device.
    Tracers are skipped (their values are unknown while tracing).
    """
    names = [k for k, v in arrays.items() if not isinstance(v, jax.core.Tracer)]
    if not names:
        return
    with jax.ensure_compile_time_eval():  # concrete arrays met while tracing a jit: still check them now
        flags = np.asarray(_finite_flags(tuple(arrays[k] for k in names)))
    if not flags.all():
        raise ValueError(f"`{names[int(np.argmin(flags))]}` must be finite; got NaN or infinite entries")


def finite_kernel(*names, static_argnums=()):
    """Decorator: ``jax.jit`` a kernel whose non-finite inputs are reported by name, at almost no cost.

    ``names`` gives the argument name of each positional argument, ``None`` for those not
    checked (pytrees, static values). Called with concrete arguments, the wrapper looks at
    the result: on a CPU, where it already is in host memory; on an accelerator, through
    one flag that the compiled kernel returns with it (so the result is not copied back).
    Either way this waits for the result. Only when the result is not finite are the named arguments checked (one fused reduction), and a
    ``ValueError`` names the first non-finite one. A NaN or an infinity in an input
    propagates to the result of every gmlib kernel, so none passes unreported; a result
    that overflows from finite inputs is returned as it is (the documented limits).
    Under an outer ``jit`` (tracers) nothing is checked.
    """
    checked = [i for i, n in enumerate(names) if n is not None]

    def decorate(fn):
        def both(*args):
            out = fn(*args)
            return out, jnp.isfinite(out).all()  # the result is small: its mask costs little

        plain, flagged = jax.jit(fn, static_argnums=static_argnums), jax.jit(both, static_argnums=static_argnums)

        @functools.wraps(fn)
        def call(*args):
            if jax.default_backend() == "cpu":  # the result is already in host memory: look at it there
                out = plain(*args)
                ok = isinstance(out, jax.core.Tracer) or np.isfinite(np.asarray(out)).all()
            else:  # an accelerator: one flag comes back, not the result
                out, ok = flagged(*args)
                ok = isinstance(ok, jax.core.Tracer) or bool(ok)
            if not ok:
                finite(**{names[i]: args[i] for i in checked})
            return out

        call.lower = plain.lower  # the compiled kernel, for inspection
        if hasattr(plain, "_cache_size"):
            call._cache_size = lambda: plain._cache_size() + flagged._cache_size()
        return call

    return decorate


def scalar(x, name: str, *, low=None, high=None, strict: bool = True, integer: bool = False):
    """A concrete, finite real number as a host Python ``float`` (``int`` with ``integer``).

    Args:
        x: a Python or numpy number, or a 0-d array (numpy or concrete JAX).
        name: the argument's name, quoted in the error message.
        low, high: bounds (``None``: unbounded).
        strict: open bounds (``low < x < high``); ``False``: closed.
        integer: require an integer (booleans are refused) and return an ``int``.

    Raises:
        ValueError: naming ``name``, unless ``x`` is such a number within the bounds.
    """
    want = _scalar_wanted(low, high, strict, integer)
    if isinstance(x, (bool, np.bool_)) or isinstance(x, jax.core.Tracer):
        raise ValueError(f"`{name}` must be {want}; got {x!r}")
    if integer:
        if isinstance(x, (int, np.integer)):
            value = int(x)
        elif isinstance(x, (np.ndarray, jax.Array)) and x.shape == () and jnp.issubdtype(x.dtype, jnp.integer):
            value = int(x)
        else:
            raise ValueError(f"`{name}` must be {want}; got {x!r}")
    else:
        try:
            a = np.asarray(x)
        except Exception:
            raise ValueError(f"`{name}` must be {want}; got {type(x).__name__}") from None
        if a.shape != () or a.dtype == object or not (np.issubdtype(a.dtype, np.floating)
                                                        or np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"`{name}` must be {want} (a real scalar); got {x!r}")
        value = float(a)
        if not np.isfinite(value):
            raise ValueError(f"`{name}` must be finite; got {value}")
    below = low is not None and (value <= low if strict else value < low)
    above = high is not None and (value >= high if strict else value > high)
    if below or above:
        raise ValueError(f"`{name}` must be {want}; got {value!r}")
    return value


def _scalar_wanted(low, high, strict, integer) -> str:
    kind = "an integer" if integer else "a finite number"
    if integer and high is None and low == 0:
        return "a positive integer" if strict else "a non-negative integer"
    lo, hi = ("(", ")") if strict else ("[", "]")
    if low is not None and high is not None:
        return f"{kind} in {lo}{low}, {high}{hi}"
    if low is not None:
        return f"{kind} {'>' if strict else '>='} {low}"
    if high is not None:
        return f"{kind} {'<' if strict else '<='} {high}"
    return kind


def check_weights(weights, name: str = "weights", *, positive: bool = False) -> None:
    """Raise unless concrete ``weights`` are non-negative (``positive``: positive) and sum to one."""
    if not is_concrete(weights):
        return
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w <= 0 if positive else w < 0):
        raise ValueError(f"`{name}` must be {'positive' if positive else 'non-negative'}; got {w}")
    if weights.dtype == jnp.float64:
        tol = 1e-9
    elif weights.dtype == jnp.float32:
        tol = 1e-5
    else:  # float16 / bfloat16: the rounding of M weights
        tol = 4.0 * max(1, w.size) * float(jnp.finfo(weights.dtype).eps)
    if abs(w.sum() - 1.0) > tol:
        raise ValueError(f"`{name}` must sum to one; got sum {w.sum():.12g}")


def _bounds(x, name: str, low, high, strict: bool, why: str) -> None:
    """Raise unless every entry of the concrete array ``x`` lies within the bounds (open with ``strict``)."""
    a = np.asarray(x)
    below = low is not None and np.any(a <= low if strict else a < low)
    if below or (high is not None and np.any(a >= high if strict else a > high)):
        raise ValueError(f"`{name}` must be {_scalar_wanted(low, high, strict, False)}{why}; got {a}")


def check_psd(mats, name: str, *, definite: bool = False) -> None:
    """Raise unless ``mats`` are square matrices (..., D, D), and on concrete values symmetric PSD.

    ``definite``: positive definite (smallest eigenvalue above 1e-12, 1e-5 in float32,
    times the largest entry). Tolerances are relative to the largest entry, in the
    matrices' precision.
    """
    if mats.ndim < 2 or mats.shape[-1] != mats.shape[-2] or mats.shape[-1] == 0:
        raise ValueError(f"`{name}` must hold square matrices, shape (..., D, D) with D >= 1; got {tuple(mats.shape)}")
    if not is_concrete(mats):
        return
    a = np.asarray(mats, dtype=np.float64)
    eps = 1e-5 if mats.dtype == jnp.float32 else 1e-10
    scale = np.maximum(1.0, np.abs(a).max(axis=(-2, -1), keepdims=True))
    if np.any(np.abs(a - np.swapaxes(a, -1, -2)) > eps * scale):
        raise ValueError(f"`{name}` must be symmetric")
    low = np.linalg.eigvalsh(a).min(axis=-1)
    if definite and np.any(low <= (1e-5 if mats.dtype == jnp.float32 else 1e-12) * scale[..., 0, 0]):
        raise ValueError(f"`{name}` must be positive definite; its smallest eigenvalue is {np.min(low):.3g}")
    if np.any(low < -eps * scale[..., 0, 0]):
        k = np.flatnonzero(np.atleast_1d(low < -eps * scale[..., 0, 0]))
        raise ValueError(
            f"`{name}` must be positive semi-definite; entry {k.tolist()} has eigenvalue "
            f"{np.atleast_1d(low)[k[0]]:.3g}"
        )


def check_choice(value, name: str, choices) -> None:
    """Raise unless ``value`` is one of ``choices`` (a mode string: a typo must not pick another mode)."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)}; got {value!r}")


def check_steps(n_steps, record_every):
    """``(n_steps, record_every)`` as positive ints, ``n_steps`` a multiple of ``record_every`` (no step dropped)."""
    n_steps = scalar(n_steps, "n_steps", low=0, integer=True)
    record_every = scalar(record_every, "record_every", low=0, integer=True)
    if n_steps % record_every:
        raise ValueError(f"`n_steps` must be a multiple of `record_every` = {record_every}; got {n_steps}")
    return n_steps, record_every


def check_float_dtype(dtype, name: str = "dtype"):
    """Return ``dtype`` as a canonical floating dtype (``None``: the default float), or raise."""
    if dtype is None:
        return common_float_dtype()
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"`{name}` must be a floating dtype (float32 or float64); got {dtype!r}") from None
    if not jnp.issubdtype(dt, jnp.floating) or dt.itemsize > 8:
        raise ValueError(f"`{name}` must be a floating dtype (float32 or float64); got {dt}")
    return jax.dtypes.canonicalize_dtype(dt)
