"""torchdata 0.9's ``datapipes.map.util.unzipper`` module path, for code that imports or patches it."""

from typing import TypeVar

from shardpipes.datapipes.map import UnZipper as UnZipperMapDataPipe

T = TypeVar("T")

__all__ = ["T", "UnZipperMapDataPipe"]
