"""The teacher's edition: student notebooks without solutions, and otter-grader assignments.

Both are derived from the chapters as they are written, so that a new chapter gets them for
free (``book/teaching.md``, step 8). What marks a solution is the book's own syntax:

- a solution in words is a ``{solution}`` directive (``:class: dropdown``) in a Markdown
  cell;
- a solution that computes is *gated*: a ``{solution-start}`` directive, then Markdown text
  and code cells, then a ``{solution-end}`` directive. Its code cells end in ``assert``
  statements, which the build executes.

``student``: each chapter without any solution (dropdowns removed, gated blocks removed with
their code cells; the exercises are kept), with a Markdown cell at the top that opens it in
Colab. ``--execute`` runs each one (as nbval would: the notebook's folder, its kernel) and
fails if one raises.

``assignments``: for each chapter an otter-grader master notebook (``otter assign``'s
"v1" format) is written and ``otter assign`` turns it into a student notebook and an
autograder (a Gradescope zip, also what ``otter run`` grades locally). A computing
exercise becomes an autograded question: its solution is the code of the gated cells, its
tests are the top-level ``assert`` statements of those cells that check a name the
solution defines (an assert about the chapter's own variables checks the chapter, not the
student, and stays in the solution). The student sees ``...`` in place of the solution and
the names the tests read. A solution in words becomes a manually graded question.

It is also the Sphinx extension (``_config.yml``: ``sphinx: local_extensions``) that puts
the student notebooks into the built site (``student/NN_*.ipynb``) and a "Student version"
line under the title of each chapter page (download, or open in Colab from the repository's
``student`` branch, which the publishing workflow fills from the site's ``student/``).

    make student       # = .venv/bin/python book/_ext/course.py student --execute --jobs N
    make assignments   # = .venv/tools/otter/bin/python book/_ext/course.py assignments
"""

from __future__ import annotations

import argparse
import ast
import builtins
import copy
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import nbformat
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUDENT_DIR = ROOT / "_build" / "student"
ASSIGNMENTS_DIR = ROOT / "_build" / "assignments"
# The branch the publishing workflow fills with the site's student/ (Colab opens from it).
STUDENT_BRANCH = "student"

# A directive opens with a fence of 3+ backticks or colons and its name in braces.
_OPEN = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[\w-]+)\}\s*(?P<arg>.*)$")
SOLUTION_DIRECTIVES = ("solution", "solution-start", "solution-end")


def chapters() -> list[pathlib.Path]:
    """Every chapter notebook, in the book's order."""
    return sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


@dataclasses.dataclass
class Words:
    """A solution in words: a ``{solution}`` directive."""

    label: str
    text: str


@dataclasses.dataclass
class Gated:
    """A gated solution: the Markdown and the code cells between solution-start and -end."""

    label: str
    words: list[str] = dataclasses.field(default_factory=list)
    code: list = dataclasses.field(default_factory=list)  # nbformat code cells


def _directive_end(lines: list[str], start: int, fence: str) -> int:
    """Index of the line that closes the directive opened at ``start`` (same fence character,
    at least as long, nothing else on the line)."""
    closing = re.compile(rf"^{re.escape(fence[0])}{{{len(fence)},}}\s*$")
    for j in range(start + 1, len(lines)):
        if closing.match(lines[j]):
            return j
    raise ValueError(f"directive opened by {lines[start]!r} is never closed")


def _body(lines: list[str]) -> str:
    """A directive's body without its leading ``:option:`` lines."""
    i = 0
    while i < len(lines) and re.match(r"^:[\w-]+:", lines[i]):
        i += 1
    return "\n".join(lines[i:]).strip("\n")


