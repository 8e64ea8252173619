"""Print pip constraints that pin gmlib's own dependencies at the lowest versions pyproject.toml allows.

Each dependency in ``[project].dependencies`` must declare a lower bound (``name>=X``; the
only kind gmlib declares, so that Colab keeps its own jax): it becomes ``name==X``. pip then
installs gmlib's direct dependencies at their declared floors and everything else (jaxlib,
chex, ml_dtypes, the test tools) at the newest versions compatible with them, as
``uv pip install --resolution lowest-direct`` would. ``make lowest`` runs the smoke tests
(``pytest -m smoke``) and chapter 1 in such an environment.

    python3 tests/lowest_constraints.py > lowest.txt
    pip install -c lowest.txt -e . pytest hypothesis nbval ipykernel

Standard library only (it runs before any environment exists).
"""

from __future__ import annotations

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*)(;.*)?$")


def lowest_pins(dependencies: list[str]) -> list[str]:
    """``name==X`` for each ``name>=X`` requirement (its other specifiers and markers are left to pip)."""
    pins = []
    for requirement in dependencies:
        match = _REQUIREMENT.match(requirement)
        if match is None:
            raise ValueError(f"cannot read the requirement {requirement!r}")
        name, specifiers = match[1], [s.strip() for s in match[3].split(",") if s.strip()]
        floors = [s[2:].strip() for s in specifiers if s.startswith(">=")]
        if len(floors) != 1:
            raise ValueError(f"{requirement!r} must declare one lower bound (name>=X); got {specifiers}")
        pins.append(f"{name}=={floors[0]}")
    return pins


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    print("# gmlib's dependencies at the lowest versions pyproject.toml allows (tests/lowest_constraints.py)")
    print("\n".join(lowest_pins(project["dependencies"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
