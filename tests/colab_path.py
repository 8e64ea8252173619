"""The Colab path: each chapter's install cell, forced on in a Colab-like environment, lets it run to the end.

Creates a fresh virtual environment holding only what Colab provides (jax, numpy,
matplotlib) plus what executing a notebook needs (ipykernel, nbclient), then executes each
chapter notebook in it with ``GMLIB_INSTALL_SOURCE=<this checkout>``: the first cell then
runs exactly as in Colab, except that it installs gmlib from the checkout instead of the
GitHub URL (``pip install --no-deps``, then whatever of optax/scipy/tqdm is missing). Each
notebook runs in an empty temporary folder (as in Colab's /content), so nothing of the
checkout is importable except through the install; a last cell, appended here, asserts
that ``gmlib`` was imported from the environment's site-packages.

    python3 tests/colab_path.py                      # every chapter
    python3 tests/colab_path.py book/01_*.ipynb      # some chapters
    python3 tests/colab_path.py --venv /tmp/colab    # keep (and reuse) the environment

Needs network access to the package index (the environment is built from it, like Colab's
install cell). Exit status 0 when every chapter runs to the end. Prints the time each took.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLAB_PACKAGES = ["jax", "numpy", "matplotlib", "flax"]  # what Colab has and gmlib needs (flax: chapter 9)
RUNNER_PACKAGES = ["ipykernel", "nbclient", "nbformat"]  # to execute a notebook, as Colab's own kernel does
KERNEL = "gmlib-colab-check"
CHECK_CELL = (
    "import gmlib, importlib.util, pathlib\n"
    "where = pathlib.Path(gmlib.__file__).resolve()\n"
    "assert 'site-packages' in where.parts, f'gmlib came from {where}, not from the install cell'\n"
    "assert all(importlib.util.find_spec(p) for p in ('optax', 'scipy', 'tqdm'))\n"
    "print('gmlib from', where.parent)"
)


def make_venv(path: pathlib.Path) -> pathlib.Path:
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, *COLAB_PACKAGES, *RUNNER_PACKAGES], check=True)
        subprocess.run([str(python), "-m", "ipykernel", "install", "--prefix", str(path), "--name", KERNEL],
                       check=True, capture_output=True)
    found = subprocess.run([str(python), "-c", "import importlib.util as u; "
                            "print([p for p in ('gmlib', 'optax', 'scipy', 'tqdm') if u.find_spec(p)])"],
                           check=True, capture_output=True, text=True, cwd="/").stdout.strip()
    print(f"environment {path}: of gmlib/optax/scipy/tqdm it already holds {found}", flush=True)
    return python


def run_inner(notebook: str, timeout: int) -> None:
    """Inside the environment: execute ``notebook`` in an empty folder, with the check cell appended."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(CHECK_CELL))
    with tempfile.TemporaryDirectory(prefix="colab-content-") as content:
        NotebookClient(nb, timeout=timeout, kernel_name=KERNEL,
                       resources={"metadata": {"path": content}}).execute()
    print(nb.cells[-1].outputs[-1].text.strip() if nb.cells[-1].outputs else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
    parser.add_argument("--venv", type=pathlib.Path, default=None,
                        help="where to create (or reuse) the environment; default: a temporary folder, removed after")
    parser.add_argument("--timeout", type=int, default=900, help="per-cell timeout in seconds")
    parser.add_argument("--source", default=str(ROOT), help="what the install cell installs gmlib from")
    parser.add_argument("--inner", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        run_inner(args.inner, args.timeout)
        return 0
    notebooks = [p.resolve() for p in args.notebooks] or sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    venv = args.venv or pathlib.Path(tempfile.mkdtemp(prefix="gmlib-colab-venv-"))
    start = time.time()
    python = make_venv(venv)
    print(f"environment ready in {time.time() - start:.0f} s", flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MPLBACKEND", "VIRTUAL_ENV")}
    env.update(GMLIB_INSTALL_SOURCE=args.source, PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    failures = []
    try:
        for nb in notebooks:
            t0 = time.time()
            proc = subprocess.run([str(python), str(pathlib.Path(__file__).resolve()), "--inner", str(nb),
                                   "--timeout", str(args.timeout)], env=env, capture_output=True, text=True)
            took = time.time() - t0
            if proc.returncode:
                failures.append(nb.name)
                print(f"{nb.name}: FAILED after {took:.0f} s\n{proc.stdout[-3000:]}{proc.stderr[-6000:]}", flush=True)
            else:
                print(f"{nb.name}: ran to the end in {took:.0f} s ({proc.stdout.strip().splitlines()[-1]})",
                      flush=True)
    finally:
        if args.venv is None:
            shutil.rmtree(venv, ignore_errors=True)
    print(f"{len(notebooks) - len(failures)}/{len(notebooks)} chapters ran to the end "
          f"({time.time() - start:.0f} s in all)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
