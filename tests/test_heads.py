"""gmlib.heads: the layer of heads (Heads), its evaluation (apply_heads), random heads (init_heads), Batch.

Reference tests compare apply_heads with plain numpy formulas (softmax and linear attention per
head, the output map on the concatenated heads, the residual) and with the population operators
of gmlib.attention on a mixture; property tests (hypothesis, strategies from ``strategies.py``)
check invariants on random valid layers, and that invalid input gets a ValueError naming the
argument.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import DTYPES, SETTINGS, Arg, arrays, assert_rejects, bad_positive_int, corrupt, tol

import gmlib
from gmlib import Batch, GaussianMixture, Heads, apply_heads, init_heads, population_attention, softmax_attention


def _np(a):
    return np.asarray(a, np.float64)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def numpy_heads(U, V, W, residual, prompt, q, kind="softmax", mask=None):
    """The layer in float64 numpy: per head softmax(q U^T z^T) z V^T or q U^T M2 V^T (M2 = mean z z^T over
    the tokens that count), plus q with the residual; W (concatenated heads) or the sum."""
    U, V, prompt, q = (_np(a) for a in (U, V, prompt, q))
    keep = np.ones(len(prompt), bool) if mask is None else np.asarray(mask)
    z = prompt[keep]
    outs = []
    for Uh, Vh in zip(U, V):
        if kind == "softmax":
            out = _softmax(q @ Uh.T @ z.T, axis=1) @ z @ Vh.T
        else:
            out = q @ Uh.T @ (z.T @ z / len(z)) @ Vh.T
        outs.append(out + q if residual else out)
    return np.concatenate(outs, axis=1) @ _np(W).T if W is not None else sum(outs)


def random_heads(seed, H=3, D=2, Dv=None, Dy=None, residual=False, dtype=np.float64):
    rng = np.random.default_rng(seed)
    Dv = D if Dv is None else Dv
    W = None if Dy is None else rng.normal(size=(Dy, H * Dv)).astype(dtype)
    return Heads(U=rng.normal(size=(H, D, D)).astype(dtype), V=rng.normal(size=(H, Dv, D)).astype(dtype), W_out=W,
                 residual=residual)


# ============================================================================ apply_heads (reference)


@pytest.mark.parametrize("kind", ["softmax", "linear"])
@pytest.mark.parametrize("Dy, residual", [(None, False), (None, True), (4, False), (4, True)])
def test_apply_heads_against_numpy(kind, Dy, residual):
    """The sum of the heads (the paper's multi-head attention) or W_out on their concatenation, with or
    without the residual, softmax or linear: the numpy formula to 1e-12."""
    heads = random_heads(0, Dy=Dy, residual=residual)
    rng = np.random.default_rng(1)
    toks, q = rng.normal(size=(40, 2)), rng.normal(size=(5, 2))
    got = apply_heads(heads, toks, q, kind=kind)
    assert got.shape == (5, 4 if Dy else 2)
    np.testing.assert_allclose(got, numpy_heads(heads.U, heads.V, heads.W_out, residual, toks, q, kind),
                               rtol=1e-12, atol=1e-12)


def test_each_head_is_softmax_attention_and_w_out_concatenates_in_head_order():
    """A one-hot W_out picks head h's output, which is softmax_attention(U_h, V_h); without W_out the output
    is the sum of those."""
    heads = random_heads(2, H=3, D=2, Dv=2)
    rng = np.random.default_rng(3)
    toks, q = rng.normal(size=(30, 2)), rng.normal(size=(4, 2))
    per_head = [softmax_attention(toks, q, heads.U[h], heads.V[h]) for h in range(3)]
    np.testing.assert_allclose(apply_heads(heads, toks, q), sum(per_head), rtol=1e-12)
    for h in range(3):
        pick = np.zeros((2, 6))
        pick[:, 2 * h:2 * h + 2] = np.eye(2)
        one = Heads(heads.U, heads.V, W_out=pick)
        np.testing.assert_allclose(apply_heads(one, toks, q), per_head[h], rtol=1e-12)


@pytest.mark.parametrize("block_size", [1, 7, 16, 64, "auto"])
def test_block_size_streams_the_same_output(block_size):
    heads = random_heads(4, H=2, D=3, Dy=2, residual=True)
    rng = np.random.default_rng(5)
    toks, q = rng.normal(size=(50, 3)), rng.normal(size=(6, 3))
    np.testing.assert_allclose(apply_heads(heads, toks, q, block_size=block_size), apply_heads(heads, toks, q),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["softmax", "linear"])
def test_masked_prompt_equals_the_unpadded_one(kind):
    """Padding a prompt of L tokens with garbage and masking it gives the output on the L tokens, under jit;
    and the numpy formula on the tokens that count (a mask with holes too)."""
    heads = random_heads(0, H=2, D=3, Dy=3, residual=True)
    rng = np.random.default_rng(1)
    toks, q = rng.normal(size=(64, 3)), rng.normal(size=(5, 3))
    f = jax.jit(lambda t, L: apply_heads(heads, t, q, kind=kind, mask=jnp.arange(64) < L))
    for L in (1, 17, 64):
        padded = toks.copy()
        padded[L:] = 50.0  # scores far above the real ones: any leak would show
        np.testing.assert_allclose(f(padded, L), apply_heads(heads, toks[:L], q, kind=kind), rtol=1e-12,
                                   atol=1e-12)
    holes = rng.random(64) < 0.5
    np.testing.assert_allclose(apply_heads(heads, toks, q, kind=kind, mask=holes),
                               numpy_heads(heads.U, heads.V, heads.W_out, True, toks, q, kind, holes), rtol=1e-12)


@pytest.mark.parametrize("kind", ["softmax", "linear"])
def test_apply_heads_on_the_infinite_prompt(kind):
    """A GaussianMixture prompt: W_out (z + T_h[mu](z))_h with T_h = population_attention, or for linear
    attention V_h E[z' z'^T] U_h z with the second moment computed in numpy."""
    heads = random_heads(6, H=2, D=2, Dy=2, residual=True)
    w, means, sd = np.array([0.4, 0.6]), np.array([[1.0, 0.0], [0.0, 2.0]]), 0.7
    mix = GaussianMixture.isotropic(jnp.asarray(w), jnp.asarray(means), sd)
    q = np.random.default_rng(7).normal(size=(5, 2))
    outs = []
    for U, V in zip(heads.U, heads.V):
        if kind == "softmax":
            outs.append(_np(population_attention(mix, q, U, V)))
        else:
            m2 = sd**2 * np.eye(2) + means.T @ np.diag(w) @ means
            outs.append(q @ (_np(V) @ m2 @ _np(U)).T)
    expected = np.concatenate([h + q for h in outs], axis=1) @ _np(heads.W_out).T
    np.testing.assert_allclose(apply_heads(heads, mix, q, kind=kind), expected, rtol=1e-10, atol=1e-12)


def test_long_prompt_approaches_the_infinite_prompt():
    """Softmax heads on L = 2e5 tokens drawn from the mixture are within a few Monte Carlo errors of the
    infinite prompt (Prop 2.1: the finite-prompt output converges to the population one)."""
    heads = random_heads(8, H=2, D=2, Dy=None)
    heads = Heads(0.3 * heads.U, heads.V)
    w, means, sd = np.array([0.3, 0.7]), np.array([[1.0, -1.0], [0.5, 1.0]]), 0.8
    mix = GaussianMixture.isotropic(jnp.asarray(w), jnp.asarray(means), sd)
    rng = np.random.default_rng(0)
    labels = rng.random(200_000) < w[1]
    toks = means[labels.astype(int)] + sd * rng.normal(size=(200_000, 2))
    q = np.array([[0.5, 0.2], [-1.0, 1.0]])
    np.testing.assert_allclose(apply_heads(heads, toks, q), apply_heads(heads, mix, q), atol=0.03)


@pytest.mark.smoke
def test_grad_vmap_jit():
    """jax.grad through the Heads pytree equals central finite differences; vmap over prompts equals the
    loop; jit equals the eager call."""
    heads = random_heads(9, H=2, D=2, Dy=2, residual=True)
    rng = np.random.default_rng(10)
    toks, q = rng.normal(size=(3, 12, 2)), rng.normal(size=(3, 4, 2))

    def loss(h):
        return jnp.sum(jax.vmap(lambda t, z: apply_heads(h, t, z))(toks, q) ** 2)

    g = jax.grad(loss)(heads)
    assert isinstance(g, Heads) and g.residual
    eps = 1e-6
    for name in ("U", "V", "W_out"):
        a = _np(getattr(heads, name))
        idx = (0,) * a.ndim
        e = np.zeros_like(a)
        e[idx] = eps
        plus, minus = (Heads(**{**_fields(heads), name: a + s * e}) for s in (1, -1))
        fd = (loss(plus) - loss(minus)) / (2 * eps)
        np.testing.assert_allclose(getattr(g, name)[idx], fd, rtol=1e-6)
    batched = jax.vmap(lambda t, z: apply_heads(heads, t, z))(toks, q)
    for i in range(3):
        np.testing.assert_allclose(batched[i], apply_heads(heads, toks[i], q[i]), rtol=1e-12)
    np.testing.assert_allclose(jax.jit(apply_heads)(heads, toks[0], q[0]), apply_heads(heads, toks[0], q[0]),
                               rtol=1e-12)


def _fields(h):
    return dict(U=h.U, V=h.V, W_out=h.W_out, residual=h.residual)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtypes(dtype):
    """float32 heads and prompt give float32 within float32 rounding of the float64 numpy formula; float64
    gives float64 to 1e-12; mixed float32 heads and float64 prompt compute in float64."""
    heads = random_heads(11, H=2, D=3, Dy=2, dtype=dtype)
    rng = np.random.default_rng(12)
    toks, q = rng.normal(size=(30, 3)).astype(dtype), rng.normal(size=(4, 3)).astype(dtype)
    got = apply_heads(heads, toks, q)
    assert got.dtype == dtype and heads.dtype == dtype
    expected = numpy_heads(heads.U, heads.V, heads.W_out, False, toks, q)
    np.testing.assert_allclose(got, expected, rtol=1e-12 if dtype == np.float64 else 1e-4,
                               atol=1e-12 if dtype == np.float64 else 1e-4)
    if dtype == np.float32:
        assert apply_heads(heads, toks.astype(np.float64), q.astype(np.float64)).dtype == np.float64


# ============================================================================ properties


@st.composite
def head_layers(draw):
    """(heads, tokens, queries, kind) of a valid apply_heads call."""
    dtype = draw(st.sampled_from(DTYPES))
    H, D, L = draw(st.sampled_from([(1, 2, 5), (3, 2, 8), (2, 3, 5)]))
    residual = draw(st.booleans())
    dv = D if residual else draw(st.sampled_from([1, D]))
    W = draw(arrays((2, H * dv))).astype(dtype) if draw(st.booleans()) else None
    heads = Heads(draw(arrays((H, D, D))).astype(dtype), draw(arrays((H, dv, D))).astype(dtype), W, residual)
    return (heads, draw(arrays((L, D))).astype(dtype), draw(arrays((2, D))).astype(dtype),
            draw(st.sampled_from(["softmax", "linear"])))


@settings(SETTINGS, max_examples=60)  # each new (shapes, dtype, kind) compiles: 60 examples cover them
@given(layer=head_layers(), seed=st.integers(0, 1000))
def test_apply_heads_formula_and_symmetries(layer, seed):
    """The numpy formula; invariant to permuting or duplicating the tokens, and to permuting the heads
    together with W_out's column blocks."""
    heads, toks, q, kind = layer
    t = tol(toks.dtype)
    out = _np(apply_heads(heads, toks, q, kind=kind))
    expected = numpy_heads(heads.U, heads.V, heads.W_out, heads.residual, toks, q, kind)
    assert out.shape == expected.shape and np.all(np.isfinite(out))
    sc = 300 * t * (1 + np.abs(expected).max())
    np.testing.assert_allclose(out, expected, atol=sc)
    rng = np.random.default_rng(seed)
    twice = np.concatenate([toks[rng.permutation(toks.shape[0])]] * 2)
    np.testing.assert_allclose(_np(apply_heads(heads, twice, q, kind=kind)), out, atol=sc)
    hp = rng.permutation(heads.n_heads)
    W = heads.W_out
    if W is not None:
        W = W.reshape(W.shape[0], heads.n_heads, -1)[:, hp].reshape(W.shape)
    permuted = Heads(heads.U[hp], heads.V[hp], W, heads.residual)
    np.testing.assert_allclose(_np(apply_heads(permuted, toks, q, kind=kind)), out, atol=sc)


# ============================================================================ Heads, init_heads, Batch


def test_heads_properties_astype_and_pytree():
    heads = random_heads(0, H=3, D=2, Dv=1, Dy=4)
    assert (heads.n_heads, heads.dim, heads.out_dim, heads.dtype) == (3, 2, 4, jnp.float64)
    assert Heads(heads.U, heads.V).out_dim == 1
    leaves, treedef = jax.tree.flatten(heads)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert len(leaves) == 3 and isinstance(rebuilt, Heads) and rebuilt.W_out is heads.W_out
    assert len(jax.tree.leaves(Heads(heads.U, heads.V))) == 2  # no output map: two leaves
    f32 = heads.astype(jnp.float32)
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(f32)) and f32.residual == heads.residual
    doubled = jax.tree.map(lambda a: 2 * a, Heads(heads.U[:, :1, :1], heads.U[:, :1, :1], residual=True))
    assert isinstance(doubled, Heads) and doubled.residual
    from_lists = Heads([[[1, 0], [0, 1]]], [[[1.0, 2.0]]])  # nested lists, ints: the default float
    assert from_lists.U.dtype == jnp.float64 and from_lists.V.shape == (1, 1, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value_dim, out_dim", [(None, None), (1, None), (None, 3), (2, 5)])
def test_init_heads(dtype, value_dim, out_dim):
    """Shapes (H, D, D), (H, D_v, D), (D_y, H D_v); dtype; reproducible; U, V linear in `scale`; entry
    variances scale^2 / D and 1 / (H D_v) (within 5 standard errors over 4 x 60 x 60 entries)."""
    kw = dict(n_heads=4, dim=60, value_dim=value_dim, out_dim=out_dim, dtype=dtype)
    h = init_heads(key=jax.random.key(0), scale=0.5, **kw)
    h1 = init_heads(key=jax.random.key(0), scale=1.0, **kw)
    dv = value_dim or 60
    assert h.U.shape == (4, 60, 60) and h.V.shape == (4, dv, 60) and h.dtype == dtype
    assert (h.W_out is None) == (out_dim is None)
    if out_dim is not None:
        assert h.W_out.shape == (out_dim, 4 * dv)
        np.testing.assert_array_equal(_np(h.W_out), _np(h1.W_out))
    np.testing.assert_allclose(_np(h.U), 0.5 * _np(h1.U), rtol=tol(dtype))
    np.testing.assert_allclose(_np(h.V), 0.5 * _np(h1.V), rtol=tol(dtype))
    var = _np(h1.U).var()
    assert abs(var - 1 / 60) < 5 * np.sqrt(2 / h1.U.size) / 60
    again = init_heads(key=jax.random.key(0), scale=0.5, **kw)
    for a, b in zip(jax.tree.leaves(h), jax.tree.leaves(again)):
        np.testing.assert_array_equal(a, b)
    assert init_heads(key=jax.random.key(0), n_heads=1, dim=2, residual=True).residual


def test_batch_fields():
    b = Batch(jnp.zeros((2, 5, 3)), jnp.zeros((2, 1, 3)), jnp.zeros((2, 1, 3)))
    assert b.aux is None and b.mask is None and b._fields == ("prompt", "queries", "targets", "aux", "mask")
    assert len(jax.tree.leaves(b._replace(mask=jnp.arange(5) < 3))) == 4


# ============================================================================ invalid inputs


def test_apply_heads_rejects_invalid():
    heads = random_heads(0, H=2, D=2, Dy=3)
    toks, q = np.ones((5, 2)), np.ones((3, 2))
    mix = GaussianMixture.isotropic(jnp.array([1.0]), jnp.zeros((1, 3)), 1.0)
    cases = [
        (dict(heads={"U": heads.U, "V": heads.V}), "heads"),
        (dict(kind="cosine"), "kind"),
        (dict(kind=None), "kind"),
        (dict(prompt=np.ones((5, 3))), "prompt"),
        (dict(prompt=np.ones((0, 2))), "prompt"),
        (dict(prompt=np.ones(2)), "prompt"),
        (dict(prompt=mix), "prompt"),
        (dict(prompt=np.full((5, 2), np.nan)), "prompt"),
        (dict(prompt=np.ones((5, 2)) + 1j), "prompt"),
        (dict(queries=np.ones((3, 3))), "queries"),
        (dict(queries=np.ones(2)), "queries"),
        (dict(queries=np.full((3, 2), np.inf)), "queries"),
        (dict(mask=np.ones(4, bool)), "mask"),
        (dict(mask=np.ones(5)), "mask"),
        (dict(mask=np.ones(5, bool), block_size=2), "mask"),
        (dict(block_size=0), "block_size"),
        (dict(block_size="fast"), "block_size"),
        (dict(block_size=2.5), "block_size"),
    ]
    for bad, name in cases:
        args = {"heads": heads, "prompt": toks, "queries": q, **bad}
        with pytest.raises(ValueError, match=f"`{name}`"):
            apply_heads(args.pop("heads"), args.pop("prompt"), args.pop("queries"), **args)
    good_mix = GaussianMixture.isotropic(jnp.array([1.0]), jnp.zeros((1, 2)), 1.0)
    with pytest.raises(ValueError, match="`mask`"):
        apply_heads(heads, good_mix, q, mask=np.ones(1, bool))


@SETTINGS
@given(layer=head_layers(), data=st.data())
def test_heads_rejects_invalid(layer, data):
    """One leaf of a valid Heads corrupted (rank, a size fixed by the others, NaN, a non-real dtype): the
    constructor names it (or the leaf whose shape fixed the size)."""
    heads = layer[0]
    leaves = {"U": _np(heads.U), "V": _np(heads.V)}
    spec = {"U": Arg(fixed_axes=(1, 2)), "V": Arg(fixed_axes=(0, 2))}
    if heads.W_out is not None:
        leaves["W_out"], spec["W_out"] = _np(heads.W_out), Arg(fixed_axes=(1,))
    name, bad = data.draw(corrupt(leaves, spec))
    assert_rejects(lambda: Heads(**bad, residual=heads.residual), name, "U", "V", "W_out")


def test_heads_needs_a_head_and_a_residual_fit():
    with pytest.raises(ValueError, match="`U`"):
        Heads(np.zeros((0, 2, 2)), np.zeros((0, 2, 2)))  # no heads would sum to a silent 0
    with pytest.raises(ValueError, match="residual"):
        Heads(np.zeros((1, 2, 2)), np.zeros((1, 1, 2)), residual=True)
    with pytest.raises(ValueError, match="`residual`"):
        Heads(np.zeros((1, 2, 2)), np.zeros((1, 2, 2)), residual="yes")


def _bad_dtype_arg(_):
    return st.sampled_from([np.int32, "banana", np.complex64, bool])


OBJ = lambda *extra: Arg(rank=False, finite=False, dtype=False, extra=extra)  # noqa: E731


@SETTINGS
@given(data=st.data())
def test_init_heads_rejects_invalid(data):
    def bad_scale(_):
        return st.sampled_from([np.nan, np.inf, np.ones(2), "1", None])

    def not_none(strategy):
        return lambda v: strategy(v).filter(lambda c: c is not None)

    args = dict(key=jax.random.key(0), n_heads=2, dim=2, value_dim=None, out_dim=3, scale=1.0, dtype=None)
    # a bad key is refused by jax.random itself (a TypeError naming the key data)
    spec = {"n_heads": OBJ(bad_positive_int), "dim": OBJ(bad_positive_int),
            "value_dim": OBJ(not_none(bad_positive_int)), "out_dim": OBJ(not_none(bad_positive_int)),
            "scale": OBJ(bad_scale), "dtype": OBJ(_bad_dtype_arg)}
    name, bad = data.draw(corrupt(args, spec))
    assert_rejects(lambda: init_heads(**bad), name)


def test_init_heads_keyword_only():
    with pytest.raises(TypeError):
        init_heads(jax.random.key(0), n_heads=1, dim=2)
    with pytest.raises(ValueError, match="value_dim"):
        init_heads(key=jax.random.key(0), n_heads=1, dim=2, value_dim=1, residual=True)


def test_public_names_are_gmlib_names():
    assert gmlib.Heads is Heads and gmlib.apply_heads is apply_heads and gmlib.init_heads is init_heads
    assert all(n in gmlib.__all__ for n in ("Batch", "Heads", "apply_heads", "init_heads"))


# ---- heads_from_flax: a flax.nnx.MultiHeadAttention read as Heads (flax is optional) ----

LAYERS = [  # (heads, dim, head size, key-value heads, biases)
    (1, 3, 3, 1, False),  # d_k = D
    (2, 3, 2, 2, True),  # d_k < D, biases
    (4, 4, 1, 2, True),  # rank-one U, grouped keys and values
    (2, 5, 3, 1, False),  # one key-value head for both
]


def _flax_layer(nnx, H, D, dk, kv, bias, dtype, seed=3):
    normal = nnx.initializers.normal(1.0)  # biases not zero: each one must be read
    return nnx.MultiHeadAttention(H, D, qkv_features=H * dk, num_kv_heads=kv, use_bias=bias, decode=False,
                                  param_dtype=dtype, bias_init=normal, rngs=nnx.Rngs(seed))


def _layer_in_numpy(layer, queries, tokens):
    """The layer's formula in float64 numpy, from its own parameters (flax computes its softmax in float32)."""
    p = lambda v: None if v is None else np.asarray(v[...], np.float64)  # noqa: E731
    H, kv = layer.num_heads, layer.num_heads // layer.num_kv_heads
    proj = lambda m, x: np.einsum("la,ahk->lhk", x, p(m.kernel)) + (0 if m.bias is None else p(m.bias))  # noqa: E731
    q = proj(layer.query, _np(queries))
    k, v = (np.repeat(proj(m, _np(tokens)), kv, axis=1) for m in (layer.key, layer.value))
    w = _softmax(np.einsum("qhk,lhk->hql", q, k) / np.sqrt(layer.head_dim))
    out = np.einsum("hql,lhk,hko->qo", w, v, p(layer.out.kernel))
    return out + (0 if layer.out.bias is None else p(layer.out.bias))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("H, D, dk, kv, bias", LAYERS)
def test_heads_from_flax_equals_the_layer(H, D, dk, kv, bias, dtype):
    """apply_heads(heads_from_flax(layer)) is the layer (for one layer: its residual block, its readout) exactly."""
    nnx = pytest.importorskip("flax.nnx")
    from gmlib.denoise import augment

    layer = _flax_layer(nnx, H, D, dk, kv, bias, dtype)
    readout = nnx.Linear(D, 2, param_dtype=dtype, bias_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(4))
    tokens = np.asarray(jax.random.normal(jax.random.key(0), (7, D)), dtype)
    queries = np.asarray(jax.random.normal(jax.random.key(1), (5, D)), dtype)
    with jax.numpy_dtype_promotion("standard"):  # flax casts to float32 inside, which strict promotion refuses
        flax_out = np.asarray(layer(queries, tokens, tokens), np.float64)
    formula = _layer_in_numpy(layer, queries, tokens)
    blocks = [(False, False), (True, False), (False, True), (True, True)] if H == 2 and bias else [(False, False)]
    for residual, with_readout in blocks:
        constant = bias or with_readout
        heads = gmlib.heads_from_flax(layer, residual=residual, readout=readout if with_readout else None,
                                      constant_token=constant)
        lift = augment if constant else (lambda x: x)
        got = _np(apply_heads(heads, lift(tokens), lift(queries)))
        assert heads.dtype == dtype and heads.dim == D + constant
        for ref, exact in ((formula, dtype == np.float64), (flax_out, False)):
            ref = ref + (_np(queries) if residual else 0)
            if with_readout:
                ref = ref @ _np(readout.kernel[...]) + _np(readout.bias[...])
            # float64: the formula to round-off; the flax layer only to float32's (its softmax runs in float32)
            rtol = 1e-12 if exact else 2e-5
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * np.abs(ref).max())


