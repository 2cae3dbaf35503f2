"""torchdata 0.9's ``ShuffleSpec``: the (empty) base class of shuffle specifications."""

import abc

__all__ = ["ShuffleSpec"]


class ShuffleSpec(abc.ABC):  # noqa: B024 - an empty marker class, as in 0.9
    """Defines a shuffle specification."""
