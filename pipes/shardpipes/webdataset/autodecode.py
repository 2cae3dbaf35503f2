"""Decode webdataset samples: webdataset 1.x's handler strings and handler functions.

A decoder is a list of handlers ``f(key, data) -> value or None``; for each field the first
handler that returns something other than ``None`` wins, and a field no handler takes stays
``bytes``. ``key`` is the field name with a leading dot (``".jpg"``, ``".seg.png"``).

The image specs (``"pil"``, ``"rgb8"``, ``"torchrgb"``, ...) give exactly what webdataset gives:
every spec converts the image to its mode (``"pil"`` is an RGB ``PIL.Image``; ``"l"`` a 2-D
float array), floats are ``float32`` in ``[0, 1]``, torch tensors are CHW.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import numpy as np

from shardpipes.formats import tenbin
from shardpipes.formats.decoders import DECODERS, PICKLE_DECODERS, decode_npy, decode_npz
from shardpipes.formats.decoders import decoders as registry_decoders
from shardpipes.webdataset import utils

__all__ = [
    "IMAGE_EXTENSIONS",
    "Continue",
    "Decoder",
    "DecodingError",
    "ImageHandler",
    "basichandlers",
    "call_extension_handler",
    "cbor_loads",
    "decoders",
    "default_decoder",
    "default_post_handlers",
    "default_pre_handlers",
    "gzfilter",
    "handle_extension",
    "imagehandler",
    "imagespecs",
    "msgpack_loads",
    "npy_loads",
    "npz_loads",
    "pytorch_weights_only",
    "tenbin_loads",
    "torch_audio",
    "torch_loads",
    "torch_video",
    "unpickle_loads",
]

pytorch_weights_only = os.environ.get("WDS_PYTORCH_WEIGHTS_ONLY", "0") == "1"

# The extensions PIL can open (PIL.Image.EXTENSION restricted to formats in PIL.Image.OPEN),
# the same list webdataset passes to its image decoder.
IMAGE_EXTENSIONS = [
    "blp",
    "bmp",
    "dib",
    "bufr",
    "cur",
    "pcx",
    "dcx",
    "dds",
    "ps",
    "eps",
    "fit",
    "fits",
    "fli",
    "flc",
    "ftc",
    "ftu",
    "gbr",
    "gif",
    "grib",
    "h5",
    "hdf",
    "png",
    "apng",
    "jp2",
    "j2k",
    "jpc",
    "jpf",
    "jpx",
    "j2c",
    "icns",
    "ico",
    "im",
    "iim",
    "tif",
    "tiff",
    "jfif",
    "jpe",
    "jpg",
    "jpeg",
    "mpg",
    "mpeg",
    "msp",
    "pcd",
    "pxr",
    "pbm",
    "pgm",
    "ppm",
    "pnm",
    "psd",
    "bw",
    "rgb",
    "rgba",
    "sgi",
    "ras",
    "tga",
    "icb",
    "vda",
    "vst",
    "webp",
    "wmf",
    "emf",
    "xbm",
    "xpm",
]


def _last_ext(key: str) -> str:
    return re.sub(r".*[.]", "", key)


def _refuse_when_secure(what: str) -> None:
    if utils.enforce_security:
        raise ValueError(
            f"{what} is not allowed for security reasons when enforce_security is set "
            "(shardpipes.webdataset.utils.enforce_security = False, or WDS_SECURE=0, allows it)"
        )


def unpickle_loads(data: bytes) -> Any:
    """Unpickle ``data``; refused while :data:`shardpipes.webdataset.utils.enforce_security` is set."""
    _refuse_when_secure("Unpickling")
    return PICKLE_DECODERS["pickle"](data)


def torch_loads(data: bytes) -> Any:
    """``torch.load`` ``data`` on the CPU; refused while ``enforce_security`` is set."""
    _refuse_when_secure("torch.loads")
    # WDS_PYTORCH_WEIGHTS_ONLY=1: tensors only, as the registry's safe "pth" decoder loads them.
    return (DECODERS if pytorch_weights_only else PICKLE_DECODERS)["pth"](data)


def tenbin_loads(data: bytes) -> Any:
    """Decode webdataset's tenbin format: a list of numpy arrays (:mod:`shardpipes.formats.tenbin`)."""
    return tenbin.decode_buffer(data)


def msgpack_loads(data: bytes) -> Any:
    """Decode msgpack (needs ``msgpack``)."""
    import msgpack

    return msgpack.unpackb(data)


npy_loads = decode_npy
npz_loads = decode_npz


def cbor_loads(data: bytes) -> Any:
    """Decode CBOR (needs ``cbor``)."""
    import cbor  # type: ignore[import-not-found]

    return cbor.loads(data)


