"""Benchmark 1 (and 5): finite softmax attention, gmlib against the JAX call, its own floor, numpy.

n = 256 queries, D = 21, float32, L tokens. The same formula (scores, stable softmax,
weighted sum of values) computed by:

- gmlib blocked: ``softmax_attention(..., block_size="auto")`` (streamed online softmax);
- gmlib unblocked: ``softmax_attention(..., block_size=None)`` (one jitted pass);
- the JAX call: ``jax.nn.dot_product_attention`` with ``scale=1``, the call a JAX user would
  make instead, its (B, T, N, H) layout filled with queries ``q = z U^T``, keys the tokens
  and values the tokens ``V^T``, in one ``jax.jit`` (it holds the n × L scores);
- the floor: gmlib's own operations on the backend, timed alone: its two matmuls per block
  (scores ``U z`` against the block's tokens, then the weights against them) and its
  exponentials (with their row sums) over the same number of blocks;
- numpy: the textbook version, the whole (n, L) score matrix at once.

The goals compare the public gmlib call with the JAX call, and gmlib's kernel with its
floor, at L = 2^18 on the same machine in the same run. Times are the best of several
interleaved calls after a warm-up (compilation excluded). Peak memory is measured in a
fresh subprocess per (implementation, L), so that each number is that implementation's
alone: ``peak RSS`` is the process's peak resident memory (Python, jax and the inputs
included), ``call`` is the rise of the resident-memory high-water mark during one
steady-state call (Linux only).

Run as ``python benchmarks/bench_attention.py --worker IMPL LOG2L`` it is that subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from _common import (Goal, Table, available_memory_bytes, best_time, best_times, blas_threads, fmt_bytes,
                     fmt_err, fmt_rate, fmt_ratio, fmt_time, peak_rss_bytes)

N_QUERIES = 256
DIM = 21
GOAL_LOG2L = 18  # the goals' prompt length, 2^18 tokens
TARGET_VS_JAX = 4.0  # public softmax_attention at least this many times faster than the JAX call
TARGET_FLOOR = 1.25  # the blocked kernel at most this many times its floor

# Peak numbers per device, matched by substring of jax's ``device_kind`` (first match wins, so
# the more specific names come first): FP32 on the vector units, TF32 on the tensor cores (dense;
# XLA's default float32 matmul precision on these GPUs), memory bandwidth. Vendor data sheets (SXM
# variants unless the name says otherwise).
DEVICE_PEAKS = [
    # name,        FP32 FLOP/s, TF32 FLOP/s, bytes/s
    ("H200",       67e12,  495e12, 4.8e12),
    ("H100 PCIe",  51e12,  378e12, 2.0e12),
    ("H100",       67e12,  495e12, 3.35e12),
    ("GH200",      67e12,  495e12, 4.0e12),
    ("A100",       19.5e12, 156e12, 2.0e12),
    ("L40S",       91.6e12, 183e12, 0.864e12),
    ("L4",         30.3e12, 60e12,  0.3e12),
    ("A10",        31.2e12, 62.5e12, 0.6e12),
    ("V100",       15.7e12, None,   0.9e12),
    ("T4",         8.1e12,  None,   0.32e12),
]


def make_inputs(L: int, seed: int = 0):
    """Queries, tokens, U, V as float32 numpy arrays; tokens drawn in chunks (no float64 temporary)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((N_QUERIES, DIM), dtype=np.float32)
    U = (rng.standard_normal((DIM, DIM), dtype=np.float32) / np.float32(DIM)).astype(np.float32)
    V = rng.standard_normal((DIM, DIM), dtype=np.float32)
    t = np.empty((L, DIM), np.float32)
    chunk = 1 << 20
    for i in range(0, L, chunk):
        t[i:i + chunk] = rng.standard_normal((min(chunk, L - i), DIM), dtype=np.float32)
    return q, t, U, V


def numpy_attention(q, t, U, V):
    """Plain numpy softmax attention: (n, L) scores, stable softmax, weighted sum of values."""
    s = (q @ U.T) @ t.T
    s -= s.max(axis=1, keepdims=True)
    np.exp(s, out=s)
    return (s @ (t @ V.T)) / s.sum(axis=1, keepdims=True)


