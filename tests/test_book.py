"""The book's invariants: notebook twins, clean notebooks, Colab install cells, toc and API page."""

import importlib
import json
import os
import pathlib
import re
import subprocess
import sys

import jupytext
import nbformat
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb")) + [BOOK / "template.ipynb"]
CHAPTERS = [nb for nb in NOTEBOOKS if nb.name != "template.ipynb"]
PUBLIC_MODULES = ["gmlib", "gmlib.lda", "gmlib.denoise", "gmlib.regression", "gmlib.train", "gmlib.plotting"]


def cells(path):
    nb = jupytext.read(path)
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_twins_agree(nb):
    """Each .ipynb has a MyST .md twin with the same cells (types and sources), whatever the file times."""
    md = nb.with_suffix(".md")
    assert md.exists(), f"{nb.name} has no .md twin"
    a, b = cells(nb), cells(md)
    assert len(a) == len(b), f"{nb.name}: {len(a)} cells, its twin {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"{nb.name} cell {i} differs from its .md twin (run `make twins`)"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_committed_clean(nb):
    data = json.loads(nb.read_text())
    for c in data["cells"]:
        if c["cell_type"] == "code":
            assert not c.get("outputs") and c.get("execution_count") is None, f"{nb.name} has outputs"


def config():
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def first_code_cells(nb):
    return [c for c in jupytext.read(nb).cells if c.cell_type == "code"][:2]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_colab_install_cell(nb):
    """The first cell installs gmlib only in Colab, from the repository _config.yml names, without deps."""
    install, setup = first_code_cells(nb)
    template_install, template_setup = first_code_cells(BOOK / "template.ipynb")
    assert install.source == template_install.source, f"{nb.name}: install cell differs from the template's"
    assert setup.source == template_setup.source, f"{nb.name}: set-up cell differs from the template's"
    url = config()["repository"]["url"]
    found = re.search(r'GMLIB_REPO = "([^"]+)"', install.source)
    assert found and found.group(1) == url, f"{nb.name}: GMLIB_REPO must be {url}"
    assert '"google.colab" in sys.modules' in install.source
    assert '"--no-deps"' in install.source  # never replace Colab's own jax
    assert 'jax_enable_x64", True' in setup.source


def toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [c["file"] for c in part["chapters"]]
    return files


def test_toc_and_chapters_agree():
    files = toc_files()
    for f in files:
        assert list(ROOT.glob(f + ".ipynb")) or list(ROOT.glob(f + ".md")), f"_toc.yml names missing {f}"
    for nb in CHAPTERS:
        assert str(nb.relative_to(ROOT).with_suffix("")) in files, f"{nb.name} is not in _toc.yml"


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.name)
def test_chapter_structure(nb):
    """A chapter states a numbered result, checks it with asserts and ends with >= 3 folded exercises."""
    text = nb.with_suffix(".md").read_text()
    assert re.search(r"```\{prf:(theorem|proposition|lemma)\}", text), f"{nb.name} states no result"
    assert text.count("assert ") >= 2, f"{nb.name} checks nothing"
    n_ex = len(re.findall(r"```\{exercise\}", text))
    n_sol = len(re.findall(r"```\{solution(-start)?\} [\w-]+\n:class: dropdown", text))  # label required
    assert n_ex >= 3 and n_sol >= n_ex, f"{nb.name}: {n_ex} exercises, {n_sol} folded solutions"


# ----------------------------------------------------------------------------- reading conventions

MAX_CODE_LINE = 88  # the page shows about 80 characters of code at a laptop width
_MAKES_FIGURE = re.compile(r"plt\.(subplots|figure|subplot_mosaic)\(")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_page(nb):
    long = [(i, line) for i, c in enumerate(jupytext.read(nb).cells) if c.cell_type == "code"
            for line in c.source.splitlines() if len(line) > MAX_CODE_LINE]
    assert not long, f"{nb.name}: {len(long)} code lines over {MAX_CODE_LINE} characters, e.g. cell {long[0]}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_a_sentence_before_every_code_cell(nb):
    """Each code cell shown open follows a markdown cell, except the set-up cell right after the
    (hidden) install cell; a folded cell (a section's checks) needs no sentence about it."""
    nb_cells = jupytext.read(nb).cells
    kinds = [c.cell_type for c in nb_cells]
    code = [i for i, k in enumerate(kinds) if k == "code"]
    bare = [i for i in code[2:] if kinds[i - 1] != "markdown" and not _FOLDED & set(nb_cells[i].metadata.get("tags", []))]
    assert not bare, f"{nb.name}: code cells {bare} have no sentence before them"


