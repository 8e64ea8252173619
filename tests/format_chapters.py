"""Apply ``ruff format`` (settings: ``book/ruff.toml``) to the code cells of the MyST twins.

Only the code of each ``{code-cell}`` changes: the cell options and metadata above it, and
the prose, are left as written. ``make format`` runs this, then ``make twins``.

    .venv/bin/python tests/format_chapters.py                 # every twin
    .venv/bin/python tests/format_chapters.py book/01_*.md    # some
    .venv/bin/python tests/format_chapters.py --check         # exit 1 if a cell would change
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "book" / "ruff.toml"
# A code cell: the opening fence, an optional `---` YAML block or `:key: value` options, the code.
CELL = re.compile(r"(^```\{code-cell\}[^\n]*\n(?:---\n.*?\n---\n|(?::[^\n]*\n)+\n?)?)(.*?)(^```$)",
                  re.S | re.M)


def ruff_format(code: str) -> str:
    """``code`` formatted; a final ``;`` (it hides the cell's last value in a notebook) is kept."""
    quiet = code.rstrip().endswith(";")
    out = subprocess.run([sys.executable, "-m", "ruff", "format", "--config", str(CONFIG), "-"],
                         input=code, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ruff format failed:\n{out.stderr}\n--- on ---\n{code}")
    return out.stdout.rstrip("\n") + ";\n" if quiet and not out.stdout.rstrip().endswith(";") else out.stdout


def format_text(text: str) -> str:
    return CELL.sub(lambda m: m.group(1) + ruff_format(m.group(2)) + m.group(3), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=pathlib.Path)
    parser.add_argument("--check", action="store_true", help="only report the twins that would change")
    args = parser.parse_args(argv)
    files = args.files or sorted((ROOT / "book").glob("[0-9][0-9]_*.md")) + [ROOT / "book" / "template.md"]
    changed = []
    for path in files:
        text = path.read_text()
        new = format_text(text)
        if new != text:
            changed.append(path.name)
            if not args.check:
                path.write_text(new)
    print(("would reformat: " if args.check else "reformatted: ") + (", ".join(changed) or "nothing"))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