def split(nb) -> list:
    """The notebook as a sequence of cells (kept as they are), ``Words`` and ``Gated`` items.

    Markdown cells holding a solution directive are cut around it: the text before and after
    it stays (an exercise often shares a cell with the previous solution's end)."""
    items, gated = [], None

    def keep_text(cell, lines, part):
        text = "\n".join(lines).strip("\n")
        if text.strip():
            new = nbformat.v4.new_markdown_cell(
                text, metadata=copy.deepcopy(cell.metadata)
            )
            new.id = f"{cell.id}-{part}" if part else cell.id
            items.append(new)

    for cell in nb.cells:
        if cell.cell_type != "markdown":
            (gated.code if gated is not None else items).append(cell)
            continue
        lines, kept, part, i = cell.source.splitlines(), [], 0, 0
        while i < len(lines):
            m = _OPEN.match(lines[i])
            if m and m["name"] in SOLUTION_DIRECTIVES:
                end = _directive_end(lines, i, m["fence"])
                if gated is None:
                    keep_text(cell, kept, part)
                    kept, part = [], part + 1
                if m["name"] == "solution":
                    if gated is not None:
                        raise ValueError(
                            f"a {{solution}} inside the gated solution of {gated.label}"
                        )
                    items.append(Words(m["arg"].strip(), _body(lines[i + 1 : end])))
                elif m["name"] == "solution-start":
                    if gated is not None:
                        raise ValueError(
                            f"solution-start inside the gated solution of {gated.label}"
                        )
                    gated = Gated(m["arg"].strip())
                else:  # solution-end
                    if gated is None:
                        raise ValueError("solution-end without a solution-start")
                    items.append(gated)
                    gated = None
                i = end + 1
                continue
            (gated.words if gated is not None else kept).append(lines[i])
            i += 1
        if gated is None:
            keep_text(cell, kept, part)
    if gated is not None:
        raise ValueError(f"the gated solution of {gated.label} has no solution-end")
    return items


def _repository() -> tuple[str, str]:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url = config["repository"]["url"].rstrip("/")
    return url, url.removeprefix("https://github.com/")


def colab_url(name: str) -> str:
    """Where Colab opens the student notebook ``name`` (the publishing workflow pushes
    ``_build/student/`` to the repository's ``student`` branch)."""
    return f"https://colab.research.google.com/github/{_repository()[1]}/blob/{STUDENT_BRANCH}/{name}"


