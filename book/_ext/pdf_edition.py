"""The PDF edition: what the LaTeX builder needs that the web pages do not (``make pdf``).

Jupyter Book 1 writes the PDF with its ``pdflatex`` builder (sphinx-jupyterbook-latex,
XeLaTeX). The book's web pages hold eight things that a PDF cannot take as they are; this
extension fixes each for the LaTeX builder only, and leaves the HTML build untouched:

* **The MathJax macros** (``mathjax3_config.tex.macros`` in ``_config.yml``: ``\\R``, ``\\E``)
  are unknown to LaTeX: each becomes a ``\\newcommand`` in the preamble, so the macros are
  written once, for both editions.
* **bbm.sty**: sphinx-jupyterbook-latex's document class loads the ``bbm`` package (for its
  ``\\RR``, ``\\NN``, ... shortcuts, which the book does not use), and TeX Live ships it only
  in ``texlive-fonts-extra``, a 500 MB download for one font. A two-line ``bbm.sty`` in the
  LaTeX build folder (found before any installed one) defines ``\\mathbbm`` as
  ``\\mathbb``. The title page gives the book's version (gmlib's, from ``pyproject.toml``).
* **The animations** (``gmlib.plotting.animation_html``: matplotlib's ``to_jshtml`` player,
  ``text/html`` only) have no LaTeX form, and myst-nb would print their ``text/plain`` repr
  instead. Each player's last frame (a PNG inside the player) is added to its output as an
  ``image/png`` alternative, which the LaTeX builder's mime priority chooses
  (``nb_mime_priority_overrides``), with a sentence under it that points to the animation in
  the online edition (:func:`site_address`, the chapter's page and the figure's anchor).
* **Links to the site's own files** (a chapter's student notebook, ``../student/...``) are
  relative to the page; in the PDF they point to the file online.
* **The Reference pages** (the parts of ``_toc.yml`` after the numbered chapters), which the
  site leaves unnumbered, are appendices A, B, ... rather than chapters counted on.
* **Exercises and theorems** are numbered as on the site (Exercise 1.2, not 1.7.2).
* **References to an exercise or a theorem** link to it: sphinx-exercise's LaTeX labels lack
  the page's name, and sphinx-proof's name the page ``None`` for a theorem whose section is
  not the page's first.
* **The solutions** of the exercises (sphinx-exercise, in words or gated with their code
  cells) are left out of the PDF, as the book's introduction says: a printed chapter is a
  student's copy; the online edition keeps them folded under each exercise.

The PDF is made from the executed book, never by executing it again: ``make pdf`` first runs
this file as a script, which fails naming each chapter that the build's jupyter-cache
(``_build/.jupyter_cache``, filled by ``make book`` or ``make strict``) lacks or holds with
other code. The PDF then shows exactly the outputs of the built site.

    .venv/bin/python book/_ext/pdf_edition.py    # exit 0: every chapter is in the cache
"""

from __future__ import annotations

import pathlib
import re
import sys
from urllib.parse import urljoin

import tomllib
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform

#: The frames of a ``to_jshtml`` player: ``frames[3] = "data:image/png;base64,iVBOR...``
#: (base64 lines continued by a backslash inside the JavaScript string).
FRAME = re.compile(r'frames\[(\d+)\]\s*=\s*"data:image/png;base64,([A-Za-z0-9+/=\\\s]*)"')

#: The sentence under each animation's still, before its address online.
ANIMATION_NOTE = "The last frame of an animation; the online edition plays it"

#: The package sphinx-jupyterbook-latex's class loads, reduced to what that class uses.
BBM_STY = r"""\NeedsTeXFormat{LaTeX2e}
\ProvidesPackage{bbm}[2026/01/01 stand-in from book/_ext/pdf_edition.py]
\providecommand{\mathbbm}[1]{\mathbb{#1}}
"""


def latex_macros(mathjax3_config: dict | None) -> str:
    r"""The MathJax macros of ``mathjax3_config`` as LaTeX definitions.

    A macro is either its body (``"\\mathbb{R}"``) or ``[body, number of arguments]``.
    ``\providecommand`` then ``\renewcommand``: a name LaTeX already has is replaced, as
    MathJax replaces it.
    """
    macros = ((mathjax3_config or {}).get("tex") or {}).get("macros") or {}
    lines = []
    for name, body in macros.items():
        args = ""
        if isinstance(body, (list, tuple)):
            body, n_args = body[0], int(body[1])
            args = f"[{n_args}]" if n_args else ""
        lines.append(f"\\providecommand{{\\{name}}}{{}}\\renewcommand{{\\{name}}}{args}{{{body}}}")
    return "\n".join(lines)


def last_frame(html: str) -> str | None:
    """The base64 PNG of a ``to_jshtml`` player's last frame, or None if ``html`` is not one."""
    frames = {int(k): re.sub(r"[\\\s]", "", data) for k, data in FRAME.findall(html)}
    return frames[max(frames)] if frames else None


