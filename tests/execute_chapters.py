"""Execute the chapters into the book's jupyter-cache, several at once, before the build reads them.

With ``execute_notebooks: cache`` (``_config.yml``), ``jupyter-book build`` executes each
notebook it does not find in ``_build/.jupyter_cache``, one after the other. This script fills
that cache first, ``--jobs`` chapters at a time (one kernel each, in the notebook's folder,
with the build's timeout and the build's environment, exactly as the build would execute
them), so that the build only takes each chapter's outputs from the cache ("Using cached
notebook") and every chapter is executed once. On a 2-core machine two chapters at a time
take a little more than half the serial time.

A chapter already in the cache (same code cells) is not executed again. A chapter that
fails is not cached: its traceback is printed, and the script exits 1 once the others are
done (the build would execute it again and stop on the same error).

    .venv/bin/python tests/execute_chapters.py --jobs 2             # every chapter
    .venv/bin/python tests/execute_chapters.py book/03_*.ipynb      # some chapters
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import nbformat
import yaml
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from jupyter_cache.executors.utils import single_nb_execution

ROOT = pathlib.Path(__file__).resolve().parents[1]
CACHE = ROOT / "_build" / ".jupyter_cache"  # myst-nb's default for jupyter-book: <build dir>/.jupyter_cache
TIMEOUT = yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]["timeout"]  # the build's, per cell


def chapters() -> list[pathlib.Path]:
    """Every chapter notebook, the later (heavier) ones first: two workers then finish together."""
    return sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"), reverse=True)


def _cached(cache, nb) -> bool:
    try:
        cache.match_cache_notebook(nb)  # on the code cells and the kernelspec, as myst-nb matches
        return True
    except KeyError:
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path, help="default: every chapter")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="chapters executed at once")
    parser.add_argument("--timeout", type=int, default=TIMEOUT, help="per-cell timeout in seconds (_config.yml's)")
    parser.add_argument("--cache", type=pathlib.Path, default=CACHE, help="the jupyter-cache folder")
    args = parser.parse_args(argv)
    cache = get_cache(str(args.cache))
    todo = {}
    for path in [p.resolve() for p in args.notebooks] or chapters():
        nb = nbformat.read(path, as_version=4)
        if _cached(cache, nb):
            print(f"{path.name}: in the cache already", flush=True)
        else:
            todo[path] = nb

    def execute(path):  # in the notebook's folder, the build's timeout, errors stop it: myst-nb's settings
        return single_nb_execution(todo[path], cwd=str(path.parent), allow_errors=False, timeout=args.timeout,
                                   meta_override=True)

    start, failures = time.time(), []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:  # the kernels are processes: threads suffice
        running = {pool.submit(execute, path): path for path in todo}
        for done in as_completed(running):  # the cache is written from this thread only
            path, result = running[done], done.result()
            if result.err is not None:
                failures.append((path.name, result.exc_string))
                print(f"{path.name}: failed ({type(result.err).__name__}) after {result.time:.1f} s", flush=True)
                continue
            cache.cache_notebook_bundle(CacheBundleIn(result.nb, str(path), data={"execution_seconds": result.time}),
                                        check_validity=False, overwrite=True)
            print(f"{path.name}: executed in {result.time:.1f} s", flush=True)
    print(f"{len(todo) - len(failures)} of {len(todo)} executed and cached ({time.time() - start:.0f} s, "
          f"{args.jobs} at a time)")
    for name, tb in failures:
        print(f"\n{name} failed:\n{tb}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
