"""MapDataPipe stages of torchdata 0.9: ``in_memory_cache`` and ``unzip``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.utils.data import MapDataPipe

from shardpipes._submodules import submodule_attributes
from shardpipes.datapipes.map._registry import register_map

__all__ = ["InMemoryCacheHolderMapDataPipe", "UnZipperMapDataPipe"]


@register_map("in_memory_cache")
class InMemoryCacheHolderMapDataPipe(MapDataPipe[Any]):
    """Keep each item read from ``source_dp`` in memory (functional name: ``in_memory_cache``).

    Example:
        >>> from shardpipes.datapipes.map import SequenceWrapper
        >>> SequenceWrapper([10, 20]).in_memory_cache()[1]
        20
    """

    def __init__(self, source_dp: MapDataPipe[Any]) -> None:
        self.source_dp = source_dp
        self.cache: dict[Any, Any] = {}

    def __getitem__(self, index: Any) -> Any:
        if index not in self.cache:
            self.cache[index] = self.source_dp[index]
        return self.cache[index]

    def __len__(self) -> int:
        return len(self.source_dp)


class _Column(MapDataPipe[Any]):
    def __init__(self, main_datapipe: MapDataPipe[Sequence[Any]], instance_id: int) -> None:
        self.main_datapipe = main_datapipe
        self.instance_id = instance_id

    def __getitem__(self, index: Any) -> Any:
        return self.main_datapipe[index][self.instance_id]

    def __len__(self) -> int:
        return len(self.main_datapipe)


@register_map("unzip")
class UnZipperMapDataPipe(MapDataPipe[Any]):
    """Split a MapDataPipe of sequences into one MapDataPipe per column (functional name: ``unzip``).

    Arguments of the call (``__new__`` returns the graph it stands for):

    - ``source_datapipe``: Items are sequences of ``sequence_length`` values.
    - ``sequence_length``: Columns of each item.
    - ``columns_to_skip``: Columns without an output. Default: ``None``.
    """

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: MapDataPipe[Sequence[Any]],
        sequence_length: int,
        columns_to_skip: Sequence[int] | None = None,
    ) -> list[MapDataPipe[Any]]:
        """Build the graph this stage stands for (torchdata 0.9 built it the same way)."""
        if sequence_length < 1:
            raise ValueError(
                f"Expected `sequence_length` larger than 0, but {sequence_length} is found"
            )
        skips = set(columns_to_skip or ())
        ids = [i for i in range(sequence_length) if i not in skips]
        if not ids:
            raise RuntimeError(
                f"All instances are being filtered out in {cls.__name__}. Please check"
                "the input `sequence_length` and `columns_to_skip`."
            )
        return [_Column(source_datapipe, i) for i in ids]


# torchdata 0.9's submodules of this package, attributes once it is imported (0.9 imported
# them eagerly): imported on first use here (tests/test_torchdata09_modules.py sweeps them).
__getattr__, __dir__ = submodule_attributes(__name__, ("cacheholder", "converter", "unzipper"))
