"""Coverage-guided fuzzing of the tar reader, webdataset grouping and decode with atheris.

    python tests/fuzz_tar.py -runs=200000 tests/fuzz_corpus

Any exception other than a ShardpipesError is a finding: atheris stops and writes the input
to a crash-* file; add it to tests/fuzz_corpus/ so test_fuzz.py replays it forever.
"""

from __future__ import annotations

import io
import sys

import atheris

with atheris.instrument_imports():
    from shardpipes.datapipes.iter import IterableWrapper
    from shardpipes.errors import ShardpipesError
    from shardpipes.formats.tarparse import iter_tar


def one_input(data: bytes) -> None:
    try:
        dp = (
            IterableWrapper([("mem://fuzz.tar", io.BytesIO(data))])
            .load_from_tar(chunk_size=4096)
            .webdataset()
            .decode(image=None)
        )
        for _ in dp:
            pass
    except ShardpipesError:
        pass
    try:
        for _ in iter_tar(io.BytesIO(data), "mem://fuzz.tar", require_end=False):
            pass
    except ShardpipesError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