def add_macros(app: Sphinx, config) -> None:
    macros = latex_macros(config.mathjax3_config)
    if macros:
        config.latex_elements["preamble"] = (
            config.latex_elements.get("preamble", "")
            + "\n% The MathJax macros of _config.yml (book/_ext/pdf_edition.py)\n"
            + macros
            + "\n"
        )


def prepare_latex(app: Sphinx) -> None:
    """The stand-in bbm.sty, and the version of the book (gmlib's, pyproject.toml) under its
    title: the site has no version to show, a printed copy needs one."""
    if app.builder.format != "latex":
        return
    (app.builder.outdir / "bbm.sty").write_text(BBM_STY, encoding="utf-8")
    pyproject = pathlib.Path(app.srcdir) / "pyproject.toml"
    if pyproject.exists():
        version = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
        app.builder.context.update(release=version, releasename="Version")


def docname_of(node: nodes.Node, env) -> str:
    """The page that ``node`` comes from, in the LaTeX builder's one tree of the whole book
    (Sphinx's ``inline_all_toctrees`` marks each page's sections with their ``docname``)."""
    for ancestor in _ancestors(node):
        if isinstance(ancestor, nodes.section) and ancestor.get("docname"):
            return ancestor["docname"]
    return env.docname


def site_address(repository_url: str, baseurl: str = "") -> str:
    """The online edition's address: ``baseurl`` (Sphinx's ``html_baseurl``) when set, else
    where .github/workflows/book.yml publishes the book, the GitHub Pages site of the
    repository (``repository.url`` in _config.yml), a fork's own included:
    https://github.com/OWNER/REPO gives https://OWNER.github.io/REPO/."""
    if baseurl:
        return baseurl.rstrip("/") + "/"
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", repository_url or "")
    if not match:
        raise ValueError(f"set `html.baseurl` in _config.yml: no GitHub Pages address for {repository_url!r}")
    return f"https://{match[1].lower()}.github.io/{match[2]}/"


def online_url(app: Sphinx, docname: str, target: str = "") -> str:
    """The address of ``target`` (an anchor, or a link relative to the page) online."""
    site = site_address(app.config.html_theme_options.get("repository_url", ""), app.config.html_baseurl)
    page = f"{site}{docname}.html"
    return urljoin(page, target) if target else page


class AnimationStills(SphinxPostTransform):
    """An ``image/png`` still (the last frame) beside each animation player's ``text/html``.

    Runs before myst-nb's ``SelectMimeType`` (priority 4), which then picks the image.
    """

    default_priority = 3
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        for bundle in list(self.document.findall(nodes.container)):
            if bundle.get("nb_element") != "mime_bundle":
                continue
            mime_types = {child.get("mime_type"): child for child in bundle.children}
            if "text/html" not in mime_types or "image/png" in mime_types:
                continue
            png = last_frame(mime_types["text/html"].astext())
            if png is None:
                continue
            figure = next((a for a in _ancestors(bundle) if isinstance(a, nodes.figure)), None)
            anchor = f"#{figure['ids'][0]}" if figure is not None and figure["ids"] else ""
            url = online_url(self.app, docname_of(bundle, self.env), anchor)
            # A data URI: Sphinx's DataURIExtractor writes it out as an image file for LaTeX.
            image = nodes.image(uri=f"data:image/png;base64,{png}", candidates={"?": ""})
            image["candidates"] = {"?": image["uri"]}
            image["alt"] = "The last frame of an animation"
            image["classes"].append("animation-still")
            note = nodes.paragraph(
                "",
                "",
                nodes.emphasis(
                    "",
                    "",
                    nodes.Text(f"{ANIMATION_NOTE}: "),
                    nodes.reference("", url, refuri=url),
                    nodes.Text("."),
                ),
            )
            still = nodes.container(mime_type="image/png")
            still += [image, note]
            bundle.append(still)


