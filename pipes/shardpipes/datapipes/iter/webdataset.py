"""Group tar members into samples by key (functional name: ``webdataset``)."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from typing import IO, Any

import numpy as np

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.datapipes.iter.tar import TarArchiveLoaderIterDataPipe
from shardpipes.errors import SampleFormatError, SkippedInputWarning
from shardpipes.formats import placed
from shardpipes.formats.decoders import decode_int, decode_json, decode_json_values
from shardpipes.formats.samples import duplicate_field, key_again, no_extension, split_key
from shardpipes.formats.stream import StreamBytes
from shardpipes.formats.tarparse import BLOCK, Run, Span, TarEntry, entries_of, slicer
from shardpipes.handlers import HandlerLike, SkipStats, resolve_handler

__all__ = ["Columns", "Deferred", "Sample", "WebDatasetIterDataPipe", "materialize", "pathsplit"]

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
    (everything after the first dot of its basename). Samples never straddle two shards. Members of one sample must be
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
        return self._samples(deferred=False)

    def deferred(self) -> Iterator[Sample | Deferred]:
        """The samples of ``__iter__``, some of them as :data:`Deferred` (:func:`materialize` makes them).

        For a stage that holds samples a while before it hands them on (the sample shuffle):
        a deferred sample is a tuple of strings, ints and one ``bytes`` window of the shard,
        which the garbage collector never tracks and which holds no copy of its own. Only
        runs of small samples are deferred; the rest are dicts as ``__iter__`` yields them.
        """
        return self._samples(deferred=True)

    def decoded(self, columns: Columns) -> Iterator[Sample | list[Sample]]:
        """The samples of ``__iter__``, runs of them as lists of samples already decoded.

        For ``decode()`` reading straight from this stage: a run of whole samples of one shape
        that the bulk grouping takes is yielded as one list, each sample's fields made by
        ``columns(shape)`` (one decoder per extension of the shape, ``None`` for a field kept as
        its bytes) straight from the shard's bytes, without the undecoded sample in between.
        Every other sample is yielded as ``__iter__`` yields it, for the caller to decode. A
        run in which a decoder raises is yielded sample by sample, undecoded, so that the
        caller meets the error (and its handler) exactly where it would have.
        """
        return self._samples(deferred=False, columns=columns)

    def _samples(self, deferred: bool, columns: Columns | None = None) -> Iterator[Any]:
        group = _Grouping(self, deferred, columns)
        step = group.step
        src = self.source_datapipe
        if isinstance(src, TarArchiveLoaderIterDataPipe) and group.split is split_key:
            # Fused path: members straight from the tar parser, in parts; runs of whole samples
            # of one shape are grouped in bulk, anything else member by member.
            for member_url, part, source, base in src.member_parts():
                yield from group.take(member_url, part, source, base)
                if group.stopped:
                    break
        else:
            for member_url, entry in self._entries():
                out = step(member_url, entry)
                if out is not None:
                    yield out
                if group.stopped:
                    break
        if group.error is not None:
            raise group.error
        if group.stopped:
            return
        out = group.end()
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


class _Grouping:
    """The state of grouping one iteration's members into samples.

    :meth:`step` takes one member (the rule, member by member); :meth:`take` a list of one
    shard's members, of which it groups the runs of whole, well-formed samples of one shape
    in bulk and hands the rest to :meth:`step`. Both give the same samples, in the same
    order, with the same errors (``tests/test_fast_path.py`` checks it on random archives).
    """

    def __init__(
        self,
        stage: WebDatasetIterDataPipe,
        deferred: bool = False,
        columns: Columns | None = None,
    ) -> None:
        self.stage = stage
        self.deferred = deferred
        self.columns = columns
        self.policy = stage.handler
        self.required = stage.required
        self.sample: Sample | None = None
        self.key: str | None = None
        self.url: str | None = None
        self.last_offset = -1
        self.seen: set[str] = set()
        self.stopped = False  # the policy ended the iteration
        self.error: Exception | None = None  # raised once the sample before it is out
        # A replaced ``pathsplit`` (0.9's hook, looked up now, as 0.9 looked it up) splits keys;
        # the bulk grouping assumes split_key, so it runs only without a replacement.
        self.split = split_key if pathsplit is _PATHSPLIT else pathsplit

    def step(self, member_url: str, entry: TarEntry) -> Sample | None:
        """Take one member: return the sample it finished, if any (then see ``stopped``)."""
        out = None
        name = entry.name
        if member_url != self.url or entry.offset <= self.last_offset:  # a new shard begins
            if self.sample is not None:
                out = self.stage._finish(self.sample, self.required, self.policy)
                if out is _STOP:
                    self.stopped = True
                    return None
            self.sample, self.key, self.url = None, None, member_url
            self.seen = set()
        self.last_offset = entry.offset
        member_key, ext = self.split(name)
        try:
            if not ext:
                raise no_extension(member_url, name)
            if member_key != self.key:
                if self.sample is not None:
                    out = self.stage._finish(self.sample, self.required, self.policy)
                    if out is _STOP:
                        self.stopped = True
                        return None
                    self.sample = None
                if member_key in self.seen:
                    # The rest of this key's run is dropped with it (one skip, not one per
                    # member): sample stays None while key matches.
                    self.key = member_key
                    raise key_again(member_url, member_key, f"member {name!r}")
                self.seen.add(member_key)
                self.key = member_key
                self.sample = {"__key__": member_key, "__url__": member_url}
                if not member_url:
                    del self.sample["__url__"]  # a foreign source: 0.9's samples had none
            elif self.sample is None:
                return out  # the rest of a sample that was already skipped
            if ext in self.sample:
                bad, self.sample = self.sample, None
                raise duplicate_field(member_url, bad["__key__"], ext)
            self.sample[ext] = entry.data
        except SampleFormatError as exc:
            try:
                go_on = self.policy(exc, member_url, self.stage.skipped)
            except Exception as raised:
                if out is None:
                    raise
                # The sample this member finished is whole and goes out first, then the error
                # (as when the run before the member was grouped in bulk).
                self.error = raised
                self.stopped = True
                return out
            if not go_on:
                self.stopped = True
        return out

    def end(self) -> Any:
        """The last sample of the iteration (or ``None``, or ``_STOP``)."""
        if self.sample is None:
            return None
        return self.stage._finish(self.sample, self.required, self.policy)

    def take(
        self, member_url: str, part: list[Span] | Run, source: memoryview, base: int
    ) -> Iterator[Any]:
        """Take a part of one shard's members (``iter_tar_parts``): yield samples, until ``stopped``."""
        n = len(part)
        step = self.step
        run = part if type(part) is Run else None
        name = part.name if run is not None else lambda i: part[i][0]  # type: ignore[union-attr]
        # Head: the first member (it may begin a new shard) and the rest of its sample.
        i = 0
        while i < n:
            out = step(member_url, entries_of([part[i]], source, base)[0])
            i += 1
            if out is not None:
                yield out
            if self.stopped:
                return
            if i < n and split_key(name(i))[0] != self.key:
                break
        # Tail: the last key's members, which may go on in the next part.
        t = n - 1
        if t > i:
            last = split_key(name(t))[0]
            while t > i and split_key(name(t - 1))[0] == last:
                t -= 1
        bulk = None
        if t > i:
            if run is not None:
                bulk = self._bulk_run(member_url, run, i, t, source, base)
            else:
                bulk = self._bulk(member_url, part, i, t, source, base)  # type: ignore[arg-type]
        if bulk is not None:
            yield from bulk
            if self.stopped:
                return
            i = t
        if i < n:
            for entry in entries_of(_spans(part, i, n), source, base):
                out = step(member_url, entry)
                if out is not None:
                    yield out
                if self.stopped:
                    return

    def _bulk_run(
        self, member_url: str, run: Run, i: int, t: int, source: memoryview, base: int
    ) -> list[Any] | None:
        """:meth:`_bulk` of ``run[i:t]``, its names checked as arrays in the usual case.

        The usual case: every key has the same length in bytes and no dot or NUL, and every
        member's name is its sample's key followed by the extension of its place in the first
        sample's shape. The names are then compared as rows of bytes (no string per member),
        and what :meth:`_bulk` checks on strings holds by construction. Anything else goes to
        :meth:`_bulk` over the run's spans, which decides as for any part.
        """
        if not member_url or int(run.heads[i]) * BLOCK + run.base <= self.last_offset:
            return None
        key, shape = _first_sample(map(run.name, range(i, t)))
        m = len(shape)
        width = len(key.encode("utf-8", "surrogateescape"))
        count = (t - i) // m
        if (
            count * m != t - i
            or not width
            or "" in shape
            or len(set(shape)) != m
            or any(e not in shape for e in self.required)
            or not _same_layout(run.names[i:t], width, shape)
        ):
            return self._bulk(member_url, run.spans(i, t), 0, t - i, source, base)
        raw = np.ascontiguousarray(run.names[i:t:m, :width]).view(f"S{width}").ravel().tolist()
        keys = b"\0".join(raw).decode("utf-8", "surrogateescape").split("\0")
        if len(set(keys)) != count or not self.seen.isdisjoint(keys) or self.key in keys:
            return None
        heads = run.heads[i:t]
        at = ((heads + 1) * BLOCK).tolist()
        sizes = run.sizes[i:t].tolist()
        last = int(heads[-1]) * BLOCK + run.base
        return self._emit(member_url, keys, shape, at, sizes, last, source)

    def _bulk(
        self, member_url: str, part: list[Span], i: int, t: int, source: memoryview, base: int
    ) -> list[Any] | None:
        """Samples of ``part[i:t]`` when they are whole samples of one shape, else ``None``.

        ``None`` also for anything :meth:`step` would report (no extension, a key again, a
        repeated extension, a missing required field): the caller then steps through them.
        """
        if not member_url or part[i][1] <= self.last_offset:
            return None
        spans = part[i:t]
        names = [x[0] for x in spans]
        shape = _first_sample(names)[1]
        m = len(shape)
        count = len(names) // m
        if (
            count * m != len(names)
            or "" in shape
            or len(set(shape)) != m
            or any(e not in shape for e in self.required)
        ):
            return None
        # Every member is key + extension of its place in the shape, and no key has a dot in
        # its last path component (so that split_key() cuts each name there too).
        cut = len(shape[0])
        keys = [name[:-cut] for name in names[::m]]
        if "." in "".join(keys) and any(k.rfind(".") > k.rfind("/") for k in keys):
            return None
        if [k + e for k in keys for e in shape] != names:
            return None
        if len(set(keys)) != count or not self.seen.isdisjoint(keys) or self.key in keys:
            return None
        at = [x[2] for x in spans]
        sizes = [x[3] for x in spans]
        return self._emit(member_url, keys, shape, at, sizes, spans[-1][1], source)

    def _emit(
        self,
        member_url: str,
        keys: list[str],
        shape: tuple[str, ...],
        at: list[int],
        sizes: list[int],
        last_offset: int,
        source: memoryview,
    ) -> list[Any] | None:
        """The samples of a run :meth:`_bulk` or :meth:`_bulk_run` checked, and the state after.

        ``keys``: one per sample; ``shape``: the extensions of every sample, in member order;
        ``at``, ``sizes``: where each member's data is in ``source`` and how long;
        ``last_offset``: the archive offset of the run's last member.
        """
        m = len(shape)
        count = len(keys)
        decoded = None
        if self.columns is not None:
            # Decoded before anything changes: a run in which a decoder raises goes member by
            # member (None), so that the decode stage meets the error on its own sample.
            try:
                decoded = _decoded(self.columns(shape), at, sizes, m, source)
            except Exception:
                return None
        out: list[Any] = []
        if self.sample is not None:  # the head's sample ends here
            done = self.stage._finish(self.sample, self.required, self.policy)
            self.sample = None
            if done is _STOP:
                self.stopped = True
                return []
            if done is not None:
                out.append(done)
        self.seen.update(keys)
        self.key = keys[-1]
        self.last_offset = last_offset
        lo = at[0]
        hi = at[-1] + sizes[-1]
        if self.deferred and hi - lo <= _DEFER_BYTES * count:
            # Each sample's fields copied once, one after the other into one bytes object of
            # its own (not the headers between them): a window shared by many samples would
            # stay alive until the last of them left the shuffle buffer.
            ends = list(map(operator.add, at, sizes))
            piece = source.__getitem__  # views: joined into one copy below
            cols = [list(map(piece, map(slice, at[r::m], ends[r::m]))) for r in range(m)]
            windows = list(map(b"".join, zip(*cols, strict=True)))
            bounds: list[list[int]] = []
            before = [0] * count
            for r in range(m):
                upto = list(map(operator.add, before, sizes[r::m]))
                bounds += [before, upto]
                before = upto
            out.extend(zip(keys, repeat(member_url), repeat(shape), windows, *bounds))
            return out
        if decoded is not None:
            out.append(_rows(keys, member_url, shape, decoded))  # one list: the run, decoded
            return out
        out.extend(_rows(keys, member_url, shape, _decoded([None] * m, at, sizes, m, source)))
        return out


