"""Images decoded with less work: JPEGs decoded only down to the rows a crop needs.

Pillow decodes a JPEG top to bottom. A crop that ends at row ``b`` needs the rows above ``b``
(plus the resize filter's reach) and nothing below, so :func:`decode_crop` stops the decoder
there: the rows it returns are the rows a full decode returns, bit for bit, and the resized
crop is the same as that of a full decode (``exact=True``). With ``exact=False`` a crop that
is at least twice the output in both directions is decoded at 1/2, 1/4 or 1/8 scale by the
JPEG decoder itself (Pillow's ``draft``: libjpeg's DCT scaling) and shrunk with
``reducing_gap=2`` (Pillow's ``reduce``), and :func:`decode_crop_tensor` resizes only the
crop's pixels with torch's antialiased bilinear filter: less work, slightly different pixels
(``docs/performance.md`` gives the accuracy measured).

Pillow, numpy and torch release the GIL while they decode and resize, so these functions can
run in threads; none of them uses torch's intra-op thread pool (see :func:`decode_crop_tensor`).
Everything else (other formats, CMYK, a file the row decoder cannot finish) goes through
Pillow's ordinary full decode: the same pixels, only slower. Pillow, numpy and torch are
imported when first used.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Sequence
from typing import Any, Literal

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageDecoder",
    "decode_crop",
    "decode_crop_tensor",
    "random_resized_crop_box",
    "to_tensor",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
Output = Literal["pil", "numpy", "torch", "uint8"]
Box = tuple[float, float, float, float]

_JPEG = ("JPEG",)
_SENTINEL = (1, 254, 3)  # written where the last decoded row will land; see _decode_rows


def random_resized_crop_box(
    rng: random.Random,
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """Torchvision's ``RandomResizedCrop.get_params``: ``(left, top, right, bottom)``.

    Ten tries at an area in ``scale`` of the image and an aspect in ``ratio`` (log-uniform);
    then the largest central crop within ``ratio``. The same draws, in the same order, as
    torchvision's, from ``rng`` instead of torch's global generator.
    """
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left, top = rng.randint(0, width - w), rng.randint(0, height - h)
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def _rows_needed(box: Box, out_h: int, height: int) -> int:
    """Rows from the top that a bilinear resize of ``box`` to ``out_h`` rows reads.

    Pillow's resampler reads, for each output row, input rows within ``support`` of its centre
    (support = the filter's 1.0 x the shrink factor, at least 1) and clips at the image's
    edge; two rows of slack beyond the last centre keep the clip where a full decode has it.
    """
    shrink = max((box[3] - box[1]) / out_h, 1.0)
    return min(height, int(math.ceil(box[3] + 0.5 * shrink + shrink)) + 2)


def _decode_rows(img: Any, data: bytes, rows: int) -> Any | None:
    """Decode the top ``rows`` rows of the opened JPEG ``img``; ``None`` if that cannot be done.

    Drives Pillow's own JPEG decoder over ``data`` in one call with an image of ``rows`` rows:
    libjpeg writes rows top to bottom, so stopping early changes none of the rows written. A
    decoder stopped early reports an error when it winds up (libjpeg's "too few scanlines");
    whether every row arrived is read from the last row, where a pixel value was written
    before decoding: if it is still there, or anything else looks wrong, ``None`` sends the
    caller to Pillow's ordinary full decode (which raises on a damaged file as usual).
    """
    from PIL import Image

    if len(img.tile) != 1 or img.mode not in ("RGB", "L"):
        return None
    tile = img.tile[0]
    if tile[0] != "jpeg":
        return None
    width = img.size[0]
    try:
        core = Image.core.new(img.mode, (width, rows))  # type: ignore[attr-defined]
        probe = _SENTINEL if img.mode == "RGB" else 7
        core.putpixel((0, rows - 1), probe)
        decoder = Image._getdecoder(img.mode, "jpeg", tile[3], img.decoderconfig)
        decoder.setimage(core, (0, 0, width, rows))
        try:
            consumed, err = decoder.decode(data[tile[2] :])
        finally:
            decoder.cleanup()
    except Exception:
        return None
    if consumed >= 0 or err not in (0, -2) or (err == -2 and rows == img.size[1]):
        return None  # wants more data (truncated) or a real failure
    if err == -2 and core.getpixel((0, rows - 1)) == probe:
        return None  # stopped before the last row: not our early stop
    return Image.Image()._new(core)


def _decode_rows_array(
    data: bytes, width: int, height: int, rows: int, args: tuple[Any, ...], config: tuple[int, int]
) -> Any | None:
    """:func:`_decode_rows` into a numpy array ``(rows, width, 4)`` (RGB + a pad byte) it owns.

    ``width``/``height`` are the decoded (DCT-scaled) size, ``args`` and ``config`` the JPEG
    decoder's (Pillow's tile arguments and ``decoderconfig``). The decoder writes straight
    into the array's memory (Pillow maps an ``RGBX`` image onto it), so no copy of the pixels
    is made on the way out of Pillow. The pad byte of the last row's first pixel is 0 before
    decoding and 255 once the decoder has written that row: how an early stop is told from a
    failure. ``None`` when anything is not as expected (the caller then decodes whole).
    """
    import numpy as np
    from PIL import Image

    try:
        arr = np.empty((rows, width, 4), np.uint8)
        arr[rows - 1, 0, 3] = 0
        core = Image.frombuffer("RGBX", (width, rows), arr, "raw", "RGBX", 0, 1).im
        decoder = Image._getdecoder("RGB", "jpeg", args, config)
        decoder.setimage(core, (0, 0, width, rows))
        try:
            consumed, err = decoder.decode(data)
        finally:
            decoder.cleanup()
    except Exception:
        return None
    if consumed >= 0 or err not in (0, -2) or (err == -2 and rows == height):
        return None
    if arr[rows - 1, 0, 3] != 255:
        return None
    return arr


_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))


def _jpeg_size(raw: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of a complete 3-component JPEG, from its frame header; else ``None``.

    Walks the marker segments up to the frame header (a dozen steps), where ``Image.open``
    parses every segment in Python: about a tenth of a small image's decode. Anything
    unusual (no EOI at the end, an Adobe segment, not 3 components, a scan before the frame)
    answers ``None`` and the caller opens the file with Pillow.
    """
    n = len(raw)
    if raw[:3] != b"\xff\xd8\xff" or raw.rstrip(b"\0\r\n ")[-2:] != b"\xff\xd9":
        return None
    i = 2
    while i + 4 <= n:
        if raw[i] != 0xFF:
            return None
        marker = raw[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker in (0xDA, 0xEE):  # a scan before the frame header; Adobe's colour transform
            return None
        if marker in _SOF:
            if i + 10 > n or raw[i + 9] != 3:
                return None
            height, width = (raw[i + 5] << 8) | raw[i + 6], (raw[i + 7] << 8) | raw[i + 8]
            return (width, height) if width and height else None
        i += 2 + ((raw[i + 2] << 8) | raw[i + 3])
    return None


def _dct_scale(box: Box, size: tuple[int, int]) -> int:
    """The largest of 8, 4, 2 at which the crop is still at least the output; else 1."""
    s = 8
    while s > 1 and not ((box[2] - box[0]) / s >= size[0] and (box[3] - box[1]) / s >= size[1]):
        s //= 2
    return s


def _open_box(
    raw: bytes, size: tuple[int, int], box: Box | None, box_fn: Any, exact: bool
) -> tuple[Any, Box, int | None]:
    """Open ``raw`` (header only); the image, the box in its pixels, and the rows to decode.

    DCT-scaled (``draft``) when ``exact`` is false and the crop is at least twice the output.
    The rows are ``None`` when the file must be decoded whole: not a JPEG, or not complete
    (no EOI at its end: the full decode then raises as Pillow always does, even when the
    crop's rows are all there).
    """
    from PIL import Image

    # a JPEG's magic number: skip Pillow's probing of every other format's plugin
    img = Image.open(io.BytesIO(raw), formats=_JPEG if raw[:3] == b"\xff\xd8\xff" else None)
    width, height = img.size
    if box_fn is not None:
        box = box_fn(width, height)
    if box is None:
        box = (0, 0, width, height)
    if img.format != "JPEG":
        return img, box, None
    out_h = size[1]
    if not exact:
        s = _dct_scale(box, size)
        draft_mode = img.mode if img.mode in ("RGB", "L") else "RGB"
        if s > 1 and img.draft(draft_mode, (width // s, height // s)):
            fx, fy = img.size[0] / width, img.size[1] / height
            box = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
            height = img.size[1]
    if raw.rstrip(b"\0\r\n ")[-2:] != b"\xff\xd9":
        return img, box, None
    return img, box, _rows_needed(box, out_h, height)


def _open_for_crop(
    raw: bytes, size: tuple[int, int], box: Box | None, box_fn: Any, exact: bool
) -> tuple[Any, Box]:
    """Open ``raw`` and decode the rows the crop needs; the RGB image and the box in its pixels."""
    img, box, rows = _open_box(raw, size, box, box_fn, exact)
    part = _decode_rows(img, raw, rows) if rows is not None else None
    if part is None:
        img.load()
        part = img
    if part.mode != "RGB":
        part = part.convert("RGB")
    return part, box


def decode_crop(
    data: bytes | bytearray | memoryview,
    size: tuple[int, int],
    box: Box | None = None,
    *,
    exact: bool = True,
    flip: bool = False,
    box_fn: Any = None,
) -> Any:
    """Decode ``data`` and return the ``box`` region resized to ``size`` (``(w, h)``), as Pillow RGB.

    Args:
        data: An encoded image (any format Pillow reads; JPEG gets the fast path).
        size: Output ``(width, height)``.
        box: ``(left, top, right, bottom)`` in the image's pixels. Default: the whole image.
        exact: ``True`` (default): the pixels of a full decode + ``resize(size, BILINEAR,
            box=box)``, bit for bit. ``False``: DCT scaling and ``reduce`` (``reducing_gap=2``)
            when the crop is at least twice the output: approximately the same pixels, faster.
        flip: Mirror left-right after resizing.
        box_fn: Instead of ``box``: called with ``(width, height)`` once the header is read,
            returns the box (the random crop draws its box this way).

    Returns:
        PIL.Image.Image: mode ``RGB``, of ``size``.
    """
    from PIL import Image

    raw = bytes(data) if not isinstance(data, bytes) else data
    part, box = _open_for_crop(raw, size, box, box_fn, exact)
    out = part.resize(size, Image.Resampling.BILINEAR, box=box, reducing_gap=None if exact else 2.0)
    return out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else out


def decode_crop_tensor(
    data: bytes | bytearray | memoryview,
    size: tuple[int, int],
    box: Box | None = None,
    *,
    exact: bool = False,
    flip: bool = False,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    box_fn: Any = None,
) -> Any:
    """:func:`decode_crop` to a CHW tensor: ``uint8``, or float32 ``(x / 255 - mean) / std``.

    ``exact=True``: :func:`decode_crop`'s exact pixels (Pillow's resize), then
    :func:`to_tensor`. ``exact=False`` (default): the crop is resized by torch's antialiased
    bilinear interpolation on ``uint8`` (``interpolate(..., antialias=True)``, the resize
    torchvision applies to tensors: within 1 of Pillow's value per pixel, about 3x faster
    here), after DCT scaling when the crop is at least twice the output; the flip and the
    normalisation are one pass in numpy over the 224x224 result.

    Every step runs in the calling thread, none on torch's intra-op thread pool, so the CPU
    spent per image does not depend on ``torch.set_num_threads`` and no torch setting is
    changed. Where torch's uint8 resize is not its vectorised kernel (a CPU without AVX2, or
    another architecture), which would use the pool, Pillow resizes the crop instead (within
    1 of torch's value per pixel).
    """
    if exact:
        img = decode_crop(data, size, box, exact=True, flip=flip, box_fn=box_fn)
        return to_tensor(img, mean, std)
    import numpy as np

    raw = bytes(data) if not isinstance(data, bytes) else data
    arr = None
    dims = _jpeg_size(raw)
    if dims is not None:  # a plain colour JPEG: the decoder is driven without Image.open
        width, height = dims
        if box_fn is not None:
            box = box_fn(width, height)
        if box is None:
            box = (0, 0, width, height)
        box_fn = None  # drawn: a fallback below must not draw again
        s = _dct_scale(box, size)
        scaled = box
        if s > 1:  # what Pillow's draft() does: libjpeg's output is ceil(size / s)
            sw, sh = (width + s - 1) // s, (height + s - 1) // s
            fx, fy = sw / width, sh / height
            scaled = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
            width, height = sw, sh
        rows = _rows_needed(scaled, size[1], height)
        arr = _decode_rows_array(raw, width, height, rows, ("RGB", ""), (s, 0))
    if arr is not None:  # decoded into memory of our own: the crop is a view of it
        left, top = int(scaled[0]), int(scaled[1])
        right = max(left + 1, int(round(scaled[2])))
        bottom = max(top + 1, int(round(scaled[3])))
        crop = arr[top:bottom, left:right]
    else:
        img, box, cut = _open_box(raw, size, box, box_fn, exact=False)
        left, top = int(box[0]), int(box[1])
        right, bottom = max(left + 1, int(round(box[2]))), max(top + 1, int(round(box[3])))
        part = _decode_rows(img, raw, cut) if cut is not None else None
        if part is None:
            img.load()
            part = img
        if part.mode != "RGB":
            part = part.convert("RGB")
        crop = np.asarray(part.crop((left, top, right, bottom)).convert("RGBX"))
    return _chw(_resize_rgbx(crop, size), flip, mean, std)


# The CPU kernels (torch.backends.cpu.get_cpu_capability()) whose uint8 antialiased resize of
# 4 channels-last channels is torch's vectorised one, which runs in the calling thread alone.
# Elsewhere torch resizes with its generic kernel, on the intra-op thread pool.
_SERIAL_RESIZE = frozenset(("AVX2", "AVX512"))
_TORCH_RESIZE: list[bool] = []


def _torch_resizes_serially() -> bool:
    """Whether torch's uint8 antialiased resize runs in the calling thread (decided once)."""
    if not _TORCH_RESIZE:
        import torch

        _TORCH_RESIZE.append(torch.backends.cpu.get_cpu_capability() in _SERIAL_RESIZE)
    return _TORCH_RESIZE[0]


def _resize_rgbx(crop: Any, size: tuple[int, int], *, use_torch: bool | None = None) -> Any:
    """``crop`` (HWC uint8, RGB + a pad byte) resized to ``size`` (``(w, h)``), as ``(h, w, 4)``.

    Bilinear with antialias, from the crop's pixels alone (nothing outside it is read).

    Only work that runs in the calling thread: a training process's torch keeps its intra-op
    threads for its model, and a stage that woke them for every sample (a copy, a flip, a
    normalisation each wake the pool, whose threads then spin) would cost more CPU per sample
    with more threads. torch's vectorised kernel where it runs in this thread (2-5x Pillow's
    resize), else Pillow's ``resize`` of the crop (the filter torch's copies, within 1 of it).
    """
    import numpy as np

    # copied in numpy (torch's copy would wake the intra-op pool); writable, as torch wants
    crop = np.require(crop, np.uint8, ("C", "W"))
    if use_torch is None:
        use_torch = _torch_resizes_serially()
    if use_torch:
        import torch
        import torch.nn.functional as F

        # NCHW over the HWC memory, channels-last with a batch stride of its own: the output is
        # then channels-last too, written straight by the kernel (else packed in a second pass)
        nchw = torch.from_numpy(crop).unsqueeze(0).permute(0, 3, 1, 2)
        out = F.interpolate(
            nchw, size=(size[1], size[0]), mode="bilinear", antialias=True, align_corners=False
        )
        return out[0].permute(1, 2, 0).numpy()
    from PIL import Image

    h, w = crop.shape[:2]
    img = Image.frombuffer("RGBX", (w, h), crop, "raw", "RGBX", 0, 1)
    return np.asarray(img.resize(size, Image.Resampling.BILINEAR))


def _chw(hwc: Any, flip: bool, mean: Sequence[float] | None, std: Sequence[float] | None) -> Any:
    """HWC uint8 pixels (the first 3 channels) as a CHW tensor, ``uint8`` or normalised float32.

    Float32 ``(x / 255 - mean) / std`` when ``mean`` and ``std`` are given; mirrored
    left-right when ``flip``. In numpy (one pass, in this thread), handed to torch uncopied.
    """
    import numpy as np
    import torch

    src = hwc[:, ::-1, :3] if flip else hwc[:, :, :3]
    chw = src.transpose(2, 0, 1)
    if mean is None or std is None:
        return torch.from_numpy(np.array(chw, order="C"))  # always a (writable) copy
    scale, shift = _affine(tuple(mean), tuple(std))
    out = np.empty(chw.shape, np.float32)
    np.multiply(chw, scale, out=out)  # x * a + b: float32, as torch's .float().mul_(a).add_(b)
    out += shift
    return torch.from_numpy(out)


_AFFINE: dict[tuple[tuple[float, ...], tuple[float, ...]], tuple[Any, Any]] = {}


def _affine(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[Any, Any]:
    """``(a, b)``: float32 arrays ``(C, 1, 1)`` with ``x * a + b == (x / 255 - mean) / std``, cached."""
    got = _AFFINE.get((mean, std))
    if got is None:
        import numpy as np

        a = np.array([1 / (255 * s) for s in std], np.float32).reshape(-1, 1, 1)
        b = np.array([-m / s for m, s in zip(mean, std, strict=True)], np.float32)
        got = _AFFINE[(mean, std)] = (a, b.reshape(-1, 1, 1))
    return got


def to_tensor(
    img: Any, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> Any:
    """An RGB image as a contiguous CHW tensor: ``uint8``, or float32 ``(x / 255 - mean) / std``."""
    import numpy as np

    return _chw(np.asarray(img), False, mean, std)


class ImageDecoder:
    """A decoder for ``decode(image=...)``: whole images resized to ``size``, decoded with less work.

    ``size`` an ``int`` resizes the shorter side to it (torchvision's ``Resize(int)``), a
    ``(width, height)`` pair to exactly that. Called with ``bytes`` it returns the decoded
    value; called with ``(key, bytes)`` it acts as a webdataset handler (``None`` for a key
    that is not an image), so ``.decode(ImageDecoder(256))`` works in webdataset pipelines too.

    Args:
        size: Shorter side, or ``(width, height)``.
        output: ``"pil"``, ``"numpy"`` (HWC uint8), ``"uint8"``/``"torch"`` (CHW tensor,
            ``"torch"`` normalised float when ``mean`` and ``std`` are given). Default: ``"torch"``.
        exact: See :func:`decode_crop`. Default: ``True``.
        mean, std: Normalisation for ``"torch"`` output. Default: ``None`` (uint8 values).
    """

    def __init__(
        self,
        size: int | tuple[int, int],
        *,
        output: Output = "torch",
        exact: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        if output not in ("pil", "numpy", "torch", "uint8"):
            raise ValueError(
                f"output {output!r} is not known; must be 'pil', 'numpy', 'torch' or 'uint8'"
            )
        if isinstance(size, int):
            if size < 1:
                raise ValueError(f"size {size} must be >= 1")
        elif len(size) != 2 or min(size) < 1:
            raise ValueError(f"size {size!r} must be an int or a (width, height) pair of ints >= 1")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        self.size = size
        self.output = output
        self.exact = exact
        self.mean = tuple(mean) if mean is not None else None
        self.std = tuple(std) if std is not None else None

    def _out_size(self, width: int, height: int) -> tuple[int, int]:
        if not isinstance(self.size, int):
            return self.size[0], self.size[1]
        if width <= height:
            return self.size, max(1, int(self.size * height / width))
        return max(1, int(self.size * width / height)), self.size

    def __call__(self, *args: Any) -> Any:
        """Decode ``(data)``, or ``(key, data)`` as a webdataset handler."""
        if len(args) == 2:  # webdataset handler: (key, data)
            key, data = args
            ext = str(key).rsplit(".", 1)[-1].lower()
            if ext not in ("jpg", "jpeg", "png", "ppm", "pgm", "pnm", "webp", "bmp", "tif", "tiff"):
                return None
        else:
            (data,) = args
        from PIL import Image

        raw = bytes(data) if not isinstance(data, bytes) else data
        with Image.open(io.BytesIO(raw)) as probe:
            size = self._out_size(*probe.size)
        img = decode_crop(raw, size, exact=self.exact)
        return convert(img, self.output, self.mean, self.std)


def convert(
    img: Any, output: Output, mean: Sequence[float] | None, std: Sequence[float] | None
) -> Any:
    """A decoded RGB image as ``output`` (see :class:`ImageDecoder`)."""
    if output == "pil":
        return img
    if output == "numpy":
        import numpy as np

        return np.asarray(img)
    if output == "uint8":
        return to_tensor(img)
    return to_tensor(img, mean, std)
