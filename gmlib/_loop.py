"""The chunked training loop and the result type shared by :mod:`gmlib.lda`, :mod:`gmlib.train` and the book."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gmlib import _checks as C

__all__ = ["TrainResult", "run_chunks"]


class TrainResult(NamedTuple):
    """What a training run returns.

    Attributes:
        params: the final parameters (a pytree).
        steps: the recorded step numbers, shape (n_records,) (int).
        metric: the values recorded at those steps, stacked on a first axis of length
            n_records (for :func:`gmlib.lda.gradient_descent`: the population risk; for
            :func:`gmlib.train.fit`: the training loss).
        trajectory: the parameters at those steps (each leaf with a leading axis of
            length n_records), or ``None`` when not recorded.
    """

    params: Any
    steps: np.ndarray
    metric: Any
    trajectory: Any = None


def run_chunks(block: Callable, state, n_records: int, *, chunk_records: int | None = None,
               progress: bool = False, desc: str | None = None):
    """Advance ``state`` by ``n_records`` records, in chunks, with an optional tqdm bar.

    ``block(state, k) -> (state, out)`` advances ``state`` by ``k`` records (typically a
    jitted ``lax.scan`` with ``k`` static) and returns their outputs, a pytree of arrays
    with a leading axis of length ``k``. The outputs of all chunks are concatenated.
    Between chunks the bar advances; a chunk is one device call, so the loop syncs with
    the host only between chunks.

    Args:
        block: the chunk function.
        state: the initial state (a pytree).
        n_records: the total number of records, a positive int.
        chunk_records: records per chunk; default all of them in one chunk, or about
            twenty chunks when ``progress`` is true (only the last one may be shorter, so
            at most two shapes compile).
        progress: show a tqdm bar.
        desc: the bar's label.

    Returns:
        ``(state, outs)``: the final state and the concatenated outputs.

    Raises:
        ValueError: naming ``n_records`` or ``chunk_records`` when not a positive int.

    Example:
        >>> state, losses = run_chunks(lambda s, k: scan_k_steps(s, k), state, 1000, progress=True)
    """
    n_records = C.scalar(n_records, "n_records", low=0, integer=True)
    if chunk_records is None:
        chunk_records = n_records if not progress else max(1, n_records // 20)
    chunk_records = C.scalar(chunk_records, "chunk_records", low=0, integer=True)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_records, desc=desc)
    outs, done = [], 0
    while done < n_records:
        k = min(chunk_records, n_records - done)
        state, out = block(state, k)
        outs.append(out)
        done += k
        if bar is not None:
            bar.update(k)
    if bar is not None:
        bar.close()
    return state, jax.tree.map(lambda *a: jnp.concatenate(a), *outs)