def _one_thread(fn, *args):
    with blas_threads(1):
        return fn(*args)


def _gmlib_call(impl):
    import gmlib

    block = None if impl == "unblocked" else "auto"
    return lambda q, t, U, V: gmlib.softmax_attention(t, q, U, V, block_size=block).block_until_ready()


def jax_attention(jax):
    """The JAX user's call: ``jax.nn.dot_product_attention`` (scale 1) on q = z U^T, keys z_i, values V z_i."""
    def call(q, t, U, V):
        one = lambda x: x[None, :, None]  # noqa: E731  (B, T, N, H) = (1, rows, 1, features)
        return jax.nn.dot_product_attention(one(q @ U.T), one(t), one(t @ V.T), scale=1.0)[0, :, 0]

    return jax.jit(call)


def floor_ops(jax, jnp, L: int, B: int):
    """gmlib's own operations alone over the L // B blocks of the blocked kernel: ``(matmuls, exponentials)``.

    ``matmuls(q, t, U)``: per block, the scores ``(U z) z_i^T`` and the weighted sum against the
    block's tokens (the kernel's two matmuls, here of the scores themselves: no exponential);
    ``exponentials(s)``: per block, the exponentials of an (n, B) tile of scores and their row
    sums (shifted by the block's index, so that no block is computed once for all).
    """
    n_blocks = L // B

    @jax.jit
    def matmuls(q, t, U):
        uq = q @ U.T

        def body(i, acc):
            blk = jax.lax.dynamic_slice_in_dim(t, i * B, B)
            return acc + (uq @ blk.T) @ blk

        return jax.lax.fori_loop(0, n_blocks, body, jnp.zeros_like(uq))

    @jax.jit
    def exponentials(s):
        def body(i, acc):
            return acc + jnp.exp(s - i.astype(s.dtype)).sum(axis=-1)

        return jax.lax.fori_loop(0, n_blocks, body, jnp.zeros(s.shape[0], s.dtype))

    return matmuls, exponentials


def xla_temp_bytes(impl: str, L: int):
    """Scratch memory XLA allocates for one call (from the compiled kernel; no data needed)."""
    import jax
    import jax.numpy as jnp

    from gmlib import attention as A

    sd = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    args = (sd(N_QUERIES, DIM), sd(L, DIM), sd(DIM, DIM), sd(DIM, DIM))
    try:
        B = A._auto_block_size(N_QUERIES, L)
        if impl == "unblocked" or B >= L:  # "auto" takes the one-pass path for short prompts
            comp = A._softmax_dense.lower(*args).compile()
        else:
            comp = A._softmax_blocked.lower(*args, B).compile()
        return comp.memory_analysis().temp_size_in_bytes
    except Exception:  # memory_analysis is optional for a backend
        return None


# ----------------------------------------------------------------------------- the subprocess


def _hwm_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _status_kib(key: str):
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None


def worker(impl: str, log2L: int) -> None:
    """Run one implementation once at L = 2**log2L in this fresh process and print its memory as JSON."""
    import time

    import jax.numpy as jnp

    q, t, U, V = make_inputs(1 << log2L)
    if impl == "numpy":
        call = numpy_attention
    else:
        call = _gmlib_call(impl)
        q, U, V = map(jnp.asarray, (q, U, V))
        t = jnp.asarray(t)  # the user's prompt, as a jax array
    t0 = time.perf_counter()
    call(q, t, U, V)  # first call (compiles)
    first = time.perf_counter() - t0
    before = _status_kib("VmRSS")
    # VmHWM is this process's own peak; ru_maxrss would also count the parent's peak (Linux keeps it
    # across exec), so it is only the fallback where /proc is missing.
    peak = _status_kib("VmHWM") or peak_rss_bytes()
    steady = None
    if _hwm_reset():
        call(q, t, U, V)
        hwm = _status_kib("VmHWM")
        steady = None if hwm is None or before is None else max(0, hwm - before)
        peak = max(peak, hwm or 0)
    print(json.dumps({"peak_rss": peak, "rss_inputs": before, "call": steady, "first_call_s": first}))


