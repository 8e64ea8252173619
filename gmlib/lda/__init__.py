r"""Linear discriminant analysis with one softmax head (paper §3, Appendix B).

Data (eq 4): :math:`Y \in \{-1, +1\}` with :math:`P(Y = 1) = \pi_+` and
:math:`X \mid Y = c \sim \mathcal N(m_c, \Gamma)` in :math:`\mathbb R^d`. The Bayes
score (eq 5) is affine, :math:`f^\star(x) = w^{\star\top} x + b^\star` with

.. math::

    w^\star = \Gamma^{-1}(m_1 - m_{-1}), \qquad
    b^\star = -\tfrac12\big(m_1^\top\Gamma^{-1}m_1 - m_{-1}^\top\Gamma^{-1}m_{-1}\big)
              + \log\frac{\pi_+}{1-\pi_+}.

The prompt holds the tokens :math:`(X, Y) \in \mathbb R^{d+1}` (:attr:`LDAProblem.prompt`
for the infinite prompt, :func:`prompt_sampler` for finite ones), the query is
:math:`(x, 0)` and the prediction is the last output coordinate of one softmax
head (:func:`to_attention` builds it as a :class:`gmlib.Heads`). With the blocks of eq 12 (the paper writes the blocks of :math:`U^\top`),
only :math:`\theta = (U_{11}, u_{12}, v_{21}, v_{22})` matter and (eqs 6–7)

.. math::

    \begin{gathered}
    f_\theta(x) = w^\top x + b + r\,\sigma(s_0 + s^\top x),\\
    \begin{aligned}
    w &= U_{11}\Gamma v_{21}, & b &= v_{21}^\top m_{-1} - v_{22},\\
    r &= v_{21}^\top(m_1 - m_{-1}) + 2 v_{22}, & s &= 2u_{12} + U_{11}(m_1 - m_{-1}),
    \end{aligned}
    \end{gathered}

with :math:`s_0 = \log(\pi_+/(1-\pi_+))`. The population logistic risk
:math:`\mathcal R(\theta) = \mathbb E\log(1 + e^{-Y f_\theta(X)})` (eq 8) depends on X,
in each class, only through the two projections :math:`(w^\top X, s^\top X)`: it is
computed by a two-dimensional rule per class that resolves the gate's step however
steep it is, with derivatives of every order that stay smooth where those
projections are rank-deficient (:math:`\theta = 0`, :math:`s = 0`,
:math:`s \parallel w`); see :func:`risk`.

Geometry of the minimizers (Thm 3.5): :func:`family_constraints` (the equations of
:math:`\Theta_1` and :math:`\Theta_2`) and :func:`risk_hessian` (the Hessian of
:func:`risk` in the flat parameters).

Training (Thms 3.5–3.6, Figures 1, 4, 5): :func:`gradient_descent` (population
gradient descent on :func:`risk`) and :func:`sgd` (stochastic gradients on sampled
minibatches), both through :func:`gmlib.optimize` (an optax optimizer, a compiled
``lax.scan`` run in chunks with an optional progress bar); both return a
:class:`gmlib.TrainResult`.

In context (chapter 9): :func:`task_sampler` draws a fresh pair of means for every
prompt, so that the classifier must be read from the labelled tokens;
:func:`train_in_context` trains heads and networks on such prompts side by side,
:func:`task_metrics` scores them against each task's Bayes classifier and the plug-in
classifier :func:`plug_in`; :func:`in_context_bayes` is the best any classifier can do from
the prompt (the posterior log-odds over tasks; the book's, not the paper's).

The module is a package: the problem and θ (``_problem``), the representation and the
risk (``_risk``; its quadrature is in :mod:`gmlib.quadrature`), training (``_training``), in context (``_in_context``,
``_optimum``).
"""

from gmlib.lda._problem import HeadParams, LDAProblem, prompt_sampler
from gmlib.lda._risk import DEFAULT_NODES as DEFAULT_NODES
from gmlib.lda._risk import (
    bayes_head,
    effective,
    effective_risk,
    family_constraints,
    predict,
    risk,
    risk_hessian,
    to_attention,
)
from gmlib.lda._in_context import plug_in, task_metrics, task_sampler, train_in_context
from gmlib.lda._optimum import in_context_bayes
from gmlib.lda._training import gradient_descent, sgd

__all__ = [
    "LDAProblem",
    "HeadParams",
    "prompt_sampler",
    "to_attention",
    "effective",
    "predict",
    "risk",
    "effective_risk",
    "bayes_head",
    "family_constraints",
    "risk_hessian",
    "gradient_descent",
    "sgd",
    "task_sampler",
    "plug_in",
    "task_metrics",
    "train_in_context",
    "in_context_bayes",
]
