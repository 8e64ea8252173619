"""The weight of validation: its share of gmlib's statement lines, and its cost on a small call.

(1) **Validation share.** Every module of ``gmlib`` (``gmlib/**/*.py``, packages included) is
parsed with ``ast`` and its statement lines are counted, docstrings and imports left out: a
simple statement counts its physical lines, a compound statement's header (``def``, ``class``,
``if``, ``for``, ``with``, ``try``, ...) counts one line and its body counts on its own. A line
is *validation* when its statement

* sits in ``gmlib/_checks.py`` or in a function named ``_check*`` or ``check_*``;
* is a ``raise``, or an ``if`` whose branches only raise (the header and the raises);
* calls a check helper: a function of ``gmlib._checks`` (``C.array``, ``C.scalar``, any
  ``C.check_*``, ...) or a function named ``_check*``/``check_*`` (for a compound statement,
  in its header).

The goal counts the whole library, ``_checks.py`` included: at most 20 %.

(2) **Small-call overhead.** A public call with n = 36 queries, L = 1024 tokens, D = 4 (float32
JAX arrays), against the same call traced into one ``jax.jit`` (shape checks at trace time
only, no finiteness check of the result), best of interleaved calls: ``softmax_attention``
(with numpy inputs too, which must be copied to the device in both cases) and
``apply_heads`` with one head of the same sizes.
"""

from __future__ import annotations

import ast
import os

from _common import Goal, Table, best_times, fmt_ratio, fmt_time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gmlib")
CHECK_PREFIXES = ("_check", "check_")
TARGET_SHARE = 0.20
TARGET_OVERHEAD = 1.5
_BODIES = ("body", "orelse", "finalbody")


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _only_raises(stmt) -> bool:
    """A ``raise``, or an ``if`` whose branches (all of them) only raise."""
    if isinstance(stmt, ast.Raise):
        return True
    return isinstance(stmt, ast.If) and all(_only_raises(s) for s in stmt.body + stmt.orelse)


def _header(stmt) -> list:
    """The expressions of a statement outside its nested blocks (a compound statement's header)."""
    if not any(hasattr(stmt, f) for f in _BODIES) and not hasattr(stmt, "cases"):
        return [stmt]
    skip = {"body", "orelse", "finalbody", "handlers", "cases"}
    return [v for f, v in ast.iter_fields(stmt) if f not in skip and isinstance(v, (ast.AST, list))]


class _Checks:
    """Which calls are calls of a check helper, for one module (its aliases of gmlib._checks)."""

    def __init__(self, tree):
        self.modules, self.names = {"C", "_checks"}, set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "gmlib._checks":
                self.names |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module == "gmlib":
                self.modules |= {a.asname or a.name for a in node.names if a.name == "_checks"}

    def called_in(self, parts) -> bool:
        roots = [p for part in parts for p in (part if isinstance(part, list) else [part]) if isinstance(p, ast.AST)]
        return any(isinstance(node, ast.Call) and self._is_check(node.func) for r in roots for node in ast.walk(r))

    def _is_check(self, f) -> bool:
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.modules:
            return True
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name.startswith(CHECK_PREFIXES) or name in self.names


def count_lines(source: str, whole_module_is_validation: bool = False) -> tuple[int, int]:
    """``(statement lines, validation lines)`` of one module's source, by the rules of this module's docstring."""
    tree = ast.parse(source)
    checks, counts = _Checks(tree), [0, 0]

    def visit(stmts, validating: bool):
        for s in stmts:
            if isinstance(s, (ast.Import, ast.ImportFrom)) or _is_docstring(s):
                continue
            compound = any(hasattr(s, f) for f in _BODIES) or hasattr(s, "cases")
            n = 1 if compound else s.end_lineno - s.lineno + 1
            check_fn = isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name.startswith(CHECK_PREFIXES)
            inherited = validating or check_fn or _only_raises(s)
            here = inherited or checks.called_in(_header(s))
            counts[0] += n
            counts[1] += n * here
            for f in _BODIES:
                visit(getattr(s, f, None) or [], inherited)
            for h in getattr(s, "handlers", []):
                visit(h.body, inherited)
            for c in getattr(s, "cases", []):
                visit(c.body, inherited)

    visit(tree.body, whole_module_is_validation)
    return counts[0], counts[1]


