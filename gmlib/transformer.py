r"""Standard attention networks (``flax.nnx``) on the book's prompts: what chapter 9 trains.

The theory of the paper is about one layer of heads with full interaction matrices. A
transformer as people build it differs: its heads factor :math:`U_h = W_{K,h} W_{Q,h}^\top/\sqrt{d_k}`
(rank :math:`d_k`), a residual stream carries the input, layers are stacked, often with
LayerNorm and an MLP, and a linear readout gives the prediction. :class:`Transformer` is
that network on a prompt of tokens and a few queries: every position (token or query)
attends to the prompt's tokens, the queries to nothing else, so that with one layer the
prediction at a query is :math:`R\,(z + \mathrm{MHA}(z; z_{1..L})) + b_R`, which
:func:`gmlib.heads_from_flax` reads exactly as a :class:`gmlib.Heads`
(:meth:`Transformer.heads`). :func:`network` turns a constructor into the forward pass and
start of :func:`gmlib.denoise.train_in_context`, so that a network trains side by side
with the book's heads on the same prompts, through :func:`gmlib.optimize`.

This module needs flax (``pip install gmlib[flax]``); the rest of gmlib does not.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from gmlib import _checks as C
from gmlib.heads import Heads, heads_from_flax

__all__ = ["Transformer", "network", "predictor", "restore", "tempered"]

_List = getattr(nnx, "List", list)  # flax >= 0.12 wants lists of modules wrapped


class Transformer(nnx.Module):
    r"""A stack of residual attention blocks on a prompt, read out at the queries.

    With :math:`x^{(0)}` the embedded tokens and queries (the identity embedding when
    ``width`` is the input dimension d), block :math:`\ell` computes

    .. math::

        x^{(\ell)} = x^{(\ell-1)} + \mathrm{MHA}_\ell\big(n(x^{(\ell-1)});\ n(x^{(\ell-1)}_{1..L})\big),

    then, with ``mlp``, :math:`x^{(\ell)} \leftarrow x^{(\ell)} + \mathrm{MLP}_\ell(n'(x^{(\ell)}))`,
    where every row attends to the L tokens of the prompt only (padding masked), :math:`n`
    and :math:`n'` are LayerNorms with ``layer_norm`` (pre-LN, and one more before the
    readout) or the identity, and the MLP has one hidden layer of ``4 width`` GELU units.
    The prediction at a query is the readout :math:`R\,x^{(\text{last})} + b_R`. The last
    block computes only the queries' rows (the tokens' rows are not read after it).

    Args:
        dim: d, the dimension of tokens and queries.
        n_layers: the number of blocks.
        n_heads: heads per block.
        head_dim: :math:`d_k` (default: ``width``, full-rank :math:`U_h`).
        width: the residual stream's width (default d: no embedding; otherwise a linear
            embedding ``nnx.Linear(d, width)``).
        mlp: add an MLP to each block.
        layer_norm: pre-LayerNorm in each block and before the readout.
        use_bias: biases in the attention and linear maps.
        out_dim: the dimension of the predictions (default d; 1 for a score).
        rngs: an ``nnx.Rngs``.

    Raises:
        ValueError: naming the argument, for a non-positive size.

    Example:
        >>> model = Transformer(2, n_layers=1, n_heads=2, rngs=nnx.Rngs(0))
        >>> tokens, queries = jax.random.normal(jax.random.key(0), (64, 2)), jnp.ones((3, 2))
        >>> model(tokens, queries).shape  # (Q, d)
        (3, 2)
        >>> heads = model.heads()  # the one-layer network as gmlib.Heads
        >>> bool(jnp.allclose(gmlib.apply_heads(heads, tokens, queries), model(tokens, queries), atol=1e-5))
        True
    """

    def __init__(self, dim: int, *, n_layers: int = 1, n_heads: int = 2, head_dim: int | None = None,
                 width: int | None = None, mlp: bool = False, layer_norm: bool = False, use_bias: bool = False,
                 out_dim: int | None = None, rngs: nnx.Rngs):
        dim = C.scalar(dim, "dim", low=0, integer=True)
        n_layers = C.scalar(n_layers, "n_layers", low=0, integer=True)
        n_heads = C.scalar(n_heads, "n_heads", low=0, integer=True)
        width = dim if width is None else C.scalar(width, "width", low=0, integer=True)
        head_dim = width if head_dim is None else C.scalar(head_dim, "head_dim", low=0, integer=True)
        out_dim = dim if out_dim is None else C.scalar(out_dim, "out_dim", low=0, integer=True)
        linear = lambda a, b: nnx.Linear(a, b, use_bias=use_bias, rngs=rngs)  # noqa: E731
        norm = lambda: nnx.LayerNorm(width, rngs=rngs) if layer_norm else None  # noqa: E731
        self.dim, self.n_layers = dim, n_layers
        self.embed = linear(dim, width) if width != dim else None
        self.attention = _List([nnx.MultiHeadAttention(n_heads, width, qkv_features=n_heads * head_dim,
                                                       use_bias=use_bias, decode=False, rngs=rngs)
                                for _ in range(n_layers)])
        self.norms = _List([norm() for _ in range(n_layers)]) if layer_norm else None
        self.mlps = _List([nnx.Sequential(linear(width, 4 * width), nnx.gelu, linear(4 * width, width))
                           for _ in range(n_layers)]) if mlp else None
        self.mlp_norms = _List([norm() for _ in range(n_layers)]) if mlp and layer_norm else None
        self.final_norm = norm()
        self.readout = linear(width, out_dim)

    def streams(self, prompt, queries, mask=None):
        """The residual stream after each block: a list of ``n_layers + 1`` arrays (L + Q, width).

        After the last block only the queries' rows are computed; its array holds the
        tokens' rows of the block before (they are not read again).
        """
        L = prompt.shape[0]
        x = jnp.concatenate([prompt, queries])
        x = x if self.embed is None else self.embed(x)
        keep = None if mask is None else mask[None, None, :]  # (heads, rows, tokens)
        out = [x]
        for i in range(self.n_layers):
            rows = x if i < self.n_layers - 1 else x[L:]
            n = (lambda v: v) if self.norms is None else self.norms[i]
            ctx = n(x[:L])
            rows = rows + self.attention[i](n(rows), ctx, ctx, mask=keep)
            if self.mlps is not None:
                rows = rows + self.mlps[i](rows if self.mlp_norms is None else self.mlp_norms[i](rows))
            x = rows if i < self.n_layers - 1 else jnp.concatenate([x[:L], rows])
            out.append(x)
        return out

    def __call__(self, prompt, queries, mask=None):
        """The predictions at the queries, shape (Q, d), for a prompt (L, d) and an optional mask (L,)."""
        x = self.streams(prompt, queries, mask)[-1][prompt.shape[0]:]
        return self.readout(x if self.final_norm is None else self.final_norm(x))

    def heads(self) -> Heads:
        """The network as the book's :class:`gmlib.Heads` (one block, no MLP, LayerNorm or embedding only).

        Its ``apply_heads`` on a prompt equals the network's prediction (with the
        constant-token augmentation of :func:`gmlib.denoise.augment` when it has biases).

        Raises:
            ValueError: for a network that one layer of heads cannot express.
        """
        if self.n_layers != 1 or self.mlps is not None or self.norms is not None or self.embed is not None:
            raise ValueError("`heads()` needs one block without MLP, LayerNorm or embedding; read deeper networks "
                             "block by block with gmlib.heads_from_flax(model.attention[i])")
        return heads_from_flax(self.attention[0], residual=True, readout=self.readout,
                               constant_token=self.readout.bias is not None)


def tempered(gamma, xi, dim: int, *, temperature, n_heads: int = 1, rngs: nnx.Rngs) -> Transformer:
    r"""The tempered in-context denoiser (:func:`gmlib.denoise.in_context_heads`) as a one-block :class:`Transformer`.

    With :math:`s = \gamma^2 + \xi^2`, :math:`a = \xi^2/s` and temperature c, the tempered
    head predicts :math:`(1 - a - ac)\, z + a \sum_i \operatorname{softmax}_i(c\, z_i^\top z/s)\, z_i`.
    The block :math:`R\,(z + \mathrm{MHA}(z))` computes it with head 0 set to
    :math:`W_Q = W_K = \sqrt{c\sqrt{d}/s}\, I` (so :math:`U_0 = cI/s`), :math:`W_V = I`,
    :math:`W_O = \tfrac{a}{1 - a - ac} I` and the readout :math:`R = (1 - a - ac) I`; the other
    heads keep their random queries, keys and values from ``rngs`` and an output map of
    zero (they add nothing, and training can switch them on). A start point for training.

    Args:
        gamma: :math:`\gamma \ge 0`.
        xi: :math:`\xi > 0`.
        dim: d.
        temperature: c > 0 with :math:`1 - a - ac \ne 0` (the readout cannot be 0).
        n_heads: heads of the block.
        rngs: an ``nnx.Rngs`` (for the other heads).

    Raises:
        ValueError: naming the argument, for values outside the ranges above.

    Example:
        >>> model = tempered(1.0, 1.0, 2, temperature=0.4, rngs=nnx.Rngs(0))
        >>> tokens, queries = jax.random.normal(jax.random.key(0), (64, 2)), jnp.ones((3, 2))
        >>> head = denoise.in_context_heads(1.0, 1.0, 2, temperature=0.4)
        >>> bool(jnp.allclose(model(tokens, queries), gmlib.apply_heads(head, tokens, queries), atol=1e-5))
        True
    """
    gamma = C.scalar(gamma, "gamma", low=0, strict=False)
    xi = C.scalar(xi, "xi", low=0)
    c = C.scalar(temperature, "temperature", low=0)
    s = gamma**2 + xi**2
    a = xi**2 / s
    r = 1 - a - a * c
    if abs(r) < 1e-6:
        raise ValueError(f"`temperature` must not be (1 - a)/a = {(1 - a) / a:g}: the readout 1 - a - ac would be 0")
    model = Transformer(dim, n_heads=n_heads, rngs=rngs)
    att, eye = model.attention[0], jnp.eye(dim)
    for layer, value in ((att.query, (c * dim**0.5 / s) ** 0.5 * eye), (att.key, (c * dim**0.5 / s) ** 0.5 * eye),
                         (att.value, eye)):
        layer.kernel[...] = layer.kernel[...].at[:, 0].set(value.astype(layer.kernel[...].dtype))
    out = jnp.zeros_like(att.out.kernel[...])
    att.out.kernel[...] = out.at[0].set((a / r * eye).astype(out.dtype))
    model.readout.kernel[...] = (r * eye).astype(model.readout.kernel[...].dtype)
    return model


def network(make: Callable[[nnx.Rngs], nnx.Module]):
    r"""A flax model as a forward pass and a start: a model of :func:`gmlib.denoise.train_in_context`.

    Args:
        make: ``make(rngs) -> module``, e.g. ``lambda rngs: Transformer(2, rngs=rngs)``; the
            module maps ``(prompt, queries, mask)`` to predictions.

    Returns:
        ``(forward, start)``: ``forward(state, prompt, queries, mask)`` the module with
        parameters ``state`` (an ``nnx.State``, a pytree that optax updates), and
        ``start(seed)`` the state of ``make(nnx.Rngs(seed))``. :func:`restore` rebuilds the
        module from a trained state.

    Example:
        >>> models = {"standard": network(lambda rngs: Transformer(2, rngs=rngs))}
        >>> forward, start = models["standard"]
        >>> tokens, queries = jax.random.normal(jax.random.key(0), (64, 2)), jnp.ones((3, 2))
        >>> forward(start(0), tokens, queries, None).shape
        (3, 2)
        >>> out = denoise.train_in_context(models, 1.0, 1.0, 2, optimizer=optax.adam(1e-2), lengths=[16],
        ...                                seeds=[0], init_seeds=[0], n_steps=5, batch_size=4)
        >>> trained = restore(models["standard"], jax.tree.map(lambda x: x[0, 0], out.params["standard"]))
        >>> isinstance(trained, Transformer)
        True
    """
    if not callable(make):
        raise ValueError(f"`make` must be a function of an nnx.Rngs; got {type(make).__name__}")
    graph, _ = nnx.split(make(nnx.Rngs(0)))

    def forward(state, prompt, queries, mask):
        return nnx.merge(graph, state)(prompt, queries, mask)

    def start(seed):
        return nnx.split(make(nnx.Rngs(int(seed))))[1]

    forward.graph = graph
    return forward, start


def restore(model, state):
    """The module of a :func:`network` ``model = (forward, start)`` with parameters ``state``."""
    return nnx.merge(model[0].graph, state)


def predictor(model, state):
    """``f(prompt, queries, mask)`` of a trained network, for :func:`gmlib.denoise.task_excess` (a Partial)."""
    return jax.tree_util.Partial(model[0], state)
