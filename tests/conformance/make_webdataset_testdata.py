"""Write a stand-in for webdataset's ``testdata/imagenet-000000.tgz`` (a Git LFS file that a
source snapshot may lack): 47 samples ``{cls, png, wnid, xml}``, the first PNG 793x600 RGB,
which is what webdataset's tests assert about it, and noise
so that the archive is far larger than 10 KB. Usage: ``python make_webdataset_testdata.py OUT.tgz``.
"""

import io
import sys
import tarfile

import numpy as np
import PIL.Image


def main(out: str) -> None:
    with tarfile.open(out, "w:gz") as tar:
        for i in range(47):
            key = f"{10 + i}"
            h, w = (793, 600) if i == 0 else (64 + i, 48 + i)
            y = np.linspace(0, 255, h, dtype=np.uint8)[:, None, None]
            img = np.broadcast_to(y, (h, w, 3)).copy()
            img[..., 1] = (i * 5) % 256
            if i >= 3:
                # Noise, so the archive is about as large as webdataset's (hundreds of KB): its
                # tests cut it after 10 KB (``dd ... count=10``) and expect a truncated archive
                # that still holds its first few samples.
                rng = np.random.default_rng(i)
                img[..., 2] = rng.integers(0, 256, size=(h, w), dtype=np.uint8)
            buf = io.BytesIO()
            PIL.Image.fromarray(img).save(buf, format="PNG")
            fields = {
                "cls": str(i % 10).encode(),
                "png": buf.getvalue(),
                "wnid": f"n{i:08d}".encode(),
                "xml": f"<annotation>{i}</annotation>".encode(),
            }
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main(sys.argv[1])
