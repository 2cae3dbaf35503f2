"""Decode sample fields by extension (functional name: ``decode``)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal, TypeGuard

from shardpipes.datapipes.iter.base import StageIterDataPipe, check_picklable_fn, register
from shardpipes.datapipes.iter.webdataset import WebDatasetIterDataPipe
from shardpipes.errors import DecodeError
from shardpipes.formats.decoders import DECODERS, lookup
from shardpipes.formats.decoders import decoders as decoder_table
from shardpipes.formats.stream import StreamBytes
from shardpipes.handlers import HandlerLike, SkipStats, resolve_handler

__all__ = ["DEFAULT_DECODERS", "IMAGE_EXTENSIONS", "DecoderIterDataPipe", "decoded_parts"]

Sample = dict[str, Any]
ImageMode = Literal["pil", "numpy", "torch"]


class _Image:
    """Decode an image with Pillow into a PIL image, an HWC uint8 array, or a CHW uint8 tensor."""

    def __init__(self, mode: ImageMode) -> None:
        self.mode = mode

    def __call__(self, data: bytes) -> Any:
        try:
            from PIL import Image
        except ImportError as exc:
            raise ImportError(
                "decoding images needs Pillow: pip install 'shardpipes[image]' "
                "(or pass image=None to keep image fields as bytes)"
            ) from exc
        img = Image.open(io.BytesIO(data))
        img.load()
        if self.mode == "pil":
            return img
        import numpy as np

        arr = np.asarray(img.convert("RGB") if img.mode not in ("L", "RGB") else img)
        if self.mode == "numpy":
            return arr
        import torch

        tensor = torch.from_numpy(arr.copy())
        return tensor.permute(2, 0, 1) if tensor.ndim == 3 else tensor


IMAGE_EXTENSIONS = (
    "jpg",
    "jpeg",
    "png",
    "ppm",
    "pgm",
    "pbm",
    "pnm",
    "webp",
    "bmp",
    "gif",
    "tif",
    "tiff",
)

#: Decoders by the last component of the extension (the registry of
#: :mod:`shardpipes.formats.decoders`). ``pt``/``pth`` load tensors with ``weights_only=True``;
#: pickles are not decoded unless ``allow_pickle=True``.
DEFAULT_DECODERS: dict[str, Callable[[bytes], Any]] = DECODERS


@register("decode")
class DecoderIterDataPipe(StageIterDataPipe[Sample]):
    r"""Decode the fields of each sample according to their extension (functional name: ``decode``).

    The decoder is chosen by the last component of the field's extension (``.seg.png`` uses the
    ``png`` decoder): ``cls``/``id``/... to ``int``, ``txt`` to ``str``, ``json`` to Python
    objects, ``npy``/``npz`` to numpy arrays (never with pickles), ``pt``/``pth`` with
    ``torch.load(weights_only=True)``, images with Pillow. Fields with no decoder stay ``bytes``.
    Nothing is unpickled unless ``allow_pickle=True``.

    Args:
        source_datapipe: Samples, as ``webdataset`` yields.
        image: ``"pil"`` (default), ``"numpy"`` (HWC uint8), ``"torch"`` (CHW uint8), ``None``
            to leave images as bytes, or a decoder ``bytes -> value`` for every image field,
            e.g. ``shardpipes.formats.image.ImageDecoder(256)`` (resized while decoding).
        decoders: Extra or replacement decoders by extension (``"seg"`` or ``".seg"``), each
            a module-level function ``bytes -> value``. A dotted extension (``"seg.png"``)
            applies to that field only, ahead of the decoder of its last part.
        allow_pickle: Decode ``pickle``/``pyd``/``pkl`` fields and ``pt`` files with full pickles.
            Only for data you trust. Default: ``False``.
        handler: What to do when a field cannot be decoded: ``"raise"`` (default),
            ``"warn_and_skip"``, ``"skip"`` (drop the sample), ``"stop"``, or a callable.

    Yields:
        dict: The sample with decoded values (a new dict; the input is not modified).

    Raises:
        DecodeError: A field could not be decoded; names the URL, key and field.

    Examples:
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> s = {"__key__": "a", "__url__": "u", ".cls": b"3", ".json": b'{"x": 1}', ".bin": b"\x00"}
        >>> list(IterableWrapper([s]).decode())
        [{'__key__': 'a', '__url__': 'u', '.cls': 3, '.json': {'x': 1}, '.bin': b'\x00'}]
    """

    one_to_one = True  # a sample skipped under a handler: the exact-length guard pads
    carries_ids = "in_step"  # yields each decoded sample before it reads the next

    def __init__(
        self,
        source_datapipe: Iterable[Sample],
        *,
        image: ImageMode | Callable[[bytes], Any] | None = "pil",
        decoders: Mapping[str, Callable[[bytes], Any]] | None = None,
        allow_pickle: bool = False,
        handler: HandlerLike = "raise",
    ) -> None:
        if not callable(image) and image not in ("pil", "numpy", "torch", None):
            raise ValueError(
                f"image {image!r} is not known; must be one of 'pil', 'numpy', 'torch', None"
            )
        table = decoder_table(allow_pickle=allow_pickle)
        if callable(image):
            check_picklable_fn(image, "image decoder")
            table.update(dict.fromkeys(IMAGE_EXTENSIONS, image))
        elif image is not None:
            table.update(dict.fromkeys(IMAGE_EXTENSIONS, _Image(image)))
        for ext, fn in (decoders or {}).items():
            check_picklable_fn(fn, f"decoder for {ext!r}")
            table[ext.lstrip(".")] = fn  # "seg.png" must not replace every "png" decoder
        self.source_datapipe = source_datapipe
        self.image = image
        self.allow_pickle = allow_pickle
        self.table = table
        self.handler = resolve_handler(handler)
        self.skipped = SkipStats()

    def __iter__(self) -> Iterator[Sample]:
        for part in self._parts():
            yield from part

    def parts(self) -> Iterator[list[Sample]]:
        """The samples of ``__iter__``, in lists (runs decoded together, others one by one).

        For a stage that reads this one's samples in a loop of its own (the lean shuffle): it
        flattens the lists in C, with no generator step per sample. Starts an iteration as
        ``iter()`` does.
        """
        self.reset()
        return self._parts()

    def _parts(self) -> Iterator[list[Sample]]:
        table = self.table
        # Field name -> decoder (None: keep bytes). Field names repeat in every sample, so the
        # extension is parsed once per name, not once per sample.
        chosen: dict[str, Callable[[bytes], Any] | None] = {}
        policy = self.handler
        src = self.source_datapipe
        samples: Iterable[Any] = src
        if _fuses(src):
            # Straight from webdataset(): runs of whole samples come as lists, their fields
            # decoded from the shard's bytes (no undecoded sample made first); everything else,
            # and any run with a field that fails to decode, comes as a sample, decoded below.
            # tests/test_fast_path.py checks both give the same samples, skips and errors.
            by_shape: dict[tuple[str, ...], list[Callable[[bytes], Any] | None]] = {}

            def columns(shape: tuple[str, ...]) -> list[Callable[[bytes], Any] | None]:
                fns = by_shape.get(shape)
                if fns is None:
                    fns = by_shape[shape] = [lookup(table, ext) for ext in shape]
                return fns

            src.reset()
            samples = src.decoded(columns)
        for sample in samples:
            if type(sample) is list:
                yield sample
                continue
            out = dict(sample)
            try:
                for name, value in sample.items():
                    fn = chosen.get(name, _UNSEEN)
                    if fn is _UNSEEN:
                        fn = None if name.startswith("__") else lookup(table, name)
                        chosen[name] = fn
                    if fn is not None and isinstance(value, _RAW):
                        if isinstance(value, StreamBytes):
                            value = value.getvalue()  # the data itself: no copy
                        try:
                            out[name] = fn(value)
                        except Exception as exc:
                            raise _decode_error(sample, name, exc) from exc
            except DecodeError as exc:
                if policy(exc, exc.url, self.skipped):
                    continue
                return
            yield [out]


def _fuses(src: Any) -> TypeGuard[WebDatasetIterDataPipe]:
    """Whether ``src`` is a plain ``webdataset()`` stage, whose decoded runs this stage takes."""
    kind = type(src)
    return (
        isinstance(src, WebDatasetIterDataPipe)
        and kind.__iter__ is WebDatasetIterDataPipe.__iter__
        and kind._samples is WebDatasetIterDataPipe._samples
    )


_UNSEEN: Any = object()
_RAW = (bytes, bytearray, memoryview, StreamBytes)


def _decode_error(sample: Sample, field: str, exc: Exception) -> DecodeError:
    url = str(sample.get("__url__", ""))
    key = str(sample.get("__key__", ""))
    return DecodeError(
        f"{url}: cannot decode field {field!r} of sample {key!r}: {type(exc).__name__}: {exc}",
        url=url,
        key=key,
    )


def decoded_parts(src: Any) -> Iterator[list[Sample]] | None:
    """``src.parts()`` when ``src`` is a plain ``decode()`` stage, else ``None``."""
    kind = type(src)
    if (
        isinstance(src, DecoderIterDataPipe)
        and kind.__iter__ is DecoderIterDataPipe.__iter__
        and kind._parts is DecoderIterDataPipe._parts
        and kind.parts is DecoderIterDataPipe.parts
    ):
        return src.parts()
    return None