def test_install_cell_is_collapsed():
    install = first_code_cells(BOOK / "template.ipynb")[0]
    assert "hide-cell" in install.metadata.get("tags", []), "the Colab install cell must be tagged hide-cell"
    assert len(install.source.splitlines()) <= 12, "keep the install cell short"


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.name)
def test_every_figure_is_numbered_captioned_and_referenced(nb):
    """A cell that draws a figure carries mystnb.figure {caption, name}, and the text cites it with numref."""
    text = nb.with_suffix(".md").read_text()
    for i, c in enumerate(jupytext.read(nb).cells):
        if c.cell_type != "code" or not _MAKES_FIGURE.search(c.source):
            continue
        fig = c.metadata.get("mystnb", {}).get("figure", {})
        assert fig.get("caption", "").strip() and fig.get("name"), f"{nb.name} cell {i}: figure without caption"
        assert re.search(rf"\{{numref\}}`([^`<]*<)?{re.escape(fig['name'])}>?`", text), (
            f"{nb.name}: figure {fig['name']} is never referenced with {{numref}}")


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.name)
def test_solutions_that_compute_are_executed(nb):
    """No code inside a plain {solution} (it would never run): such solutions are gated code cells that assert."""
    text = nb.with_suffix(".md").read_text()
    for body in re.findall(r"```\{solution\}[^\n]*\n(.*?)\n```\s*$", text, flags=re.S | re.M):
        code = [line for line in body.splitlines() if re.match(r"(    |\t)\S|```|>>> ", line)]
        assert not code, f"{nb.name}: a plain solution holds code ({code[0].strip()!r}); gate it"
    for body in re.findall(r"```\{solution-start\}(.*?)```\{solution-end\}", text, flags=re.S):
        if "{code-cell}" in body:
            assert "assert " in body, f"{nb.name}: a computed solution ends in no assert"


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.name)
def test_prose_quotes_glued_numbers(nb):
    text = nb.with_suffix(".md").read_text()
    names = set(re.findall(r"glue\(\s*[\"']([\w-]+)[\"']", text))
    quoted = set(re.findall(r"\{glue:text\}`([\w-]+)", text))
    assert quoted, f"{nb.name} quotes no glued number"
    assert quoted <= names, f"{nb.name}: quotes {sorted(quoted - names)} but never glues them"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_relies_on_a_trailing_semicolon(nb):
    """A trailing ';' hides a cell's value in the build, but nbval's strict comparison runs without it
    and sees an extra output: a cell that ends on a value assigns it (``_ = plotting.glue(...)``)."""
    ends = [i for i, c in enumerate(jupytext.read(nb).cells) if c.cell_type == "code" and c.source.strip().endswith(";")]
    assert not ends, f"{nb.name}: code cells {ends} end in ';'"


MAX_OPEN_CELL = 30  # lines of a code cell shown open on the page
_FOLDED = {"hide-input", "hide-cell", "remove-cell", "remove-input"}


def open_code_cells(nb):
    """``(index, source)`` of the code cells a reader sees open on the page.

    A cell is folded when tagged hide-input/hide-cell/remove-*, or when it sits inside a gated
    dropdown solution (between ``solution-start`` and ``solution-end``)."""
    out, in_solution = [], False
    for i, c in enumerate(jupytext.read(nb).cells):
        if c.cell_type == "markdown":
            starts, ends = c.source.rfind("{solution-start}"), c.source.rfind("{solution-end}")
            in_solution = starts > ends if starts != -1 or ends != -1 else in_solution
        elif not in_solution and not _FOLDED & set(c.metadata.get("tags", [])):
            out.append((i, c.source))
    return out


def open_cells_over(nb, limit=MAX_OPEN_CELL):
    """``(index, lines)`` of the code cells shown open with more than ``limit`` lines."""
    sizes = [(i, len(src.strip().splitlines())) for i, src in open_code_cells(nb)]
    return [(i, n) for i, n in sizes if n > limit]


MAX_OPEN_ASSERTS = 5  # per chapter: an assert shown open is one that *is* the point


