"""Moved: the property tests of the core live in tests/test_mixture.py, test_attention.py,
test_quadrature.py and test_plotting.py, their strategies in tests/strategies.py.

This module only keeps the old private names importable until every property module has
switched to ``from strategies import ...``; it holds no tests.
"""

from strategies import *  # noqa: F401,F403
from strategies import asymmetric as _asymmetric  # noqa: F401
from strategies import bad_key as _bad_key  # noqa: F401
from strategies import bad_positive_int as _bad_positive_int  # noqa: F401
from strategies import indefinite as _indefinite  # noqa: F401
from strategies import negative as _negative  # noqa: F401
from strategies import negative_weights as _negative_weights  # noqa: F401
from strategies import unnormalised as _unnormalised  # noqa: F401
