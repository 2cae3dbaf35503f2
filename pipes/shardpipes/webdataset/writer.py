"""webdataset's ``TarWriter`` and ``ShardWriter``: samples (dicts) -> tar shards.

Values are encoded by extension as webdataset encodes them (images by PIL for ``jpg``/``png``/
..., numbers for ``cls``, JSON, ``npy``, ...); ``bytes`` and ``str`` are written as they are.
Pickle and ``torch.save`` encoders exist for ``pyd``/``pickle``/``pth`` as in webdataset, tenbin
for ``ten``/``tenbin``/``tb``, msgpack for ``mp``/``msgpack``/``msg`` and CBOR for ``cbor``
(those two need their packages, as in webdataset).
Local shards from ``ShardWriter`` are written under ``<name>.partial`` and renamed when
complete, as :class:`shardpipes.writer.ShardWriter` does, so a reader never sees half a shard.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import pickle
import re
import tarfile
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from shardpipes.formats import tenbin
from shardpipes.formats.compression import CODECS, by_suffix
from shardpipes.formats.stream import raw_bytes
from shardpipes.formats.tarwrite import TarMemberWriter
from shardpipes.storage.write import write_atomic
from shardpipes.webdataset.gopen import gopen
from shardpipes.writer import ClosesOnExit, ShardSeries, encode_value

logger = logging.getLogger(__name__)

__all__ = [
    "ShardWriter",
    "TarWriter",
    "cbor_dumps",
    "imageencoder",
    "make_encoder",
    "mp_dumps",
    "numpy_dumps",
    "tenbin_dumps",
    "torch_dumps",
]


def imageencoder(image: Any, format: str = "PNG") -> bytes:
    """Compress a PIL image or an array (uint8, or float in [0, 1]) as ``format``."""
    import PIL.Image

    if isinstance(image, np.ndarray):
        if image.dtype in (np.dtype("f"), np.dtype("d")):
            if np.amin(image) <= -0.001 or np.amax(image) >= 1.001:
                raise ValueError(f"image values out of range {np.amin(image)} {np.amax(image)}")
            image = np.array(np.clip(image, 0.0, 1.0) * 255.0, "uint8")
        if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3)):
            raise ValueError(f"cannot encode an image of shape {image.shape}")
        image = PIL.Image.fromarray(image)
    elif not isinstance(image, PIL.Image.Image):
        raise TypeError(f"cannot encode {type(image).__name__} as an image")
    fmt = format.upper()
    fmt = {"JPG": "JPEG", "IMG": "PPM", "IMAGE": "PPM"}.get(fmt, fmt)
    opts = {"quality": 100} if fmt in ("JPEG", "TIFF") else {}
    with io.BytesIO() as result:
        image.save(result, format=fmt, **opts)
        return result.getvalue()


def torch_dumps(data: Any) -> bytes:
    """``torch.save`` into bytes."""
    import torch

    stream = io.BytesIO()
    torch.save(data, stream)
    return stream.getvalue()


def numpy_dumps(data: np.ndarray) -> bytes:
    """An array as ``.npy`` bytes."""
    return encode_value(".npy", data)


def numpy_npz_dumps(data: dict[str, np.ndarray]) -> bytes:
    """A dict of arrays as ``.npz`` bytes."""
    stream = io.BytesIO()
    np.savez_compressed(stream, **data)  # type: ignore[arg-type]
    return stream.getvalue()


class _Image:
    def __init__(self, fmt: str) -> None:
        self.fmt = fmt

    def __call__(self, data: Any) -> bytes:
        return imageencoder(data, self.fmt)


def _ascii(x: Any) -> bytes:
    return str(x).encode("ascii")


def _utf8(x: str) -> bytes:
    return x.encode("utf-8")


def _json(x: Any) -> bytes:
    return json.dumps(x).encode("utf-8")


def tenbin_dumps(x: Any) -> bytes:
    """An array, or a list of arrays, in webdataset's tenbin format (``.ten``/``.tb``)."""
    return bytes(tenbin.encode_buffer(x if isinstance(x, list) else [x]))


def mp_dumps(x: Any) -> bytes:
    """MessagePack (needs ``msgpack``, as in webdataset)."""
    import msgpack

    return cast(bytes, msgpack.packb(x))


def cbor_dumps(x: Any) -> bytes:
    """CBOR (needs ``cbor``, as in webdataset)."""
    import cbor  # type: ignore[import-not-found]

    return cast(bytes, cbor.dumps(x))


