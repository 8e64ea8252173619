r"""Denoising a Gaussian mixture with softmax attention (Section 4 of the paper).

The model (eq 9): :math:`X \sim \sum_k \pi_k \mathcal N(m_k, \Gamma)` and
:math:`Z = X + \xi\varepsilon` with :math:`\varepsilon \sim \mathcal N(0, I_d)` independent of
:math:`X`; :math:`S = \Gamma + \xi^2 I_d`. The Bayes denoiser for the squared loss (eq 10) is
the softmax-gated affine map

.. math::

    f^\star(z) = \mathbb E[X \mid Z = z] = \Gamma S^{-1} z + \xi^2 S^{-1} \sum_k \beta_k(z)\, m_k,
    \qquad \beta_k(z) = \operatorname{softmax}_k\Big(\log \pi_k + m_k^\top S^{-1} z
    - \tfrac12 m_k^\top S^{-1} m_k\Big) = P(C = k \mid Z = z).

Softmax attention on the noisy prompt :math:`\mu_Z` has the same shape (Prop 2.1), but one
head cannot weigh the two terms differently (Prop C.4): two heads can (Prop C.5, Prop C.3),
and the residual two-head layer of Prop 4.4 does it for every task at once, reading the
task from the prompt. Every construction returns a :class:`gmlib.Heads`, evaluated by
:func:`gmlib.apply_heads` on the noisy prompt (``problem.noisy``, the infinite prompt) or on
tokens.

What lives where (everything is imported here, ``gmlib.denoise.<name>``):

- :mod:`gmlib.denoise.problem`: :class:`DenoisingProblem`: the laws of X and Z, the
  posterior responsibilities, the Bayes denoiser (eq 10), the excess risk of any map, the
  Bayes risk;
- :mod:`gmlib.denoise.paper_heads`: the paper's exact heads for two components of equal
  norm, :func:`two_head_bayes` (Thm 4.1, Props C.3, C.5) and :func:`single_head_bayes`;
- :mod:`gmlib.denoise.general_heads`: beyond the paper's assumptions (the book's chapter 8):
  :func:`augment` (a constant coordinate in the tokens), :func:`multi_head_bayes` and
  :func:`heads_needed` (M components, any covariance), :func:`fewer_heads`,
  :func:`skip_head_bayes` (a linear skip connection), :func:`small_score_head`;
- :mod:`gmlib.denoise.linear`: no selection: :func:`linear_optimum`, :func:`affine_optimum`,
  their risks :func:`linear_risk`, :func:`affine_risk` and gaps to Bayes :func:`linear_gap`,
  :func:`affine_gap` (Prop C.6);
- :mod:`gmlib.denoise.in_context`: in-context denoising: :func:`in_context_heads` (Prop 4.4
  and its tempered family), :func:`estimate_task` (the plug-in competitor),
  :func:`finite_prompt_errors` (both on one finite prompt), :func:`task_sampler` and
  :func:`task_excess` (prompts of random tasks, for training), :func:`excess_by_length`,
  :func:`tempered_excess`, :func:`plug_in_excess`, :func:`train_in_context` and
  :func:`trained_excess` (finite prompts, the book's chapter 7);
- :mod:`gmlib.denoise.optimum`: :func:`in_context_bayes`, the Bayes-optimal in-context
  denoiser (the posterior mean over tasks given the prompt: the best any predictor can do
  from a finite prompt; quadrature in d ≤ 2, importance sampling with a standard error in
  any d);
- :mod:`gmlib.denoise.clean_context`: in-context denoising from clean tokens, the setting of
  Smart, Bietti and Sengupta (2025) (the book's chapter 10): :func:`clean_context_sampler`,
  :func:`tempered_risk` (the tempered head over its inverse temperature),
  :func:`known_centres_bayes`, :func:`clean_context_bayes` with :func:`cluster_labels` (the
  Bayes-optimal in-context denoiser, bracketed), :func:`train_clean_context` (their
  one-layer model, trained as they train it);
- :mod:`gmlib.denoise.iterated`: the iterated denoiser of Prop 4.3: :func:`iterate`,
  :func:`separation`, :func:`tanh_fixed_point`, :func:`cluster_limits`.

Everything except the host functions (:func:`tanh_fixed_point`, :func:`cluster_limits`, :func:`fewer_heads`,
:func:`heads_needed`, a scipy root solver and numpy linear algebra) and the value-dependent
checks works under ``jit``, ``vmap`` and ``grad``, in float32 and float64.
"""

from gmlib.denoise.clean_context import (
    CleanTasks,
    TemperedRisk,
    clean_context_bayes,
    clean_context_sampler,
    cluster_labels,
    known_centres_bayes,
    tempered_risk,
    train_clean_context,
)
from gmlib.denoise.general_heads import (
    augment,
    fewer_heads,
    heads_needed,
    multi_head_bayes,
    skip_head_bayes,
    small_score_head,
)
from gmlib.denoise.in_context import (
    estimate_task,
    excess_by_length,
    finite_prompt_errors,
    in_context_heads,
    plug_in_excess,
    task_excess,
    task_sampler,
    tempered_excess,
    train_in_context,
    trained_excess,
)
from gmlib.denoise.iterated import cluster_limits, iterate, separation, tanh_fixed_point
from gmlib.denoise.linear import (
    affine_gap,
    affine_optimum,
    affine_risk,
    linear_gap,
    linear_optimum,
    linear_risk,
)
from gmlib.denoise.optimum import in_context_bayes
from gmlib.denoise.paper_heads import single_head_bayes, two_head_bayes
from gmlib.denoise.problem import DenoisingProblem

__all__ = [
    "DenoisingProblem",
    "two_head_bayes",
    "single_head_bayes",
    "augment",
    "multi_head_bayes",
    "heads_needed",
    "fewer_heads",
    "skip_head_bayes",
    "small_score_head",
    "linear_optimum",
    "linear_risk",
    "linear_gap",
    "affine_optimum",
    "affine_risk",
    "affine_gap",
    "in_context_heads",
    "estimate_task",
    "finite_prompt_errors",
    "task_sampler",
    "task_excess",
    "excess_by_length",
    "tempered_excess",
    "plug_in_excess",
    "train_in_context",
    "trained_excess",
    "in_context_bayes",
    "clean_context_sampler",
    "CleanTasks",
    "tempered_risk",
    "TemperedRisk",
    "known_centres_bayes",
    "cluster_labels",
    "clean_context_bayes",
    "train_clean_context",
    "iterate",
    "separation",
    "tanh_fixed_point",
    "cluster_limits",
]
