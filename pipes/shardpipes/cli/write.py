"""``shardpipes write``: pack files into WebDataset-style tar shards.

Files are grouped into samples by basename, as WebDataset readers group tar members: the key is
the path (relative to the folder given) up to the first dot of the basename, the field is the
rest. ``photos/cat.jpg`` and ``photos/cat.cls`` become one sample ``{"__key__": "cat", ".jpg",
".cls"}`` when ``photos`` is the folder given.
"""

from __future__ import annotations

import argparse
import posixpath
import re
from typing import Any

from shardpipes.cli._command import Command, arg

__all__ = ["COMMAND", "collect_samples", "parse_size", "run"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse a byte size with an optional decimal (``KB``) or binary (``KiB``) unit.

    Raises:
        ValueError: Not a size, naming the text.

    Examples:
        >>> parse_size("100MB"), parse_size("1GiB"), parse_size("512"), parse_size("1.5k")
        (100000000, 1073741824, 512, 1500)
    """
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (use e.g. 500MB, 1GiB or a number of bytes)")
    number, unit, binary = m.groups()
    power = " kmgt".index(unit.lower() or " ")
    return int(float(number) * (1024 if binary else 1000) ** power)


COMMAND = Command(
    "write",
    help="pack files (or folders of files) into tar shards",
    description="Groups files into samples by basename (key = path up to the first dot of "
    "the file name, relative to the folder given; field = the rest, e.g. '.jpg') and writes "
    "them, in key order, into numbered tar shards.",
    args=(
        arg("inputs", nargs="+", metavar="INPUT", help="files or folders (read recursively)"),
        arg(
            "-o",
            "--output",
            required=True,
            metavar="PATTERN",
            help="shard path or URL with a %%d placeholder, e.g. 'out/train-%%06d.tar'",
        ),
        arg(
            "--maxcount",
            type=int,
            default=10_000,
            help="samples per shard at most (default: 10000)",
        ),
        arg(
            "--maxsize",
            type=parse_size,
            default=parse_size("1GB"),
            help="bytes per shard at most: 500MB, 1GiB, 2000000 ... (default: 1GB)",
        ),
    ),
)


def collect_samples(inputs: list[str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Return ``[(key, [(extension, file URL), ...]), ...]`` sorted by key, fields sorted.

    Files whose name starts with a dot are skipped.

    Raises:
        ValueError: A file without an extension, or two files giving the same key and field.
        FileNotFoundError: An input that does not exist.
    """
    from shardpipes.datapipes.iter.fsspec import filesystem

    samples: dict[str, dict[str, str]] = {}
    for top in inputs:
        fs, root = filesystem(top, None)
        if fs.isdir(root):
            files = [(p, posixpath.relpath(p, root)) for p in sorted(fs.find(root))]
        elif fs.exists(root):
            files = [(root, posixpath.basename(root))]
        else:
            raise FileNotFoundError(f"{top}: no such file or folder")
        for path, rel in files:
            base = posixpath.basename(rel)
            if base.startswith("."):
                continue
            url = str(fs.unstrip_protocol(path)) if "://" in top else path
            dot = base.find(".")
            if dot <= 0 or dot == len(base) - 1:
                raise ValueError(
                    f"{url}: file name has no extension; a sample field needs one (key.ext)"
                )
            key, ext = rel[: len(rel) - len(base) + dot], base[dot:]
            fields = samples.setdefault(key, {})
            if ext in fields:
                raise ValueError(
                    f"{url} and {fields[ext]} both give field {ext!r} of sample {key!r}"
                )
            fields[ext] = url
    return [(k, sorted(samples[k].items())) for k in sorted(samples)]


def run(args: argparse.Namespace) -> int:
    """Collect the samples and write the shards."""
    from shardpipes.cli.index import format_bytes
    from shardpipes.storage.open import open_url
    from shardpipes.writer import ShardWriter

    samples = collect_samples(args.inputs)
    if not samples:
        raise ValueError(f"no files found in {', '.join(args.inputs)}")
    total = 0
    fields: set[str] = set()
    with ShardWriter(args.output, maxcount=args.maxcount, maxsize=args.maxsize) as writer:
        for key, members in samples:
            sample: dict[str, Any] = {"__key__": key}
            for ext, url in members:
                with open_url(url, "rb", readahead=0) as f:
                    sample[ext] = f.read()
                total += len(sample[ext])
                fields.add(ext)
            writer.write(sample)
    print(
        f"wrote {len(samples)} samples ({format_bytes(total)}; fields {', '.join(sorted(fields))}) "
        f"to {len(writer.urls)} shard(s):"
    )
    for url, count in zip(writer.urls, writer.counts, strict=True):
        print(f"  {url}  {count} samples")
    return 0