def open_verification(nb):
    """``(asserts, glue calls)`` in the cells shown open: the checks and the numbers the text
    quotes belong in folded cells, the page shows the computation that makes the point."""
    shown = "\n".join(src for _, src in open_code_cells(nb))
    return len(re.findall(r"^\s*assert\b", shown, flags=re.M)), len(re.findall(r"\bglue\(", shown))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_no_code_cell_over_30_lines_is_shown_open(nb):
    """Plumbing goes into gmlib, presentation into a hide-input cell: the page shows short cells."""
    long = open_cells_over(nb)
    assert not long, f"{nb.name}: code cells (index, lines) {long} are shown open with over {MAX_OPEN_CELL} lines"


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.name)
def test_checks_and_glue_are_folded(nb):
    asserts, glued = open_verification(nb)
    assert asserts <= MAX_OPEN_ASSERTS, f"{nb.name}: {asserts} asserts shown open (at most {MAX_OPEN_ASSERTS})"
    assert not glued, f"{nb.name}: {glued} glue calls shown open; fold them into the section's checks cell"


PRF_TITLE = re.compile(r"^```\{prf:(\w+)\} (.+)$", re.M)


def bad_theorem_titles(text):
    """The titles of ``{prf:...}`` boxes that do not read "Theorem 3.1 (name)": _config.yml's
    ``proof_title_format`` writes a title right after its type word, so a title is a number
    (with, at most, one name in parentheses or after a colon) or a name in parentheses."""
    good = re.compile(r"^(?:(?:[A-C]|\d+)(?:\.\d+)+\b[^()]*(?:\([^()]*\))?[^()]*|\([^()]*\))$")
    return [f"{kind}: {title}" for kind, title in PRF_TITLE.findall(text) if not good.match(title)]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_theorem_titles_have_one_number_and_one_name(nb):
    assert yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]["proof_title_format"] == " %t"
    bad = bad_theorem_titles(nb.with_suffix(".md").read_text())
    assert not bad, f"{nb.name}: titles {bad}"


def test_the_theorem_title_check_can_fail():
    text = "```{prf:theorem} 3.1 (effective landscape)\n```{prf:lemma} 3.2\n```{prf:remark} (a name)\n"
    assert bad_theorem_titles(text) == []
    text = "```{prf:proposition} 9.1 (9.1 (the book's: a layer))\n```{prf:proposition} A name\n"
    assert len(bad_theorem_titles(text)) == 2


def test_the_folded_checks_test_can_fail(tmp_path):
    body = "x = 1\nassert x == 1\n_ = glue(\"x\", x)"
    src = (BOOK / "template.md").read_text().replace("## Exercises", f"## Open\n\nA cell.\n\n```{{code-cell}} ipython3\n{body}\n```\n\n## Exercises", 1)
    (tmp_path / "t.md").write_text(src)
    before = open_verification(BOOK / "template.md")
    assert open_verification(tmp_path / "t.md") == (before[0] + 1, before[1] + 1)
    folded = src.replace(f"```{{code-cell}} ipython3\n{body}", f"```{{code-cell}} ipython3\n:tags: [hide-input]\n\n{body}")
    (tmp_path / "t.md").write_text(folded)
    assert open_verification(tmp_path / "t.md") == before


def test_the_open_cell_check_can_fail(tmp_path):
    body = "\n".join(f"x{i} = {i}" for i in range(31))
    src = (BOOK / "template.md").read_text().replace("## Exercises", f"## Long\n\nA long cell.\n\n```{{code-cell}} ipython3\n{body}\n```\n\n## Exercises", 1)
    (tmp_path / "t.md").write_text(src)
    assert [n for _, n in open_cells_over(tmp_path / "t.md")] == [31]
    assert open_cells_over(tmp_path / "t.md", limit=31) == []