def _handlers() -> dict[str, Callable[[Any], bytes]]:
    table: dict[str, Callable[[Any], bytes]] = {}
    pairs: list[tuple[str, Callable[[Any], bytes]]] = [
        ("cls cls2 class count index inx id", _ascii),
        ("txt text transcript html htm", _utf8),
        ("pyd pickle", pickle.dumps),
        ("pth", torch_dumps),
        ("npy", numpy_dumps),
        ("npz", numpy_npz_dumps),
        ("ten tenbin tb", tenbin_dumps),
        ("json jsn", _json),
        ("mp msgpack msg", mp_dumps),
        ("cbor", cbor_dumps),
        ("jpg jpeg img image", _Image("jpg")),
        ("png", _Image("png")),
        ("pbm", _Image("pbm")),
        ("pgm", _Image("pgm")),
        ("ppm", _Image("ppm")),
        ("tiff tif", _Image("tiff")),
    ]
    for keys, fn in pairs:
        for k in keys.split():
            table[k] = fn
    return table


default_handlers = _handlers()


def encode_based_on_extension1(
    data: Any, tname: str, handlers: dict[str, Callable[[Any], bytes]]
) -> Any:
    """Encode one value for field ``tname`` (``.gz`` fields are compressed after encoding)."""
    if tname[0] == "_":
        if not isinstance(data, str):
            raise ValueError("the values of metadata must be of string type")
        return data
    compress = tname.endswith(".gz")
    if compress:
        tname = tname[:-3]
    data = raw_bytes(data)  # a member read by shardpipes' webdataset() (a file): its bytes
    if isinstance(data, bytes):
        result = data
    elif isinstance(data, str):
        result = data.encode("utf-8")
    else:
        ext = re.sub(r".*\.", "", tname).lower()
        handler = handlers.get(ext)
        if handler is None:
            raise ValueError(f"no handler found for {ext}")
        result = handler(data)
    return gzip.compress(result) if compress else result


class _ByExtension:
    def __init__(self, handlers: dict[str, Callable[[Any], bytes]]) -> None:
        self.handlers = handlers

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return {k: encode_based_on_extension1(v, k, self.handlers) for k, v in sample.items()}


def _no_encoding(x: Any) -> Any:
    return x