def test_heads_from_flax_reads_the_theory_matrices():
    """U_h = W_K W_Q^T / sqrt(d_k) has rank d_k < D; V_h = W_O^T W_V^T; and it runs under jit and grad."""
    nnx = pytest.importorskip("flax.nnx")
    layer = _flax_layer(nnx, 2, 4, 1, 2, False, np.float64)
    heads = gmlib.heads_from_flax(layer)
    Wq, Wk, Wv, Wo = (np.asarray(m.kernel[...]) for m in (layer.query, layer.key, layer.value, layer.out))
    np.testing.assert_allclose(_np(heads.U[1]), Wk[:, 1] @ Wq[:, 1].T, rtol=1e-13)  # 1/sqrt(1)
    np.testing.assert_allclose(_np(heads.V[0]), Wo[0].T @ Wv[:, 0].T, rtol=1e-13)
    assert [np.linalg.matrix_rank(_np(u), tol=1e-10) for u in heads.U] == [1, 1]
    graph, state = nnx.split(layer)
    tokens = jax.random.normal(jax.random.key(0), (6, 4))

    def through_heads(state):
        return apply_heads(gmlib.heads_from_flax(nnx.merge(graph, state)), tokens, tokens[:2]).sum()

    def through_layer(state):
        return nnx.merge(graph, state)(tokens[:2], tokens, tokens).sum()

    with jax.numpy_dtype_promotion("standard"):  # flax casts to float32 inside
        g_heads, g_layer = jax.jit(jax.grad(through_heads))(state), jax.grad(through_layer)(state)
    for a, b in zip(jax.tree.leaves(g_heads), jax.tree.leaves(g_layer)):
        np.testing.assert_allclose(_np(a), _np(b), rtol=1e-4, atol=1e-6)


