"""gmlib.plotting: the log-log fit against exact power laws, its bad input, and glue."""

import re

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from strategies import SETTINGS, floats, nonfinite

from gmlib import plotting
from gmlib.plotting import glue, loglog_slope


@SETTINGS
@given(p=floats(-3.0, 3.0), logc=floats(-5.0, 5.0),
       x=hnp.arrays(np.float64, st.integers(2, 12), elements=floats(1e-3, 1e3), unique=True))
def test_loglog_slope_recovers_power_laws(p, logc, x):
    """y = c x^p gives (p, log c)."""
    assume(np.ptp(np.log(x)) > 1e-3)
    slope, intercept = loglog_slope(x, np.exp(logc) * x**p)
    np.testing.assert_allclose([slope, intercept], [p, logc], atol=1e-6 * (1 + abs(p)) / min(1, np.ptp(np.log(x))))


@SETTINGS
@given(p=floats(-3.0, 3.0), x=hnp.arrays(np.float64, st.integers(2, 12), elements=floats(1e-3, 1e3), unique=True),
       lam=floats(0.1, 10.0))
def test_loglog_slope_rescaling_shifts_the_intercept(p, x, lam):
    """Rescaling x by λ shifts the intercept by -p log λ."""
    assume(np.ptp(np.log(x)) > 1e-3)
    slope, intercept = loglog_slope(x, x**p)
    _, intercept2 = loglog_slope(lam * x, x**p)
    np.testing.assert_allclose(intercept2, intercept - slope * np.log(lam),
                               atol=1e-5 * (1 + abs(p)) / min(1, np.ptp(np.log(x))))


@SETTINGS
@given(x=hnp.arrays(np.float64, st.integers(2, 6), elements=floats(0.1, 10.0), unique=True), data=st.data())
def test_loglog_slope_rejects_invalid(x, data):
    y = x**2
    how = data.draw(st.sampled_from(["nonpositive", "nonfinite", "mismatch", "rank", "short"]))
    if how == "nonpositive":
        bad = x.copy()
        bad[data.draw(st.integers(0, x.size - 1))] = data.draw(st.sampled_from([0.0, -1.0]))
    elif how == "nonfinite":
        bad = nonfinite(x, data.draw)
    elif how == "mismatch":
        bad = np.concatenate([x, x[:1] * 2])
    elif how == "rank":
        bad = x[None]
    else:
        bad = x[:1]
    other = {"rank": y[None], "short": y[:1], "mismatch": y}.get(how, y)
    args = (bad, other) if data.draw(st.booleans()) else (other, bad)
    with pytest.raises(ValueError, match="`x`|`y`"):
        loglog_slope(*args)


@pytest.mark.parametrize("x, y", [
    ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]),  # identical x: LinAlgError / a meaningless slope
    ([1j, 2j], [1.0, 2.0]),  # complex: TypeError
    (["a", "b"], [1.0, 2.0]),  # strings: numpy's message, naming nothing
    ([1e200, 1e201], [1e200, 1e201]),  # finite but x * y overflows: wrongly refused
], ids=["identical-x", "complex", "strings", "overflowing-product"])
def test_loglog_slope_edge_cases(x, y):
    try:
        slope, _ = loglog_slope(x, y)
    except ValueError as exc:
        assert "`x`" in str(exc) and "could not convert" not in str(exc) and "positive and finite" not in str(exc)
        return
    assert np.isfinite(slope) and abs(slope - 1) < 1e-9


def test_glue_returns_its_value_outside_a_notebook():
    value = np.float64(0.25)
    assert glue("x", value) is value


def test_style_is_a_plain_dict_of_rc_settings():
    import matplotlib

    assert set(plotting.STYLE) <= set(matplotlib.rcParams) and len(plotting.PALETTE) == 8
    sizes = [v for k, v in plotting.STYLE.items() if k.endswith("size") and k not in ("lines.markersize", "figure.figsize")]
    assert sizes and min(sizes) >= plotting.MIN_FONT_PT
    assert plotting.STYLE["figure.figsize"][0] == plotting.COLUMN_WIDTH


@pytest.fixture
def styled():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.style.context(plotting.STYLE):
        yield plt
    plt.close("all")


@pytest.mark.smoke
def test_a_figure_in_the_style_with_a_shared_legend_passes(styled):
    fig, axes = styled.subplots(1, 2)
    for ax in axes:
        ax.plot([1, 2, 3], [1, 4, 9], label="squares")
        ax.plot([1, 2, 3], [2, 3, 4], label="line")
    leg = plotting.legend(fig)
    assert [t.get_text() for t in leg.get_texts()] == ["squares", "line"]  # once each, not once per panel
    assert plotting.figure_problems(fig) == []
    plotting.check_figure(fig)
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=2 * fig.dpi, bbox_inches="tight")  # what the retina inline backend does
    assert Image.open(buf).size[0] >= 1200


@pytest.mark.parametrize("breakage, message", [
    ("wide", "wide"), ("narrow", "wide"), ("small font", "under 9"), ("legend on data", "legend lies on the data"),
])
def test_check_figure_names_each_broken_rule(styled, breakage, message):
    width = {"wide": 10.0, "narrow": 4.0}.get(breakage, plotting.COLUMN_WIDTH)
    fig, ax = styled.subplots(figsize=(width, 3))
    ax.plot([0, 1, 2], [0, 1, 0], label="tent")
    if breakage == "small font":
        ax.set_title("a title", fontsize=8)
    if breakage == "legend on data":
        ax.legend(loc="center")
    else:
        plotting.legend(fig, where="right")
    with pytest.raises(ValueError, match=f"`fig`.*{message}"):
        plotting.check_figure(fig)


