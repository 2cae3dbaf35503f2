"""A counter-based seed engine with torchdata 0.9's ``PhiloxEngine`` interface.

Draws are ``derive_seed([seed, counter])`` (numpy's ``SeedSequence``), not the Philox cipher:
the values differ from 0.9's, the contract is the same (a seed and a counter decide every
draw; ``spawn(i)`` gives an independent engine per child, the same for the same ``i``).
"""

from __future__ import annotations

from shardpipes.plan.seeds import derive_seed

__all__ = ["PhiloxEngine"]

_SPAWN = 1  # a tag, so that a child's seed is never one of the parent's draws


class PhiloxEngine:
    """Seeded, counter-based source of 63-bit seeds.

    Args:
        seed: The base seed; ``generate``/``spawn`` need one (``seed()`` sets it later).
    """

    def __init__(self, seed: int | None = None) -> None:
        self._seed: int | None = None
        self._counter = 0
        if seed is not None:
            self.seed(seed)

    def seed(self, seed: int) -> PhiloxEngine:
        """Set the base seed and restart the counter."""
        self._seed = derive_seed([seed & (2**64 - 1), 0])
        self._counter = 0
        return self

    def generate(self) -> int:
        """The next seed."""
        assert self._seed is not None, "Please provide seed"
        value = derive_seed([self._seed, self._counter])
        self._counter += 1
        return value

    def clone(self) -> PhiloxEngine:
        """A copy at the same position."""
        other = PhiloxEngine()
        other._seed, other._counter = self._seed, self._counter
        return other

    def spawn(self, index: int) -> PhiloxEngine:
        """The engine of child ``index``: depends on the base seed and ``index`` only."""
        assert index >= 0, f"Expected a non-negative value for spawn, but found {index}"
        assert self._seed is not None, "Please provide seed"
        child = PhiloxEngine()
        child._seed = derive_seed([self._seed, _SPAWN, index])
        return child

    def __getstate__(self) -> tuple[int | None, int]:
        return self._seed, self._counter

    def __setstate__(self, state: tuple[int | None, int]) -> None:
        self._seed, self._counter = state
