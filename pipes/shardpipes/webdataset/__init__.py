"""webdataset 1.x's API on the shardpipes graph: ``import shardpipes.webdataset as wds``.

``wds.WebDataset(urls)...`` builds a shardpipes DataPipe graph (shard list -> seeded shard
shuffle -> ``sharding_filter`` -> ``open_files_by_fsspec`` -> ``load_from_tar`` ->
``webdataset``) and gives webdataset's samples (``{"__key__", "__url__", "jpg": ...}``, no
leading dots). ``wds.WebLoader`` runs it with ``DataLoader2``: the split by rank and worker is
automatic, and under DDP every rank yields the same number of batches. See
``docs/migrating-from-webdataset.md`` for what differs from webdataset, and why.
"""

from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.webdataset import autodecode, utils, wids
from shardpipes.webdataset._graph import tarfile_samples, tarfile_to_samples
from shardpipes.webdataset.autodecode import (
    Continue,
    Decoder,
    DecodingError,
    gzfilter,
    handle_extension,
    imagehandler,
    torch_audio,
    torch_loads,
    torch_video,
)
from shardpipes.webdataset.compat import FluidInterface, FluidWrapper, WebDataset
from shardpipes.webdataset.filters import (
    Cached,
    LMDBCached,
    batched,
    decode,
    detshuffle,
    extract_keys,
    getfirst,
    info,
    map,
    map_dict,
    map_tuple,
    pipelinefilter,
    rename,
    rename_keys,
    rsample,
    select,
    shuffle,
    slice,
    to_tuple,
    transform_with,
    unbatched,
    unlisted,
    xdecode,
)
from shardpipes.webdataset.gopen import gopen
from shardpipes.webdataset.handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from shardpipes.webdataset.loader import WebLoader
from shardpipes.webdataset.mix import RandomMix, RoundRobin
from shardpipes.webdataset.pipeline import DataPipeline
from shardpipes.webdataset.shardlists import (
    ResampledShards,
    SimpleShardList,
    non_empty,
    resampled,
    shardspec,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from shardpipes.webdataset.utils import PipelineStage, repeatedly
from shardpipes.webdataset.writer import ShardWriter, TarWriter, numpy_dumps, torch_dumps

ResampledShardList = ResampledShards


class MockDataset(DataPipeline):
    """``length`` copies of ``sample`` (webdataset's ``MockDataset``)."""

    def __init__(self, sample: object, length: int) -> None:
        super().__init__(IterableWrapper([sample] * length, deepcopy=False))


__all__ = [
    "Cached",
    "Continue",
    "DataPipeline",
    "Decoder",
    "DecodingError",
    "FluidInterface",
    "FluidWrapper",
    "LMDBCached",
    "MockDataset",
    "PipelineStage",
    "RandomMix",
    "ResampledShardList",
    "ResampledShards",
    "RoundRobin",
    "ShardWriter",
    "SimpleShardList",
    "TarWriter",
    "WebDataset",
    "WebLoader",
    "autodecode",
    "batched",
    "decode",
    "detshuffle",
    "extract_keys",
    "getfirst",
    "gopen",
    "gzfilter",
    "handle_extension",
    "ignore_and_continue",
    "ignore_and_stop",
    "imagehandler",
    "info",
    "map",
    "map_dict",
    "map_tuple",
    "non_empty",
    "numpy_dumps",
    "pipelinefilter",
    "rename",
    "rename_keys",
    "repeatedly",
    "reraise_exception",
    "resampled",
    "rsample",
    "select",
    "shardspec",
    "shuffle",
    "single_node_only",
    "slice",
    "split_by_node",
    "split_by_worker",
    "tarfile_samples",
    "tarfile_to_samples",
    "to_tuple",
    "torch_audio",
    "torch_dumps",
    "torch_loads",
    "torch_video",
    "transform_with",
    "unbatched",
    "unlisted",
    "utils",
    "warn_and_continue",
    "warn_and_stop",
    "wids",
    "xdecode",
]
