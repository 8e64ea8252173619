"""The PDF edition (`make pdf`: _build/latex/book.pdf), read back as a reader gets it.

Skipped with a reason until `make pdf` has built it (it needs the built book and TeX Live;
`.ci/run` builds it after `make test` and runs this file). Read with poppler (`pdftotext`;
`pdftohtml -xml` where the font or a link matters; `pdfimages -list`) against the built site
(`_build/html`), the PDF must hold every page's title of `_toc.yml`; embed at least as many
images as the pages show figures (each animation as one still with a link to it online, the
solutions' figures left out); hold every exercise, numbered as on the site, and no solution;
and leave no formula as TeX in the prose, no figure as its `<Figure size ...>` text, no output
as an object's repr, no ANSI colour code from a captured stream, no link relative to a page
it does not have. XeLaTeX's log must name no character missing from the fonts and no
undefined reference. The detectors are tested on planted text, with or without a PDF.
"""

from __future__ import annotations

import html
import html.parser
import pathlib
import re
import shutil
import subprocess
import sys
import unicodedata

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import pdf_edition

PDF = ROOT / "_build" / "latex" / "book.pdf"
HTML = ROOT / "_build" / "html"

#: TeX that a formula left in the prose when it failed to become math.
RAW_TEX = re.compile(r"\\[A-Za-z]+|\$\$|\$[^$\n]{1,80}\$|\\[()\[\]]")
#: What myst-nb prints for an output it could not show (jupyter-book #1429's glued figures).
PLACEHOLDER = re.compile(r"<Figure size [^>]*>|<(?:IPython|matplotlib|gmlib)\.[\w.]+|<[\w.]+ object at 0x[0-9a-fA-F]+>")
#: An ANSI escape sequence, or what is left of one once the escape character is dropped.
ANSI = re.compile(r"\x1b|\[(?:\d{1,3};)*\d{1,3}m")
#: A ``to_jshtml`` player's frame (gmlib.plotting.animation_html), one per animation.
PLAYER = re.compile(r'<img [^>]*id="_anim_img')
#: The sentence under each animation's still.
ANIMATION_NOTE = pdf_edition.ANIMATION_NOTE


def raw_tex(text: str) -> list[str]:
    """The TeX fragments of ``text`` (prose: code is read apart, see :func:`prose`)."""
    return [m.group(0) for m in RAW_TEX.finditer(text)]


def placeholders(text: str) -> list[str]:
    return [m.group(0) for m in PLACEHOLDER.finditer(text)]


def ansi_codes(text: str) -> list[str]:
    return [m.group(0) for m in ANSI.finditer(text)]


def missing_characters(log: str) -> list[str]:
    """The characters XeLaTeX's log says a font lacks (its lines, broken at 79 characters,
    joined again first)."""
    return sorted(set(re.findall(r"Missing character: There is no (\S+) \(U\+", log.replace("\n", ""))))


def undefined_references(log: str) -> list[str]:
    """The links, ``\\ref`` and ``\\cite`` whose target LaTeX never saw (printed as ??)."""
    found = re.findall(r"LaTeX Warning: (?:Hyper reference|Reference|Citation) `([^']+)'", log.replace("\n", ""))
    return sorted(set(found))


def squeeze(text: str) -> str:
    """``text`` reduced to its lower-case letters and digits: line breaks, hyphenation, case
    (the chapter heads are in capitals) and typography (’ for ') no longer matter."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).lower() if ch.isalnum())


def toc_docnames() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    names = [toc["root"]]
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        names += [entry["file"] for entry in part.get("chapters", []) if "file" in entry]
    return [re.sub(r"\.(md|ipynb)$", "", name) for name in names]


def title(docname: str) -> str:
    """The first heading of a page: its .md (a chapter's MyST twin), else its notebook."""
    md = ROOT / f"{docname}.md"
    if md.exists():
        text = md.read_text(encoding="utf-8")
    else:
        import nbformat

        nb = nbformat.read(ROOT / f"{docname}.ipynb", as_version=4)
        text = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.DOTALL)  # front matter
    text = re.sub(r"^(`{3,}|:{3,}).*?^\1", "", text, flags=re.DOTALL | re.MULTILINE)  # fenced blocks
    match = re.search(r"^# (.+)$", text, flags=re.MULTILINE)
    assert match, f"{docname} has no title heading"
    return match.group(1)


def title_words(heading: str) -> list[str]:
    """The parts of a heading that are words (math and markup dropped), squeezed."""
    heading = re.sub(r"\{[\w:-]+\}`([^`]*)`", r"\1", heading).replace("`", "")
    return [s for s in (squeeze(p) for p in re.split(r"\$[^$]*\$", heading)) if s]


