"""The book's invariants: notebook twins, clean notebooks, Colab install cells, toc and API page."""

import importlib
import json
import pathlib
import re

import jupytext
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb")) + [BOOK / "template.ipynb"]
CHAPTERS = [nb for nb in NOTEBOOKS if nb.name != "template.ipynb"]
PUBLIC_MODULES = ["gmlib", "gmlib.lda", "gmlib.denoise", "gmlib.train", "gmlib.plotting"]


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
    n_sol = len(re.findall(r"```\{solution\}[^\n]*\n:class: dropdown", text))
    assert n_ex >= 3 and n_sol >= n_ex, f"{nb.name}: {n_ex} exercises, {n_sol} folded solutions"


def test_api_page_lists_every_public_name():
    """book/api.md documents each public name explicitly (autofunction / autoclass / autodata)."""
    api = (BOOK / "api.md").read_text()
    for modname in PUBLIC_MODULES:
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            assert re.search(rf":: {re.escape(modname)}\.{name}\s", api), f"{modname}.{name} is missing from book/api.md"
