"""torchdata 0.9's ``dist_share_seed``: every rank takes rank 0's seed."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from shardpipes.datapipes.iter.sync import settled

__all__ = ["dist_share_seed"]


def dist_share_seed(seed: int, process_group: Any = None) -> int:
    """Return rank 0's ``seed`` on every rank of ``process_group`` (a broadcast)."""
    value = torch.tensor(seed if seed < 2**63 else seed - 2**64, dtype=torch.int64)
    settled(dist.broadcast(value, src=0, group=process_group, async_op=True), [value], None)
    shared = int(value.item())
    return shared if shared >= 0 or seed < 2**63 else shared + 2**64