def test_legend_refuses_an_unknown_place(styled):
    fig, ax = styled.subplots()
    with pytest.raises(ValueError, match="`where`"):
        plotting.legend(fig, where="inside")
    assert plotting.legend(fig) is None  # nothing labelled


@pytest.mark.smoke
def test_table_rounds_numbers_and_escapes_text():
    table = plotting.Table(["L", "excess <risk>"], [(16, 0.0123456), (1024, 2.5e-5)], digits=2)
    html = table._repr_html_()
    assert "<td>0.012</td>" in html and "<td>1,024</td>" in html and "<td>2.5 × 10⁻⁵</td>" in html
    assert "excess &lt;risk&gt;" in html and "0.0123456" not in repr(table)
    with pytest.raises(ValueError, match="`rows`"):
        plotting.Table(["a", "b"], [(1, 2), (3,)])


def test_animation_html_is_self_contained_and_bounded(styled):
    from matplotlib.animation import FuncAnimation

    fig, ax = styled.subplots()
    (line,) = ax.plot([], [])
    ax.set(xlim=(0, 3), ylim=(0, 9))
    anim = FuncAnimation(fig, lambda i: line.set_data(range(i + 1), [k * k for k in range(i + 1)]), frames=3)
    html = plotting.animation_html(anim, alt="A parabola <drawn> point by point.").html
    assert "_anim_img" in html and html.count("data:image/png;base64") >= 3  # the frames are embedded
    assert "font-awesome" not in html and "https://" not in html  # nothing fetched from outside the page
    # a text alternative for the frames (escaped), a label for the slider (WCAG 2.1 AA)
    assert re.search(r'<img alt="A parabola &lt;drawn&gt; point by point\." id="_anim_img', html)
    assert re.search(r'<input aria-label="Frame" id="_anim_slider[^>]*type="range"', html)
    with pytest.raises(ValueError, match="`max_bytes`"):
        plotting.animation_html(anim, alt="A parabola.", max_bytes=len(html) // 2)
    with pytest.raises(ValueError, match="`alt`"):
        plotting.animation_html(anim, alt=" ")


@pytest.mark.smoke
@pytest.mark.parametrize("x, kwargs, text", [
    (1.62e-5, {}, "1.6 × 10⁻⁵"),
    (-1.62e-5, {}, "\u22121.6 × 10⁻⁵"),  # a true minus sign, U+2212
    (1e-8, {}, "10⁻⁸"),  # a mantissa of 1 is left out
    (-1e-8, {}, "\u221210⁻⁸"),
    (2.5e6, {"digits": 3}, "2.5 × 10⁶"),  # trailing zeros dropped
    (123456.0, {"digits": 3}, "1.23 × 10⁵"),
    (12345.0, {}, "12,000"),  # positional below 10⁵, with a thousands separator
    (0.00099996, {}, "0.001"),  # rounded first, then the notation chosen
    (0.000999, {}, "0.001"),
    (0.0009, {}, "9 × 10⁻⁴"),
    (3.14159, {"digits": 3}, "3.14"),
    (9.96, {}, "10"),
    (0.0, {}, "0"),
    (-0.0, {}, "0"),
    (-0.25, {}, "\u22120.25"),
    (20_000, {}, "20,000"),  # an integer in full
    (np.int64(-1234567), {}, "\u22121,234,567"),
    (0.5, {"decimals": 2}, "0.50"),  # decimals keep their zeros
    (-0.001, {"decimals": 2}, "0.00"),  # rounded to zero: no sign
    (1234.5, {"decimals": 1}, "1,234.5"),
    (0.8512, {"percent": True}, "85\u00a0%"),  # after a no-break space
    (0.8512, {"percent": True, "decimals": 1}, "85.1\u00a0%"),
    (np.float32(0.1), {"digits": 3}, "0.1"),
])
def test_number_typesets(x, kwargs, text):
    assert plotting.number(x, **kwargs) == text


_SUP = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")


def test_number_agrees_with_python_rounding():
    """Positional or not, the digits are those of Python's own rounding (an independent format)."""
    rng = np.random.default_rng(0)
    for x in 10.0 ** rng.uniform(-9, 9, 300) * rng.choice([-1, 1], 300):
        for digits in (1, 2, 3, 4):
            text = plotting.number(x, digits).replace("\u2212", "-").replace(",", "")
            if "⁻" in text or any(c in text for c in "⁰¹²³⁴⁵⁶⁷⁸⁹"):  # m × 10ᵉ, or 10ᵉ alone
                head, _, power = text.rpartition("10")
                mantissa = head.replace(" × ", "") or "1"
                value = float("-1" if mantissa == "-" else mantissa) * 10.0 ** int(power.translate(_SUP))
            else:
                value = float(text)
            assert value == pytest.approx(float(f"{x:.{digits - 1}e}"), rel=1e-12), (x, digits, text)


@pytest.mark.parametrize("x, kwargs, match", [
    (float("nan"), {}, "`x`"), (float("inf"), {}, "`x`"), ("0.5", {}, "`x`"), ([1.0, 2.0], {}, "`x`"),
    (1 + 2j, {}, "`x`"), (0.5, {"digits": 0}, "`digits`"), (0.5, {"digits": 2.0}, "`digits`"),
    (0.5, {"decimals": -1}, "`decimals`"), (0.5, {"digits": 2, "decimals": 2}, "`digits` or `decimals`"),
])
def test_number_refuses_what_it_cannot_typeset(x, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plotting.number(x, **kwargs)