def validation_shares(root: str = ROOT) -> dict[str, tuple[int, int]]:
    """Per module of gmlib (``gmlib/**/*.py``, paths relative to ``gmlib/``): ``(lines, validation lines)``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
        for fname in sorted(f for f in filenames if f.endswith(".py")):
            path = os.path.join(dirpath, fname)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path) as fh:
                out[rel] = count_lines(fh.read(), whole_module_is_validation=rel == "_checks.py")
    return dict(sorted(out.items()))


def library_share(shares: dict[str, tuple[int, int]]) -> float:
    """The validation share of the whole library, ``_checks.py`` included."""
    return sum(v for _, v in shares.values()) / max(1, sum(n for n, _ in shares.values()))


def _small_call_times(jax, jnp, np):
    from gmlib import Heads, apply_heads, softmax_attention

    rng = np.random.default_rng(0)
    n, L, D = 36, 1024, 4
    host = [rng.normal(size=s).astype(np.float32) for s in ((L, D), (n, D), (D, D), (D, D))]
    dev = [jnp.asarray(a) for a in host]
    heads = Heads(U=dev[2][None], V=dev[3][None])  # one head, the same U and V
    jitted, jitted_heads = jax.jit(softmax_attention), jax.jit(apply_heads)
    fns = {
        "public": lambda: softmax_attention(*dev).block_until_ready(),
        "jit": lambda: jitted(*dev).block_until_ready(),
        "public, numpy in": lambda: softmax_attention(*host).block_until_ready(),
        "jit, numpy in": lambda: jitted(*host).block_until_ready(),
        "heads": lambda: apply_heads(heads, dev[0], dev[1]).block_until_ready(),
        "heads, jit": lambda: jitted_heads(heads, dev[0], dev[1]).block_until_ready(),
    }
    return best_times(fns, min_time=1.0, min_reps=200, max_reps=5000)


def run(quick: bool, log) -> tuple[list[Table], list[Goal]]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    log("  validation share (ast)")
    shares = validation_shares()
    tab = Table("Validation share of gmlib's statement lines (ast count)",
                ["module", "statement lines", "validation", "share"])
    for fname, (n, v) in shares.items():
        tab.add(fname, n, v, f"{v / max(n, 1):.0%}")
    inside = {k: v for k, v in shares.items() if k != "_checks.py"}
    n_in, v_in = sum(v[0] for v in inside.values()), sum(v[1] for v in inside.values())
    n_all, v_all = sum(v[0] for v in shares.values()), sum(v[1] for v in shares.values())
    share = library_share(shares)
    tab.add("all of gmlib but _checks.py", n_in, v_in, f"{v_in / max(n_in, 1):.1%}")
    tab.add("all of gmlib (the goal counts this)", n_all, v_all, f"{share:.1%}")
    tab.notes.append("statement lines: docstrings and imports left out, a compound statement's header one line. "
                     "Validation: `_checks.py`, functions named `_check*`/`check_*`, `raise`, an `if` whose branches "
                     "only raise, and statements that call a check helper (`benchmarks/bench_api.py`).")

    log("  small-call overhead")
    wall, cpu = _small_call_times(jax, jnp, np)
    small = Table("Small public call, n = 36, L = 1024, D = 4, float32 (best of interleaved calls)",
                  ["call", "inputs", "public", "inside jax.jit", "ratio", "ratio, CPU time"])
    rows = (("softmax_attention", "JAX arrays", "public", "jit"),
            ("softmax_attention", "numpy arrays", "public, numpy in", "jit, numpy in"),
            ("apply_heads, one head", "JAX arrays", "heads", "heads, jit"))
    for call, kind, pub, jit in rows:
        small.add(call, kind, fmt_time(wall[pub]), fmt_time(wall[jit]), fmt_ratio(wall[pub] / wall[jit]),
                  fmt_ratio(cpu[pub] / max(cpu[jit], 1e-9)))
    small.notes.append("public: the kernel (its shape and dtype checks run when it is traced, once per shape), "
                       "then its result checked for finiteness (by a flag from the same device call), the "
                       "inputs only when it is not; inside jax.jit: the same "
                       "kernel, no finiteness check. apply_heads: a gmlib.Heads of one head with the same U, V.")
    ratio, ratio_heads = wall["public"] / wall["jit"], wall["heads"] / wall["heads, jit"]
    goals = [
        Goal("validation share of gmlib's statement lines (_checks.py included)", f"≤ {TARGET_SHARE:.0%}",
             f"{share:.1%} ({v_in / max(n_in, 1):.1%} without it)", share <= TARGET_SHARE),
        Goal("small softmax_attention call vs inside jit", f"≤ {TARGET_OVERHEAD}×", fmt_ratio(ratio),
             ratio <= TARGET_OVERHEAD),
        Goal("small apply_heads call (one head) vs inside jit", f"≤ {TARGET_OVERHEAD}×", fmt_ratio(ratio_heads),
             ratio_heads <= TARGET_OVERHEAD),
    ]
    return [tab, small], goals


if __name__ == "__main__":
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax

    jax.config.update("jax_enable_x64", True)
    tables, goals = run(False, print)
    for t in tables:
        print()
        print(t.text())
    for g in goals:
        print(g)
