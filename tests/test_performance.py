"""The fast attention kernels: blocked and one-pass agree, nothing recompiles, memory stays flat; and the
weight of validation (its share of gmlib's statement lines, the count of benchmarks/bench_api.py).

Timings live in ``benchmarks/`` (``make bench``), never here: these tests check the
properties that make the kernels fast without measuring time.
"""

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gmlib import attention as A
from gmlib import softmax_attention

RNG = np.random.default_rng(6)


def numpy_reference(q, toks, U, V):
    """Float64 numpy: scores, stable softmax, weighted sum of values (V z_i for each token)."""
    q, toks, U, V = (np.asarray(x, dtype=np.float64) for x in (q, toks, U, V))
    s = (q @ U.T) @ toks.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ (toks @ V.T)


def inputs(n, L, D, D_out, dtype, scale=1.0):
    q = RNG.normal(size=(n, D))
    toks = RNG.normal(size=(L, D))
    U = scale * RNG.normal(size=(D, D)) / D
    V = RNG.normal(size=(D_out, D))
    return tuple(jnp.asarray(x, dtype) for x in (q, toks, U, V))


TOL = {jnp.float32: dict(rtol=2e-4, atol=2e-5), jnp.float64: dict(rtol=1e-10, atol=1e-12)}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
# D_out < D projects each block's tokens by V; D_out >= D accumulates tokens and applies V at the end
@pytest.mark.parametrize(("L", "D_out"), [(1, 3), (64, 8), (257, 1), (1000, 8), (4097, 3)])
def test_blocked_matches_unblocked_and_numpy(dtype, L, D_out):
    q, toks, U, V = inputs(7, L, 3, D_out, dtype, scale=3.0)
    expected = numpy_reference(q, toks, U, V)
    dense = softmax_attention(toks, q, U, V)
    assert dense.dtype == dtype
    np.testing.assert_allclose(dense, expected, **TOL[dtype])
    for block in (1, 7, 64, 1000, L + 3):  # L not a multiple of the block, and blocks longer than L
        out = softmax_attention(toks, q, U, V, block_size=block)
        assert out.dtype == dtype and out.shape == (7, D_out)
        np.testing.assert_allclose(out, dense, **TOL[dtype], err_msg=f"L={L}, block_size={block}")
        if block >= L:  # the public function takes the one-pass path there: check the kernel itself
            np.testing.assert_allclose(A._softmax_blocked(q, toks, U, V, block), dense, **TOL[dtype])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_auto_block_size(dtype):
    q, toks, U, V = inputs(256, 20_000, 4, 4, dtype)
    out = softmax_attention(toks, q, U, V, block_size="auto")
    np.testing.assert_allclose(out, numpy_reference(q, toks, U, V), **TOL[dtype])
    for n in (1, 3, 256, 4096):
        for L in (1, 100, 5000, 10**6):
            b = A._auto_block_size(n, L)
            assert b == L or (b & (b - 1) == 0 and 256 <= b < L), (n, L, b)
    with pytest.raises(ValueError, match="block_size"):
        softmax_attention(toks, q, U, V, block_size="fast")


def test_blocked_stays_finite_for_huge_scores():
    q, toks, U, V = inputs(5, 999, 3, 3, jnp.float64, scale=3e3)  # scores of order 1e3 to 1e4
    expected = numpy_reference(q, toks, U, V)
    for block in (10, 128):
        out = softmax_attention(toks, q, U, V, block_size=block)
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("D_out", [2, 5])
def test_blocked_gradients_match_unblocked(D_out):
    q, toks, U, V = inputs(4, 301, 3, D_out, jnp.float64)

    def loss(U, V, block):
        return jnp.sum(softmax_attention(toks, q, U, V, block_size=block) ** 2)

    g_dense = jax.grad(loss, argnums=(0, 1))(U, V, None)
    g_block = jax.grad(loss, argnums=(0, 1))(U, V, 32)
    for a, b in zip(g_dense, g_block):
        assert np.all(np.isfinite(b))
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)


def _cache_size(fn):
    if not hasattr(fn, "_cache_size"):
        pytest.skip("this jax version does not expose a jitted function's cache size")
    return fn._cache_size()


