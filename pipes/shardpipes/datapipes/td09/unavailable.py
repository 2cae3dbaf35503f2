"""torchdata 0.9 readers whose service is gone or whose dependency shardpipes does not carry.

Each keeps 0.9's class name, functional name and arguments, so imports and graph definitions
still load, and fails at construction with the reason and the alternative:

- AIStore (``AISFileLister``/``AISFileLoader``): torchdata's ``aistore`` client API is gone;
  AIStore serves an S3-compatible API, read it with ``FSSpecFileLister``/``FSSpecFileOpener``
  and ``storage_options={"client_kwargs": {"endpoint_url": ...}}``.
- Hugging Face Hub (``HuggingFaceHubReader``): use ``datasets.load_dataset(..., streaming=True)``
  and wrap it with ``IterableWrapper``, or read the Hub's files with fsspec's ``hf://`` URLs.
- torcharrow dataframes (``DataFrameMaker``/``ParquetDataFrameLoader``): torcharrow was
  archived; batch rows with ``batch()``/``rows2columnar()`` or read Parquet with pyarrow in a
  ``map``.
"""

from __future__ import annotations

from typing import Any, NoReturn

from shardpipes.datapipes.iter.base import StageIterDataPipe, register

__all__ = [
    "AISFileListerIterDataPipe",
    "AISFileLoaderIterDataPipe",
    "DataFrameMakerIterDataPipe",
    "HuggingFaceHubReaderIterDataPipe",
    "ParquetDFLoaderIterDataPipe",
]

_AIS = (
    "torchdata's AIStore client is gone. AIStore serves an S3-compatible API: use "
    "FSSpecFileLister / FSSpecFileOpener with s3:// URLs and "
    "storage_options={'client_kwargs': {'endpoint_url': '<AIS endpoint>/s3'}} "
    "(pip install 'shardpipes[s3]')."
)
_HF = (
    "shardpipes does not carry the Hugging Face datasets package. Use "
    "IterableWrapper(datasets.load_dataset(name, streaming=True, split=...)) (pip install datasets), "
    "or read the Hub's files with FSSpecFileOpener and hf:// URLs (pip install huggingface_hub)."
)
_DF = (
    "torcharrow was archived by PyTorch, so torchdata's dataframe stages cannot work. Batch rows "
    "with batch() and rows2columnar(), or read Parquet with pyarrow.parquet inside a map()."
)


def _unavailable(name: str, why: str) -> NoReturn:
    raise ModuleNotFoundError(f"{name} is not provided by shardpipes: {why}")


@register("list_files_by_ais")
class AISFileListerIterDataPipe(StageIterDataPipe[str]):
    """AIStore listing: not provided, see the module notes (functional name: ``list_files_by_ais``)."""

    def __init__(self, source_datapipe: Any, url: str, length: int = -1) -> None:
        _unavailable("AISFileLister", _AIS)


@register("load_files_by_ais")
class AISFileLoaderIterDataPipe(StageIterDataPipe[tuple[str, Any]]):
    """AIStore loading: not provided, see the module notes (functional name: ``load_files_by_ais``)."""

    def __init__(self, source_datapipe: Any, url: str, length: int = -1) -> None:
        _unavailable("AISFileLoader", _AIS)


class HuggingFaceHubReaderIterDataPipe(StageIterDataPipe[Any]):
    """Hugging Face Hub datasets: not provided, see the module notes."""

    def __init__(self, dataset: str, **config_kwargs: Any) -> None:
        _unavailable("HuggingFaceHubReader", _HF)


@register("dataframe")
class DataFrameMakerIterDataPipe(StageIterDataPipe[Any]):
    """torcharrow dataframes: not provided, see the module notes (functional name: ``dataframe``)."""

    def __init__(
        self,
        source_dp: Any,
        dataframe_size: int = 1000,
        dtype: Any = None,
        dtype_generator: Any = None,
        columns: list[str] | None = None,
        device: str = "",
    ) -> None:
        _unavailable("DataFrameMaker", _DF)


@register("load_parquet_as_df")
class ParquetDFLoaderIterDataPipe(StageIterDataPipe[Any]):
    """torcharrow Parquet loading: not provided, see the module notes (functional name: ``load_parquet_as_df``)."""

    def __init__(
        self,
        source_dp: Any,
        dtype: Any = None,
        columns: list[str] | None = None,
        device: str = "",
        use_threads: bool = False,
    ) -> None:
        _unavailable("ParquetDataFrameLoader", _DF)
