"""One figure style for the whole book, and the small fits that go with its plots.

Nothing here changes matplotlib's global state: a notebook opts in with
``plt.rcParams.update(gmlib.plotting.STYLE)`` (or ``plt.style.context(STYLE)``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["PALETTE", "STYLE", "loglog_slope"]

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


def loglog_slope(x, y):
    """Least-squares slope and intercept of ``log y`` against ``log x``.

    Args:
        x, y: positive arrays of the same shape (at least two points).

    Returns:
        ``(slope, intercept)`` with ``y ≈ exp(intercept) * x ** slope``.

    Raises:
        ValueError: for non-positive or mismatched inputs.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"`x` and `y` must be 1-D of equal length >= 2; got {x.shape} and {y.shape}")
    if np.any(x <= 0) or np.any(y <= 0) or not np.all(np.isfinite(x * y)):
        raise ValueError("`x` and `y` must be positive and finite for a log-log fit")
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope), float(intercept)