def test_no_recompilation_for_repeated_shapes():
    """Fresh arrays of the same shapes and dtypes reuse the compiled kernels.

    (numpy inputs get an entry of their own in the jitted kernel's dispatch cache, which the
    counter sees, over the same compiled program: both kinds are called once first.)
    """
    for kernel, block in ((A._softmax_blocked, 64), (A._softmax_dense, None), (A._softmax_blocked, "auto")):
        L = 20_011 if block == "auto" else 1_003  # "auto" streams only prompts longer than eight blocks
        q, toks, U, V = inputs(256 if block == "auto" else 6, L, 3, 3, jnp.float32)
        softmax_attention(toks, q, U, V, block_size=block).block_until_ready()
        softmax_attention(np.asarray(toks), np.asarray(q), U, V, block_size=block)
        before = _cache_size(kernel)
        for seed in range(4):
            q2, toks2, U2, V2 = (x + seed for x in (q, toks, U, V))
            softmax_attention(toks2, q2, U2, V2, block_size=block).block_until_ready()
            softmax_attention(np.asarray(toks2), np.asarray(q2), U2, V2, block_size=block)  # numpy in
        assert _cache_size(kernel) == before, f"{kernel.__name__} recompiled for block_size={block}"
    # a new block size is a new static argument: exactly one more compilation, then none
    start = _cache_size(A._softmax_blocked)
    softmax_attention(toks, q, U, V, block_size=96)
    after = _cache_size(A._softmax_blocked)
    assert after == start + 1  # the counter does see compilations
    softmax_attention(toks, q + 1, U, V, block_size=96)
    assert _cache_size(A._softmax_blocked) == after


def test_blocked_kernel_memory_is_flat_in_L():
    """The compiled blocked kernel's scratch memory does not grow with L (no (n, L) scores, no copy)."""
    n, D = 256, 21
    sd = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731

    def scratch(L):
        comp = A._softmax_blocked.lower(sd(n, D), sd(L, D), sd(D, D), sd(D, D), 2048).compile()
        stats = comp.memory_analysis()
        if stats is None:
            pytest.skip("this backend reports no memory analysis")
        return stats.temp_size_in_bytes

    small, large = scratch(2**14 + 5), scratch(2**22 + 5)
    assert large <= small + 4096, (small, large)
    assert large < n * 2048 * 4 * 4  # a few (n, block) tiles at most, nowhere near n × L or L × D


# ============================================================================ the weight of validation

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_api  # noqa: E402  (benchmarks/bench_api.py: the count the benchmark page reports)

COUNTED = '''
"""A module docstring: left out."""
import os
from gmlib import _checks as C

X = [1,
     2]


def f(a, b):
    """A docstring: left out."""
    a = C.array(a, "a")
    if a.ndim != 2:
        raise ValueError(
            "two lines")
    if b:
        raise ValueError("x")
    else:
        raise TypeError("y")
    if b > 1:
        b = 2
        raise ValueError("z")
    for i in range(C.scalar(b, "b")):
        a = a + i
    try:
        a = 1
    except Exception:
        raise ValueError("w") from None
    return a


def _check_thing(x):
    y = x + 1
    return y
'''


def test_validation_count_follows_its_rules():
    """By hand: X 2 lines; def f 1; C.array 1 (validation); an if-raise 1 + 2 (validation); an if/else whose
    branches only raise 3 (validation); an if that also assigns 1 + 1 and its raise 1 (validation); a for whose
    header calls C.scalar 1 (validation) and its body 1; try 1, a = 1 1, a raise 1 (validation); return 1;
    _check_thing 3 (validation). 22 lines, 13 of them validation; all of them in _checks.py."""
    assert bench_api.count_lines(COUNTED) == (22, 13)
    assert bench_api.count_lines(COUNTED, whole_module_is_validation=True) == (22, 22)


def test_validation_count_walks_packages(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "b.py").write_text("if x:\n    raise ValueError('x')\n")
    shares = bench_api.validation_shares(str(tmp_path))
    assert shares == {"a.py": (1, 0), "pkg/b.py": (2, 2)}
    assert bench_api.library_share(shares) == 2 / 3


def test_validation_share_of_gmlib_is_at_most_20_percent():
    """Validation (_checks.py included) is at most 20 % of gmlib's statement lines (benchmarks/bench_api.py)."""
    shares = bench_api.validation_shares()
    share = bench_api.library_share(shares)
    worst = sorted(shares.items(), key=lambda kv: -kv[1][1])[:5]
    assert share <= bench_api.TARGET_SHARE, f"validation is {share:.1%} of gmlib's statement lines; most in {worst}"
