"""torchdata 0.9's ``dataloader2.communication`` module paths (its worker queue protocol).

shardpipes' worker pool (``dataloader2/workers/``) does not run 0.9's queue
protocol, so these modules keep 0.9's names for imports and ``isinstance`` checks: the message
classes are plain values; the protocol, queue and event-loop classes refuse construction with
the reason.
"""

from shardpipes.dataloader2.communication import eventloop, iter, map, messages, protocol, queue

__all__ = ["eventloop", "iter", "map", "messages", "protocol", "queue"]