class _Figures(html.parser.HTMLParser):
    """Counts the images of a page's article that the PDF prints too: not those of a solution
    (left out of the PDF) nor of a cell folded away whole (``hide-cell``, ``hide-output``,
    which sphinx-jupyterbook-latex leaves out)."""

    SKIP = frozenset({"solution", "tag_hide-cell", "tag_hide-output"})
    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                      "wbr"})

    def __init__(self):
        super().__init__()
        self.stack: list[tuple[bool, bool]] = []  # (in the article, skipped)
        self.count = 0

    def handle_starttag(self, tag, attrs):
        classes = set((dict(attrs).get("class") or "").split())
        article, skipped = self.stack[-1] if self.stack else (False, False)
        article = article or "bd-article" in classes
        skipped = skipped or bool(classes & self.SKIP)
        if tag == "img" and article and not skipped:
            self.count += 1
        if tag not in self.VOID:
            self.stack.append((article, skipped))

    def handle_endtag(self, tag):
        if tag not in self.VOID and self.stack:
            self.stack.pop()


def figures_in_html(page: str) -> int:
    parser = _Figures()
    parser.feed(page)
    return parser.count


def pdf_xml(pdf: pathlib.Path) -> str:
    """The PDF as poppler's XML: each run of text with its font, and its links."""
    return subprocess.run(["pdftohtml", "-xml", "-i", "-stdout", "-q", str(pdf)], check=True,
                          capture_output=True, text=True, errors="replace").stdout


def links(pdf: pathlib.Path) -> list[str]:
    """Every link target of the PDF (its own pages show as ``book.html#N``)."""
    return [html.unescape(h) for h in re.findall(r'<a href="([^"]*)"', pdf_xml(pdf))]


def prose(pdf: pathlib.Path) -> str:
    """The PDF's text outside code and outputs (whatever is not set in a monospaced font)."""
    xml = pdf_xml(pdf)
    mono = {m.group(1) for m in re.finditer(r'<fontspec id="(\d+)"[^>]*family="[^"]*Mono[^"]*"', xml)}
    lines = []
    for m in re.finditer(r'<text [^>]*font="(\d+)"[^>]*>(.*?)</text>', xml):
        if m.group(1) not in mono:
            lines.append(html.unescape(re.sub(r"<[^>]+>", "", m.group(2))))
    return "\n".join(lines)


# ---- the detectors, on planted text -------------------------------------------------


@pytest.mark.parametrize("text", [r"where \begin{aligned} x", r"the gate \frac{1}{2}", "$$ x $$",
                                  r"in \mathbb{R}^D", r"at $\beta$ here", r"\(x\)"])
def test_raw_tex_is_found(text):
    assert raw_tex(text)


@pytest.mark.parametrize("text", ["plain prose, with 1.5 and − and × here", "costs 5 dollars", "a/b and {x}"])
def test_prose_is_not_raw_tex(text):
    assert not raw_tex(text)


def test_placeholders_and_ansi_are_found():
    assert placeholders("<Figure size 700x360 with 1 Axes>") == ["<Figure size 700x360 with 1 Axes>"]
    assert placeholders("<IPython.core.display.HTML object>") and placeholders("<matplotlib.animation.Func")
    assert placeholders("<gmlib.plotting._HTML object at 0x7f3a2b1c>")
    assert not placeholders("x < y and Figure 3 > Figure 2")
    assert ansi_codes("\x1b[0;31mValueError") and ansi_codes("[1;32mok") and not ansi_codes("a[1] and [2]")


def test_log_problems_are_found():
    log = ("Missing character: There is no \u1d40 (U+1D40) in font FreeSans/OT:script=latn;lang\nuage=dflt;!\n"
           "LaTeX Warning: Hyper reference `book/01_gaussian_prompts:ex-gauss-ess' on pa\nge 231 undefined on\n"
           "LaTeX Warning: Citation `gabet2026' on page 3 undefined on input line 9.\n")
    assert missing_characters(log) == ["\u1d40"]
    assert undefined_references(log) == ["book/01_gaussian_prompts:ex-gauss-ess", "gabet2026"]
    assert missing_characters("Missing character: none") == [] == undefined_references("LaTeX Warning: Label(s) may")


def test_site_address():
    assert pdf_edition.site_address("https://github.com/Gmlib-Book/softmax-attention") == \
        "https://gmlib-book.github.io/softmax-attention/"
    assert pdf_edition.site_address("https://github.com/a/b", "https://book.example.org") == "https://book.example.org/"
    with pytest.raises(ValueError, match="html.baseurl"):
        pdf_edition.site_address("https://gitlab.com/a/b")


def test_titles_and_figures_are_read():
    assert title_words(r"Degenerate mixtures: $\gamma = 0$ and {math}`x` `code`") == ["degeneratemixtures", "andxcode"]
    page = ('<body><img src="logo.png"><article class="bd-article"><img src="a.png"><br>'
            '<div class="solution dropdown"><p><img src="s.png"></p></div>'
            '<div class="cell tag_hide-cell"><img src="h.png"></div><img src="b.png"></article></body>')
    assert figures_in_html(page) == 2


