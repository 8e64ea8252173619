"""Reproducible book: executing a chapter twice gives the same text outputs.

The strict book build (``make strict``) leaves one execution of every chapter in its
jupyter-cache (``_build/.jupyter_cache``, filled by ``tests/execute_chapters.py``, or by the
build itself for a chapter it had to execute). This script executes each chapter notebook
(``book/[0-9][0-9]_*.ipynb``) once more with nbclient and compares the text outputs cell by
cell with that execution: stdout/stderr streams and ``text/plain`` results. It ignores what is
not text (images), figure reprs (``<Figure size 640x480 with 1 Axes>``), memory addresses
(``0x7f...``) and tqdm progress bars (their rates and times are wall-clock), and fails on
anything else that differs. The second execution runs with a different PYTHONHASHSEED
than the build (which ``make`` pins to 0), so a chapter whose output depends on set or
hash order fails here too.

    .venv/bin/python tests/reproducibility.py                  # every chapter, against the build
    .venv/bin/python tests/reproducibility.py book/01_*.ipynb  # some chapters

Exit status 0 when every chapter reproduces, 1 otherwise (the differing cells are printed).
"""

from __future__ import annotations

import argparse
import difflib
import os
import pathlib
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import nbformat
from jupyter_cache import get_cache
from nbclient import NotebookClient

from execute_chapters import CACHE, chapters

ROOT = pathlib.Path(__file__).resolve().parents[1]

_FIGURE = re.compile(r"^<(Figure|matplotlib\.[\w.]+|Axes[\w]*)[^>]*>$")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_TQDM = re.compile(r"\d+%\|.*\||\d+(\.\d+)?(it/s|s/it)|\[\d+:\d+(:\d+)?<")


def _stream_text(text: str) -> str:
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        line = line.split("\r")[-1]  # a progress bar redraws itself with \r: keep the last state
        if _TQDM.search(line):
            continue
        lines.append(_ADDRESS.sub("0x…", line))
    return "\n".join(lines).strip("\n")


def text_outputs(nb) -> list[tuple[int, str, str]]:
    """(cell index, kind, normalised text) for every text output of every code cell."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        streams: dict[str, str] = {}
        for out in cell.get("outputs", []):
            if out.output_type == "stream":  # consecutive chunks of one stream are one text
                streams[out.name] = streams.get(out.name, "") + out.text
            elif out.output_type in ("execute_result", "display_data"):
                text = out.get("data", {}).get("text/plain")
                if text is None or _FIGURE.match(text.strip()):
                    continue
                found.append((i, out.output_type, _ADDRESS.sub("0x…", text).strip()))
            elif out.output_type == "error":
                found.append((i, "error", f"{out.ename}: {out.evalue}"))
        for name in sorted(streams):
            text = _stream_text(streams[name])
            if text:
                found.append((i, name, text))
    return found


def execute(path: pathlib.Path, timeout: int, hashseed: str):
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    env.pop("MPLBACKEND", None)  # inline figures, as in the build
    env.pop("GMLIB_INSTALL_SOURCE", None)  # the install cell must stay a no-op here
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=env)  # the kernel's environment (this process's is left alone)
    return nb


def compare(path: pathlib.Path, cache_dir: pathlib.Path, timeout: int, hashseed: str) -> list[str]:
    try:  # the build's execution: the cached outputs merged into the notebook, as the build reads them
        built_nb = get_cache(str(cache_dir)).merge_match_into_notebook(nbformat.read(path, as_version=4))[1]
    except KeyError:
        return [f"{path.name}: no execution of this code in {cache_dir} (run `make strict` first)"]
    built = text_outputs(built_nb)
    again = text_outputs(execute(path, timeout, hashseed))
    problems = []
    for outputs, which in ((built, "build"), (again, "re-execution")):
        for i, kind, text in outputs:
            if kind == "error":
                problems.append(f"{path.name} cell {i}: the {which} raised {text}")
    if built != again:
        by_cell = lambda outs: {(i, k): t for i, k, t in outs}
        x, y = by_cell(built), by_cell(again)
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                diff = "\n".join(difflib.unified_diff((x.get(key) or "").splitlines(),
                                                      (y.get(key) or "").splitlines(),
                                                      "build", "re-execution", lineterm="", n=1))
                problems.append(f"{path.name} cell {key[0]} ({key[1]}) differs:\n{diff}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path,
                        help="chapter notebooks (default: book/[0-9][0-9]_*.ipynb)")
    parser.add_argument("--cache", type=pathlib.Path, default=CACHE, help="the build's jupyter-cache")
    parser.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds")
    parser.add_argument("--hashseed", default="12345", help="PYTHONHASHSEED of the re-execution")
    parser.add_argument("--jobs", type=int, default=1, help="chapters executed at once (one kernel each)")
    args = parser.parse_args(argv)
    notebooks = [p.resolve() for p in args.notebooks] or chapters()

    def one(nb):
        start = time.time()
        problems = compare(nb, args.cache, args.timeout, args.hashseed)
        status = "reproduces" if not problems else f"{len(problems)} difference(s)"
        print(f"{nb.name}: {status} ({time.time() - start:.0f} s)", flush=True)
        return problems

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        failures = [p for problems in pool.map(one, notebooks) for p in problems]
    for p in failures:
        print("\n" + p)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
