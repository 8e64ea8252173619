"""One figure style for the whole book, its rules, and the small fits that go with its plots.

The rules of a figure on the page: drawn at the width of the text column
(:data:`COLUMN_WIDTH`), so that it is shown at its own size, never shrunk; every text
at least :data:`MIN_FONT_PT` points; legends beside or below the axes, never on the data
(:func:`legend`); rendered as a PNG at twice the displayed size (``retina``: at least
1200 px wide), sharp on any screen. :func:`check_figure` says which rule a figure breaks.

Nothing here changes matplotlib's or IPython's global state: a notebook opts in with
``plt.rcParams.update(gmlib.plotting.STYLE)`` (or ``plt.style.context(STYLE)``) and
``%config InlineBackend.figure_formats = ["retina"]``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["COLUMN_WIDTH", "MIN_FONT_PT", "PALETTE", "STYLE", "Table", "animation_html", "check_figure",
           "figure_problems", "glue", "legend", "loglog_slope", "number"]

#: Okabe–Ito colour-blind-safe palette, in the order the book uses it.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")

#: Width of the book's figures in inches, at their 100 dpi (an inch is 100 CSS px).
#: In a 1400 px window a code cell's output is 784 px wide, so a figure this wide is shown at
#: its own size (tests/site_check.py measures it), and its fonts at the sizes of :data:`STYLE`.
COLUMN_WIDTH = 7.0

#: The smallest font size, in points at the displayed size, of any text in a figure.
MIN_FONT_PT = 9.0

#: The matplotlib rc settings of the book's figures.
#: Column width, fonts from 9.5 pt, a white background (readable in dark mode), and
#: constrained layout (room for legends outside the axes).
STYLE = {
    "figure.figsize": (COLUMN_WIDTH, 3.6),
    "figure.dpi": 100,
    "savefig.dpi": 200,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "figure.constrained_layout.use": True,
    "axes.prop_cycle": __import__("cycler").cycler(color=list(PALETTE)),
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 10,
    "axes.titlesize": 10.5,
    "axes.labelsize": 10,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
    "legend.fontsize": 9.5,
    "legend.title_fontsize": 9.5,
    "figure.titlesize": 11,
    "legend.frameon": False,
    "lines.linewidth": 1.8,
    "lines.markersize": 5,
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


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
_MINUS = "\u2212"


def number(x, digits: int | None = None, *, decimals: int | None = None, percent: bool = False) -> str:
    r"""``x`` typeset for a page: 1.6 × 10⁻⁵, −0.25, 20,000, 85 %: the one number format of the book.

    A real number is rounded to ``digits`` significant digits (default 2) or, with
    ``decimals``, to that many digits after the point (then kept, as a table column
    needs). Rounded to significant digits, it is written in positional notation when
    :math:`10^{-3} \le |x| < 10^5` (trailing zeros dropped, as Python's ``g`` format does)
    and as :math:`m \times 10^{e}` otherwise, with a superscript exponent (and
    :math:`10^{e}` alone for a mantissa of 1). An integer is written in full. Minus signs
    are true minus signs (U+2212), thousands are separated by commas, and ``percent``
    writes :math:`100x` followed by a no-break space and ``%`` (the book's "within 2 %").

    Args:
        x: a finite real number (a Python, NumPy or JAX scalar, or a 0-d array).
        digits: significant digits, a positive int (not with ``decimals``).
        decimals: digits after the point, an int ≥ 0 (not with ``digits``).
        percent: write ``x`` as a percentage.

    Returns:
        a ``str``: ``glue(name, value, digits=2)`` records it for the prose.

    Raises:
        ValueError: naming ``x`` (not a finite real number), ``digits`` or ``decimals``.

    Example:
        >>> number(1.62e-5), number(-0.25), number(20_000), number(0.8512, percent=True)
        ('1.6 × 10⁻⁵', '−0.25', '20,000', '85\xa0%')
        >>> number(3.14159, 3), number(2.5e6), number(1e-8), number(0.5, decimals=2)
        ('3.14', '2.5 × 10⁶', '10⁻⁸', '0.50')
    """
    if digits is not None and decimals is not None:
        raise ValueError(f"give `digits` or `decimals`, not both; got digits={digits}, decimals={decimals}")
    for name, n, low in (("digits", digits, 1), ("decimals", decimals, 0)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < low):
            raise ValueError(f"`{name}` must be an int ≥ {low}; got {n!r}")
    arr = np.asarray(x)
    if arr.ndim != 0 or arr.dtype.kind not in "biuf" or not np.isfinite(arr):
        raise ValueError(f"`x` must be a finite real number; got {x!r}")
    value = arr.item()
    if percent:
        return number(100 * value, digits, decimals=decimals) + "\u00a0%"  # a no-break space
    if isinstance(value, (bool, int)) and decimals is None:
        text = f"{value:,}"
    elif decimals is not None:
        text = f"{value:,.{decimals}f}"
    else:
        digits = 2 if digits is None else int(digits)
        mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
        exponent = int(exponent)
        if -3 <= exponent < 5:
            text = f"{float(f'{value:.{digits - 1}e}'):,.{max(digits - 1 - exponent, 0)}f}"
            text = text.rstrip("0").rstrip(".") if "." in text else text
        else:
            mantissa = mantissa.rstrip("0").rstrip(".")
            power = "10" + str(exponent).translate(_SUPERSCRIPT)
            text = power if mantissa in ("1", "-1") else f"{mantissa} × {power}"
            text = "-" + text if mantissa == "-1" else text
    if text.startswith("-") and not text.strip("-0.,"):  # rounded to zero: no sign
        text = text[1:]
    return text.replace("-", _MINUS)


_GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value, *, digits: int | None = None, decimals: int | None = None, percent: bool = False):
    """Record ``value`` under ``name`` for the book's prose, and return it.

    The text quotes it as ``{glue:text}`name```. With ``digits``, ``decimals`` or
    ``percent`` what is recorded is ``number(value, ...)``, the value typeset
    (1.6 × 10⁻⁵, a true minus sign): quote it without a format spec. Without them the
    value itself is recorded, and ``{glue:text}`name:.3g``` formats it (myst-nb's glue
    protocol; NumPy and JAX scalars are recorded as Python numbers, so a format spec
    applies to them). Nothing is shown in the notebook. Without IPython (a plain script)
    it only returns ``value``.

    Raises:
        ValueError: what :func:`number` raises, when a format is asked for.

    Example:
        >>> slope, _ = glue("slope", loglog_slope([10, 100, 1000], [1.0, 0.1, 0.01]))
        >>> round(slope, 6)  # outside a notebook glue only returns its value
        -1.0
        >>> glue("tiny", 1.62e-5, digits=2)  # the prose quotes {glue:text}`tiny`: 1.6 × 10⁻⁵
        1.62e-05
    """
    recorded = value
    if digits is not None or decimals is not None or percent:
        recorded = number(value, digits, decimals=decimals, percent=percent)
    try:
        from IPython import get_ipython
        from IPython.core.formatters import format_display_data
        from IPython.display import display
    except ImportError:  # a plain Python process: nothing to record into
        return value
    if get_ipython() is None:
        return value
    shown = recorded
    if np.ndim(recorded) == 0 and not isinstance(recorded, (str, bytes)):
        item = np.asarray(recorded).item()
        shown = item if isinstance(item, (bool, int, float)) else recorded
    bundle, metadata = format_display_data(shown)
    metadata["scrapbook"] = dict(name=name, mime_prefix=_GLUE_PREFIX)
    display({_GLUE_PREFIX + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)
    return value


def legend(fig, *, where: str = "below", ncol: int | None = None, **kwargs):
    """One legend for every labelled artist of ``fig``, outside the axes.

    Labels repeated across panels are listed once. ``where="below"`` puts it under the
    panels, in ``ncol`` columns (default: all entries on as few rows as fit, at most 4 a
    row); ``where="right"`` beside them, in one column. Further keyword arguments go to
    ``fig.legend``. Returns the legend (``None`` when nothing is labelled).
    """
    if where not in ("below", "right"):
        raise ValueError(f"`where` must be 'below' or 'right'; got {where!r}")
    entries = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if not entries:
        return None
    if where == "below":
        ncol = ncol or min(len(entries), 4)
        loc = "outside lower center"
    else:
        ncol = ncol or 1
        loc = "outside right upper"
    return fig.legend(list(entries.values()), list(entries), loc=loc, ncol=ncol, **kwargs)


def figure_problems(fig) -> list[str]:
    """The rules of the book's figures that ``fig`` breaks, in words (empty when it keeps them all).

    The rules: ``fig`` is between 0.85 and 1 column wide (:data:`COLUMN_WIDTH`: shown at its
    own size, and at least 1200 px wide as a retina PNG); every visible text is at least
    :data:`MIN_FONT_PT` points; no legend overlaps the data area of any axes.
    """
    from matplotlib.text import Text

    width = fig.get_figwidth()
    problems = []
    if not 0.85 * COLUMN_WIDTH <= width <= COLUMN_WIDTH + 1e-9:
        problems.append(f"it is {width:.2f} in wide, not between {0.85 * COLUMN_WIDTH:.2f} and {COLUMN_WIDTH} "
                        "(the column)")
    fig.canvas.draw()  # lays out ticks, labels and legends
    small = sorted({f"{t.get_text()!r} ({t.get_fontsize():.1f} pt)" for t in fig.findobj(Text)
                    if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_FONT_PT - 1e-9})
    if small:
        problems.append(f"texts under {MIN_FONT_PT} pt: {', '.join(small[:5])}")
    renderer = fig.canvas.get_renderer()
    legends = [leg for leg in (*fig.legends, *(ax.get_legend() for ax in fig.axes)) if leg and leg.get_visible()]
    data_areas = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_label() != "<colorbar>"]
    if any(leg.get_window_extent(renderer).overlaps(area) for leg in legends for area in data_areas):
        problems.append("a legend lies on the data (use gmlib.plotting.legend, or place it beside the axes)")
    return problems


def check_figure(fig) -> None:
    """Raise ``ValueError`` naming every rule of :func:`figure_problems` that ``fig`` breaks."""
    if problems := figure_problems(fig):
        raise ValueError("`fig` breaks the book's figure rules: " + "; ".join(problems))


class Table:
    """A table of results shown as HTML in a notebook (plain text elsewhere).

    Args:
        columns: the column headers.
        rows: one sequence per row, as many entries as ``columns``. Finite real numbers
            are typeset by :func:`number` (integers in full, floats to ``digits``
            significant digits), other entries shown as ``str``.
        digits: significant digits of the floats.

    Example:
        >>> Table(["L", "excess"], [(16, 0.0123456), (1024, -2.5e-5)])
           L   excess
          16   0.0123
        1,024  −2.5 × 10⁻⁵
    """

    def __init__(self, columns, rows, *, digits: int = 3):
        self.columns = [str(c) for c in columns]
        self.rows = [list(r) for r in rows]
        if any(len(r) != len(self.columns) for r in self.rows):
            raise ValueError(f"every row of `rows` must have {len(self.columns)} entries, one per column")
        self.digits = digits

    def _cell(self, value) -> str:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
                or not np.isfinite(value):
            return str(value)
        return number(value, None if isinstance(value, (int, np.integer)) else self.digits)

    def _repr_html_(self) -> str:
        from html import escape

        head = "".join(f"<th>{escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{escape(self._cell(v))}</td>" for v in r) + "</tr>" for r in self.rows)
        return f'<table class="gmlib-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'

    def __repr__(self) -> str:
        cells = [self.columns, *([self._cell(v) for v in r] for r in self.rows)]
        widths = [max(len(row[j]) for row in cells) for j in range(len(self.columns))]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


class _HTML:
    """HTML that a notebook displays (``_repr_html_``); the text is ``.html``."""

    def __init__(self, html: str):
        self.html = html

    def _repr_html_(self) -> str:
        return self.html


def animation_html(anim, *, alt: str, dpi: float = 100, max_bytes: int = 3_000_000):
    """A ``matplotlib.animation.Animation`` as a self-contained HTML player for the page.

    Rendered with ``to_jshtml`` (frames as embedded PNGs, no ffmpeg) at ``dpi`` (100: frames
    at their displayed size), without the Font Awesome stylesheet it would fetch from a CDN
    (the book's theme draws the buttons; elsewhere they show without icons and still work).
    The frames carry ``alt`` as their text alternative and the frame slider is labelled
    "Frame" (WCAG 2.1 AA: matplotlib's player has neither); its buttons are buttons, so the
    player works from the keyboard.

    Args:
        anim: the animation.
        alt: what the animation shows, in a sentence (its caption's first sentence, say).
        dpi: the frames' resolution.
        max_bytes: the most the player may weigh on the page.

    Returns:
        an object a notebook shows as the player (its text is ``.html``).

    Raises:
        ValueError: naming ``alt`` when it is empty, or when the page would carry more
            than ``max_bytes`` of it (fewer frames, a lower ``dpi`` or a smaller figure fix that).
    """
    import html as html_lib
    import re

    import matplotlib

    if not isinstance(alt, str) or not alt.strip():
        raise ValueError(f"`alt` must be a sentence saying what the animation shows; got {alt!r}")
    with matplotlib.rc_context({"savefig.dpi": dpi}):
        html = anim.to_jshtml(default_mode="once")
    html = re.sub(r'<link rel="stylesheet"\s+href="https?://[^"]*font-awesome[^>]*>', "", html)
    html = html.replace('<img id="_anim_img', f'<img alt="{html_lib.escape(alt)}" id="_anim_img', 1)
    html = html.replace('<input id="_anim_slider', '<input aria-label="Frame" id="_anim_slider', 1)
    if len(html) > max_bytes:
        raise ValueError(f"the animation takes {len(html):,} bytes, over `max_bytes` = {max_bytes:,}")
    return _HTML(html)
