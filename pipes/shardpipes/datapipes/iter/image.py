"""Decode images straight into the ImageNet training crop (functional name: ``decode_random_resized_crop``)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shardpipes.datapipes.iter.base import SeededRng, StageIterDataPipe, register
from shardpipes.datapipes.iter.decode import IMAGE_EXTENSIONS
from shardpipes.errors import DecodeError
from shardpipes.formats.image import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    decode_crop_tensor,
    random_resized_crop_box,
)
from shardpipes.formats.stream import raw_bytes

__all__ = ["RandomResizedCropDecoderIterDataPipe"]

Sample = dict[str, Any]


class _Crop:
    """One sample's crop, with its own ``random.Random`` seeded from the stage's.

    So the boxes and flips are the same with or without threads, in whatever order they finish.
    """

    def __init__(self, stage: RandomResizedCropDecoderIterDataPipe, seed: int) -> None:
        self.stage, self.seed = stage, seed

    def box(self, width: int, height: int) -> tuple[int, int, int, int]:
        return random_resized_crop_box(self.rng, width, height, self.stage.scale, self.stage.ratio)

    def __call__(self, sample: Sample) -> Sample:
        st = self.stage
        out = dict(sample)
        for name in st._fields(sample):
            value = raw_bytes(sample[name])  # a member's value is a file: its bytes, no copy
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(
                    f"{sample.get('__url__', '')}: field {name!r} of sample "
                    f"{sample.get('__key__', '')!r} is a {type(value).__name__}, not the encoded "
                    "bytes: decode images here, not before (.decode(image=None) keeps them bytes)"
                )
            self.rng = random.Random(self.seed)  # every image field of a sample: the same crop
            flip = st.flip and self.rng.random() < 0.5
            try:
                out[name] = decode_crop_tensor(
                    value,
                    (st.size[1], st.size[0]),
                    exact=st.exact,
                    flip=flip,
                    mean=st.mean,
                    std=st.std,
                    box_fn=self.box,
                )
            except Exception as exc:
                url, key = str(sample.get("__url__", "")), str(sample.get("__key__", ""))
                raise DecodeError(
                    f"{url}: cannot decode field {name!r} of sample {key!r}: "
                    f"{type(exc).__name__}: {exc}",
                    url=url,
                    key=key,
                ) from exc
        return out


@register("decode_random_resized_crop")
class RandomResizedCropDecoderIterDataPipe(SeededRng, StageIterDataPipe[Sample]):
    r"""Decode image fields straight into a random resized crop, flipped and normalised (functional name: ``decode_random_resized_crop``).

    The ImageNet training transform (torchvision's ``RandomResizedCrop(size)`` +
    ``RandomHorizontalFlip()`` + ``ToTensor()`` + ``Normalize(mean, std)``) fused with the
    decode, doing less work than a full decode followed by the transform: the crop's box is
    drawn from the image's header, a JPEG is decoded only down to the rows the crop needs,
    and only the crop's pixels are converted (see :mod:`shardpipes.formats.image`). Each
    image field (``.jpg``, ``.png``, ...) becomes a float32 CHW tensor; other fields pass.

    Accuracy: ``exact=True`` gives the pixels of a full Pillow decode + ``resize(BILINEAR,
    box)``, bit for bit. ``exact=False`` (default) resizes with torch's antialiased bilinear
    interpolation of the cropped pixels (what torchvision's ``RandomResizedCrop`` does to a
    tensor), and decodes at 1/2-1/8 scale when the crop is at least twice the output: on
    the benchmark's 1,200 photographs: PSNR at least 50 dB, differences above 2 grey levels only
    on the crop's border, where torch clamps and Pillow reads past the box
    (``docs/performance.md``).

    Random because it has ``set_seed``: the loader seeds it per epoch (and per rank and worker
    after ``sharding_filter``); unseeded, seed 0. A sample's crop does not depend on ``threads``.

    Args:
        source_datapipe: Samples, as ``webdataset`` yields.
        size: Output size: an ``int`` (square) or ``(height, width)``. Default: ``224``.
        scale: Range of the crop's area, as a fraction of the image's. Default: ``(0.08, 1.0)``.
        ratio: Range of the crop's aspect (width / height). Default: ``(3/4, 4/3)``.
        flip: Mirror left-right with probability 0.5. Default: ``True``.
        mean, std: Per-channel normalisation of ``x / 255``; ``None`` for both keeps ``uint8``
            values. Default: ImageNet's.
        exact: See above. Default: ``False``.
        fields: Fields to decode (``".jpg"``); default: every field whose extension is an
            image's.
        threads: Decode this many samples at a time in threads (Pillow and torch release the
            GIL while they work): more samples per second in one process, the same CPU time per
            sample. Default: ``0`` (in the calling thread). Either way the stage never runs
            work on torch's intra-op threads, so its CPU per sample is the same whatever
            ``torch.set_num_threads`` a training process chose for its model.

    Yields:
        dict: The sample, its image fields replaced by tensors (a new dict).

    Raises:
        DecodeError: An image could not be decoded; names the URL, key and field.

    Examples:
        >>> import io
        >>> from PIL import Image
        >>> from shardpipes.datapipes.iter import IterableWrapper
        >>> buf = io.BytesIO()
        >>> Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "JPEG")
        >>> s = {"__key__": "a", "__url__": "u", ".jpg": buf.getvalue(), ".cls": 3}
        >>> out = next(iter(IterableWrapper([s]).decode_random_resized_crop(32)))
        >>> tuple(out[".jpg"].shape), out[".cls"]
        ((3, 32, 32), 3)
    """

    def __init__(
        self,
        source_datapipe: Iterable[Sample],
        size: int | tuple[int, int] = 224,
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
        mean: Sequence[float] | None = IMAGENET_MEAN,
        std: Sequence[float] | None = IMAGENET_STD,
        exact: bool = False,
        fields: Sequence[str] | None = None,
        threads: int = 0,
    ) -> None:
        hw = (size, size) if isinstance(size, int) else tuple(size)
        if len(hw) != 2 or min(hw) < 1:
            raise ValueError(f"size {size!r} must be an int >= 1 or a (height, width) pair")
        if not (0 < scale[0] <= scale[1] <= 1):
            raise ValueError(f"scale {scale!r} must satisfy 0 < low <= high <= 1")
        if not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"ratio {ratio!r} must satisfy 0 < low <= high")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if (
            mean is not None
            and std is not None
            and (len(mean) != 3 or len(std) != 3 or min(abs(x) for x in std) == 0)
        ):
            raise ValueError(
                f"mean {tuple(mean)!r} and std {tuple(std)!r} must have 3 values (RGB), std non-zero"
            )
        if threads < 0:
            raise ValueError(f"threads {threads} must be >= 0")
        self.source_datapipe = source_datapipe
        self.size = (int(hw[0]), int(hw[1]))
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip = flip
        self.mean = tuple(mean) if mean is not None else None
        self.std = tuple(std) if std is not None else None
        self.exact = exact
        self.fields = tuple("." + f.lstrip(".") for f in fields) if fields else None
        self.threads = threads
        self._seed = 0

    def _fields(self, sample: Sample) -> list[str]:
        if self.fields is not None:
            return [f for f in self.fields if f in sample]
        return [
            n
            for n in sample
            if not n.startswith("__") and n.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS
        ]

    def set_seed(self, seed: int) -> RandomResizedCropDecoderIterDataPipe:
        """Seed the next iteration (called by reading services)."""
        self._seed = int(seed)
        return self

    def __iter__(self) -> Iterator[Sample]:
        rng = self._rng
        if self.threads == 0:
            for sample in self.source_datapipe:
                yield _Crop(self, rng.getrandbits(64))(sample)
            return
        # In order, at most 2 x threads samples in flight; the seeds are drawn here, in order.
        pending: deque[Future[Sample]] = deque()
        with ThreadPoolExecutor(self.threads, thread_name_prefix="shardpipes-image") as pool:
            for sample in self.source_datapipe:
                pending.append(pool.submit(_Crop(self, rng.getrandbits(64)), sample))
                if len(pending) >= 2 * self.threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]
