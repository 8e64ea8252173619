"""The weight of validation: its share of gmlib's executable statements, and its cost on a small call.

(1) **Validation share.** Every module of ``gmlib`` is parsed with ``ast``; its executable
statements (everything but imports, docstrings, ``pass`` and the ``def``/``class`` lines
themselves) are counted, and among them the validation statements:

* the whole of ``gmlib/_checks.py`` and of any function whose name starts with
  ``_check``, ``check_`` or ``_validate`` (or is a module-local scalar check such as
  ``_scalar``);
* ``if`` blocks whose body raises (the test, and every statement of the block), ``raise``
  statements, and ``try`` blocks with a handler that raises;
* statements whose value is a call of a validation helper (``C.array``, ``C.scalar``, any
  ``C.check_*``, a module's ``_check_*``): the conversions and checks at the top of a
  public function.

(2) **Small-call overhead.** A public ``softmax_attention`` call with n = 36 queries,
L = 1024 tokens, D = 4 (float32 JAX arrays), against the same call traced into one
``jax.jit`` (shape checks at trace time only, no finiteness check of the result), best of
interleaved calls; and the same with numpy inputs (which must be copied to the device in
both cases).
"""

from __future__ import annotations

import ast
import os

from _common import Goal, Table, best_times, fmt_ratio, fmt_time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gmlib")
CHECK_PREFIXES = ("_check", "check_", "_validate")
CHECK_NAMES = {"_scalar", "_host_scalar"}
TARGET_SHARE = 0.20
TARGET_OVERHEAD = 1.5


def _is_check_call(node) -> bool:
    """A call of a validation helper: ``C.anything(...)`` or a ``_check*``-named function."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "C":
        return True
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return name.startswith(CHECK_PREFIXES) or name in CHECK_NAMES


def _raises(stmts) -> bool:
    return any(isinstance(n, ast.Raise) for s in stmts for n in ast.walk(s))


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def count_statements(source: str, whole_module_is_validation: bool = False) -> tuple[int, int]:
    """``(executable, validation)`` statement counts of one module's source."""
    counts = [0, 0]

    def visit(stmts, validating: bool):
        for s in stmts:
            if isinstance(s, (ast.Import, ast.ImportFrom, ast.Pass)) or _is_docstring(s):
                continue
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                check_fn = not isinstance(s, ast.ClassDef) and (s.name.startswith(CHECK_PREFIXES)
                                                                or s.name in CHECK_NAMES)
                visit(s.body, validating or check_fn)
                continue
            counts[0] += 1
            here = validating
            if isinstance(s, ast.Raise):
                here = True
            elif isinstance(s, ast.If) and _raises(s.body) and not s.orelse:
                here = True
            elif isinstance(s, ast.Try) and any(_raises(h.body) for h in s.handlers):
                here = True
            elif isinstance(s, (ast.Expr, ast.Assign, ast.AnnAssign, ast.Return)) and s.value is not None \
                    and _is_check_call(s.value):
                here = True
            elif isinstance(s, ast.Assign) and isinstance(s.value, ast.Tuple) \
                    and all(_is_check_call(v) for v in s.value.elts):
                here = True
            counts[1] += here
            # nested blocks: their statements count on their own
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(s, field, None)
                if isinstance(inner, list) and not isinstance(s, (ast.FunctionDef, ast.ClassDef)):
                    visit(inner, here)
            for h in getattr(s, "handlers", []):
                visit(h.body, here)

    visit(ast.parse(source).body, whole_module_is_validation)
    return counts[0], counts[1]


def validation_shares() -> dict[str, tuple[int, int]]:
    """Per module of gmlib: ``(executable, validation)`` statements."""
    out = {}
    for folder, _, files in sorted(os.walk(ROOT)):  # subpackages too (gmlib/denoise/)
        for fname in sorted(files):
            if fname.endswith(".py"):
                name = os.path.relpath(os.path.join(folder, fname), ROOT)
                with open(os.path.join(folder, fname)) as fh:
                    out[name] = count_statements(fh.read(), whole_module_is_validation=name == "_checks.py")
    return out


def _small_call_times(jax, jnp, np):
    from gmlib import softmax_attention

    rng = np.random.default_rng(0)
    n, L, D = 36, 1024, 4
    host = [rng.normal(size=s).astype(np.float32) for s in ((L, D), (n, D), (D, D), (D, D))]
    dev = [jnp.asarray(a) for a in host]
    jitted = jax.jit(softmax_attention)
    fns = {
        "public": lambda: softmax_attention(*dev).block_until_ready(),
        "jit": lambda: jitted(*dev).block_until_ready(),
        "public, numpy in": lambda: softmax_attention(*host).block_until_ready(),
        "jit, numpy in": lambda: jitted(*host).block_until_ready(),
    }
    return best_times(fns, min_time=1.0, min_reps=200, max_reps=5000)


def run(quick: bool, log) -> tuple[list[Table], list[Goal]]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    log("  validation share (ast)")
    shares = validation_shares()
    tab = Table("Validation share of gmlib's executable statements (ast count)",
                ["module", "statements", "validation", "share"])
    for fname, (n, v) in shares.items():
        tab.add(fname, n, v, f"{v / max(n, 1):.0%}")
    inside = {k: v for k, v in shares.items() if k != "_checks.py"}
    n_in, v_in = sum(v[0] for v in inside.values()), sum(v[1] for v in inside.values())
    n_all, v_all = sum(v[0] for v in shares.values()), sum(v[1] for v in shares.values())
    share = v_in / max(n_in, 1)
    tab.add("gmlib without _checks.py", n_in, v_in, f"{share:.1%}")
    tab.add("gmlib with _checks.py", n_all, v_all, f"{v_all / max(n_all, 1):.1%}")
    tab.notes.append("validation: _checks.py, check helpers, if-raise blocks, raise, try/except-raise, and "
                     "statements that call C.* or a _check_* helper (benchmarks/bench_api.py). The goal counts "
                     "the modules without _checks.py, the issue's count (41 % on the tree it was filed on).")

    log("  small-call overhead")
    wall, cpu = _small_call_times(jax, jnp, np)
    small = Table("Small public call: softmax_attention, n = 36, L = 1024, D = 4, float32 (best of interleaved "
                  "calls)", ["inputs", "public", "inside jax.jit", "ratio", "ratio, CPU time"])
    for kind, pub, jit in (("JAX arrays", "public", "jit"), ("numpy arrays", "public, numpy in", "jit, numpy in")):
        small.add(kind, fmt_time(wall[pub]), fmt_time(wall[jit]), fmt_ratio(wall[pub] / wall[jit]),
                  fmt_ratio(cpu[pub] / max(cpu[jit], 1e-9)))
    small.notes.append("public: the kernel (its shape and dtype checks run when it is traced, once per shape), "
                       "then its result checked for finiteness (on a CPU in host memory, on an accelerator by a "
                       "flag from the same device call), the inputs only when it is not; inside jax.jit: the same "
                       "kernel, no finiteness check.")
    ratio = wall["public"] / wall["jit"]
    goals = [
        Goal("validation share of gmlib's statements (without _checks.py)", f"≤ {TARGET_SHARE:.0%}",
             f"{share:.1%} ({v_all / max(n_all, 1):.1%} with it)",
             share <= TARGET_SHARE),
        Goal("small softmax_attention call vs inside jit", f"≤ {TARGET_OVERHEAD}×", fmt_ratio(ratio),
             ratio <= TARGET_OVERHEAD),
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