def chapter_sections(nb):
    """The chapter's markdown outside code cells, split at its level-2 headings: ``[(title, text)]``."""
    text = "\n\n".join(c.source for c in jupytext.read(nb.with_suffix(".md")).cells if c.cell_type == "markdown")
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return [("", parts[0])] + list(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_opens_with_its_question(nb):
    """The first paragraph under the title starts "**The question.**" and asks it."""
    intro = chapter_sections(nb)[0][1]
    after_title = re.split(r"^# .+$", intro, maxsplit=1, flags=re.M)[-1].strip()
    first = after_title.split("\n\n")[0]
    assert first.startswith("**The question.**") and "?" in first, (
        f"{nb.name}: the first paragraph after the title must start with **The question.** and ask it; got {first[:80]!r}")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_ends_with_what_was_learned(nb):
    """A "What we learned" section closes the chapter (before its exercises), its numbers glued."""
    titles = [t for t, _ in chapter_sections(nb)[1:]]
    assert titles[-2:] == ["What we learned", "Exercises"], (
        f"{nb.name}: the last sections must be 'What we learned' then 'Exercises'; got {titles[-2:]}")
    summary = dict(chapter_sections(nb))["What we learned"]
    if nb.name != "template.ipynb":
        assert "{glue:text}" in summary, f"{nb.name}: the summary quotes no glued number"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_every_figure_keeps_the_figure_rules(nb):
    """A cell that draws a figure checks it (gmlib.plotting.check_figure), and the set-up cell asks for retina PNGs."""
    code = [c.source for c in jupytext.read(nb).cells if c.cell_type == "code"]
    unchecked = [i for i, src in enumerate(code) if _MAKES_FIGURE.search(src) and "check_figure(" not in src]
    assert not unchecked, f"{nb.name}: code cells {unchecked} draw a figure and never call plotting.check_figure"
    assert 'set_matplotlib_formats("retina")' in code[1], f"{nb.name}: the set-up cell asks for no retina PNGs"


# ----------------------------------------------------------------------------- publishing metadata


def tool(name: str) -> str:
    """A command-line tool of the metadata checks: installed by `make tools` in .venv/tools/<name>."""
    path = ROOT / ".venv" / "tools" / name / "bin" / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing in CI (the Makefile's tools target installs it)")
        pytest.skip(f"{name} is not installed (run `make tools`)")
    return str(path)


def test_workflows_follow_the_github_schema():
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert {w.name for w in workflows} >= {"book.yml", "ci.yml"}
    out = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
                          *map(str, workflows)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    book = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    uses = [s.get("uses", "") for job in book["jobs"].values() for s in job.get("steps", [])]
    assert any(u.startswith("actions/upload-pages-artifact") for u in uses)
    assert any(u.startswith("actions/deploy-pages") for u in uses)
    ci = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert "pull_request" in ci and "bash .ci/run" in ci


def test_citation_file_is_valid():
    out = subprocess.run([tool("cffconvert"), "--validate", "-i", str(ROOT / "CITATION.cff")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["repository-code"] == config()["repository"]["url"]
    assert any("2610.11798" in str(ref) for ref in cff["references"]), "cite the paper the book follows"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_zenodo_metadata_agrees_with_the_citation_file():
    """.zenodo.json (the DOI record Zenodo mints for each GitHub release) says what CITATION.cff says."""
    zen = json.loads((ROOT / ".zenodo.json").read_text())
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert zen["upload_type"] == "software" and zen["description"].strip()
    assert (zen["title"], zen["version"], zen["license"]) == (cff["title"], cff["version"], cff["license"])
    assert [c["name"] for c in zen["creators"]] == [a.get("name") or f"{a['family-names']}, {a['given-names']}"
                                                    for a in cff["authors"]]
    related = {r["identifier"]: r["relation"] for r in zen["related_identifiers"]}
    papers = [i["value"] for ref in cff["references"] for i in ref.get("identifiers", [])]
    assert related.get(papers[0]) == "isSupplementTo", "the record must point to the paper the book follows"
    assert set(papers) <= set(related)


def test_release_workflow_builds_and_attaches_the_artefacts():
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    assert wf[True]["push"]["tags"] == ["v*"]  # YAML reads the key `on` as True
    assert wf["permissions"]["contents"] == "write"
    run = "\n".join(s.get("run", "") for job in wf["jobs"].values() for s in job["steps"])
    assert "python -m build" in run and "make strict" in run and "gh release upload" in run
    assert "GITHUB_REF_NAME" in run and "pyproject.toml" in run  # the tag must name pyproject's version


def test_api_page_lists_every_public_name():
    """book/api.md documents each public name explicitly (autofunction / autoclass / autodata)."""
    api = (BOOK / "api.md").read_text()
    for modname in PUBLIC_MODULES:
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            assert re.search(rf":: {re.escape(modname)}\.{name}\s", api), f"{modname}.{name} is missing from book/api.md"


def test_chapter_code_is_ruff_formatted():
    """`make format` leaves every twin as it is (ruff format, book/ruff.toml)."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "format_chapters.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"{out.stdout}{out.stderr}(run `make format`)"


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.name)
def test_every_numref_has_a_target(nb):
    """Each {numref} names a figure (or a labelled equation or section) of the chapter: no dangling reference."""
    text = nb.with_suffix(".md").read_text()
    refs = {m.group(2) for m in re.finditer(r"\{numref\}`([^`<]*<)?([\w-]+)>?`", text)}
    figures = {c.metadata.get("mystnb", {}).get("figure", {}).get("name") for c in jupytext.read(nb).cells}
    labels = set(re.findall(r"^\(([\w-]+)\)=$", text, flags=re.M)) | set(re.findall(r":(?:label|name): ([\w-]+)", text))
    assert refs <= figures | labels, f"{nb.name}: {{numref}} to missing targets {sorted(refs - figures - labels)}"


def test_chapters_are_executed_into_the_cache_and_failures_reported(tmp_path, capsys):
    """execute_chapters caches a notebook that runs (the build then matches it), not one that fails."""
    import execute_chapters
    from jupyter_cache import get_cache

    def notebook(name, source):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)],
                                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                               "language": "python"}})
        nbformat.write(nb, tmp_path / name)
        return tmp_path / name

    good, bad = notebook("good.ipynb", "print(6 * 7)"), notebook("bad.ipynb", "assert 1 == 2, 'wrong'")
    cache_dir = tmp_path / "cache"
    assert execute_chapters.main([str(good), str(bad), "--jobs", "2", "--cache", str(cache_dir)]) == 1
    out = capsys.readouterr().out
    assert "good.ipynb: executed" in out and "bad.ipynb: failed" in out and "AssertionError" in out
    cache = get_cache(str(cache_dir))
    cached = cache.merge_match_into_notebook(nbformat.read(good, as_version=4))[1]
    assert cached.cells[0].outputs[0].text == "42\n"
    with pytest.raises(KeyError):
        cache.match_cache_notebook(nbformat.read(bad, as_version=4))
    assert execute_chapters.main([str(good), "--cache", str(cache_dir)]) == 0  # matched: not executed again
    assert "good.ipynb: in the cache already" in capsys.readouterr().out


def _list_markers_inside_formulas(text):
    """Lines of Markdown that open a list item ("- ", "+ ", "* ", "1. ") while an inline formula is open.

    MyST reads such a line as a list item and the formula around it is left as raw TeX on the
    page: a source line must not start with an operator inside ``$...$``. Code blocks are
    skipped; directive bodies (a proposition, a solution) are Markdown and are checked.
    """
    found, fences, dollars = [], [], 0
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^(`{3,})\s*(\{[^}]*\}|\w*)", line)
        if fence:
            if fences and fences[-1] == "code":
                fences.pop()
            elif fence[2].startswith("{") or fence[2]:  # a directive, or a code block with a language
                fences.append("directive" if fence[2].startswith("{") else "code")
            elif fences:  # a bare fence closes the directive
                fences.pop()
            else:
                fences.append("code")
            dollars = 0
            continue
        if fences and fences[-1] == "code":
            continue
        if not line.strip() or line.startswith(":"):
            dollars = 0
            continue
        if dollars % 2 and re.match(r"^\s*([-+*]|\d+\.)\s", line):
            found.append((n, line.strip()[:60]))
        dollars += len(re.findall(r"(?<!\\)\$", line.replace("$$", "")))
    return found


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_no_line_inside_a_formula_starts_a_list(nb):
    """No Markdown line inside an inline formula starts with "- ", "+ ", "* " or "1. " (it breaks the formula)."""
    bad = [hit for c in jupytext.read(nb).cells if c.cell_type == "markdown"
           for hit in _list_markers_inside_formulas(c.source)]
    assert not bad, f"{nb.name}: move the operator to the end of the previous line: {bad}"


def test_the_formula_check_can_fail():
    """The check finds the two cases that broke pages (a "- " and a "+ " opening a line inside $...$)."""
    text = "```{prf:proposition}\n$\\beta = a\n- b$.\n```\n\nThen $x = y\n+ z$ holds.\n\n- a real item $x$\n"
    assert [n for n, _ in _list_markers_inside_formulas(text)] == [3, 7]
