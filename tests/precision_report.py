"""Measure the float32 and float64 accuracy of gmlib's main kernels against float64 references.

    JAX_PLATFORMS=cpu .venv/bin/python tests/precision_report.py

prints the Markdown table of book/api.md ("Precision and numerical limits"). Each row is a
fixed, seeded problem; the error is max |out - ref| / max |ref| over all outputs, where
``ref`` is an independent numpy float64 computation on the *same* (already rounded)
inputs, so the number measures the kernel, not the rounding of the inputs. The bounds
are what the book documents; tests/test_attention.py::test_documented_precision_bounds
re-measures and asserts every error is within its bound.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np

from gmlib import GaussianMixture, mixture_expectation, population_attention, softmax_attention

#: (kernel, setting) -> (float64 bound, float32 bound) on the relative error: what book/api.md documents.
BOUNDS = {
    ("softmax_attention", "one pass, scores up to 10"): (1e-13, 1e-5),
    ("softmax_attention", "blocks of 256, scores up to 10"): (1e-13, 1e-5),
    ("softmax_attention", "one pass, scores up to 1e3"): (1e-11, 1e-3),
    ("softmax_attention", "blocks of 256, scores up to 1e3"): (1e-11, 1e-3),
    ("population_attention", "‖Uz‖ ≈ 3"): (1e-13, 1e-5),
    ("population_attention", "‖Uz‖ ≈ 100"): (1e-11, 1e-3),
    ("mixture_expectation", "2 projections, 80 nodes (rounding only)"): (1e-11, 1e-5),
    ("mixture_expectation", "2 projections, 20 nodes (with truncation)"): (2e-6, 1e-5),
}


def _rel(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def _softmax_ref(q, toks, U, V):
    q, toks, U, V = (np.asarray(a, np.float64) for a in (q, toks, U, V))
    s = (q @ U.T) @ toks.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ toks @ V.T


def _population_ref(mix, q, U, V):
    w, m, c = (np.asarray(a, np.float64) for a in (mix.weights, mix.means, mix.covs))
    u = np.asarray(q, np.float64) @ np.asarray(U, np.float64).T
    logits = np.log(w)[None] + u @ m.T + 0.5 * np.einsum("nd,kde,ne->nk", u, c, u)
    a = np.exp(logits - logits.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    return np.einsum("nk,nkd->nd", a, m[None] + np.einsum("kde,ne->nkd", c, u)) @ np.asarray(V, np.float64).T


def _expectation_ref(mix, fn, A, n_nodes):
    """Tensor Gauss–Hermite in numpy float64 (Cholesky of A Γ Aᵀ + a jitter-free eigh fallback)."""
    x, w = np.polynomial.hermite_e.hermegauss(n_nodes)
    w = w / w.sum()
    X = np.stack(np.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2)
    W = np.outer(w, w).reshape(-1)
    total = 0.0
    for pk, mk, ck in zip(*(np.asarray(a, np.float64) for a in (mix.weights, mix.means, mix.covs))):
        lam, Q = np.linalg.eigh(A @ ck @ A.T)
        R = Q * np.sqrt(np.clip(lam, 0, None))
        total += pk * (W @ fn(A @ mk + X @ R.T))
    return total


def problems(seed=0):
    """The fixed problems, as (kernel, setting, run(dtype) -> (out, ref)) triples."""
    rng = np.random.default_rng(seed)
    L, n, D = 4096, 64, 8
    toks = rng.normal(size=(L, D))
    q = rng.normal(size=(n, D))
    V = rng.normal(size=(4, D))
    top = np.abs(q @ toks.T).max()
    U_small = 10 * np.eye(D) / top  # the largest |score| is 10
    U_large = 1e3 * np.eye(D) / top  # the largest |score| is 1e3

    def softmax(U, block):
        def run(dtype):
            args = [a.astype(dtype) for a in (q, toks, U, V)]
            return softmax_attention(args[1], args[0], *args[2:], block_size=block), _softmax_ref(*args)
        return run

    M = 4
    a = rng.normal(size=(M, D, D))
    covs = 0.3 * a @ np.swapaxes(a, -1, -2) / D + 0.05 * np.eye(D)
    means = rng.normal(size=(M, D))
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)

    def population(norm_u):
        def run(dtype):
            mix = GaussianMixture(weights.astype(dtype), means.astype(dtype), covs.astype(dtype))
            args = [x.astype(dtype) for x in (qn, norm_u * np.eye(D), V)]
            return population_attention(mix, *args), _population_ref(mix, *args)
        return run

    A = rng.normal(size=(2, D)) / np.sqrt(D)

    def expectation(n_nodes):
        return lambda dtype: _expectation(dtype, n_nodes)

    def _expectation(dtype, n_nodes):
        mix = GaussianMixture(weights.astype(dtype), means.astype(dtype), covs.astype(dtype))
        import jax.numpy as jnp

        out = mixture_expectation(mix, lambda y: jnp.tanh(y[:, 0]) * jnp.cos(y[:, 1]), projection=A.astype(dtype),
                                  n_nodes=n_nodes)
        ref = _expectation_ref(mix, lambda y: np.tanh(y[:, 0]) * np.cos(y[:, 1]),
                               np.asarray(A.astype(dtype), np.float64), 80)
        return out, ref

    return [
        ("softmax_attention", "one pass, scores up to 10", softmax(U_small, None)),
        ("softmax_attention", "blocks of 256, scores up to 10", softmax(U_small, 256)),
        ("softmax_attention", "one pass, scores up to 1e3", softmax(U_large, None)),
        ("softmax_attention", "blocks of 256, scores up to 1e3", softmax(U_large, 256)),
        ("population_attention", "‖Uz‖ ≈ 3", population(3.0)),
        ("population_attention", "‖Uz‖ ≈ 100", population(100.0)),
        ("mixture_expectation", "2 projections, 80 nodes (rounding only)", expectation(80)),
        ("mixture_expectation", "2 projections, 20 nodes (with truncation)", expectation(20)),
    ]


def measure():
    """Rows (kernel, setting, err64, err32, bound64, bound32)."""
    rows = []
    for kernel, setting, run in problems():
        errs = [_rel(*run(dtype)) for dtype in (np.float64, np.float32)]
        rows.append((kernel, setting, *errs, *BOUNDS[(kernel, setting)]))
    return rows


def table(rows) -> str:
    lines = ["| kernel | problem | float64 error | float32 error | documented bound (f64 / f32) |",
             "|---|---|---|---|---|"]
    for kernel, setting, e64, e32, b64, b32 in rows:
        lines.append(f"| `{kernel}` | {setting} | {e64:.1e} | {e32:.1e} | {b64:.0e} / {b32:.0e} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(f"Measured on {jax.default_backend()} with jax {jax.__version__} (relative error, max over outputs):\n")
    print(table(measure()))
