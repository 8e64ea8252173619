"""The built site in headless Chromium (tests/site_check.py), skipped with a reason when it cannot run.

It needs a built site (`make book` or `make strict` leaves `_build/html`), Debian's Chromium
(`apt-get install -y chromium`), the `playwright` package (requirements.txt) and a local
MathJax 3 (fetched once with `npm pack mathjax@3`, or `GMLIB_MATHJAX_DIR`). `.ci/run` runs
the same check as a script right after the strict build, where all of these are present.
"""

import pytest

import site_check


def test_built_site_in_chromium():
    html = site_check.ROOT / "_build" / "html"
    try:
        if not (html / "index.html").exists():
            raise site_check.CannotRun(f"no built site at {html} (run `make book` first)")
        pytest.importorskip("playwright", reason="the `playwright` package is not installed")
        chromium = site_check.find_chromium()
        mathjax = site_check.find_mathjax(html.resolve())
    except site_check.CannotRun as exc:
        pytest.skip(f"browser check of the site skipped: {exc}")
    problems = site_check.check_site(html.resolve(), chromium, mathjax, verbose=False)
    assert not problems, "\n".join(problems)