# ---- the PDF -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pdf_text():
    if not PDF.exists():
        pytest.skip(f"no PDF at {PDF.relative_to(ROOT)} (`make pdf` builds it, after `make book`)")
    for tool in ("pdftotext", "pdfimages", "pdftohtml"):
        if shutil.which(tool) is None:
            pytest.skip(f"`{tool}` is missing (Debian's poppler-utils; `make pdf` installs it)")
    return subprocess.run(["pdftotext", "-enc", "UTF-8", str(PDF), "-"], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture(scope="module")
def site_pages(pdf_text):
    """The built site's page of each entry of `_toc.yml`, as HTML text."""
    if not (HTML / "index.html").exists():
        pytest.skip("no built site to compare the PDF with (`make book`)")
    return {d: (HTML / f"{d}.html").read_text(encoding="utf-8") for d in toc_docnames() if (HTML / f"{d}.html").exists()}


def test_every_page_title_is_in_the_pdf(pdf_text):
    text = squeeze(pdf_text)
    missing = []
    for docname in toc_docnames():
        heading = title(docname)
        # once in the table of contents and once as the chapter's head (the root page's
        # title is the book's, on the title page and in the running heads)
        if not all(text.count(w) >= 2 for w in title_words(heading)):
            missing.append(f"{docname}: {heading!r}")
    assert not missing, "titles missing from the PDF: " + "; ".join(missing)


def test_every_figure_is_an_image_in_the_pdf(site_pages):
    figures = {d: figures_in_html(page) for d, page in site_pages.items()}
    listing = subprocess.run(["pdfimages", "-list", str(PDF)], check=True, capture_output=True, text=True).stdout
    images = sum(1 for line in listing.splitlines()[2:] if line.split()[2:3] == ["image"])  # not "smask"
    assert sum(figures.values()) > 0
    assert images >= sum(figures.values()), (
        f"the PDF embeds {images} images; the pages show {sum(figures.values())} figures "
        f"({', '.join(f'{d}: {n}' for d, n in figures.items() if n)})")


def test_each_animation_is_a_still_with_a_pointer(pdf_text, site_pages):
    players = sum(len(PLAYER.findall(page)) for page in site_pages.values())
    assert players > 0
    assert squeeze(pdf_text).count(squeeze(ANIMATION_NOTE)) == players
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    site = pdf_edition.site_address(config["repository"]["url"], config.get("html", {}).get("baseurl", ""))
    to_figures = {u for u in links(PDF) if re.fullmatch(re.escape(site) + r"book/\d\d_\w+\.html#fig-[\w-]+", u)}
    assert len(to_figures) == players, f"an animation's note should link its figure online: {sorted(to_figures)}"


def test_no_link_is_relative(pdf_text):
    # a page's link to a file of the site (../student/NN_*.ipynb) must point online
    relative = [u for u in links(PDF) if not re.match(r"[a-z]+:|book\.html#\d+$", u)]
    assert not relative, f"links the PDF cannot follow: {sorted(set(relative))[:10]}"


def test_no_raw_tex_in_the_prose(pdf_text):
    found = raw_tex(prose(PDF))
    assert not found, f"TeX left in the PDF's prose: {sorted(set(found))[:20]}"


def test_no_placeholder_repr_or_ansi_code(pdf_text):
    assert not placeholders(pdf_text), f"outputs printed as text: {sorted(set(placeholders(pdf_text)))[:20]}"
    assert not ansi_codes(pdf_text), f"ANSI codes in the PDF: {sorted(set(map(repr, ansi_codes(pdf_text))))[:20]}"


def test_every_exercise_is_in_the_pdf_numbered_as_on_the_site(pdf_text, site_pages):
    site = {n for page in site_pages.values() for n in re.findall(r'caption-number">(Exercise [\d.]+\d)', page)}
    assert site
    missing = sorted(site - set(re.findall(r"Exercise \d+(?:\.\d+)+", pdf_text)))
    assert not missing, f"exercises missing or numbered otherwise in the PDF: {missing[:10]}"


def test_solutions_are_left_out(pdf_text):
    # book/intro.md says so; sphinx-exercise titles a solution "Solution to Exercise N"
    assert "Solution to" not in pdf_text


def test_no_character_is_missing_from_the_fonts(pdf_text):
    missing = missing_characters(PDF.with_suffix(".log").read_text(encoding="utf-8", errors="replace"))
    assert not missing, f"characters the PDF's fonts lack (_config.yml: latex_elements): {missing}"


def test_every_reference_and_citation_resolves(pdf_text):
    undefined = undefined_references(PDF.with_suffix(".log").read_text(encoding="utf-8", errors="replace"))
    assert not undefined, f"references with no target in the PDF: {undefined[:10]}"
