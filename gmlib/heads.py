r"""A layer of attention heads: the book's central object, one pytree and one function.

A layer of H heads, each with an interaction matrix :math:`U_h` (D × D) and a value
matrix :math:`V_h` (D_v × D), optionally residual (the query added to each head's
output) and optionally followed by an output map :math:`W_{\mathrm{out}}` on the
concatenated head outputs, maps a query :math:`z` to

.. math::

    f[\mu](z) = W_{\mathrm{out}}
    \begin{pmatrix} r\,z + T_{U_1,V_1}[\mu](z) \\ \vdots \\ r\,z + T_{U_H,V_H}[\mu](z) \end{pmatrix},
    \qquad r \in \{0, 1\},

or, without an output map, to the sum :math:`\sum_h \big(r\,z + T_{U_h,V_h}[\mu](z)\big)` of
the heads (multi-head attention as the paper writes it, its §2). :math:`T` is softmax
attention (eq 1 of the paper) or linear attention, on a finite prompt (the empirical
measure :math:`\mu_L` of L tokens) or on an infinite one (a Gaussian mixture: the closed
form of Prop 2.1). :class:`Heads` holds the parameters, :func:`~gmlib.apply_heads` evaluates them,
:func:`~gmlib.init_heads` draws random ones, :func:`~gmlib.heads_from_flax` reads a standard
attention layer (``flax.nnx.MultiHeadAttention``). Every construction of ``gmlib.denoise`` and
``gmlib.lda`` returns a :class:`Heads`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib import _random
from gmlib._dtypes import common_float_dtype
from gmlib._pytree import unchecked
from gmlib.attention import (
    _block_size,
    _population,
    _population_linear,
    _softmax_blocked,
    _softmax_dense,
)
from gmlib.mixture import GaussianMixture

__all__ = ["Batch", "Heads", "apply_heads", "heads_from_flax", "init_heads"]

_KINDS = ("softmax", "linear")


class Batch(NamedTuple):
    """A minibatch of prompts with their queries and targets (a pytree), what the task samplers draw.

    Attributes:
        prompt: (B, L, D), the tokens of each prompt.
        queries: (B, Q, D), the queries of each prompt.
        targets: (B, Q, D_y), what the model should predict at each query.
        aux: a task-dependent pytree (e.g. each task's means and weights), or ``None``.
        mask: ``None`` (every token counts) or a boolean (L,): the tokens that count in
            every prompt of the batch (the others are padding; see :func:`apply_heads`).
    """

    prompt: jax.Array
    queries: jax.Array
    targets: jax.Array
    aux: object = None
    mask: jax.Array | None = None


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Heads:
    r"""A layer of H attention heads (a frozen pytree): what :func:`apply_heads` evaluates.

    Attributes:
        U: the interaction matrices, shape (H, D, D): the score of token :math:`z'` for
            query :math:`z` in head h is :math:`z'^\top U_h z`.
        V: the value matrices, shape (H, D_v, D).
        W_out: ``None`` (the heads' outputs are summed) or the output map, shape
            (D_y, H·D_v), applied to the head outputs concatenated in head order.
        residual: add the query to each head's output (needs D_v = D). Static: part of
            the pytree's structure, not a leaf, so ``jax.grad`` and optax never touch it.

    The leaves are ``U``, ``V`` and ``W_out`` (when present), so a :class:`Heads` goes through
    ``jax.jit``, ``jax.vmap``, ``jax.grad`` and every optax transformation as it is. Built
    from arrays (numpy, JAX or nested lists) it checks their shapes and finiteness and
    casts them to one floating dtype; inside a transformation it is rebuilt without checks.

    Example:
        >>> U1, U2 = jnp.eye(3), -jnp.eye(3)
        >>> heads = Heads(U=jnp.stack([U1, U2]), V=jnp.stack([jnp.eye(3), jnp.eye(3)]))
        >>> heads.n_heads, heads.dim, heads.out_dim
        (2, 3, 3)
    """

    U: jax.Array
    V: jax.Array
    W_out: jax.Array | None = None
    residual: bool = False

    def __post_init__(self):
        leaves = [a for a in (self.U, self.V, self.W_out) if a is not None]
        dtype = common_float_dtype(*leaves)
        U = C.array(self.U, "U", ("H", "D", "D"), dtype=dtype, min_rows=1)
        H, D = U.shape[0], U.shape[1]
        V = C.array(self.V, "V", ("H", "D_v", "D"), dims={"H": H, "D": D}, dtype=dtype)
        if not isinstance(self.residual, (bool, np.bool_)) or (self.residual and V.shape[1] != D):
            raise ValueError(f"`residual` must be True or False, True only with D_v = D = {D}; got {self.residual!r} "
                             f"with `V` of shape {tuple(V.shape)}")
        W = self.W_out
        if W is not None:
            hv = H * V.shape[1]
            W = C.array(W, "W_out", ("D_y", "H·D_v"), dims={"H·D_v": hv}, dtype=dtype)
        for name, value in (("U", U), ("V", V), ("W_out", W), ("residual", bool(self.residual))):
            object.__setattr__(self, name, value)

    def tree_flatten(self):
        return (self.U, self.V, self.W_out), self.residual

    @classmethod
    def tree_unflatten(cls, residual, leaves):
        return unchecked(cls, *leaves, residual)

    @property
    def n_heads(self) -> int:
        """H, the number of heads."""
        return self.U.shape[-3]

    @property
    def dim(self) -> int:
        """D, the dimension of tokens and queries."""
        return self.U.shape[-1]

    @property
    def out_dim(self) -> int:
        """D_y, the dimension of the layer's output (D_v without an output map)."""
        return self.V.shape[-2] if self.W_out is None else self.W_out.shape[-2]

    @property
    def dtype(self):
        """The floating dtype of the parameters."""
        return self.U.dtype

    @property
    def output_maps(self) -> jax.Array:
        r"""Each head's map from its attention-weighted tokens to the layer's output, shape (H, D_y, D).

        Head h adds :math:`W_h V_h \sum_i \operatorname{softmax}_i(\cdot)\, z_i` to the output,
        with :math:`W_h` its block of ``W_out`` (columns :math:`h D_v` to :math:`(h+1) D_v`), or
        the identity without an output map: this is :math:`W_h V_h`. It is how much, and in which
        directions, a head speaks (e.g. zero for a head that is switched off).
        """
        if self.W_out is None:
            return self.V
        H, D_v = self.V.shape[-3], self.V.shape[-2]
        return jnp.einsum("yha,had->hyd", self.W_out.reshape(-1, H, D_v), self.V)

    def astype(self, dtype) -> Heads:
        """The same heads with every parameter cast to ``dtype``."""
        cast = lambda a: None if a is None else a.astype(dtype)  # noqa: E731
        return unchecked(Heads, cast(self.U), cast(self.V), cast(self.W_out), self.residual)


def apply_heads(heads: Heads, prompt, queries, *, kind: str = "softmax", block_size=None, mask=None):
    r"""Evaluate a layer of heads on a prompt: the formula of this module's docstring.

    Let :math:`z` denote a row of ``queries`` (Q, D) and :math:`\mu` the prompt: the
    empirical measure of the rows of ``prompt`` (L, D), or the law itself when ``prompt``
    is a :class:`~gmlib.GaussianMixture` (the infinite prompt, exact by Prop 2.1). Head h
    computes :math:`T_{U_h,V_h}[\mu](z)`, softmax attention (eq 1 of the paper; the
    closed form of :func:`~gmlib.population_attention` on a mixture) or, with
    ``kind="linear"``, linear attention :math:`V_h\,\mathbb E_\mu[z'z'^\top]\,U_h z`.

    Args:
        heads: a :class:`Heads` with H heads on dimension D.
        prompt: tokens (L, D), L ≥ 1, or a :class:`~gmlib.GaussianMixture` on
            :math:`\mathbb R^D`.
        queries: shape (Q, D).
        kind: ``"softmax"`` or ``"linear"``.
        block_size: for a finite softmax prompt, stream the tokens in blocks of this
            many (an int, or ``"auto"``): memory grows with Q × block_size, not Q × L
            (as in :func:`~gmlib.softmax_attention`).
        mask: ``None``, or a boolean (L,) marking the tokens that count (the others are
            padding: a score of :math:`-\infty` for softmax attention, left out of the
            average of linear attention). A prompt of L tokens padded to L' with the
            mask ``jnp.arange(L') < L`` gives the output of the L tokens alone.

    Returns:
        array (Q, D_y): D_y = D_v without an output map, the rows of ``W_out`` with one.

    Raises:
        ValueError: naming the argument, for an unknown ``kind``, shapes that do not
            fit the heads' dimension D, a mask that does not fit the prompt (or a mask
            with a mixture, or with ``block_size``), non-finite values.

    Example:
        >>> prob = denoise.DenoisingProblem([0.3, 0.7], [[2.0, 0.0], [0.0, 2.0]], gamma=1.0, xi=1.0)
        >>> heads = denoise.two_head_bayes(prob)
        >>> z = jnp.array([[1.0, 1.0], [2.0, -1.0]])
        >>> out = apply_heads(heads, prob.noisy, z)  # the infinite prompt: the Bayes denoiser (Thm 4.1)
        >>> bool(jnp.allclose(out, prob.bayes(z)))
        True
        >>> tokens, _ = prob.noisy.sample(key=jax.random.key(0), n_samples=100_000)
        >>> out_L = apply_heads(heads, tokens, z, block_size=4096)  # a finite prompt, streamed
        >>> bool(jnp.abs(out_L - out).max() < 0.05)
        True
    """
    if not isinstance(heads, Heads):
        raise ValueError(f"`heads` must be a gmlib.Heads; got {type(heads).__name__}")
    C.check_choice(kind, "kind", _KINDS)
    population, D = isinstance(prompt, GaussianMixture), heads.dim
    if population and (prompt.dim != D or mask is not None):
        raise ValueError(f"`prompt` must be a mixture on R^{D} (the heads' D) without a `mask`; got R^{prompt.dim}")
    prompt = prompt if population else C.array(prompt, "prompt", ("L", "D"), dims={"D": D}, finite=False, min_rows=1)
    queries = C.array(queries, "queries", ("Q", "D"), dims={"D": D}, finite=False)
    if mask is not None and (jnp.shape(mask) != prompt.shape[:1] or jnp.result_type(mask) != jnp.bool_
                             or block_size is not None):
        raise ValueError(f"`mask` must be a boolean array (L,) = ({prompt.shape[0]},), without a `block_size`; got "
                         f"{jnp.result_type(mask)} of shape {jnp.shape(mask)}, block_size={block_size!r}")
    # (population and linear attention take the prompt in one pass: L = 1 gives block_size None)
    block_size = _block_size(block_size, queries.shape[0], 1 if population or kind == "linear" else prompt.shape[0])
    return _apply(heads, prompt, queries, mask, kind, block_size)


@C.finite_kernel("heads", "prompt", "queries", None, static_argnums=(4, 5))
def _apply(heads, prompt, queries, mask, kind, block_size):
    population = isinstance(prompt, GaussianMixture)
    dtype = common_float_dtype(heads.U, prompt.means if population else prompt, queries)
    heads, queries = heads.astype(dtype), queries.astype(dtype)
    prompt = prompt.astype(dtype)
    if population:
        op = _population if kind == "softmax" else _population_linear
        outs = jax.vmap(lambda U, V: op(queries, prompt, U, V))(heads.U, heads.V)
    elif kind == "linear":
        w = None if mask is None else mask.astype(dtype)
        weighted = prompt if w is None else prompt * w[:, None]
        moment = weighted.T @ prompt / (prompt.shape[0] if w is None else w.sum())
        outs = jnp.einsum("qd,hed,ef,hvf->hqv", queries, heads.U, moment, heads.V)
    elif block_size is not None:
        outs = jax.vmap(lambda U, V: _softmax_blocked(queries, prompt, U, V, block_size))(heads.U, heads.V)
    elif mask is None:
        outs = jax.vmap(lambda U, V: _softmax_dense(queries, prompt, U, V))(heads.U, heads.V)
    else:
        scores = jnp.einsum("qd,hed,le->hql", queries, heads.U, prompt)  # z_i^T U_h z
        weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
        outs = jnp.einsum("hql,le,hve->hqv", weights, prompt, heads.V)
    if heads.residual:
        outs = outs + queries
    if heads.W_out is None:
        return outs.sum(axis=0)
    H, Q, Dv = outs.shape
    return jnp.transpose(outs, (1, 0, 2)).reshape(Q, H * Dv) @ heads.W_out.T


def init_heads(*, key, n_heads: int, dim: int, value_dim: int | None = None, out_dim: int | None = None,
               residual: bool = False, scale: float = 1.0, dtype=None) -> Heads:
    r"""Random heads: i.i.d. Gaussian entries, the usual start point of training.

    :math:`U_h` and :math:`V_h` have entries :math:`\mathcal N(0, \mathrm{scale}^2/D)`; the
    output map (when ``out_dim`` is given) :math:`\mathcal N(0, 1/(H D_v))`.

    Args:
        key: a ``jax.random`` key.
        n_heads: H ≥ 1.
        dim: D, the dimension of tokens and queries.
        value_dim: D_v (default D).
        out_dim: D_y, or ``None`` for no output map (the heads are summed).
        residual: the ``residual`` flag of the result.
        scale: the scale of U and V, a finite number.
        dtype: floating dtype (default: JAX's default float).

    Returns:
        a :class:`Heads`.

    Example:
        >>> heads = init_heads(key=jax.random.key(0), n_heads=2, dim=3, out_dim=3, scale=0.5)
        >>> heads.U.shape, heads.W_out.shape
        ((2, 3, 3), (3, 6))
    """
    n_heads = C.scalar(n_heads, "n_heads", low=0, integer=True)
    dim = C.scalar(dim, "dim", low=0, integer=True)
    value_dim = dim if value_dim is None else C.scalar(value_dim, "value_dim", low=0, integer=True)
    out_dim = None if out_dim is None else C.scalar(out_dim, "out_dim", low=0, integer=True)
    dtype = C.check_float_dtype(dtype)
    scale = C.scalar(scale, "scale")
    ku, kv, kw = jax.random.split(key, 3)
    factor = jnp.asarray(scale / np.sqrt(dim), dtype)  # in `dtype`: strict promotion
    U = factor * _random.normal(ku, (n_heads, dim, dim), dtype)
    V = factor * _random.normal(kv, (n_heads, value_dim, dim), dtype)
    W = None
    if out_dim is not None:
        W = _random.normal(kw, (out_dim, n_heads * value_dim), dtype) * jnp.asarray(1 / np.sqrt(n_heads * value_dim),
                                                                                   dtype)
    if residual and value_dim != dim:
        raise ValueError(f"a residual layer needs `value_dim` = `dim` = {dim}; got {value_dim}")
    return unchecked(Heads, U, V, W, bool(residual))


def _param(variable):
    """The array held by a flax parameter (``None`` stays ``None``)."""
    return None if variable is None else jnp.asarray(variable[...])


def heads_from_flax(layer, *, residual: bool = False, readout=None, constant_token: bool = False) -> Heads:
    r"""A standard attention layer (``flax.nnx.MultiHeadAttention``) as the book's :class:`Heads`.

    A standard layer of H heads of size :math:`d_k` projects a query :math:`z` and the
    tokens :math:`z_i` to :math:`q_h = W_{Q,h}^\top z + b_{Q,h}`, :math:`k_{h,i} = W_{K,h}^\top z_i + b_{K,h}`,
    :math:`v_{h,i} = W_{V,h}^\top z_i + b_{V,h}` and returns
    :math:`\sum_h W_{O,h}^\top \sum_i \operatorname{softmax}_i(q_h^\top k_{h,i}/\sqrt{d_k})\, v_{h,i} + b_O`.
    Without biases, head h is the theory's head (eq 1 of the paper) with

    .. math::

        U_h = W_{K,h} W_{Q,h}^\top / \sqrt{d_k}, \qquad V_h = W_{O,h}^\top W_{V,h}^\top,

    so that :math:`U_h` has rank at most :math:`d_k` (a head size below D limits it). With
    biases, ``constant_token=True`` reads the layer on tokens and queries augmented with a
    constant coordinate 1 (:func:`gmlib.denoise.augment`): the query bias becomes the last
    column of :math:`U_h` (a score linear in the token), the key bias its last row (the
    same for every token: softmax ignores it), the value and output biases the last column
    of :math:`V_h` (the attention weights sum to 1). With ``residual`` and ``readout``
    (an ``nnx.Linear`` R, bias :math:`b_R`) the heads compute the block
    :math:`R\,(z + \mathrm{layer}(z)) + b_R` of a one-layer transformer, through the output
    map :math:`W_{\mathrm{out}}` of :class:`Heads`.

    Exactness: ``gmlib.apply_heads(heads_from_flax(layer), tokens, queries)`` equals
    ``layer(queries, tokens, tokens)`` (with ``augment`` on both inputs when
    ``constant_token``), up to the round-off of the layer's dtype; a test checks it in
    float32 and float64 for several head counts, head sizes and grouped key-value heads.
    Dropout is left out (the layer as called with ``deterministic=True``). Traceable: under
    ``jit`` or ``grad`` (e.g. inside a training metric) it reads the traced parameters.

    Args:
        layer: a ``flax.nnx.MultiHeadAttention`` with the default ``attention_fn``, no
            ``normalize_qk``, no ``decode``, and keys in the queries' space
            (``in_kv_features`` = ``in_features``).
        residual: add the query to the layer's output (needs ``out_features`` =
            ``in_features``).
        readout: ``None`` or an ``nnx.Linear`` applied last (its ``in_features`` =
            ``out_features`` of the layer).
        constant_token: read the biases through a constant coordinate (required when the
            layer or the readout has biases; the heads then act on dimension D + 1).

    Returns:
        a :class:`Heads` on dimension D (D + 1 with ``constant_token``), U of shape (H, ·, ·);
        without ``residual`` or ``readout`` the heads are summed (no output map).

    Raises:
        ValueError: naming the argument: ``layer`` not an ``nnx.MultiHeadAttention`` or
            with a feature the theory's heads cannot express (``normalize_qk``, another
            ``attention_fn``, ``decode``, keys of another dimension); biases without
            ``constant_token`` (build the layer with ``use_bias=False``, or pass
            ``constant_token=True`` and augment tokens and queries); ``residual`` with
            ``out_features`` ≠ ``in_features``; a ``readout`` that is not an ``nnx.Linear``
            of the right size. ImportError when flax is not installed (``pip install
            gmlib[flax]``).

    Example:
        >>> from flax import nnx
        >>> layer = nnx.MultiHeadAttention(2, 3, qkv_features=4, use_bias=False, decode=False, rngs=nnx.Rngs(0))
        >>> heads = gmlib.heads_from_flax(layer)  # U: (2, 3, 3) of rank <= 2
        >>> tokens, queries = jax.random.normal(jax.random.key(1), (50, 3)), jnp.ones((4, 3))
        >>> out = gmlib.apply_heads(heads, tokens, queries)
        >>> bool(jnp.allclose(out, layer(queries, tokens, tokens), atol=1e-5))
        True
    """
    from flax import nnx  # optional: gmlib[flax]

    if not isinstance(layer, nnx.MultiHeadAttention):
        raise ValueError(f"`layer` must be a flax.nnx.MultiHeadAttention; got {type(layer).__name__}")
    unsupported = {"normalize_qk": layer.normalize_qk, "decode": bool(layer.decode),
                   "attention_fn": layer.attention_fn is not nnx.dot_product_attention,
                   "in_kv_features": layer.in_kv_features != layer.in_features}
    if any(unsupported.values()):
        raise ValueError(f"`layer` uses what one layer of the theory's heads cannot express: "
                         f"{[k for k, v in unsupported.items() if v]} (use the defaults: normalize_qk=False, "
                         f"decode=False, attention_fn=nnx.dot_product_attention, in_kv_features=in_features)")
    D, H, dk, d_out = layer.in_features, layer.num_heads, layer.head_dim, layer.out_features
    if readout is not None and (not isinstance(readout, nnx.Linear) or readout.in_features != d_out):
        raise ValueError(f"`readout` must be None or an nnx.Linear with in_features = {d_out} (the layer's "
                         f"out_features); got {type(readout).__name__}")
    if residual is not bool(residual) or (residual and d_out != D):
        raise ValueError(f"`residual` must be True or False, True only with out_features = in_features = {D}; "
                         f"got {residual!r} with out_features = {d_out}")
    q, k, v, o = (layer.query, layer.key, layer.value, layer.out)
    biases = [_param(m.bias) for m in (q, k, v, o)] + [None if readout is None else _param(readout.bias)]
    if any(b is not None for b in biases) and not constant_token:
        raise ValueError("`constant_token` must be True for a layer (or readout) with biases: pass "
                         "constant_token=True and augment tokens and queries (gmlib.denoise.augment), or build "
                         "the layer with use_bias=False")
    if constant_token is not bool(constant_token):
        raise ValueError(f"`constant_token` must be True or False; got {constant_token!r}")
    bq, bk, bv, bo, br = biases
    kv = np.arange(H) // (H // getattr(layer, "num_kv_heads", H))  # grouped keys and values: head h reads kv[h]
    Wq, Wk, Wv, Wo = _param(q.kernel), _param(k.kernel)[:, kv], _param(v.kernel)[:, kv], _param(o.kernel)
    dtype = common_float_dtype(Wq, Wk, Wv, Wo)
    scale = jnp.asarray(1 / np.sqrt(dk), dtype)
    U = jnp.einsum("ahk,bhk->hab", Wk, Wq) * scale  # (H, D, D): token index first, z'^T U z
    V = jnp.einsum("hko,ahk->hoa", Wo, Wv)  # (H, D_out, D)
    if constant_token:
        zero = lambda b, shape: jnp.zeros(shape, dtype) if b is None else b  # noqa: E731
        bq, bk, bv = zero(bq, (H, dk)), zero(bk, (H, dk))[kv], zero(bv, (H, dk))[kv]
        top = jnp.concatenate([U, jnp.einsum("ahk,hk->ha", Wk, bq)[..., None] * scale], axis=2)
        bottom = jnp.concatenate([jnp.einsum("bhk,hk->hb", Wq, bk), jnp.einsum("hk,hk->h", bq, bk)[:, None]],
                                 axis=1)[:, None] * scale
        U = jnp.concatenate([top, bottom], axis=1)
        value_bias = jnp.einsum("hko,hk->ho", Wo, bv).at[0].add(zero(bo, (d_out,)))  # b_O once: in head 0
        V = jnp.concatenate([V, value_bias[..., None]], axis=2)
    if readout is None and not residual:
        return Heads(U.astype(dtype), V.astype(dtype))
    R = jnp.eye(d_out, dtype=dtype) if readout is None else _param(readout.kernel).T.astype(dtype)  # (D_y, D_out)
    if not residual:  # R (sum_h V_h T_h) + b_R: the readout inside each value map, its bias in head 0
        V = jnp.einsum("yo,hoa->hya", R, V)
        if br is not None:
            V = V.at[0, :, -1].add(br)
        return Heads(U.astype(dtype), V.astype(dtype))
    # residual: sum_h W_h (z~ + V'_h T_h) with W_h = (R, b_R)/H and V'_h = H (V_h; 0) gives
    # R z + b_R + R sum_h V_h T_h (z~ = z, or (z, 1) with a constant token)
    n = U.shape[-1]
    W_h = R if not constant_token else jnp.concatenate([R, zero(br, (R.shape[0],))[:, None]], axis=1)
    V = jnp.zeros((H, n, n), dtype).at[:, :d_out].set(H * V)
    return Heads(U.astype(dtype), V, jnp.tile(W_h / H, (1, H)), residual=True)
