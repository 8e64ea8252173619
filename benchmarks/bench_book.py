"""Benchmark 4: execution time of each chapter notebook (and, on request, of a fresh ``make test``).

Each ``book/[0-9][0-9]_*.ipynb`` is executed with nbclient in its own kernel, with
``book/`` as the working directory, and written to a temporary folder (the
committed notebooks stay without outputs). Kernel start-up is included: it is part
of what a reader or the book build pays.
"""

from __future__ import annotations

import glob
import os
import subprocess
import tempfile
import time

from _common import Goal, Table, fmt_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOK_LIMIT_S = 300.0


def _execute(path: str, out_dir: str) -> tuple[float, str]:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(path)}})
    t0 = time.perf_counter()
    try:
        client.execute()
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
        return [], [Goal("whole book executes", f"≤ {BOOK_LIMIT_S:.0f} s", "nbclient missing", None)]
    chapters = sorted(glob.glob(os.path.join(ROOT, "book", "[0-9][0-9]_*.ipynb")))
    if quick:
        chapters = [os.path.join(ROOT, "book", "template.ipynb")]
    env_backend = os.environ.pop("MPLBACKEND", None)  # PITFALLS: a global Agg backend leaks into kernels
    tab = Table("The book: execution time of each notebook (nbclient, fresh kernel each)",
                ["notebook", "time", "status"])
    total, ok = 0.0, True
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            for path in chapters:
                log(f"  executing {os.path.relpath(path, ROOT)}")
                elapsed, status = _execute(path, out_dir)
                total += elapsed
                ok &= status == "ok"
                tab.add(os.path.relpath(path, ROOT), fmt_time(elapsed), status)
    finally:
        if env_backend is not None:
            os.environ["MPLBACKEND"] = env_backend
    tab.add("total", fmt_time(total), "ok" if ok else "FAILED")
    if quick:
        tab.notes.append("--quick executes only book/template.ipynb (a smoke test of the machinery).")
        goals = [Goal("whole book executes", f"≤ {BOOK_LIMIT_S:.0f} s", "not run (--quick)", None)]
    else:
        goals = [Goal(f"whole book executes ({len(chapters)} chapters)", f"≤ {BOOK_LIMIT_S:.0f} s",
                      fmt_time(total), ok and total <= BOOK_LIMIT_S)]
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
        tab.notes.append("`make test` timing: run with --make-test (off by default: it executes "
                         "everything again).")
    return [tab], goals
