"""torchdata 0.9's ``SeedGenerator``: a facade over the :class:`~shardpipes.plan.epoch.EpochPlan` it stands for.

Our reading services are handed the epoch's plan itself. Code written for 0.9 (a reading
service of its own, a ``worker_reset_fn``) is handed a ``SeedGenerator`` made from the plan
(:func:`facade`), and calls ``generate_shared_seed()``/``generate_seed()``/``spawn()`` on it as
before; :func:`as_plan` reads the plan back when such code passes it on to ours. A generator
made by user code (``SeedGenerator(123)``) stands for the plan of seed 123, epoch 0.
"""

from __future__ import annotations

import torch

from shardpipes.dataloader2.random._philox import PhiloxEngine
from shardpipes.plan.epoch import EpochPlan

__all__ = ["SeedGenerator", "as_plan", "facade", "int64_seed"]

_UINT64_UPPER_BOUND = 2**64
_SHARED, _WORKER = 0, 1


def int64_seed(seed: int) -> int:
    """Any integer as a signed 64-bit value (``seed`` modulo 2**64): what the plan stores."""
    seed %= _UINT64_UPPER_BOUND
    return seed - _UINT64_UPPER_BOUND if seed >= 2**63 else seed


def _torch_seed() -> int:
    # Like 0.9: drawn from torch's default generator without moving it.
    with torch.random.fork_rng(devices=[]):
        return int(torch.randint(0, 2**63 - 1, ()).item())


class SeedGenerator:
    """Deterministic seeds from one base seed: shared by all readers, or per reader.

    Args:
        seed: The base seed; ``None`` draws one from torch's default generator.
    """

    def __init__(
        self,
        seed: int | None = None,
        _rngs: tuple[PhiloxEngine, PhiloxEngine] | None = None,
        *,
        _plan: EpochPlan | None = None,
    ) -> None:
        if seed is not None and _rngs is not None:
            raise ValueError(
                "SeedGenerator doesn't allow both seed and _rng specified at the same time"
            )
        if _rngs is not None:
            self._shared_rng, self._worker_rng = _rngs
            self._plan = _plan if _plan is not None else EpochPlan(0, 0)
        elif _plan is not None:
            self._set_plan(_plan)
        else:
            self.seed(seed)

    @classmethod
    def from_plan(cls, plan: EpochPlan) -> SeedGenerator:
        """The generator that stands for ``plan`` (what ``DataLoader2`` hands the services)."""
        return cls(_plan=plan)

    def _set_plan(self, plan: EpochPlan) -> None:
        self._plan = plan
        self._shared_rng = PhiloxEngine(plan.shared_seed(-1))
        self._worker_rng = PhiloxEngine(plan.shared_seed(-2))
        for index in plan.path:
            self._worker_rng = self._worker_rng.spawn(index)

    def seed(self, seed: int | None = None) -> None:
        """Re-seed; ``None`` draws a seed from torch's default generator."""
        if seed is None:
            seed = _torch_seed()
        if seed >= _UINT64_UPPER_BOUND:
            raise ValueError(f"Expected an uint64 seed, but got {seed}.")
        self._set_plan(
            EpochPlan(int64_seed(seed), 0, self._plan.path if hasattr(self, "_plan") else ())
        )

    def generate_shared_seed(self) -> int:
        """The next seed that is the same on every rank and worker."""
        return self._shared_rng.generate()

    def generate_seed(self) -> int:
        """The next seed of this reader (distinct per rank and worker)."""
        return self._worker_rng.generate()

    def spawn(self, worker_id: int, inplace: bool = False) -> SeedGenerator:
        """The generator of child ``worker_id`` (a rank, then a worker); or become it (``inplace``)."""
        if worker_id < 0:
            raise ValueError(f"Expected `rank` equal or larger than 0, but got {worker_id}.")
        plan = self._plan.spawn(worker_id)
        worker = self._worker_rng.spawn(worker_id)
        if inplace:
            self._plan, self._worker_rng = plan, worker
            return self
        return SeedGenerator(_rngs=(self._shared_rng.clone(), worker), _plan=plan)

    def __getstate__(self) -> tuple[PhiloxEngine, PhiloxEngine, EpochPlan]:
        return self._shared_rng, self._worker_rng, self._plan

    def __setstate__(self, state: tuple[PhiloxEngine, ...]) -> None:
        if len(state) == 3:
            self._shared_rng, self._worker_rng, self._plan = state  # type: ignore[assignment]
        else:
            self._shared_rng, self._worker_rng = state
            self._plan = EpochPlan(0, 0)

    def __repr__(self) -> str:
        return f"SeedGenerator(seed={self._plan.seed}, epoch={self._plan.epoch}, path={self._plan.path})"


def as_plan(seed_generator: SeedGenerator | EpochPlan) -> EpochPlan:
    """The epoch plan a reading service was handed (as a 0.9 ``SeedGenerator`` or a plan)."""
    if isinstance(seed_generator, EpochPlan):
        return seed_generator
    if isinstance(seed_generator, SeedGenerator):
        return seed_generator._plan
    raise TypeError(
        f"expected a SeedGenerator or an EpochPlan, got {type(seed_generator).__name__}"
    )


def facade(plan: EpochPlan | SeedGenerator) -> SeedGenerator:
    """0.9's ``SeedGenerator`` for code written for 0.9: the one it was given, or one made from the plan."""
    return plan if isinstance(plan, SeedGenerator) else SeedGenerator.from_plan(plan)