#: The basic decoders by (last) extension, as webdataset's ``autodecode.decoders``: the
#: registry's decoders for the extensions webdataset knows, its unpickling ones behind
#: ``enforce_security`` (read at each call), and the formats only webdataset reads.
decoders: dict[str, Callable[[bytes], Any]] = {
    **registry_decoders(
        ("txt", "text", "transcript", "cls", "cls2", "index", "inx", "id", "json", "jsn")
        + ("npy", "npz")
    ),
    **dict.fromkeys(("pkl", "pickle", "pyd"), unpickle_loads),
    "pth": torch_loads,
    **dict.fromkeys(("ten", "tb"), tenbin_loads),
    **dict.fromkeys(("mp", "msg"), msgpack_loads),
    "cbor": cbor_loads,
}


def basichandlers(key: str, data: bytes) -> Any:
    """Decode text, ints, JSON, numpy (and, if allowed, pickles) by the last extension of ``key``."""
    fn = decoders.get(_last_ext(key))
    return fn(data) if fn is not None else None


def call_extension_handler(
    key: str, data: bytes, f: Callable[[bytes], Any], extensions: Sequence[str]
) -> Any:
    """Return ``f(data)`` when ``key`` ends with one of ``extensions`` (dot-separated parts), else ``None``."""
    parts = key.lower().split(".")
    for target in extensions:
        want = target.split(".")
        if len(want) <= len(parts) and parts[-len(want) :] == want:
            return f(data)
    return None


def handle_extension(extensions: str, f: Callable[[bytes], Any]) -> Callable[[str, bytes], Any]:
    """A handler calling ``f(data)`` for keys with one of ``extensions`` (space-separated, case-blind).

    ``handle_extension("seg.png", f)`` applies to ``x.seg.png`` only; ``"png"`` to every ``.png``.
    """
    return partial(call_extension_handler, f=f, extensions=extensions.lower().split())


#: spec -> (array type, element type, mode), webdataset's table.
imagespecs: dict[str, tuple[str, str | None, str]] = {
    "l8": ("numpy", "uint8", "l"),
    "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"),
    "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"),
    "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"),
    "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"),
    "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"),
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}


