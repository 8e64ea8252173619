"""nbval in strict mode on the chapters as the build executed them: a reproducible book.

The strict build (``make strict``) leaves one execution of every chapter in its jupyter-cache
(``_build/.jupyter_cache``, filled by ``tests/execute_chapters.py``). myst-nb's
``_build/jupyter_execute/*.ipynb`` carry no outputs in cache mode, so this script exports
each chapter with the build's outputs merged in (jupyter-cache's
``merge_match_into_notebook``) into ``_build/nbval/``, then runs

    pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
           --nbval-cell-timeout <the build's, _config.yml> _build/nbval/*.ipynb

which executes every chapter once more and compares each cell's outputs with the build's:
streams, ``text/plain``, HTML and glue records (``application/papermill.record/...``), after
the substitutions of the sanitize file (addresses, tqdm times, timings, animation ids, image
bytes); nbval does not compare PNG/JPEG outputs. The chapters are spread over ``--jobs``
processes (pytest-xdist, one notebook per process, the heavier ones first). The
re-execution runs with another PYTHONHASHSEED than the build (which ``make`` pins to 0), so
a chapter whose output depends on set or hash order fails here too.

A notebook whose code is not in the cache (not built yet, edited since, or the template) is
exported as committed, without outputs: nbval then only checks that its cells run (as
``--nbval-lax`` would), and the script says so.

    .venv/bin/python tests/nbval_chapters.py --jobs 2               # every chapter, against the build
    .venv/bin/python tests/nbval_chapters.py book/01_*.ipynb        # some notebooks

Exit status: pytest's (0 when every cell ran and every compared output agreed).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys

import nbformat
from jupyter_cache import get_cache

from execute_chapters import CACHE, TIMEOUT, chapters

ROOT = pathlib.Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"
OUT = ROOT / "_build" / "nbval"


def nbval_options(timeout: float = TIMEOUT) -> list[str]:
    """nbval's options for the comparison (strict mode; the same in tests/test_nbval.py)."""
    return ["--nbval", "--nbval-current-env", f"--nbval-sanitize-with={SANITIZE}",
            f"--nbval-cell-timeout={timeout}"]


def export(notebooks, cache_dir: pathlib.Path, out: pathlib.Path) -> list[tuple[pathlib.Path, bool]]:
    """Write each notebook into ``out`` with the build's outputs; (path, compared?) for each."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cache = get_cache(str(cache_dir)) if cache_dir.exists() else None
    exported = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        compared = False
        if cache is not None:
            try:
                nb = cache.merge_match_into_notebook(nb)[1]
                compared = True
            except KeyError:
                pass
        nbformat.write(nb, out / path.name)
        exported.append((out / path.name, compared))
    return exported


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path,
                        help="notebooks (default: every chapter, book/[0-9][0-9]_*.ipynb)")
    parser.add_argument("--cache", type=pathlib.Path, default=CACHE, help="the build's jupyter-cache")
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help="where the exported notebooks go")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="per-cell timeout (the build's)")
    parser.add_argument("--hashseed", default="12345", help="PYTHONHASHSEED of the re-execution")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks executed at once (one kernel each)")
    args = parser.parse_args(argv)
    # the heavier (later) chapters first, so that the processes finish together
    notebooks = sorted((p.resolve() for p in args.notebooks), key=lambda p: p.name, reverse=True)
    notebooks = notebooks or chapters()
    exported = export(notebooks, args.cache, args.out)
    for path, compared in exported:
        print(f"{path.name}: " + ("re-executed and compared with the build's outputs" if compared else
                                  "not in the build's cache (run `make strict`): only executed, "
                                  "nothing compared"))
    env = dict(os.environ, PYTHONHASHSEED=args.hashseed)
    env.pop("MPLBACKEND", None)  # inline figures, as in the build
    env.pop("GMLIB_INSTALL_SOURCE", None)  # the install cell must stay a no-op here
    jobs = min(args.jobs, len(exported))
    command = [sys.executable, "-m", "pytest", *[str(p) for p, _ in exported], *nbval_options(args.timeout),
               "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT)]
    if jobs > 1:
        command += ["-n", str(jobs), "--dist", "loadfile"]
    return subprocess.run(command, env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
