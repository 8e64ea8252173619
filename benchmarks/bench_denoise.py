"""Benchmark 3: the denoising excess risk E‖f(Z) − f*(Z)‖² by Gauss–Hermite quadrature (d = 2).

Figure 2's problem: two components of equal norm, γ = 1, ξ = 2. Two denoisers with
known excess risk: the best linear denoiser (its excess risk is ``linear_gap``,
computed by an independent route: a closed form minus a trapezoid rule for the
Bayes risk) and the two softmax heads of Thm 4.1, whose sum is the Bayes denoiser
(excess risk exactly 0).
"""

from __future__ import annotations

from _common import Goal, Table, fmt_err, fmt_rate
from bench_lda import _rate

NODES = (10, 20, 30, 40, 60, 80, 120)


def run(quick: bool, log) -> tuple[list[Table], list[Goal]]:
    import jax

    try:
        from gmlib import denoise as dn

        for name in ("DenoisingProblem", "linear_optimum", "linear_gap", "two_head_bayes"):
            getattr(dn, name)
        from gmlib import apply_heads
        dn.DenoisingProblem.excess_risk  # noqa: B018
    except (ImportError, AttributeError) as exc:
        print(f"  [skip] denoising benchmark: gmlib.denoise is not available ({exc})")
        return [], [Goal("denoising excess risk", "accurate, fast", "gmlib.denoise missing", None)]

    prob = dn.DenoisingProblem([0.5, 0.5], [[3.0, 0.0], [0.0, 3.0]], gamma=1.0, xi=2.0)
    A = dn.linear_optimum(prob)
    heads = dn.two_head_bayes(prob)
    ref = float(dn.linear_gap(prob))

    def linear(A, k):
        return prob.excess_risk(lambda z: z @ A.T, n_nodes=k)

    def two_heads(hs, k):
        return prob.excess_risk(lambda z: apply_heads(hs, prob.noisy, z), n_nodes=k)

    log("  denoising accuracy")
    nodes = (10, 40, 80) if quick else NODES
    acc = Table("Denoising d = 2: excess risk by quadrature against the nodes per coordinate (float64)",
                ["nodes", "points", "error, best linear", "value, two-head Bayes (exact: 0)"])
    for k in nodes:
        err_lin = abs(float(linear(A, k)) - ref)
        acc.add(k, f"2 × {k}²", fmt_err(err_lin), fmt_err(abs(float(two_heads(heads, k)))))
    acc.notes.append(f"best linear denoiser: reference linear_gap = {ref:.12f} (closed form minus a "
                     "trapezoid "
                     "Bayes risk), independent of the quadrature.")

    log("  denoising evaluations per second")
    thr = Table("Denoising d = 2: jitted evaluations per second (Python loop, one sync at the end)",
                ["nodes", "best linear /s", "two heads /s", "two heads + gradient /s"])
    for k in ((40,) if quick else (40, 80)):
        f_lin = jax.jit(lambda A, k=k: linear(A, k))
        f_two = jax.jit(lambda hs, k=k: two_heads(hs, k))
        g_two = jax.jit(jax.value_and_grad(lambda hs, k=k: two_heads(hs, k)))
        thr.add(k, fmt_rate(_rate(f_lin, A)), fmt_rate(_rate(f_two, heads)), fmt_rate(_rate(g_two, heads)))
    thr.notes.append("80 nodes per coordinate is the default for d = 2.")
    return [acc, thr], []
