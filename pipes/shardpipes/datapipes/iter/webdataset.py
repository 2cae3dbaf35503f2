"""Group tar members into samples by key (functional name: ``webdataset``)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.datapipes.iter.tar import TarArchiveLoaderIterDataPipe
from shardpipes.errors import SampleFormatError, SkippedInputWarning
from shardpipes.formats.samples import duplicate_field, key_again, no_extension, split_key
from shardpipes.formats.stream import StreamBytes
from shardpipes.formats.tarparse import TarEntry
from shardpipes.handlers import HandlerLike, SkipStats, resolve_handler

__all__ = ["Sample", "WebDatasetIterDataPipe", "pathsplit"]

Sample = dict[str, Any]


def pathsplit(p: str) -> tuple[str, str]:
    """Split a member path into ``(key, extension)``: torchdata 0.9's function of this name.

    The extension is everything from the first dot of the basename; a backslash counts as a
    slash. ``webdataset()`` looks this function up each time it starts: code that replaces
    ``shardpipes.datapipes.iter.util.webdataset.pathsplit`` (as some 0.9 code replaced
    ``torchdata.datapipes.iter.util.webdataset.pathsplit``) changes how it groups members.

    Examples:
        >>> pathsplit("train/x.seg.png")
        ('train/x', '.seg.png')
    """
    return split_key(p.replace("\\", "/"))


_PATHSPLIT = pathsplit


@register("webdataset")
class WebDatasetIterDataPipe(StageIterDataPipe[Sample]):
    """Group consecutive tar members with the same key into one sample (functional name: ``webdataset``).

    A sample is a dict ``{"__key__": key, "__url__": shard URL, ".jpg": bytes, ".cls": bytes,
    ...}``, one entry per member (the values are
    :class:`~shardpipes.formats.stream.StreamBytes`: in-memory files, as torchdata 0.9's
    streams were, that also answer like ``bytes``), keyed by the member's extension
    (everything after the first
    dot of its basename). Samples never straddle two shards. Members of one sample must be
    adjacent in the archive, as the WebDataset format requires; a key that comes back later in
    the same shard is an error rather than a silently split sample.

    Args:
        source_datapipe: ``(path, stream)`` pairs, as ``load_from_tar`` yields.
        required: Extensions every sample must have, e.g. ``[".jpg", ".cls"]``. Default: none.
        handler: What to do with a bad member or sample: ``"raise"`` (default),
            ``"warn_and_skip"``, ``"skip"``, ``"stop"``, or a callable.

    Yields:
        dict: One sample per key.

    Raises:
        SampleFormatError: A member with no extension, a key whose members are not adjacent,
            a repeated extension, or a missing required field; naming the URL and key.

    Examples:
        >>> import io, tarfile, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "shard.tar")
        >>> with tarfile.open(path, "w") as t:
        ...     for name, data in [("a.cls", b"1"), ("a.txt", b"x"), ("b.cls", b"2")]:
        ...         info = tarfile.TarInfo(name); info.size = len(data)
        ...         t.addfile(info, io.BytesIO(data))
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> dp = IterableWrapper([path]).open_files_by_fsspec().load_from_tar().webdataset()
        >>> [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in dp]
        [('a', ['.cls', '.txt']), ('b', ['.cls'])]
    """

    range_to_samples = ("members", "samples")

    def __init__(
        self,
        source_datapipe: Iterable[tuple[str, IO[bytes]]],
        *,
        required: Sequence[str] | None = None,
        handler: HandlerLike = "raise",
    ) -> None:
        self.source_datapipe = source_datapipe
        self.required = tuple(_dotted(e) for e in required or ())
        self.handler = resolve_handler(handler)
        self.skipped = SkipStats()

    def _entries(self) -> Iterator[tuple[str, TarEntry]]:
        src = self.source_datapipe
        if isinstance(src, TarArchiveLoaderIterDataPipe):
            # Fused path: take members straight from the tar parser, without stream objects.
            yield from src.members()
            return
        count = 0
        last_url = None
        warned = False
        for path, stream in src:
            url = getattr(stream, "url", None)
            name = getattr(stream, "name", None)
            if url is None or not isinstance(name, str):
                # A foreign source ((path, value) pairs, as torchdata 0.9 took): the key keeps
                # the full path, the value is kept as it is, the sample has no __url__, and a
                # path without an extension is metadata, left out (0.9's rule), counted in
                # ``skipped`` and warned about once.
                url, name = "", path
                if not split_key(path)[1]:
                    self.skipped.record(path, no_extension(path, path))
                    if not warned:
                        warned = True
                        warnings.warn(
                            f"webdataset(): {path!r} has no extension; left out as metadata, as "
                            "torchdata 0.9 did (further ones are counted in .skipped)",
                            SkippedInputWarning,
                            stacklevel=2,
                        )
                    continue
            count = 0 if url != last_url else count + 1
            last_url = url
            # A TarMember knows its byte offset: a shard listed twice in a row then starts
            # again at a lower offset, which is how __iter__ tells the two passes apart.
            offset = getattr(stream, "offset", None)
            if not isinstance(offset, int):
                offset = count
            data: Any
            if isinstance(stream, StreamBytes):
                data = stream
            elif hasattr(stream, "read"):
                data = StreamBytes(stream.read())
                stream.close()
            else:
                data = stream  # a value already read (bytes, str, a decoded object): as it is
            yield url, TarEntry(name, data, offset, offset)

    def __iter__(self) -> Iterator[Sample]:
        policy = self.handler
        required = self.required
        sample: Sample | None = None
        key: str | None = None
        url: str | None = None
        last_offset = -1
        seen: set[str] = set()
        # A replaced ``pathsplit`` (0.9's hook, looked up now, as 0.9 looked it up) splits keys.
        split = split_key if pathsplit is _PATHSPLIT else pathsplit
        for member_url, entry in self._entries():
            name = entry.name
            if member_url != url or entry.offset <= last_offset:  # a new shard begins
                if sample is not None:
                    out = self._finish(sample, required, policy)
                    if out is _STOP:
                        return
                    if out is not None:
                        yield out
                sample, key, url = None, None, member_url
                seen = set()
            last_offset = entry.offset
            member_key, ext = split(name)
            try:
                if not ext:
                    raise no_extension(member_url, name)
                if member_key != key:
                    if sample is not None:
                        out = self._finish(sample, required, policy)
                        if out is _STOP:
                            return
                        if out is not None:
                            yield out
                        sample = None
                    if member_key in seen:
                        # The rest of this key's run is dropped with it (one skip, not one
                        # per member): sample stays None while key matches.
                        key = member_key
                        raise key_again(member_url, member_key, f"member {name!r}")
                    seen.add(member_key)
                    key = member_key
                    sample = {"__key__": member_key, "__url__": member_url}
                    if not member_url:
                        del sample["__url__"]  # a foreign source: 0.9's samples had none
                elif sample is None:
                    continue  # the rest of a sample that was already skipped
                if ext in sample:
                    bad, sample = sample, None
                    raise duplicate_field(member_url, bad["__key__"], ext)
                sample[ext] = entry.data
            except SampleFormatError as exc:
                if not policy(exc, member_url, self.skipped):
                    return
        if sample is not None:
            out = self._finish(sample, required, policy)
            if out is not None and out is not _STOP:
                yield out

    def _finish(self, sample: Sample, required: tuple[str, ...], policy: Any) -> Sample | None:
        """Return the sample, ``None`` to skip it, or ``_STOP`` when the policy stops."""
        if not required:
            return sample
        missing = [e for e in required if e not in sample]
        if not missing:
            return sample
        url = sample.get("__url__", "")
        have = ", ".join(k for k in sample if not k.startswith("__"))
        exc = SampleFormatError(
            f"{url}: sample {sample['__key__']!r} has no {', '.join(missing)} (it has {have})",
            url=url,
            key=sample["__key__"],
        )
        if policy.raises:
            raise exc
        return None if policy(exc, url, self.skipped) else _STOP


_STOP: Any = object()


def _dotted(ext: str) -> str:
    return ext if ext.startswith(".") else f".{ext}"
