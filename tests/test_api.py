"""The public API, derived from ``__all__``: every name exists, and its module's test file uses it."""

import ast
import importlib
import pathlib

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
MODULES = ["gmlib", "gmlib.plotting", "gmlib.lda", "gmlib.denoise", "gmlib.train", "gmlib.transformer"]


def _names_used(path):
    """Names and attributes read inside the test functions of a file."""
    tree = ast.parse(path.read_text())
    used = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_"):
            for node in ast.walk(fn):
                if isinstance(node, ast.Name):
                    used.add(node.id)
                elif isinstance(node, ast.Attribute):
                    used.add(node.attr)
    return used


USED = None


def _used_anywhere():
    global USED
    if USED is None:
        USED = set().union(*(_names_used(f) for f in TESTS.glob("test_*.py")))
    return USED


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_is_tested(module):
    """Every name of ``module.__all__`` exists and is used by a test function (in tests/test_X.py for gmlib/X.py)."""
    mod = importlib.import_module(module)
    missing = []
    for name in mod.__all__:
        obj = getattr(mod, name)  # raises if __all__ lists a name the module lacks
        if name not in _used_anywhere():
            home = (getattr(obj, "__module__", None) or module).split(".")[-1].lstrip("_")
            missing.append(f"{name} (add its tests to tests/test_{home}.py)")
    assert not missing, f"public names of {module} used by no test: {missing}"


def test_one_version_everywhere():
    """gmlib.__version__, pyproject.toml, CITATION.cff and the newest CHANGELOG entry name one version."""
    import re

    import gmlib

    root = TESTS.parent
    found = {
        "gmlib.__version__": gmlib.__version__,
        "pyproject.toml": re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M)[1],
        "CITATION.cff": re.search(r"^version: (\S+)", (root / "CITATION.cff").read_text(), re.M)[1],
        "CHANGELOG.md": re.search(r"^## (\S+)", (root / "CHANGELOG.md").read_text(), re.M)[1],
    }
    assert len(set(found.values())) == 1, found
