"""torchdata 0.9's ``datapipes.iter.util.dataframemaker`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import (
    DataFrameMaker as DataFrameMakerIterDataPipe,
)
from shardpipes.datapipes.iter import (
    ParquetDataFrameLoader as ParquetDFLoaderIterDataPipe,
)

T_co = TypeVar("T_co", covariant=True)

__all__ = ["DataFrameMakerIterDataPipe", "ParquetDFLoaderIterDataPipe", "T_co"]