def _title(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def header_cell(path: pathlib.Path, nb, what: str, colab: bool = True):
    """The Markdown cell on top of a student notebook: what it is, and a Colab link."""
    badge = "https://colab.research.google.com/assets/colab-badge.svg"
    text = (
        f"[![Open In Colab]({badge})]({colab_url(path.name)})\n\n" if colab else ""
    ) + (
        f"**{what}** of *{_title(nb)}* (`{path.name}`): the chapter with its exercises and "
        f"without their solutions."
    )
    cell = nbformat.v4.new_markdown_cell(text)
    cell.id = "student-version"
    return cell


def student_notebook(path: pathlib.Path):
    """The chapter at ``path`` without its solutions, a Colab link on top."""
    nb = nbformat.read(path, as_version=4)
    kept = [item for item in split(nb) if not isinstance(item, (Words, Gated))]
    out = copy.deepcopy(nb)
    out.cells = [header_cell(path, nb, "Student version"), *kept]
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return out


def solution_leftovers(nb) -> list[str]:
    """What of a solution a notebook still holds (empty when none)."""
    found = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            found += [
                f"a {{{m}}} directive"
                for m in re.findall(r"\{(solution(?:-start|-end)?)\}", cell.source)
            ]
    return found


def execute(nb, cwd: pathlib.Path, timeout: int = 600):
    """Run ``nb`` in a fresh kernel (the notebook's folder): the executed notebook, or raise."""
    from nbclient import NotebookClient

    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return nb


def write_students(paths, out_dir=STUDENT_DIR, run=False, jobs=1) -> dict[str, float]:
    """Write each chapter's student notebook into ``out_dir``; with ``run``, execute them
    (``jobs`` at a time, one kernel each), raise if one fails, and return the seconds each took."""
    out_dir.mkdir(parents=True, exist_ok=True)
    notebooks = {}
    for path in paths:
        nb = student_notebook(path)
        if leftovers := solution_leftovers(nb):
            raise AssertionError(f"{path.name}: the student version keeps {leftovers}")
        nbformat.write(nb, out_dir / path.name)
        notebooks[path] = nb
        print(f"{path.name}: student version written to {out_dir}", flush=True)
    if not run:
        return {}

    def run_one(path):
        start = time.time()
        execute(copy.deepcopy(notebooks[path]), path.parent)
        return time.time() - start

    from concurrent.futures import ThreadPoolExecutor, as_completed

    seconds, failures = {}, []
    with ThreadPoolExecutor(
        max(1, jobs)
    ) as pool:  # kernels are processes: threads suffice
        running = {
            pool.submit(run_one, path): path for path in sorted(paths, reverse=True)
        }
        for done in as_completed(running):
            name = running[done].name
            try:
                seconds[name] = done.result()
                print(
                    f"{name}: student version executed in {seconds[name]:.1f} s",
                    flush=True,
                )
            except Exception as err:  # noqa: BLE001 (reported below, then raised)
                failures.append(f"{name}: {type(err).__name__}: {err}")
                print(f"{name}: student version FAILED", flush=True)
    if failures:
        raise RuntimeError(
            "student notebooks that do not execute:\n" + "\n".join(failures)
        )
    return seconds


# --- assignments -------------------------------------------------------------------------


def _bound_names(tree: ast.AST) -> set[str]:
    """Names a piece of code binds at its top level (assignments, defs, imports, loops)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _loaded_names(node: ast.AST) -> set[str]:
    return {
        n.id
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }


def _statements(source: str) -> list[tuple[ast.stmt, str]]:
    """Top-level statements of a code cell with their source text (comments between
    statements go with the statement that follows them)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    out, previous_end = [], 0
    for stmt in tree.body:
        out.append((stmt, "\n".join(lines[previous_end : stmt.end_lineno])))
        previous_end = stmt.end_lineno
    return out


def question(gated: Gated) -> tuple[str, list[str], list[str]]:
    """A gated solution as an otter question: (solution code, tested names, test sources)."""
    solution, tests = [], []
    stmts = [s for cell in gated.code for s in _statements(cell.source)]
    defined = set()
    for stmt, _ in stmts:
        if not isinstance(stmt, ast.Assert):
            defined |= _bound_names(stmt)
    defined -= set(dir(builtins))
    tested = set()
    for stmt, text in stmts:
        if isinstance(stmt, ast.Assert) and _loaded_names(stmt) & defined:
            tests.append(ast.unparse(stmt))
            tested |= _loaded_names(stmt) & defined
        else:
            solution.append(text)
    # The names the tests read are reset at the top of the student's cell, so that a value
    # the chapter left under the same name cannot pass a test; a name the solution reads
    # before it binds it keeps its value (the solution builds on it).
    read_first, bound = set(), set()
    for stmt, _ in stmts:
        read_first |= (_loaded_names(stmt) & tested) - bound
        bound |= _bound_names(stmt)
    reset = sorted(tested - read_first)
    return "\n".join(solution).strip("\n"), sorted(tested), tests, reset


def _raw(text: str):
    return nbformat.v4.new_raw_cell(text)


def master_notebook(path: pathlib.Path, requirements: str = "requirements.txt"):
    """The otter-grader master notebook of a chapter (otter assign's v1 format)."""
    nb = nbformat.read(path, as_version=4)
    config = {
        "name": path.stem,
        "requirements": requirements,
        "overwrite_requirements": True,
        "init_cell": False,  # ours, after the chapter's install cell (otter's would come first)
        "check_all_cell": False,
        "export_cell": False,
        "run_tests": False,
        "solutions_pdf": False,
        "generate": {"pdf": False, "filtering": False},
    }
    cells = [
        _raw("# ASSIGNMENT CONFIG\n" + yaml.safe_dump(config, sort_keys=False).strip())
    ]
    cells.append(header_cell(path, nb, "Assignment", colab=False))
    init_done = False
    for item in split(nb):
        if isinstance(item, Words):
            cells += [
                _raw(f"# BEGIN QUESTION\nname: {item.label}\nmanual: true\npoints: 1"),
                nbformat.v4.new_markdown_cell(
                    f"**Your answer to {item.label}** (in words):"
                ),
                _raw("# BEGIN SOLUTION"),
                nbformat.v4.new_markdown_cell(item.text),
                _raw("# END SOLUTION"),
                _raw("# END QUESTION"),
            ]
        elif isinstance(item, Gated):
            solution, tested, tests, reset = question(item)
            if (
                not tests
            ):  # nothing to grade automatically: the words and the code are the answer
                cells += [
                    _raw(
                        f"# BEGIN QUESTION\nname: {item.label}\nmanual: true\npoints: 1"
                    ),
                    _raw("# BEGIN SOLUTION"),
                    nbformat.v4.new_markdown_cell("\n".join(item.words).strip()),
                    _raw("# END SOLUTION"),
                    _raw("# END QUESTION"),
                ]
                continue
            prompt = (
                f"# {item.label}: your code here; the tests read {', '.join(tested)}"
            )
            if reset:
                prompt += f"\n{' = '.join(reset)} = ...  # (not the chapter's values)"
            cells += [
                _raw(f"# BEGIN QUESTION\nname: {item.label}\npoints: {len(tests)}"),
                _raw("# BEGIN SOLUTION"),
                nbformat.v4.new_markdown_cell("\n".join(item.words).strip()),
                nbformat.v4.new_code_cell(
                    f"{prompt}\n# BEGIN SOLUTION\n{solution}\n# END SOLUTION"
                ),
                _raw("# END SOLUTION"),
                _raw("# BEGIN TESTS"),
                *[nbformat.v4.new_code_cell(test) for test in tests],
                _raw("# END TESTS"),
                _raw("# END QUESTION"),
            ]
        else:
            cell = copy.deepcopy(item)
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
            cells.append(cell)
            if cell.cell_type == "code" and not init_done:
                cells.append(otter_init_cell(path))  # right after the install cell
                init_done = True
    out = copy.deepcopy(nb)
    out.cells = cells
    for i, cell in enumerate(out.cells):  # unique ids, as nbformat 4.5 wants
        cell.id = f"c{i:03d}"
    return out


def otter_requirements() -> str:
    """The grading environment (Gradescope's image): a kernel, and gmlib from the book's
    repository with its dependencies (jax, optax, scipy, matplotlib, tqdm)."""
    return f"ipykernel>=6.29\ngmlib @ git+{_repository()[0]}@main\n"


def otter_init_cell(path: pathlib.Path):
    """Otter's set-up, after the chapter's install cell. ``grader.check`` reads the tests
    from the notebook's metadata, in Jupyter; where it cannot (Colab, otter missing) the
    check cells say so and the notebook still runs to the end."""
    return nbformat.v4.new_code_cell(
        "# grader.check(label) runs an exercise's tests (Jupyter, with otter-grader installed)\n"
        "try:\n"
        "    import otter\n\n"
        f'    grader = otter.Notebook("{path.name}")\n'
        "except (ImportError, ValueError) as err:  # Colab, or no otter: no checks here\n"
        '    reason = f"{type(err).__name__}: {err}"\n\n'
        "    class grader:  # stands in for otter.Notebook\n"
        "        def check(label):\n"
        '            print(f"{label} is not checked here ({reason}); the autograder grades it.")\n'
    )


def write_assignments(paths, out_dir=ASSIGNMENTS_DIR, otter="otter") -> None:
    """Write each chapter's master notebook and run ``otter assign`` on it: ``out_dir/NN_x/``
    holds ``master/`` (the input), ``student/`` and ``autograder/`` (otter's output)."""
    for path in paths:
        where = out_dir / path.stem
        shutil.rmtree(where, ignore_errors=True)
        (where / "master").mkdir(parents=True)
        (where / "master" / "requirements.txt").write_text(otter_requirements())
        nbformat.write(master_notebook(path), where / "master" / path.name)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), os.environ.get("PYTHONPATH", "")]
            ),
        }
        subprocess.run(
            [
                otter,
                "assign",
                "--no-run-tests",
                str(where / "master" / path.name),
                str(where / "dist"),
            ],
            check=True,
            env=env,
            cwd=where / "master",
        )
        print(
            f"{path.name}: assignment written to {where}/dist",
            flush=True,
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("student", help="write _build/student/NN_*.ipynb")
    s.add_argument(
        "notebooks", nargs="*", type=pathlib.Path, help="default: every chapter"
    )
    s.add_argument(
        "--execute", action="store_true", help="execute each student notebook"
    )
    s.add_argument("--jobs", type=int, default=1, help="notebooks executed at once")
    s.add_argument("--out", type=pathlib.Path, default=STUDENT_DIR)
    a = sub.add_parser(
        "assignments", help="write _build/assignments/NN_*/ with otter assign"
    )
    a.add_argument(
        "notebooks", nargs="*", type=pathlib.Path, help="default: every chapter"
    )
    a.add_argument(
        "--otter",
        default=str(pathlib.Path(sys.executable).parent / "otter"),
        help="otter's executable",
    )
    a.add_argument("--out", type=pathlib.Path, default=ASSIGNMENTS_DIR)
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or chapters()
    if args.what == "student":
        seconds = write_students(paths, args.out, run=args.execute, jobs=args.jobs)
        first = seconds.get(chapters()[0].name)
        for name in sorted(seconds):
            ratio = (
                f"  ({seconds[name] / first:.1f}x chapter 1, {args.jobs} at a time)"
                if first
                else ""
            )
            print(f"  {name}: {seconds[name]:6.1f} s{ratio}")
    else:
        write_assignments(paths, args.out, otter=args.otter)
    return 0


# --- the Sphinx extension ----------------------------------------------------------------


def _chapter_docnames(app) -> dict[str, pathlib.Path]:
    """docname -> notebook, for the chapters of the book (book/NN_*.ipynb)."""
    src = pathlib.Path(app.srcdir)
    return {
        str(p.relative_to(src).with_suffix("")).replace(os.sep, "/"): p
        for p in chapters()
    }


def _add_student_line(app, doctree) -> None:
    """Under the title of a chapter page: the student version, to download or open in Colab."""
    from docutils import nodes

    path = _chapter_docnames(app).get(app.env.docname)
    section = next(iter(doctree.findall(nodes.section)), None)
    if path is None or section is None:
        return
    depth = app.env.docname.count("/")
    para = nodes.paragraph(classes=["student-version"])
    para += nodes.strong(text="Student version")
    para += nodes.Text(" (the exercises without their solutions): ")
    para += nodes.reference(
        "", "download the notebook", refuri="../" * depth + f"student/{path.name}"
    )
    para += nodes.Text(" or ")
    para += nodes.reference("", "open it in Colab", refuri=colab_url(path.name))
    para += nodes.Text(".")
    title = next(iter(section.findall(nodes.title)))
    title.parent.insert(title.parent.index(title) + 1, para)


def _copy_student_notebooks(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        write_students(chapters(), pathlib.Path(app.outdir) / "student")


def setup(app):
    app.connect("doctree-read", _add_student_line)
    app.connect("build-finished", _copy_student_notebooks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    sys.exit(main())
