"""Decode sample fields by extension (functional name: ``decode``)."""

from __future__ import annotations

import io
import json
import json.scanner
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from shardpipes.datapipes.iter._base import StageIterDataPipe, check_picklable_fn, register
from shardpipes.errors import DecodeError
from shardpipes.handlers import HandlerLike, SkipStats, resolve_handler

__all__ = ["DEFAULT_DECODERS", "IMAGE_EXTENSIONS", "DecoderIterDataPipe"]

Sample = dict[str, Any]
ImageMode = Literal["pil", "numpy", "torch"]


def _int(data: bytes) -> int:
    return int(data)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed has it wrong


def _json(data: bytes) -> Any:
    # json.loads(bytes) spends more time guessing the encoding and wrapping its C scanner than
    # scanning a small document; go to the scanner directly for the usual case (UTF-8, no
    # leading space), and leave everything else, errors included, to json.loads.
    try:
        text = data.decode("utf-8")
        value, end = _scan_json(text, 0)
    except (StopIteration, UnicodeDecodeError, ValueError):
        return json.loads(data)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return json.loads(data)  # extra data: json.loads raises the error
    return value


def _npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _npz(data: bytes) -> Any:
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def _torch_weights(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _torch_pickle(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _pickle(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)


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

#: Decoders by the last component of the extension. ``pt``/``pth`` load tensors with
#: ``weights_only=True``; pickles are not decoded unless ``allow_pickle=True``.
DEFAULT_DECODERS: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), _int),
    **dict.fromkeys(("txt", "text", "transcript"), _text),
    **dict.fromkeys(("json", "jsn"), _json),
    "npy": _npy,
    "npz": _npz,
    **dict.fromkeys(("pt", "pth"), _torch_weights),
}


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
        allow_pickle: Decode ``pickle``/``pyd`` fields and ``pt`` files with full pickles.
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
        table = dict(DEFAULT_DECODERS)
        if callable(image):
            check_picklable_fn(image, "image decoder")
            table.update(dict.fromkeys(IMAGE_EXTENSIONS, image))
        elif image is not None:
            table.update(dict.fromkeys(IMAGE_EXTENSIONS, _Image(image)))
        if allow_pickle:
            table.update(
                {"pickle": _pickle, "pyd": _pickle, "pt": _torch_pickle, "pth": _torch_pickle}
            )
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
        table = self.table
        # Field name -> decoder (None: keep bytes). Field names repeat in every sample, so the
        # extension is parsed once per name, not once per sample.
        chosen: dict[str, Callable[[bytes], Any] | None] = {}
        policy = self.handler
        for sample in self.source_datapipe:
            out = dict(sample)
            try:
                for name, value in sample.items():
                    fn = chosen.get(name, _UNSEEN)
                    if fn is _UNSEEN:
                        fn = None if name.startswith("__") else _lookup(table, name)
                        chosen[name] = fn
                    if fn is not None and isinstance(value, _RAW):
                        try:
                            out[name] = fn(value)
                        except Exception as exc:
                            raise _decode_error(sample, name, exc) from exc
            except DecodeError as exc:
                if policy(exc, exc.url, self.skipped):
                    continue
                return
            yield out


_UNSEEN: Any = object()
_RAW = (bytes, bytearray, memoryview)


def _lookup(
    table: Mapping[str, Callable[[bytes], Any]], field: str
) -> Callable[[bytes], Any] | None:
    """The decoder of ``field`` (``".seg.png"``): by its whole extension, else by its last part."""
    return table.get(field.lstrip("."), table.get(field.rsplit(".", 1)[-1]))


def _decode_error(sample: Sample, field: str, exc: Exception) -> DecodeError:
    url = str(sample.get("__url__", ""))
    key = str(sample.get("__key__", ""))
    return DecodeError(
        f"{url}: cannot decode field {field!r} of sample {key!r}: {type(exc).__name__}: {exc}",
        url=url,
        key=key,
    )
