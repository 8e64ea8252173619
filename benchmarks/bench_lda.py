"""Benchmark 2: the population LDA risk (d = 20) by Gauss–Hermite quadrature, against Monte Carlo.

Three heads: the two Bayes-optimal families of ``bayes_head`` (θ1, and θ2 where
s = 0, the singular case), whose risk must equal the Bayes risk computed by the
independent one-dimensional formula ``LDAProblem.bayes_risk``, and a random head
(reference: the same quadrature with 200 nodes). Float64 throughout.
"""

from __future__ import annotations

import time

import numpy as np

from _common import Goal, Table, best_time, fmt_err, fmt_rate, fmt_ratio, fmt_time

D = 20
NODES = (8, 16, 24, 32, 48, 64, 96)
TARGET = 1e-10


def _rate(fn, arg, min_time=0.5):
    """Calls per second of ``fn(arg)`` in a Python loop, synchronising once at the end."""
    import jax

    jax.block_until_ready(fn(arg))
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(20):
            out = fn(arg)
        n += 20
        jax.block_until_ready(out)
        if time.perf_counter() - start > min_time:
            return n / (time.perf_counter() - start)


def problem_and_heads():
    import jax

    from gmlib import lda

    rng = np.random.default_rng(0)
    mp, mn = rng.standard_normal(D) / np.sqrt(D), rng.standard_normal(D) / np.sqrt(D)
    G = rng.standard_normal((D, D)) / np.sqrt(D)
    prob = lda.LDAProblem(mp, mn, G @ G.T / 2 + 0.5 * np.eye(D), 0.6)
    heads = {
        "Bayes θ1": lda.bayes_head(prob, "theta1"),
        "Bayes θ2 (s = 0)": lda.bayes_head(prob, "theta2"),
        "random": lda.HeadParams.normal(jax.random.key(1), D, scale=1 / np.sqrt(D)),
    }
    return prob, heads


def run(quick: bool, log) -> tuple[list[Table], list[Goal]]:
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    try:
        from gmlib import lda

        for name in ("LDAProblem", "HeadParams", "risk", "bayes_head", "predict"):
            getattr(lda, name)
    except (ImportError, AttributeError) as exc:
        print(f"  [skip] LDA benchmark: gmlib.lda is not available ({exc})")
        return [], [Goal("LDA risk+gradient evaluations/s", "≥ 2000/s", "gmlib.lda missing", None)]

    prob, heads = problem_and_heads()
    nodes = (8, 24, 48, 64) if quick else NODES
    log("  LDA accuracy against the number of nodes")
    refs = {name: float(prob.bayes_risk()) if name.startswith("Bayes")
            else float(lda.risk(prob, th, n_nodes=200)) for name, th in heads.items()}
    grad = lambda k: jax.grad(lambda th: lda.risk(prob, th, n_nodes=k))  # noqa: E731
    g_ref = ravel_pytree(grad(200)(heads["random"]))[0]
    acc = Table(f"LDA d = {D}: error of the quadrature risk against the nodes per projection (float64)",
                ["nodes"] + [f"risk error, {n}" for n in heads] + ["gradient error, random"])
    worst = {}
    for k in nodes:
        errs = [abs(float(lda.risk(prob, th, n_nodes=k)) - refs[name]) for name, th in heads.items()]
        g_err = float(jnp.max(jnp.abs(ravel_pytree(grad(k)(heads["random"]))[0] - g_ref)))
        worst[k] = max(*errs, g_err)
        acc.add(k, *map(fmt_err, errs), fmt_err(g_err))
    acc.notes.append("references: the Bayes heads against LDAProblem.bayes_risk (an independent 1-D "
                     "formula); "
                     "the random head against 200 nodes.")
    k_acc = next((k for k in nodes if worst[k] <= TARGET), max(nodes))

    log("  LDA evaluations per second")
    thr = Table(f"LDA d = {D}: jitted evaluations per second (random head; Python loop, one sync at the end)",
                ["nodes", "max error", "risk /s", "risk + gradient /s", "risk, vmap 64 heads /s"])
    theta = heads["random"]
    batch = jax.tree.map(lambda a: jnp.stack([a] * 64), theta)
    rates = {}
    for k in sorted({k_acc, 64}):
        f = jax.jit(lambda th, k=k: lda.risk(prob, th, n_nodes=k))
        g = jax.jit(jax.value_and_grad(lambda th, k=k: lda.risk(prob, th, n_nodes=k)))
        fb = jax.jit(jax.vmap(lambda th, k=k: lda.risk(prob, th, n_nodes=k)))
        r_f, r_g, r_b = _rate(f, theta), _rate(g, theta), 64 * _rate(fb, batch)
        rates[k] = (r_f, r_g)
        thr.add(k, fmt_err(worst.get(k)), fmt_rate(r_f), fmt_rate(r_g), fmt_rate(r_b))
    thr.notes.append(f"{k_acc} nodes is the fewest in the sweep with every error ≤ {TARGET:g}; "
                     "64 is the default.")

    log("  LDA against Monte Carlo at equal time")
    mc = _monte_carlo(prob, theta, refs["random"], k_acc, quick)
    goals = [
        Goal(f"LDA risk evaluations/s at ≤ {TARGET:g} ({k_acc} nodes)", "≥ 2000/s", fmt_rate(rates[k_acc][0]),
             rates[k_acc][0] >= 2000),
        Goal(f"LDA risk + gradient evaluations/s ({k_acc} nodes)", "≥ 2000/s", fmt_rate(rates[k_acc][1]),
             rates[k_acc][1] >= 2000),
        Goal("LDA quadrature vs Monte Carlo error at equal time", "≥ 1000× smaller", fmt_ratio(mc[1]),
             mc[1] >= 1000),
    ]
    return [acc, thr, mc[0]], goals


