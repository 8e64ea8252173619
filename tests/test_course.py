"""The teacher's edition (book/course.md): student notebooks and otter-grader assignments.

The student versions of every chapter and of the template are built here (no execution) and
checked for leftovers of a solution; chapter 1's and the template's are executed. The
otter-grader assignment of chapter 1 is made and graded with ``otter run``: the reference
solutions get full marks and the untouched student notebook none. That test needs otter's
own venv (``make assignments`` makes it) and is skipped without it.
"""

import ast
import copy
import json
import os
import pathlib
import re
import subprocess
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import course

BOOK = ROOT / "book"
NOTEBOOKS = course.chapters() + [BOOK / "template.ipynb"]
OTTER = ROOT / ".venv" / "tools" / "otter" / "bin" / "otter"
LIGHT = BOOK / "01_gaussian_prompts.ipynb"  # the chapter the running times are measured against


def _code(nb):
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_student_version_has_no_solution(path):
    """No solution directive, no code of a gated solution, every exercise kept, a Colab link on top."""
    nb = nbformat.read(path, as_version=4)
    items = course.split(nb)
    gated = [i for i in items if isinstance(i, course.Gated)]
    words = [i for i in items if isinstance(i, course.Words)]
    assert gated and words, f"{path.name}: no computing or no written solution found (the parser broke?)"
    student = course.student_notebook(path)
    assert not course.solution_leftovers(student)
    text = "\n".join(c.source for c in student.cells if c.cell_type == "markdown")
    for item in words:
        assert item.text.strip() not in text, f"{path.name}: the solution of {item.label} is still there"
    code = _code(student)
    for item in gated:
        for cell in item.code:
            assert cell.source.strip() not in code, f"{path.name}: the code of {item.label} is still there"
    exercises = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown").count("{exercise}")
    assert text.count("{exercise}") == exercises, f"{path.name}: an exercise went with the solutions"
    assert course.colab_url(path.name) in student.cells[0].source


def test_solution_parser_on_a_made_up_chapter():
    """Solutions that share a cell with an exercise, a longer fence, text around them."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            "Intro.\n\n```{exercise}\n:label: a\n\nQ1\n```\n\n````{solution} a\n:class: dropdown\n\n"
            "```python\nx = 1\n```\n````\n\n```{exercise}\n:label: b\n\nQ2\n```\n\n"
            "```{solution-start} b\n:class: dropdown\n```\n\nWhy."
        ),
        nbformat.v4.new_code_cell("y = 2\nassert y == 2"),
        nbformat.v4.new_markdown_cell("```{solution-end}\n```\n\nAfter."),
    ]
    items = course.split(nb)
    kept = [i.source for i in items if isinstance(i, nbformat.NotebookNode)]
    assert kept == [
        "Intro.\n\n```{exercise}\n:label: a\n\nQ1\n```",
        "```{exercise}\n:label: b\n\nQ2\n```",
        "After.",
    ]
    (words,) = [i for i in items if isinstance(i, course.Words)]
    assert words.label == "a" and "x = 1" in words.text
    (gated,) = [i for i in items if isinstance(i, course.Gated)]
    assert gated.label == "b" and gated.words == ["", "Why."] and len(gated.code) == 1
    solution, tested, tests, reset = course.question(gated)
    assert (solution, tested, tests, reset) == ("y = 2", ["y"], ["assert y == 2"], ["y"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_computing_exercise_is_autograded(path):
    """Each gated solution gives tests, and each test reads a name the student's cell resets or
    the chapter never defines: the untouched student notebook cannot pass it."""
    items = course.split(nbformat.read(path, as_version=4))
    chapter = set()
    for item in items:
        if isinstance(item, nbformat.NotebookNode) and item.cell_type == "code":
            chapter |= course._bound_names(ast.parse(item.source))
    for item in items:
        if isinstance(item, course.Gated):
            _, tested, tests, reset = course.question(item)
            assert tests, f"{path.name}: the solution of {item.label} asserts nothing about its own names"
            for test in tests:
                names = course._loaded_names(ast.parse(test)) & set(tested)
                assert names & (set(reset) | (set(tested) - chapter)), f"{path.name} {item.label}: {test}"


@pytest.mark.parametrize("path", [LIGHT, BOOK / "template.ipynb"], ids=lambda p: p.name)
def test_student_version_executes(path, tmp_path):
    """Without its solutions, the notebook still runs to the end (nothing later needs them)."""
    executed_path = tmp_path / path.name
    course.write_students([path], tmp_path)
    nb = nbformat.read(executed_path, as_version=4)
    course.execute(copy.deepcopy(nb), path.parent)


def _grade(notebook: pathlib.Path, autograder: pathlib.Path, tmp: pathlib.Path) -> dict[str, float]:
    """``otter run`` on one notebook: score per question."""
    tmp.mkdir()
    (tmp / notebook.name).write_bytes(notebook.read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [str(OTTER), "run", "-a", str(autograder), "-o", str(tmp), notebook.name],
        cwd=tmp,
        env=env,
        check=True,
        capture_output=True,
    )
    results = json.loads((tmp / "results.json").read_text())["tests"]
    return {r["name"]: (r["score"], r["max_score"]) for r in results if "score" in r}


@pytest.mark.parametrize("path", [BOOK / "template.ipynb", LIGHT], ids=lambda p: p.name)
def test_assignment_grades_solutions_and_not_blanks(path, tmp_path):
    """otter assign makes the assignment; the reference solutions get full marks, the untouched
    student notebook none, on every computing exercise."""
    if not OTTER.exists():
        pytest.skip("otter-grader's venv is missing: `make assignments` makes it")
    course.write_assignments([path], tmp_path, otter=str(OTTER))
    dist = tmp_path / path.stem / "dist"
    (autograder,) = (dist / "autograder").glob("*.zip")
    gated = [i.label for i in course.split(nbformat.read(path, as_version=4)) if isinstance(i, course.Gated)]
    reference = _grade(dist / "autograder" / path.name, autograder, tmp_path / "reference")
    blank = _grade(dist / "student" / path.name, autograder, tmp_path / "blank")
    assert sorted(reference) == sorted(blank) == sorted(gated)
    assert all(score == top > 0 for score, top in reference.values()), reference
    assert all(score == 0 for score, _ in blank.values()), blank


def test_course_page_numbers_the_exercises_as_the_chapters_do():
    """The course page names exercises "N.k" (the k-th exercise of chapter N) with a link to
    its label: the number must still be the label's place in the chapter."""
    labels = {}
    for n, path in enumerate(course.chapters(), start=1):
        text = "\n".join(
            c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"
        )
        for k, label in enumerate(re.findall(r"```\{exercise\}[^\n]*\n:label: ([\w-]+)", text), start=1):
            labels[label] = f"{n}.{k}"
    refs = re.findall(r"\{ref\}`(\d+\.\d+) <([\w-]+)>`", (BOOK / "course.md").read_text())
    assert refs, "no exercise named on the course page"
    for number, label in refs:
        assert labels.get(label) == number, f"course.md calls {label} {number}; it is {labels.get(label)}"