class ImageHandler:
    """Decode images by ``imagespec`` (a key of :data:`imagespecs`) for ``extensions``.

    Args:
        imagespec: ``"pil"``, ``"pilrgb"``, ``"rgb8"``, ``"torchrgb"``, ``"l"``, ... .
        extensions: Extensions (without dot) decoded as images. Default: :data:`IMAGE_EXTENSIONS`.

    Raises:
        ValueError: An unknown ``imagespec``, naming the known ones.
    """

    def __init__(self, imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> None:
        if imagespec not in imagespecs:
            raise ValueError(
                f"Unknown imagespec: {imagespec} (known: {', '.join(sorted(imagespecs))})"
            )
        self.imagespec = imagespec.lower()
        self.extensions = set(extensions)

    def __call__(self, key: str, data: bytes) -> Any:
        """Decode ``data`` if ``key`` names an image extension, else return ``None``."""
        if _last_ext(key).lower() not in self.extensions:
            return None
        import PIL.Image

        atype, etype, mode = imagespecs[self.imagespec]
        with io.BytesIO(data) as stream:
            opened = PIL.Image.open(stream)
            opened.load()
            img = opened.convert(mode.upper())
        if atype == "pil":
            return img
        result = np.asarray(img)
        if etype == "float":
            result = result.astype(np.float32) / 255.0
        # convert() already gives the mode's channels; these mirror webdataset's guards.
        if mode == "l" and result.ndim == 3:
            result = np.mean(result[:, :, :3], axis=2)
        elif mode == "rgb" and result.ndim == 2:
            result = np.repeat(result[:, :, np.newaxis], 3, axis=2)
        elif mode == "rgba" and result.ndim == 2:
            result = np.repeat(result[:, :, np.newaxis], 4, axis=2)
            result[:, :, 3] = 255
        if atype == "numpy":
            return result
        import torch

        if result.ndim == 3:
            return torch.from_numpy(result.transpose(2, 0, 1).copy())
        return torch.from_numpy(result.copy())


def imagehandler(imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> ImageHandler:
    """Return an :class:`ImageHandler` (webdataset's lower-case alias)."""
    return ImageHandler(imagespec, extensions)


def _decode_file(key: str, data: bytes, exts: Sequence[str], load: Callable[[str], Any]) -> Any:
    extension = _last_ext(key)
    if extension not in exts:
        return None
    with tempfile.TemporaryDirectory() as dirname:
        fname = os.path.join(dirname, f"file.{extension}")
        with open(fname, "wb") as stream:
            stream.write(data)
        return load(fname)


def _read_video(fname: str) -> Any:
    import torchvision.io  # type: ignore[import-not-found]

    return torchvision.io.read_video(fname, pts_unit="sec")


def _read_audio(fname: str) -> Any:
    import torchaudio  # type: ignore[import-not-found]

    return torchaudio.load(fname)


def torch_video(key: str, data: bytes) -> Any:
    """Decode video with ``torchvision.io.read_video`` (mp4 ogv mjpeg avi mov h264 mpg webm wmv)."""
    return _decode_file(
        key, data, ["mp4", "ogv", "mjpeg", "avi", "mov", "h264", "mpg", "webm", "wmv"], _read_video
    )


def torch_audio(key: str, data: bytes) -> Any:
    """Decode audio with ``torchaudio.load`` (flac mp3 sox wav m4a ogg wma)."""
    return _decode_file(key, data, ["flac", "mp3", "sox", "wav", "m4a", "ogg", "wma"], _read_audio)


class Continue:
    """Returned by a handler to go on decoding ``data`` as ``key`` (e.g. after decompressing)."""

    def __init__(self, key: str, data: bytes) -> None:
        self.key, self.data = key, data


def gzfilter(key: str, data: bytes) -> Any:
    """Decompress ``.gz`` fields and continue decoding without the ``.gz``."""
    if not key.endswith(".gz"):
        return None
    return Continue(key[:-3], gzip.decompress(data))


default_pre_handlers: list[Callable[[str, bytes], Any]] = [gzfilter]
default_post_handlers: list[Callable[[str, bytes], Any]] = [basichandlers]


class DecodingError(Exception):
    """Decoding field ``k`` of sample ``key`` from shard ``url`` failed (the cause is chained)."""

    def __init__(self, url: Any = None, key: Any = None, k: Any = None, sample: Any = None) -> None:
        super().__init__(f"{url}: cannot decode field {k!r} of sample {key!r}")
        self.url = url
        self.key = key
        self.k = k
        self.sample = sample


class Decoder:
    """Decode every field of a sample with ``pre + handlers + post``.

    Args:
        handlers: The main handlers (functions ``f(key, data)`` or :class:`ImageHandler`).
        pre: Handlers tried first. Default: ``[gzfilter]``.
        post: Handlers tried last. Default: ``[basichandlers]``.
        only: Field names (a list, or a space-separated string) to decode; others stay as they are.
        partial: Leave fields that are not ``bytes`` as they are, instead of failing.

    Raises:
        DecodingError: From :meth:`decode`, naming the shard, the sample and the field.
    """

    def __init__(
        self,
        handlers: list[Callable[[str, bytes], Any]],
        pre: list[Callable[[str, bytes], Any]] | None = None,
        post: list[Callable[[str, bytes], Any]] | None = None,
        only: Iterable[str] | str | None = None,
        partial: bool = False,
    ) -> None:
        if not isinstance(handlers, list):
            raise TypeError(f"handlers = {handlers} must be a list")
        if isinstance(only, str):
            only = only.split()
        self.only = None if only is None else set(only)
        pre = default_pre_handlers if pre is None else pre
        post = default_post_handlers if post is None else post
        for h in [*handlers, *pre, *post]:
            if not callable(h):
                raise TypeError(f"decoder handler {h!r} is not callable")
        self.handlers = [*pre, *handlers, *post]
        self.partial = partial

    def decode1(self, key: str, data: bytes) -> Any:
        """Decode one field named ``key`` (without its leading dot)."""
        key = "." + key
        for f in self.handlers:
            result = f(key, data)
            if isinstance(result, Continue):
                key, data = result.key, result.data
                continue
            if result is not None:
                return result
        return data

    def decode(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Decode a whole sample; ``__``-fields are only turned from bytes into ``str``."""
        if not isinstance(sample, dict):
            raise TypeError(f"decode needs dict samples, got {type(sample).__name__}")
        result: dict[str, Any] = {}
        for k, v in list(sample.items()):
            try:
                if k[:2] == "__":
                    if isinstance(v, bytes):
                        try:
                            v = v.decode("utf-8")
                        except UnicodeDecodeError:
                            pass
                    result[k] = v
                    continue
                if self.only is not None and k not in self.only:
                    result[k] = v
                    continue
                if v is None:
                    raise ValueError(f"field {k!r} is None")
                if not isinstance(v, bytes):
                    if self.partial:
                        result[k] = v
                        continue
                    raise TypeError(f"field {k!r} is {type(v).__name__}, not bytes")
                result[k] = self.decode1(k, v)
            except Exception as exn:
                raise DecodingError(
                    key=sample.get("__key__"), url=sample.get("__url__"), k=k, sample=sample
                ) from exn
        return result

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Decode ``sample``."""
        return self.decode(sample)


default_decoder = Decoder(default_pre_handlers + default_post_handlers)
