"""torchdata 0.9's ``datapipes.iter.load.s3io`` module path, for code that imports or patches it."""

from shardpipes.datapipes.iter import (
    S3FileLister as S3FileListerIterDataPipe,
)
from shardpipes.datapipes.iter import (
    S3FileLoader as S3FileLoaderIterDataPipe,
)

__all__ = ["S3FileListerIterDataPipe", "S3FileLoaderIterDataPipe"]
