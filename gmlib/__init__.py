"""gmlib: softmax attention on Gaussian mixtures, in JAX.

The library behind the book *Softmax attention over Gaussian mixtures*, after
Gabet, Boursier and Boyer, "Softmax Attention on Gaussian Mixtures: Linear When
It Can, Selective When It Must" (arXiv:2610.11798).

Submodules: :mod:`gmlib.lda` (LDA with one head), :mod:`gmlib.denoise`
(denoising), :mod:`gmlib.regression` (in-context linear regression with linear attention),
:mod:`gmlib.plotting` (the book's figure style).
"""

from gmlib._loop import TrainResult, optimize, run_chunks
from gmlib.attention import (
    gates,
    linear_attention,
    population_attention,
    population_linear_attention,
    softmax_attention,
)
from gmlib.heads import Batch, Heads, apply_heads, heads_from_flax, init_heads
from gmlib.mixture import GaussianMixture, psd_sqrt
from gmlib.quadrature import gauss_hermite, mixture_expectation, monte_carlo_expectation

__version__ = "1.5.0"

__all__ = [
    "Batch",
    "GaussianMixture",
    "Heads",
    "TrainResult",
    "apply_heads",
    "gates",
    "gauss_hermite",
    "heads_from_flax",
    "init_heads",
    "linear_attention",
    "mixture_expectation",
    "monte_carlo_expectation",
    "optimize",
    "population_attention",
    "population_linear_attention",
    "psd_sqrt",
    "run_chunks",
    "softmax_attention",
]
