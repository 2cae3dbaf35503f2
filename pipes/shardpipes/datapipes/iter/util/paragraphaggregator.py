"""torchdata 0.9's ``datapipes.iter.util.paragraphaggregator`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import ParagraphAggregator as ParagraphAggregatorIterDataPipe

T_co = TypeVar("T_co", covariant=True)

__all__ = ["ParagraphAggregatorIterDataPipe", "T_co"]
