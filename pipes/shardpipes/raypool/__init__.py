"""Readers on a Ray pool: a rank's logical readers made by Ray actors, dealt as the worker pool deals them.

Ray is an optional extra (``pip install 'shardpipes[ray]'``); this package imports it only when
the service starts. See docs/disaggregated-reading.md.
"""

from shardpipes.raypool.service import RayReadingService, SeekRefused
from shardpipes.raypool.sizing import SizingPolicy

__all__ = ["RayReadingService", "SeekRefused", "SizingPolicy"]
