"""The ``jpeg`` preset's photographs, made here from the sample photos that packages ship.

The sources are the colour photographs in scikit-image's ``skimage/data`` (astronaut, cat,
coffee, Hubble deep field, immunohistochemistry slide, motorcycle left and right, retina,
rocket) and matplotlib's ``grace_hopper.jpg``: real photographs, read from the installed
packages (no download). Each sample is a random crop (40-100% of the area, aspect 3/4-4/3)
of one of them, rescaled to 500x375 (3 in 4) or 375x500, mirrored half the time, with a
small change of brightness, saved by Pillow at quality 90 (4:2:0, baseline): ImageNet's
usual shape and size (about 40-110 KB). ``.cls`` is the index of the source photograph.
"""

from __future__ import annotations

import io
import os
import random
import tarfile

__all__ = ["SOURCES", "load_sources", "make_jpeg", "write_jpeg_shards"]

SOURCES = [
    ("skimage", "astronaut.png"),
    ("skimage", "chelsea.png"),
    ("skimage", "coffee.png"),
    ("skimage", "hubble_deep_field.jpg"),
    ("skimage", "ihc.png"),
    ("skimage", "motorcycle_left.png"),
    ("skimage", "motorcycle_right.png"),
    ("skimage", "retina.jpg"),
    ("skimage", "rocket.jpg"),
    ("matplotlib", "grace_hopper.jpg"),
]


def _path(package: str, name: str) -> str:
    if package == "skimage":
        try:
            import skimage
        except ImportError as exc:
            raise ImportError(
                "the jpeg preset is made from scikit-image's sample photographs: "
                "pip install scikit-image (in the 'bench' extra)"
            ) from exc
        return os.path.join(os.path.dirname(skimage.__file__), "data", name)
    import matplotlib

    return os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data", name)


def load_sources() -> list:
    from PIL import Image

    out = []
    for package, name in SOURCES:
        with Image.open(_path(package, name)) as im:
            out.append(im.convert("RGB"))
    return out


def make_jpeg(rng: random.Random, sources: list) -> tuple[bytes, int]:
    from PIL import Image, ImageEnhance

    cls = rng.randrange(len(sources))
    src = sources[cls]
    w, h = src.size
    for _ in range(20):
        area = w * h * rng.uniform(0.4, 1.0)
        aspect = rng.uniform(3 / 4, 4 / 3)
        cw, ch = int((area * aspect) ** 0.5), int((area / aspect) ** 0.5)
        if cw <= w and ch <= h:
            break
    else:
        cw, ch = w, h
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    size = (500, 375) if rng.random() < 0.75 else (375, 500)
    img = src.resize(size, Image.Resampling.LANCZOS, box=(x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    img = ImageEnhance.Brightness(img).enhance(rng.uniform(0.8, 1.2))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue(), cls


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_jpeg_shards(directory: str, counts: list[int], seed: int) -> list[str]:
    """Write ``train-%06d.tar`` shards of ``{key}.jpg`` + ``{key}.cls`` samples."""
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    sources = load_sources()
    paths = []
    for s, count in enumerate(counts):
        path = os.path.join(directory, f"train-{s:06d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(count):
                data, cls = make_jpeg(rng, sources)
                key = f"{s:06d}_{i:06d}"
                _add(tar, f"{key}.jpg", data)
                _add(tar, f"{key}.cls", str(cls).encode())
        paths.append(path)
    return paths
