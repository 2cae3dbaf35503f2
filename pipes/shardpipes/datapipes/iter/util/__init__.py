"""torchdata 0.9's ``datapipes.iter.util`` module path, for imports that reached into it."""

from shardpipes._submodules import submodule_attributes

# torchdata 0.9's submodules of this package, attributes once it is imported (0.9 imported
# them eagerly): imported on first use here (tests/test_torchdata09_modules.py sweeps them).
__getattr__, __dir__ = submodule_attributes(
    __name__,
    (
        "bz2fileloader",
        "cacheholder",
        "combining",
        "converter",
        "cycler",
        "dataframemaker",
        "decompressor",
        "distributed",
        "hashchecker",
        "header",
        "indexadder",
        "jsonparser",
        "mux_longest",
        "paragraphaggregator",
        "plain_text_reader",
        "prefetcher",
        "randomsplitter",
        "rararchiveloader",
        "rows2columnar",
        "samplemultiplexer",
        "saver",
        "shardexpander",
        "sharding",
        "tararchiveloader",
        "tfrecordloader",
        "webdataset",
        "xzfileloader",
        "zip_longest",
        "ziparchiveloader",
    ),
)
