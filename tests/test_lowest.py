"""`make lowest`: constraints that follow pyproject.toml, and a smoke selection that covers the API."""

import pathlib
import re
import tomllib

import pytest

import lowest_constraints

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEPENDENCIES = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def test_constraints_pin_every_dependency_at_its_lower_bound():
    pins = lowest_constraints.lowest_pins(DEPENDENCIES)
    assert [p.split("==")[0] for p in pins] == [re.split(r"[<>=!~;\[ ]", d)[0] for d in DEPENDENCIES]
    for pin, dependency in zip(pins, DEPENDENCIES):
        assert dependency.replace(" ", "").startswith(pin.replace("==", ">=")), (pin, dependency)
    assert lowest_constraints.lowest_pins(["jax >= 0.4.35, < 1; python_version >= '3.10'"]) == ["jax==0.4.35"]


@pytest.mark.parametrize("bad", ["jax", "jax<1", "numpy>=1.26,>=2"])
def test_a_dependency_without_one_lower_bound_is_refused(bad):
    with pytest.raises(ValueError, match="lower bound"):
        lowest_constraints.lowest_pins([bad])


def test_requirements_declare_the_same_lower_bounds():
    """requirements.txt (the full stack) states gmlib's floors as pyproject.toml does."""
    text = (ROOT / "requirements.txt").read_text()
    lines = {re.split(r"[<>=]", line)[0].strip(): line.strip() for line in text.splitlines()
             if line.strip() and not line.startswith("#")}
    for dependency in DEPENDENCIES:
        name = re.split(r"[<>=]", dependency)[0].strip()
        assert lines.get(name) == dependency.replace(" ", ""), (lines.get(name), dependency)


def test_the_smoke_selection_calls_every_public_callable():
    """`-m smoke` includes the contract test that calls each public callable of every public module once."""
    contract = (ROOT / "tests" / "test_contract.py").read_text()
    assert re.search(r"@pytest\.mark\.smoke\n(@[^\n]*\n)*def test_the_valid_call_runs\(", contract)
    assert 'MODULES = ["gmlib", "gmlib.plotting", "gmlib.lda", "gmlib.denoise", "gmlib.regression", "gmlib.train"]' in contract
