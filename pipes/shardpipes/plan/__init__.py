"""The plan: seeds, shuffles, topology, partitions and resume, as pure functions of integers.

The bottom layer of the package (it imports nothing else of it). Every other layer asks it the
same questions and gets the same answers: which reader a (rank, worker) is and its seed path
(:mod:`~shardpipes.plan.readers`), the seeds and the counter-based shuffle
(:mod:`~shardpipes.plan.seeds`), the epoch's sample partition (:mod:`~shardpipes.plan.partition`),
where a resumed epoch continues (:mod:`~shardpipes.plan.resume`) and the per-epoch value the
loader hands the stages (:mod:`~shardpipes.plan.epoch`).
"""