def test_heads_from_flax_rejects_what_heads_cannot_express():
    nnx = pytest.importorskip("flax.nnx")
    rngs = nnx.Rngs(0)
    plain = nnx.MultiHeadAttention(2, 4, use_bias=False, decode=False, rngs=rngs)
    cases = [
        (dict(layer=nnx.Linear(4, 4, rngs=rngs)), "`layer` must be"),
        (dict(layer=nnx.MultiHeadAttention(2, 4, use_bias=False, normalize_qk=True, decode=False, rngs=rngs)),
         "normalize_qk"),
        (dict(layer=nnx.MultiHeadAttention(2, 4, in_kv_features=3, use_bias=False, decode=False, rngs=rngs)),
         "in_kv_features"),
        (dict(layer=nnx.MultiHeadAttention(2, 4, decode=False, rngs=rngs)), "`constant_token` must be True"),
        (dict(layer=plain, readout=nnx.Linear(4, 2, rngs=rngs)), "`constant_token` must be True"),
        (dict(layer=plain, readout=nnx.Linear(3, 2, use_bias=False, rngs=rngs)), "`readout` must be"),
        (dict(layer=nnx.MultiHeadAttention(2, 4, out_features=3, use_bias=False, decode=False, rngs=rngs),
              residual=True), "`residual` must be"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            gmlib.heads_from_flax(**kwargs)


@pytest.mark.parametrize("out_dim, residual", [(None, False), (2, False), (3, True)])
def test_output_maps_are_what_each_head_adds(out_dim, residual):
    """With uniform attention (U = 0) head h adds output_maps[h] @ mean(tokens): checked head by head, by switching
    the others off, against apply_heads."""
    heads = gmlib.init_heads(key=jax.random.key(0), n_heads=3, dim=3, out_dim=out_dim, residual=residual)
    heads = gmlib.Heads(jnp.zeros_like(heads.U), heads.V, heads.W_out, residual)
    tokens = jax.random.normal(jax.random.key(1), (40, 3))
    queries = jax.random.normal(jax.random.key(2), (5, 3))
    maps = heads.output_maps
    assert maps.shape == (3, heads.out_dim, 3)
    off = gmlib.Heads(heads.U, jnp.zeros_like(heads.V), heads.W_out, residual)
    base = gmlib.apply_heads(off, tokens, queries)  # what is left with every value map at zero
    for h in range(3):
        only_h = gmlib.Heads(heads.U, heads.V.at[jnp.arange(3) != h].set(0.0), heads.W_out, residual)
        added = gmlib.apply_heads(only_h, tokens, queries) - base
        np.testing.assert_allclose(added, jnp.broadcast_to(maps[h] @ tokens.mean(0), added.shape), rtol=1e-10,
                                   atol=1e-12)
