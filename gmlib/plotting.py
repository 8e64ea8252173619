"""One figure style for the whole book, and the small fits that go with its plots.

Nothing here changes matplotlib's global state: a notebook opts in with
``plt.rcParams.update(gmlib.plotting.STYLE)`` (or ``plt.style.context(STYLE)``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["PALETTE", "STYLE", "glue", "loglog_slope"]

#: Okabe–Ito colour-blind-safe palette, in the order the book uses it.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")

#: matplotlib rc settings of the book's figures.
STYLE = {
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "axes.prop_cycle": __import__("cycler").cycler(color=list(PALETTE)),
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "lines.linewidth": 1.8,
    "image.cmap": "viridis",
}


def _positive_1d(a, name: str, size=None):
    """``a`` as a float64 array of at least two (or exactly ``size``) positive finite numbers, or raise naming it."""
    try:
        arr = np.asarray(a)
    except (TypeError, ValueError):  # a ragged list and the like
        arr = np.asarray(None)
    if arr.dtype.kind not in "biuf":  # complex (a cast would drop the imaginary part), strings, objects
        raise ValueError(f"`{name}` must be a 1-D array of real numbers; got {type(a).__name__}")
    arr = arr.astype(np.float64)
    if arr.ndim != 1 or arr.size < 2 or arr.size != (size or arr.size) or not np.all(np.isfinite(arr)) \
            or np.any(arr <= 0):
        raise ValueError(f"`{name}` must be 1-D, with at least two entries (`y` as many as `x`), all positive and "
                         f"finite (a log-log fit); got shape {arr.shape}")
    return arr


def loglog_slope(x, y):
    """Least-squares slope and intercept of ``log y`` against ``log x``.

    Args:
        x, y: positive finite 1-D arrays of the same length, with at least two distinct ``x``.

    Returns:
        ``(slope, intercept)`` with ``y ≈ exp(intercept) * x ** slope``.

    Raises:
        ValueError: naming ``x`` or ``y``, for non-numeric, non-positive, non-finite or
            mismatched inputs, or when every ``x`` is the same (no slope to fit).
    """
    x = _positive_1d(x, "x")
    y = _positive_1d(y, "y", x.size)
    lx = np.log(x)
    if np.ptp(lx) == 0:
        raise ValueError("`x` must hold at least two distinct values to fit a slope")
    slope, intercept = np.polyfit(lx, np.log(y), 1)
    return float(slope), float(intercept)


_GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value):
    """Record ``value`` under ``name`` for the book's prose, and return it.

    The text quotes it as ``{glue:text}`name``` or, formatted, ``{glue:text}`name:.3g```
    (myst-nb's glue protocol; nothing is shown in the notebook). NumPy and JAX scalars
    are recorded as Python numbers, so a format spec applies to them. Without IPython
    (a plain script) it only returns ``value``.

    Example:
        >>> slope = glue("slope", loglog_slope(lengths, errors))
    """
    try:
        from IPython import get_ipython
        from IPython.core.formatters import format_display_data
        from IPython.display import display
    except ImportError:  # a plain Python process: nothing to record into
        return value
    if get_ipython() is None:
        return value
    shown = value
    if np.ndim(value) == 0 and not isinstance(value, (str, bytes)):
        item = np.asarray(value).item()
        shown = item if isinstance(item, (bool, int, float)) else value
    bundle, metadata = format_display_data(shown)
    metadata["scrapbook"] = dict(name=name, mime_prefix=_GLUE_PREFIX)
    display({_GLUE_PREFIX + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)
    return value
