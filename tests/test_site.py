"""The built site in headless Chromium (tests/site_check.py), skipped with a reason when it cannot run,
and the site check's own detectors, which must be able to fail.

The browser check needs a built site (`make book` or `make strict` leaves `_build/html`, with
MathJax served from it), Debian's Chromium (`apt-get install -y chromium`) and the `playwright`
package (requirements.txt). `.ci/run` runs the same check as a script right after the strict build.
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
        site_check.find_axe()
    except site_check.CannotRun as exc:
        pytest.skip(f"browser check of the site skipped: {exc}")
    problems = site_check.check_site(html.resolve(), chromium, verbose=False)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("text", [
    r"where $\beta(z) = \operatorname{softmax}_k(",  # a formula the Markdown broke
    r"the gate \frac{1}{2} of",
    "costs $5 a month",
    r"in \R^D the",
])
def test_unrendered_tex_is_found(text):
    assert site_check.unrendered_tex(text)


@pytest.mark.parametrize("text", ["plain prose, with numbers 1.5 and a dash - here", r"a path C:\Rtools\n"])
def test_prose_is_not_tex(text):
    assert site_check.unrendered_tex(text) == []


@pytest.mark.parametrize("text, found", [
    ("an excess of 1.6e-05 at L = 16", ["1.6e-05"]),
    ("a ratio of 2E+06, then 3e8", ["2E+06", "3e8"]),
    ("typeset: 1.6 × 10⁻⁵, the Adam step 1 × 10⁻³, a file fig-e3.png, seed 1e, 0x1e5", []),
])
def test_computer_notation_is_found(text, found):
    assert [snippet for snippet in found if any(snippet in s for s in site_check.computer_notation(text))] == found
    assert len(site_check.computer_notation(text)) == len(found)


def test_bare_outputs_are_found():
    outputs = [("text_plain", "np.float64(0.00059)"), ("stream", "excess 0.1 at L = 16\n45.82702461417883\n"),
               ("stream", "on 1 cpu device(s)\n"), ("stream", "Array([[0.75, 0.25]])"), ("other", "<table>")]
    assert site_check.bare_outputs(outputs) == ["np.float64(0.00059)", "45.82702461417883", "on 1 cpu device(s)",
                                                "Array([[0.75, 0.25]])"]
    assert site_check.bare_outputs([("stream", "the excess is 0.1 at L = 16\n"), ("other", "1.5")]) == []


def test_accessibility_finds_a_violation(tmp_path):
    """axe-core, as the site check runs it, reports an image without a text alternative and
    an unlabelled slider, and nothing on the same page once both are named."""
    try:
        pytest.importorskip("playwright", reason="the `playwright` package is not installed")
        chromium, _ = site_check.find_chromium(), site_check.find_axe()
    except site_check.CannotRun as exc:
        pytest.skip(f"accessibility check skipped: {exc}")
    from playwright.sync_api import sync_playwright

    page_html = ('<!DOCTYPE html><html lang="en"><head><title>t</title></head>'
                 '<body><main><h1>t</h1>{}</main></body></html>')
    bad = '<img src="x.png"><input type="range">'
    good = '<img src="x.png" alt="A plot."><input type="range" aria-label="Frame">'
    (tmp_path / "bad.html").write_text(page_html.format(bad))
    (tmp_path / "good.html").write_text(page_html.format(good))
    server, origin = site_check.serve(tmp_path)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=site_check.CHROMIUM_ARGS)
            page = browser.new_page()
            found = {}
            for name in ("bad", "good"):
                page.goto(f"{origin}/{name}.html", wait_until="load")
                found[name] = site_check.accessibility(page, "light")
            browser.close()
    finally:
        server.shutdown()
    assert any("image-alt" in v for v in found["bad"]) and any(": label," in v for v in found["bad"])
    assert found["good"] == []