def _monte_carlo(prob, theta, ref, k, quick):
    """Monte Carlo risk with as many samples as one quadrature evaluation's time allows."""
    import jax
    import jax.numpy as jnp

    from gmlib import lda

    quad = jax.jit(lambda th: lda.risk(prob, th, n_nodes=k))
    t_quad = best_time(lambda: quad(theta).block_until_ready())
    q_err = abs(float(quad(theta)) - ref)

    def mc_fn(n):
        def one(key):
            x, y = prob.sample(key, n)
            return jnp.mean(jax.nn.softplus(-y * lda.predict(prob, theta, x)))

        return jax.jit(one)

    n = 1024
    for _ in range(3):  # calibrate the sample size to the quadrature's time
        t_mc = best_time(lambda: mc_fn(n)(jax.random.key(0)).block_until_ready())
        n = max(16, int(n * t_quad / t_mc))
    fn = mc_fn(n)
    t_mc = best_time(lambda: fn(jax.random.key(0)).block_until_ready())
    seeds = 32 if quick else 200
    ests = np.array([float(fn(jax.random.key(s))) for s in range(seeds)])
    rms = float(np.sqrt(np.mean((ests - ref) ** 2)))
    floor = max(q_err, np.finfo(np.float64).eps * abs(ref))
    ratio = rms / floor
    tab = Table(f"LDA d = {D}: quadrature against Monte Carlo at equal time (random head)",
                ["method", "time per estimate", "samples / nodes", "error"])
    tab.add(f"Gauss–Hermite, {k} nodes", fmt_time(t_quad), f"2 × {k}²", fmt_err(q_err))
    tab.add("Monte Carlo", fmt_time(t_mc), f"{n:,}", f"{rms:.1e} (rms of {seeds} seeds)")
    tab.add("Monte Carlo error / quadrature error", "", "", fmt_ratio(ratio))
    if q_err < floor:
        tab.notes.append(f"the quadrature error is below round-off: the ratio uses ε·|R| = {floor:.1e} "
                         "instead.")
    return tab, ratio
