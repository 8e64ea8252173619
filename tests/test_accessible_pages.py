"""book/_ext/accessible_pages.py: each correction on the HTML the themes write, and nothing else.

The snippets are the themes' own markup (pydata-sphinx-theme 0.16, myst-nb 1.x, docutils
0.21, as built into _build/html); the site check (tests/site_check.py) runs axe-core on the
whole built site, this test the rules one by one.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import accessible_pages as A  # noqa: E402

SEARCH = ('<button class="btn search-button-field search-button__button pst-js-only" title="Search" '
          'aria-label="Search" data-bs-placement="bottom" data-bs-toggle="tooltip">')
SEARCH_ICON = ('<button class="btn btn-sm pst-navbar-icon search-button search-button__button pst-js-only" '
               'title="Search" aria-label="Search" data-bs-placement="bottom" data-bs-toggle="tooltip">')
THEME = '<i class="theme-switch fa-solid fa-moon               fa-lg" data-mode="dark"  title="Dark"></i>'
SUMMARY = '<summary aria-label="Toggle hidden content">\n<p class="collapsed admonition-title">Show'
ENTRY = '<div class="citation" id="id3" role="doc-biblioentry">'
FIGURE = '''<figure class="align-default" id="fig-tempered">
<a class="reference internal image-reference" href="../_images/172b.png"><img alt="../_images/172b.png" \
src="../_images/172b.png" style="width: 709px;" />
</a>
<figcaption>
<p><span class="caption-number">Fig. 7.1 </span><span class="caption-text">Beyond the paper. Excess risk of \
the heads <span class="math notranslate nohighlight">\\(U_1 = cS^{-1}\\)</span> &amp; more, against c. A second \
sentence.</span><a class="headerlink" href="#fig-tempered" title="Link to this image">#</a></p>
</figcaption>
</figure>'''


def test_the_search_field_is_named_by_its_text_and_the_icon_button_keeps_its_name():
    assert A.fix_page(SEARCH) == SEARCH.replace(' aria-label="Search"', "")
    assert A.fix_page(SEARCH_ICON) == SEARCH_ICON  # no visible text: its aria-label is its name


def test_the_colour_mode_icons_lose_their_titles():
    assert A.fix_page(THEME) == THEME.replace('  title="Dark"', "")


def test_folded_cells_and_bibliography_entries():
    assert A.fix_page(SUMMARY) == SUMMARY.replace(' aria-label="Toggle hidden content"', "")
    assert A.fix_page(ENTRY) == ENTRY.replace("doc-biblioentry", "listitem")


def test_a_captioned_figure_takes_its_caption_as_alt():
    fixed = A.fix_page(FIGURE)
    alt = fixed.split('<img alt="', 1)[1].split('"', 1)[0]
    # the opening sentences, at least 80 characters, as text (the formula as its TeX, `&` escaped)
    assert alt == ("Beyond the paper. Excess risk of the heads U_1 = cS^{-1} &amp; more, against c. "
                   "A second sentence.")  # two sentences make 76 characters: a third
    assert fixed.replace(alt, "../_images/172b.png", 1) == FIGURE  # nothing else changes


def test_a_long_caption_is_cut_at_a_word():
    alt = A.caption_alt("word " * 200)
    assert alt.endswith(" …") and len(alt) <= 245 and "wor …" not in alt


def test_pages_without_those_elements_are_left_as_they_are():
    page = '<p>An <img alt="A described image" src="x.png"> and <figure><img alt="y.png"></figure></p>'
    assert A.fix_page(page) == page  # a figure without a caption: nothing to take its alt from