def make_encoder(spec: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``True``: webdataset's table; a dict: your table; a callable: itself; ``False``/``None``: none."""
    if spec is False or spec is None:
        return _no_encoding
    if spec is True:
        return _ByExtension(default_handlers)
    if isinstance(spec, dict):
        return _ByExtension(spec)
    if callable(spec):
        return cast(Callable[[dict[str, Any]], dict[str, Any]], spec)
    raise ValueError(f"{spec}: unknown encoder spec")


class TarWriter(ClosesOnExit):
    """Write samples (dicts with ``__key__``) to one tar file or stream.

    Args:
        fileobj: A writable binary stream, or a path/URL (opened with fsspec).
        user: Owner user name of the members.
        group: Owner group name of the members.
        mode: Permissions of the members.
        compress: ``True``/``"gz"``, ``"bz2"``, ``"xz"``; or, for a file name, by its suffix.
        encoder: See :func:`make_encoder`. Default: by extension.
        keep_meta: Also write ``_``-fields (not ``__key__``).
        mtime: Member time (fix it for reproducible tars). Default: now.
        format: ``tarfile`` format name, e.g. ``"PAX_FORMAT"``. Default: USTAR.
    """

    def __init__(
        self,
        fileobj: Any,
        user: str = "bigdata",
        group: str = "bigdata",
        mode: int = 0o0444,
        compress: bool | str | None = None,
        encoder: Any = True,
        keep_meta: bool = False,
        mtime: float | None = None,
        format: Any = None,
    ) -> None:
        self.format = getattr(tarfile, format, format) if format else tarfile.USTAR_FORMAT
        codec = self._codec(fileobj, compress)
        self.own_fileobj: Any = None
        if isinstance(fileobj, str) and fileobj.startswith("pipe:"):
            fileobj = gopen(fileobj, "wb")  # webdataset's pipe: outputs, as gopen opens them
            self.own_fileobj = fileobj
        elif isinstance(fileobj, str | os.PathLike):
            fileobj = write_atomic(os.fspath(fileobj))
            self.own_fileobj = fileobj
            fileobj = fileobj.file
        self.encoder = make_encoder(encoder)
        self.keep_meta = keep_meta
        self.mtime = mtime
        self.stream = fileobj
        self.tarstream = TarMemberWriter(fileobj, compression=codec, format=self.format)
        self.user = user
        self.group = group
        self.mode = mode
        self.compress = compress

    @staticmethod
    def _codec(fileobj: Any, compress: bool | str | None) -> str | None:
        """The compression of :mod:`shardpipes.formats.compression` for ``compress``."""
        if compress is False:
            return None
        if compress is True or compress == "gz":
            return "gzip"
        if compress in ("bz2", "xz"):
            return "bzip2" if compress == "bz2" else "xz"
        return by_suffix(fileobj) if isinstance(fileobj, str) else None

    @staticmethod
    def tarmode(fileobj: Any, compress: bool | str | None = None) -> str:
        """The ``tarfile`` stream mode for ``compress`` (or the file name's suffix)."""
        codec = TarWriter._codec(fileobj, compress)
        return "w|" + (CODECS[codec].tar if codec is not None else "")

    def write(self, obj: dict[str, Any]) -> int:
        """Write one sample; return the bytes of member data written."""
        obj = self.encoder(obj)
        if "__key__" not in obj:
            raise ValueError("object must contain a __key__")
        key = obj["__key__"]
        total = 0
        for k in sorted(obj):
            if k == "__key__" or (k[0] == "_" and not self.keep_meta):
                continue
            v = obj[k]
            if isinstance(v, str):
                v = v.encode("utf-8")
            if not isinstance(v, bytes | bytearray | memoryview):
                raise ValueError(f"{k} doesn't map to a bytes after encoding ({type(v)})")
            total += self.tarstream.add(
                f"{key}.{k}",
                v,
                mode=self.mode,
                mtime=self.mtime if self.mtime is not None else time.time(),
                uname=self.user,
                gname=self.group,
            )
        return total

    def close(self) -> None:
        """Finish the archive (and close the file if this writer opened it)."""
        self.tarstream.close()
        if self.own_fileobj is not None:
            self.own_fileobj.close()  # put in place: a local file is renamed when complete
            self.own_fileobj = None


class ShardWriter(ClosesOnExit):
    """Write samples to ``pattern % n`` shards, a new one after ``maxcount`` samples or ``maxsize`` bytes.

    Args:
        pattern: e.g. ``"out/train-%06d.tar"``.
        maxcount: Samples per shard at most. Default: ``100000``.
        maxsize: Bytes per shard at most. Default: ``3e9``.
        post: Called with each finished shard's name.
        start_shard: Number of the first shard.
        verbose: Log each new shard (``logging`` at INFO) when true.
        opener: ``opener(name)`` returns the stream to write a shard to.
        **kw: Passed to :class:`TarWriter`.
    """

    def __init__(
        self,
        pattern: str,
        maxcount: int = 100000,
        maxsize: float = 3e9,
        post: Callable[[str], Any] | None = None,
        start_shard: int = 0,
        verbose: int = 1,
        opener: Callable[[str], Any] | None = None,
        **kw: Any,
    ) -> None:
        self.verbose = verbose
        self.kw = kw
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.post = post
        self.tarstream: TarWriter | None = None
        self.shard = start_shard
        self.pattern = pattern
        self.total = 0
        self.count = 0
        self.size = 0
        self.fname: str | None = None
        self.opener = opener
        self._series = ShardSeries(pattern, start=start_shard, opener=opener)
        self.next_stream()

    def next_stream(self) -> None:
        """Close the current shard and open the next."""
        self.finish()
        self.fname = self.pattern % self.shard
        if self.verbose:
            logger.info("writing %s", self.fname)
        self.shard += 1
        stream = self._series.next()
        kw = dict(self.kw)
        if self.opener is None and kw.get("compress") is None:
            # A shard's compression follows its name (``.tar.gz``), as webdataset's does.
            codec = by_suffix(self.fname)
            kw["compress"] = CODECS[codec].tar if codec is not None else None
        self.tarstream = TarWriter(stream, **kw)
        self.count = 0
        self.size = 0

    def write(self, obj: dict[str, Any]) -> None:
        """Write one sample."""
        if self.tarstream is None or self.count >= self.maxcount or self.size >= self.maxsize:
            self.next_stream()
        assert self.tarstream is not None
        self.size += self.tarstream.write(obj)
        self.count += 1
        self.total += 1

    def finish(self) -> None:
        """Finish the current shard."""
        if self.tarstream is not None:
            self.tarstream.close()
            self._series.finish()
            if callable(self.post) and self.fname is not None:
                self.post(self.fname)
            self.tarstream = None

    def close(self) -> None:
        """Finish writing."""
        self.finish()
