r"""Softmax and linear attention, on finite prompts and in the infinite-prompt limit.

Conventions (those of the paper, eq 1). A head has an interaction matrix :math:`U` (D × D) and a
value matrix :math:`V` (D_out × D). The score of a token :math:`z'` for a query
:math:`z` is :math:`z'^\top U z = \langle U z, z' \rangle` (no :math:`1/\sqrt d`).
Softmax attention on a probability measure :math:`\mu` (eq 1) is

.. math::

    T_{U,V}[\mu](z) = \frac{\int e^{z'^\top U z}\, V z' \, d\mu(z')}{\int e^{z'^\top U z}\, d\mu(z')},

which on the empirical measure of L tokens is ordinary softmax attention, and
as :math:`L \to \infty` converges to the *population* operator on the law of the tokens.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C
from gmlib._dtypes import common_float_dtype
from gmlib.mixture import GaussianMixture

__all__ = [
    "softmax_attention",
    "linear_attention",
    "gates",
    "population_attention",
    "population_linear_attention",
]


# ----------------------------------------------------------------------------- checks


def _arrays(*args, names):
    """Arrays a jitted kernel takes as they are (JAX arrays, tracers, real numpy arrays, None, a mixture);
    anything else (lists, numbers, complex or object arrays) converted or refused by :func:`C.array`.

    The public functions pass their inputs through this, then to a kernel that checks them with
    :func:`_check_args`: shapes and dtypes are checked and cast while the kernel is traced,
    once per combination of shapes and dtypes, so a repeated call costs one dispatch.
    """
    return tuple(a if _as_is(a) else C.array(a, name, finite=False) for a, name in zip(args, names))


def _as_is(a) -> bool:
    if a is None or isinstance(a, (jax.Array, GaussianMixture)):
        return True
    return isinstance(a, np.ndarray) and a.dtype.kind in "biuf" and a.dtype.itemsize <= 8


def _rows(x) -> int:
    """The size of the first axis (0 for a scalar, which :func:`_check_args` then reports)."""
    return x.shape[0] if x.ndim else 0


def _check_args(queries, prompt, U, V=None, *static):
    """Convert the kernel arguments queries (n, D), prompt (tokens (L, D) or a GaussianMixture), U (D, D)
    and V (D_out, D) (or None) to one floating dtype; shapes against the token dimension D. Every kernel
    runs it (:func:`C.finite_kernel`'s ``check``) when it is traced, once per shape and dtype."""
    population = isinstance(prompt, GaussianMixture)
    dtype = common_float_dtype(prompt.means if population else prompt, queries, U, V)
    # (the arguments are tracers here: finiteness is finite_kernel's, on the result)
    prompt = prompt.astype(dtype) if population else C.array(prompt, "prompt", ("L", "D"), dtype=dtype, min_rows=1)
    dims = {"D": prompt.dim if population else prompt.shape[1]}  # the token dimension
    queries, U, V = (None if a is None else C.array(a, name, shape, dims=dims, dtype=dtype) for a, name, shape in
                     ((queries, "queries", ("n", "D")), (U, "U", ("D", "D")), (V, "V", ("D_out", "D"))))
    return (queries, prompt, U, V, *static)


def _block_size(block_size, n: int, L: int):
    """``None`` (one pass over the prompt) or the int size of its blocks, for a valid ``block_size``
    (``None``, a positive int, ``"auto"``: :func:`_auto_block_size`), or raise."""
    if not (block_size is None or isinstance(block_size, str) and block_size == "auto" or isinstance(
            block_size, (int, np.integer)) and not isinstance(block_size, bool) and block_size > 0):
        raise ValueError(f'`block_size` must be None, a positive int or "auto"; got {block_size!r}')
    block_size = _auto_block_size(n, L) if isinstance(block_size, str) else block_size
    return None if block_size is None or block_size >= L else int(block_size)


# ----------------------------------------------------------------------------- finite prompts


def softmax_attention(prompt, queries, U, V, *, block_size=None):
    r"""Softmax attention of ``queries`` over a finite ``prompt`` of tokens.

    Let :math:`z` denote a row of ``queries`` (n, D) and :math:`z_1, \dots, z_L` the
    rows of ``prompt`` (L, D). Then

    .. math::

        T(z) = \sum_{i=1}^L \frac{e^{z_i^\top U z}}{\sum_{j} e^{z_j^\top U z}} \, V z_i .

    Stable for scores of any size (the largest score is subtracted before the
    exponential). With ``block_size`` the prompt is streamed in blocks of that
    many tokens with an online softmax (running maximum and rescaled sums), so the
    n × L score matrix is never held: memory grows with n × block_size, not n × L.

    **Numerical limits.** Any finite scores are safe (checked up to 1e4); the relative
    error is about :math:`\varepsilon \max|z_i^\top U z|` (:math:`\varepsilon` the dtype's
    machine epsilon: 2.2e-16 in float64, 1.2e-7 in float32), the rounding of the scores
    themselves: in float32, scores of 1e4 leave about three digits. Scores beyond the
    dtype's range (about 1e308, 3e38 in float32) overflow to NaN. Measured errors: "Precision
    and numerical limits" at the end of this page.

    Args:
        prompt: the tokens, shape (L, D), L ≥ 1.
        queries: shape (n, D).
        U: interaction matrix, shape (D, D).
        V: value matrix, shape (D_out, D).
        block_size: ``None`` (one pass over all tokens), a positive int, or
            ``"auto"`` (blocks of a power of two chosen from n, L and the backend:
            2048 tokens for n = 256 on a CPU, so that a block's scores stay in cache;
            larger on an accelerator; a prompt of at most eight blocks takes the
            one-pass path).

    Returns:
        array (n, D_out).

    Raises:
        ValueError: naming the argument, for wrong shapes, non-finite values, an
            empty prompt or a ``block_size`` other than ``None``, a positive int or ``"auto"``.

    Example:
        >>> toks = jax.random.normal(jax.random.key(0), (10_000, 2))
        >>> q = jnp.array([[0.5, 0.5], [1.0, -1.0]])
        >>> out = softmax_attention(toks, q, jnp.eye(2), jnp.eye(2), block_size=4096)  # streamed
        >>> bool(jnp.allclose(out, softmax_attention(toks, q, jnp.eye(2), jnp.eye(2))))
        True
        >>> np.round(out, 1).tolist()  # on N(0, I) tokens the infinite prompt gives q (Prop 3.1)
        [[0.5, 0.5], [1.0, -1.0]]

    This is eq 1 of the paper on the empirical measure of the tokens.
    """
    prompt, queries, U, V = _arrays(prompt, queries, U, V, names=("prompt", "queries", "U", "V"))
    block_size = _block_size(block_size, _rows(queries), _rows(prompt))
    if block_size is None:
        return _softmax_dense(queries, prompt, U, V)
    return _softmax_blocked(queries, prompt, U, V, block_size)


def _values_at_end(n: int, D: int, D_out: int) -> bool:
    r"""Whether to accumulate softmax-weighted *tokens* and apply V once at the end.

    :math:`\sum_i p_i V z_i = V \sum_i p_i z_i`: accumulating the tokens costs n·D per
    token, projecting every token first costs D·D_out + n·D_out per token. Shapes are
    static, so the choice is made at trace time.
    """
    return n * D <= D * D_out + n * D_out


def _auto_block_size(n: int, L: int) -> int:
    """The block size of ``block_size="auto"``: a power of two, chosen from the shapes and the backend.

    The (n, B) score tile of one block should stay in cache on a CPU (about 2**19
    scores, 2 MiB in float32: B = 2048 for n = 256) and be large enough to fill an
    accelerator (about 2**25 scores). B is clipped to [256, 2**20]. A prompt of at
    most eight such blocks takes the one-pass path (returned as B = L): streaming it
    would only add overhead (measured on 2 CPU cores: the one pass wins at n = 256,
    L = 2**14, and streaming from L = 2**16 on), and its score matrix is small anyway.
    """
    target = 2**19 if jax.default_backend() == "cpu" else 2**25
    b = 1 << max(0, (target // max(n, 1)).bit_length() - 1)  # largest power of two <= target / n
    b = min(max(b, 256), 2**20)
    return int(L if L <= 8 * b else b)


_PROMPT = ("queries", "prompt", "U", "V")  # the arguments of the kernels, by name
_POPULATION = ("queries", "mixture", "U", "V")


@C.finite_kernel(*_PROMPT, check=_check_args)
def _softmax_dense(queries, tokens, U, V):
    scores = (queries @ U.T) @ tokens.T  # (n, L): z_i^T U z
    weights = jax.nn.softmax(scores, axis=-1)
    if _values_at_end(*queries.shape, V.shape[0]):
        return (weights @ tokens) @ V.T
    return weights @ (tokens @ V.T)


def _block_stats(uq, toks, V, at_end):
    """Max, sum of exponentials and weighted values of one block (the online softmax's pieces)."""
    s = uq @ toks.T  # (n, B): z_i^T U z
    top = s.max(axis=-1)
    p = jnp.exp(s - top[:, None])
    vals = p @ toks if at_end else p @ (toks @ V.T)
    return top, p.sum(axis=-1), vals


def _merge(carry, block):
    """Merge the running (max, sum, values) with one block's, rescaling to the larger max."""
    (m0, s0, a0), (m1, s1, a1) = carry, block
    m = jnp.maximum(m0, m1)
    r0, r1 = jnp.exp(m0 - m), jnp.exp(m1 - m)
    return m, s0 * r0 + s1 * r1, a0 * r0[:, None] + a1 * r1[:, None]


@C.finite_kernel(*_PROMPT, None, static_argnums=4, check=_check_args)
def _softmax_blocked(queries, tokens, U, V, block_size: int):
    # Streams the prompt in place: full blocks are read with dynamic_slice inside a
    # fori_loop (no padded or reshaped copy of the (L, D) tokens, which at L = 2**23
    # would double the memory), the last partial block is one static slice. The
    # first block initialises the running statistics, so no -inf ever enters them.
    n, D = queries.shape
    L = tokens.shape[0]
    B = min(block_size, L)
    n_full, tail = divmod(L, B)
    at_end = _values_at_end(n, D, V.shape[0])
    uq = queries @ U.T  # (n, D), U folded into the queries once
    stats = partial(_block_stats, uq, V=V, at_end=at_end)

    carry = stats(tokens[:B])
    if n_full > 1:
        def body(i, carry):
            return _merge(carry, stats(jax.lax.dynamic_slice_in_dim(tokens, i * B, B)))

        carry = jax.lax.fori_loop(1, n_full, body, carry)
    if tail:
        carry = _merge(carry, stats(tokens[n_full * B:]))
    _, total, acc = carry
    out = acc / total[:, None]
    return out @ V.T if at_end else out


def linear_attention(prompt, queries, U, V):
    r"""Linear attention of ``queries`` over a finite ``prompt`` of tokens.

    .. math::

        T_{\mathrm{lin}}(z) = \frac1L \sum_{i=1}^L (z_i^\top U z)\, V z_i
                            = V \Big(\frac1L \sum_i z_i z_i^\top\Big) U z ,

    computed through the D × D empirical second moment (cost O(L D²), not O(n L D)).

    **Numerical limits.** No exponentials: the relative error is a few
    :math:`\varepsilon` times the condition of the sums (cancellation when
    :math:`\frac1L \sum_i z_i z_i^\top` nearly vanishes along :math:`U z`).

    Args:
        prompt: the tokens, shape (L, D), L ≥ 1.
        queries: shape (n, D).
        U: shape (D, D).
        V: shape (D_out, D).

    Returns:
        array (n, D_out).

    Raises:
        ValueError: as :func:`softmax_attention`.
    """
    return _linear(*_arrays(queries, prompt, U, V, names=("queries", "prompt", "U", "V")))


@C.finite_kernel(*_PROMPT, check=_check_args)
def _linear(queries, tokens, U, V):
    moment = tokens.T @ tokens / tokens.shape[0]
    return queries @ U.T @ moment @ V.T


# ----------------------------------------------------------------------------- population (L -> infinity)


def gates(mixture, queries, U):
    r"""The gates :math:`\alpha_k(z)` of softmax attention on a Gaussian mixture (Prop 2.1).

    With :math:`u = U z`,

    .. math::

        \alpha_k(z) = \operatorname{softmax}_k\Big(\log \pi_k + m_k^\top u
                      + \tfrac12 u^\top \Gamma_k u\Big).

    Computed in log space: stable for any :math:`\|U z\|`.

    **Numerical limits.** Any finite :math:`\|U z\|` is safe (checked up to 1e3, logits up
    to about 1e6); the logits carry an absolute error of about :math:`\varepsilon\,|{\rm logit}|`,
    so in float32 gates whose logits differ by less than that are not resolved. Weights
    down to 1e-300 are exact (such a component can still win); weights below the smallest
    normal number (2.2e-308 in float64, 1.2e-38 in float32) are flushed to zero on CPU.

    Args:
        mixture: a :class:`GaussianMixture` on :math:`\mathbb R^D` (the prompt's law).
        queries: shape (n, D).
        U: shape (D, D).

    Returns:
        array (n, M): probabilities, each row sums to one.

    Raises:
        ValueError: as :func:`population_attention`.
    """
    return _gates(*_arrays(queries, mixture, U, None, names=("queries", "mixture", "U", "V")))


def _gate_logits(mixture, u):
    quad = 0.5 * jnp.einsum("nd,kde,ne->nk", u, mixture.covs, u)
    return jnp.log(mixture.weights)[None, :] + u @ mixture.means.T + quad


@C.finite_kernel(*_POPULATION, check=_check_args)
def _gates(queries, mixture, U, V):  # (V: None)
    u = queries @ U.T
    return jax.nn.softmax(_gate_logits(mixture, u), axis=-1)


def population_attention(mixture, queries, U, V):
    r"""Softmax attention on the infinite prompt :math:`\mu = \sum_k \pi_k \mathcal N(m_k, \Gamma_k)`.

    The closed form of Prop 2.1: a softmax-gated mixture of affine experts,

    .. math::

        T_{U,V}[\mu](z) = V \sum_{k=1}^M \alpha_k(z)\, (m_k + \Gamma_k U z),

    with the gates :math:`\alpha_k` of :func:`gates`. For one component
    (a Gaussian prompt) this is the affine map :math:`V(m + \Gamma U z)`. Holds
    for singular covariances too. Stable for large :math:`\|U z\|` (the gates are
    computed in log space).

    **Numerical limits.** Those of :func:`gates` for the weights of the experts; the experts
    :math:`m_k + \Gamma_k U z` themselves are exact up to round-off. Singular covariances
    (point masses, noiseless coordinates) are exact. Measured errors: "Precision and
    numerical limits" at the end of this page.

    Args:
        mixture: a :class:`GaussianMixture` on :math:`\mathbb R^D`.
        queries: shape (n, D).
        U: shape (D, D).
        V: shape (D_out, D).

    Returns:
        array (n, D_out).

    Raises:
        ValueError: for shapes that do not match the mixture's dimension, or
            non-finite values.
    """
    return _population(*_arrays(queries, mixture, U, V, names=("queries", "mixture", "U", "V")))


@C.finite_kernel(*_POPULATION, check=_check_args)
def _population(queries, mixture, U, V):
    u = queries @ U.T
    alpha = jax.nn.softmax(_gate_logits(mixture, u), axis=-1)  # (n, M)
    experts = mixture.means[None, :, :] + jnp.einsum("kde,ne->nkd", mixture.covs, u)  # (n, M, D)
    return jnp.einsum("nk,nkd->nd", alpha, experts) @ V.T


def population_linear_attention(mixture, queries, U, V):
    r"""Linear attention on the infinite prompt: :math:`T_{\mathrm{lin}}[\mu](z) = V\, \mathbb E[z' z'^\top]\, U z`.

    On a mixture, :math:`T_{\mathrm{lin}}[\mu] = \sum_k \pi_k T_{\mathrm{lin}}[\mu_k]`: the
    components are weighed by :math:`\pi_k` whatever the query (Prop A.1).

    **Numerical limits.** Round-off only (a few :math:`\varepsilon` relative to
    :math:`\|V\|\,\|\mathbb E[z'z'^\top]\|\,\|U z\|`).

    Args:
        mixture: a :class:`GaussianMixture` on :math:`\mathbb R^D`.
        queries: shape (n, D).
        U: shape (D, D).
        V: shape (D_out, D).

    Returns:
        array (n, D_out).

    Raises:
        ValueError: as :func:`population_attention`.
    """
    return _population_linear(*_arrays(queries, mixture, U, V, names=("queries", "mixture", "U", "V")))


@C.finite_kernel(*_POPULATION, check=_check_args)
def _population_linear(queries, mixture, U, V):
    return queries @ U.T @ mixture.second_moment() @ V.T
