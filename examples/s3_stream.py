"""Stream WebDataset shards from S3 (or any S3-compatible store) through DataLoader2.

By default the example needs no bucket and no network: it starts moto's S3 server
(``moto[server]``) on 127.0.0.1, uploads a few synthetic shards to it with s3fs, and streams
them with worker processes, checking that every sample arrives once per epoch::

    python examples/s3_stream.py

Against a real store, name the bucket (and, for MinIO, Ceph, R2 and other S3-compatible
stores, the endpoint). Credentials come the usual way (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, instance metadata); ``--upload`` first writes the
synthetic shards to ``s3://BUCKET/PREFIX/`` (nothing is deleted afterwards), otherwise the
shards already there are read::

    python examples/s3_stream.py --bucket my-bucket --prefix tmp/shardpipes --upload
    python examples/s3_stream.py --endpoint http://127.0.0.1:9000 --bucket data --shards 128

Needs ``pip install 'shardpipes[s3]'`` (s3fs), and ``moto[server]`` for the default mode.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.synthetic import write_synthetic


@contextmanager
def moto_s3() -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 (a free port) for the block; yield its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # else a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def storage_options(endpoint: str | None, *, dummy_keys: bool, anon: bool) -> dict[str, Any]:
    """The s3fs options: an endpoint for S3-compatible stores, and keys only for moto."""
    options: dict[str, Any] = {}
    if endpoint is not None:
        options["client_kwargs"] = {"endpoint_url": endpoint}
    if dummy_keys:  # moto accepts any keys; never put real ones in code
        options.update(key="testing", secret="testing")
    if anon:
        options["anon"] = True
    return options


def upload_synthetic(
    bucket: str, prefix: str, shards: int, samples: int, options: dict[str, Any]
) -> int:
    """Write synthetic shards locally and copy them to ``s3://bucket/prefix/``; return the sample count."""
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    counts = [samples + 7 * i for i in range(shards)]  # uneven shards, as real data has
    with tempfile.TemporaryDirectory(prefix="shardpipes-s3-example-") as tmp:
        for path in write_synthetic(tmp, shards=shards, samples=counts):
            fs.put_file(path, f"{bucket}/{prefix}/{os.path.basename(path)}")
    return sum(counts)


def sample_name(sample: dict[str, Any]) -> str:
    """Keep only the sample's name, shard URL and key: unique, so repeats can be counted."""
    return f"{sample['__url__']}#{sample['__key__']}"


def build_pipeline(pattern: str, options: dict[str, Any], batch_size: int) -> Any:
    """Shards on S3 -> shuffled batches of sample names; the shards are streamed, not downloaded."""
    return (
        IterableWrapper([pattern])
        .shard_expand()  # no request: a brace pattern names the objects
        .shuffle()
        .sharding_filter()  # each worker process streams its own shards
        .open_files_by_fsspec(mode="rb", storage_options=options)
        .load_from_tar()
        .webdataset()
        .decode()
        .map(sample_name)
        .shuffle(buffer_size=200)
        .batch(batch_size)
    )


def stream(
    pattern: str, options: dict[str, Any], args: argparse.Namespace, total: int | None
) -> bool:
    """Read ``args.epochs`` epochs; print counts and throughput; check coverage if ``total``."""
    rs = MultiProcessingReadingService(num_workers=args.workers)
    ok = True
    with DataLoader2(build_pipeline(pattern, options, args.batch_size), reading_service=rs) as dl:
        for epoch in range(args.epochs):
            dl.seed(epoch)
            t0 = time.perf_counter()
            batches = list(dl)
            seconds = time.perf_counter() - t0
            names = [name for batch in batches for name in batch]
            repeated = len(names) - len(set(names))
            line = (
                f"epoch {epoch}: {len(names)} samples in {len(batches)} batches, "
                f"{len(names) / seconds:,.0f} samples/s"
            )
            if total is not None:  # we wrote the shards: we know how many samples they hold
                once = len(names) == total and repeated == 0
                line += f"; every sample once: {once}"
                ok = ok and once
            elif repeated:
                line += f"; {repeated} repeated samples"
                ok = False
            print(line)
    return ok


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Without --bucket: moto's S3 server on 127.0.0.1 with synthetic shards.",
    )
    p.add_argument(
        "--endpoint",
        default=None,
        help="S3-compatible endpoint URL, e.g. http://127.0.0.1:9000 (default: AWS's)",
    )
    p.add_argument("--bucket", default=None, help="use this bucket of a real store instead of moto")
    p.add_argument("--prefix", default="shardpipes-example", help="key prefix of the shards")
    p.add_argument(
        "--upload",
        action="store_true",
        help="with --bucket: write the synthetic shards there first (always done with moto)",
    )
    p.add_argument("--anon", action="store_true", help="unsigned requests (public buckets)")
    p.add_argument("--shards", type=int, default=5, help="number of shards (default: 5)")
    p.add_argument(
        "--samples",
        type=int,
        default=100,
        help="samples in the first shard; shard i has SAMPLES + 7*i (default: 100)",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default: 2)")
    p.add_argument("--epochs", type=int, default=2, help="epochs (default: 2)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default: 32)")
    return p.parse_args(argv)


def run(
    args: argparse.Namespace, endpoint: str | None, bucket: str, upload: bool, dummy_keys: bool
) -> bool:
    options = storage_options(endpoint, dummy_keys=dummy_keys, anon=args.anon)
    total = None
    if upload:
        total = upload_synthetic(bucket, args.prefix, args.shards, args.samples, options)
        print(f"uploaded {args.shards} shards ({total} samples) to s3://{bucket}/{args.prefix}/")
    pattern = f"s3://{bucket}/{args.prefix}/train-{{000000..{args.shards - 1:06d}}}.tar"
    print(f"streaming {pattern} with {args.workers} worker process(es)")
    return stream(pattern, options, args, total)


def main(args: argparse.Namespace) -> int:
    if args.bucket is None:
        with moto_s3() as endpoint:
            print(f"moto S3 server at {endpoint}")
            ok = run(args, endpoint, "examples", upload=True, dummy_keys=True)
    else:
        ok = run(args, args.endpoint, args.bucket, upload=args.upload, dummy_keys=False)
    print("done" if ok else "error: some samples were missing or repeated")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(parse_args()))
