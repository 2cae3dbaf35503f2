"""torchdata 0.9's ``datapipes.utils.common`` module path (torch's check, as 0.9's was)."""

from torch.utils.data.datapipes.utils.common import validate_pathname_binary_tuple

__all__ = ["validate_pathname_binary_tuple"]
