"""torchdata 0.9's ``datapipes.iter.util.randomsplitter`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.iter import RandomSplitter as RandomSplitterIterDataPipe
from shardpipes.datapipes.td09.bucket import SplitterIterator

T = TypeVar("T")

__all__ = ["RandomSplitterIterDataPipe", "SplitterIterator", "T"]
