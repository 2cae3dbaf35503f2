"""torchdata 0.9's ``PauseIteration``."""

__all__ = ["PauseIteration"]


class PauseIteration(StopIteration):
    """Ends an iteration without finishing the epoch (torchdata 0.9's pause protocol)."""
