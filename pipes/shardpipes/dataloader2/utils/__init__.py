"""torchdata 0.9's ``dataloader2.utils``: ``WorkerInfo``, ``process_init_fn``, ``process_reset_fn``."""

from shardpipes.dataloader2.utils.worker import WorkerInfo, process_init_fn, process_reset_fn

__all__ = ["WorkerInfo", "process_init_fn", "process_reset_fn"]
