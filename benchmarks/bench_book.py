"""Benchmark 4: execution time of each chapter notebook (and, on request, of a fresh ``make test``).

Each ``book/[0-9][0-9]_*.ipynb`` is executed with nbclient in its own kernel, one after the
other, with ``book/`` as the working directory and XLA's persistent compilation cache off
(each chapter pays its own compilations, as in a fresh Colab session), and written to a
temporary folder (the committed notebooks stay without outputs). Kernel start-up is
included: it is part of what a reader or the book build pays. Times are given as multiples
of chapter 1's, measured in the same run (machines of this kind differ up to 3x in speed
from one day to the next); the goal: no chapter above 8x chapter 1.
"""

from __future__ import annotations

import glob
import os
import subprocess
import tempfile
import time

from _common import Goal, Table, fmt_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAPTER_LIMIT = 8.0  # the heaviest chapter, in multiples of chapter 1


def _execute(path: str, out_dir: str) -> tuple[float, str]:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(path)}})
    env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
    t0 = time.perf_counter()
    try:
        client.execute(env=env)
        status = "ok"
    except Exception as exc:  # a failing cell: time it anyway and say so
        status = f"FAILED ({type(exc).__name__})"
    elapsed = time.perf_counter() - t0
    nbformat.write(nb, os.path.join(out_dir, os.path.basename(path)))
    return elapsed, status


def run(quick: bool, log, make_test: bool = False) -> tuple[list[Table], list[Goal]]:
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError as exc:
        print(f"  [skip] book benchmark: nbclient/nbformat not installed ({exc})")
        return [], [Goal("heaviest chapter vs chapter 1", f"≤ {CHAPTER_LIMIT:.0f}×", "nbclient missing", None)]
    chapters = sorted(glob.glob(os.path.join(ROOT, "book", "[0-9][0-9]_*.ipynb")))
    if quick:
        chapters = [os.path.join(ROOT, "book", "template.ipynb")]
    env_backend = os.environ.pop("MPLBACKEND", None)  # PITFALLS: a global Agg backend leaks into kernels
    tab = Table("The book: execution time of each notebook (nbclient, fresh kernel each, no compilation cache)",
                ["notebook", "time", "× chapter 1", "status"])
    times, ok = {}, True
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            for path in chapters:
                log(f"  executing {os.path.relpath(path, ROOT)}")
                times[path], status = _execute(path, out_dir)
                ok &= status == "ok"
                tab.add(os.path.relpath(path, ROOT), fmt_time(times[path]),
                        f"{times[path] / times[chapters[0]]:.1f}×", status)
    finally:
        if env_backend is not None:
            os.environ["MPLBACKEND"] = env_backend
    first, total = times[chapters[0]], sum(times.values())
    tab.add("total", fmt_time(total), f"{total / first:.1f}×", "ok" if ok else "FAILED")
    if quick:
        tab.notes.append("--quick executes only book/template.ipynb (a smoke test of the machinery).")
        goals = [Goal("heaviest chapter vs chapter 1", f"≤ {CHAPTER_LIMIT:.0f}×", "not run (--quick)", None)]
    else:
        heaviest = max(times, key=times.get)
        worst = times[heaviest] / first
        goals = [Goal(f"heaviest chapter vs chapter 1 ({os.path.basename(heaviest)[:2]})", f"≤ {CHAPTER_LIMIT:.0f}×",
                      f"{worst:.1f}×", ok and worst <= CHAPTER_LIMIT)]
    if make_test:
        log("  make test (fresh)")
        t0 = time.perf_counter()
        res = subprocess.run(["make", "test"], cwd=ROOT, capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
        tail = (res.stdout.strip().splitlines() or [""])[-1]
        status = "ok" if res.returncode == 0 else f"FAILED (rc {res.returncode})"
        tab.add("make test", fmt_time(elapsed), status)
        tab.notes.append(f"make test: {tail}")
    else:
        tab.notes.append("`make test` timing: run with `--make-test` (off by default: it executes "
                         "everything again).")
    return [tab], goals