class OnlineLinks(SphinxPostTransform):
    """A link relative to its page (a file the site serves, such as a chapter's student
    notebook, ``../student/NN_*.ipynb``) points to that file online: a PDF has no site
    beside it."""

    default_priority = 5
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        for ref in self.document.findall(nodes.reference):
            uri = ref.get("refuri", "")
            # not an address (scheme:), an anchor (#) or the LaTeX builder's own page link (%)
            if uri and not ref.get("internal") and not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|[#%]", uri):
                ref["refuri"] = online_url(self.app, docname_of(ref, self.env), uri)


class ReferenceAsAppendices(SphinxPostTransform):
    """The parts of ``_toc.yml`` after the numbered ones (the Reference pages) as appendices
    (A, B, ...): the site leaves them unnumbered; LaTeX would count them on as chapters.

    Runs after sphinx-jupyterbook-latex has turned each caption of ``_toc.yml`` into a part
    (a section whose ``docname`` is the caption, priority 700).
    """

    default_priority = 710
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        site_map = getattr(self.config, "external_site_map", None)
        if site_map is None or not getattr(self.env, "jblatex_captions_to_parts", False):
            return
        subtrees = site_map.root.subtrees
        numbered = [bool(t.numbered) for t in subtrees]
        if True not in numbered or False not in numbered[numbered.index(True):]:
            return
        caption = subtrees[numbered.index(False, numbered.index(True))].caption
        for section in list(self.document.findall(nodes.section)):
            if section.get("docname") == caption and section.parent is not None:
                part = section.parent.parent  # the part's section, in its start_of_file, in a compound
                part.parent.insert(part.parent.index(part), nodes.raw("", "\\appendix\n", format="latex"))
                return


class ReferenceTargets(SphinxPostTransform):
    """A LaTeX label for each exercise and theorem under the name that references to it use
    (``page:label``). sphinx-exercise labels an exercise ``exercise:label`` only, so that a
    reference from another page (the course's plans, book/course.md) would link nowhere;
    sphinx-proof labels a theorem ``None:label`` when its section is not the page's first
    (it looks for the page's name on the nearest section, which has one only at the top)."""

    default_priority = 5
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        from sphinx_exercise.nodes import exercise_enumerable_node, exercise_node

        def labelled(n) -> bool:
            return isinstance(n, (exercise_node, exercise_enumerable_node)) or (
                type(n).__module__ == "sphinx_proof.nodes" and type(n).__name__ != "proof_node")

        for node in list(self.document.findall(labelled)):
            if node.get("label") and node.parent is not None:
                label = f"{docname_of(node, self.env)}:{node['label']}"
                node.parent.insert(node.parent.index(node), nodes.raw(
                    "", f"\\phantomsection\\label{{\\detokenize{{{label}}}}}\n", format="latex"))


class SiteNumbers(SphinxPostTransform):
    """Exercises and theorems numbered as on the site: chapter, then count (Exercise 1.2).

    sphinx-jupyterbook-latex sets ``numfig_secnum_depth`` to 2 when the book has parts, so that
    LaTeX counts figures, tables and equations by chapter; but Sphinx then also numbers what
    LaTeX does not count (sphinx-exercise's exercises, sphinx-proof's theorems) by section
    (Exercise 1.7.2), and the book's own references (book/course.md: "1.2") no longer match.
    Those numbers are counted again here, per chapter, in the order of the pages.
    """

    default_priority = 1  # before sphinx-exercise and sphinx-proof read them, and references
    formats = ("latex",)
    LATEX_COUNTS = frozenset({"figure", "table", "code-block", "displaymath"})

    def run(self, **kwargs) -> None:
        if self.config.numfig_secnum_depth < 2:
            return
        fignumbers = self.env.toc_fignumbers
        counters: dict[tuple, int] = {}
        for node in self.document.findall(nodes.Element):
            if not node.get("ids"):
                continue
            docname = docname_of(node, self.env)
            for figtype, numbers in fignumbers.get(docname, {}).items():
                number = numbers.get(node["ids"][0])
                if figtype in self.LATEX_COUNTS or number is None or len(number) < 2:
                    continue
                key = (docname, figtype, number[0])
                counters[key] = counters.get(key, 0) + 1
                numbers[node["ids"][0]] = (number[0], counters[key])


class LeaveOutSolutions(SphinxPostTransform):
    """The solutions of the exercises, left out of the PDF (the introduction says so)."""

    default_priority = 2
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        from sphinx_exercise.nodes import solution_node

        for node in list(self.document.findall(solution_node)):
            node.parent.remove(node)


def _ancestors(node: nodes.Node):
    while node.parent is not None:
        node = node.parent
        yield node


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", add_macros)
    app.connect("builder-inited", prepare_latex)
    app.add_post_transform(AnimationStills)
    app.add_post_transform(OnlineLinks)
    app.add_post_transform(SiteNumbers)
    app.add_post_transform(ReferenceTargets)
    app.add_post_transform(LeaveOutSolutions)
    app.add_post_transform(ReferenceAsAppendices)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def uncached(root: pathlib.Path) -> list[str]:
    """What keeps the PDF from being made of the cached outputs alone, one line each."""
    import nbformat
    import yaml
    from jupyter_cache import get_cache

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for p in toc.get("parts", []) for c in p.get("chapters", []) if "file" in c]
    notebooks = [root / f"{re.sub(r'[.]ipynb$', '', f)}.ipynb" for f in files]
    notebooks = [nb for nb in notebooks if nb.exists()]
    folder = root / "_build" / ".jupyter_cache"
    if not folder.exists():
        return [f"no jupyter-cache at {folder.relative_to(root)}: run `make book` first"]
    cache, problems = get_cache(str(folder)), []
    for path in notebooks:
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))  # code cells, as myst-nb matches
        except KeyError:
            problems.append(f"{path.relative_to(root)} is not in the cache with its current code: run `make book`")
    return problems


if __name__ == "__main__":
    problems = uncached(pathlib.Path(__file__).resolve().parents[2])
    for line in problems:
        print(f"make pdf: {line}", file=sys.stderr)
    sys.exit(1 if problems else 0)
