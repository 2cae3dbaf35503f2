"""How many examples a hypothesis test runs, relative to the profile chosen in tests/conftest.py.

A test states its budget for the ``ci`` profile (``@settings(max_examples=budget(400))``); the
``explore`` profile multiplies every budget, so ``tox -e explore`` searches further than CI does
without each test naming two numbers. An explicit ``max_examples`` would override the profile.
"""

from __future__ import annotations

from hypothesis import settings

CI_EXAMPLES = 100  # max_examples of the ``ci`` profile: the unit the budgets are written in


def budget(n: int) -> int:
    """``n`` examples under the ``ci`` profile, scaled by the profile that is loaded now."""
    return max(1, n * settings.default.max_examples // CI_EXAMPLES)
