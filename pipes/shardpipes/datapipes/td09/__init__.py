"""torchdata 0.9's stages that have no core counterpart: the 0.9 adapter over the core stages.

Re-exported at 0.9's paths by :mod:`shardpipes.datapipes.iter`.
"""
