"""Accessible names and roles the themes get wrong, corrected in the built pages (WCAG 2.1 AA).

Measured with axe-core in headless Chromium (``tests/site_check.py`` runs it on every page,
light and dark), the Jupyter Book 1 stack leaves four kinds of violation in pages the book
does not write itself. Each is a theme bug, worked around here after the HTML build (the
``build-finished`` event), so that every page the site serves is corrected, JavaScript or not:

* **label-content-name-mismatch** (WCAG 2.5.3, label in name): pydata-sphinx-theme's search
  field, whose visible text is "Search Ctrl+K", is named "Search" by its ``aria-label``; the
  colour-mode button holds three icons titled "Light", "Dark", "System Settings" beside its
  name "Color mode" (Font Awesome turns each title into the ``<title>`` of an inline SVG,
  text inside the button); myst-nb's folded cells name their ``<summary>`` "Toggle hidden
  content" while it shows "Show code cell source". The search field and the summaries take
  their visible text as their name (the ``aria-label`` goes); the icons lose their titles,
  and the button keeps its name and its tooltip.
* **aria-deprecated-role** and **aria-required-children** (WCAG 4.1.2): docutils marks each
  bibliography entry ``role="doc-biblioentry"``, deprecated in DPUB-ARIA 1.1, inside a
  ``role="list"``; the entries become ``role="listitem"``.
* **A figure's text alternative** (WCAG 1.1.1): myst-nb gives a notebook's figure the image's
  file name as its ``alt`` (``../_images/172b…png``), which a screen reader reads out; the
  image of a captioned figure takes the opening of its caption instead (:func:`caption_alt`).

Reported upstream in the book's notes on the accessibility issue (pydata-sphinx-theme,
myst-nb, docutils); remove a rule here when its project fixes it (the site check confirms).
"""

from __future__ import annotations

import html as html_lib
import pathlib
import re

#: (pattern, replacement, what it fixes): applied to every HTML page of the build.
FIXES = [
    (re.compile(r'(<button class="btn search-button-field[^"]*"[^>]*?) aria-label="Search"'), r"\1",
     "the search field is named by its visible text"),
    (re.compile(r'(<i class="theme-switch [^"]*" data-mode="\w+")\s+title="[^"]*"'), r"\1",
     "the colour-mode button's icons carry no title of their own"),
    (re.compile(r'<summary aria-label="Toggle hidden content">'), "<summary>",
     "a folded cell's summary is named by its visible text"),
    (re.compile(r'role="doc-biblioentry"'), 'role="listitem"',
     "bibliography entries are list items"),
]


_FIGURE = re.compile(r"<figure\b.*?</figure>", re.S)
_FILE_ALT = re.compile(r'<img alt="[^"]*\.(?:png|svg|jpe?g|gif)"')
_CAPTION = re.compile(r'<span class="caption-text">(.*?)</span><a class="headerlink"', re.S)


def caption_alt(caption_html: str, at_least: int = 80) -> str:
    """The opening sentences of a caption as plain text, at least ``at_least`` characters
    (a first sentence such as "Beyond the paper." says too little), formulas as their TeX."""
    text = re.sub(r"<[^>]+>", "", caption_html)
    text = html_lib.unescape(text).replace("\\(", "").replace("\\)", "")
    text = " ".join(text.split())
    sentences = re.split(r"(?<=[.:;])\s+(?=[A-Z(])", text)
    alt = ""
    for sentence in sentences:
        alt = f"{alt} {sentence}".strip()
        if len(alt) >= at_least:
            break
    return alt if len(alt) <= 3 * at_least else alt[:3 * at_least].rsplit(" ", 1)[0] + " …"


def _figure_alt(match: re.Match) -> str:
    figure = match.group(0)
    caption = _CAPTION.search(figure)
    if not caption or not _FILE_ALT.search(figure):
        return figure
    alt = html_lib.escape(caption_alt(caption.group(1)), quote=True)
    return _FILE_ALT.sub(lambda _: f'<img alt="{alt}"', figure, count=1)


def fix_page(html: str) -> str:
    """``html`` with every rule of :data:`FIXES` applied, and its captioned figures' images
    given their caption's opening as ``alt`` (a rule that matches nothing is a no-op)."""
    for pattern, replacement, _ in FIXES:
        html = pattern.sub(replacement, html)
    return _FIGURE.sub(_figure_alt, html)


def _fix_build(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    for path in pathlib.Path(app.outdir).rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        fixed = fix_page(text)
        if fixed != text:
            path.write_text(fixed, encoding="utf-8")


def setup(app):
    app.connect("build-finished", _fix_build)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
