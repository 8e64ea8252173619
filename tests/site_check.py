r"""The built site in a real browser: every page of ``_build/html`` in headless Chromium.

Serves ``_build/html`` on 127.0.0.1 (Python's http.server in a thread) and opens every
page with Playwright driving Debian's Chromium. Per page it checks that

* every image loads (``complete`` and ``naturalWidth > 0``);
* every figure (a PNG in a cell's output) is at least 1200 px wide and shown at no less than
  its intended size (half its pixels: the retina PNGs of gmlib.plotting's rules), in a
  1400 px wide window: shrunk into the column, its fonts would fall under 9 pt;
* MathJax typesets every formula, with no ``mjx-merror`` (a TeX error) and no undefined
  control sequence (MathJax's ``noundefined`` red text) left on the page, and no TeX is left
  unrendered in the page's text (a ``$``, ``\frac``, ``\operatorname``... outside a formula:
  a formula the Markdown around it broke), and no displayed formula runs past the column in
  the 1400 px window (MathJax 3 does not break lines: a long one is cut off at the right, to
  be scrolled; split it with ``aligned``), and no table is wider than the column either;
* no number in the prose or a table of a chapter or a reader's page (READER_PAGES) is in
  computer notation (``1.6e-05``: the book typesets 1.6 × 10⁻⁵), and no glued number is set
  in another weight than its sentence (myst-nb shows glued text in bold; book/_static/gmlib.css
  sets it back);
* no cell shows a bare value (an ``execute_result`` as plain text: ``np.float64(...)``,
  ``Array(...)``) or prints a bare number or a build-machine line;
* the console shows no error and no script raises (page errors), except the two theme
  errors listed in KNOWN_ERRORS (printed on every run, with why they are tolerated);
* no local request fails (status >= 400 or a network error: a missing CSS/JS/image);
* every internal link resolves: the target file exists and, for ``#anchor``, has that id;
* WCAG 2.1 AA, in the light and the dark theme: axe-core (``_axe/axe.min.js``, fetched by
  ``make site-check`` from npm as MathJax is) finds no violation of the ``wcag2a``,
  ``wcag2aa``, ``wcag21a`` and ``wcag21aa`` rules on any page, and no image in a page's
  article has its file name for a text alternative;
* each chapter page (``book/NN_*.html``) carries the Colab button with the URL of that
  chapter's notebook, ``https://colab.research.google.com/github/<org>/<repo>/blob/<branch>/book/<name>.ipynb``
  (from ``_config.yml``'s ``repository``), and the notebook exists in the checkout.

MathJax 3 is served by the built site itself (``es5/``, copied from ``_mathjax/`` by the
build: see the Makefile), so the formulas are typeset here exactly as an offline reader sees
them. Any request for something outside the site is a problem: it is aborted and reported.

    .venv/bin/python tests/site_check.py [--html _build/html] [--chromium /usr/bin/chromium]

Exit status: 0 when every check passes, 1 when one fails, 2 when it cannot run (no
Chromium, no Playwright, no axe-core, no build); tests/test_site.py turns 2 into a skip.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import pathlib
import re
import shutil
import sys
import threading
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: Console/page errors of the themes themselves, tolerated but printed on every run. Each is
#: matched exactly; remove an entry when its cause is fixed (the run then confirms it).
KNOWN_ERRORS = {
    "page error: Identifier 'THEBE_JS_URL' has already been declared":
        "sphinx-thebe's inline config script is emitted twice in every page by the Jupyter Book 1.0.4 / "
        "sphinx-book-theme 1.3 stack; the second copy throws, harmlessly (live code cells are not used)",
    "console error: Got invalid theme mode: . Resetting to auto.":
        "pydata-sphinx-theme logs this on a reader's first visit, before a light/dark mode is stored",
}
#: axe-core, the accessibility engine run on every page (fetched by `make site-check`), and
#: the rules it runs: WCAG 2.0 and 2.1, levels A and AA.
AXE = ROOT / "_axe" / "axe.min.js"
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
_AXE_RUN = """async (tags) => (await axe.run(document, {runOnly: {type: 'tag', values: tags}})).violations
    .map(v => [v.id, v.help, v.nodes.length, v.nodes[0].target.join(' ')])"""
#: Figures: a PNG in a cell's output at least this wide (px), shown at >= 97 % of half its width.
MIN_FIGURE_PX = 1200
WINDOW = {"width": 1400, "height": 900}
#: TeX left in a page's text: a dollar sign, or a control sequence of the book's formulas.
UNRENDERED_TEX = re.compile(r"\$|\\(?:frac|operatorname|mathbb|mathcal|mathrm|text|sum|int|prod|sqrt|top|left|right|"
                            r"begin|end|hat|tilde|bar|alpha|beta|gamma|delta|Delta|mu|xi|pi|sigma|Sigma|Gamma|"
                            r"theta|lambda|kappa|cdot|le|ge|leq|geq|quad|infty|partial|nabla|log|exp|R|E)(?![A-Za-z])")
#: A printed line that is a bare value (a number, a NumPy/JAX repr) or a line about the build machine.
BARE_PRINT = re.compile(r"^\s*(?:[-+]?\d[\d.,eE+-]*|(?:np\.\w+|Array)\(.*|.*\bcpu device\(s\).*)\s*$", re.M)


def unrendered_tex(text: str) -> list[str]:
    """Snippets of ``text`` (a page's visible text, formulas and code left out) that hold TeX."""
    return [text[max(0, m.start() - 30):m.end() + 30].replace("\n", " ") for m in UNRENDERED_TEX.finditer(text)]


#: A number in computer notation (1.6e-05, 2E+06): the book typesets 1.6 × 10⁻⁵ (gmlib.plotting.number).
COMPUTER_NOTATION = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[eE][-+]?\d+(?![\w.])")


#: The pages for readers besides the chapters; the contributors' pages (the API reference, its
#: docstrings' tolerances, the benchmarks) write numbers as code does.
READER_PAGES = ("book/intro.html", "book/notation.html", "book/proofs.html", "book/course.html",
                "book/bibliography.html")


def computer_notation(text: str) -> list[str]:
    """Snippets of ``text`` (a page's prose, or its tables' text) with a number in computer notation."""
    return [text[max(0, m.start() - 30):m.end() + 30].replace("\n", " ") for m in COMPUTER_NOTATION.finditer(text)]


def bare_outputs(outputs: list[tuple[str, str]]) -> list[str]:
    """The cell outputs ``(kind, text)`` that show a bare value: an execute_result as plain text,
    or a printed line that is only a number, a NumPy/JAX repr or a build-machine line."""
    bad = [text.strip()[:80] for kind, text in outputs if kind == "text_plain"]
    bad += [m.group(0).strip()[:80] for kind, text in outputs if kind == "stream" for m in BARE_PRINT.finditer(text)]
    return bad


class CannotRun(Exception):
    """The check cannot run here (missing Chromium, Playwright or build)."""


# ----------------------------------------------------------------------------- prerequisites


def find_chromium(explicit: str | None = None) -> str:
    for cand in [explicit, os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")]:
        if cand and os.path.exists(cand):
            return cand
    raise CannotRun("no Chromium found (apt-get install -y chromium, or set CHROMIUM=/path/to/chromium)")


# ----------------------------------------------------------------------------- the site on disk


def pages(html: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in html.rglob("*.html") if not any(part.startswith("_") for part in p.relative_to(html).parts))


@functools.lru_cache(maxsize=None)
def ids_of(path: pathlib.Path) -> frozenset:
    text = path.read_text(errors="replace")
    return frozenset(re.findall(r'\b(?:id|name)="([^"]+)"', text))


def check_link(html: pathlib.Path, page: pathlib.Path, href: str, origin: str) -> str | None:
    """None when ``href`` (absolute, as the browser resolved it) is external or resolves; else the problem."""
    url = urllib.parse.urlsplit(href)
    if f"{url.scheme}://{url.netloc}" != origin:
        return None
    rel = urllib.parse.unquote(url.path).lstrip("/")
    target = html / rel
    if target.is_dir():
        target = target / "index.html"
    if not target.exists():
        return f"broken link {href} (no file {target.relative_to(html)})"
    frag = urllib.parse.unquote(url.fragment)
    if frag and target.suffix == ".html" and frag not in ids_of(target):
        return f"broken anchor {href} (no id {frag!r} in {target.relative_to(html)})"
    return None


def expected_colab(name: str) -> str:
    import yaml

    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = cfg["repository"]
    org_repo = urllib.parse.urlsplit(repo["url"]).path.strip("/")
    prefix = (repo.get("path_to_book") or "").strip("/")
    path = "/".join(p for p in (prefix, "book", f"{name}.ipynb") if p)
    return f"{cfg['launch_buttons']['colab_url'].rstrip('/')}/github/{org_repo}/blob/{repo.get('branch', 'main')}/{path}"


# ----------------------------------------------------------------------------- the browser


def serve(html: pathlib.Path):
    handler = functools.partial(_QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


_PAGE_STATE = """async () => {
  await Promise.all(Array.from(document.images).map(i => i.complete ? null :
      new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); })));
  let mathjax = 'absent';
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
    if (MathJax.typesetPromise) { await MathJax.typesetPromise(); }
    mathjax = 'ready';
  }
  const math = Array.from(document.querySelectorAll('.math'));
  const main = document.querySelector('article') || document.body;
  const prose = main.cloneNode(true);
  prose.querySelectorAll('mjx-container, .math, pre, code, script, style, .cell_input, .cell_output, '
      + 'mjx-assistive-mml, .headerlink').forEach(e => e.remove());
  const figures = Array.from(main.querySelectorAll('.cell_output img, figure img'))
      .filter(i => !(i.id || '').startsWith('_anim_img') && !(i.currentSrc || i.src).endsWith('.svg'));
  return {
    text: prose.textContent,
    tables: Array.from(main.querySelectorAll('table')).map(t => t.textContent).join(' '),
    boldGlue: Array.from(main.querySelectorAll('span.pasted-text')).filter(g =>
        getComputedStyle(g).fontWeight !== getComputedStyle(g.parentElement).fontWeight).map(g => g.textContent),
    wide: Array.from(main.querySelectorAll('mjx-container[display="true"]'))
        .filter(m => m.scrollWidth > m.clientWidth + 2)
        .map(m => [m.scrollWidth - m.clientWidth, m.textContent.slice(0, 60)])
        .concat(Array.from(main.querySelectorAll('table')).filter(t => t.closest('.bd-article')
            && t.getBoundingClientRect().width > main.querySelector('section, .section, div').getBoundingClientRect().width + 2)
          .map(t => [Math.round(t.getBoundingClientRect().width), 'table: ' + t.textContent.trim().slice(0, 50)])),
    figures: figures.map(i => [i.currentSrc || i.src, i.naturalWidth, i.getBoundingClientRect().width]),
    outputs: Array.from(main.querySelectorAll('.cell_output .output')).map(o =>
        [o.classList.contains('text_plain') ? 'text_plain' : (o.classList.contains('stream') ? 'stream' : 'other'),
         o.textContent]),
    images: Array.from(document.images).map(i => [i.currentSrc || i.src, i.complete, i.naturalWidth]),
    mathjax: mathjax,
    math: math.length,
    untypeset: math.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 80)),
    merrors: Array.from(document.querySelectorAll('mjx-merror, [data-mjx-error]'))
        .map(e => e.getAttribute('data-mjx-error') || e.textContent.slice(0, 80))
        .concat(Array.from(document.querySelectorAll('mjx-container [style*="color: red"]'))  // noundefined
        .map(e => 'undefined control sequence ' + Array.from(e.querySelectorAll('mjx-c'))
            .map(c => String.fromCodePoint(parseInt(c.className.replace(/.*mjx-c([0-9A-F]+).*/, '$1'), 16))).join(''))),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    file_alts: Array.from(main.querySelectorAll('img')).map(i => i.getAttribute('alt') || '')
        .filter(a => /[.](png|svg|jpe?g|gif)$/i.test(a)),
    colab: Array.from(document.querySelectorAll('a[href*="colab.research.google.com"]')).map(a => a.href),
  };
}"""


def redirect(path: pathlib.Path):
    """The match of a redirect page's refresh target (``index.html``), or ``None``."""
    return re.search(r'http-equiv="refresh"\s+content="\d+;\s*url=([^"]+)"', path.read_text(), re.I)


def find_axe() -> pathlib.Path:
    if not AXE.exists():
        raise CannotRun(f"axe-core is missing at {AXE} (`make site-check` fetches it)")
    return AXE


def accessibility(page, mode: str) -> list[str]:
    """The WCAG 2.1 A/AA violations axe-core finds on ``page`` (loaded, formulas typeset)."""
    page.add_script_tag(path=str(find_axe()))
    return [f"accessibility ({mode}): {rule}, {n} element(s), e.g. {target!r}: {what}"
            for rule, what, n, target in page.evaluate(_AXE_RUN, AXE_TAGS)]


def check_site(html: pathlib.Path, chromium: str, verbose=True) -> list[str]:
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    external: set[str] = set()
    tolerated: set[str] = set()
    server, origin = serve(html)
    chapter = re.compile(r"^book/(\d\d_[^/]+)\.html$")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport=WINDOW)

            def route(r):
                url = r.request.url
                if url.startswith(origin):
                    return r.continue_()
                external.add(url)
                return r.abort()

            context.route("**/*", route)
            for path in pages(html):
                rel = path.relative_to(html).as_posix()
                refresh = redirect(path)
                if refresh:  # a redirect page (index.html): its target must exist
                    bad = check_link(html, path, urllib.parse.urljoin(f"{origin}/{rel}", refresh[1]), origin)
                    problems += [f"{rel}: redirect: {bad}"] if bad else []
                    if verbose:
                        print(f"{rel}: redirects to {refresh[1]}" + (" -- broken" if bad else " ok"), flush=True)
                    continue
                page = context.new_page()
                errors: list[str] = []
                page.on("console", lambda msg, errors=errors: errors.append(
                    f"console error: {msg.text}") if msg.type == "error" and
                    (msg.location or {}).get("url", "") not in external and "net::ERR_FAILED" not in msg.text
                    else None)
                page.on("pageerror", lambda exc, errors=errors: errors.append(f"page error: {exc}"))
                page.on("response", lambda resp, errors=errors: errors.append(
                    f"HTTP {resp.status} for {resp.url}") if resp.url.startswith(origin) and resp.status >= 400
                    else None)
                page.on("requestfailed", lambda req, errors=errors: errors.append(
                    f"request failed: {req.url} ({req.failure})") if req.url.startswith(origin) else None)
                page.goto(f"{origin}/{rel}", wait_until="load")
                state = page.evaluate(_PAGE_STATE)
                for src, complete, width in state["images"]:
                    if not complete or width == 0:
                        errors.append(f"image does not load: {src}")
                if state["math"] and state["mathjax"] != "ready":
                    errors.append(f"{state['math']} formulas but MathJax did not start")
                for src, natural, shown in state["figures"]:
                    name = src.rsplit("/", 1)[-1][:16]
                    if natural < MIN_FIGURE_PX:
                        errors.append(f"figure {name}... is {natural} px wide (< {MIN_FIGURE_PX}): blurred on the page")
                    elif shown < 0.97 * natural / 2:
                        errors.append(f"figure {name}... is shown {shown:.0f} px wide, under its intended "
                                      f"{natural / 2:.0f} px: shrunk, its fonts fall under 9 pt")
                for snippet in unrendered_tex(state["text"]):
                    errors.append(f"TeX left unrendered in the text: {snippet!r}")
                for value in state["boldGlue"][:3]:
                    errors.append(f"a glued number set apart from its sentence (bold): {value!r}")
                if chapter.match(rel) or rel in READER_PAGES:
                    for snippet in computer_notation(state["text"] + "\n" + state["tables"]):
                        errors.append(f"a number in computer notation: {snippet!r}")
                for extra, what in state["wide"]:
                    if what.startswith("table: "):
                        errors.append(f"table cut off: {extra} px wide, past the column: {what[7:]!r}")
                    else:
                        errors.append(f"formula cut off: {extra} px past the column: {what!r}")
                for value in bare_outputs(state["outputs"]):
                    errors.append(f"a cell shows a bare value: {value!r}")
                for tex in state["untypeset"]:
                    errors.append(f"formula not typeset: {tex!r}")
                for msg in sorted(set(state["merrors"])):
                    errors.append(f"MathJax error: {msg}")
                for href in sorted(set(state["links"])):
                    bad = check_link(html, path, href, origin)
                    if bad:
                        errors.append(bad)
                for alt in state["file_alts"]:
                    errors.append(f"an image's text alternative is its file name: {alt[:60]!r}")
                errors += accessibility(page, "light")
                m = chapter.match(rel)
                if m:
                    want = expected_colab(m[1])
                    if want not in state["colab"]:
                        errors.append(f"no Colab button to {want} (found {state['colab'] or 'none'})")
                    if not (ROOT / "book" / f"{m[1]}.ipynb").exists():
                        errors.append(f"the Colab button points to book/{m[1]}.ipynb, which is not in the checkout")
                page.close()
                n_bad = sum(e not in KNOWN_ERRORS for e in errors)
                if verbose:
                    print(f"{rel}: {len(state['images'])} images, {state['math']} formulas, "
                          f"{len(set(state['links']))} links" + (f" -- {n_bad} problem(s)" if n_bad else " ok"),
                          flush=True)
                tolerated.update(e for e in errors if e in KNOWN_ERRORS)
                problems += [f"{rel}: {e}" for e in errors if e not in KNOWN_ERRORS]
            # The dark theme, as a reader who chose it sees every page: its colours checked again.
            dark = browser.new_context(viewport=WINDOW, color_scheme="dark")
            dark.add_init_script("localStorage.setItem('mode', 'dark'); localStorage.setItem('theme', 'dark');")
            dark.route("**/*", route)
            page = dark.new_page()
            for path in pages(html):
                rel = path.relative_to(html).as_posix()
                if redirect(path):
                    continue
                page.goto(f"{origin}/{rel}", wait_until="load")
                page.evaluate(_PAGE_STATE)  # images loaded, formulas typeset
                errors = (["the dark theme is not applied"]
                          if page.evaluate("document.documentElement.dataset.theme") != "dark" else [])
                errors += accessibility(page, "dark")
                if verbose:
                    print(f"{rel} (dark theme): " + (f"{len(errors)} problem(s)" if errors else "ok"), flush=True)
                problems += [f"{rel}: {e}" for e in errors]
            browser.close()
    finally:
        server.shutdown()
    if verbose and tolerated:
        print("known theme errors, tolerated (see KNOWN_ERRORS):",
              *(f"{e}\n    why: {KNOWN_ERRORS[e]}" for e in sorted(tolerated)), sep="\n  ")
    problems += [f"a page requests {url} from outside the site (offline readers do not get it)"
                 for url in sorted(external)]
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--html", type=pathlib.Path, default=ROOT / "_build" / "html")
    parser.add_argument("--chromium", default=None)
    args = parser.parse_args(argv)
    try:
        if not (args.html / "index.html").exists():
            raise CannotRun(f"no built site at {args.html} (run `make book` or `make strict` first)")
        try:
            import playwright  # noqa: F401
        except ImportError:
            raise CannotRun("the Python package `playwright` is not installed (pip install playwright)") from None
        chromium = find_chromium(args.chromium)
        find_axe()
    except CannotRun as exc:
        print(f"site check cannot run: {exc}")
        return 2
    problems = check_site(args.html.resolve(), chromium)
    for p in problems:
        print("FAIL", p)
    print(f"{len(pages(args.html))} pages, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
