"""torchdata 0.9's ``dataloader2.random``: ``SeedGenerator`` and ``dist_share_seed``."""

from shardpipes.dataloader2.random.distributed import dist_share_seed
from shardpipes.dataloader2.random.seed_generator import SeedGenerator

__all__ = ["SeedGenerator", "dist_share_seed"]