def measure_memory(impl: str, log2L: int, timeout: float = 600):
    """Peak memory of one implementation at L = 2**log2L, in a fresh subprocess (None if it failed)."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")  # share an accelerator with the parent
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, str(log2L)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return json.loads(res.stdout.strip().splitlines()[-1])
    except Exception as exc:  # a crash or an out-of-memory kill: report, do not stop the suite
        print(f"    memory subprocess {impl} L=2^{log2L} failed: {exc!r}", flush=True)
        return None


# ----------------------------------------------------------------------------- the benchmark


def _dense_budget(jax) -> float:
    if jax.default_backend() == "cpu":
        return min(4 << 30, 0.4 * available_memory_bytes())
    stats = jax.devices()[0].memory_stats() or {}
    return 0.6 * stats.get("bytes_limit", 8 << 30)


def run(quick: bool, log) -> tuple[list[Table], list[Goal]]:
    import jax
    import jax.numpy as jnp

    exps = [12, 14, 16] if quick else [12, 14, 16, 18, 20, 22]
    mem_exps = [14, 18] if quick else [12, 16, 18, 20, 22, 23]
    on_cpu = jax.default_backend() == "cpu"
    host_budget = min(4 << 30, 0.4 * available_memory_bytes())
    dense_budget = _dense_budget(jax)
    blocked, unblocked = _gmlib_call("blocked"), _gmlib_call("unblocked")
    import gmlib
    from gmlib import attention as A

    tab = Table(
        f"Finite softmax attention: n = {N_QUERIES} queries, D = {DIM}, float32 (best of interleaved calls)",
        ["L", "auto block", "numpy", "numpy 1 thread", "unblocked", "blocked", "blocked scores/s", "× numpy",
         "× unblocked", "× numpy, CPU time", "max rel. diff"],
    )
    res = {}
    for e in exps:
        L = 1 << e
        log(f"  attention L = 2^{e}")
        q, t, U, V = make_inputs(L)
        qj, tj, Uj, Vj = map(jnp.asarray, (q, t, U, V))
        fns = {}
        if N_QUERIES * L * 4 * 2 <= host_budget:
            fns["numpy"] = lambda: numpy_attention(q, t, U, V)
            if blas_threads(1).available:
                fns["numpy1"] = lambda: _one_thread(numpy_attention, q, t, U, V)
        dense_temp = xla_temp_bytes("unblocked", L)
        if dense_temp is not None and dense_temp <= dense_budget:
            fns["unblocked"] = lambda: unblocked(qj, tj, Uj, Vj)
        fns["blocked"] = lambda: blocked(qj, tj, Uj, Vj)
        times, cpu = best_times(fns, min_time=0.3 if quick else 0.6)
        t_np, t_np1, t_dense, t_blk = (times.get(k) for k in ("numpy", "numpy1", "unblocked", "blocked"))
        t_base = min((x for x in (t_np, t_np1) if x is not None), default=None)
        c_base = min((cpu[k] for k in ("numpy", "numpy1") if k in cpu), default=None)
        cpu_ratio = None if c_base is None else c_base / cpu["blocked"]
        ref = numpy_attention(q, t, U, V) if t_np is not None else None
        out = np.asarray(gmlib.softmax_attention(tj, qj, Uj, Vj, block_size="auto"))
        err = None if ref is None else float(np.abs(out - ref).max() / np.abs(ref).max())
        t_kernel = None
        if not on_cpu:  # the roofline wants the device's time alone (validation copies tokens to the host)
            B_auto = A._auto_block_size(N_QUERIES, L)
            kern = ((lambda: A._softmax_dense(qj, tj, Uj, Vj)) if B_auto >= L
                    else (lambda: A._softmax_blocked(qj, tj, Uj, Vj, B_auto)))
            t_kernel = best_time(lambda: kern().block_until_ready())
        res[e] = (t_base, t_dense, t_blk, t_kernel, cpu_ratio)
        B = A._auto_block_size(N_QUERIES, L)
        tab.add(f"2^{e}", B if B < L else "one pass", fmt_time(t_np), fmt_time(t_np1), fmt_time(t_dense),
                fmt_time(t_blk), fmt_rate(N_QUERIES * L / t_blk), fmt_ratio(t_base and t_base / t_blk),
                fmt_ratio(t_dense and t_dense / t_blk), fmt_ratio(cpu_ratio), fmt_err(err))
        del q, t, qj, tj, ref
    tab.notes.append("numpy and unblocked are skipped (—) where their (n, L) score matrices would not fit "
                     f"the memory budget ({fmt_bytes(host_budget)} host, {fmt_bytes(dense_budget)} for XLA); "
                     "the gmlib columns include input validation (a finiteness check of the tokens). "
                     "`× numpy` is against the faster of the two numpy columns (default BLAS threads, one "
                     "BLAS thread); all four are measured in interleaved rounds. `× numpy, CPU time`: the "
                     "same ratio "
                     "in CPU time of the process (all threads), which other jobs on the machine hardly "
                     "disturb. `max rel. diff`: blocked against numpy, relative to the largest output.")

    mem = Table(
        "Memory of one call (fresh subprocess per cell; peak RSS is the whole process: Python, jax, inputs)",
        ["L", "tokens", "numpy peak RSS", "unblocked peak RSS", "blocked peak RSS", "blocked call",
         "blocked XLA scratch"],
    )
    mres = {}
    for e in mem_exps:
        L = 1 << e
        log(f"  memory L = 2^{e}")
        cells = {}
        for impl in ("numpy", "unblocked", "blocked"):
            if impl == "numpy" and N_QUERIES * L * 4 * 2 > host_budget:
                continue
            if impl == "unblocked":
                temp = xla_temp_bytes("unblocked", L)
                if temp is None or temp > dense_budget or (on_cpu and temp > host_budget):
                    continue
            cells[impl] = measure_memory(impl, e)
        mres[e] = cells
        g = lambda impl, k: (cells.get(impl) or {}).get(k)  # noqa: E731
        mem.add(f"2^{e}", fmt_bytes(L * DIM * 4), fmt_bytes(g("numpy", "peak_rss")),
                fmt_bytes(g("unblocked", "peak_rss")), fmt_bytes(g("blocked", "peak_rss")),
                fmt_bytes(g("blocked", "call")), fmt_bytes(xla_temp_bytes("blocked", L)))
    mem.notes.append("`blocked call`: rise of resident memory during a steady-state call above the inputs "
                     "(the kernel; validation holds no copy or mask of the tokens); "
                     "`XLA scratch`: the compiled kernel's temporary buffers.")

    log(f"  against jax.nn.dot_product_attention and the floor, L = 2^{GOAL_LOG2L}")
    vs_jax, goals = against_jax(jax, jnp, GOAL_LOG2L)
    # where "auto" takes the one-pass path the two columns run the same kernel: only noise to compare
    both = [(e, v[1] / v[2]) for e, v in res.items()
            if v[1] and A._auto_block_size(N_QUERIES, 1 << e) < 1 << e]
    if both:
        e_min, r_min = min(both, key=lambda x: x[1])
        goals.append(Goal("blocked vs unblocked (every L both run, auto blocks)", "≥ 1×",
                          f"min {fmt_ratio(r_min)} (L = 2^{e_min})", r_min >= 0.95))
    big = max(mres)
    peak = ((mres[big] or {}).get("blocked") or {}).get("peak_rss")
    goals.append(Goal(f"blocked peak RSS, L = 2^{big}",
                      "≤ 3 GB (whole process)" if big >= 23 else "≤ 3 GB at 2^23",
                      fmt_bytes(peak), None if peak is None or big < 23 else peak <= 3e9))
    calls = [(e, (c.get("blocked") or {}).get("call")) for e, c in mres.items()]
    calls = [(e, c) for e, c in calls if c is not None]
    if len(calls) >= 2:
        growth = [c for (e, c) in calls]
        kernel_flat = max(growth) < 64e6
        goals.append(Goal("blocked memory flat in L", "call memory flat",
                          f"{fmt_bytes(min(growth))} … {fmt_bytes(max(growth))}", kernel_flat))
    tables = [tab, vs_jax, mem]
    if not on_cpu:
        tables.append(_roofline(res, jax, log))
    return tables, goals


def against_jax(jax, jnp, log2L: int):
    """The public call and its kernel against jax.nn.dot_product_attention and the floor: ``(table, goals)``."""
    from gmlib import attention as A

    L = 1 << log2L
    q, t, U, V = (jnp.asarray(a) for a in make_inputs(L))
    B = A._auto_block_size(N_QUERIES, L)
    matmuls, exponentials = floor_ops(jax, jnp, L, B)
    scores = jnp.asarray(np.random.default_rng(1).standard_normal((N_QUERIES, B), dtype=np.float32))
    dpa, public = jax_attention(jax), _gmlib_call("blocked")
    fns = {
        "public": lambda: public(q, t, U, V),
        "kernel": lambda: A._softmax_blocked(q, t, U, V, B).block_until_ready(),
        "jax": lambda: dpa(q, t, U, V).block_until_ready(),
        "matmuls": lambda: matmuls(q, t, U).block_until_ready(),
        "exponentials": lambda: exponentials(scores).block_until_ready(),
    }
    wall, cpu = best_times(fns, min_time=0.6)
    floor, floor_cpu = wall["matmuls"] + wall["exponentials"], cpu["matmuls"] + cpu["exponentials"]
    ref = np.asarray(A._softmax_blocked(q, t, U, V, B))
    err = float(np.abs(np.asarray(dpa(q, t, U, V)) - ref).max() / np.abs(ref).max())
    tab = Table(f"Against the JAX call and the floor: L = 2^{log2L}, n = {N_QUERIES}, D = {DIM}, float32, "
                f"blocks of {B} (best of interleaved calls)", ["implementation", "time", "CPU time", "× gmlib public"])
    rows = (("gmlib softmax_attention (public, block_size='auto')", "public"),
            ("gmlib blocked kernel alone (no validation)", "kernel"),
            ("jax.nn.dot_product_attention, scale = 1, in jax.jit", "jax"),
            ("floor: gmlib's two block matmuls alone", "matmuls"),
            ("floor: gmlib's exponentials (and row sums) alone", "exponentials"))
    for label, k in rows:
        tab.add(label, fmt_time(wall[k]), fmt_time(cpu[k]), fmt_ratio(wall[k] / wall["public"]))
    tab.add("floor: matmuls + exponentials", fmt_time(floor), fmt_time(floor_cpu), fmt_ratio(floor / wall["public"]))
    tab.notes.append("the JAX call: queries z U^T, keys the tokens, values the tokens V^T in the (B, T, N, H) layout "
                     "of jax.nn.dot_product_attention, one jitted function; it holds the n × L scores. Its max "
                     f"relative difference from gmlib: {fmt_err(err)}. The floor times gmlib's operations over "
                     "the same blocks without the online softmax's bookkeeping (running max, rescaling, "
                     "merges) and without validation; XLA fuses the kernel's exponentials into its loop, so "
                     "the kernel can beat the sum of the parts.")
    vs_jax, vs_floor = wall["jax"] / wall["public"], wall["kernel"] / floor
    on_cpu = jax.default_backend() == "cpu"  # the goals are set for a CPU; elsewhere they are only reported
    goals = [
        Goal(f"softmax_attention vs jax.nn.dot_product_attention, L = 2^{log2L}", f"≥ {TARGET_VS_JAX:g}× on CPU",
             f"{fmt_ratio(vs_jax)} (CPU time: {fmt_ratio(cpu['jax'] / cpu['public'])})",
             vs_jax >= TARGET_VS_JAX if on_cpu else None),
        Goal(f"blocked kernel vs the floor of its operations, L = 2^{log2L}", f"≤ {TARGET_FLOOR:g}× on CPU",
             f"{fmt_ratio(vs_floor)} (CPU time: {fmt_ratio(cpu['kernel'] / floor_cpu)})",
             vs_floor <= TARGET_FLOOR if on_cpu else None),
    ]
    return tab, goals


# ----------------------------------------------------------------------------- 5: accelerators


def _roofline(res, jax, log) -> Table:
    """Throughput as a fraction of the device's peaks, and the largest prompt that fits."""
    import jax.numpy as jnp

    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", str(dev))
    peaks = next((p for p in DEVICE_PEAKS if p[0].lower() in kind.lower()), None)
    tab = Table(f"Roofline on {kind} (the kernel block_size='auto' runs, without host-side validation)",
                ["L", "time", "TFLOP/s", "of FP32 peak", "of TF32 peak", "GB/s", "of bandwidth",
                 "of roofline"])
    for e, (_, _, _, t, _) in sorted(res.items()):
        L = 1 << e
        flops = 4.0 * N_QUERIES * L * DIM + 3.0 * N_QUERIES * L  # two matmuls, exp/subtract/sum
        nbytes = 4.0 * L * DIM  # the tokens, read once
        fps, bps = flops / t, nbytes / t
        if peaks:
            _, fp32, tf32, bw = peaks
            compute = tf32 or fp32
            roof = min(compute, flops / nbytes * bw)
            tab.add(f"2^{e}", fmt_time(t), f"{fps / 1e12:.2f}", f"{fps / fp32:.2%}",
                    "—" if tf32 is None else f"{fps / tf32:.2%}", f"{bps / 1e9:.1f}", f"{bps / bw:.2%}",
                    f"{fps / roof:.1%}")
        else:
            tab.add(f"2^{e}", fmt_time(t), f"{fps / 1e12:.2f}", "—", "—", f"{bps / 1e9:.0f}", "—", "—")
    if peaks is None:
        tab.notes.append(f"device '{kind}' is not in the peak table of benchmarks/bench_attention.py: "
                         "add its FP32/TF32 FLOP/s and bandwidth there to get fractions.")
    else:
        tab.notes.append(f"peaks used: FP32 {peaks[1] / 1e12:g} TFLOP/s, TF32 "
                         f"{'n/a' if peaks[2] is None else f'{peaks[2] / 1e12:g} TFLOP/s'}, "
                         f"{peaks[3] / 1e12:g} TB/s; roofline = min(TF32 (else FP32) peak, "
                         "arithmetic intensity × bandwidth); flops = 4nLD + 3nL.")
    # The largest L that fits: double until the device refuses (the blocked path needs only the
    # tokens). The tokens are a constant fill (no random-number temporaries) and the kernel is
    # called directly: the public function's finiteness check would copy them to the host.
    from gmlib import attention as A

    limit = (dev.memory_stats() or {}).get("bytes_limit")
    q = jax.random.normal(jax.random.key(0), (N_QUERIES, DIM), jnp.float32)
    U = jnp.eye(DIM, dtype=jnp.float32) / DIM
    largest = None
    e = 23
    while e <= 34 and (limit is None or (1 << e) * DIM * 4 < limit):
        log(f"  device capacity L = 2^{e}")
        try:
            t = jnp.full((1 << e, DIM), 0.01, jnp.float32)
            A._softmax_blocked(q, t, U, U, A._auto_block_size(N_QUERIES, 1 << e)).block_until_ready()
            largest = e
            del t
        except Exception as exc:  # RESOURCE_EXHAUSTED and the like
            log(f"    2^{e} does not fit: {type(exc).__name__}")
            break
        e += 1
    if largest is None:
        tab.notes.append("largest L that ran (doubling from 2^23): none")
    else:
        limit_txt = f"; device memory limit {fmt_bytes(limit)}" if limit else ""
        tab.notes.append(f"largest L that ran (doubling from 2^23): 2^{largest} = {1 << largest:,} tokens "
                         f"({fmt_bytes((1 << largest) * DIM * 4)} of tokens{limit_txt})")
    return tab


if __name__ == "__main__" and len(sys.argv) >= 4 and sys.argv[1] == "--worker":
    worker(sys.argv[2], int(sys.argv[3]))
