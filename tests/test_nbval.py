"""The chapters' reproducibility check (tests/nbval_chapters.py) can fail, and fails only where it should.

Tiny notebooks made here, not chapters: one whose reference outputs differ from a fresh
execution only in what tests/nbval_sanitize.cfg blanks (an address, a tqdm bar's times and
rate, an animation's uuid-like id, a figure repr, a glued PNG) passes nbval with the options
`make test` uses; the same notebook with planted changes (a printed number, a glued number,
an HTML table cell) fails on exactly those cells.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

import nbval_chapters

GLUE = "application/papermill.record/"
# two "figures" (PNG bytes as a glue record holds them, base64) that differ after the header
PNG_BUILD, PNG_NOW = (base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(r)).decode()
                      for r in (range(100), range(100, 200)))

# (source, reference outputs as the build recorded them); each cell's output differs from
# what running it gives now, but only in what the sanitize file blanks.
CELLS = {
    "stdout": ("print(6 * 7)", [new_output("stream", name="stdout", text="42\n")]),
    "address": ("print(object())",
                [new_output("stream", name="stdout", text="<object object at 0x7f3a5c2e1b40>\n")]),
    "tqdm": (
        ("import sys, time\nfrom tqdm import tqdm\n"
         "for _ in tqdm(range(3), desc='train', file=sys.stderr, ascii=True, mininterval=0):\n"
         "    time.sleep(0.01)"),
        [new_output("stream", name="stderr", text="\rtrain:   0%|          | 0/3 [00:00<?, ?it/s]"
                    "\rtrain: 100%|##########| 3/3 [00:02<00:00,  1.37s/it]\n")]),
    "glue": (
        ("from IPython.display import display\n"
         f"display({{'{GLUE}text/plain': '0.25', '{GLUE}image/png': {PNG_NOW!r}}}, raw=True, "
         "metadata={'scrapbook': {'name': 'x', 'mime_prefix': '" + GLUE + "'}})"),
        [new_output("display_data", data={f"{GLUE}text/plain": "0.25", f"{GLUE}image/png": PNG_BUILD},
                    metadata={"scrapbook": {"name": "x", "mime_prefix": GLUE}})]),
    "html": (
        ("import uuid\nfrom IPython.display import HTML\n"
         "HTML(f'<table id=\"anim{uuid.uuid4().hex}\"><tr><td>1.5</td></tr></table>')"),
        [new_output("execute_result", execution_count=1,
                    data={"text/html": '<table id="anim0f1e2d3c4b5a69788796a5b4c3d2e1f0">'
                                       '<tr><td>1.5</td></tr></table>',
                          "text/plain": "<IPython.core.display.HTML object>"})]),
    "figure": (
        ("class Figure:\n    def __repr__(self):\n        return '<Figure size 640x480 with 1 Axes>'\n\n"
         "Figure()"),
        [new_output("execute_result", execution_count=1,
                    data={"text/plain": "<Figure size 700x360 with 2 Axes>"})]),
}
# What a planted change does to a reference output (each must fail its cell).
PLANTED = {
    "stdout": lambda outs: outs[0].update(text="43\n"),
    "glue": lambda outs: outs[0].data.update({f"{GLUE}text/plain": "0.26"}),
    "html": lambda outs: outs[0].data.update({"text/html": outs[0].data["text/html"].replace("1.5", "1.6")}),
}


def _notebook(path, planted=()):
    cells = []
    for n, (name, (source, outputs)) in enumerate(CELLS.items(), 1):
        outputs = [nbformat.from_dict(dict(o)) for o in outputs]
        if name in planted:
            PLANTED[name](outputs)
        cells.append(new_code_cell(source, outputs=outputs, execution_count=n))
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}}), path)
    return path


def _nbval(tmp_path, notebooks, options):
    """Run pytest --nbval on ``notebooks``: ({(notebook stem, cell number): failed?}, pytest's output)."""
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "PYTEST_ADDOPTS")}
    out = subprocess.run([sys.executable, "-m", "pytest", *map(str, notebooks), *options,
                          "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(tmp_path),
                          f"--junitxml={report}", "-q"],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    failed = {(case.get("classname").removesuffix(".ipynb"), int(case.get("name").split()[-1])):  # "Cell 3"
              case.find("failure") is not None for case in ET.parse(report).iter("testcase")}
    return failed, out.stdout + out.stderr


def test_nbval_fails_on_a_planted_change_and_passes_what_is_sanitized(tmp_path):
    good = _notebook(tmp_path / "good.ipynb")
    bad = _notebook(tmp_path / "bad.ipynb", planted=PLANTED)
    failed, out = _nbval(tmp_path, [good, bad], nbval_chapters.nbval_options(60))
    names = list(CELLS)
    assert [names[c] for c in range(len(names)) if failed[("good", c)]] == [], out
    assert {names[c] for c in range(len(names)) if failed[("bad", c)]} == set(PLANTED), out
    assert "Cell outputs differ" in out
    # and the sanitized cells do differ: without the sanitize file, they fail
    options = [o for o in nbval_chapters.nbval_options(60) if not o.startswith("--nbval-sanitize-with")]
    failed, out = _nbval(tmp_path, [good], options)
    assert [names[c] for c in range(len(names)) if failed[("good", c)]] == names[1:], out


def test_export_merges_the_builds_outputs(tmp_path):
    """A chapter found in the build's cache is exported with its outputs; one that is not, as committed."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    kernelspec = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    built = tmp_path / "01_built.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(6 * 7)")], metadata=kernelspec), built)
    new = tmp_path / "02_new.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)")], metadata=kernelspec), new)
    executed = nbformat.read(built, as_version=4)
    executed.cells[0].update(execution_count=1, outputs=[new_output("stream", name="stdout", text="42\n")])
    cache = get_cache(str(tmp_path / "cache"))
    cache.cache_notebook_bundle(CacheBundleIn(executed, str(built)), check_validity=False)
    exported = nbval_chapters.export([built, new], tmp_path / "cache", tmp_path / "out")
    assert [(p.name, compared) for p, compared in exported] == [("01_built.ipynb", True),
                                                                ("02_new.ipynb", False)]
    assert nbformat.read(tmp_path / "out" / "01_built.ipynb", as_version=4).cells[0].outputs[0].text == "42\n"
    assert nbformat.read(tmp_path / "out" / "02_new.ipynb", as_version=4).cells[0].outputs == []


@pytest.mark.parametrize("text, sanitized", [
    ("<gmlib.Heads object at 0x7f3a5c2e1b40>", "<gmlib.Heads object at 0x<address>>"),
    ("fit: 100%|##########| 40/40 [00:03<00:00, 11.84it/s]",
     "fit: 100%|##########| 40/40 [<elapsed><remaining>]"),
    ("done in 3.2 s; took 120 ms", "done in <time>; took <time>"),
    ("CPU times: user 1.2 s, sys: 3 ms, total: 1.2 s", "CPU times: <time>"),
    ("1.23 ms ± 45.6 µs per loop (mean ± std. dev. of 7 runs, 100 loops each)", "<timeit>"),
    ('<img id="_anim_img5c1857d85ffb475e8cd1880bc3bb09a5">', '<img id="_anim_img<uuid>">'),
    ('frames[0] = "data:image/png;base64,iVBORw0KGgo\\\nAAAA";', 'frames[0] = "data:image;base64,<image>";'),
    # what must stay compared
    ("slope 0.635, residual 6.2e-15 at L = 4096", "slope 0.635, residual 6.2e-15 at L = 4096"),
    ("in 3 layers, 2 heads", "in 3 layers, 2 heads"),
])
def test_sanitize_patterns(text, sanitized):
    import re

    from nbval.plugin import get_sanitize_patterns

    for regex, replace in get_sanitize_patterns(nbval_chapters.SANITIZE.read_text()):
        text = re.sub(regex, replace, text)
    assert text == sanitized