def _spans(part: list[Span] | Run, lo: int, hi: int) -> list[Span]:
    """Members ``lo`` to ``hi`` of a part (a list of spans or a Run), as spans."""
    if not isinstance(part, Run):
        return part[lo:hi]
    # A few members (a part's head or tail) one by one: Run.spans() costs a dozen numpy calls.
    return [part[j] for j in range(lo, hi)] if hi - lo <= 16 else part.spans(lo, hi)


def _first_sample(names: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    """The key of the first of ``names`` and the extensions of the members that share it.

    Reads ``names`` only up to the first member of another key.
    """
    it = iter(names)
    key, ext = split_key(next(it))
    shape = [ext]
    for name in it:
        other, ext = split_key(name)
        if other != key:
            break
        shape.append(ext)
    return key, tuple(shape)


def _same_layout(names: np.ndarray, width: int, shape: tuple[str, ...]) -> bool:
    """Whether each row of ``names`` is a key of ``width`` bytes, then its place's extension.

    ``names``: the name fields of whole samples of ``len(shape)`` members each; the key is
    that of each sample's first member, has no dot (so the extension is cut where the name
    says) and no NUL (so the name does not end inside it), and is the same in all its members.
    """
    m = len(shape)
    keys = names[0::m, :width]
    if (keys == 46).any() or (keys == 0).any():
        return False
    for r, ext in enumerate(shape):
        tail = np.frombuffer(ext.encode("utf-8", "surrogateescape") + b"\0", dtype=np.uint8)
        rows = names[r::m]
        end = width + len(tail)
        if end > 101:
            return False
        if not (rows[:, width:end] == tail[: 100 - width]).all():  # the NUL, unless 100 bytes
            return False
        if r and not (rows[:, :width] == keys).all():
            return False
    return True


def _decoded(
    fns: Sequence[Callable[[bytes], Any] | None],
    at: list[int],
    sizes: list[int],
    m: int,
    source: memoryview,
) -> list[list[Any]]:
    """The fields of a run of samples of ``m`` members each, a column per extension.

    ``at``, ``sizes``: where each member's data is in ``source`` and how long, in member order.
    Column ``r`` holds ``fns[r]`` of each sample's ``r``-th member's bytes, or the bytes as a
    :class:`~shardpipes.formats.stream.StreamBytes` where ``fns[r]`` is ``None``: the values
    ``decode()`` makes of the members ``entries_of`` makes, made here without the members.
    """
    ends = list(map(operator.add, at, sizes))
    piece = slicer(source)
    # Large members kept by their place (formats/placed.py), when there are any.
    where = placed.place_of(source, sizes)
    cols: list[list[Any]] = []
    for r, fn in enumerate(fns):
        if fn is None and where is not None:
            cols.append(placed.values(where, piece, at[r::m], sizes[r::m]))
            continue
        data = map(piece, map(slice, at[r::m], ends[r::m]))
        if fn is None:
            cols.append(list(map(StreamBytes, data)))
        elif fn is decode_json:
            # decode_json over the column, with no Python frame per value (the same values).
            cols.append(decode_json_values(list(data)))
        else:
            # decode_int is int(): the builtin itself, with no Python frame per value.
            cols.append(list(map(int if fn is decode_int else fn, map(bytes, data))))
    return cols


def _rows(keys: list[str], url: str, shape: tuple[str, ...], cols: list[list[Any]]) -> list[Sample]:
    """One dict per sample: ``__key__``, ``__url__``, then a field per extension of ``shape``."""
    if len(shape) == 3:  # the usual shape (e.g. .cls, .json, .jpg): one dict display per sample
        a, b, c = shape
        return [
            {"__key__": k, "__url__": url, a: x, b: y, c: z}
            for k, x, y, z in zip(keys, *cols, strict=True)
        ]
    fields = ("__key__", "__url__", *shape)
    return list(map(dict, map(zip, repeat(fields), zip(keys, repeat(url), *cols))))


# Samples larger than this (on average over a run) are never deferred: a copy of the run
# would cost more than the garbage collector's visits to their dicts.
_DEFER_BYTES = 64 << 10

#: What ``decoded()`` takes: a run's shape (its extensions, in order) -> a decoder per
#: extension (``None``: the field stays its bytes).
Columns = Callable[[tuple[str, ...]], Sequence[Callable[[bytes], Any] | None]]

# A sample deferred by ``WebDatasetIterDataPipe.deferred()``: (key, url, extensions, window,
# start and end of each field's bytes in the window).
Deferred = tuple[Any, ...]


def materialize(deferred: Deferred) -> Sample:
    """The sample dict of a deferred sample (the same dict ``__iter__`` would have yielded)."""
    key, url, shape, window = deferred[:4]
    if len(shape) == 3:
        a, b, c = shape
        _, _, _, _, a0, b0, a1, b1, a2, b2 = deferred
        return {
            "__key__": key,
            "__url__": url,
            a: StreamBytes(window[a0:b0]),
            b: StreamBytes(window[a1:b1]),
            c: StreamBytes(window[a2:b2]),
        }
    sample: Sample = {"__key__": key, "__url__": url}
    for r, ext in enumerate(shape):
        sample[ext] = StreamBytes(window[deferred[4 + 2 * r] : deferred[5 + 2 * r]])
    return sample


_STOP: Any = object()


def _dotted(ext: str) -> str:
    return ext if ext.startswith(".") else f".{ext}"
